package compat

// The Watch API: what clientv3 sees, and on the raw stream what the protocol carries (watch ids,
// created and canceled acknowledgements, progress notifications, fragments). Every expectation is
// etcd's behaviour (checked with COMPAT_ETCD against 3.5 and 3.4).

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// writeOps performs ops as one write (a Put, a Delete, or a Txn of them), records it in h and
// returns its revision.
func writeOps(t *testing.T, c *clientv3.Client, h *history, ops ...wop) int64 {
	t.Helper()
	x := ctx(t)
	var rev int64
	deleted := make([]int64, len(ops))
	if len(ops) == 1 {
		resp := must(c.Do(x, ops[0].clientOp()))
		if ops[0].put {
			rev = resp.Put().Header.Revision
		} else {
			rev, deleted[0] = resp.Del().Header.Revision, resp.Del().Deleted
		}
	} else {
		cops := make([]clientv3.Op, len(ops))
		for i, o := range ops {
			cops[i] = o.clientOp()
		}
		resp := must(c.Txn(x).Then(cops...).Commit())
		rev = resp.Header.Revision
		for i, o := range ops {
			if !o.put {
				deleted[i] = resp.Responses[i].GetResponseDeleteRange().Deleted
			}
		}
	}
	if err := h.apply(rev, ops, deleted); err != nil {
		t.Fatal(err)
	}
	return rev
}

// checkEvents compares received events with the history's, field by field.
func checkEvents(t *testing.T, name string, got []*clientv3.Event, want []*mvccpb.Event, prevKV bool) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d events, want %d: %v", name, len(got), len(want), fmtEvents(got))
	}
	for i, ev := range got {
		w := want[i]
		if ev.Type != w.Type || !sameKV(ev.Kv, w.Kv) {
			t.Fatalf("%s: event %d is %v %+v, want %v %+v", name, i, ev.Type, ev.Kv, w.Type, w.Kv)
		}
		wantPrev := w.PrevKv
		if !prevKV {
			wantPrev = nil
		}
		if !sameKV(ev.PrevKv, wantPrev) {
			t.Fatalf("%s: event %d (%s) has prev_kv %+v, want %+v", name, i, fmtEvent(w), ev.PrevKv, wantPrev)
		}
		switch {
		case ev.Type == mvccpb.DELETE:
			// A delete carries the key and the deletion's revision, nothing else.
			if len(ev.Kv.Value) != 0 || ev.Kv.CreateRevision != 0 || ev.Kv.Version != 0 || ev.Kv.Lease != 0 || ev.IsCreate() || ev.IsModify() {
				t.Fatalf("%s: delete event %+v", name, ev.Kv)
			}
		case ev.IsCreate() != (w.Kv.Version == 1) || ev.IsModify() == ev.IsCreate():
			t.Fatalf("%s: %s: IsCreate %v IsModify %v", name, fmtEvent(w), ev.IsCreate(), ev.IsModify())
		}
	}
}

// rawEvents reads event responses from r until each watch id in want has its number of
// events; anything else (another id, a control response, too many events) fails the test.
func rawEvents(t *testing.T, r *rawStream, want map[int64]int) map[int64][]*clientv3.Event {
	t.Helper()
	out := map[int64][]*clientv3.Event{}
	missing := 0
	for _, n := range want {
		missing += n
	}
	for missing > 0 {
		resp := r.next(5 * time.Second)
		n, ok := want[resp.WatchId]
		if !ok || resp.Created || resp.Canceled || len(resp.Events) == 0 || len(out[resp.WatchId])+len(resp.Events) > n {
			t.Fatalf("expected events for watches %v, got %s", want, fmtResp(resp))
		}
		for _, ev := range resp.Events {
			out[resp.WatchId] = append(out[resp.WatchId], (*clientv3.Event)(ev))
		}
		missing -= len(resp.Events)
	}
	return out
}

// Live watches of a key, a prefix, a range, every key from a key, and every key; events carry
// the store's kv, and a delete only the key and the deletion's revision.
func TestWatchKeyPrefixRangeFromKeyAndAllKeys(t *testing.T) {
	s := startServer(t, "")
	c := s.client()
	x := ctx(t)
	h := newHistory()
	writeOps(t, c, h, putOp("a", "before")) // revision 2, before every watch

	specs := []struct {
		spec watchSpec
		opts []clientv3.OpOption
	}{
		{watchSpec{name: "key a", key: "a"}, nil},
		{watchSpec{name: "prefix p/", key: "p/", end: "p0"}, []clientv3.OpOption{clientv3.WithPrefix()}},
		{watchSpec{name: "range [b, d)", key: "b", end: "d"}, []clientv3.OpOption{clientv3.WithRange("d")}},
		{watchSpec{name: "from key m", key: "m", end: "\x00"}, []clientv3.OpOption{clientv3.WithFromKey()}},
		// clientv3 sends an empty key with WithFromKey as "\x00", range_end "\x00".
		{watchSpec{name: "all keys", key: "\x00", end: "\x00"}, []clientv3.OpOption{clientv3.WithFromKey()}},
		{watchSpec{name: "key a, prev_kv", key: "a", prevKV: true}, []clientv3.OpOption{clientv3.WithPrevKV()}},
	}
	chans := make([]clientv3.WatchChan, len(specs))
	for i, sp := range specs {
		key := sp.spec.key
		if sp.spec.name == "all keys" {
			key = ""
		}
		var rev int64
		chans[i], rev = watchCreated(t, c, x, key, sp.opts...)
		if rev != 2 {
			t.Fatalf("%s: the created response's header revision is %d, the store's is 2", sp.spec.name, rev)
		}
	}
	// On the raw stream: an empty key with range_end "\x00" is every key; "m" with "\x00" is
	// every key >= "m".
	r := openRaw(t, c, true)
	rawAll := r.created(&pb.WatchCreateRequest{RangeEnd: []byte{0}})
	rawFrom := r.created(&pb.WatchCreateRequest{Key: []byte("m"), RangeEnd: []byte{0}})
	if rawAll.Header.Revision != 2 || rawFrom.Header.Revision != 2 {
		t.Fatalf("raw created responses: %s %s", fmtResp(rawAll), fmtResp(rawFrom))
	}

	writeOps(t, c, h, putOp("a", "1")) // a modify
	writeOps(t, c, h, putOp("p/1", "x"))
	writeOps(t, c, h, putOp("p/2", "y"))
	writeOps(t, c, h, putOp("p0", "not under p/"))
	writeOps(t, c, h, putOp("p", "nor this"))
	writeOps(t, c, h, putOp("b", "b"))
	writeOps(t, c, h, putOp("c", "c"))
	writeOps(t, c, h, putOp("d", "d: the range's end, outside it"))
	writeOps(t, c, h, putOp("m", "m"))
	writeOps(t, c, h, putOp("zz", "z"))
	writeOps(t, c, h, putOp("\x00", "the smallest key"))
	writeOps(t, c, h, putOp("\xff\xff", "a large key"))
	writeOps(t, c, h, delOp("a"))
	writeOps(t, c, h, putOp("a", "again")) // a new generation: a create
	writeOps(t, c, h, delRange("p/", "p0"))
	writeOps(t, c, h, putOp("c", "c2"), putOp("p/3", "z"), delOp("b"), putOp("n", "n"))

	for i, sp := range specs {
		sp.spec.start = 3
		want := h.expected(sp.spec, h.rev)
		_, got := collect(t, chans[i], len(want), 5*time.Second)
		checkEvents(t, sp.spec.name, got, want, sp.spec.prevKV)
		quiet(t, chans[i], 100*time.Millisecond)
	}
	all := h.expected(watchSpec{key: "\x00", end: "\x00", start: 3}, h.rev)
	from := h.expected(watchSpec{key: "m", end: "\x00", start: 3}, h.rev)
	got := rawEvents(t, r, map[int64]int{rawAll.WatchId: len(all), rawFrom.WatchId: len(from)})
	checkEvents(t, "raw: empty key, range_end \\x00", got[rawAll.WatchId], all, false)
	checkEvents(t, "raw: key m, range_end \\x00", got[rawFrom.WatchId], from, false)
}

// A watch from an old revision replays the history, then goes live with no gap and no repeat,
// while writes continue; a start revision in the future waits for it.
func TestWatchFromOldRevisionReplaysThenGoesLive(t *testing.T) {
	s := startServer(t, "")
	c := s.client()
	x := ctx(t)
	h := newHistory()
	for i := 0; i < 10; i++ { // revisions 2..11
		writeOps(t, c, h, putOp(fmt.Sprint("h/k", i%3), fmt.Sprint("v", i)))
	}
	wch := c.Watch(x, "h/", clientv3.WithPrefix(), clientv3.WithRev(2))
	single := c.Watch(x, "h/k1", clientv3.WithRev(7))
	done := make(chan struct{})
	var failed firstErr
	go func() { // h is the writer's until done
		defer close(done)
		for i := 10; i < 20; i++ { // revisions 12..21, while the watch replays
			op := putOp(fmt.Sprint("h/k", i%3), fmt.Sprint("v", i))
			resp, err := c.Put(x, op.key, op.value)
			if err == nil {
				err = h.apply(resp.Header.Revision, []wop{op}, nil)
			}
			if err != nil {
				failed.set(err)
				return
			}
		}
	}()
	resps, got := collect(t, wch, 20, 10*time.Second)
	<-done
	if err := failed.get(); err != nil {
		t.Fatal(err)
	}
	checkEvents(t, "from revision 2", got, h.expected(watchSpec{key: "h/", end: "h0", start: 2}, 21), false)
	for _, r := range resps {
		if last := r.Events[len(r.Events)-1].Kv.ModRevision; r.Header.Revision < last {
			t.Fatalf("a response's header revision %d is below its last event's %d", r.Header.Revision, last)
		}
	}
	quiet(t, wch, 200*time.Millisecond)
	want := h.expected(watchSpec{key: "h/k1", start: 7}, 21)
	_, got = collect(t, single, len(want), 5*time.Second)
	checkEvents(t, "h/k1 from revision 7", got, want, false)

	future := c.Watch(x, "h/", clientv3.WithPrefix(), clientv3.WithRev(24))
	for i := 0; i < 5; i++ { // revisions 22..26
		writeOps(t, c, h, putOp(fmt.Sprint("h/f", i), "f"))
	}
	want = h.expected(watchSpec{key: "h/", end: "h0", start: 24}, 26)
	_, got = collect(t, future, len(want), 5*time.Second)
	checkEvents(t, "from the future revision 24", got, want, false)
	quiet(t, future, 100*time.Millisecond)
}

// A watch from exactly the compaction revision is served; one from below it is canceled with the
// compaction revision. Negative start revisions are in TestWatchNegativeStartRevisions.
func TestWatchCompactedStartRevisions(t *testing.T) {
	s := startServer(t, "")
	c := s.client()
	x := ctx(t)
	h := newHistory()
	for i := 0; i < 10; i++ { // revisions 2..11
		writeOps(t, c, h, putOp("k", fmt.Sprint(i)))
	}
	r := openRaw(t, c, true)
	writeOps(t, c, h, putOp("k", "live")) // revision 12

	must(c.Compact(x, 6, clientv3.WithCompactPhysical()))
	at := c.Watch(x, "k", clientv3.WithRev(6))
	_, got := collect(t, at, 7, 5*time.Second)
	checkEvents(t, "from the compaction revision", got, h.expected(watchSpec{key: "k", start: 6}, 12), false)

	below := c.Watch(x, "k", clientv3.WithRev(5))
	select {
	case resp := <-below:
		if !resp.Canceled || resp.CompactRevision != 6 || len(resp.Events) != 0 || resp.Err() != rpctypes.ErrCompacted {
			t.Fatalf("a watch below the compaction: %+v (err %v)", resp, resp.Err())
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a watch below the compaction got no response")
	}
	select {
	case resp, ok := <-below:
		if ok {
			t.Fatalf("the canceled watch's channel delivered %+v", resp)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the canceled watch's channel stays open")
	}

	// On the raw stream: created first, then canceled with compact_revision and no reason; the
	// id stays registered, so a cancel of it is acknowledged (once).
	for _, sr := range []int64{5, 1} {
		cr := r.created(&pb.WatchCreateRequest{Key: []byte("k"), StartRevision: sr})
		if cr.Header.Revision != 12 {
			t.Fatalf("created: %s", fmtResp(cr))
		}
		got := r.next(5 * time.Second)
		if got.WatchId != cr.WatchId || !got.Canceled || got.Created || got.CompactRevision != 6 || len(got.Events) != 0 || got.CancelReason != "" {
			t.Fatalf("start revision %d below the compaction: %s", sr, fmtResp(got))
		}
		r.cancelWatch(cr.WatchId)
		ack := r.next(5 * time.Second)
		if ack.WatchId != cr.WatchId || !ack.Canceled || ack.Created || ack.CompactRevision != 0 || ack.Header.Revision != 12 {
			t.Fatalf("cancel of a watch compaction ended: %s", fmtResp(ack))
		}
		r.cancelWatch(cr.WatchId)
	}
	writeOps(t, c, h, putOp("k", "after")) // revision 13: no watcher left on this stream
	r.none(200 * time.Millisecond)

	t.Run("a delete at the compaction revision", func(t *testing.T) {
		// Compaction keeps a tombstone at the compaction revision, so a watch from it sees the
		// delete (etcd #18274, in 3.5.16 and 3.4.34; 3.4.23 drops it).
		skipBefore(t, s, 5)
		writeOps(t, c, h, putOp("d", "1"))
		rev := writeOps(t, c, h, delOp("d"))
		must(c.Compact(x, rev, clientv3.WithCompactPhysical()))
		wch := c.Watch(x, "d", clientv3.WithRev(rev))
		_, got := collect(t, wch, 1, 5*time.Second)
		checkEvents(t, "from a delete's revision, compacted at it", got, h.events[len(h.events)-1:], false)
	})
}

// A negative start revision. etcd 3.6 refuses it at once: created and canceled, watch id -1,
// reason ErrCompacted. etcd 3.4 and 3.5 compare it with the compaction revision (-1 when never
// compacted): -1 then watches live, -2 and below are canceled with compact_revision -1, and
// after a compaction at C every negative start is canceled with compact_revision C.
func TestWatchNegativeStartRevisions(t *testing.T) {
	s := startServer(t, "")
	c := s.client()
	x := ctx(t)
	h := newHistory()
	for i := 0; i < 10; i++ { // revisions 2..11
		writeOps(t, c, h, putOp("k", fmt.Sprint(i)))
	}
	r := openRaw(t, c, true)
	if serverMinor(t, s) >= 6 {
		for _, sr := range []int64{-1, -2, -5} {
			r.create(&pb.WatchCreateRequest{Key: []byte("k"), StartRevision: sr})
			got := r.next(5 * time.Second)
			if got.WatchId != -1 || !got.Created || !got.Canceled || got.CancelReason != rpctypes.ErrCompacted.Error() {
				t.Fatalf("start revision %d: %s", sr, fmtResp(got))
			}
		}
		return
	}
	minusOne := r.created(&pb.WatchCreateRequest{Key: []byte("k"), StartRevision: -1})
	for _, sr := range []int64{-2, -5} {
		cr := r.created(&pb.WatchCreateRequest{Key: []byte("k"), StartRevision: sr})
		got := r.next(5 * time.Second)
		if got.WatchId != cr.WatchId || !got.Canceled || got.Created || got.CompactRevision != -1 || len(got.Events) != 0 || got.CancelReason != "" {
			t.Fatalf("start revision %d on a store never compacted: %s", sr, fmtResp(got))
		}
	}
	writeOps(t, c, h, putOp("k", "live")) // revision 12
	checkEvents(t, "start revision -1", rawEvents(t, r, map[int64]int{minusOne.WatchId: 1})[minusOne.WatchId], h.events[10:], false)
	must(c.Compact(x, 6, clientv3.WithCompactPhysical()))
	for _, sr := range []int64{-1, -5} {
		cr := r.created(&pb.WatchCreateRequest{Key: []byte("k"), StartRevision: sr})
		got := r.next(5 * time.Second)
		if got.WatchId != cr.WatchId || !got.Canceled || got.Created || got.CompactRevision != 6 {
			t.Fatalf("start revision %d below the compaction: %s", sr, fmtResp(got))
		}
	}
}

// prev_kv: the key's previous state on a modify and a delete, none on a create (also a
// re-create after a delete); the same on a replay. Without prev_kv, none at all.
func TestWatchPrevKV(t *testing.T) {
	s := startServer(t, "")
	c := s.client()
	x := ctx(t)
	h := newHistory()
	with, _ := watchCreated(t, c, x, "k", clientv3.WithPrevKV())
	without, _ := watchCreated(t, c, x, "k")
	prefix, _ := watchCreated(t, c, x, "k", clientv3.WithPrefix(), clientv3.WithPrevKV())
	writeOps(t, c, h, putOp("k", "v1"))
	writeOps(t, c, h, putOp("k", "v2"))
	writeOps(t, c, h, putOp("k", "v2")) // the same value again: still a modify with a prev_kv
	writeOps(t, c, h, delOp("k"))
	writeOps(t, c, h, putOp("k", "v3"))
	writeOps(t, c, h, putOp("k", "v4"))
	writeOps(t, c, h, putOp("k2", "a"))
	writeOps(t, c, h, putOp("k3", "b"))
	writeOps(t, c, h, delRange("k", "l"))
	one := h.expected(watchSpec{key: "k", start: 2}, h.rev)
	_, got := collect(t, with, len(one), 5*time.Second)
	checkEvents(t, "prev_kv", got, one, true)
	_, got = collect(t, without, len(one), 5*time.Second)
	checkEvents(t, "no prev_kv", got, one, false)
	all := h.expected(watchSpec{key: "k", end: "l", start: 2}, h.rev)
	_, got = collect(t, prefix, len(all), 5*time.Second)
	checkEvents(t, "prefix, prev_kv", got, all, true)
	replay := c.Watch(x, "k", clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithRev(1))
	_, got = collect(t, replay, len(all), 5*time.Second)
	checkEvents(t, "replay, prev_kv", got, all, true)
}

// Filters drop events server-side; a revision whose events are all filtered out sends nothing.
func TestWatchFilters(t *testing.T) {
	s := startServer(t, "")
	c := s.client()
	x := ctx(t)
	h := newHistory()
	noPut, _ := watchCreated(t, c, x, "f/", clientv3.WithPrefix(), clientv3.WithFilterPut())
	noDel, _ := watchCreated(t, c, x, "f/", clientv3.WithPrefix(), clientv3.WithFilterDelete())
	r := openRaw(t, c, true)
	both := r.created(&pb.WatchCreateRequest{Key: []byte("f/"), RangeEnd: []byte("f0"),
		Filters: []pb.WatchCreateRequest_FilterType{pb.WatchCreateRequest_NOPUT, pb.WatchCreateRequest_NODELETE}})
	writeOps(t, c, h, putOp("f/a", "1"))
	writeOps(t, c, h, putOp("f/b", "1"))
	writeOps(t, c, h, putOp("f/a", "2"))
	writeOps(t, c, h, delOp("f/a"))
	writeOps(t, c, h, putOp("f/c", "1"), delOp("f/b"))
	writeOps(t, c, h, delOp("f/c"))
	writeOps(t, c, h, putOp("f/d", "1"))
	for _, w := range []struct {
		name  string
		wch   clientv3.WatchChan
		spec  watchSpec
		resps int
	}{
		{"no puts", noPut, watchSpec{key: "f/", end: "f0", start: 2, noPut: true}, 3},
		{"no deletes", noDel, watchSpec{key: "f/", end: "f0", start: 2, noDelete: true}, 5},
	} {
		want := h.expected(w.spec, h.rev)
		resps, got := collect(t, w.wch, len(want), 5*time.Second)
		checkEvents(t, w.name, got, want, false)
		if len(resps) != w.resps {
			t.Fatalf("%s: %d responses, want one per revision with a selected event (%d)", w.name, len(resps), w.resps)
		}
		quiet(t, w.wch, 100*time.Millisecond)
	}
	// Both filters: nothing at all; the stream still answers a progress request.
	r.progress()
	if p := r.next(5 * time.Second); p.WatchId != -1 || len(p.Events) != 0 || p.Header.Revision != h.rev {
		t.Fatalf("watch %d filtering everything: expected only a progress response, got %s", both.WatchId, fmtResp(p))
	}
}

// All events of one revision arrive in one response, in the order of the write's operations (a
// range delete's in key order), live and on a replay.
func TestWatchTxnEventsArriveInOneResponse(t *testing.T) {
	s := startServer(t, "")
	c := s.client()
	x := ctx(t)
	h := newHistory()
	writeOps(t, c, h, putOp("t/0", "0"))
	writeOps(t, c, h, putOp("t/x", "x"))
	live, _ := watchCreated(t, c, x, "t/", clientv3.WithPrefix(), clientv3.WithPrevKV())
	writeOps(t, c, h, putOp("t/2", "a"), putOp("t/1", "b"), delOp("t/0"), putOp("t/3", "c"), putOp("t/x", "x2")) // revision 4
	writeOps(t, c, h, delRange("t/", "t0"))                                                                      // revision 5
	writeOps(t, c, h, putOp("t/9", "z"), putOp("u", "outside"))                                                  // revision 6
	for _, wch := range []clientv3.WatchChan{live, c.Watch(x, "t/", clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithRev(4))} {
		want := h.expected(watchSpec{key: "t/", end: "t0", start: 4}, h.rev)
		resps, got := collect(t, wch, len(want), 5*time.Second)
		checkEvents(t, "txn", got, want, true)
		in := map[int64]int{}
		for i, r := range resps {
			for _, ev := range r.Events {
				if j, ok := in[ev.Kv.ModRevision]; ok && j != i {
					t.Fatalf("revision %d split over responses %d and %d", ev.Kv.ModRevision, j, i)
				}
				in[ev.Kv.ModRevision] = i
			}
		}
	}
}

// Resuming: a client reads some events and goes away; a new watch from the last revision + 1
// gets exactly the rest.
func TestWatchResumeFromLastRevision(t *testing.T) {
	s := startServer(t, "")
	x := ctx(t)
	h := newHistory()
	w := s.client()
	c := s.client()
	first, _ := watchCreated(t, w, x, "r/", clientv3.WithPrefix())
	for i := 0; i < 8; i++ {
		writeOps(t, c, h, putOp(fmt.Sprint("r/", i%3), fmt.Sprint(i)))
	}
	_, got := collect(t, first, 5, 5*time.Second)
	last := got[len(got)-1].Kv.ModRevision
	w.Close()
	for i := 8; i < 15; i++ {
		writeOps(t, c, h, putOp(fmt.Sprint("r/", i%3), fmt.Sprint(i)))
	}
	writeOps(t, c, h, delOp("r/0"))
	again := c.Watch(x, "r/", clientv3.WithPrefix(), clientv3.WithRev(last+1))
	want := h.expected(watchSpec{key: "r/", end: "r0", start: last + 1}, h.rev)
	_, got = collect(t, again, len(want), 5*time.Second)
	checkEvents(t, "resumed", got, want, false)
	quiet(t, again, 200*time.Millisecond)
}

// A server restart breaks the stream; clientv3 re-watches from the revision after the last event
// it delivered, and the history survived, so nothing is lost or repeated.
func TestWatchResumesAcrossServerRestart(t *testing.T) {
	s := startServer(t, "")
	c := s.client()
	x := ctx(t)
	h := newHistory()
	wch, _ := watchCreated(t, c, x, "r/", clientv3.WithPrefix(), clientv3.WithPrevKV())
	for i := 0; i < 5; i++ {
		writeOps(t, c, h, putOp(fmt.Sprint("r/", i%2), fmt.Sprint(i)))
	}
	_, before := collect(t, wch, 5, 5*time.Second)
	stopping := time.Now()
	s.stop()
	if d := time.Since(stopping); d > 5*time.Second { // etcd: a few milliseconds
		t.Errorf("SIGTERM with a watch stream open took %v to stop the server", d)
	}
	s.start()
	for deadline := time.Now().Add(10 * time.Second); ; { // the client reconnects
		if _, err := c.Get(x, "r/0"); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("no reconnection within 10s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for i := 5; i < 10; i++ {
		writeOps(t, c, h, putOp(fmt.Sprint("r/", i%2), fmt.Sprint(i)))
	}
	writeOps(t, c, h, delOp("r/1"))
	_, after := collect(t, wch, 6, 15*time.Second)
	checkEvents(t, "across a restart", append(before, after...), h.expected(watchSpec{key: "r/", end: "r0", start: 2}, h.rev), true)
	quiet(t, wch, 200*time.Millisecond)
}

// The raw protocol: client-chosen and automatic watch ids, refused creates (a duplicate id, an
// empty range), cancel acknowledgements, and what is not answered.
func TestWatchRawStreamIDsErrorsAndCancel(t *testing.T) {
	s := startServer(t, "")
	c := s.client()
	h := newHistory()
	writeOps(t, c, h, putOp("a", "1")) // revision 2
	r := openRaw(t, c, true)
	ids := []int64{}
	for _, want := range []struct{ asked, got int64 }{
		{7, 7}, // a client-chosen id is honoured
		{1, 1},
		{0, 0}, // 0 asks for an automatic id: the lowest unused, from 0
		{0, 2}, // ... skipping the ids the client took
		{1 << 40, 1 << 40},
	} {
		resp := r.created(&pb.WatchCreateRequest{Key: []byte("a"), WatchId: want.asked})
		if resp.WatchId != want.got || resp.Header.Revision != 2 || resp.CancelReason != "" || resp.CompactRevision != 0 || resp.Fragment {
			t.Fatalf("create asking for id %d: got %s, want id %d at the store's revision 2", want.asked, fmtResp(resp), want.got)
		}
		ids = append(ids, resp.WatchId)
	}
	// Refused creates are answered with created and canceled both set, watch id -1 and mvcc's
	// error as the reason.
	for _, bad := range []struct {
		req    *pb.WatchCreateRequest
		reason string
	}{
		{&pb.WatchCreateRequest{Key: []byte("b"), WatchId: 7}, "mvcc: duplicate watch ID provided on the WatchStream"},
		{&pb.WatchCreateRequest{Key: []byte("b"), RangeEnd: []byte("a")}, "mvcc: watcher range is empty"},
		{&pb.WatchCreateRequest{Key: []byte("b"), RangeEnd: []byte("b")}, "mvcc: watcher range is empty"},
	} {
		r.create(bad.req)
		resp := r.next(5 * time.Second)
		if !resp.Created || !resp.Canceled || resp.WatchId != -1 || resp.CancelReason != bad.reason || resp.Header.Revision != 2 {
			t.Fatalf("create %v: got %s, want created+canceled, id -1, reason %q", bad.req, fmtResp(resp), bad.reason)
		}
	}
	// Every watcher gets the event under its own id, with the write's revision in the header.
	writeOps(t, c, h, putOp("a", "2")) // revision 3
	want := map[int64]int{}
	for _, id := range ids {
		want[id] = 1
	}
	for id, evs := range rawEvents(t, r, want) {
		checkEvents(t, fmt.Sprint("watch ", id), evs, h.events[1:], false)
	}
	// A cancel of a known id is acknowledged.
	r.cancelWatch(7)
	ack := r.next(5 * time.Second)
	if ack.WatchId != 7 || !ack.Canceled || ack.Created || ack.CancelReason != "" || ack.CompactRevision != 0 || ack.Header.Revision != 3 || len(ack.Events) != 0 {
		t.Fatalf("cancel of watch 7: %s", fmtResp(ack))
	}
	// A cancel of an unknown or already canceled id, and an empty request, are not answered:
	// the next response is the progress request's.
	r.cancelWatch(7)
	r.cancelWatch(12345)
	r.send(&pb.WatchRequest{})
	r.progress()
	if p := r.next(5 * time.Second); p.WatchId != -1 || p.Canceled || p.Created || p.Header.Revision != 3 {
		t.Fatalf("expected the progress response, got %s", fmtResp(p))
	}
	// The canceled watcher gets no more events; the others do. A new create reports the
	// current revision.
	writeOps(t, c, h, putOp("a", "3")) // revision 4
	delete(want, 7)
	rawEvents(t, r, want)
	if resp := r.created(&pb.WatchCreateRequest{Key: []byte("a"), WatchId: 7}); resp.WatchId != 7 || resp.Header.Revision != 4 {
		t.Fatalf("a canceled id can be used again: %s", fmtResp(resp))
	}
	r.none(200 * time.Millisecond)
}

// RequestProgress: a response with watch id -1 and no events, at the current revision, that
// clientv3 delivers to every watch on the stream as a progress notification.
func TestWatchRequestProgress(t *testing.T) {
	s := startServer(t, "")
	c := s.client()
	x := ctx(t)
	k, _ := watchCreated(t, c, x, "k")
	j, _ := watchCreated(t, c, x, "j", clientv3.WithPrefix())
	var rev int64
	for i := 0; i < 3; i++ {
		rev = must(c.Put(x, "other", "x")).Header.Revision
	}
	must(0, c.RequestProgress(x))
	for name, wch := range map[string]clientv3.WatchChan{"k": k, "j": j} {
		select {
		case resp := <-wch:
			if !resp.IsProgressNotify() || resp.Header.Revision != rev {
				t.Fatalf("watch %s: expected a progress notification at %d, got %+v", name, rev, resp)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("watch %s: no progress notification", name)
		}
	}

	r := openRaw(t, c, true)
	r.created(&pb.WatchCreateRequest{Key: []byte("k")})
	rev = must(c.Put(x, "other", "y")).Header.Revision
	r.progress()
	p := r.next(5 * time.Second)
	if p.WatchId != -1 || p.Header.Revision != rev || len(p.Events) != 0 || p.Created || p.Canceled || p.CompactRevision != 0 || p.Fragment {
		t.Fatalf("progress response: %s, want watch id -1 at revision %d", fmtResp(p), rev)
	}

	t.Run("no watchers", func(t *testing.T) {
		// etcd 3.4 answers at once from the control path; 3.5 asks the watchers, and with none
		// on the stream nothing answers.
		skipBefore(t, s, 5)
		r := openRaw(t, c, true)
		r.progress()
		r.none(500 * time.Millisecond)
		r.created(&pb.WatchCreateRequest{Key: []byte("k")})
		r.progress()
		if p := r.next(5 * time.Second); p.WatchId != -1 || p.Header.Revision != rev {
			t.Fatalf("progress with a watcher: %s", fmtResp(p))
		}
	})
}

// A watcher far behind (a long history, a client that does not read) gets its events in order,
// and a progress response never claims a revision whose events it has not delivered first; once
// caught up, progress reports the current revision.
func TestWatchProgressNeverAheadOfEvents(t *testing.T) {
	s := startServer(t, "")
	// etcd 3.4.23 answers a progress request from the control path at once, ahead of the events
	// still queued for an unsynced watcher (etcd #15220, fixed in 3.5.8 and 3.4.25).
	skipBefore(t, s, 5)
	c := s.client()
	const writes, size = 2000, 10 << 10
	value := strings.Repeat("v", size)
	var wg sync.WaitGroup
	var failed firstErr
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := g; i < writes; i += 16 {
				if _, err := c.Put(context.Background(), fmt.Sprintf("u/%04d", i%100), value); err != nil {
					failed.set(err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	if err := failed.get(); err != nil {
		t.Fatal(err)
	}
	final := int64(writes + 1)
	r := openRaw(t, c, false)
	r.create(&pb.WatchCreateRequest{Key: []byte("u/"), RangeEnd: []byte("u0"), StartRevision: 1})
	// Progress requests all along, from before the watcher has caught up until after.
	var requests atomic.Int64
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			if r.wc.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}}) != nil {
				return
			}
			requests.Add(1)
		}
	}()
	time.Sleep(50 * time.Millisecond)
	r.startReading()
	if cr := r.next(5 * time.Second); !cr.Created || cr.Header.Revision != final {
		t.Fatalf("created: %s", fmtResp(cr))
	}
	var last int64 = 1
	eventResps, progressDuring, progressAfter := 0, 0, 0
	deadline := time.Now().Add(30 * time.Second)
	for last < final || progressAfter == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("at revision %d of %d after 30s", last, final)
		}
		resp := r.next(10 * time.Second)
		switch {
		case resp.WatchId == -1:
			if len(resp.Events) != 0 || resp.Header.Revision > last {
				t.Fatalf("a progress response at %d before the events after %d were delivered: %s", resp.Header.Revision, last, fmtResp(resp))
			}
			if last < final {
				progressDuring++
			} else if resp.Header.Revision != final {
				t.Fatalf("caught up at %d, a progress response at %d", final, resp.Header.Revision)
			} else {
				progressAfter++
			}
		case len(resp.Events) > 0 && !resp.Canceled:
			eventResps++
			for _, ev := range resp.Events {
				if ev.Kv.ModRevision != last+1 || len(ev.Kv.Value) != size {
					t.Fatalf("after revision %d: %s", last, fmtEvent(ev))
				}
				last++
			}
			if resp.Header.Revision < last {
				t.Fatalf("header revision %d below the events' %d", resp.Header.Revision, last)
			}
		default:
			t.Fatalf("unexpected %s", fmtResp(resp))
		}
		if last < final {
			time.Sleep(time.Millisecond) // a slow reader
		}
	}
	t.Logf("%d event responses; %d progress requests, %d answered while catching up, %d after", eventResps, requests.Load(), progressDuring, progressAfter)
}

// --experimental-watch-progress-notify-interval: an idle watcher with progress_notify gets
// progress notifications (under its own watch id, no events, the current revision); a watcher
// without it gets none.
func TestWatchProgressNotifyInterval(t *testing.T) {
	s := startServer(t, "", "--experimental-watch-progress-notify-interval=500ms")
	c := s.client()
	x := ctx(t)
	rev := must(c.Put(x, "other", "1")).Header.Revision
	wch, _ := watchCreated(t, c, x, "idle", clientv3.WithProgressNotify())
	plain, _ := watchCreated(t, c, x, "idle2")
	r := openRaw(t, c, true)
	r.created(&pb.WatchCreateRequest{Key: []byte("idle"), WatchId: 5, ProgressNotify: true})
	r.created(&pb.WatchCreateRequest{Key: []byte("idle"), WatchId: 6})
	for round := 0; round < 2; round++ {
		// Notifications come until one reports rev (one made just before a put reports the
		// revision before it).
		start := time.Now()
		for seen := int64(0); seen != rev; {
			select {
			case resp := <-wch:
				if !resp.IsProgressNotify() || resp.Header.Revision > rev || resp.Header.Revision < rev-1 {
					t.Fatalf("expected a progress notification at %d, got %+v", rev, resp)
				}
				seen = resp.Header.Revision
			case <-time.After(5*time.Second - time.Since(start)):
				t.Fatalf("no progress notification at revision %d within 5s", rev)
			}
		}
		for seen := int64(0); seen != rev; {
			resp := r.next(5*time.Second - time.Since(start))
			if resp.WatchId != 5 || len(resp.Events) != 0 || resp.Created || resp.Canceled || resp.Header.Revision > rev || resp.Header.Revision < rev-1 {
				t.Fatalf("raw: expected a progress notification for watch 5 at %d, got %s", rev, fmtResp(resp))
			}
			seen = resp.Header.Revision
		}
		t.Logf("a progress notification at revision %d after %v", rev, time.Since(start))
		rev = must(c.Put(x, "other", "2")).Header.Revision
	}
	quiet(t, plain, 100*time.Millisecond)
}

// Fragments: with fragment set, a response larger than the server's limit (--max-request-bytes
// plus gRPC's 512 KiB allowance) is split between events into parts with fragment=true but the
// last, each as full as the limit allows; clientv3 reassembles them. Without fragment the
// response arrives whole.
func TestWatchFragments(t *testing.T) {
	const maxRequest = 1 << 20
	limit := maxRequest + 512<<10
	s := startServer(t, "", fmt.Sprint("--max-request-bytes=", maxRequest))
	c := s.client()
	x := ctx(t)
	// A transaction putting 64 keys of 15 KiB fits a 1 MiB request; its events with their
	// prev_kv (a second such transaction) make a response of about 2 MiB.
	const n = 64
	txn := func(value string) int64 {
		ops := make([]clientv3.Op, n)
		for i := range ops {
			ops[i] = clientv3.OpPut(fmt.Sprintf("big/%02d", i), value)
		}
		return must(c.Txn(x).Then(ops...).Commit()).Header.Revision
	}
	frag, _ := watchCreated(t, c, x, "big/", clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithFragment())
	whole, _ := watchCreated(t, c, x, "big/", clientv3.WithPrefix(), clientv3.WithPrevKV())
	r := openRaw(t, c, true)
	r.created(&pb.WatchCreateRequest{Key: []byte("big/"), RangeEnd: []byte("big0"), WatchId: 1, PrevKv: true, Fragment: true})
	r.created(&pb.WatchCreateRequest{Key: []byte("big/"), RangeEnd: []byte("big0"), WatchId: 2, PrevKv: true})
	r.created(&pb.WatchCreateRequest{Key: []byte("big/"), RangeEnd: []byte("big0"), WatchId: 3, Fragment: true})
	a, b := strings.Repeat("a", 15<<10), strings.Repeat("b", 15<<10)
	rev1, rev2 := txn(a), txn(b)

	for name, wch := range map[string]clientv3.WatchChan{"WithFragment": frag, "without fragment": whole} {
		resps, evs := collect(t, wch, 2*n, 10*time.Second)
		if len(resps) != 2 || len(resps[0].Events) != n || len(resps[1].Events) != n {
			t.Fatalf("%s: %d responses, want two of %d events", name, len(resps), n)
		}
		for i, ev := range evs {
			wantRev, wantValue := rev1, a
			if i >= n {
				wantRev, wantValue = rev2, b
			}
			if string(ev.Kv.Key) != fmt.Sprintf("big/%02d", i%n) || ev.Kv.ModRevision != wantRev || string(ev.Kv.Value) != wantValue {
				t.Fatalf("%s: event %d is %s", name, i, fmtEvent((*mvccpb.Event)(ev)))
			}
			if (i >= n) != (ev.PrevKv != nil) || i >= n && string(ev.PrevKv.Value) != a {
				t.Fatalf("%s: event %d's prev_kv", name, i)
			}
		}
	}

	parts := map[int64][]*pb.WatchResponse{}
	events := map[int64]int{}
	for events[1] < 2*n || events[2] < 2*n || events[3] < 2*n {
		resp := r.next(10 * time.Second)
		parts[resp.WatchId] = append(parts[resp.WatchId], resp)
		events[resp.WatchId] += len(resp.Events)
	}
	// Watch 1 (fragment, prev_kv): revision 1's response (~1 MiB) whole, revision 2's (~2 MiB)
	// in parts.
	p := parts[1]
	if len(p) < 3 || p[0].Fragment || len(p[0].Events) != n {
		t.Fatalf("watch 1: %d responses, the first %s", len(p), fmtResp(p[0]))
	}
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("big/%02d", i)
	}
	checkFragments(t, p[1:], limit, rev2, mvccpb.PUT, keys)
	// Watch 2 (prev_kv, no fragment) and watch 3 (fragment, no prev_kv: every response is under
	// the limit): one response per revision.
	for _, id := range []int64{2, 3} {
		if len(parts[id]) != 2 || parts[id][0].Fragment || parts[id][1].Fragment {
			t.Fatalf("watch %d: %d responses", id, len(parts[id]))
		}
	}
	if size := parts[2][1].Size(); size < limit {
		t.Fatalf("the unfragmented response is %d bytes, under the limit %d: the test proves nothing", size, limit)
	}

	// A range delete of 40 keys of 80 KiB (each written alone) with prev_kv: ~3.2 MiB in one
	// revision, in three parts; clientv3 gives it as one response.
	huge, _ := watchCreated(t, c, x, "huge/", clientv3.WithPrefix(), clientv3.WithPrevKV(), clientv3.WithFragment())
	r.created(&pb.WatchCreateRequest{Key: []byte("huge/"), RangeEnd: []byte("huge0"), WatchId: 4, PrevKv: true, Fragment: true})
	keys = make([]string, 40)
	for i := range keys {
		keys[i] = fmt.Sprintf("huge/%02d", i)
		must(c.Put(x, keys[i], strings.Repeat("h", 80<<10)))
	}
	del := must(c.Delete(x, "huge/", clientv3.WithPrefix())).Header.Revision
	var dparts []*pb.WatchResponse
	for got := 0; got < 2*len(keys); {
		resp := r.next(10 * time.Second)
		if resp.WatchId != 4 {
			t.Fatalf("expected watch 4's responses, got %s", fmtResp(resp))
		}
		if resp.Header.Revision == del {
			dparts = append(dparts, resp)
		}
		got += len(resp.Events)
	}
	checkFragments(t, dparts, limit, del, mvccpb.DELETE, keys)
	resps, _ := collect(t, huge, 2*len(keys), 10*time.Second)
	if lastResp := resps[len(resps)-1]; len(lastResp.Events) != len(keys) || lastResp.Events[0].Kv.ModRevision != del {
		t.Fatalf("clientv3 reassembles the delete's %d parts into one response of %d events: got %d", len(dparts), len(keys), len(lastResp.Events))
	}
}

// checkFragments checks the parts of one revision's fragmented response: in order, fragment set
// on all but the last, each but the last as full as the limit allows (one more event would reach
// it; a part of one event may exceed it), together every event of the revision.
func checkFragments(t *testing.T, parts []*pb.WatchResponse, limit int, rev int64, typ mvccpb.Event_EventType, keys []string) {
	t.Helper()
	next, total := 0, 0
	for i, part := range parts {
		last := i == len(parts)-1
		if part.Fragment == last || len(part.Events) == 0 || part.Header.Revision != rev {
			t.Fatalf("part %d of %d: %s", i, len(parts), fmtResp(part))
		}
		for _, ev := range part.Events {
			if next >= len(keys) || string(ev.Kv.Key) != keys[next] || ev.Kv.ModRevision != rev || ev.Type != typ || ev.PrevKv == nil {
				t.Fatalf("part %d: event %s, want %v %q at %d with prev_kv", i, fmtEvent(ev), typ, keys[next], rev)
			}
			next++
		}
		total += part.Size()
		if size := part.Size(); size >= limit && len(part.Events) > 1 {
			t.Fatalf("part %d is %d bytes, over the limit %d", i, size, limit)
		}
		if !last {
			fuller := *part
			fuller.Events = append(append([]*mvccpb.Event{}, part.Events...), parts[i+1].Events[0])
			if fuller.Size() < limit {
				t.Fatalf("part %d (%d bytes) could hold another event under the limit %d", i, part.Size(), limit)
			}
		}
	}
	if next != len(keys) {
		t.Fatalf("the parts hold %d of %d events", next, len(keys))
	}
	t.Logf("a %d-byte response in %d parts under the limit %d", total, len(parts), limit)
}

// One stream holds a thousand watchers: all created (ids 0..999 in order) and each gets its
// event. clientv3 too, with a thousand watches of one key on one client.
func TestWatchManyWatchersOnOneStream(t *testing.T) {
	s := startServer(t, "")
	c := s.client()
	x := ctx(t)
	const n = 1000
	r := openRaw(t, c, true)
	for i := 0; i < n; i++ {
		r.create(&pb.WatchCreateRequest{Key: []byte(fmt.Sprintf("m/%04d", i))})
	}
	for i := 0; i < n; i++ {
		if resp := r.next(10 * time.Second); !resp.Created || resp.Canceled || resp.WatchId != int64(i) {
			t.Fatalf("create %d: %s", i, fmtResp(resp))
		}
	}
	chans := make([]clientv3.WatchChan, n)
	for i := range chans {
		chans[i] = c.Watch(x, "m/same", clientv3.WithCreatedNotify())
	}
	for i, wch := range chans {
		if resp := <-wch; !resp.Created {
			t.Fatalf("clientv3 watch %d: %+v", i, resp)
		}
	}
	var wg sync.WaitGroup
	var failed firstErr
	for g := 0; g < 20; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := g; i < n; i += 20 {
				if _, err := c.Put(x, fmt.Sprintf("m/%04d", i), "v"); err != nil {
					failed.set(err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	if err := failed.get(); err != nil {
		t.Fatal(err)
	}
	seen := make([]bool, n)
	for i := 0; i < n; i++ {
		resp := r.next(10 * time.Second)
		if resp.WatchId < 0 || resp.WatchId >= n || seen[resp.WatchId] || len(resp.Events) != 1 ||
			string(resp.Events[0].Kv.Key) != fmt.Sprintf("m/%04d", resp.WatchId) {
			t.Fatalf("event %d: %s", i, fmtResp(resp))
		}
		seen[resp.WatchId] = true
	}
	rev := must(c.Put(x, "m/same", "v")).Header.Revision
	for i, wch := range chans {
		select {
		case resp := <-wch:
			if len(resp.Events) != 1 || resp.Events[0].Kv.ModRevision != rev {
				t.Fatalf("clientv3 watch %d: %+v", i, resp)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("clientv3 watch %d got no event", i)
		}
	}
}

// A client that opens a watch and never reads while thousands of writes happen does not stop
// the server serving others; when it reads at last it gets every event in order (or a
// compaction cancel, never a gap).
func TestWatchStalledWatcherDoesNotBlockOthers(t *testing.T) {
	s := startServer(t, "")
	x := ctx(t)
	// A fixed 64 KiB flow-control window (no BDP growth), so the server's sends block soon.
	sc, err := clientv3.New(clientv3.Config{Endpoints: []string{s.url}, DialTimeout: 5 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithInitialWindowSize(1 << 16), grpc.WithInitialConnWindowSize(1 << 16)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sc.Close() })
	stalled := openRaw(t, sc, false)
	stalled.create(&pb.WatchCreateRequest{Key: []byte("s/"), RangeEnd: []byte("s0")})
	time.Sleep(100 * time.Millisecond) // created (unread) before the writes
	other := s.client()
	wo, _ := watchCreated(t, other, x, "o/", clientv3.WithPrefix())

	const writes = 5000
	value := strings.Repeat("x", 1<<10)
	writer := s.client()
	var mu sync.Mutex
	var revs []int64
	done := make(chan error, 1)
	go func() {
		var wg sync.WaitGroup
		var failed firstErr
		for g := 0; g < 32; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				for i := g; i < writes; i += 32 {
					resp, err := writer.Put(context.Background(), fmt.Sprintf("s/%03d", i%500), value)
					if err != nil {
						failed.set(err)
						return
					}
					mu.Lock()
					revs = append(revs, resp.Header.Revision)
					mu.Unlock()
				}
			}(g)
		}
		wg.Wait()
		done <- failed.get()
	}()
	// Meanwhile another client writes and watches, and new watches are created, with bounded
	// latency.
	var worst time.Duration
	rounds := 0
	for running := true; running; rounds++ {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			running = false
		default:
		}
		start := time.Now()
		rev := must(other.Put(x, "o/k", fmt.Sprint(rounds))).Header.Revision
		select {
		case resp := <-wo:
			if len(resp.Events) != 1 || resp.Events[0].Kv.ModRevision != rev {
				t.Fatalf("the other watcher: %+v", resp)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("the other watcher got no event within 5s while a watcher is stalled")
		}
		if rounds%10 == 0 {
			wctx, cancel := context.WithCancel(x)
			watchCreated(t, other, wctx, fmt.Sprint("o/new", rounds))
			cancel()
		}
		if d := time.Since(start); d > worst {
			worst = d
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("%d rounds of put-and-watch beside the stalled watcher, the slowest %v", rounds, worst)
	if worst > 2*time.Second {
		t.Fatalf("a put and its event took %v beside a stalled watcher", worst)
	}
	sort.Slice(revs, func(i, j int) bool { return revs[i] < revs[j] })
	stalled.startReading()
	if cr := stalled.next(5 * time.Second); !cr.Created || cr.Header.Revision != 1 {
		t.Fatalf("created: %s", fmtResp(cr))
	}
	next := 0
	for next < len(revs) {
		resp := stalled.next(20 * time.Second)
		if resp.CompactRevision != 0 {
			t.Logf("the stalled watcher was canceled at compaction revision %d after %d events", resp.CompactRevision, next)
			return
		}
		for _, ev := range resp.Events {
			if next >= len(revs) || ev.Kv.ModRevision != revs[next] {
				t.Fatalf("the stalled watcher's event %d is %s, want revision %d", next, fmtEvent(ev), revs[next])
			}
			next++
		}
	}
	stalled.none(100 * time.Millisecond)
}
