package compat

// Requests no well-behaved client sends: malformed gRPC framing, contradictory fields, values the
// API does not define. Each gets etcd's answer (checked against etcd itself with COMPAT_ETCD), and
// the server keeps serving.

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding/gzip"
	"google.golang.org/grpc/status"
)

// grpcFrame is gRPC's length-prefixed message: a compression flag, a big-endian length, the
// bytes. The announced length need not match the bytes.
func grpcFrame(compressed byte, announced uint32, msg []byte) []byte {
	b := []byte{compressed, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], announced)
	return append(b, msg...)
}

// rawCall sends body as a gRPC request over cleartext HTTP/2 and returns the grpc-status code and
// the (decoded) grpc-message.
func rawCall(t *testing.T, s *server, method string, hdr map[string]string, body []byte) (codes.Code, string) {
	t.Helper()
	tr := &http2.Transport{AllowHTTP: true, DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	req, err := http.NewRequest("POST", s.url+method, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("content-type", "application/grpc")
	req.Header.Set("te", "trailers")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	_, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	get := func(k string) string {
		if v := resp.Trailer.Get(k); v != "" {
			return v
		}
		return resp.Header.Get(k) // a trailers-only response
	}
	var code codes.Code
	if _, err := fmt.Sscan(get("grpc-status"), &code); err != nil {
		t.Fatalf("%s: no grpc-status (HTTP %d)", method, resp.StatusCode)
	}
	msg, _ := url.PathUnescape(get("grpc-message"))
	return code, msg
}

func TestMalformedGRPCRequestsGetErrorsAndTheServerKeepsServing(t *testing.T) {
	s := startServer(t, "")
	put := must((&pb.PutRequest{Key: []byte("raw"), Value: []byte("v")}).Marshal())
	const kvPut = "/etcdserverpb.KV/Put"
	if code, msg := rawCall(t, s, kvPut, nil, grpcFrame(0, uint32(len(put)), put)); code != codes.OK {
		t.Fatalf("a well-formed raw put: %v %q", code, msg)
	}
	// A message that is not protobuf, or is cut short, or claims compression it does not name.
	for name, body := range map[string][]byte{
		"not protobuf":        grpcFrame(0, 3, []byte{0xff, 0xff, 0xff}),
		"shorter than stated": grpcFrame(0, 100, put),
		"cut inside prefix":   {0, 0},
		"compressed, no name": grpcFrame(1, uint32(len(put)), put),
	} {
		if code, msg := rawCall(t, s, kvPut, nil, body); code != codes.Internal && code != codes.Unknown {
			t.Errorf("%s: got %v %q, want an Internal or Unknown error as etcd's", name, code, msg)
		}
	}
	// Over the receive limit (request limit + 512 KiB), on any service: refused from the length
	// prefix alone, with grpc-go's status, before the bytes arrive.
	for _, method := range []string{kvPut, "/etcdserverpb.Maintenance/Status"} {
		for _, n := range []uint32{3 << 20, 1<<32 - 1} {
			code, msg := rawCall(t, s, method, nil, grpcFrame(0, n, put))
			want := fmt.Sprintf("grpc: received message larger than max (%d vs. %d)", n, 2<<20)
			if code != codes.ResourceExhausted || msg != want {
				t.Errorf("%s announcing %d bytes: got %v %q, want ResourceExhausted %q", method, n, code, msg, want)
			}
		}
	}
	if code, _ := rawCall(t, s, "/etcdserverpb.KV/NoSuchMethod", nil, grpcFrame(0, 0, nil)); code != codes.Unimplemented {
		t.Errorf("an unknown method: got %v", code)
	}
	// Bytes that are not HTTP/2 at all.
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(s.url, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = conn.Write(bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef}, 4096))
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, _ = io.Copy(io.Discard, conn)
	conn.Close()
	// Still serving, with everything written before intact.
	c := s.client()
	x := ctx(t)
	must(c.Put(x, "after", "ok"))
	if got := must(c.Get(x, "raw")); len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "v" {
		t.Fatalf("the raw put reads back: %+v", got.Kvs)
	}
}

// skipBefore skips a test of behaviour etcd added in minor version `minor` (3.x) when the suite
// runs against an older etcd.
func skipBefore(t *testing.T, s *server, minor int) {
	t.Helper()
	if etcdBin() == "" {
		return
	}
	var major, got int
	v := must(s.client().Status(ctx(t), s.url)).Version
	if _, err := fmt.Sscanf(v, "%d.%d", &major, &got); err != nil || major != 3 {
		t.Fatalf("etcd version %q", v)
	}
	if got < minor {
		t.Skipf("etcd %s predates this behaviour (3.%d)", v, minor)
	}
}

// grpc-go clients can compress requests (grpc.UseCompressor); etcd 3.5 and later decompress them.
func TestGzipCompressedRequests(t *testing.T) {
	s := startServer(t, "")
	skipBefore(t, s, 5)
	c, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{s.url},
		DialTimeout: 5 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.UseCompressor(gzip.Name))},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	x := ctx(t)
	value := strings.Repeat("compressible ", 10000)
	must(c.Put(x, "gz", value))
	if got := must(c.Get(x, "gz")); len(got.Kvs) != 1 || string(got.Kvs[0].Value) != value {
		t.Fatal("a value written and read with gzip-compressed requests reads back whole")
	}
	must(c.Status(x, s.url))
}

// etcd's request checks (checkPutRequest, checkTxnRequest) and compaction floor.
func TestRequestChecksMatchEtcd(t *testing.T) {
	s := startServer(t, "")
	c := s.client()
	x := ctx(t)
	kv := pb.NewKVClient(c.ActiveConnection())
	// A store never compacted takes a compaction at revision 0, once.
	if _, err := c.Compact(x, 0); err != nil {
		t.Fatalf("compact 0 on a fresh store: %v", err)
	}
	_, err := c.Compact(x, 0)
	wantErr(t, err, rpctypes.ErrGRPCCompacted, codes.OutOfRange)
	must(c.Put(x, "k", "v"))

	// The raw stub reaches fields the client's own API will not set; rpctypes.Error types its
	// errors as the client does.
	_, err = kv.Put(x, &pb.PutRequest{Key: []byte("k"), Value: []byte("x"), IgnoreValue: true})
	wantErr(t, rpctypes.Error(err), rpctypes.ErrGRPCValueProvided, codes.InvalidArgument)
	_, err = kv.Put(x, &pb.PutRequest{Key: []byte("k"), Lease: 5, IgnoreLease: true})
	wantErr(t, rpctypes.Error(err), rpctypes.ErrGRPCLeaseProvided, codes.InvalidArgument)
	putOp := func(p *pb.PutRequest) *pb.RequestOp {
		return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: p}}
	}
	_, err = kv.Txn(x, &pb.TxnRequest{Success: []*pb.RequestOp{putOp(&pb.PutRequest{Key: []byte("k"), Value: []byte("x"), IgnoreValue: true})}})
	wantErr(t, rpctypes.Error(err), rpctypes.ErrGRPCValueProvided, codes.InvalidArgument)
	_, err = kv.Txn(x, &pb.TxnRequest{Compare: []*pb.Compare{{Target: pb.Compare_VERSION}}})
	wantErr(t, rpctypes.Error(err), rpctypes.ErrGRPCEmptyKey, codes.InvalidArgument)

	// A nested transaction may use what its parent leaves of the 128-op budget, which counts the
	// longest of its compares, success and failure lists.
	ranges := func(n int) []*pb.RequestOp {
		ops := make([]*pb.RequestOp, n)
		for i := range ops {
			ops[i] = &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte(fmt.Sprint("r", i))}}}
		}
		return ops
	}
	nested := func(outer, inner int) *pb.TxnRequest {
		ops := append(ranges(outer-1), &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{Success: ranges(inner)}}})
		return &pb.TxnRequest{Success: ops}
	}
	must(kv.Txn(x, nested(100, 28)))
	_, err = kv.Txn(x, nested(100, 29))
	wantErr(t, rpctypes.Error(err), rpctypes.ErrGRPCTooManyOps, codes.InvalidArgument)
	_, err = kv.Txn(x, nested(1, 128))
	wantErr(t, rpctypes.Error(err), rpctypes.ErrGRPCTooManyOps, codes.InvalidArgument)
	after := must(c.Get(x, "k"))
	if string(after.Kvs[0].Value) != "v" || after.Kvs[0].Version != 1 {
		t.Fatalf("refused requests changed nothing: %+v", after.Kvs[0])
	}
}

// etcd's compareKV: the operand comes from the union member matching the target (any other
// counts as zero), an undefined target compares as equal, and an undefined result holds for
// every existing key (and for a missing one unless the target is the value).
func TestCompareEdgeCasesMatchEtcd(t *testing.T) {
	s := startServer(t, "")
	c := s.client()
	x := ctx(t)
	kv := pb.NewKVClient(c.ActiveConnection())
	must(c.Put(x, "k", "v")) // version 1, create and mod revision 2, no lease
	const undefined = 9
	results := []pb.Compare_CompareResult{pb.Compare_EQUAL, pb.Compare_GREATER, pb.Compare_LESS, pb.Compare_NOT_EQUAL, undefined}
	targets := []pb.Compare_CompareTarget{pb.Compare_VERSION, pb.Compare_CREATE, pb.Compare_MOD, pb.Compare_VALUE, pb.Compare_LEASE, undefined}
	// want[target][result] for the existing key "k" and the missing key "m", with the operand
	// given as Version: 1 (so only the version target sees 1; the others see 0 or "").
	want := map[pb.Compare_CompareTarget][2]string{
		//                     k: = > < != ?     m: = > < != ?
		pb.Compare_VERSION: {"TFFFT", "FFTTT"},
		pb.Compare_CREATE:  {"FTFTT", "TFFFT"},
		pb.Compare_MOD:     {"FTFTT", "TFFFT"},
		pb.Compare_VALUE:   {"FTFTT", "FFFFF"},
		pb.Compare_LEASE:   {"TFFFT", "TFFFT"},
		undefined:          {"TFFFT", "TFFFT"},
	}
	for _, target := range targets {
		for ki, key := range []string{"k", "m"} {
			for ri, result := range results {
				cmp := &pb.Compare{Key: []byte(key), Target: target, Result: result, TargetUnion: &pb.Compare_Version{Version: 1}}
				got := must(kv.Txn(x, &pb.TxnRequest{Compare: []*pb.Compare{cmp}})).Succeeded
				if exp := want[target][ki][ri] == 'T'; got != exp {
					t.Errorf("target %v result %v on %q: succeeded %v, etcd says %v", target, result, key, got, exp)
				}
			}
		}
	}
}

// etcd 3.6 refuses sort values the API does not define (3.5 crashes on an unknown sort target).
func TestUndefinedSortOptionsAreRefused(t *testing.T) {
	s := startServer(t, "")
	skipBefore(t, s, 6)
	c := s.client()
	x := ctx(t)
	kv := pb.NewKVClient(c.ActiveConnection())
	for _, r := range []*pb.RangeRequest{
		{Key: []byte("k"), SortOrder: 7},
		{Key: []byte("k"), SortOrder: pb.RangeRequest_ASCEND, SortTarget: 9},
	} {
		_, err := kv.Range(x, r)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "etcdserver: invalid sort option") {
			t.Errorf("range %+v: got %v", r, err)
		}
		op := &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: r}}
		_, err = kv.Txn(x, &pb.TxnRequest{Success: []*pb.RequestOp{op}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "etcdserver: invalid sort option") {
			t.Errorf("txn range %+v: got %v", r, err)
		}
	}
}
