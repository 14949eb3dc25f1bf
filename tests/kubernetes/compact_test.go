package k8scontract

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/coreos/go-semver/semver"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"
)

// compactRevKey is the key kube-apiserver's compactors coordinate through.
const compactRevKey = "compact_rev_key"

// compactor is one kube-apiserver's compactor state: t is the version of compactRevKey it last
// saw, rev the revision it saw one interval ago, which it will compact at.
type compactor struct {
	c      *clientv3.Client
	t, rev int64
}

// interval is one compaction interval: a CAS on compactRevKey's version that, if it wins, records
// rev and then compacts at rev (never on the first interval, where rev is 0); if it loses, the
// compactor adopts the winner's version. Either way it remembers the current revision for the
// next interval. It returns whether the CAS won and the revision compacted (0 for none).
func (cp *compactor) interval(ctx context.Context) (won bool, compacted int64, err error) {
	resp, err := cp.c.Txn(ctx).If(
		clientv3.Compare(clientv3.Version(compactRevKey), "=", cp.t),
	).Then(
		clientv3.OpPut(compactRevKey, strconv.FormatInt(cp.rev, 10)),
	).Else(
		clientv3.OpGet(compactRevKey),
	).Commit()
	if err != nil {
		return false, 0, err
	}
	current := resp.Header.Revision
	if !resp.Succeeded {
		kvs := resp.Responses[0].GetResponseRange().GetKvs()
		if len(kvs) != 1 {
			return false, 0, fmt.Errorf("failed CAS on %s returned %d kvs, want 1", compactRevKey, len(kvs))
		}
		cp.t, cp.rev = kvs[0].Version, current
		return false, 0, nil
	}
	cp.t++
	toCompact := cp.rev
	cp.rev = current
	if toCompact == 0 {
		return true, 0, nil
	}
	if _, err := cp.c.Compact(ctx, toCompact); err != nil {
		return true, 0, err
	}
	return true, toCompact, nil
}

// race runs one interval on every compactor at once, as apiservers whose timers fire together,
// and checks that exactly one won, compacting at wantCompacted, and that afterwards all agree on
// the key's version and the revision to compact next.
func race(t *testing.T, ctx context.Context, wantCompacted int64, cps ...*compactor) {
	t.Helper()
	type result struct {
		won       bool
		compacted int64
		err       error
	}
	results := make([]result, len(cps))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, cp := range cps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r := &results[i]
			r.won, r.compacted, r.err = cp.interval(ctx)
		}()
	}
	close(start)
	wg.Wait()
	winners := 0
	for i, r := range results {
		if r.err != nil {
			t.Fatalf("apiserver %d: %v", i, r.err)
		}
		if r.won {
			winners++
			if r.compacted != wantCompacted {
				t.Fatalf("apiserver %d won and compacted at %d, want %d", i, r.compacted, wantCompacted)
			}
		}
	}
	if winners != 1 {
		t.Fatalf("%d apiservers won the interval's CAS, want exactly 1", winners)
	}
	for i, cp := range cps[1:] {
		if cp.t != cps[0].t || cp.rev != cps[0].rev {
			t.Fatalf("apiservers disagree after the interval: %d has t=%d rev=%d, 0 has t=%d rev=%d", i+1, cp.t, cp.rev, cps[0].t, cps[0].rev)
		}
	}
}

// TestCompactor: kube-apiserver's compactor bookkeeping (storage/etcd3/compact.go) with two
// apiservers racing every interval; compact_rev_key's version and value are exact and watchable;
// after each compaction reads and watches below it fail with ErrCompacted while the latest
// values and the events from the compact revision on remain; a tombstone at the compaction
// revision stays visible to a watch from there.
func TestCompactor(t *testing.T) {
	e := newEnv(t, serverOpts{})
	a := &compactor{c: e.c.Client}
	b := &compactor{c: e.s.client().Client} // a second apiserver, with its own connection
	wctx := e.watchCtx()
	keyWatch := e.c.Watch(wctx, compactRevKey, clientv3.WithRev(e.rev()+1), clientv3.WithPrevKV())

	// Interval 1 (bootstrap): the winner creates the key with value "0"; nothing is compacted.
	race(t, e.ctx, 0, a, b)
	g := e.get(compactRevKey, 0)
	if g.KV == nil {
		t.Fatalf("%s missing after interval 1", compactRevKey)
	}
	p1 := g.KV.ModRevision
	checkKV(t, "compact_rev_key after interval 1", g.KV, kv(compactRevKey, "0", p1, p1, 1))
	if a.t != 1 || a.rev != p1 {
		t.Fatalf("after interval 1: t=%d rev=%d, want 1 and %d", a.t, a.rev, p1)
	}

	// Objects written during the interval.
	const prefix = "/registry/pods/"
	o, gone := prefix+"ns/o", prefix+"ns/gone"
	ro1 := e.create(o, "o1", 0)
	ro2 := e.update(o, "o2", ro1)
	rg := e.create(gone, "g", 0)
	rgDel := e.del(gone, rg)

	// Interval 2: the winner records p1 and compacts at it.
	race(t, e.ctx, p1, a, b)
	g = e.get(compactRevKey, 0)
	if g.KV == nil {
		t.Fatalf("%s missing after interval 2", compactRevKey)
	}
	p2 := g.KV.ModRevision
	checkKV(t, "compact_rev_key after interval 2", g.KV, kv(compactRevKey, strconv.FormatInt(p1, 10), p1, p2, 2))
	checkCompactedAt(t, e, p1, "0")
	// A watch from the compact revision has every later event, with prev_kv.
	evs := collectEvents(t, e.kubeWatch(wctx, prefix, p1-1), 4, 10*time.Second)
	checkEvents(t, "pods from the first compact revision", evs, []wantEvent{
		put(kv(o, "o1", ro1, ro1, 1), nil),
		put(kv(o, "o2", ro1, ro2, 2), kv(o, "o1", ro1, ro1, 1)),
		put(kv(gone, "g", rg, rg, 1), nil),
		deleted(gone, rgDel, kv(gone, "g", rg, rg, 1)),
	})

	// Interval 3: the winner records p2 and compacts at it.
	race(t, e.ctx, p2, a, b)
	g = e.get(compactRevKey, 0)
	if g.KV == nil {
		t.Fatalf("%s missing after interval 3", compactRevKey)
	}
	p3 := g.KV.ModRevision
	checkKV(t, "compact_rev_key after interval 3", g.KV, kv(compactRevKey, strconv.FormatInt(p2, 10), p1, p3, 3))
	checkCompactedAt(t, e, p2, strconv.FormatInt(p1, 10))
	// The latest values survive, with their history counters.
	l := e.list(prefix, kubernetes.ListOptions{})
	if len(l.Kvs) != 1 || l.Count != 1 {
		t.Fatalf("List after compaction: %d objects, count %d", len(l.Kvs), l.Count)
	}
	checkKV(t, "object after compaction", l.Kvs[0], kv(o, "o2", ro1, ro2, 2))

	// compact_rev_key is watchable: each interval's write, value and version exact.
	checkEvents(t, "compact_rev_key watch", collectEvents(t, keyWatch, 3, 10*time.Second), []wantEvent{
		put(kv(compactRevKey, "0", p1, p1, 1), nil),
		put(kv(compactRevKey, strconv.FormatInt(p1, 10), p1, p2, 2), kv(compactRevKey, "0", p1, p1, 1)),
		put(kv(compactRevKey, strconv.FormatInt(p2, 10), p1, p3, 3), kv(compactRevKey, strconv.FormatInt(p1, 10), p1, p2, 2)),
	})

	t.Run("TombstoneAtCompactRevision", func(t *testing.T) {
		e.s.requireEtcd(t, func(v semver.Version) bool {
			return atLeast(v, 3, 4, 34) && !(atLeast(v, 3, 5, 0) && !atLeast(v, 3, 5, 16))
		}, "the tombstone at the compaction revision (kept since etcd 3.4.34, 3.5.16)")
		x := prefix + "ns/x"
		rx := e.create(x, "x", 0)
		d := e.del(x, rx)
		ry := e.create(prefix+"ns/y", "y", 0)
		_, err := e.c.Compact(e.ctx, d)
		noErr(t, err, "Compact at the delete's revision")
		evs := collectEvents(t, e.kubeWatch(wctx, prefix, d-1), 2, 10*time.Second)
		if evs[0].Type != mvccpb.DELETE || string(evs[0].Kv.Key) != x || evs[0].Kv.ModRevision != d {
			t.Fatalf("watch from the compaction revision %d starts with %s, want the DELETE of %s", d, fmtEvent(evs[0]), x)
		}
		checkEvents(t, "after the tombstone", evs[1:], []wantEvent{put(kv(prefix+"ns/y", "y", ry, ry, 1), nil)})
		if g := e.get(x, d); g.KV != nil {
			t.Fatalf("Get %s at its delete revision: %v", x, g.KV)
		}
		_, err = e.k.Get(e.ctx, x, kubernetes.GetOptions{Revision: d - 1})
		wantErr(t, "Get below the compaction revision", err, rpctypes.ErrCompacted)
	})
}

// checkCompactedAt checks that the store is compacted at exactly c: reads and watches at c-1
// fail with ErrCompacted, reads at c work (compact_rev_key had value valueAtC there).
func checkCompactedAt(t *testing.T, e *env, c int64, valueAtC string) {
	t.Helper()
	_, err := e.k.Get(e.ctx, compactRevKey, kubernetes.GetOptions{Revision: c - 1})
	wantErr(t, fmt.Sprintf("Get at %d below the compaction at %d", c-1, c), err, rpctypes.ErrCompacted)
	_, err = e.k.List(e.ctx, "/registry/", kubernetes.ListOptions{Revision: c - 1, Limit: 10})
	wantErr(t, fmt.Sprintf("List at %d below the compaction at %d", c-1, c), err, rpctypes.ErrCompacted)
	if g := e.get(compactRevKey, c); g.KV == nil || string(g.KV.Value) != valueAtC {
		t.Fatalf("Get %s at the compact revision %d: %v, want value %q", compactRevKey, c, g.KV, valueAtC)
	}
	resp := nextResponse(t, e.kubeWatch(e.watchCtx(), "/registry/", c-2), 5*time.Second)
	if !resp.Canceled || resp.CompactRevision != c || !errors.Is(resp.Err(), rpctypes.ErrCompacted) {
		t.Fatalf("watch from %d after compacting at %d: canceled=%v compact_revision=%d err=%v",
			c-1, c, resp.Canceled, resp.CompactRevision, resp.Err())
	}
}
