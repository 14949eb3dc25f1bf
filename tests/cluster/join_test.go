package cluster

// Growing and repairing a cluster of real processes, as an operator does it: add a member
// through the Cluster API, start it with --initial-cluster-state existing and an empty data
// directory, promote it once it caught up; remove a member that died for good and replace it.
// A writer keeps writing the whole time.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// changeWindow is how long after a membership change or a kill a write may fail: an election
// (500 ms timeout here) and the client's move to another endpoint take well under it.
const changeWindow = 3 * time.Second

// member returns member i (members may be added while the proxy reads them).
func (c *cluster) member(i int) *member {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.members[i]
}

// addMember makes a member that is not started yet, behind the proxy, that will join the
// members in `with` (indexes) with --initial-cluster-state existing. Returns its index.
func (c *cluster) addMember(with []int) int {
	c.mu.Lock()
	i := len(c.members)
	m := &member{name: fmt.Sprintf("m%d", i), dir: filepath.Join(c.root, fmt.Sprintf("m%d", i))}
	m.url = fmt.Sprintf("http://127.0.0.1:%d", freePort(c.t))
	m.peerPort, m.proxyPort = freePort(c.t), freePort(c.t)
	var initial []string
	for _, j := range append(append([]int{}, with...), i) {
		o := m
		if j != i {
			o = c.members[j]
		}
		initial = append(initial, fmt.Sprintf("%s=%s", o.name, o.peerURL()))
	}
	m.joining = strings.Join(initial, ",")
	c.members = append(c.members, m)
	c.mu.Unlock()
	c.proxy.listen(i, m.proxyPort)
	return i
}

// peerURL is the URL its peers reach it at (through the proxy).
func (m *member) peerURL() string { return fmt.Sprintf("http://127.0.0.1:%d", m.proxyPort) }

// writer puts keys through cl until stopped, and remembers when a write failed.
type writer struct {
	mu       sync.Mutex
	ok       int
	failures []time.Time
	lastErr  error
	stop     chan struct{}
	done     chan struct{}
}

func startWriter(cl *clientv3.Client) *writer {
	w := &writer{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for n := 0; ; n++ {
			select {
			case <-w.stop:
				return
			default:
			}
			cx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := cl.Put(cx, fmt.Sprintf("w/%08d", n), "during the change")
			cancel()
			w.mu.Lock()
			if err != nil {
				w.failures, w.lastErr = append(w.failures, time.Now()), err
			} else {
				w.ok++
			}
			w.mu.Unlock()
			if err != nil {
				time.Sleep(50 * time.Millisecond)
			}
		}
	}()
	return w
}

// finish stops the writer and fails the test if a write failed outside the window after one
// of the given moments (membership changes, kills), or if too few writes succeeded.
func (w *writer) finish(t *testing.T, changes []time.Time, least int) {
	t.Helper()
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, f := range w.failures {
		explained := false
		for _, ch := range changes {
			explained = explained || (!f.Before(ch) && f.Sub(ch) < changeWindow)
		}
		if !explained {
			t.Fatalf("a write failed at %s, outside %s after any change (%d failed, last: %v)",
				f.Format(time.RFC3339Nano), changeWindow, len(w.failures), w.lastErr)
		}
	}
	if w.ok < least {
		t.Fatalf("only %d writes succeeded during the changes (%d failed, last: %v)",
			w.ok, len(w.failures), w.lastErr)
	}
	t.Logf("writer: %d writes succeeded, %d failed within %s of a change", w.ok, len(w.failures), changeWindow)
}

// load writes n keys of 100 bytes, 100 to a transaction.
func load(t *testing.T, cl *clientv3.Client, n int) {
	t.Helper()
	value := strings.Repeat("v", 100)
	for i := 0; i < n; i += 100 {
		var ops []clientv3.Op
		for k := i; k < i+100 && k < n; k++ {
			ops = append(ops, clientv3.OpPut(fmt.Sprintf("load/%08d", k), value))
		}
		cx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := cl.Txn(cx).Then(ops...).Commit()
		cancel()
		if err != nil {
			t.Fatalf("loading key %d: %v", i, err)
		}
	}
}

// keyCount is how many keys to load: 10,000, or 100,000 for a long run (FAULT_SOAK set).
func keyCount() int {
	if os.Getenv("FAULT_SOAK") != "" {
		return 100_000
	}
	return 10_000
}

// join adds a learner through cl, starts it from an empty data directory with
// --initial-cluster-state existing, and promotes it once it caught up (retrying while it is
// not ready). Returns the new member's index and the moments of the two changes.
func (c *cluster) join(cl *clientv3.Client, with []int) (int, []time.Time) {
	c.t.Helper()
	i, id, changes := c.addLearner(cl, with)
	return i, append(changes, c.promote(cl, id))
}

// addLearner adds a learner through cl and starts it from an empty data directory with
// --initial-cluster-state existing. Returns its index, its id and the moment it was added.
func (c *cluster) addLearner(cl *clientv3.Client, with []int) (int, uint64, []time.Time) {
	c.t.Helper()
	i := c.addMember(with)
	cx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	added, err := cl.MemberAddAsLearner(cx, []string{c.member(i).peerURL()})
	cancel()
	if err != nil {
		c.t.Fatalf("member add: %v", err)
	}
	changes := []time.Time{time.Now()}
	c.start(i)
	return i, added.Member.ID, changes
}

// joinAuto is join on a cluster started with --auto-promote-learners: nobody calls
// MemberPromote; the leader promotes the learner once it has caught up. Returns the new
// member's index and the moments of the two changes (the promotion's as the last moment it
// was still seen a learner).
func (c *cluster) joinAuto(cl *clientv3.Client, with []int) (int, []time.Time) {
	c.t.Helper()
	i, id, changes := c.addLearner(cl, with)
	deadline := time.Now().Add(30 * time.Second)
	for {
		c.failIfCrashed()
		at := time.Now()
		cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		list, err := cl.MemberList(cx)
		cancel()
		if err == nil {
			for _, m := range list.Members {
				if m.ID == id && !m.IsLearner {
					return i, append(changes, at)
				}
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("the learner %x was never promoted (last list error: %v); logs in %s", id, err, c.root)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestGrowFromOneToThree: one member holding 10,000 keys (100,000 with FAULT_SOAK) grows to
// three, each new member joining as a learner from an empty directory and promoted once it
// caught up, while a writer keeps writing; every member ends with the same HashKV.
func TestGrowFromOneToThree(t *testing.T) {
	growFromOneToThree(t, false)
}

// TestGrowFromOneToThreeWithAutomaticPromotion: the same journey with --auto-promote-learners,
// where the leader promotes each learner by itself once it has caught up.
func TestGrowFromOneToThreeWithAutomaticPromotion(t *testing.T) {
	growFromOneToThree(t, true)
}

func growFromOneToThree(t *testing.T, auto bool) {
	if etcdBin() != "" {
		t.Skip("cairn's journey (etcd would need its own member add output)")
	}
	var extra []string
	join := (*cluster).join
	if auto {
		extra, join = []string{"--auto-promote-learners"}, (*cluster).joinAuto
	}
	c := startCluster(t, 1, defaultBin(t), extra...)
	cl := c.client(c.members[0].url)
	c.leader(cl)
	load(t, cl, keyCount())
	w := startWriter(cl)
	_, first := join(c, cl, []int{0})
	_, second := join(c, cl, []int{0, 1})
	time.Sleep(500 * time.Millisecond) // writes after the last change reach all three
	w.finish(t, append(first, second...), 50)
	c.leader(c.client(c.endpoints()...))
	list, err := cl.MemberList(context.Background())
	if err != nil || len(list.Members) != 3 {
		t.Fatalf("member list: %v %v", list, err)
	}
	for _, m := range list.Members {
		if m.IsLearner || m.Name == "" {
			t.Fatalf("every member should be a started voter: %v", list.Members)
		}
	}
	c.convergence(cl)
}

// TestReplaceADeadMember: of three members, the leader is killed for good and removed; a new
// member joins from an empty data directory, catches up and is promoted; writes go on
// throughout (failing only while a new leader is elected), and the three live members end
// with the same HashKV.
func TestReplaceADeadMember(t *testing.T) {
	if etcdBin() != "" {
		t.Skip("cairn's journey (etcd would need its own member add output)")
	}
	c := startCluster(t, 3, defaultBin(t))
	cl := c.client(c.endpoints()...)
	dead := c.leader(cl)
	load(t, cl, 2_000)
	w := startWriter(cl)
	time.Sleep(300 * time.Millisecond)
	deadID, err := c.memberID(cl, dead)
	if err != nil {
		t.Fatal(err)
	}
	changes := []time.Time{time.Now()}
	c.kill(dead)
	live := c.others(dead)
	c.leader(cl)
	cx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err = cl.MemberRemove(cx, deadID)
	cancel()
	if err != nil {
		t.Fatalf("member remove %x: %v", deadID, err)
	}
	changes = append(changes, time.Now())
	fresh, joined := c.join(cl, live)
	time.Sleep(500 * time.Millisecond)
	w.finish(t, append(changes, joined...), 50)
	c.convergenceOf(cl, []*member{c.member(live[0]), c.member(live[1]), c.member(fresh)})
}
