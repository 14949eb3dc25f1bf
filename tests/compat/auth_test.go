package compat

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// authCluster is a server with auth enabled: root, and users whose roles cover different
// ranges. bcrypt's cost is etcd's minimum so adding users stays fast.
type authCluster struct {
	s     *server
	users map[string]*clientv3.Client // by user name, "root" included
}

const authTokenTTL = 3 // seconds

func startAuth(t *testing.T) *authCluster {
	t.Helper()
	s := startServer(t, "", "--bcrypt-cost", "4", "--auth-token-ttl", "3")
	c := s.client()
	cx := ctx(t)
	_, err := c.AuthEnable(cx)
	wantErr(t, err, rpctypes.ErrGRPCRootUserNotExist, codes.FailedPrecondition)
	must(c.UserAdd(cx, "root", "rootpw"))
	_, err = c.AuthEnable(cx)
	wantErr(t, err, rpctypes.ErrGRPCRootRoleNotExist, codes.FailedPrecondition)
	must(c.UserGrantRole(cx, "root", "root"))
	// reader: read the prefix r/; writer: write the one key w; fromz: read and write from z on.
	must(c.RoleAdd(cx, "reader"))
	must(c.RoleGrantPermission(cx, "reader", "r/", "r0", clientv3.PermissionType(clientv3.PermRead)))
	must(c.RoleAdd(cx, "writer"))
	must(c.RoleGrantPermission(cx, "writer", "w", "", clientv3.PermissionType(clientv3.PermWrite)))
	must(c.RoleAdd(cx, "fromz"))
	must(c.RoleGrantPermission(cx, "fromz", "z", "\x00", clientv3.PermissionType(clientv3.PermReadWrite)))
	for user, role := range map[string]string{"alice": "reader", "bob": "writer", "carol": "fromz", "dave": ""} {
		must(c.UserAdd(cx, user, user+"pw"))
		if role != "" {
			must(c.UserGrantRole(cx, user, role))
		}
	}
	_, err = c.UserAdd(cx, "alice", "again")
	wantErr(t, err, rpctypes.ErrGRPCUserAlreadyExist, codes.FailedPrecondition)
	_, err = c.UserRevokeRole(cx, "dave", "reader")
	wantErr(t, err, rpctypes.ErrGRPCRoleNotGranted, codes.FailedPrecondition)
	_, err = c.RoleRevokePermission(cx, "reader", "nope", "")
	wantErr(t, err, rpctypes.ErrGRPCPermissionNotGranted, codes.FailedPrecondition)
	_, err = c.RoleGet(cx, "nosuchrole")
	wantErr(t, err, rpctypes.ErrGRPCRoleNotFound, codes.FailedPrecondition)
	must(c.AuthEnable(cx))
	a := &authCluster{s: s, users: map[string]*clientv3.Client{}}
	for _, user := range []string{"root", "alice", "bob", "carol", "dave"} {
		a.users[user] = a.as(t, user, user+"pw")
	}
	a.users["root"] = a.as(t, "root", "rootpw")
	for _, k := range []string{"r/1", "r/2", "w", "z1", "secret"} {
		must(a.users["root"].Put(cx, k, "v-"+k))
	}
	return a
}

func (a *authCluster) as(t *testing.T, user, password string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{a.s.url}, DialTimeout: 5 * time.Second,
		Username: user, Password: password})
	if err != nil {
		t.Fatalf("%s: %v", user, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestAuthMatrix runs each request as every user: allowed for the users listed (root always),
// refused with etcd's ErrPermissionDenied for the others.
func TestAuthMatrix(t *testing.T) {
	a := startAuth(t)
	cmpVersion := func(k string) clientv3.Cmp { return clientv3.Compare(clientv3.Version(k), ">", 0) }
	cases := []struct {
		name    string
		allowed []string
		op      func(c *clientv3.Client, cx context.Context) error
	}{
		{"get one key in a prefix", []string{"alice"}, func(c *clientv3.Client, cx context.Context) error {
			_, err := c.Get(cx, "r/1")
			return err
		}},
		{"get the whole prefix", []string{"alice"}, func(c *clientv3.Client, cx context.Context) error {
			_, err := c.Get(cx, "r/", clientv3.WithPrefix())
			return err
		}},
		{"get past the prefix", nil, func(c *clientv3.Client, cx context.Context) error {
			_, err := c.Get(cx, "r/", clientv3.WithRange("r1"))
			return err
		}},
		{"get a key nobody may read", nil, func(c *clientv3.Client, cx context.Context) error {
			_, err := c.Get(cx, "secret")
			return err
		}},
		{"get a write-only key", nil, func(c *clientv3.Client, cx context.Context) error {
			_, err := c.Get(cx, "w")
			return err
		}},
		{"get from a key on", []string{"carol"}, func(c *clientv3.Client, cx context.Context) error {
			_, err := c.Get(cx, "z", clientv3.WithFromKey())
			return err
		}},
		{"put a read-only key", nil, func(c *clientv3.Client, cx context.Context) error {
			_, err := c.Put(cx, "r/1", "x")
			return err
		}},
		{"put a write-only key", []string{"bob"}, func(c *clientv3.Client, cx context.Context) error {
			_, err := c.Put(cx, "w", "x")
			return err
		}},
		{"put asking for the previous value", nil, func(c *clientv3.Client, cx context.Context) error {
			_, err := c.Put(cx, "w", "x", clientv3.WithPrevKV())
			return err
		}},
		{"put from a key on", []string{"carol"}, func(c *clientv3.Client, cx context.Context) error {
			_, err := c.Put(cx, "z9", "x")
			return err
		}},
		{"delete a write-only key", []string{"bob"}, func(c *clientv3.Client, cx context.Context) error {
			_, err := c.Delete(cx, "w")
			return err
		}},
		{"delete a read-only prefix", nil, func(c *clientv3.Client, cx context.Context) error {
			_, err := c.Delete(cx, "r/", clientv3.WithPrefix())
			return err
		}},
		{"txn writing its own key", []string{"bob"}, func(c *clientv3.Client, cx context.Context) error {
			_, err := c.Txn(cx).Then(clientv3.OpPut("w", "t")).Commit()
			return err
		}},
		{"txn whose other branch reads a secret", nil, func(c *clientv3.Client, cx context.Context) error {
			_, err := c.Txn(cx).Then(clientv3.OpPut("w", "t")).Else(clientv3.OpGet("secret")).Commit()
			return err
		}},
		{"txn comparing a secret", nil, func(c *clientv3.Client, cx context.Context) error {
			_, err := c.Txn(cx).If(cmpVersion("secret")).Then(clientv3.OpPut("w", "t")).Commit()
			return err
		}},
		{"txn within from-key rights", []string{"carol"}, func(c *clientv3.Client, cx context.Context) error {
			_, err := c.Txn(cx).If(cmpVersion("z1")).Then(clientv3.OpPut("z2", "t")).Else(clientv3.OpGet("z3")).Commit()
			return err
		}},
	}
	for _, tc := range cases {
		for _, user := range []string{"root", "alice", "bob", "carol", "dave"} {
			allowed := user == "root"
			for _, u := range tc.allowed {
				allowed = allowed || u == user
			}
			err := tc.op(a.users[user], ctx(t))
			switch {
			case allowed && err != nil:
				t.Errorf("%s as %s: refused: %v", tc.name, user, err)
			case !allowed && err == nil:
				t.Errorf("%s as %s: allowed", tc.name, user)
			case !allowed:
				if rpctypes.ErrorDesc(err) != rpctypes.ErrorDesc(rpctypes.ErrGRPCPermissionDenied) {
					t.Errorf("%s as %s: %v, want permission denied", tc.name, user, err)
				}
			}
		}
	}
	// The refused writes changed nothing.
	if v := must(a.users["root"].Get(ctx(t), "secret")).Kvs; len(v) != 1 || string(v[0].Value) != "v-secret" {
		t.Fatalf("secret after refused writes: %v", v)
	}
}

// TestAuthWatchAndLease: a watch needs read on its keys and sees no other key, even one written
// in the same revision; revoking a lease needs write on every key attached to it.
func TestAuthWatchAndLease(t *testing.T) {
	a := startAuth(t)
	root, alice, bob := a.users["root"], a.users["alice"], a.users["bob"]
	cx, cancel := context.WithCancel(ctx(t))
	defer cancel()
	// etcd's cancel reason is the whole status text, which its client makes the error.
	for _, w := range []clientv3.WatchChan{alice.Watch(cx, "secret"), alice.Watch(cx, "r/", clientv3.WithRange("r1"))} {
		denied := <-w
		if !denied.Canceled || !strings.Contains(fmt.Sprint(denied.Err()), "etcdserver: permission denied") {
			t.Fatalf("watch on keys alice may not read: %+v (%v)", denied, denied.Err())
		}
	}
	wc := alice.Watch(cx, "r/", clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithCreatedNotify())
	if created := <-wc; !created.Created || created.Canceled {
		t.Fatalf("watch on the permitted prefix: %+v", created)
	}
	must(root.Txn(ctx(t)).Then(clientv3.OpPut("secret", "s2"), clientv3.OpPut("r/3", "x")).Commit())
	select {
	case got := <-wc:
		if len(got.Events) != 1 || string(got.Events[0].Kv.Key) != "r/3" {
			t.Fatalf("alice's watch saw %v", got.Events)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no event for r/3")
	}

	own := must(root.Grant(ctx(t), 60))
	must(root.Put(ctx(t), "w", "leased", clientv3.WithLease(own.ID)))
	shared := must(root.Grant(ctx(t), 60))
	must(root.Put(ctx(t), "secret", "leased", clientv3.WithLease(shared.ID)))
	_, err := bob.Revoke(ctx(t), shared.ID)
	wantErr(t, err, rpctypes.ErrGRPCPermissionDenied, codes.PermissionDenied)
	if n := must(root.Get(ctx(t), "secret")).Count; n != 1 {
		t.Fatal("a refused revoke deleted the lease's key")
	}
	_, err = bob.Put(ctx(t), "w", "x", clientv3.WithLease(shared.ID))
	wantErr(t, err, rpctypes.ErrGRPCPermissionDenied, codes.PermissionDenied)
	must(bob.Revoke(ctx(t), own.ID))
	if n := must(root.Get(ctx(t), "w")).Count; n != 0 {
		t.Fatal("revoking bob's lease left its key")
	}
}

// rawKV is a KV client without clientv3's retries (which retry a bad token until the deadline):
// each call gets the server's own answer.
func rawKV(t *testing.T, s *server) pb.KVClient {
	t.Helper()
	conn, err := grpc.Dial(strings.TrimPrefix(s.url, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewKVClient(conn)
}

// wantStatus checks a raw call's answer: etcd's code and message.
func wantStatus(t *testing.T, what string, err error, want error) {
	t.Helper()
	got, wantS := status.Convert(err), status.Convert(want)
	if got.Code() != wantS.Code() || got.Message() != wantS.Message() {
		t.Fatalf("%s: %v, want %v", what, err, want)
	}
}

// TestAuthTokens: requests without a token, with garbage, forged or expired tokens, and
// wrong passwords get etcd's errors, and the server goes on serving.
func TestAuthTokens(t *testing.T) {
	a := startAuth(t)
	anon := a.s.client()
	kv := rawKV(t, a.s)
	get := &pb.RangeRequest{Key: []byte("r/1")}
	_, err := kv.Range(ctx(t), get)
	wantStatus(t, "no token", err, rpctypes.ErrGRPCUserEmpty)
	_, err = anon.Authenticate(ctx(t), "alice", "wrong")
	wantErr(t, err, rpctypes.ErrGRPCAuthFailed, codes.InvalidArgument)
	_, err = anon.Authenticate(ctx(t), "nobody", "x")
	wantErr(t, err, rpctypes.ErrGRPCAuthFailed, codes.InvalidArgument)
	good := must(anon.Authenticate(ctx(t), "alice", "alicepw")).Token
	with := func(token string) context.Context { return metadata.AppendToOutgoingContext(ctx(t), "token", token) }
	must(kv.Range(with(good), get))
	forged := []string{"", "x", good + "x", good[:len(good)-1], strings.Repeat("a", 4096), "root", "../../etc", "alice.1"}
	for i := 0; i < 200; i++ {
		forged = append(forged, strings.Repeat("0123456789abcdef", 4)[i%64:]+string(rune('a'+i%26)))
	}
	for _, tok := range forged {
		_, err := kv.Range(with(tok), get)
		wantStatus(t, "token "+tok[:min(len(tok), 20)], err, rpctypes.ErrGRPCInvalidAuthToken)
	}
	_, err = kv.Put(with("garbage"), &pb.PutRequest{Key: []byte("w")})
	wantStatus(t, "put with garbage", err, rpctypes.ErrGRPCInvalidAuthToken)
	// An unused simple token expires after --auth-token-ttl (etcd sweeps once a second).
	time.Sleep((authTokenTTL + 2) * time.Second)
	_, err = kv.Range(with(good), get)
	wantStatus(t, "expired token", err, rpctypes.ErrGRPCInvalidAuthToken)
	// A client with a user name authenticates again by itself.
	must(a.users["alice"].Get(ctx(t), "r/1"))
	must(a.users["root"].Put(ctx(t), "still", "serving"))
}
