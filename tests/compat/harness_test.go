// Package compat drives a real cairn with the official etcd Go client: the same calls etcdctl,
// Kubernetes and other etcd clients make, checked against etcd's documented semantics.
package compat

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"cairn.dev/harness"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// etcdBin is set ($COMPAT_ETCD=/path/to/etcd) to run the whole suite against real etcd instead
// of cairn: every expectation here is a claim about etcd's behaviour, and this checks it.
func etcdBin() string { return os.Getenv("COMPAT_ETCD") }

// freePort is a port nothing listens on, from below the ephemeral range, never one handed out
// before in this run (harness.RandomFreePort): a server's client and peer ports are picked
// before it binds either.
func freePort(t *testing.T) int {
	t.Helper()
	if p := harness.RandomFreePort(200); p != 0 {
		return p
	}
	t.Fatal("no free port found in 20000-32000")
	return 0
}

// server is one cairn process on a loopback port with its own data directory.
type server struct {
	t        *testing.T
	cmd      *exec.Cmd
	exited   chan struct{} // closed once cmd has been reaped
	dataDir  string
	port     int
	peerPort int // etcd only: its peer listener, unused with one member
	url      string
	health   *http.Client // asks /health during start; nil: http.DefaultClient
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
		s.cmd = exec.Command(harness.CairnBin(s.t), args...)
	}
	health := s.health
	if health == nil {
		health = http.DefaultClient
	}
	exited, err := launchWith(s.cmd, s.url, health, 15*time.Second)
	s.exited = exited
	if err != nil {
		s.cmd = nil
		s.t.Fatal(err)
	}
}

// launch starts cmd and waits until it answers /health on url. A server that exits first fails
// at once, with what it wrote (stderr is also passed through); one that never answers, after
// `within`. The returned channel closes once the process has been reaped.
func launch(cmd *exec.Cmd, url string, within time.Duration) (chan struct{}, error) {
	return launchWith(cmd, url, http.DefaultClient, within)
}

// launchWith is launch asking /health with client (one that speaks TLS to an https:// url).
func launchWith(cmd *exec.Cmd, url string, client *http.Client, within time.Duration) (chan struct{}, error) {
	out := &syncBuffer{}
	cmd.Stderr = io.MultiWriter(os.Stderr, out)
	exited := make(chan struct{})
	if err := cmd.Start(); err != nil {
		close(exited)
		return exited, fmt.Errorf("the server did not start: %v", err)
	}
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return exited, fmt.Errorf("the server exited during start (%v); it said:\n%s", waitErr, out.String())
		default:
		}
		resp, err := client.Get(url + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return exited, nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-exited
	return exited, fmt.Errorf("the server did not become healthy on %s within %v; it said:\n%s", url, within, out.String())
}

// syncBuffer is a bytes.Buffer written by the process's stderr copier and read by the waiter.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// kill stops the process at once (SIGKILL): nothing gets flushed on the way out.
func (s *server) kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGKILL)
		<-s.exited
		s.cmd = nil
	}
}

// stop ends the server gracefully (SIGTERM, SIGKILL after 10 s).
func (s *server) stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		harness.Stop(s.cmd.Process, s.exited, 10*time.Second)
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
