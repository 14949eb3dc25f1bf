package k8scontract

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"
)

func fmtEvent(ev *clientv3.Event) string {
	s := fmt.Sprintf("%s %q=%q mod=%d create=%d ver=%d", ev.Type, ev.Kv.Key, ev.Kv.Value, ev.Kv.ModRevision, ev.Kv.CreateRevision, ev.Kv.Version)
	if ev.PrevKv != nil {
		s += fmt.Sprintf(" prev=%q@%d", ev.PrevKv.Value, ev.PrevKv.ModRevision)
	}
	return s
}

func fmtEvents(evs []*clientv3.Event) string {
	var b strings.Builder
	for _, ev := range evs {
		b.WriteString("\n  " + fmtEvent(ev))
	}
	return b.String()
}

// kubeWatch opens the watch kube-apiserver's cacher runs: over a hasleader stream, on a prefix,
// from start_revision = list revision + 1, with prev_kv and progress_notify. ctx (from watchCtx)
// picks the stream: RequestProgress must be sent with the same ctx to reach it.
func (e *env) kubeWatch(ctx context.Context, prefix string, listRev int64) clientv3.WatchChan {
	return e.c.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(listRev+1), clientv3.WithPrevKV(), clientv3.WithProgressNotify())
}

func (e *env) watchCtx() context.Context {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(e.ctx))
	e.t.Cleanup(cancel)
	return ctx
}

// nextResponse is the next response on wch; the test fails if none comes within timeout or the
// channel closes.
func nextResponse(t *testing.T, wch clientv3.WatchChan, timeout time.Duration) clientv3.WatchResponse {
	t.Helper()
	select {
	case resp, ok := <-wch:
		if !ok {
			t.Fatal("watch channel closed")
		}
		return resp
	case <-time.After(timeout):
		t.Fatalf("no watch response within %v", timeout)
	}
	panic("unreachable")
}

// collectEvents reads exactly n events from wch (skipping progress notifications), checking that
// revisions never go backwards and that no response's header revision is behind its events.
func collectEvents(t *testing.T, wch clientv3.WatchChan, n int, timeout time.Duration) []*clientv3.Event {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var evs []*clientv3.Event
	for len(evs) < n {
		resp := nextResponse(t, wch, time.Until(deadline))
		if err := resp.Err(); err != nil || resp.Canceled {
			t.Fatalf("watch canceled after %d of %d events: %v (compact_revision %d)%s", len(evs), n, err, resp.CompactRevision, fmtEvents(evs))
		}
		checkResponse(t, resp, evs)
		evs = append(evs, resp.Events...)
	}
	if len(evs) > n {
		t.Fatalf("%d events, want %d:%s", len(evs), n, fmtEvents(evs))
	}
	return evs
}

func checkResponse(t *testing.T, resp clientv3.WatchResponse, before []*clientv3.Event) {
	t.Helper()
	last := int64(0)
	if len(before) > 0 {
		last = before[len(before)-1].Kv.ModRevision
	}
	for _, ev := range resp.Events {
		if ev.Kv.ModRevision < last {
			t.Fatalf("event revision went back from %d: %s", last, fmtEvent(ev))
		}
		last = ev.Kv.ModRevision
	}
	if resp.Header.Revision < last {
		t.Fatalf("response header revision %d is behind its events (up to %d)", resp.Header.Revision, last)
	}
}

// untilProgress reads wch until a progress notification at revision >= atLeast arrives and
// returns the events delivered before it and its revision. A progress notification promises that
// every event up to its revision has been delivered, so an event at or below the revision of an
// earlier notification fails the test here; the caller checks that the events returned are all
// those expected up to the notification's revision.
func untilProgress(t *testing.T, wch clientv3.WatchChan, atLeast int64, timeout time.Duration) ([]*clientv3.Event, int64) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var evs []*clientv3.Event
	progressed := int64(0)
	for {
		resp := nextResponse(t, wch, time.Until(deadline))
		if err := resp.Err(); err != nil || resp.Canceled {
			t.Fatalf("watch canceled: %v", err)
		}
		checkResponse(t, resp, evs)
		for _, ev := range resp.Events {
			if ev.Kv.ModRevision <= progressed {
				t.Fatalf("event %s arrived after a progress notification at revision %d", fmtEvent(ev), progressed)
			}
		}
		evs = append(evs, resp.Events...)
		if resp.IsProgressNotify() {
			progressed = resp.Header.Revision
			if progressed >= atLeast {
				return evs, progressed
			}
		}
	}
}

// wantEvent is one expected event. A DELETE's kv has only the key and the deletion revision.
type wantEvent struct {
	typ  mvccpb.Event_EventType
	kv   *mvccpb.KeyValue
	prev *mvccpb.KeyValue // nil for a create
}

func put(k *mvccpb.KeyValue, prev *mvccpb.KeyValue) wantEvent {
	return wantEvent{typ: mvccpb.PUT, kv: k, prev: prev}
}

func deleted(key string, rev int64, prev *mvccpb.KeyValue) wantEvent {
	return wantEvent{typ: mvccpb.DELETE, kv: &mvccpb.KeyValue{Key: []byte(key), ModRevision: rev}, prev: prev}
}

// checkEvents compares events with the expected ones, the way kube-apiserver's parseEvent reads
// them: IsCreate, and prev_kv on every event that is not a create.
func checkEvents(t *testing.T, what string, got []*clientv3.Event, want []wantEvent) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d events, want %d:%s", what, len(got), len(want), fmtEvents(got))
	}
	for i, ev := range got {
		w := want[i]
		name := fmt.Sprintf("%s: event %d (%s)", what, i, fmtEvent(ev))
		if ev.Type != w.typ {
			t.Fatalf("%s: type %v, want %v", name, ev.Type, w.typ)
		}
		checkKV(t, name, ev.Kv, w.kv)
		isCreate := w.typ == mvccpb.PUT && w.kv.Version == 1
		if ev.IsCreate() != isCreate {
			t.Fatalf("%s: IsCreate %v, want %v", name, ev.IsCreate(), isCreate)
		}
		if !isCreate && ev.PrevKv == nil {
			t.Fatalf("%s: no prev_kv on a non-create event (kube-apiserver: \"etcd event received with PrevKv=nil\")", name)
		}
		checkKV(t, name+" prev_kv", ev.PrevKv, w.prev)
	}
}

// TestKubernetesWatch: list-then-watch as the cacher does it. Writes made after the list but
// before the watch are replayed from history, then live writes follow, with correct types,
// IsCreate, prev_kv, one revision for a multi-key Txn, and nothing outside the prefix.
func TestKubernetesWatch(t *testing.T) {
	e := newEnv(t, serverOpts{})
	const prefix = "/registry/configmaps/"
	a, b, c, d, x := prefix+"ns/a", prefix+"ns/b", prefix+"ns/c", prefix+"ns/d", prefix+"ns/x"
	ra := e.create(a, "a1", 0)
	rb := e.create(b, "b1", 0)
	l := e.list(prefix, kubernetes.ListOptions{})
	if len(l.Kvs) != 2 || l.Revision != rb {
		t.Fatalf("List: %d objects at %d, want 2 at %d", len(l.Kvs), l.Revision, rb)
	}

	// After the list, before the watch starts: the watch must replay these.
	ra2 := e.update(a, "a2", ra)
	rbDel := e.del(b, rb)
	rc := e.create(c, "c1", 0)
	e.create("/registry/configmaps0", "outside", 0)

	wctx := e.watchCtx()
	wch := e.kubeWatch(wctx, prefix, l.Revision)

	// Live: two creates in one Txn, an update, a delete, a re-create, writes outside the prefix.
	txn, err := e.c.Txn(e.ctx).If(
		clientv3.Compare(clientv3.ModRevision(d), "=", 0), clientv3.Compare(clientv3.ModRevision(x), "=", 0),
	).Then(clientv3.OpPut(d, "d1"), clientv3.OpPut(x, "x1")).Commit()
	noErr(t, err, "Txn creating two objects")
	if !txn.Succeeded {
		t.Fatal("Txn creating two objects did not succeed")
	}
	rdx := txn.Header.Revision
	e.create("/registry/secrets/ns/s", "outside", 0)
	rc2 := e.update(c, "c2", rc)
	raDel := e.del(a, ra2)
	rb2 := e.create(b, "b2", 0)

	want := []wantEvent{
		put(kv(a, "a2", ra, ra2, 2), kv(a, "a1", ra, ra, 1)),
		deleted(b, rbDel, kv(b, "b1", rb, rb, 1)),
		put(kv(c, "c1", rc, rc, 1), nil),
		put(kv(d, "d1", rdx, rdx, 1), nil),
		put(kv(x, "x1", rdx, rdx, 1), nil),
		put(kv(c, "c2", rc, rc2, 2), kv(c, "c1", rc, rc, 1)),
		deleted(a, raDel, kv(a, "a2", ra, ra2, 2)),
		put(kv(b, "b2", rb2, rb2, 1), nil),
	}
	checkEvents(t, "replayed and live events", collectEvents(t, wch, len(want), 10*time.Second), want)

	// Nothing extra or duplicated: the next event is the next write.
	rs := e.create(prefix+"ns/sentinel", "s", 0)
	checkEvents(t, "after the sentinel write", collectEvents(t, wch, 1, 10*time.Second),
		[]wantEvent{put(kv(prefix+"ns/sentinel", "s", rs, rs, 1), nil)})

	// RequestProgress, as kube-apiserver's consistent reads from the watch cache use it: answered
	// on the stream once all its watchers are synced, at a revision that covers the writes made
	// before the request, and only after every event up to that revision.
	t.Run("RequestProgress", func(t *testing.T) {
		e.s.requireEtcd(t, watchProgressGate, "RequestProgress synchronised with the watch stream (etcd 3.4.25, 3.5.8)")
		// A second watcher on the same stream, as for a second resource type.
		const other = "/registry/secrets/"
		wch2 := e.kubeWatch(wctx, other, e.rev())

		// Synced watchers: a write, then the request.
		w := e.create(prefix+"ns/p1", "p", 0)
		noErr(t, e.c.RequestProgress(wctx), "RequestProgress")
		evs, rev := untilProgress(t, wch, w, 5*time.Second)
		checkEvents(t, "before the progress notification", evs, []wantEvent{put(kv(prefix+"ns/p1", "p", w, w, 1), nil)})
		if rev != w {
			t.Fatalf("progress at revision %d, want the current revision %d", rev, w)
		}
		evs, rev = untilProgress(t, wch2, w, 5*time.Second)
		if len(evs) != 0 || rev != w {
			t.Fatalf("second watcher: progress at %d after %d events, want %d after none", rev, len(evs), w)
		}

		// Right after a burst of writes to both prefixes, while the watchers may be catching up.
		var want1, want2 []wantEvent
		var last int64
		for i := 0; i < 40; i++ {
			p, list := prefix, &want1
			if i%2 == 1 {
				p, list = other, &want2
			}
			k := fmt.Sprintf("%sns/burst-%02d", p, i)
			last = e.create(k, "v", 0)
			*list = append(*list, put(kv(k, "v", last, last, 1), nil))
		}
		noErr(t, e.c.RequestProgress(wctx), "RequestProgress")
		evs, rev = untilProgress(t, wch, last, 10*time.Second)
		checkEvents(t, "burst before progress", evs, want1)
		if rev != last {
			t.Fatalf("progress at %d after the burst, want the current revision %d", rev, last)
		}
		evs, rev = untilProgress(t, wch2, last, 10*time.Second)
		checkEvents(t, "second watcher's burst before progress", evs, want2)
		if rev != last {
			t.Fatalf("second watcher: progress at %d after the burst, want %d", rev, last)
		}
	})
}

// TestWatchCompacted: a watch from a compacted revision is canceled with ErrCompacted and the
// compact revision (kube-apiserver relists: "too old resource version"); reads there fail the
// same way; a relist and a watch from its revision + 1 work; a watch exactly at the compact
// revision works.
func TestWatchCompacted(t *testing.T) {
	e := newEnv(t, serverOpts{})
	const prefix = "/registry/secrets/"
	k := prefix + "ns/s"
	r1 := e.create(k, "1", 0)
	r2 := e.update(k, "2", r1)
	r3 := e.update(k, "3", r2)
	r4 := e.update(k, "4", r3)
	_, err := e.c.Compact(e.ctx, r3)
	noErr(t, err, "Compact")

	wctx := e.watchCtx()
	wch := e.kubeWatch(wctx, prefix, r1) // from r2, below the compact revision
	resp := nextResponse(t, wch, 5*time.Second)
	if !resp.Canceled || resp.CompactRevision != r3 || !errors.Is(resp.Err(), rpctypes.ErrCompacted) || len(resp.Events) != 0 {
		t.Fatalf("watch from %d after compacting at %d: canceled=%v compact_revision=%d err=%v events=%d",
			r2, r3, resp.Canceled, resp.CompactRevision, resp.Err(), len(resp.Events))
	}
	select {
	case extra, ok := <-wch:
		if ok {
			t.Fatalf("response after the cancel: %+v", extra)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the watch channel did not close after the cancel")
	}
	_, err = e.k.Get(e.ctx, k, kubernetes.GetOptions{Revision: r2})
	wantErr(t, "Get below the compact revision", err, rpctypes.ErrCompacted)
	_, err = e.k.List(e.ctx, prefix, kubernetes.ListOptions{Revision: r2, Limit: 10})
	wantErr(t, "List below the compact revision", err, rpctypes.ErrCompacted)
	checkKV(t, "Get at the compact revision", e.get(k, r3).KV, kv(k, "3", r1, r3, 3))

	// Relist, rewatch from the list's revision + 1.
	l := e.list(prefix, kubernetes.ListOptions{})
	if len(l.Kvs) != 1 || l.Revision != r4 {
		t.Fatalf("relist: %d objects at %d", len(l.Kvs), l.Revision)
	}
	checkKV(t, "relisted object", l.Kvs[0], kv(k, "4", r1, r4, 4))
	wch = e.kubeWatch(wctx, prefix, l.Revision)
	r5 := e.update(k, "5", r4)
	checkEvents(t, "after the relist", collectEvents(t, wch, 1, 10*time.Second),
		[]wantEvent{put(kv(k, "5", r1, r5, 5), kv(k, "4", r1, r4, 4))})

	// Exactly at the compact revision: the event there (its prev_kv is compacted away, so it is
	// not checked), then the rest.
	wch = e.kubeWatch(wctx, prefix, r3-1)
	evs := collectEvents(t, wch, 3, 10*time.Second)
	if evs[0].Type != mvccpb.PUT || evs[0].Kv.ModRevision != r3 || string(evs[0].Kv.Value) != "3" {
		t.Fatalf("watch at the compact revision starts with %s, want the update at %d", fmtEvent(evs[0]), r3)
	}
	checkEvents(t, "watch at the compact revision", evs[1:], []wantEvent{
		put(kv(k, "4", r1, r4, 4), kv(k, "3", r1, r3, 3)),
		put(kv(k, "5", r1, r5, 5), kv(k, "4", r1, r4, 4)),
	})
}

// TestProgressNotifyInterval: with the server's progress interval set short, an idle
// progress_notify watcher gets periodic notifications (kube-apiserver's cacher turns them into
// bookmarks), at the current revision and never ahead of its events.
func TestProgressNotifyInterval(t *testing.T) {
	// (etcd has the flag for this, --experimental-watch-progress-notify-interval, from 3.4.11 on.)
	e := newEnv(t, serverOpts{progressNotifyInterval: time.Second})
	const prefix = "/registry/leases/"
	start := e.rev()
	wctx := e.watchCtx()
	wch := e.kubeWatch(wctx, prefix, start)

	began := time.Now()
	evs, rev := untilProgress(t, wch, start, 5*time.Second)
	if len(evs) != 0 || rev != start {
		t.Fatalf("idle watcher: progress at %d after %d events, want %d after none", rev, len(evs), start)
	}
	t.Logf("first progress notification after %.1fs", time.Since(began).Seconds())

	w := e.create(prefix+"ns/l", "v", 0)
	evs, rev = untilProgress(t, wch, w, 5*time.Second)
	checkEvents(t, "before the next progress notification", evs, []wantEvent{put(kv(prefix+"ns/l", "v", w, w, 1), nil)})
	if rev != w {
		t.Fatalf("progress at %d, want the current revision %d", rev, w)
	}
}
