package compat

// The client port's plain-HTTP side: /version as etcd answers it, a 404 for unknown paths, and
// gRPC methods out of a browser's reach (a cross-site form POST is HTTP/1.1 with a "simple"
// content type: it must run nothing).

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/version"
	"google.golang.org/grpc/codes"
)

func TestVersionAndUnknownPaths(t *testing.T) {
	s := startServer(t, "")
	c := &http.Client{Timeout: 10 * time.Second}
	resp := must(c.Get(s.url + "/version"))
	body := must(io.ReadAll(resp.Body))
	resp.Body.Close()
	var v version.Versions
	if resp.StatusCode != 200 || json.Unmarshal(body, &v) != nil {
		t.Fatalf("/version: HTTP %d %q", resp.StatusCode, body)
	}
	// What etcd clients parse: a 3.x server version and a major.minor.0 cluster version.
	if !regexp.MustCompile(`^3\.\d+\.\d+$`).MatchString(v.Server) ||
		!regexp.MustCompile(`^3\.\d+\.0$`).MatchString(v.Cluster) {
		t.Fatalf("/version: %q", body)
	}
	resp = must(c.Get(s.url + "/no-such-path"))
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("/no-such-path: HTTP %d, want 404", resp.StatusCode)
	}
}

func TestHTTP1RequestsForGRPCMethodsRunNothing(t *testing.T) {
	s := startServer(t, "")
	x := ctx(t)
	c := s.client()
	// http.Client speaks HTTP/1.1 to an http:// URL, as a browser does.
	hc := &http.Client{Timeout: 10 * time.Second}
	for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", "application/grpc"} {
		put := must((&pb.PutRequest{Key: []byte("csrf " + ct), Value: []byte("v")}).Marshal())
		req := must(http.NewRequest("POST", s.url+"/etcdserverpb.KV/Put", bytes.NewReader(grpcFrame(0, uint32(len(put)), put))))
		req.Header.Set("content-type", ct)
		resp := must(hc.Do(req))
		resp.Body.Close()
		if resp.StatusCode < 400 || resp.StatusCode >= 500 {
			t.Errorf("HTTP/1.1 POST with %s: HTTP %d, want a 4xx", ct, resp.StatusCode)
		}
		if got := must(c.Get(x, "csrf "+ct)); len(got.Kvs) != 0 {
			t.Errorf("HTTP/1.1 POST with %s ran the put", ct)
		}
	}
}

func TestUnknownMethodsAreNamed(t *testing.T) {
	s := startServer(t, "")
	// grpc-go's wording, which etcd answers with; cairn may add to it.
	code, msg := rawCall(t, s, "/etcdserverpb.KV/NoSuchMethod", nil, grpcFrame(0, 0, nil))
	want := "unknown method NoSuchMethod for service etcdserverpb.KV"
	if code != codes.Unimplemented || !bytes.Contains([]byte(msg), []byte(want)) {
		t.Errorf("an unknown method: got %v %q, want Unimplemented %q", code, msg, want)
	}
	code, msg = rawCall(t, s, "/no.Such/Method", nil, grpcFrame(0, 0, nil))
	want = "unknown service no.Such"
	if code != codes.Unimplemented || !bytes.Contains([]byte(msg), []byte(want)) {
		t.Errorf("an unknown service: got %v %q, want Unimplemented %q", code, msg, want)
	}
}
