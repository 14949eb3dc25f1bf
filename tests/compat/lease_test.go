package compat

// The Lease API as clientv3 (and so Kubernetes' events, leader election and etcdctl) uses it:
// grant, attach keys, keep alive, expire, revoke, and what survives a restart.

import (
	"context"
	"fmt"
	"runtime/debug"
	"sort"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// etcd's smallest lease TTL with the default election timeout (1000 ms, heartbeat 100 ms):
// ceil(1.5 * election timeout) = 2 s. A grant asking for less (1, 0 or negative) gets this.
const leaseMinTTL = 2

// etcd's largest lease TTL (lease.MaxLeaseTTL), in seconds.
const leaseMaxTTL = 9_000_000_000

// leaseFailOnPanic turns a panic in the test's goroutine (must's way of failing) into a failure
// of that test alone, so that its cleanups run and parallel tests, and their servers, go on.
// Deferred directly by each test: recover works only there.
func leaseFailOnPanic(t *testing.T) {
	if r := recover(); r != nil {
		t.Fatalf("%v\n%s", r, debug.Stack())
	}
}

// leaseCtx is ctx with a longer bound, for the tests that wait out TTLs.
func leaseCtx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

// leaseWantStatus checks a raw stub's error (no clientv3 mapping): etcd's code and message.
func leaseWantStatus(t *testing.T, err error, want error) {
	t.Helper()
	if status.Code(err) != status.Code(want) || status.Convert(err).Message() != status.Convert(want).Message() {
		t.Fatalf("expected %v, got %v", want, err)
	}
}

// leaseAlive reports whether the server still knows the lease (TimeToLive answers TTL -1 for
// a lease it does not know).
func leaseAlive(t *testing.T, c *clientv3.Client, id clientv3.LeaseID) bool {
	t.Helper()
	x, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return must(c.TimeToLive(x, id)).TTL != -1
}

// leaseWaitGone polls until the lease is gone and returns when that was first seen; it fails
// the test if that takes longer than within.
func leaseWaitGone(t *testing.T, c *clientv3.Client, id clientv3.LeaseID, within time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if !leaseAlive(t, c, id) {
			return time.Now()
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("lease %x still alive after %v", id, within)
	return time.Time{}
}

// leaseWatch opens a watch on prefix from revision rev and waits until the server has created
// it, so that nothing written afterwards can be missed.
func leaseWatch(t *testing.T, c *clientv3.Client, prefix string, rev int64) clientv3.WatchChan {
	t.Helper()
	x, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	wch := c.Watch(clientv3.WithRequireLeader(x), prefix, clientv3.WithPrefix(), clientv3.WithRev(rev), clientv3.WithCreatedNotify())
	select {
	case resp := <-wch:
		if !resp.Created {
			t.Fatalf("expected the created notification, got %+v", resp)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the watch was not created")
	}
	return wch
}

// wantDeletes checks that evs are one DELETE per key in keys (in key order), all at revision rev
// and all in a single watch response.
func wantDeletes(t *testing.T, resps []clientv3.WatchResponse, evs []*clientv3.Event, keys []string, rev int64) {
	t.Helper()
	if len(resps) != 1 {
		t.Fatalf("the deletes of one revoke arrive in one watch response, got %d", len(resps))
	}
	sorted := append([]string(nil), keys...)
	sort.Strings(sorted)
	if len(evs) != len(sorted) {
		t.Fatalf("expected %d deletes, got %d", len(sorted), len(evs))
	}
	for i, ev := range evs {
		if ev.Type != mvccpb.DELETE || string(ev.Kv.Key) != sorted[i] || ev.Kv.ModRevision != rev {
			t.Fatalf("event %d: want DELETE %s at %d, got %s %s at %d", i, sorted[i], rev, ev.Type, ev.Kv.Key, ev.Kv.ModRevision)
		}
	}
}

func TestLeaseGrantIDsAndTTLs(t *testing.T) {
	defer leaseFailOnPanic(t)
	s := startServer(t, "")
	c := s.client()
	x := ctx(t)
	must(c.Put(x, "k", "v")) // revision 2
	g := must(c.Grant(x, 30))
	if g.ID <= 0 || g.TTL != 30 || g.Error != "" {
		t.Fatalf("a grant with ID 0 gets a positive server-chosen ID and the asked TTL: %+v", g)
	}
	if g.ResponseHeader.Revision != 2 {
		t.Fatalf("a grant carries the current revision and does not move it: %+v", g.ResponseHeader)
	}
	g2 := must(c.Grant(x, 30))
	if g2.ID <= 0 || g2.ID == g.ID {
		t.Fatalf("two grants get two IDs: %x %x", g.ID, g2.ID)
	}
	raw := pb.NewLeaseClient(c.ActiveConnection())
	chosen := must(raw.LeaseGrant(x, &pb.LeaseGrantRequest{ID: 0x1234, TTL: 60}))
	if chosen.ID != 0x1234 || chosen.TTL != 60 || chosen.Header.Revision != 2 {
		t.Fatalf("a grant with a chosen ID keeps it: %+v", chosen)
	}
	// etcd takes any non-zero int64 as an ID, negative ones too.
	neg := must(raw.LeaseGrant(x, &pb.LeaseGrantRequest{ID: -7, TTL: 60}))
	if neg.ID != -7 {
		t.Fatalf("negative ID: %+v", neg)
	}
	_, err := raw.LeaseGrant(x, &pb.LeaseGrantRequest{ID: 0x1234, TTL: 10})
	leaseWantStatus(t, err, rpctypes.ErrGRPCLeaseExist)
	_, err = raw.LeaseGrant(x, &pb.LeaseGrantRequest{ID: int64(g.ID), TTL: 10})
	leaseWantStatus(t, err, rpctypes.ErrGRPCLeaseExist)
	if tt := must(c.TimeToLive(x, 0x1234)); tt.GrantedTTL != 60 {
		t.Fatalf("a refused re-grant leaves the lease as it was: %+v", tt)
	}
	_, err = c.Grant(x, leaseMaxTTL+1)
	wantErr(t, err, rpctypes.ErrGRPCLeaseTTLTooLarge, codes.OutOfRange)
	huge := must(c.Grant(x, leaseMaxTTL))
	if huge.TTL != leaseMaxTTL {
		t.Fatalf("the largest TTL is accepted as is: %+v", huge)
	}
	for _, ask := range []int64{1, 0, -5} {
		small := must(c.Grant(x, ask))
		if small.TTL != leaseMinTTL || small.TTL < ask {
			t.Fatalf("a grant of %d s is raised to etcd's minimum %d s, got %d", ask, leaseMinTTL, small.TTL)
		}
		if tt := must(c.TimeToLive(x, small.ID)); tt.GrantedTTL != leaseMinTTL {
			t.Fatalf("TimeToLive reports the raised TTL: %+v", tt)
		}
	}
	if three := must(c.Grant(x, leaseMinTTL+1)); three.TTL != leaseMinTTL+1 {
		t.Fatalf("a TTL above the minimum is kept: %+v", three)
	}
	if got := must(c.Get(x, "k")); got.Header.Revision != 2 {
		t.Fatalf("grants never move the revision: %d", got.Header.Revision)
	}
}

func TestLeasePutAttachesKeys(t *testing.T) {
	defer leaseFailOnPanic(t)
	s := startServer(t, "")
	c := s.client()
	x := ctx(t)
	l1 := must(c.Grant(x, 60)).ID
	l2 := must(c.Grant(x, 60)).ID
	p := must(c.Put(x, "a", "1", clientv3.WithLease(l1)))
	if kv := must(c.Get(x, "a")).Kvs[0]; kv.Lease != int64(l1) || kv.ModRevision != p.Header.Revision {
		t.Fatalf("put with a lease attaches the key: %+v", kv)
	}
	// A lease that does not exist: NotFound, nothing written.
	_, err := c.Put(x, "b", "1", clientv3.WithLease(0x7777))
	wantErr(t, err, rpctypes.ErrGRPCLeaseNotFound, codes.NotFound)
	if got := must(c.Get(x, "b")); len(got.Kvs) != 0 || got.Header.Revision != p.Header.Revision {
		t.Fatalf("a refused put writes nothing: %+v", got)
	}
	// ignore_lease keeps the key's lease and changes the value.
	must(c.Put(x, "a", "2", clientv3.WithIgnoreLease()))
	if kv := must(c.Get(x, "a")).Kvs[0]; kv.Lease != int64(l1) || string(kv.Value) != "2" || kv.Version != 2 {
		t.Fatalf("ignore_lease keeps the lease: %+v", kv)
	}
	_, err = c.Put(x, "absent", "v", clientv3.WithIgnoreLease())
	wantErr(t, err, rpctypes.ErrGRPCKeyNotFound, codes.InvalidArgument)
	_, err = c.Put(x, "a", "3", clientv3.WithIgnoreLease(), clientv3.WithLease(l1))
	wantErr(t, err, rpctypes.ErrGRPCLeaseProvided, codes.InvalidArgument)
	// ignore_value with a lease: same value, new lease.
	must(c.Put(x, "a", "", clientv3.WithIgnoreValue(), clientv3.WithLease(l2)))
	if kv := must(c.Get(x, "a")).Kvs[0]; kv.Lease != int64(l2) || string(kv.Value) != "2" {
		t.Fatalf("ignore_value with a new lease moves the key to it: %+v", kv)
	}
	tt1 := must(c.TimeToLive(x, l1, clientv3.WithAttachedKeys()))
	tt2 := must(c.TimeToLive(x, l2, clientv3.WithAttachedKeys()))
	if len(tt1.Keys) != 0 || len(tt2.Keys) != 1 || string(tt2.Keys[0]) != "a" {
		t.Fatalf("a key belongs to one lease at a time: %q %q", tt1.Keys, tt2.Keys)
	}
	// A plain put detaches the key; a delete detaches it too.
	must(c.Put(x, "plain", "v", clientv3.WithLease(l2)))
	must(c.Put(x, "plain", "v2"))
	must(c.Put(x, "gone", "v", clientv3.WithLease(l2)))
	must(c.Delete(x, "gone"))
	must(c.Put(x, "gone", "again"))
	if kv := must(c.Get(x, "plain")).Kvs[0]; kv.Lease != 0 {
		t.Fatalf("a put without a lease detaches the key: %+v", kv)
	}
	// Kubernetes' Create with a lease (events, leases of the apiserver's own objects).
	key := "/registry/events/default/e"
	create := func(v string, id clientv3.LeaseID) (*clientv3.TxnResponse, error) {
		return c.Txn(x).If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, v, clientv3.WithLease(id))).Commit()
	}
	tr := must(create("e1", l2))
	if !tr.Succeeded {
		t.Fatal("create with a lease")
	}
	if kv := must(c.Get(x, key)).Kvs[0]; kv.Lease != int64(l2) || kv.CreateRevision != tr.Header.Revision {
		t.Fatalf("txn put with a lease attaches the key: %+v", kv)
	}
	// etcd checks the lease of the puts on the branch taken, and only those.
	_, err = c.Txn(x).If(clientv3.Compare(clientv3.ModRevision("other"), "=", 0)).
		Then(clientv3.OpPut("other", "v", clientv3.WithLease(0x7777))).Commit()
	wantErr(t, err, rpctypes.ErrGRPCLeaseNotFound, codes.NotFound)
	if r := must(create("e2", 0x7777)); r.Succeeded {
		t.Fatal("the create must fail: the key exists")
	}
	// Revoking l2 deletes exactly the keys still attached to it: a, the event.
	before := must(c.Get(x, "\x00", clientv3.WithFromKey(), clientv3.WithKeysOnly()))
	rv := must(c.Revoke(x, l2))
	if rv.Header.Revision != before.Header.Revision+1 {
		t.Fatalf("a revoke deleting keys takes one revision: %d -> %d", before.Header.Revision, rv.Header.Revision)
	}
	var left []string
	for _, kv := range must(c.Get(x, "\x00", clientv3.WithFromKey())).Kvs {
		left = append(left, string(kv.Key))
	}
	if fmt.Sprint(left) != "[gone plain]" {
		t.Fatalf("after the revoke only the detached keys remain: %q", left)
	}
	// A revoke with no attached keys (l1 lost its only key) does not move the revision.
	rv1 := must(c.Revoke(x, l1))
	if rv1.Header.Revision != rv.Header.Revision {
		t.Fatalf("a revoke deleting nothing keeps the revision: %d -> %d", rv.Header.Revision, rv1.Header.Revision)
	}
}

func TestLeaseRevokeDeletesKeysInOneRevision(t *testing.T) {
	defer leaseFailOnPanic(t)
	s := startServer(t, "")
	c := s.client()
	x := ctx(t)
	id := must(c.Grant(x, 60)).ID
	keys := []string{"r/e", "r/a", "r/d", "r/b", "r/c"}
	for _, k := range keys {
		must(c.Put(x, k, "v-"+k, clientv3.WithLease(id)))
	}
	last := must(c.Put(x, "r/stay", "v")).Header.Revision
	wch := leaseWatch(t, c, "r/", last+1)
	rv := must(c.Revoke(x, id))
	if rv.Header.Revision != last+1 {
		t.Fatalf("the revoke's header is the revision of its deletes: %d, want %d", rv.Header.Revision, last+1)
	}
	resps, evs := collect(t, wch, len(keys), 10*time.Second)
	wantDeletes(t, resps, evs, keys, last+1)
	got := must(c.Get(x, "r/", clientv3.WithPrefix()))
	if got.Count != 1 || string(got.Kvs[0].Key) != "r/stay" || got.Header.Revision != last+1 {
		t.Fatalf("after the revoke: %+v", got)
	}
	if leaseAlive(t, c, id) {
		t.Fatal("a revoked lease is gone")
	}
	_, err := c.Revoke(x, id)
	wantErr(t, err, rpctypes.ErrGRPCLeaseNotFound, codes.NotFound)
	_, err = c.Revoke(x, 0x4242)
	wantErr(t, err, rpctypes.ErrGRPCLeaseNotFound, codes.NotFound)
	_, err = c.Put(x, "r/late", "v", clientv3.WithLease(id))
	wantErr(t, err, rpctypes.ErrGRPCLeaseNotFound, codes.NotFound)
	if after := must(c.Get(x, "r/stay")); after.Header.Revision != last+1 {
		t.Fatalf("failed revokes and puts do not move the revision: %d", after.Header.Revision)
	}
	// A lease can be granted again under a revoked ID.
	raw := pb.NewLeaseClient(c.ActiveConnection())
	if again := must(raw.LeaseGrant(x, &pb.LeaseGrantRequest{ID: int64(id), TTL: 60})); again.ID != int64(id) {
		t.Fatalf("re-grant of a revoked ID: %+v", again)
	}
}

// A lease nobody keeps alive expires no earlier than its TTL after the grant, and not much
// later; its keys go in one revision, as with a revoke.
func TestLeaseExpiresAndDeletesItsKeys(t *testing.T) {
	defer leaseFailOnPanic(t)
	t.Parallel()
	s := startServer(t, "")
	c := s.client()
	x := leaseCtx(t)
	base := must(c.Put(x, "x/stay", "v")).Header.Revision
	start := time.Now()
	g := must(c.Grant(x, 1))
	if g.TTL != leaseMinTTL {
		t.Fatalf("TTL: %d", g.TTL)
	}
	keys := []string{"x/1", "x/2", "x/3"}
	for _, k := range keys {
		must(c.Put(x, k, "v", clientv3.WithLease(g.ID)))
	}
	wch := leaseWatch(t, c, "x/", base+1)
	if _, evs := collect(t, wch, len(keys), 5*time.Second); evs[0].Type != mvccpb.PUT {
		t.Fatal("the watch starts with the puts")
	}
	time.Sleep(time.Until(start.Add(time.Duration(g.TTL)*time.Second - time.Second)))
	tt := must(c.TimeToLive(x, g.ID, clientv3.WithAttachedKeys()))
	if tt.TTL < 0 || len(tt.Keys) != len(keys) {
		t.Fatalf("one second before its TTL the lease is alive with its keys: %+v", tt)
	}
	gone := leaseWaitGone(t, c, g.ID, time.Duration(g.TTL)*time.Second+4*time.Second)
	if gone.Sub(start) < time.Duration(g.TTL)*time.Second {
		t.Fatalf("the lease expired after %v, before its TTL of %d s", gone.Sub(start), g.TTL)
	}
	t.Logf("expired %v after the grant (TTL %d s)", gone.Sub(start), g.TTL)
	resps, evs := collect(t, wch, len(keys), 5*time.Second)
	wantDeletes(t, resps, evs, keys, base+len64(keys)+1)
	got := must(c.Get(x, "x/", clientv3.WithPrefix()))
	if got.Count != 1 || got.Header.Revision != base+len64(keys)+1 {
		t.Fatalf("after expiry: %+v", got)
	}
	_, err := c.Put(x, "x/late", "v", clientv3.WithLease(g.ID))
	wantErr(t, err, rpctypes.ErrGRPCLeaseNotFound, codes.NotFound)
}

func len64[T any](s []T) int64 { return int64(len(s)) }

func TestLeaseKeepAlive(t *testing.T) {
	defer leaseFailOnPanic(t)
	t.Parallel()
	s := startServer(t, "")
	c := s.client()
	x := leaseCtx(t)
	g := must(c.Grant(x, leaseMinTTL))
	must(c.Put(x, "ka", "v", clientv3.WithLease(g.ID)))
	rev := must(c.Put(x, "other", "v")).Header.Revision
	once := must(c.KeepAliveOnce(x, g.ID))
	if once.ID != g.ID || once.TTL != leaseMinTTL || once.ResponseHeader.Revision != rev {
		t.Fatalf("keepalive once: the ID, the granted TTL, the current revision: %+v %+v", once, once.ResponseHeader)
	}
	// The stream, as clientv3 drives it (a request every TTL/3), holds the lease well past its TTL.
	kx, stop := context.WithCancel(x)
	defer stop()
	ch := must(c.KeepAlive(kx, g.ID))
	hold := time.Duration(3*leaseMinTTL) * time.Second
	deadline := time.After(hold)
	n := 0
	for waiting := true; waiting; {
		select {
		case resp, ok := <-ch:
			if !ok {
				t.Fatalf("the keepalive channel closed after %d responses", n)
			}
			n++
			if resp.ID != g.ID || resp.TTL != leaseMinTTL || resp.ResponseHeader.Revision != rev {
				t.Fatalf("keepalive response: %+v %+v", resp, resp.ResponseHeader)
			}
		case <-deadline:
			waiting = false
		}
	}
	if n < 3 {
		t.Fatalf("%d keepalive responses in %v", n, hold)
	}
	tt := must(c.TimeToLive(x, g.ID, clientv3.WithAttachedKeys()))
	if tt.TTL <= 0 || tt.TTL > leaseMinTTL || tt.GrantedTTL != leaseMinTTL || len(tt.Keys) != 1 {
		t.Fatalf("after %v of keepalives the lease is alive with its key: %+v", hold, tt)
	}
	// Stop the keepalives: the lease expires about a TTL later.
	stop()
	stopped := time.Now()
	gone := leaseWaitGone(t, c, g.ID, time.Duration(leaseMinTTL)*time.Second+4*time.Second)
	t.Logf("%d keepalives in %v; expired %v after they stopped", n, hold, gone.Sub(stopped))
	if got := must(c.Get(x, "ka")); len(got.Kvs) != 0 {
		t.Fatal("the key went with the lease")
	}
	// Keepalives for a lease that does not exist: the server answers TTL 0 (not an error),
	// which clientv3 turns into ErrLeaseNotFound.
	_, err := c.KeepAliveOnce(x, g.ID)
	wantErr(t, err, rpctypes.ErrGRPCLeaseNotFound, codes.NotFound)
	stream := must(pb.NewLeaseClient(c.ActiveConnection()).LeaseKeepAlive(x))
	for _, id := range []int64{int64(g.ID), 0} {
		if err := stream.Send(&pb.LeaseKeepAliveRequest{ID: id}); err != nil {
			t.Fatal(err)
		}
		resp := must(stream.Recv())
		if resp.ID != id || resp.TTL != 0 || resp.Header == nil || resp.Header.Revision == 0 {
			t.Fatalf("keepalive of a missing lease %x: %+v", id, resp)
		}
	}
	// A revoke ends a running KeepAlive: its channel closes.
	g2 := must(c.Grant(x, leaseMinTTL))
	ch2 := must(c.KeepAlive(x, g2.ID))
	<-ch2
	must(c.Revoke(x, g2.ID))
	timeout := time.After(10 * time.Second)
	for open := true; open; {
		select {
		case _, open = <-ch2:
		case <-timeout:
			t.Fatal("the keepalive channel of a revoked lease stays open")
		}
	}
}

// Keepalives pipelined on one stream (clientv3 sends one for every lease it holds at once):
// each is answered, in the order sent, with its lease's TTL, or TTL 0 for a lease that is gone.
func TestLeaseKeepAlivePipelined(t *testing.T) {
	defer leaseFailOnPanic(t)
	t.Parallel()
	s := startServer(t, "")
	c := s.client()
	x := leaseCtx(t)
	a, b := must(c.Grant(x, 10)), must(c.Grant(x, 20))
	gone := must(c.Grant(x, 10))
	must(c.Revoke(x, gone.ID))
	ttls := map[int64]int64{int64(a.ID): 10, int64(b.ID): 20, int64(gone.ID): 0}
	ids := []int64{int64(a.ID), int64(b.ID), int64(gone.ID)}
	stream := must(pb.NewLeaseClient(c.ActiveConnection()).LeaseKeepAlive(x))
	const n = 3000
	sent := make(chan error, 1)
	go func() {
		for i := 0; i < n; i++ {
			if err := stream.Send(&pb.LeaseKeepAliveRequest{ID: ids[i%len(ids)]}); err != nil {
				sent <- err
				return
			}
		}
		sent <- stream.CloseSend()
	}()
	for i := 0; i < n; i++ {
		resp := must(stream.Recv())
		if id := ids[i%len(ids)]; resp.ID != id || resp.TTL != ttls[id] {
			t.Fatalf("answer %d: want lease %x TTL %d, got %+v", i, id, ttls[id], resp)
		}
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
}

func TestLeaseTimeToLiveAndLeases(t *testing.T) {
	defer leaseFailOnPanic(t)
	s := startServer(t, "")
	c := s.client()
	x := ctx(t)
	l1 := must(c.Grant(x, 30)).ID
	l2 := must(c.Grant(x, 100)).ID
	must(c.Put(x, "t/b", "v", clientv3.WithLease(l1)))
	rev := must(c.Put(x, "t/a", "v", clientv3.WithLease(l1))).Header.Revision
	plain := must(c.TimeToLive(x, l1))
	if plain.ID != l1 || plain.GrantedTTL != 30 || plain.TTL <= 0 || plain.TTL > 30 || len(plain.Keys) != 0 {
		t.Fatalf("time to live without keys: %+v", plain)
	}
	if plain.ResponseHeader.Revision != rev || plain.ResponseHeader.MemberId == 0 || plain.ResponseHeader.ClusterId == 0 {
		t.Fatalf("time to live header: %+v", plain.ResponseHeader)
	}
	withKeys := must(c.TimeToLive(x, l1, clientv3.WithAttachedKeys()))
	var ks []string
	for _, k := range withKeys.Keys {
		ks = append(ks, string(k))
	}
	sort.Strings(ks)
	if fmt.Sprint(ks) != "[t/a t/b]" || withKeys.GrantedTTL != 30 || withKeys.TTL <= 0 || withKeys.TTL > 30 {
		t.Fatalf("time to live with keys: %+v %q", withKeys, ks)
	}
	if none := must(c.TimeToLive(x, l2, clientv3.WithAttachedKeys())); len(none.Keys) != 0 || none.GrantedTTL != 100 {
		t.Fatalf("a lease without keys: %+v", none)
	}
	// A lease the server does not know: no error, TTL -1, granted TTL 0, the ID echoed, and a
	// full header.
	for _, id := range []clientv3.LeaseID{0x5555, 0} {
		missing, err := c.TimeToLive(x, id, clientv3.WithAttachedKeys())
		if err != nil {
			t.Fatalf("time to live of a missing lease is not an error: %v", err)
		}
		if missing.ID != id || missing.TTL != -1 || missing.GrantedTTL != 0 || len(missing.Keys) != 0 {
			t.Fatalf("time to live of missing lease %x: %+v", id, missing)
		}
		if missing.ResponseHeader.Revision != rev || missing.ResponseHeader.MemberId == 0 {
			t.Fatalf("time to live of a missing lease has the current header: %+v", missing.ResponseHeader)
		}
	}
	ls := must(c.Leases(x))
	got := map[clientv3.LeaseID]bool{}
	for _, l := range ls.Leases {
		got[l.ID] = true
	}
	if len(ls.Leases) != 2 || !got[l1] || !got[l2] || ls.ResponseHeader.Revision != rev {
		t.Fatalf("leases lists the granted leases: %+v", ls)
	}
	must(c.Revoke(x, l1))
	if ls := must(c.Leases(x)); len(ls.Leases) != 1 || ls.Leases[0].ID != l2 {
		t.Fatalf("a revoked lease is no longer listed: %+v", ls)
	}
	must(c.Revoke(x, l2))
	if ls := must(c.Leases(x)); len(ls.Leases) != 0 {
		t.Fatalf("no leases: %+v", ls)
	}
}

// A lease and its keys survive a graceful restart and a SIGKILL. etcd re-arms every lease when
// its server becomes leader: it expires a full TTL plus the election timeout (1 s) after that,
// however much of the TTL had gone before. It still expires.
func TestLeaseSurvivesRestart(t *testing.T) {
	defer leaseFailOnPanic(t)
	t.Parallel()
	s := startServer(t, t.TempDir())
	c := s.client()
	x := leaseCtx(t)
	const ttl = 6
	g := must(c.Grant(x, ttl))
	keys := []string{"s/1", "s/2"}
	for _, k := range keys {
		must(c.Put(x, k, "v", clientv3.WithLease(g.ID)))
	}
	last := must(c.Put(x, "s/stay", "v")).Header.Revision
	time.Sleep(3 * time.Second) // spend half the TTL
	var restarted time.Time
	for _, kill := range []bool{false, true} {
		if kill {
			s.kill()
		} else {
			s.stop()
		}
		s.start()
		restarted = time.Now()
		c = s.client()
		tt := must(c.TimeToLive(x, g.ID, clientv3.WithAttachedKeys()))
		if tt.GrantedTTL != ttl || len(tt.Keys) != len(keys) {
			t.Fatalf("kill=%v: the lease comes back with its keys: %+v", kill, tt)
		}
		if tt.TTL < ttl-2 {
			t.Fatalf("kill=%v: a restart re-arms the lease with its full TTL, remaining %d", kill, tt.TTL)
		}
		if got := must(c.Get(x, "s/", clientv3.WithPrefix())); got.Count != 3 || got.Header.Revision != last {
			t.Fatalf("kill=%v: the keys are back: %+v", kill, got)
		}
	}
	wch := leaseWatch(t, c, "s/", last+1)
	time.Sleep(time.Until(restarted.Add((ttl - 1) * time.Second)))
	if !leaseAlive(t, c, g.ID) {
		t.Fatalf("the lease expired less than its TTL after the restart")
	}
	const grace, margin = time.Second, 3 * time.Second
	gone := leaseWaitGone(t, c, g.ID, time.Until(restarted.Add(ttl*time.Second+grace+margin)))
	t.Logf("expired %v after the restart (TTL %d s)", gone.Sub(restarted), ttl)
	resps, evs := collect(t, wch, len(keys), 5*time.Second)
	wantDeletes(t, resps, evs, keys, last+1)
}

func TestLeaseManyLeases(t *testing.T) {
	defer leaseFailOnPanic(t)
	t.Parallel()
	s := startServer(t, "")
	c := s.client()
	x := leaseCtx(t)
	const n, workers = 1000, 32
	ids := make([]clientv3.LeaseID, n)
	run := func(what string, f func(i int) error) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		next := make(chan int)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					if err := f(i); err != nil {
						errs <- fmt.Errorf("%s %d: %w", what, i, err)
						return
					}
				}
			}()
		}
		for i := 0; i < n; i++ {
			select {
			case next <- i:
			case err := <-errs:
				close(next)
				t.Fatal(err)
			}
		}
		close(next)
		wg.Wait()
		select {
		case err := <-errs:
			t.Fatal(err)
		default:
		}
	}
	run("grant+put", func(i int) error {
		g, err := c.Grant(x, 600)
		if err != nil {
			return err
		}
		ids[i] = g.ID
		_, err = c.Put(x, fmt.Sprintf("m/%04d", i), "v", clientv3.WithLease(g.ID))
		return err
	})
	if ls := must(c.Leases(x)); len(ls.Leases) != n {
		t.Fatalf("%d leases listed", len(ls.Leases))
	}
	if got := must(c.Get(x, "m/", clientv3.WithPrefix(), clientv3.WithCountOnly())); got.Count != n || got.Header.Revision != n+1 {
		t.Fatalf("after the puts: %+v", got)
	}
	run("revoke", func(i int) error {
		_, err := c.Revoke(x, ids[i])
		return err
	})
	got := must(c.Get(x, "m/", clientv3.WithPrefix(), clientv3.WithCountOnly()))
	if got.Count != 0 || got.Header.Revision != 2*n+1 {
		t.Fatalf("every revoke deletes its key in one revision of its own: %+v", got)
	}
	if ls := must(c.Leases(x)); len(ls.Leases) != 0 {
		t.Fatalf("%d leases left", len(ls.Leases))
	}
}
