// Package compat drives a real cairn with the official etcd Go client: the same calls etcdctl,
// Kubernetes and other etcd clients make, checked against etcd's documented semantics.
package compat

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// etcdBin is set ($COMPAT_ETCD=/path/to/etcd) to run the whole suite against real etcd instead
// of cairn: every expectation here is a claim about etcd's behaviour, and this checks it.
func etcdBin() string { return os.Getenv("COMPAT_ETCD") }

// cairnBin is the binary under test: $CAIRN_BIN, or the workspace's release/debug build.
func cairnBin(t *testing.T) string {
	if b := os.Getenv("CAIRN_BIN"); b != "" {
		return b
	}
	for _, p := range []string{"../../target/release/cairn", "../../target/debug/cairn"} {
		if _, err := os.Stat(p); err == nil {
			abs, _ := filepath.Abs(p)
			return abs
		}
	}
	t.Fatal("cairn binary not found: build it or set CAIRN_BIN")
	return ""
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// server is one cairn process on a loopback port with its own data directory.
type server struct {
	t        *testing.T
	cmd      *exec.Cmd
	dataDir  string
	port     int
	peerPort int // etcd only: its peer listener, unused with one member
	url      string
}

// startServer starts cairn (or etcd, see etcdBin) with its data in dataDir ("" for a fresh one).
// extra are flags both accept under the same name, such as --max-txn-ops.
func startServer(t *testing.T, dataDir string, extra ...string) *server {
	t.Helper()
	if dataDir == "" {
		dataDir = t.TempDir()
	}
	s := &server{t: t, dataDir: dataDir, port: freePort(t), peerPort: freePort(t)}
	s.url = fmt.Sprintf("http://127.0.0.1:%d", s.port)
	s.start(extra...)
	t.Cleanup(s.stop)
	return s
}

func (s *server) start(extra ...string) {
	if e := etcdBin(); e != "" {
		peer := fmt.Sprintf("http://127.0.0.1:%d", s.peerPort)
		args := append([]string{"--name", "default", "--data-dir", s.dataDir,
			"--listen-client-urls", s.url, "--advertise-client-urls", s.url,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", "default=" + peer, "--log-level", "error"}, extra...)
		s.cmd = exec.Command(e, args...)
	} else {
		args := append([]string{"serve", "--data-dir", s.dataDir, "--listen-client-urls", s.url}, extra...)
		s.cmd = exec.Command(cairnBin(s.t), args...)
	}
	s.cmd.Stderr = os.Stderr
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(s.url + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.t.Fatalf("the server did not become healthy on %s", s.url)
}

// kill stops the process at once (SIGKILL): nothing gets flushed on the way out.
func (s *server) kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGKILL)
		_, _ = s.cmd.Process.Wait()
		s.cmd = nil
	}
}

func (s *server) stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _, _ = s.cmd.Process.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			s.kill()
		}
		s.cmd = nil
	}
}

func (s *server) client() *clientv3.Client {
	s.t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{s.url}, DialTimeout: 5 * time.Second})
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { c.Close() })
	return c
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}
