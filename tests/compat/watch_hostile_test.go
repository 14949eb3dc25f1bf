package compat

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc/codes"
)

// rssKiB is the server process's resident memory (Linux /proc), in KiB.
func rssKiB(t *testing.T, s *server) int {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			return must(strconv.Atoi(f[1]))
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// Garbage on the Watch and LeaseKeepAlive streams gets an error, as on unary calls, and the
// server keeps serving; 10,000 watchers on one stream are all created, cost bounded memory,
// each gets its own event, and all cancel.
func TestWatchHostileStreams(t *testing.T) {
	s := startServer(t, "")
	for _, method := range []string{"/etcdserverpb.Watch/Watch", "/etcdserverpb.Lease/LeaseKeepAlive"} {
		code, msg := rawCall(t, s, method, nil, grpcFrame(0, 3, []byte{0xff, 0xff, 0xff}))
		if code != codes.Internal && code != codes.Unknown {
			t.Errorf("%s with garbage: got %v %q, want Internal or Unknown as etcd", method, code, msg)
		}
	}
	c := s.client()
	x := ctx(t)
	r := openRaw(t, c, true)
	before := rssKiB(t, s)
	const n = 10000
	for i := 0; i < n; i++ {
		r.create(&pb.WatchCreateRequest{Key: []byte(fmt.Sprintf("w/%05d", i))})
	}
	ids := map[int64]bool{}
	for len(ids) < n {
		resp := r.next(20 * time.Second)
		if !resp.Created || resp.Canceled {
			t.Fatalf("create %d: %s", len(ids), fmtResp(resp))
		}
		ids[resp.WatchId] = true
	}
	grown := rssKiB(t, s) - before
	t.Logf("%d watchers on one stream: server RSS grew %d KiB (%d bytes each)", n, grown, grown*1024/n)
	if grown > 256*1024 {
		t.Fatalf("10,000 idle watchers cost %d KiB", grown)
	}
	for _, i := range []int{0, 4242, n - 1} {
		must(c.Put(x, fmt.Sprintf("w/%05d", i), "v"))
		resp := r.next(10 * time.Second)
		if len(resp.Events) != 1 || string(resp.Events[0].Kv.Key) != fmt.Sprintf("w/%05d", i) {
			t.Fatalf("the event for w/%05d: %s", i, fmtResp(resp))
		}
	}
	for id := range ids {
		r.cancelWatch(id)
	}
	for canceled := 0; canceled < n; canceled++ {
		if resp := r.next(20 * time.Second); !resp.Canceled {
			t.Fatalf("cancel %d: %s", canceled, fmtResp(resp))
		}
	}
	must(c.Put(x, "after", "ok"))
}

// etcd clients put every call and watch on one connection: 300 watch streams open on it must
// not hold up another stream or a plain put (hyper's default allowed 200 streams).
func TestManyStreamsOnOneConnection(t *testing.T) {
	s := startServer(t, "")
	c := s.client()
	x := ctx(t)
	for i := 0; i < 300; i++ {
		r := openRaw(t, c, true)
		r.created(&pb.WatchCreateRequest{Key: []byte(fmt.Sprintf("s/%03d", i))})
	}
	short, cancel := context.WithTimeout(x, 5*time.Second)
	defer cancel()
	if _, err := c.Put(short, "s/000", "v"); err != nil {
		t.Fatalf("a put with 300 watch streams open on its connection: %v", err)
	}
}
