package compat

// Hostile tokens and the paths by which keys could leak past a user's permissions: what
// TestAuthMatrix and TestAuthWatchAndLease leave out.

import (
	"context"
	"fmt"
	"math/rand"
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
)

// TestAuthNothingLeaks: a user reading r/ sees no other key through a delete's previous
// values, a lease's attached keys, or a watch over a wider range with previous values.
func TestAuthNothingLeaks(t *testing.T) {
	a := startAuth(t)
	root, alice, bob := a.users["root"], a.users["alice"], a.users["bob"]
	// bob may write w but not read it: a delete returning the previous value would read it.
	_, err := bob.Delete(ctx(t), "w", clientv3.WithPrevKV())
	wantErr(t, err, rpctypes.ErrGRPCPermissionDenied, codes.PermissionDenied)
	if n := must(root.Get(ctx(t), "w")).Count; n != 1 {
		t.Fatal("a refused delete deleted w")
	}
	// A lease's attached keys are read only by who may read every one of them (since etcd
	// 3.5: 3.4 lists them to anyone, the leak this test caught in cairn).
	mixed := must(root.Grant(ctx(t), 60))
	must(root.Put(ctx(t), "r/1", "leased", clientv3.WithLease(mixed.ID)))
	must(root.Put(ctx(t), "secret", "leased", clientv3.WithLease(mixed.ID)))
	checksLeaseKeys := serverMinor(t, a.s) >= 5
	_, err = alice.TimeToLive(ctx(t), mixed.ID, clientv3.WithAttachedKeys())
	if checksLeaseKeys {
		wantErr(t, err, rpctypes.ErrGRPCPermissionDenied, codes.PermissionDenied)
	}
	if ttl := must(alice.TimeToLive(ctx(t), mixed.ID)); ttl.TTL <= 0 || len(ttl.Keys) != 0 {
		t.Fatalf("TimeToLive without keys: %+v", ttl)
	}
	own := must(root.Grant(ctx(t), 60))
	must(root.Put(ctx(t), "r/2", "leased", clientv3.WithLease(own.ID)))
	if ttl := must(alice.TimeToLive(ctx(t), own.ID, clientv3.WithAttachedKeys())); len(ttl.Keys) != 1 {
		t.Fatalf("alice's own lease: %+v", ttl)
	}
	if ttl := must(root.TimeToLive(ctx(t), mixed.ID, clientv3.WithAttachedKeys())); len(ttl.Keys) != 2 {
		t.Fatalf("root's view of the lease: %+v", ttl)
	}
	conn := rawConn(t, a.s)
	_, err = pb.NewLeaseClient(conn).LeaseTimeToLive(ctx(t), &pb.LeaseTimeToLiveRequest{ID: int64(own.ID), Keys: true})
	if checksLeaseKeys {
		wantStatus(t, "TimeToLive with keys and no user", err, rpctypes.ErrGRPCUserEmpty)
	}
	// A watch wider than alice's range is refused whole, previous values or not.
	cx, cancel := context.WithCancel(ctx(t))
	defer cancel()
	for _, w := range []clientv3.WatchChan{
		alice.Watch(cx, "", clientv3.WithFromKey(), clientv3.WithPrevKV()),
		alice.Watch(cx, "r", clientv3.WithPrefix(), clientv3.WithPrevKV()),
	} {
		if denied := <-w; !denied.Canceled {
			t.Fatalf("alice watched beyond r/: %+v", denied)
		}
	}
}

func rawConn(t *testing.T, s *server) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.Dial(strings.TrimPrefix(s.url, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestAuthHostileTokens: huge, binary and guessed tokens, the token of a deleted user and
// tokens from before an AuthDisable get errors, and the server goes on serving.
func TestAuthHostileTokens(t *testing.T) {
	a := startAuth(t)
	root := a.users["root"]
	kv := rawKV(t, a.s)
	anon := a.s.client()
	get := &pb.RangeRequest{Key: []byte("r/1")}
	with := func(token string) context.Context {
		return metadata.AppendToOutgoingContext(ctx(t), "token", token)
	}
	// gRPC refuses these before or at the server (header size, invalid metadata): errors in
	// any case, never an answer, and never the end of the server.
	for what, token := range map[string]string{
		"1 MiB":  strings.Repeat("t", 1<<20),
		"binary": "\x00\xff\x80.\x01",
	} {
		if _, err := kv.Range(with(token), get); err == nil {
			t.Fatalf("a %s token got an answer", what)
		}
	}
	// Guesses in the simple tokens' form (16 letters, a dot, an index), in parallel. The index
	// is one already applied: etcd holds a token naming a later one until it is.
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		go func(g int) {
			r := rand.New(rand.NewSource(int64(g)))
			for i := 0; i < 100; i++ {
				b := make([]byte, 16)
				for j := range b {
					b[j] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"[r.Intn(52)]
				}
				_, err := kv.Range(with(fmt.Sprintf("%s.%d", b, 1+r.Intn(5))), get)
				if err == nil || !strings.Contains(err.Error(), "invalid auth token") {
					errs <- fmt.Errorf("guess %s: %v", b, err)
					return
				}
			}
			errs <- nil
		}(g)
	}
	for g := 0; g < 8; g++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// A valid token dies with its user, and every token with AuthDisable.
	dave := must(anon.Authenticate(ctx(t), "dave", "davepw")).Token
	alice := must(anon.Authenticate(ctx(t), "alice", "alicepw")).Token
	must(kv.Range(with(alice), get))
	must(root.UserDelete(ctx(t), "dave"))
	_, err := kv.Range(with(dave), &pb.RangeRequest{Key: []byte("r/1")})
	wantStatus(t, "a deleted user's token", err, rpctypes.ErrGRPCInvalidAuthToken)
	must(root.AuthDisable(ctx(t)))
	must(a.s.client().AuthEnable(ctx(t)))
	// Wait out clientv3's own retries of the token it held before the disable.
	time.Sleep(100 * time.Millisecond)
	for _, tok := range []string{alice, dave} {
		_, err = kv.Range(with(tok), get)
		wantStatus(t, "a token from before auth disable", err, rpctypes.ErrGRPCInvalidAuthToken)
	}
	fresh := must(anon.Authenticate(ctx(t), "alice", "alicepw")).Token
	must(kv.Range(with(fresh), get))
	must(a.users["root"].Put(ctx(t), "still", "serving"))
}
