package k8scontract

import (
	"errors"
	"fmt"
	"sort"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"
)

// checkKV compares an object with what it must be; a nil want means "no object".
func checkKV(t *testing.T, what string, got *mvccpb.KeyValue, want *mvccpb.KeyValue) {
	t.Helper()
	if want == nil {
		if got != nil {
			t.Fatalf("%s: got %q=%q at %d, want no object", what, got.Key, got.Value, got.ModRevision)
		}
		return
	}
	if got == nil {
		t.Fatalf("%s: no object, want %q=%q at %d", what, want.Key, want.Value, want.ModRevision)
	}
	if string(got.Key) != string(want.Key) || string(got.Value) != string(want.Value) ||
		got.CreateRevision != want.CreateRevision || got.ModRevision != want.ModRevision ||
		got.Version != want.Version || got.Lease != want.Lease {
		t.Fatalf("%s:\n got  key=%q value=%q create=%d mod=%d version=%d lease=%d\n want key=%q value=%q create=%d mod=%d version=%d lease=%d",
			what, got.Key, got.Value, got.CreateRevision, got.ModRevision, got.Version, got.Lease,
			want.Key, want.Value, want.CreateRevision, want.ModRevision, want.Version, want.Lease)
	}
}

func kv(key, val string, create, mod, version int64) *mvccpb.KeyValue {
	return &mvccpb.KeyValue{Key: []byte(key), Value: []byte(val), CreateRevision: create, ModRevision: mod, Version: version}
}

func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: got error %v, want %v", what, err, want)
	}
}

// TestOptimisticPutAndDelete: Create, GuaranteedUpdate and Delete as kube-apiserver issues them
// (Txn If mod_revision == expected Then Put/Delete Else Get), including conflicts.
func TestOptimisticPutAndDelete(t *testing.T) {
	e := newEnv(t, serverOpts{})
	const key = "/registry/configmaps/default/cm"

	// Create: expected revision 0 means "does not exist".
	r1 := e.create(key, "v1", 0)
	g := e.get(key, 0)
	checkKV(t, "after create", g.KV, kv(key, "v1", r1, r1, 1))
	if g.Revision != r1 {
		t.Fatalf("Get header revision %d after create at %d", g.Revision, r1)
	}

	// A second Create of the same key conflicts and returns the existing object; no revision is used.
	p, err := e.k.OptimisticPut(e.ctx, key, []byte("dup"), 0, kubernetes.PutOptions{GetOnFailure: true})
	noErr(t, err, "create existing")
	if p.Succeeded || p.Revision != r1 {
		t.Fatalf("create existing: Succeeded=%v Revision=%d, want false at %d", p.Succeeded, p.Revision, r1)
	}
	checkKV(t, "create existing returns current", p.KV, kv(key, "v1", r1, r1, 1))

	// Update at the right revision: the header revision is the object's new mod_revision.
	r2 := e.update(key, "v2", r1)
	if r2 != r1+1 {
		t.Fatalf("update revision %d, want %d", r2, r1+1)
	}
	checkKV(t, "after update", e.get(key, 0).KV, kv(key, "v2", r1, r2, 2))

	// Update at a stale revision: Succeeded=false, the current object comes back, nothing changes.
	p, err = e.k.OptimisticPut(e.ctx, key, []byte("stale"), r1, kubernetes.PutOptions{GetOnFailure: true})
	noErr(t, err, "stale update")
	if p.Succeeded || p.Revision != r2 {
		t.Fatalf("stale update: Succeeded=%v Revision=%d, want false at %d", p.Succeeded, p.Revision, r2)
	}
	checkKV(t, "stale update returns current", p.KV, kv(key, "v2", r1, r2, 2))
	p, err = e.k.OptimisticPut(e.ctx, key, []byte("stale"), r1, kubernetes.PutOptions{})
	noErr(t, err, "stale update without GetOnFailure")
	if p.Succeeded || p.KV != nil || p.Revision != r2 {
		t.Fatalf("stale update without GetOnFailure: %+v", p)
	}
	checkKV(t, "after stale updates", e.get(key, 0).KV, kv(key, "v2", r1, r2, 2))

	// Delete at a stale revision (and with "must not exist"): conflict, current object returned.
	for _, stale := range []int64{r1, 0} {
		d, err := e.k.OptimisticDelete(e.ctx, key, stale, kubernetes.DeleteOptions{GetOnFailure: true})
		noErr(t, err, "stale delete")
		if d.Succeeded || d.Revision != r2 {
			t.Fatalf("delete at %d: Succeeded=%v Revision=%d, want false at %d", stale, d.Succeeded, d.Revision, r2)
		}
		checkKV(t, fmt.Sprintf("delete at %d returns current", stale), d.KV, kv(key, "v2", r1, r2, 2))
	}

	// Delete at the right revision.
	r3 := e.del(key, r2)
	if r3 != r2+1 {
		t.Fatalf("delete revision %d, want %d", r3, r2+1)
	}
	g = e.get(key, 0)
	checkKV(t, "after delete", g.KV, nil)
	if g.Revision != r3 {
		t.Fatalf("Get header revision %d after delete at %d", g.Revision, r3)
	}
	checkKV(t, "history before the delete", e.get(key, r2).KV, kv(key, "v2", r1, r2, 2))

	// Update or delete of the deleted object conflicts with nothing to return.
	d, err := e.k.OptimisticDelete(e.ctx, key, r2, kubernetes.DeleteOptions{GetOnFailure: true})
	noErr(t, err, "delete deleted")
	if d.Succeeded || d.KV != nil || d.Revision != r3 {
		t.Fatalf("delete of a deleted object: %+v", d)
	}
	p, err = e.k.OptimisticPut(e.ctx, key, []byte("v3"), r2, kubernetes.PutOptions{GetOnFailure: true})
	noErr(t, err, "update deleted")
	if p.Succeeded || p.KV != nil || p.Revision != r3 {
		t.Fatalf("update of a deleted object: %+v", p)
	}

	// Re-create: a new generation (version 1, create_revision = mod_revision).
	r4 := e.create(key, "v4", 0)
	checkKV(t, "after re-create", e.get(key, 0).KV, kv(key, "v4", r4, r4, 1))
}

// TestGetListCount: Get with and without a revision, List with pagination pinned to the first
// page's revision while writes go on, Count, and prefix boundaries.
func TestGetListCount(t *testing.T) {
	e := newEnv(t, serverOpts{})
	const prefix = "/registry/pods/"
	// Neighbours that a prefix range must leave out.
	for _, k := range []string{"/registry/pods", "/registry/pods0", "/registry/podsecuritypolicies/p", "/registry/pod/x"} {
		e.create(k, "outside", 0)
	}
	created := map[string]int64{}
	var names []string
	for i := 0; i < 25; i++ {
		k := fmt.Sprintf("%sdefault/pod-%02d", prefix, i)
		created[k] = e.create(k, fmt.Sprintf("v0-%02d", i), 0)
		names = append(names, k)
	}
	last := prefix + "\xff\xfe"
	created[last] = e.create(last, "last", 0)
	names = append(names, last)

	// Get: latest, at past revisions, missing, future.
	pod0 := names[0]
	c0 := created[pod0]
	u1 := e.update(pod0, "v1", c0)
	u2 := e.update(pod0, "v2", u1)
	for _, c := range []struct {
		rev  int64
		want *mvccpb.KeyValue
	}{
		{0, kv(pod0, "v2", c0, u2, 3)}, {u2, kv(pod0, "v2", c0, u2, 3)}, {u1, kv(pod0, "v1", c0, u1, 2)},
		{u1 - 1, kv(pod0, "v0-00", c0, c0, 1)}, {c0, kv(pod0, "v0-00", c0, c0, 1)}, {c0 - 1, nil},
	} {
		g := e.get(pod0, c.rev)
		checkKV(t, fmt.Sprintf("Get at %d", c.rev), g.KV, c.want)
		if g.Revision != u2 {
			t.Fatalf("Get at %d: header revision %d, want the current %d", c.rev, g.Revision, u2)
		}
	}
	if g := e.get(prefix+"default/missing", 0); g.KV != nil || g.Revision != u2 {
		t.Fatalf("Get of a missing key: %+v", g)
	}
	_, err := e.k.Get(e.ctx, pod0, kubernetes.GetOptions{Revision: u2 + 10})
	wantErr(t, "Get at a future revision", err, rpctypes.ErrFutureRev)
	_, err = e.k.List(e.ctx, prefix, kubernetes.ListOptions{Revision: u2 + 10, Limit: 5})
	wantErr(t, "List at a future revision", err, rpctypes.ErrFutureRev)

	// The current resourceVersion: List(prefix, limit 1), only its revision is used.
	if l := e.list(prefix, kubernetes.ListOptions{Limit: 1}); l.Revision != u2 || len(l.Kvs) != 1 || l.Count != 26 {
		t.Fatalf("List limit 1: revision %d count %d len %d, want %d, 26, 1", l.Revision, l.Count, len(l.Kvs), u2)
	}

	// Unpaginated List and Count see exactly the prefix.
	full := e.list(prefix, kubernetes.ListOptions{})
	if got := keysOf(full.Kvs); fmt.Sprint(got) != fmt.Sprint(names) {
		t.Fatalf("List %s: keys %q\nwant %q", prefix, got, names)
	}
	if full.Count != 26 || full.Revision != u2 {
		t.Fatalf("List: count %d revision %d, want 26 at %d", full.Count, full.Revision, u2)
	}
	if n, err := e.k.Count(e.ctx, prefix, kubernetes.CountOptions{}); err != nil || n != 26 {
		t.Fatalf("Count: %d, %v; want 26", n, err)
	}
	if n, err := e.k.Count(e.ctx, "/registry/nothing/", kubernetes.CountOptions{}); err != nil || n != 0 {
		t.Fatalf("Count of an empty prefix: %d, %v", n, err)
	}

	// Paginate by 10, pinned to the first page's revision, with writes between pages that touch
	// keys on pages not read yet, and before the continue key.
	first := e.list(prefix, kubernetes.ListOptions{Limit: 10})
	pinned := first.Revision
	snapshot := full.Kvs // nothing was written since the unpaginated List
	pages := []kubernetes.ListResponse{first}
	seen := len(first.Kvs)
	write := 0
	for page := first; len(page.Kvs) < int(page.Count); {
		// The writes: a new pod at the end, an update and a delete of unread pods, and a pod that
		// sorts before the continue key.
		write++
		e.create(fmt.Sprintf("%sdefault/pod-%02d-new", prefix, 30+write), "new", 0)
		victim := names[10*write+3]
		rv := e.get(victim, 0).KV.ModRevision
		e.update(victim, "changed", rv)
		gone := names[10*write+4]
		e.del(gone, e.get(gone, 0).KV.ModRevision)
		e.create(fmt.Sprintf("%sdefault/pod-00-%d", prefix, write), "early", 0)

		cont := string(page.Kvs[len(page.Kvs)-1].Key) + "\x00"
		page = e.list(prefix, kubernetes.ListOptions{Revision: pinned, Limit: 10, Continue: cont})
		if page.Revision <= pinned {
			t.Fatalf("page %d: header revision %d, want the current revision (> %d)", len(pages), page.Revision, pinned)
		}
		if want := int64(len(snapshot) - seen); page.Count != want {
			t.Fatalf("page %d (continue %q): count %d, want the %d keys left at revision %d", len(pages), cont, page.Count, want, pinned)
		}
		if len(page.Kvs) == 0 || len(page.Kvs) > 10 {
			t.Fatalf("page %d: %d keys", len(pages), len(page.Kvs))
		}
		seen += len(page.Kvs)
		pages = append(pages, page)
		if len(pages) > 5 {
			t.Fatal("pagination does not end")
		}
	}
	if len(pages) != 3 || len(pages[0].Kvs) != 10 || len(pages[1].Kvs) != 10 || len(pages[2].Kvs) != 6 {
		t.Fatalf("pages of %v keys, want 10, 10, 6", pageSizes(pages))
	}
	var got []*mvccpb.KeyValue
	for _, p := range pages {
		got = append(got, p.Kvs...)
	}
	if len(got) != len(snapshot) {
		t.Fatalf("pages hold %d keys, the store at %d held %d", len(got), pinned, len(snapshot))
	}
	for i := range got {
		checkKV(t, fmt.Sprintf("paginated key %d", i), got[i], snapshot[i])
	}
	if !sort.SliceIsSorted(got, func(i, j int) bool { return string(got[i].Key) < string(got[j].Key) }) {
		t.Fatal("pages are not in key order")
	}

	// The writes are visible at the latest revision: per round one new, one deleted, one early.
	if n, err := e.k.Count(e.ctx, prefix, kubernetes.CountOptions{}); err != nil || n != 26+int64(write) {
		t.Fatalf("Count after the writes: %d, %v; want %d", n, err, 26+write)
	}
	if l := e.list(prefix, kubernetes.ListOptions{}); int64(len(l.Kvs)) != l.Count || l.Count != 26+int64(write) {
		t.Fatalf("List after the writes: %d keys, count %d", len(l.Kvs), l.Count)
	}
}

func keysOf(kvs []*mvccpb.KeyValue) []string {
	var out []string
	for _, kv := range kvs {
		out = append(out, string(kv.Key))
	}
	return out
}

func pageSizes(pages []kubernetes.ListResponse) []int {
	var out []int
	for _, p := range pages {
		out = append(out, len(p.Kvs))
	}
	return out
}

// TestLeaseTTLObjects: an Event-like object written with a lease (LeaseGrant, then the lease ID
// in OptimisticPut's options, one lease shared by several objects as kube-apiserver's lease
// manager does) disappears when the TTL runs out: every attached key in one revision, as
// ordinary DELETE watch events that carry prev_kv. Unleased objects stay.
func TestLeaseTTLObjects(t *testing.T) {
	e := newEnv(t, serverOpts{})
	const prefix = "/registry/events/default/"
	const ttl = 2
	lease, err := e.c.Grant(e.ctx, ttl)
	noErr(t, err, "LeaseGrant")
	if lease.TTL < ttl {
		t.Fatalf("LeaseGrant TTL %d, asked for %d", lease.TTL, ttl)
	}
	start := e.rev()
	wctx := clientv3.WithRequireLeader(e.ctx)
	wch := e.c.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(start+1), clientv3.WithPrevKV(), clientv3.WithProgressNotify())

	r1 := e.create(prefix+"ev1", "e1", lease.ID)
	r2 := e.create(prefix+"ev2", "e2", lease.ID)
	rk := e.create(prefix+"kept", "k", 0)
	want1 := kv(prefix+"ev1", "e1", r1, r1, 1)
	want1.Lease = int64(lease.ID)
	want2 := kv(prefix+"ev2", "e2", r2, r2, 1)
	want2.Lease = int64(lease.ID)
	checkKV(t, "leased object", e.get(prefix+"ev1", 0).KV, want1)
	granted := time.Now()

	evs := collectEvents(t, wch, 5, 20*time.Second)
	gone := time.Since(granted)
	t.Logf("leased objects expired %.1fs after the writes (TTL %ds)", gone.Seconds(), lease.TTL)
	for i, want := range []*mvccpb.KeyValue{want1, want2, kv(prefix+"kept", "k", rk, rk, 1)} {
		if evs[i].Type != clientv3.EventTypePut || !evs[i].IsCreate() || evs[i].PrevKv != nil {
			t.Fatalf("event %d: %v, want a create", i, fmtEvent(evs[i]))
		}
		checkKV(t, fmt.Sprintf("event %d", i), evs[i].Kv, want)
	}
	del := evs[3:]
	if del[0].Kv.ModRevision != del[1].Kv.ModRevision || del[0].Kv.ModRevision <= rk {
		t.Fatalf("expiry deletes at revisions %d and %d, want one revision after %d", del[0].Kv.ModRevision, del[1].Kv.ModRevision, rk)
	}
	sort.Slice(del, func(i, j int) bool { return string(del[i].Kv.Key) < string(del[j].Kv.Key) })
	for i, want := range []*mvccpb.KeyValue{want1, want2} {
		if del[i].Type != clientv3.EventTypeDelete || string(del[i].Kv.Key) != string(want.Key) {
			t.Fatalf("expiry event %d: %v, want DELETE %s", i, fmtEvent(del[i]), want.Key)
		}
		checkKV(t, fmt.Sprintf("expiry event %d prev_kv", i), del[i].PrevKv, want)
	}
	if g := e.get(prefix+"ev1", 0); g.KV != nil || g.Revision != del[0].Kv.ModRevision {
		t.Fatalf("after expiry: Get ev1 = %+v, want nothing at revision %d", g, del[0].Kv.ModRevision)
	}
	if n, err := e.k.Count(e.ctx, prefix, kubernetes.CountOptions{}); err != nil || n != 1 {
		t.Fatalf("Count after expiry: %d, %v; want 1", n, err)
	}
	checkKV(t, "unleased object", e.get(prefix+"kept", 0).KV, kv(prefix+"kept", "k", rk, rk, 1))
}
