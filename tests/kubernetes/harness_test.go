// Run: cd tests/kubernetes && go test ./...   (CAIRN_BIN=/path/to/cairn picks the binary, default
// release/cairn in cargo's target directory; K8S_ETCD=/path/to/etcd runs the same suite against real etcd).
//
// Package k8scontract checks the contract kube-apiserver relies on (etcd's
// go.etcd.io/etcd/client/v3/kubernetes interface, the watch the cacher runs, the compactor's
// bookkeeping and Maintenance.Status) against a live server on 127.0.0.1.
package k8scontract

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"cairn.dev/harness"
	"github.com/coreos/go-semver/semver"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/kubernetes"
	"go.uber.org/zap"
)

// etcdBin is $K8S_ETCD: when set, the suite runs against that etcd binary instead of cairn, to
// check that every expectation here is one real etcd meets.
func etcdBin() string { return os.Getenv("K8S_ETCD") }

// cairnBin is $CAIRN_BIN or the release build, as an absolute path. It is this suite's own, not
// harness.CairnBin: it takes the release build only, never a debug one, and says so when missing.
func cairnBin(t *testing.T) string {
	t.Helper()
	b := os.Getenv("CAIRN_BIN")
	if b == "" {
		b = filepath.Join(harness.TargetDir(), "release", "cairn")
	}
	abs, err := filepath.Abs(b)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(abs); err != nil {
		t.Fatalf("cairn did not start: no such file %s (build it: cargo build --release -p cairn, or set CAIRN_BIN)", abs)
	}
	return abs
}

// randomFreePort draws a port from [20000, 32000) at random (harness.RandomFreePort) and checks
// that nothing listens on it. Between this check and the server's bind another process could
// take it: startServer then retries with fresh ports.
func randomFreePort(t *testing.T, avoid ...int) int {
	t.Helper()
	if p := harness.RandomFreePort(200, avoid...); p != 0 {
		return p
	}
	t.Fatal("no free port found in 20000-32000")
	return 0
}

// serverOpts are the few settings a test needs; each maps to cairn's and etcd's own flag.
type serverOpts struct {
	// progressNotifyInterval, if set, is how often idle progress_notify watchers get a progress
	// notification (cairn --watch-progress-notify-interval, etcd
	// --experimental-watch-progress-notify-interval; the default is 10 minutes).
	progressNotifyInterval time.Duration
}

// server is one single-member cairn or etcd process with its own data directory.
type server struct {
	t       *testing.T
	cmd     *exec.Cmd
	url     string
	logPath string
	exited  chan struct{}   // closed once the process has been reaped
	version *semver.Version // from Maintenance.Status, read once the server is up
}

func startServer(t *testing.T, opts serverOpts) *server {
	t.Helper()
	dir := t.TempDir()
	s := &server{t: t, logPath: filepath.Join(dir, "server.log")}
	t.Cleanup(s.stop)
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		if lastErr = s.start(filepath.Join(dir, fmt.Sprintf("data%d", attempt)), opts); lastErr == nil {
			s.readVersion()
			return s
		}
		s.stop()
	}
	t.Fatalf("server did not start: %v\n%s", lastErr, s.logTail())
	return nil
}

func (s *server) start(dataDir string, opts serverOpts) error {
	port := randomFreePort(s.t)
	s.url = fmt.Sprintf("http://127.0.0.1:%d", port)
	var args []string
	bin := etcdBin()
	if bin != "" {
		peer := fmt.Sprintf("http://127.0.0.1:%d", randomFreePort(s.t, port))
		args = []string{"--name", "default", "--data-dir", dataDir,
			"--listen-client-urls", s.url, "--advertise-client-urls", s.url,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", "default=" + peer, "--logger", "zap", "--log-level", "error"}
		if opts.progressNotifyInterval > 0 {
			args = append(args, "--experimental-watch-progress-notify-interval", opts.progressNotifyInterval.String())
		}
	} else {
		bin = cairnBin(s.t)
		args = []string{"serve", "--data-dir", dataDir, "--listen-client-urls", s.url}
		if opts.progressNotifyInterval > 0 {
			args = append(args, "--watch-progress-notify-interval", opts.progressNotifyInterval.String())
		}
	}
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// If this test process dies without running its cleanups (a -timeout panic, a signal), the
	// kernel kills the server too instead of leaving it running.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	s.cmd = cmd
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(15 * time.Second)
	hc := &http.Client{Timeout: time.Second}
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			s.cmd = nil
			return fmt.Errorf("%s exited during startup", bin)
		default:
		}
		if resp, err := hc.Get(s.url + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				s.exited = exited
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.exited = exited
	return fmt.Errorf("%s not healthy on %s after 15s", bin, s.url)
}

// stop ends the one process this test started (SIGTERM, then SIGKILL after 10 s), and quotes
// its log if the test failed.
func (s *server) stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	harness.Stop(s.cmd.Process, s.exited, 10*time.Second)
	s.cmd = nil
	if s.t.Failed() {
		s.t.Logf("server log (%s):\n%s", s.url, s.logTail())
	}
}

func (s *server) logTail() string {
	return strings.TrimSpace(harness.Tail(s.logPath, 4000))
}

// client returns a kubernetes.Client (a clientv3.Client plus the Kubernetes interface), closed
// when the test ends.
func (s *server) client() *kubernetes.Client {
	s.t.Helper()
	// The client's own logger stays quiet: it logs every expected ErrCompacted/ErrFutureRev.
	c, err := kubernetes.New(clientv3.Config{Endpoints: []string{s.url}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { c.Close() })
	return c
}

func (s *server) readVersion() {
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{s.url}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		s.t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := c.Status(ctx, s.url)
	if err != nil {
		s.t.Fatalf("Maintenance.Status: %v", err)
	}
	v, err := semver.NewVersion(strings.TrimPrefix(st.Version, "v"))
	if err != nil {
		s.t.Fatalf("Maintenance.Status version %q is not semver: %v", st.Version, err)
	}
	s.version = v
}

// requireEtcd skips the calling test when it runs against a real etcd whose version lacks a
// behaviour (ok(version) is false), naming what is missing. Against cairn it never skips: cairn
// must have every behaviour whatever version it reports.
func (s *server) requireEtcd(t *testing.T, ok func(v semver.Version) bool, what string) {
	t.Helper()
	if etcdBin() != "" && !ok(*s.version) {
		t.Skipf("etcd %s lacks %s", s.version, what)
	}
}

// atLeast says whether v is at least major.minor.patch.
func atLeast(v semver.Version, major, minor, patch int64) bool {
	return !v.LessThan(semver.Version{Major: major, Minor: minor, Patch: patch})
}

// watchProgressGate is kube-apiserver's test (etcdfeature, RequestWatchProgress) of whether a
// server's RequestProgress answers are synchronised with its watch streams: >= 3.4.25 and not
// 3.5.0-3.5.7 (etcd fixed this in 3.4.25 and 3.5.8).
func watchProgressGate(v semver.Version) bool {
	if !atLeast(v, 3, 4, 25) {
		return false
	}
	return !(atLeast(v, 3, 5, 0) && !atLeast(v, 3, 5, 8))
}

// testCtx is a context for one test, bounded so that a hung server fails the test instead of the
// whole run.
func testCtx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// env is one test's server, its Kubernetes-interface client and helpers that fail the test on
// an error.
type env struct {
	t   *testing.T
	s   *server
	c   *kubernetes.Client
	k   kubernetes.Interface
	ctx context.Context
}

func newEnv(t *testing.T, opts serverOpts) *env {
	s := startServer(t, opts)
	c := s.client()
	return &env{t: t, s: s, c: c, k: c.Kubernetes, ctx: testCtx(t)}
}

func noErr(t *testing.T, err error, what string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// create is kube-apiserver's Create: OptimisticPut with expected revision 0. It must succeed;
// it returns the new object's revision.
func (e *env) create(key, val string, lease clientv3.LeaseID) int64 {
	e.t.Helper()
	r, err := e.k.OptimisticPut(e.ctx, key, []byte(val), 0, kubernetes.PutOptions{LeaseID: lease})
	noErr(e.t, err, "create "+key)
	if !r.Succeeded {
		e.t.Fatalf("create %s: not Succeeded", key)
	}
	return r.Revision
}

// update is GuaranteedUpdate's write: OptimisticPut at the object's revision; it must succeed.
func (e *env) update(key, val string, rev int64) int64 {
	e.t.Helper()
	r, err := e.k.OptimisticPut(e.ctx, key, []byte(val), rev, kubernetes.PutOptions{GetOnFailure: true})
	noErr(e.t, err, "update "+key)
	if !r.Succeeded {
		e.t.Fatalf("update %s at %d: not Succeeded (current %v)", key, rev, r.KV)
	}
	return r.Revision
}

// del is kube-apiserver's Delete: OptimisticDelete at the object's revision; it must succeed.
func (e *env) del(key string, rev int64) int64 {
	e.t.Helper()
	r, err := e.k.OptimisticDelete(e.ctx, key, rev, kubernetes.DeleteOptions{GetOnFailure: true})
	noErr(e.t, err, "delete "+key)
	if !r.Succeeded {
		e.t.Fatalf("delete %s at %d: not Succeeded (current %v)", key, rev, r.KV)
	}
	return r.Revision
}

func (e *env) get(key string, rev int64) kubernetes.GetResponse {
	e.t.Helper()
	r, err := e.k.Get(e.ctx, key, kubernetes.GetOptions{Revision: rev})
	noErr(e.t, err, fmt.Sprintf("get %s at %d", key, rev))
	return r
}

func (e *env) list(prefix string, opts kubernetes.ListOptions) kubernetes.ListResponse {
	e.t.Helper()
	r, err := e.k.List(e.ctx, prefix, opts)
	noErr(e.t, err, fmt.Sprintf("list %s %+v", prefix, opts))
	return r
}

// rev is the current store revision, read the way kube-apiserver's health check reads: a
// linearizable Get of a key that does not exist.
func (e *env) rev() int64 {
	e.t.Helper()
	return e.get("/registry/health", 0).Revision
}
