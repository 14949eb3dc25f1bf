// Package cluster runs real cairn clusters (3 processes on 127.0.0.1) under faults: kill -9,
// SIGSTOP, partitions through a TCP proxy on the peer ports, leadership moves, graceful
// restarts and membership changes (a follower replaced, a learner added and removed, a member
// back after the log was compacted past it, each catching up by snapshot), with the official
// etcd Go client as the workload and porcupine as the judge.
//
// Environment:
//
//	CAIRN_BIN          the cairn binary (default: the release, then debug build in cargo's target directory)
//	CAIRN_PLANTED_BIN  cairn built with --features planted-bugs, for the checker's own test
//	CLUSTER_ETCD       an etcd binary: run the same tests against etcd (checks the harness)
//	FAULT_SEEDS        seeds for the fault runs: "7", "1,5,9" or "1..20" (default 1,2,3)
//	FAULT_SOAK         a duration ("30m"): run random seeds until it has passed
package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"cairn.dev/harness"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func etcdBin() string { return os.Getenv("CLUSTER_ETCD") }

// snapshotCount is every member's --snapshot-count: how many applied entries pass between two
// compactions of the log.
const snapshotCount = 500

// catchUpEntries is every cairn member's --snapshot-catchup-entries: how many entries its log
// keeps behind a compaction. Small, so that a member down for a while needs a snapshot; etcd
// keeps its default of 5,000 (Debian's etcd 3.4 has no such flag).
const catchUpEntries = 100

// freePort returns a port that is free now, from below the ephemeral range (see
// harness.RandomFreePort): a fault run makes hundreds of connections.
func freePort(t *testing.T) int {
	if port := harness.RandomFreePort(100); port != 0 {
		return port
	}
	t.Fatal("no free port between 20000 and 32000")
	return 0
}

// member is one server process. It listens for peers on peerPort but advertises proxyPort,
// so every connection a peer opens to it passes through the test's proxy.
type member struct {
	name, dir, url      string
	peerPort, proxyPort int
	cmd                 *exec.Cmd
	joining             string        // --initial-cluster of a member added at run time
	exited              chan struct{} // closed when the running process has been reaped
	expectExit          bool          // set before the test stops or kills it
	paused              bool
	removed             bool // by the Cluster API: heal leaves it down, checks skip it
}

type cluster struct {
	t       *testing.T
	bin     []string // program and leading arguments
	extra   []string
	root    string // data directories and logs; kept when the test fails
	members []*member
	initial string
	proxy   *proxy
	mu      sync.Mutex // guards members (it grows), each member's cmd, expectExit, paused, removed
	crashed []string   // members that exited without being asked to
	clients []*clientv3.Client
	seats   *seats // the workers' members, when workers run
}

// startCluster starts n members, through the proxy, and waits for a leader. extra flags go to
// every member (both cairn and etcd must accept them).
func startCluster(t *testing.T, n int, bin []string, extra ...string) *cluster {
	t.Helper()
	root, err := os.MkdirTemp("", "cairn-cluster-")
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, bin: bin, extra: extra, root: root}
	var initial []string
	for i := 0; i < n; i++ {
		m := &member{name: fmt.Sprintf("m%d", i), dir: filepath.Join(root, fmt.Sprintf("m%d", i))}
		m.url = fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
		m.peerPort, m.proxyPort = freePort(t), freePort(t)
		initial = append(initial, fmt.Sprintf("%s=http://127.0.0.1:%d", m.name, m.proxyPort))
		c.members = append(c.members, m)
	}
	c.initial = strings.Join(initial, ",")
	c.proxy = newProxy(t, c)
	t.Cleanup(c.close)
	for i := range c.members {
		c.start(i)
	}
	return c
}

// defaultBin is cairn, or etcd when CLUSTER_ETCD is set.
func defaultBin(t *testing.T) []string {
	if e := etcdBin(); e != "" {
		return []string{e}
	}
	return []string{harness.CairnBin(t), "serve"}
}

func (c *cluster) start(i int) {
	m := c.members[i]
	peer := fmt.Sprintf("http://127.0.0.1:%d", m.peerPort)
	advertised := fmt.Sprintf("http://127.0.0.1:%d", m.proxyPort)
	initial, state := c.initial, "new"
	if m.joining != "" {
		initial, state = m.joining, "existing"
	}
	args := append(append([]string{}, c.bin[1:]...),
		"--name", m.name, "--data-dir", m.dir,
		"--listen-client-urls", m.url, "--advertise-client-urls", m.url,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", advertised,
		"--initial-cluster", initial, "--initial-cluster-state", state,
		"--initial-cluster-token", "fault-cluster",
		"--heartbeat-interval", "50", "--election-timeout", "500",
		// Compacting the log often makes a member that was down catch up by snapshot.
		"--snapshot-count", fmt.Sprint(snapshotCount))
	args = append(args, c.extra...)
	if etcdBin() != "" {
		args = append(args, "--log-level", "warn")
	} else {
		args = append(args, "--snapshot-catchup-entries", fmt.Sprint(catchUpEntries))
	}
	cmd := exec.Command(c.bin[0], args...)
	log, err := os.OpenFile(filepath.Join(c.root, m.name+".log"),
		os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	fmt.Fprintf(log, "---- %s start\n", time.Now().Format(time.RFC3339Nano))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	exited := make(chan struct{})
	c.mu.Lock()
	m.cmd, m.exited, m.expectExit, m.paused = cmd, exited, false, false
	c.mu.Unlock()
	go func() {
		err := cmd.Wait()
		log.Close()
		c.mu.Lock()
		if !m.expectExit {
			c.crashed = append(c.crashed, fmt.Sprintf("%s exited on its own (%v)", m.name, err))
		}
		c.mu.Unlock()
		close(exited)
	}()
}

// signal sends sig to member i and, for SIGKILL and SIGTERM, waits (at most 15 s) until the
// process is gone. A process that ignores SIGTERM that long fails the test.
func (c *cluster) signal(i int, sig syscall.Signal) {
	m := c.members[i]
	c.mu.Lock()
	cmd, exited := m.cmd, m.exited
	if cmd == nil {
		c.mu.Unlock()
		return
	}
	stops := sig == syscall.SIGKILL || sig == syscall.SIGTERM
	if stops {
		m.expectExit, m.cmd = true, nil
		if m.paused { // a stopped process would not act on SIGTERM
			_ = cmd.Process.Signal(syscall.SIGCONT)
		}
		m.paused = false
	}
	switch sig {
	case syscall.SIGSTOP:
		m.paused = true
	case syscall.SIGCONT:
		m.paused = false
	}
	c.mu.Unlock()
	_ = cmd.Process.Signal(sig)
	if !stops {
		return
	}
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-exited
		c.t.Errorf("%s did not stop within 15 s of %v", m.name, sig)
	}
}

func (c *cluster) kill(i int)   { c.signal(i, syscall.SIGKILL) }
func (c *cluster) pause(i int)  { c.signal(i, syscall.SIGSTOP) }
func (c *cluster) resume(i int) { c.signal(i, syscall.SIGCONT) }

// running reports whether member i is up and not paused.
func (c *cluster) running(i int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.members[i].cmd != nil && !c.members[i].paused
}

// pids maps every running process to its member's index (for the proxy).
func (c *cluster) pids() map[int]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[int]int{}
	for i, m := range c.members {
		if m.cmd != nil {
			out[m.cmd.Process.Pid] = i
		}
	}
	return out
}

// heal ends every fault: resumes paused members, starts stopped ones (not those removed from
// the cluster), and lifts partitions.
func (c *cluster) heal() {
	c.proxy.heal()
	for i, m := range c.members {
		c.mu.Lock()
		down, paused := m.cmd == nil && !m.removed, m.paused
		c.mu.Unlock()
		if paused {
			c.resume(i)
		}
		if down {
			c.start(i)
		}
	}
}

// awaitExit waits (at most `within`) for member i to exit on its own, as it must after a
// fatal error, and takes it off the list of crashes. False if it is still running.
func (c *cluster) awaitExit(i int, within time.Duration) bool {
	m := c.members[i]
	c.mu.Lock()
	exited := m.exited
	c.mu.Unlock()
	select {
	case <-exited:
	case <-time.After(within):
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	m.cmd = nil
	kept := c.crashed[:0]
	for _, s := range c.crashed {
		if !strings.HasPrefix(s, m.name+" ") {
			kept = append(kept, s)
		}
	}
	c.crashed = kept
	return true
}

// failIfCrashed stops the test at once if a member exited on its own (a bad flag, a port in
// use), quoting the end of its log, instead of waiting out a leader that cannot come.
func (c *cluster) failIfCrashed() {
	if report := c.crashReport(); report != "" {
		c.t.Fatal(report)
	}
}

// crashReport names the members that exited on their own and quotes the first one's log.
func (c *cluster) crashReport() string {
	c.mu.Lock()
	crashed := append([]string(nil), c.crashed...)
	c.mu.Unlock()
	if len(crashed) == 0 {
		return ""
	}
	name := strings.Fields(crashed[0])[0]
	log := harness.Tail(filepath.Join(c.root, name+".log"), 3000)
	return fmt.Sprintf("%s; %s's log ends:\n%s", strings.Join(crashed, "; "), name, log)
}

// checkCrashes fails the test if a member exited without being killed or stopped.
func (c *cluster) checkCrashes() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.crashed {
		c.t.Errorf("%s; logs in %s", s, c.root)
	}
	c.crashed = nil
}

// close stops every process it started (by PID) and the proxy; the directory with data and
// logs is removed unless the test failed.
func (c *cluster) close() {
	for i := range c.members {
		c.kill(i)
	}
	c.checkCrashes()
	c.proxy.close()
	for _, cl := range c.clients {
		cl.Close()
	}
	if c.t.Failed() {
		c.t.Logf("data and logs kept in %s", c.root)
		return
	}
	os.RemoveAll(c.root)
}

// endpoints are the client URLs of the members not removed from the cluster.
func (c *cluster) endpoints() []string {
	var eps []string
	for _, i := range c.live() {
		eps = append(eps, c.member(i).url)
	}
	return eps
}

// live is the indexes of the members not removed from the cluster, in order.
func (c *cluster) live() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []int
	for i, m := range c.members {
		if !m.removed {
			out = append(out, i)
		}
	}
	return out
}

// client is a client of the given endpoints with the etcd client's own retries and balancing,
// closed with the cluster.
func (c *cluster) client(endpoints ...string) *clientv3.Client {
	cfg := clientv3.Config{Endpoints: endpoints, DialTimeout: 2 * time.Second, Logger: zap.NewNop()}
	cl, err := clientv3.New(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	c.mu.Lock()
	c.clients = append(c.clients, cl)
	c.mu.Unlock()
	return cl
}

// leader waits (at most 20 s) until every running member names the same leader, and returns
// that member's index.
func (c *cluster) leader(cl *clientv3.Client) int {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		c.failIfCrashed()
		if i, ok := c.agreedLeader(cl); ok {
			return i
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.t.Fatalf("no leader that every running member agrees on within 20 s; logs in %s", c.root)
	return -1
}

func (c *cluster) agreedLeader(cl *clientv3.Client) (int, bool) {
	ids, lead := map[uint64]int{}, uint64(0)
	for _, i := range c.live() {
		m := c.member(i)
		if !c.running(i) {
			continue
		}
		cx, cancel := context.WithTimeout(context.Background(), time.Second)
		s, err := cl.Status(cx, m.url)
		cancel()
		if err != nil || s.Leader == 0 || (lead != 0 && s.Leader != lead) {
			return 0, false
		}
		lead, ids[s.Header.MemberId] = s.Leader, i
	}
	i, ok := ids[lead]
	return i, ok
}

// putAfterLeaderLoss writes through cl while the old leader is cut off or stopped, trying up
// to five times: the first attempts may reach the old leader through a member that has not
// noticed yet, and time out (etcd answers the same).
func (c *cluster) putAfterLeaderLoss(cl *clientv3.Client, key, value string) {
	c.t.Helper()
	for attempt := 0; ; attempt++ {
		try, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		_, err := cl.Put(try, key, value)
		cancel()
		if err == nil {
			return
		}
		if attempt == 4 {
			c.t.Fatalf("the majority does not take writes without the old leader: %v", err)
		}
	}
}

// memberID is member i's id as it reports it.
func (c *cluster) memberID(cl *clientv3.Client, i int) (uint64, error) {
	cx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s, err := cl.Status(cx, c.members[i].url)
	if err != nil {
		return 0, err
	}
	return s.Header.MemberId, nil
}

// convergence waits (at most 20 s) until every member not removed from the cluster reports
// the same revision and HashKV.
func (c *cluster) convergence(cl *clientv3.Client) {
	var members []*member
	for _, i := range c.live() {
		members = append(members, c.member(i))
	}
	c.convergenceOf(cl, members)
}

// convergenceOf is convergence among the given members only.
func (c *cluster) convergenceOf(cl *clientv3.Client, members []*member) {
	deadline := time.Now().Add(20 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		var revs []int64
		var hashes []uint32
		for _, m := range members {
			cx, cancel := context.WithTimeout(context.Background(), time.Second)
			s, err := cl.Status(cx, m.url)
			if err == nil {
				var h *clientv3.HashKVResponse
				h, err = cl.HashKV(cx, m.url, s.Header.Revision)
				if err == nil {
					revs, hashes = append(revs, s.Header.Revision), append(hashes, h.Hash)
				}
			}
			cancel()
		}
		last = fmt.Sprintf("revisions %v, hashes %v", revs, hashes)
		if len(revs) == len(members) && allSame(revs) && allSame(hashes) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.t.Fatalf("members did not converge: %s", last)
}

// logLines counts the lines of every member's log that contain s.
func (c *cluster) logLines(s string) int {
	n := 0
	for _, m := range c.members {
		data, _ := os.ReadFile(filepath.Join(c.root, m.name+".log"))
		n += strings.Count(string(data), s)
	}
	return n
}

func allSame[T comparable](xs []T) bool {
	for _, x := range xs {
		if x != xs[0] {
			return false
		}
	}
	return true
}
