package compat

// A 3-member cluster of real processes under kill -9: writers on every member while the leader
// and followers are killed and restarted, then every member killed at once. Every acknowledged
// write must be readable afterwards, from every member, and the members must converge on the
// same revision and HashKV. With COMPAT_ETCD it runs against an etcd cluster started with the
// same flags, which checks the test itself.

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

type member struct {
	name, dataDir, url, peer string
	cmd                      *exec.Cmd
}

type cluster struct {
	t       *testing.T
	members []*member
	initial string
}

func startCluster(t *testing.T, n int) *cluster {
	t.Helper()
	c := &cluster{t: t}
	var initial []string
	for i := 0; i < n; i++ {
		m := &member{name: fmt.Sprintf("m%d", i), dataDir: t.TempDir()}
		m.url = fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
		m.peer = fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
		initial = append(initial, m.name+"="+m.peer)
		c.members = append(c.members, m)
	}
	c.initial = strings.Join(initial, ",")
	for i := range c.members {
		c.start(i)
	}
	t.Cleanup(func() {
		for i := range c.members {
			c.kill(i)
		}
	})
	return c
}

func (c *cluster) start(i int) {
	m := c.members[i]
	args := []string{"--name", m.name, "--data-dir", m.dataDir,
		"--listen-client-urls", m.url, "--advertise-client-urls", m.url,
		"--listen-peer-urls", m.peer, "--initial-advertise-peer-urls", m.peer,
		"--initial-cluster", c.initial, "--initial-cluster-state", "new",
		"--initial-cluster-token", "compat-cluster",
		"--heartbeat-interval", "50", "--election-timeout", "500"}
	if e := etcdBin(); e != "" {
		m.cmd = exec.Command(e, append(args, "--log-level", "error")...)
	} else {
		m.cmd = exec.Command(cairnBin(c.t), append([]string{"serve"}, args...)...)
	}
	log, err := os.OpenFile(filepath.Join(m.dataDir, "..", m.name+".log"),
		os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	m.cmd.Stdout, m.cmd.Stderr = log, log
	if err := m.cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) kill(i int) {
	m := c.members[i]
	if m.cmd != nil && m.cmd.Process != nil {
		_ = m.cmd.Process.Signal(syscall.SIGKILL)
		_, _ = m.cmd.Process.Wait()
		m.cmd = nil
	}
}

func (c *cluster) endpoints() []string {
	var eps []string
	for _, m := range c.members {
		eps = append(eps, m.url)
	}
	return eps
}

func (c *cluster) client(endpoints ...string) *clientv3.Client {
	// The client logs every retry while members are down; the test reports what matters.
	cfg := clientv3.Config{Endpoints: endpoints, DialTimeout: 2 * time.Second, Logger: zap.NewNop()}
	cl, err := clientv3.New(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { cl.Close() })
	return cl
}

// leader waits (at most 20 s) until every running member names the same leader, and returns
// that member's index.
func (c *cluster) leader(cl *clientv3.Client) int {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		ids, lead := map[uint64]int{}, uint64(0)
		agreed := true
		for i, m := range c.members {
			if m.cmd == nil {
				continue
			}
			cx, cancel := context.WithTimeout(context.Background(), time.Second)
			s, err := cl.Status(cx, m.url)
			cancel()
			if err != nil || s.Leader == 0 || (lead != 0 && s.Leader != lead) {
				agreed = false
				break
			}
			lead, ids[s.Header.MemberId] = s.Leader, i
		}
		if i, ok := ids[lead]; agreed && ok {
			return i
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.t.Fatal("no leader that every member agrees on within 20 s")
	return -1
}

// writers put unique keys through clients pinned to each member until stop closes, and
// return what was acknowledged.
func writers(c *cluster, stop <-chan struct{}) map[string]string {
	var mu sync.Mutex
	acked := map[string]string{}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		eps := c.endpoints()
		if g < len(eps) {
			eps = eps[g : g+1]
		}
		cl := c.client(eps...)
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				k, v := fmt.Sprintf("w%d-%06d", g, n), fmt.Sprint(n)
				cx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_, err := cl.Put(cx, k, v)
				cancel()
				if err == nil {
					mu.Lock()
					acked[k] = v
					mu.Unlock()
				} else {
					time.Sleep(20 * time.Millisecond)
				}
			}
		}(g)
	}
	<-stop
	wg.Wait()
	return acked
}

func TestClusterKeepsAcknowledgedWritesThroughKills(t *testing.T) {
	c := startCluster(t, 3)
	all := c.client(c.endpoints()...)
	c.leader(all)
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("seed %d", seed)
	stop := make(chan struct{})
	result := make(chan map[string]string)
	go func() { result <- writers(c, stop) }()
	// Kill the leader or a follower, restart it, five times over.
	for round := 0; round < 5; round++ {
		time.Sleep(time.Duration(800+rng.Intn(800)) * time.Millisecond)
		victim := c.leader(all)
		if rng.Intn(2) == 0 {
			victim = (victim + 1 + rng.Intn(2)) % 3
		}
		t.Logf("round %d: kill -9 m%d", round, victim)
		c.kill(victim)
		time.Sleep(time.Duration(300+rng.Intn(700)) * time.Millisecond)
		c.start(victim)
	}
	time.Sleep(500 * time.Millisecond)
	// Every member at once, while writes are in flight.
	for i := range c.members {
		c.kill(i)
	}
	close(stop)
	acked := <-result
	for i := range c.members {
		c.start(i)
	}
	c.leader(all)
	if len(acked) < 50 {
		t.Fatalf("only %d writes were acknowledged: the cluster barely served", len(acked))
	}
	for i, m := range c.members {
		cl := c.client(m.url)
		cx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := cl.Get(cx, "w", clientv3.WithPrefix())
		cancel()
		if err != nil {
			t.Fatalf("m%d: %v", i, err)
		}
		got := map[string]string{}
		for _, kv := range resp.Kvs {
			got[string(kv.Key)] = string(kv.Value)
		}
		for k, v := range acked {
			if got[k] != v {
				t.Fatalf("m%d lost acknowledged write %s=%s (has %q); seed %d", i, k, v, got[k], seed)
			}
		}
	}
	t.Logf("%d acknowledged writes, all present on every member", len(acked))
	convergence(t, c, all)
}

// convergence waits (at most 20 s) until every member reports the same revision and HashKV.
func convergence(t *testing.T, c *cluster, cl *clientv3.Client) {
	deadline := time.Now().Add(20 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		var revs []int64
		var hashes []uint32
		for _, m := range c.members {
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
		if len(revs) == len(c.members) && allSame(revs) && allSame(hashes) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("members did not converge: %s", last)
}

func allSame[T comparable](xs []T) bool {
	for _, x := range xs {
		if x != xs[0] {
			return false
		}
	}
	return true
}
