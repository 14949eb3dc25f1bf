package compat

// A validator for watch streams, after etcd's robustness tests: the history of every revision is
// rebuilt from the writes' own responses (independently of Watch), and each watcher's responses
// are checked against it. The guarantees, as etcd documents them for Watch:
//
//   ordered   events arrive in revision order (and, within a revision, in the order of the
//             writes' operations: etcd's sub-revisions)
//   unique    no event arrives twice
//   atomic    all of a revision's events (that the watcher selects) arrive in one response
//   reliable  no event the watcher selects is missing between its start and the end
//   exact     each event's kv is the store's (value, create and mod revision, version), its
//             prev_kv is the key's previous state (and is absent without prev_kv or on a create),
//             IsCreate holds exactly when the version is 1, and the filters hold

import (
	"context"
	"fmt"
	"math/rand"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// wop is one operation of a write: a put, or a delete of key or of [key, end) ("\x00": every
// key >= key).
type wop struct {
	put      bool
	key, end string
	value    string
}

func putOp(k, v string) wop      { return wop{put: true, key: k, value: v} }
func delOp(k string) wop         { return wop{key: k} }
func delRange(k, end string) wop { return wop{key: k, end: end} }

func (o wop) clientOp() clientv3.Op {
	switch {
	case o.put:
		return clientv3.OpPut(o.key, o.value)
	case o.end != "":
		return clientv3.OpDelete(o.key, clientv3.WithRange(o.end))
	}
	return clientv3.OpDelete(o.key)
}

// inRange reports whether k is in the range a watch or delete names by key and end.
func inRange(k, key, end string) bool {
	switch end {
	case "":
		return k == key
	case "\x00":
		return k >= key
	}
	return k >= key && k < end
}

// history is the store's event history rebuilt from writes: every event with its full kv and
// the prev_kv a watcher with prev_kv gets (nil on a create), in revision and sub-revision order.
type history struct {
	kvs    map[string]*mvccpb.KeyValue
	events []*mvccpb.Event
	rev    int64
}

func newHistory() *history { return &history{kvs: map[string]*mvccpb.KeyValue{}, rev: 1} }

// apply records the write that took effect at rev. deleted, if given, is the deleted count the
// server answered for each op (ignored for puts), checked against the model.
func (h *history) apply(rev int64, ops []wop, deleted []int64) error {
	if rev != h.rev+1 {
		return fmt.Errorf("write at revision %d after revision %d: the writes' revisions have a gap or a repeat", rev, h.rev)
	}
	var evs []*mvccpb.Event
	for i, o := range ops {
		if o.put {
			prev := h.kvs[o.key]
			kv := &mvccpb.KeyValue{Key: []byte(o.key), Value: []byte(o.value), CreateRevision: rev, ModRevision: rev, Version: 1}
			if prev != nil {
				kv.CreateRevision, kv.Version = prev.CreateRevision, prev.Version+1
			}
			h.kvs[o.key] = kv
			evs = append(evs, &mvccpb.Event{Type: mvccpb.PUT, Kv: kv, PrevKv: prev})
			continue
		}
		var keys []string
		for k := range h.kvs {
			if inRange(k, o.key, o.end) {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys) // a range delete takes its keys (and sub-revisions) in key order
		if deleted != nil && int64(len(keys)) != deleted[i] {
			return fmt.Errorf("revision %d: delete %q..%q removed %d keys, the model has %d", rev, o.key, o.end, deleted[i], len(keys))
		}
		for _, k := range keys {
			evs = append(evs, &mvccpb.Event{Type: mvccpb.DELETE, Kv: &mvccpb.KeyValue{Key: []byte(k), ModRevision: rev}, PrevKv: h.kvs[k]})
			delete(h.kvs, k)
		}
	}
	if len(evs) == 0 {
		return fmt.Errorf("revision %d: a write that changed nothing has no revision", rev)
	}
	h.rev = rev
	h.events = append(h.events, evs...)
	return nil
}

// watchSpec is what a watcher asked for. start is the first revision it is owed: its
// start_revision, or for a live watch the created response's header revision + 1.
type watchSpec struct {
	name            string
	key, end        string
	start           int64
	prevKV          bool
	noPut, noDelete bool
}

func (w watchSpec) selects(ev *mvccpb.Event) bool {
	if ev.Kv.ModRevision < w.start || !inRange(string(ev.Kv.Key), w.key, w.end) {
		return false
	}
	return !(w.noPut && ev.Type == mvccpb.PUT) && !(w.noDelete && ev.Type == mvccpb.DELETE)
}

// expected is what the watcher is owed of the history up to revision upTo.
func (h *history) expected(w watchSpec, upTo int64) []*mvccpb.Event {
	var out []*mvccpb.Event
	for _, ev := range h.events {
		if ev.Kv.ModRevision <= upTo && w.selects(ev) {
			out = append(out, ev)
		}
	}
	return out
}

// wresp is one watch response as the client got it (fragments reassembled).
type wresp struct {
	header int64
	events []*mvccpb.Event
}

type evID struct {
	rev int64
	key string
}

func idOf(ev *mvccpb.Event) evID { return evID{ev.Kv.ModRevision, string(ev.Kv.Key)} }

// validateWatch checks one watcher's responses against the history up to upTo; every error
// names the guarantee it breaks.
func validateWatch(h *history, w watchSpec, resps []wresp, upTo int64) []error {
	var errs []error
	fail := func(format string, args ...any) {
		if len(errs) < 20 {
			errs = append(errs, fmt.Errorf(w.name+": "+format, args...))
		}
	}
	want := h.expected(w, upTo)
	wantByID := map[evID]*mvccpb.Event{}
	for _, ev := range want {
		wantByID[idOf(ev)] = ev
	}
	var got []*mvccpb.Event
	seen := map[evID]bool{}
	respOf := map[int64]int{} // revision -> the response that carried it
	last := int64(0)
	for ri, r := range resps {
		if len(r.events) == 0 {
			fail("exact: response %d carries no events (an empty response is a progress notification, not an event response)", ri)
		}
		for _, ev := range r.events {
			id := idOf(ev)
			if ev.Kv.ModRevision < last {
				fail("ordered: %s (response %d) after an event at revision %d", fmtEvent(ev), ri, last)
			}
			last = ev.Kv.ModRevision
			if seen[id] {
				fail("unique: %s delivered twice", fmtEvent(ev))
				continue
			}
			seen[id] = true
			if prev, ok := respOf[id.rev]; ok && prev != ri {
				fail("atomic: revision %d split over responses %d and %d", id.rev, prev, ri)
			}
			respOf[id.rev] = ri
			if r.header < ev.Kv.ModRevision {
				fail("exact: response %d has header revision %d below its event %s", ri, r.header, fmtEvent(ev))
			}
			got = append(got, ev)
			if w.noPut && ev.Type == mvccpb.PUT || w.noDelete && ev.Type == mvccpb.DELETE {
				fail("filter: %s delivered to a watcher filtering it out", fmtEvent(ev))
				continue
			}
			if ev.Type == mvccpb.PUT && (ev.Kv.Version == 1) != (ev.Kv.CreateRevision == ev.Kv.ModRevision) {
				fail("is-create: %s has version %d but create revision %d", fmtEvent(ev), ev.Kv.Version, ev.Kv.CreateRevision)
			}
			exp, ok := wantByID[id]
			if !ok {
				fail("exact: unexpected event %s (not in the history the watcher selects)", fmtEvent(ev))
				continue
			}
			if ev.Type != exp.Type || !sameKV(ev.Kv, exp.Kv) {
				fail("exact: got %s %+v, the store has %s %+v", ev.Type, ev.Kv, exp.Type, exp.Kv)
			}
			switch {
			case !w.prevKV && ev.PrevKv != nil:
				fail("prev_kv: %s carries a prev_kv nobody asked for", fmtEvent(ev))
			case w.prevKV && !sameKV(ev.PrevKv, exp.PrevKv):
				fail("prev_kv: %s has prev_kv %+v, the key's previous state is %+v", fmtEvent(ev), ev.PrevKv, exp.PrevKv)
			}
		}
	}
	for _, ev := range want {
		if !seen[idOf(ev)] {
			fail("reliable: %s is missing (a gap)", fmtEvent(ev))
		}
	}
	if len(errs) == 0 {
		// Same events: now the same order, within revisions too.
		for i := range got {
			if idOf(got[i]) != idOf(want[i]) {
				fail("ordered: event %d is %s, the history has %s there", i, fmtEvent(got[i]), fmtEvent(want[i]))
				break
			}
		}
	}
	return errs
}

// The validator rejects each kind of broken stream: it is not vacuous.
func TestWatchValidatorRejectsDoctoredStreams(t *testing.T) {
	h := newHistory()
	writes := [][]wop{
		{putOp("a", "1")},
		{putOp("b", "1")},
		{putOp("a", "2"), putOp("c", "1")}, // revision 4: two events
		{delOp("b")},
		{putOp("b", "2")},
		{delRange("a", "\x00")}, // revision 7: three events
	}
	for i, ops := range writes {
		if err := h.apply(int64(i+2), ops, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.apply(9, []wop{putOp("x", "1")}, nil); err == nil {
		t.Fatal("the history takes a gap in the writes' revisions")
	}
	if err := h.apply(8, []wop{delOp("x")}, nil); err == nil {
		t.Fatal("the history takes a write that changed nothing")
	}
	all := watchSpec{name: "all", key: "\x00", end: "\x00", start: 1, prevKV: true}
	// One response per revision, as a live watcher gets them.
	perfect := func() []wresp {
		var out []wresp
		for _, ev := range h.events {
			c := *ev
			if n := len(out); n > 0 && out[n-1].header == ev.Kv.ModRevision {
				out[n-1].events = append(out[n-1].events, &c)
				continue
			}
			out = append(out, wresp{header: ev.Kv.ModRevision, events: []*mvccpb.Event{&c}})
		}
		return out
	}
	if errs := validateWatch(h, all, perfect(), h.rev); len(errs) != 0 {
		t.Fatalf("the true stream is rejected: %v", errs)
	}
	// A replay may put many revisions in one response.
	if errs := validateWatch(h, all, []wresp{{header: h.rev, events: h.events}}, h.rev); len(errs) != 0 {
		t.Fatalf("one response with every revision is rejected: %v", errs)
	}
	onlyB := watchSpec{name: "b", key: "b", start: 3}
	var bs []wresp
	for _, r := range perfect() {
		var evs []*mvccpb.Event
		for _, ev := range r.events {
			if string(ev.Kv.Key) == "b" {
				c := *ev
				c.PrevKv = nil
				evs = append(evs, &c)
			}
		}
		if len(evs) > 0 {
			bs = append(bs, wresp{header: r.header, events: evs})
		}
	}
	if errs := validateWatch(h, onlyB, bs, h.rev); len(errs) != 0 {
		t.Fatalf("a single-key watcher's true stream is rejected: %v", errs)
	}

	doctored := map[string]struct {
		spec   watchSpec
		doctor func([]wresp) []wresp
	}{
		"reliable": {all, func(r []wresp) []wresp { return append(r[:1], r[2:]...) }}, // drop revision 3
		"unique":   {all, func(r []wresp) []wresp { return append(r[:2], r[1:]...) }}, // revision 3 again
		"ordered": {all, func(r []wresp) []wresp { // swap revisions 4 and 5
			r[2], r[3] = r[3], r[2]
			return r
		}},
		"atomic": {all, func(r []wresp) []wresp { // revision 4 split in two responses
			a, b := r[2], r[2]
			a.events, b.events = r[2].events[:1], r[2].events[1:]
			return append(r[:2], append([]wresp{a, b}, r[3:]...)...)
		}},
		"prev_kv": {all, func(r []wresp) []wresp { // the delete of b claims a's first state
			r[3].events[0].PrevKv = r[0].events[0].Kv
			return r
		}},
		"is-create": {all, func(r []wresp) []wresp { // the modify of a posing as a create
			kv := *r[2].events[0].Kv
			kv.Version = 1
			r[2].events[0].Kv = &kv
			return r
		}},
		"filter": {watchSpec{name: "noput", key: "\x00", end: "\x00", start: 1, prevKV: true, noPut: true}, func(r []wresp) []wresp {
			return r // every put is delivered
		}},
		"exact": {all, func(r []wresp) []wresp { // a value that was never written
			kv := *r[0].events[0].Kv
			kv.Value = []byte("forged")
			r[0].events[0].Kv = &kv
			return r
		}},
	}
	for property, d := range doctored {
		errs := validateWatch(h, d.spec, d.doctor(perfect()), h.rev)
		found := false
		for _, err := range errs {
			found = found || strings.Contains(err.Error(), ": "+property+":")
		}
		if !found {
			t.Errorf("a stream breaking %q is not rejected for it: %v", property, errs)
		}
	}
	// Reordering within a revision: the events of the range delete in the wrong order.
	r := perfect()
	last := r[len(r)-1].events
	last[0], last[1] = last[1], last[0]
	if errs := validateWatch(h, all, r, h.rev); len(errs) == 0 || !strings.Contains(errs[0].Error(), "ordered") {
		t.Errorf("events of one revision out of sub-revision order are not rejected: %v", errs)
	}
}

// recorder collects a clientv3 watch's responses in the background.
type recorder struct {
	spec    watchSpec
	resps   []wresp      // owned by the goroutine until done is closed
	lastRev atomic.Int64 // the highest event revision received
	closing atomic.Bool  // set before the client closes: errors after it are the close's
	err     error
	done    chan struct{}
}

func record(spec watchSpec, wch clientv3.WatchChan, slow bool) *recorder {
	r := &recorder{spec: spec, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for resp := range wch {
			if err := resp.Err(); err != nil {
				if !r.closing.Load() {
					r.err = err
				}
				return
			}
			if resp.Created || resp.IsProgressNotify() {
				continue
			}
			evs := make([]*mvccpb.Event, len(resp.Events))
			for i, ev := range resp.Events {
				evs[i] = (*mvccpb.Event)(ev)
			}
			r.resps = append(r.resps, wresp{header: resp.Header.Revision, events: evs})
			if n := len(evs); n > 0 {
				r.lastRev.Store(evs[n-1].Kv.ModRevision)
			}
			if slow {
				time.Sleep(time.Duration(rand.Intn(3)) * time.Millisecond)
			}
		}
	}()
	return r
}

// waitFor waits until the recorder has an event at rev or later, or has ended, or the deadline.
func (r *recorder) waitFor(rev int64, deadline time.Time) {
	for r.lastRev.Load() < rev && time.Now().Before(deadline) {
		select {
		case <-r.done:
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// A random workload of puts, deletes, range deletes and transactions on a small key space from
// several clients at once, with a compaction in the middle below every watcher's position; each
// watcher's stream must hold etcd's guarantees.
func TestWatchValidatorOverRandomWorkload(t *testing.T) {
	s := startServer(t, "")
	x := ctx(t)
	cw := s.client()    // the watchers
	cslow := s.client() // a watcher on its own connection that reads slowly
	keys := []string{}
	for _, p := range []string{"v/a", "v/b"} {
		for i := 0; i < 5; i++ {
			keys = append(keys, fmt.Sprint(p, i))
		}
	}

	// The writes, each with what the server answered.
	type write struct {
		rev     int64
		ops     []wop
		deleted []int64
	}
	var mu sync.Mutex
	var writes []write
	var writeErr error
	perform := func(c *clientv3.Client, rng *rand.Rand) error {
		value := fmt.Sprintf("%x", rng.Int63())
		var op wop
		switch p := rng.Intn(100); {
		case p < 45:
			op = putOp(keys[rng.Intn(len(keys))], value)
		case p < 65:
			op = delOp(keys[rng.Intn(len(keys))])
		case p < 70:
			op = delRange("v/b", "v/c")
		default:
			// A transaction on 2 to 4 distinct keys, guarded by a compare so that either branch
			// may run.
			perm := rng.Perm(len(keys))
			n := 2 + rng.Intn(3)
			var then, els []wop
			for i := 0; i < n; i++ {
				k := keys[perm[i]]
				if rng.Intn(3) == 0 {
					then = append(then, delOp(k))
				} else {
					then = append(then, putOp(k, value+fmt.Sprint(i)))
				}
			}
			els = []wop{putOp(keys[perm[n]], value+"e")}
			var tops, eops []clientv3.Op
			for _, o := range then {
				tops = append(tops, o.clientOp())
			}
			for _, o := range els {
				eops = append(eops, o.clientOp())
			}
			resp, err := c.Txn(context.Background()).
				If(clientv3.Compare(clientv3.Version(keys[perm[0]]), "<", 3)).
				Then(tops...).Else(eops...).Commit()
			if err != nil {
				return err
			}
			ops := els
			if resp.Succeeded {
				ops = then
			}
			deleted := make([]int64, len(ops))
			effective := false
			for i, o := range ops {
				if o.put {
					effective = true
				} else {
					deleted[i] = resp.Responses[i].GetResponseDeleteRange().Deleted
					effective = effective || deleted[i] > 0
				}
			}
			if effective { // a write that changed nothing took no revision
				mu.Lock()
				writes = append(writes, write{resp.Header.Revision, ops, deleted})
				mu.Unlock()
			}
			return nil
		}
		resp, err := c.Do(context.Background(), op.clientOp())
		if err != nil {
			return err
		}
		w := write{ops: []wop{op}, deleted: []int64{0}}
		if op.put {
			w.rev = resp.Put().Header.Revision
		} else if d := resp.Del(); d.Deleted > 0 {
			w.rev, w.deleted[0] = d.Header.Revision, d.Deleted
		} else {
			return nil
		}
		mu.Lock()
		writes = append(writes, w)
		mu.Unlock()
		return nil
	}
	runWriters := func(n, each int, seed int64) {
		var wg sync.WaitGroup
		for g := 0; g < n; g++ {
			c := s.client()
			rng := rand.New(rand.NewSource(seed + int64(g)))
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < each; i++ {
					if err := perform(c, rng); err != nil {
						mu.Lock()
						writeErr = err
						mu.Unlock()
						return
					}
				}
			}()
		}
		wg.Wait()
		if writeErr != nil {
			t.Fatal(writeErr)
		}
	}

	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	runWriters(1, 100, seed) // some history before any watcher
	var recs []*recorder
	live := func(c *clientv3.Client, spec watchSpec, slow bool, opts ...clientv3.OpOption) {
		wch, rev := watchCreated(t, c, x, spec.key, opts...)
		spec.start = rev + 1
		recs = append(recs, record(spec, wch, slow))
	}
	from := func(c *clientv3.Client, spec watchSpec, opts ...clientv3.OpOption) {
		wch, _ := watchCreated(t, c, x, spec.key, append(opts, clientv3.WithRev(spec.start))...)
		recs = append(recs, record(spec, wch, false))
	}
	from(cw, watchSpec{name: "full history from 1, prev_kv", key: "v/", end: "v0", start: 1, prevKV: true}, clientv3.WithPrefix(), clientv3.WithPrevKV())
	from(cw, watchSpec{name: "all keys from 1", key: "\x00", end: "\x00", start: 1}, clientv3.WithFromKey())
	from(cw, watchSpec{name: "range [v/a3, v/b2) from 40, prev_kv", key: "v/a3", end: "v/b2", start: 40, prevKV: true}, clientv3.WithRange("v/b2"), clientv3.WithPrevKV())
	from(cw, watchSpec{name: "no deletes from 1", key: "v/", end: "v0", start: 1, noDelete: true}, clientv3.WithPrefix(), clientv3.WithFilterDelete())
	live(cw, watchSpec{name: "live prefix v/a, prev_kv", key: "v/a", end: "v/b", prevKV: true}, false, clientv3.WithPrefix(), clientv3.WithPrevKV())
	live(cw, watchSpec{name: "live key v/b2", key: "v/b2"}, false)
	live(cw, watchSpec{name: "live no puts, prev_kv", key: "v/", end: "v0", noPut: true, prevKV: true}, false, clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithPrevKV())
	live(cslow, watchSpec{name: "live slow reader, prev_kv", key: "v/", end: "v0", prevKV: true}, true, clientv3.WithPrefix(), clientv3.WithPrevKV())

	runWriters(4, 250, seed+100)
	// Compact below every watcher's position: each has received an event at or above it.
	compactAt := int64(1 << 62)
	deadline := time.Now().Add(10 * time.Second)
	for _, r := range recs {
		r.waitFor(50, deadline)
		if p := r.lastRev.Load(); p < compactAt {
			compactAt = p
		}
	}
	if compactAt < 50 {
		t.Fatalf("a watcher has not progressed past revision 50 (at %d)", compactAt)
	}
	must(cw.Compact(x, compactAt, clientv3.WithCompactPhysical()))
	// A watcher from exactly the compaction revision is served, with that revision's events.
	// etcd before 3.5.16 (and 3.4.34) drops a delete's tombstone at the compaction revision
	// (etcd #18274), so with etcd 3.4 this watcher starts one revision later.
	lateStart := compactAt
	if serverMinor(t, s) < 5 {
		lateStart++
	}
	from(cw, watchSpec{name: fmt.Sprintf("all keys from %d (compacted at %d)", lateStart, compactAt), key: "\x00", end: "\x00", start: lateStart}, clientv3.WithFromKey())
	runWriters(4, 250, seed+200)

	// Rebuild the history from the writes' responses.
	sort.Slice(writes, func(i, j int) bool { return writes[i].rev < writes[j].rev })
	h := newHistory()
	for _, w := range writes {
		if err := h.apply(w.rev, w.ops, w.deleted); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d writes, %d events, last revision %d, compacted at %d", len(writes), len(h.events), h.rev, compactAt)

	// Every watcher catches up to its last event, then its stream is checked.
	deadline = time.Now().Add(20 * time.Second)
	for _, r := range recs {
		want := h.expected(r.spec, h.rev)
		if len(want) == 0 {
			t.Fatalf("%s selects no event: the workload does not exercise it", r.spec.name)
		}
		r.waitFor(want[len(want)-1].Kv.ModRevision, deadline)
	}
	time.Sleep(200 * time.Millisecond) // anything extra arrives too
	for _, r := range recs {
		r.closing.Store(true)
	}
	cw.Close()
	cslow.Close()
	for _, r := range recs {
		<-r.done
		if r.err != nil {
			t.Errorf("%s: the watch ended with %v", r.spec.name, r.err)
			continue
		}
		for _, err := range validateWatch(h, r.spec, r.resps, h.rev) {
			t.Error(err)
		}
		t.Logf("%s: %d responses, %d events", r.spec.name, len(r.resps), len(h.expected(r.spec, h.rev)))
	}
}
