package compat

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// must unwraps a client call; an error fails the test (with its stack) at the call.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// wantErr checks that the client recognised etcd's exact message (it maps known messages to
// typed errors) and that the gRPC code is etcd's.
func wantErr(t *testing.T, err error, want error, code codes.Code) {
	t.Helper()
	if err == nil {
		t.Fatalf("expected %v, got success", want)
	}
	if rpctypes.ErrorDesc(err) != rpctypes.ErrorDesc(want) {
		t.Fatalf("expected %q, got %q", rpctypes.ErrorDesc(want), rpctypes.ErrorDesc(err))
	}
	var typed rpctypes.EtcdError
	got := status.Code(err)
	if errors.As(err, &typed) {
		got = typed.Code()
	} else {
		t.Fatalf("the client did not recognise %q as an etcd error", err)
	}
	if got != code || status.Code(want) != code {
		t.Fatalf("expected code %v, got %v (%v)", code, got, err)
	}
}

func TestCRUDAndRevisions(t *testing.T) {
	s := startServer(t, "")
	c := s.client()
	x := ctx(t)
	empty := must(c.Get(x, "nothing"))
	if empty.Header.Revision != 1 || len(empty.Kvs) != 0 {
		t.Fatalf("an empty store is at revision 1 with no keys: %+v", empty)
	}
	p1 := must(c.Put(x, "k", "v1"))
	if p1.Header.Revision != 2 {
		t.Fatalf("first write is revision 2, got %d", p1.Header.Revision)
	}
	p2 := must(c.Put(x, "k", "v2", clientv3.WithPrevKV()))
	if string(p2.PrevKv.Value) != "v1" {
		t.Fatalf("prev_kv: %+v", p2.PrevKv)
	}
	g := must(c.Get(x, "k"))
	kv := g.Kvs[0]
	if kv.CreateRevision != 2 || kv.ModRevision != 3 || kv.Version != 2 || string(kv.Value) != "v2" {
		t.Fatalf("key state: %+v", kv)
	}
	must(c.Put(x, "k", "", clientv3.WithIgnoreValue()))
	if v := must(c.Get(x, "k")).Kvs[0]; string(v.Value) != "v2" || v.Version != 3 {
		t.Fatalf("ignore_value keeps the value: %+v", v)
	}
	_, err := c.Put(x, "missing", "", clientv3.WithIgnoreValue())
	wantErr(t, err, rpctypes.ErrGRPCKeyNotFound, codes.InvalidArgument)
	d := must(c.Delete(x, "k", clientv3.WithPrevKV()))
	if d.Deleted != 1 || string(d.PrevKvs[0].Value) != "v2" {
		t.Fatalf("delete: %+v", d)
	}
	none := must(c.Delete(x, "k"))
	if none.Deleted != 0 || none.Header.Revision != d.Header.Revision {
		t.Fatalf("deleting nothing does not move the revision: %+v", none)
	}
	again := must(c.Put(x, "k", "new"))
	if v := must(c.Get(x, "k")).Kvs[0]; v.Version != 1 || v.CreateRevision != again.Header.Revision {
		t.Fatalf("a re-created key starts a new generation: %+v", v)
	}
}

func TestEveryRangeOption(t *testing.T) {
	s := startServer(t, "")
	c := s.client()
	x := ctx(t)
	for i, k := range []string{"a", "b/1", "b/2", "b/3", "c"} {
		must(c.Put(x, k, strings.Repeat("v", 5-i)))
	}
	must(c.Put(x, "b/2", "again")) // b/2: version 2, mod revision 7
	pre := must(c.Get(x, "b/", clientv3.WithPrefix()))
	if pre.Count != 3 || len(pre.Kvs) != 3 {
		t.Fatalf("prefix: %+v", pre)
	}
	from := must(c.Get(x, "b/2", clientv3.WithFromKey()))
	if from.Count != 3 {
		t.Fatalf("from key: count %d", from.Count)
	}
	all := must(c.Get(x, "\x00", clientv3.WithFromKey()))
	if all.Count != 5 {
		t.Fatalf("all keys: count %d", all.Count)
	}
	lim := must(c.Get(x, "b/", clientv3.WithPrefix(), clientv3.WithLimit(2)))
	if len(lim.Kvs) != 2 || !lim.More || lim.Count != 3 {
		t.Fatalf("limit: kvs %d more %v count %d", len(lim.Kvs), lim.More, lim.Count)
	}
	old := must(c.Get(x, "b/2", clientv3.WithRev(4)))
	if string(old.Kvs[0].Value) != "vvv" || old.Header.Revision != 7 {
		t.Fatalf("a read at revision 4 sees that revision's value, with the current header: %+v", old)
	}
	if gone := must(c.Get(x, "b/2", clientv3.WithRev(3))); len(gone.Kvs) != 0 {
		t.Fatalf("b/2 did not exist at revision 3: %+v", gone)
	}
	desc := must(c.Get(x, "b/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend)))
	if string(desc.Kvs[0].Key) != "b/3" {
		t.Fatalf("sort descending: %s", desc.Kvs[0].Key)
	}
	byVer := must(c.Get(x, "b/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByVersion, clientv3.SortDescend)))
	if string(byVer.Kvs[0].Key) != "b/2" {
		t.Fatalf("sort by version: %s", byVer.Kvs[0].Key)
	}
	byVal := must(c.Get(x, "b/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByValue, clientv3.SortAscend), clientv3.WithKeysOnly()))
	if string(byVal.Kvs[0].Key) != "b/2" || len(byVal.Kvs[0].Value) != 0 {
		t.Fatalf("sort by value with keys only: %+v", byVal.Kvs[0])
	}
	cnt := must(c.Get(x, "b/", clientv3.WithPrefix(), clientv3.WithCountOnly()))
	if cnt.Count != 3 || len(cnt.Kvs) != 0 {
		t.Fatalf("count only: %+v", cnt)
	}
	keys := must(c.Get(x, "b/", clientv3.WithPrefix(), clientv3.WithKeysOnly()))
	for _, kv := range keys.Kvs {
		if len(kv.Value) != 0 || kv.ModRevision == 0 {
			t.Fatalf("keys only keeps metadata, drops values: %+v", kv)
		}
	}
	mod := must(c.Get(x, "b/", clientv3.WithPrefix(), clientv3.WithMinModRev(5)))
	if len(mod.Kvs) != 2 {
		t.Fatalf("min mod revision: %d", len(mod.Kvs))
	}
	created := must(c.Get(x, "b/", clientv3.WithPrefix(), clientv3.WithMaxCreateRev(4)))
	if len(created.Kvs) != 2 {
		t.Fatalf("max create revision: %d", len(created.Kvs))
	}
	serial := must(c.Get(x, "a", clientv3.WithSerializable()))
	if len(serial.Kvs) != 1 {
		t.Fatal("serializable read")
	}
	_, err := c.Get(x, "a", clientv3.WithRev(100))
	wantErr(t, err, rpctypes.ErrGRPCFutureRev, codes.OutOfRange)
}

// The four transaction shapes Kubernetes uses (client/v3/kubernetes).
func TestKubernetesTxnShapes(t *testing.T) {
	s := startServer(t, "")
	c := s.client()
	x := ctx(t)
	key := "/registry/pods/default/p"
	// Create: only if absent.
	create := func() *clientv3.TxnResponse {
		return must(c.Txn(x).If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).Then(clientv3.OpPut(key, "v1")).Commit())
	}
	r := create()
	if !r.Succeeded {
		t.Fatal("create should succeed")
	}
	rv := r.Header.Revision
	if got := must(c.Get(x, key)).Kvs[0]; got.ModRevision != rv || got.CreateRevision != rv {
		t.Fatalf("the txn header revision is the object's resourceVersion: %+v vs %d", got, rv)
	}
	if create().Succeeded {
		t.Fatal("a second create must fail")
	}
	// Update: if unchanged since rv, else read the current object.
	update := func(at int64, v string) *clientv3.TxnResponse {
		return must(c.Txn(x).If(clientv3.Compare(clientv3.ModRevision(key), "=", at)).
			Then(clientv3.OpPut(key, v)).Else(clientv3.OpGet(key)).Commit())
	}
	u := update(rv, "v2")
	if !u.Succeeded {
		t.Fatal("update at the current revision")
	}
	stale := update(rv, "v3")
	if stale.Succeeded || string(stale.Responses[0].GetResponseRange().Kvs[0].Value) != "v2" {
		t.Fatalf("a stale update fails and returns the current object: %+v", stale)
	}
	// Delete: if unchanged, else read.
	del := must(c.Txn(x).If(clientv3.Compare(clientv3.ModRevision(key), "=", u.Header.Revision)).
		Then(clientv3.OpDelete(key)).Else(clientv3.OpGet(key)).Commit())
	if !del.Succeeded || del.Responses[0].GetResponseDeleteRange().Deleted != 1 {
		t.Fatalf("delete: %+v", del)
	}
	// Compaction bookkeeping: CAS on compact_rev_key's version, then Compact.
	const ck = "compact_rev_key"
	book := func(version int64, rev int64) *clientv3.TxnResponse {
		return must(c.Txn(x).If(clientv3.Compare(clientv3.Version(ck), "=", version)).
			Then(clientv3.OpPut(ck, fmt.Sprint(rev))).Else(clientv3.OpGet(ck)).Commit())
	}
	b := book(0, del.Header.Revision)
	if !b.Succeeded {
		t.Fatal("first compaction bookkeeping")
	}
	must(c.Compact(x, del.Header.Revision))
	lost := book(0, 99)
	if lost.Succeeded || lost.Responses[0].GetResponseRange().Kvs[0].Version != 1 {
		t.Fatalf("another apiserver loses the race and sees version 1: %+v", lost)
	}
}

// Kubernetes lists in pages pinned to the first page's revision, continuing from the last key.
func TestPaginatedListPinnedToFirstRevision(t *testing.T) {
	s := startServer(t, "")
	c := s.client()
	x := ctx(t)
	for i := 0; i < 25; i++ {
		must(c.Put(x, fmt.Sprintf("/registry/cm/%02d", i), "x"))
	}
	prefix := "/registry/cm/"
	end := clientv3.GetPrefixRangeEnd(prefix)
	first := must(c.Get(x, prefix, clientv3.WithRange(end), clientv3.WithLimit(10)))
	if first.Count != 25 || !first.More || len(first.Kvs) != 10 {
		t.Fatalf("first page: count %d more %v kvs %d", first.Count, first.More, len(first.Kvs))
	}
	rev := first.Header.Revision
	must(c.Put(x, prefix+"99-late", "x")) // must not appear in later pages
	seen := len(first.Kvs)
	next := string(first.Kvs[len(first.Kvs)-1].Key) + "\x00"
	for {
		page := must(c.Get(x, next, clientv3.WithRange(end), clientv3.WithLimit(10), clientv3.WithRev(rev)))
		seen += len(page.Kvs)
		if int64(seen)+page.Count-int64(len(page.Kvs)) < 25 {
			t.Fatalf("count must be exact at the pinned revision: %d", page.Count)
		}
		if !page.More {
			break
		}
		next = string(page.Kvs[len(page.Kvs)-1].Key) + "\x00"
	}
	if seen != 25 {
		t.Fatalf("pages pinned to revision %d hold exactly 25 keys, saw %d", rev, seen)
	}
}

func TestCompactionErrors(t *testing.T) {
	s := startServer(t, "")
	c := s.client()
	x := ctx(t)
	for i := 0; i < 5; i++ {
		must(c.Put(x, "k", fmt.Sprint(i)))
	}
	must(c.Compact(x, 4, clientv3.WithCompactPhysical()))
	_, err := c.Get(x, "k", clientv3.WithRev(3))
	wantErr(t, err, rpctypes.ErrGRPCCompacted, codes.OutOfRange)
	if got := must(c.Get(x, "k", clientv3.WithRev(4))); string(got.Kvs[0].Value) != "2" {
		t.Fatalf("reading at the compact revision works: %+v", got)
	}
	_, err = c.Compact(x, 4)
	wantErr(t, err, rpctypes.ErrGRPCCompacted, codes.OutOfRange)
	_, err = c.Compact(x, 100)
	wantErr(t, err, rpctypes.ErrGRPCFutureRev, codes.OutOfRange)
}

func TestLimitsAndErrorStrings(t *testing.T) {
	s := startServer(t, "")
	c := s.client()
	x := ctx(t)
	ops := make([]clientv3.Op, 129)
	for i := range ops {
		ops[i] = clientv3.OpPut(fmt.Sprint("k", i), "v")
	}
	_, err := c.Txn(x).Then(ops...).Commit()
	wantErr(t, err, rpctypes.ErrGRPCTooManyOps, codes.InvalidArgument)
	must(c.Txn(x).Then(ops[:128]...).Commit())
	_, err = c.Txn(x).Then(clientv3.OpPut("d", "1"), clientv3.OpPut("d", "2")).Commit()
	wantErr(t, err, rpctypes.ErrGRPCDuplicateKey, codes.InvalidArgument)
	_, err = c.Put(x, "", "v")
	wantErr(t, err, rpctypes.ErrGRPCEmptyKey, codes.InvalidArgument)
	_, err = c.Put(x, "big", strings.Repeat("x", 1600*1024))
	wantErr(t, err, rpctypes.ErrGRPCRequestTooLarge, codes.InvalidArgument)
	big := strings.Repeat("x", 1400*1024)
	if _, err := c.Put(x, "ok", big); err != nil {
		t.Fatalf("a value under the limit is accepted: %v", err)
	}
	if got := must(c.Get(x, "ok")); len(got.Kvs) != 1 || string(got.Kvs[0].Value) != big {
		t.Fatal("a large value reads back whole")
	}
}

func TestStatusAndMemberList(t *testing.T) {
	s := startServer(t, "")
	c := s.client()
	x := ctx(t)
	st := must(c.Status(x, s.url))
	// cairn reports an etcd version from the 3.6 line; etcd reports its own.
	wantVersion := "3.6."
	if etcdBin() != "" {
		wantVersion = "3."
	}
	if !strings.HasPrefix(st.Version, wantVersion) || st.Leader == 0 || st.Leader != st.Header.MemberId || st.RaftTerm == 0 {
		t.Fatalf("status: %+v", st)
	}
	ml := must(c.MemberList(x))
	if len(ml.Members) != 1 || ml.Members[0].ID != st.Header.MemberId || ml.Members[0].ClientURLs[0] != s.url {
		t.Fatalf("member list: %+v", ml.Members)
	}
}

func TestKillAndRestartKeepsAcknowledgedWrites(t *testing.T) {
	dir := t.TempDir()
	s := startServer(t, dir)
	c := s.client()
	x := ctx(t)
	var last int64
	for i := 0; i < 300; i++ {
		last = must(c.Put(x, fmt.Sprintf("k%03d", i), fmt.Sprint(i))).Header.Revision
	}
	s.kill()
	s.start()
	c2 := s.client()
	got := must(c2.Get(x, "k", clientv3.WithPrefix(), clientv3.WithCountOnly()))
	if got.Count != 300 || got.Header.Revision != last {
		t.Fatalf("after SIGKILL and restart: count %d revision %d (want 300, %d)", got.Count, got.Header.Revision, last)
	}
}

func TestHealthAndRequireLeader(t *testing.T) {
	s := startServer(t, "")
	c := s.client()
	x := ctx(t)
	// The standard gRPC health service answers SERVING.
	hc := healthpb.NewHealthClient(c.ActiveConnection())
	h := must(hc.Check(x, &healthpb.HealthCheckRequest{}))
	if h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("grpc health: %v", h.Status)
	}
	// Calls with hasleader=true (clientv3.WithRequireLeader) succeed while a leader exists.
	must(c.Put(clientv3.WithRequireLeader(x), "rl", "v"))
	if got := must(c.Get(clientv3.WithRequireLeader(x), "rl")); len(got.Kvs) != 1 {
		t.Fatal("read with hasleader")
	}
}

// A transaction op with no request set is refused (etcd's checkRequestOp), not silently dropped.
func TestEmptyTxnOpIsRefused(t *testing.T) {
	s := startServer(t, "")
	c := s.client()
	x := ctx(t)
	// The Go client refuses to build an empty op, so send it with the raw stub.
	raw := pb.NewKVClient(c.ActiveConnection())
	_, err := raw.Txn(x, &pb.TxnRequest{Success: []*pb.RequestOp{{}}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "key not found") {
		t.Fatalf("an empty op must be refused with etcd's error, got %v", err)
	}
}
