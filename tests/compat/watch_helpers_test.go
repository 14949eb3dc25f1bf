package compat

// Helpers for the Watch tests: a raw Watch stream (the protocol as it is on the wire, with every
// control response), clientv3 watches that wait for their creation, and event comparison.

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// rawStream is one Watch RPC driven with the generated stub, so the test sees every response
// the server sends: created and canceled acknowledgements, fragments, watch_id -1.
type rawStream struct {
	t      *testing.T
	wc     pb.Watch_WatchClient
	ch     chan *pb.WatchResponse
	errc   chan error
	cancel context.CancelFunc
}

// openRaw opens a Watch stream on c's connection. With read, a goroutine receives responses as
// they come (next, none); without it nothing is read until startReading, so the server meets a
// client that does not read.
func openRaw(t *testing.T, c *clientv3.Client, read bool) *rawStream {
	t.Helper()
	x, cancel := context.WithCancel(context.Background())
	// The stub does not inherit the client's call options: lift gRPC's 4 MiB receive limit as
	// clientv3 does, since a watch response may be as large as the history it carries.
	wc, err := pb.NewWatchClient(c.ActiveConnection()).Watch(x, grpc.MaxCallRecvMsgSize(math.MaxInt32))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	r := &rawStream{t: t, wc: wc, ch: make(chan *pb.WatchResponse, 1<<16), errc: make(chan error, 1), cancel: cancel}
	t.Cleanup(cancel)
	if read {
		r.startReading()
	}
	return r
}

func (r *rawStream) startReading() {
	go func() {
		for {
			resp, err := r.wc.Recv()
			if err != nil {
				r.errc <- err
				close(r.ch)
				return
			}
			r.ch <- resp
		}
	}()
}

func (r *rawStream) send(req *pb.WatchRequest) {
	r.t.Helper()
	if err := r.wc.Send(req); err != nil {
		r.t.Fatalf("send %v: %v", req, err)
	}
}

func (r *rawStream) create(cr *pb.WatchCreateRequest) {
	r.t.Helper()
	r.send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: cr}})
}

func (r *rawStream) cancelWatch(id int64) {
	r.t.Helper()
	r.send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{CancelRequest: &pb.WatchCancelRequest{WatchId: id}}})
}

func (r *rawStream) progress() {
	r.t.Helper()
	r.send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_ProgressRequest{ProgressRequest: &pb.WatchProgressRequest{}}})
}

// next is the next response; the test fails if none comes within the timeout.
func (r *rawStream) next(timeout time.Duration) *pb.WatchResponse {
	r.t.Helper()
	select {
	case resp, ok := <-r.ch:
		if !ok {
			r.t.Fatalf("the watch stream ended: %v", <-r.errc)
		}
		return resp
	case <-time.After(timeout):
		r.t.Fatalf("no watch response within %v", timeout)
	}
	return nil
}

// none fails the test if a response arrives within d.
func (r *rawStream) none(d time.Duration) {
	r.t.Helper()
	select {
	case resp, ok := <-r.ch:
		if ok {
			r.t.Fatalf("expected no response, got %s", fmtResp(resp))
		}
		r.t.Fatalf("the watch stream ended: %v", <-r.errc)
	case <-time.After(d):
	}
}

// created sends a create request and returns its response, which must be the next one.
func (r *rawStream) created(cr *pb.WatchCreateRequest) *pb.WatchResponse {
	r.t.Helper()
	r.create(cr)
	resp := r.next(5 * time.Second)
	if !resp.Created || resp.Canceled || len(resp.Events) != 0 {
		r.t.Fatalf("create %v: expected a created response, got %s", cr, fmtResp(resp))
	}
	return resp
}

func fmtResp(r *pb.WatchResponse) string {
	s := fmt.Sprintf("{id %d rev %d created %v canceled %v compact %d fragment %v reason %q events [",
		r.WatchId, r.Header.GetRevision(), r.Created, r.Canceled, r.CompactRevision, r.Fragment, r.CancelReason)
	for i, ev := range r.Events {
		if i > 0 {
			s += " "
		}
		s += fmtEvent(ev)
	}
	return s + "]}"
}

func fmtEvent(ev *mvccpb.Event) string {
	if ev == nil || ev.Kv == nil {
		return "<nil>"
	}
	s := fmt.Sprintf("%v %q@%d", ev.Type, ev.Kv.Key, ev.Kv.ModRevision)
	if ev.Type == mvccpb.PUT {
		s += fmt.Sprintf("(c%d v%d %dB)", ev.Kv.CreateRevision, ev.Kv.Version, len(ev.Kv.Value))
	}
	if ev.PrevKv != nil {
		s += fmt.Sprintf(" prev@%d", ev.PrevKv.ModRevision)
	}
	return s
}

// watchCreated opens a clientv3 watch and waits for the server to create it, so that nothing
// written afterwards can be missed. It returns the channel and the creation's header revision:
// a live watch sees every event after it.
func watchCreated(t *testing.T, c *clientv3.Client, x context.Context, key string, opts ...clientv3.OpOption) (clientv3.WatchChan, int64) {
	t.Helper()
	wch := c.Watch(x, key, append(opts, clientv3.WithCreatedNotify())...)
	select {
	case resp, ok := <-wch:
		if !ok || !resp.Created || resp.Err() != nil {
			t.Fatalf("watch %q: expected a created notification, got %+v (err %v)", key, resp, resp.Err())
		}
		return wch, resp.Header.Revision
	case <-time.After(10 * time.Second):
		t.Fatalf("watch %q was not created within 10s", key)
	}
	return nil, 0
}

// collect reads responses from wch until it holds n events, failing on an error, a close, a
// timeout or more than n events. Progress notifications are skipped.
func collect(t *testing.T, wch clientv3.WatchChan, n int, timeout time.Duration) ([]clientv3.WatchResponse, []*clientv3.Event) {
	t.Helper()
	var resps []clientv3.WatchResponse
	var evs []*clientv3.Event
	deadline := time.After(timeout)
	for len(evs) < n {
		select {
		case resp, ok := <-wch:
			if !ok {
				t.Fatalf("the watch closed after %d of %d events", len(evs), n)
			}
			if err := resp.Err(); err != nil {
				t.Fatalf("watch error after %d of %d events: %v", len(evs), n, err)
			}
			if resp.IsProgressNotify() {
				continue
			}
			resps = append(resps, resp)
			evs = append(evs, resp.Events...)
		case <-deadline:
			t.Fatalf("only %d of %d events within %v", len(evs), n, timeout)
		}
	}
	if len(evs) > n {
		t.Fatalf("expected %d events, got %d: %v", n, len(evs), fmtEvents(evs))
	}
	return resps, evs
}

// quiet fails if wch delivers anything but progress notifications within d.
func quiet(t *testing.T, wch clientv3.WatchChan, d time.Duration) {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case resp, ok := <-wch:
			if !ok {
				t.Fatal("the watch closed")
			}
			if !resp.IsProgressNotify() {
				t.Fatalf("expected nothing more, got %+v: %v", resp, fmtEvents(resp.Events))
			}
		case <-deadline:
			return
		}
	}
}

func fmtEvents(evs []*clientv3.Event) string {
	s := "["
	for i, ev := range evs {
		if i > 0 {
			s += " "
		}
		s += fmtEvent((*mvccpb.Event)(ev))
	}
	return s + "]"
}

// sameKV compares the fields of a key-value an event carries.
func sameKV(a, b *mvccpb.KeyValue) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return string(a.Key) == string(b.Key) && string(a.Value) == string(b.Value) &&
		a.CreateRevision == b.CreateRevision && a.ModRevision == b.ModRevision &&
		a.Version == b.Version && a.Lease == b.Lease
}

// serverMinor is the 3.x minor version of etcd under test (COMPAT_ETCD), or 6 for cairn, which
// follows etcd 3.6.
func serverMinor(t *testing.T, s *server) int {
	t.Helper()
	if etcdBin() == "" {
		return 6
	}
	var major, minor int
	v := must(s.client().Status(ctx(t), s.url)).Version
	if _, err := fmt.Sscanf(v, "%d.%d", &major, &minor); err != nil || major != 3 {
		t.Fatalf("etcd version %q", v)
	}
	return minor
}

// firstErr keeps the first error that goroutines report (t.Fatal belongs to the test's own
// goroutine).
type firstErr struct {
	mu  sync.Mutex
	err error
}

func (f *firstErr) set(err error) {
	f.mu.Lock()
	if f.err == nil {
		f.err = err
	}
	f.mu.Unlock()
}

func (f *firstErr) get() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}
