package cluster

// The membership faults of the schedule, made through the Cluster API as an operator makes
// them while the workers keep going: a follower replaced (removed while it still runs, then
// killed and wiped, and a fresh member with a new name, new ports and an empty data directory
// added as a learner and promoted once it caught up), a learner added and removed again, and a
// follower kept down until the log was compacted past it. A member that joins late, or comes
// back after the compaction, catches up by snapshot; each fault says whether the member
// installed one (cairn_snapshots_installed, etcd_network_snapshot_receive_success on its
// /metrics), so a replay shows which path a seed took.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
)

// TestEachMembershipFault runs every membership fault once, in a fixed order, whatever the
// seeds of TestLinearizableUnderFaults draw among all the faults: a learner added and removed,
// a follower replaced, a follower kept down past a compaction, then every member killed at once
// (the member that joined at run time restarts from its own data directory). The history must
// be linearizable and the members converged.
func TestEachMembershipFault(t *testing.T) {
	faults := []fault{
		{kind: cycleLearner, hold: time.Second, gap: 500 * time.Millisecond},
		{kind: replaceFollower, hold: time.Second, gap: 500 * time.Millisecond},
		{kind: killPastSnapshot, hold: time.Second, gap: 500 * time.Millisecond, choice: 1},
		{kind: killAll, hold: 500 * time.Millisecond, gap: time.Second},
	}
	res, vis := run(t, defaultBin(t), 1, faults)
	if res != porcupine.Ok {
		t.Fatalf("history is %s (visualization: %s)", res, vis)
	}
}

// clusterCallWithin bounds the retries of one Cluster API call. etcd takes a member add or a
// voter's removal only once the leader has been connected to every voter for 5 s (server.go,
// mayAddMember and mayRemoveMember: "etcdserver: unhealthy cluster"), which a member restarted
// by the fault before is not.
const clusterCallWithin = 30 * time.Second

// injectMembership applies a membership fault (follower is the member it takes, if it takes
// one), holds it for f.hold and leaves the cluster healed. Returns what it did.
func (c *cluster) injectMembership(admin *clientv3.Client, f fault, follower int) string {
	switch f.kind {
	case replaceFollower:
		return c.replaceMember(admin, follower, f.hold)
	case cycleLearner:
		return c.cycleLearner(admin, f.hold)
	case killPastSnapshot:
		return c.killPastSnapshot(admin, follower, f.hold)
	}
	c.t.Fatalf("%q is not a membership fault", f.kind)
	return ""
}

// replaceMember removes member old through the Cluster API and lets it run for hold (its
// workers keep calling it: whatever it answers is in the history), kills it and wipes its data
// directory, then adds a fresh member as a learner, starts it, promotes it once it caught up
// and hands it old's workers.
func (c *cluster) replaceMember(admin *clientv3.Client, old int, hold time.Duration) string {
	id := c.idOf(admin, old)
	c.markRemoved(old)
	admin.SetEndpoints(c.endpoints()...)
	c.removeMember(admin, id)
	time.Sleep(hold)
	c.kill(old)
	if err := os.RemoveAll(c.member(old).dir); err != nil {
		c.t.Fatal(err)
	}
	fresh, freshID := c.addLearnerRetrying(admin)
	c.promoteRetrying(admin, freshID)
	snap := c.snapshotReport(fresh)
	c.reseat(old, fresh)
	admin.SetEndpoints(c.endpoints()...)
	return fmt.Sprintf("m%d removed, m%d joined as a learner, %s, promoted", old, fresh, snap)
}

// cycleLearner adds a learner, waits until it serves what the voters hold, keeps it for hold,
// then removes it, kills it and wipes its data directory.
func (c *cluster) cycleLearner(admin *clientv3.Client, hold time.Duration) string {
	i, id := c.addLearnerRetrying(admin)
	c.awaitCaughtUp(admin, []int{i})
	time.Sleep(hold)
	snap := c.snapshotReport(i)
	c.markRemoved(i)
	c.removeMember(admin, id)
	c.kill(i)
	if err := os.RemoveAll(c.member(i).dir); err != nil {
		c.t.Fatal(err)
	}
	return fmt.Sprintf("m%d joined as a learner, %s, removed", i, snap)
}

// killPastSnapshot kills member i and keeps it down for at least hold and until the log moved
// far enough that the live members compacted past where i stopped, then restarts it: it must
// catch up by snapshot. cairn compacts every snapshotCount entries up to catchUpEntries behind
// what it applied (and keeps nothing for a member that is down), so one compaction after i
// stopped is enough, and it comes within catchUpEntries plus snapshotCount entries and what
// the store has not made durable yet. etcd snapshots every snapshotCount entries (and an apply
// batch) but compacts only up to 5,000 entries behind the snapshot (SnapshotCatchUpEntries),
// and not at all for 30 s after it sent a snapshot (releaseDelayAfterSnapshot: "skip
// compaction since there is an inflight snapshot"), so after another membership fault an etcd
// member may catch up from the log; the fault says which.
func (c *cluster) killPastSnapshot(admin *clientv3.Client, i int, hold time.Duration) string {
	need, within := uint64(catchUpEntries+snapshotCount*3/2), 30*time.Second
	if etcdBin() != "" {
		need, within = 5_000+2*snapshotCount, 60*time.Second
	}
	c.kill(i)
	start := c.raftIndex(admin) // i holds at most the few entries in flight past it
	held, limit := time.Now().Add(hold), time.Now().Add(within)
	stopFill := fill(admin)
	defer stopFill()
	var at uint64
	for {
		at = c.raftIndex(admin)
		if at >= start+need && time.Now().After(held) {
			break
		}
		if time.Now().After(limit) {
			c.t.Fatalf("with m%d down, the log moved %d entries in %v (want %d); logs in %s",
				i, at-start, within, need, c.root)
		}
		time.Sleep(100 * time.Millisecond)
	}
	stopFill()
	c.heal()
	return fmt.Sprintf("m%d down while the log moved %d entries, %s", i, at-start,
		c.awaitCatchUp(admin, i, at))
}

// fill writes through cl from a few goroutines until the returned function is first called
// (it returns once they stopped), so that the log moves on faster than the workers move it (etcd
// serves them at a few hundred writes a second here). Failed writes are of no interest: the
// keys are not in the history, only in the members' HashKV.
func fill(cl *clientv3.Client) func() {
	stop, done := make(chan struct{}), make(chan struct{})
	const writers = 6
	for g := 0; g < writers; g++ {
		go func(g int) {
			defer func() { done <- struct{}{} }()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				cx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_, err := cl.Put(cx, fmt.Sprintf("filler/%d", g), fmt.Sprint(n))
				cancel()
				if err != nil {
					time.Sleep(50 * time.Millisecond)
				}
			}
		}(g)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			close(stop)
			for g := 0; g < writers; g++ {
				<-done
			}
		})
	}
}

// idOf is member i's id, asked of it (at most 10 s: it may have been restarted just now).
func (c *cluster) idOf(cl *clientv3.Client, i int) uint64 {
	c.t.Helper()
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var id uint64
		if id, err = c.memberID(cl, i); err == nil {
			return id
		}
	}
	c.t.Fatalf("m%d does not tell its id: %v; logs in %s", i, err, c.root)
	return 0
}

// markRemoved takes member i out of the cluster's checks before its removal: heal no longer
// starts it, and its exit (etcd stops a member once it learns it was removed) is no crash.
func (c *cluster) markRemoved(i int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.members[i].removed, c.members[i].expectExit = true, true
}

// retryable reports whether a Cluster API call may succeed if made again: etcd's "unhealthy
// cluster" (see clusterCallWithin), a cluster between leaders, a call that timed out or a
// member that cannot be reached.
func retryable(err error) bool {
	for _, e := range []error{rpctypes.ErrUnhealthy, rpctypes.ErrMemberNotEnoughStarted,
		rpctypes.ErrTimeout, rpctypes.ErrTimeoutDueToLeaderFail, rpctypes.ErrTimeoutDueToConnectionLost,
		rpctypes.ErrLeaderChanged, rpctypes.ErrNoLeader, rpctypes.ErrStopped, context.DeadlineExceeded} {
		if errors.Is(err, e) {
			return true
		}
	}
	code, _ := codeAndMessage(err)
	return code == codes.Unavailable || code == codes.DeadlineExceeded
}

// removeMember removes member id through cl, retrying (see clusterCallWithin) what may pass
// later. A retry that finds the member gone means an earlier attempt that timed out took
// effect.
func (c *cluster) removeMember(cl *clientv3.Client, id uint64) {
	c.t.Helper()
	deadline := time.Now().Add(clusterCallWithin)
	for attempt := 0; ; attempt++ {
		c.failIfCrashed()
		cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := cl.MemberRemove(cx, id)
		cancel()
		switch {
		case err == nil, attempt > 0 && errors.Is(err, rpctypes.ErrMemberNotFound):
			return
		case !retryable(err) || time.Now().After(deadline):
			c.t.Fatalf("member remove %x: %v; logs in %s", id, err, c.root)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// addLearnerRetrying adds a fresh member (a new name, new ports behind the proxy, an empty data
// directory) as a learner through cl, retrying what may pass later, and starts it with
// --initial-cluster-state existing. Returns its index and id.
func (c *cluster) addLearnerRetrying(cl *clientv3.Client) (int, uint64) {
	c.t.Helper()
	i := c.addMember(c.live())
	url := c.member(i).peerURL()
	deadline := time.Now().Add(clusterCallWithin)
	for attempt := 0; ; attempt++ {
		c.failIfCrashed()
		cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		added, err := cl.MemberAddAsLearner(cx, []string{url})
		cancel()
		var id uint64
		switch {
		case err == nil:
			id = added.Member.ID
		case attempt > 0 && errors.Is(err, rpctypes.ErrPeerURLExist):
			id = c.idByPeerURL(cl, url) // an earlier attempt that timed out took effect
		case !retryable(err) || time.Now().After(deadline):
			c.t.Fatalf("member add (learner) %s: %v; logs in %s", url, err, c.root)
		}
		if id != 0 {
			c.start(i)
			return i, id
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// idByPeerURL is the id of the member with peer URL url, from the member list.
func (c *cluster) idByPeerURL(cl *clientv3.Client, url string) uint64 {
	c.t.Helper()
	cx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	list, err := cl.MemberList(cx)
	if err != nil {
		c.t.Fatalf("member list: %v", err)
	}
	for _, m := range list.Members {
		for _, u := range m.PeerURLs {
			if u == url {
				return m.ID
			}
		}
	}
	c.t.Fatalf("no member with peer URL %s in %v", url, list.Members)
	return 0
}

// promoteRetrying promotes learner id through cl once it caught up: promote of the learners
// test, also retrying what may pass later. A retry that finds a voter means an earlier attempt
// that timed out took effect.
func (c *cluster) promoteRetrying(cl *clientv3.Client, id uint64) {
	c.t.Helper()
	deadline := time.Now().Add(clusterCallWithin)
	for attempt := 0; ; attempt++ {
		c.failIfCrashed()
		cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := cl.MemberPromote(cx, id)
		cancel()
		switch {
		case err == nil, attempt > 0 && errors.Is(err, rpctypes.ErrMemberNotLearner):
			return
		case errors.Is(err, rpctypes.ErrMemberLearnerNotReady) && time.Now().Before(deadline):
		case !retryable(err) || time.Now().After(deadline):
			c.t.Fatalf("member promote %x: %v; logs in %s", id, err, c.root)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// raftIndex is the highest Raft index a running live member reports (at most 10 s).
func (c *cluster) raftIndex(cl *clientv3.Client) uint64 {
	c.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var top uint64
		for _, i := range c.live() {
			if !c.running(i) {
				continue
			}
			cx, cancel := context.WithTimeout(context.Background(), time.Second)
			s, err := cl.Status(cx, c.member(i).url)
			cancel()
			if err == nil && s.RaftIndex > top {
				top = s.RaftIndex
			}
		}
		if top > 0 {
			return top
		}
	}
	c.t.Fatalf("no running member reports its Raft index; logs in %s", c.root)
	return 0
}

// awaitCatchUp waits (at most 20 s) until member i, just restarted, applied index target, and
// says whether it installed a snapshot on the way.
func (c *cluster) awaitCatchUp(cl *clientv3.Client, i int, target uint64) string {
	c.t.Helper()
	var last string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		c.failIfCrashed()
		cx, cancel := context.WithTimeout(context.Background(), time.Second)
		s, err := cl.Status(cx, c.member(i).url)
		cancel()
		if err == nil && s.RaftAppliedIndex >= target {
			return c.snapshotReport(i)
		}
		last = fmt.Sprintf("%v %v", s, err)
	}
	c.t.Fatalf("m%d did not apply index %d within 20 s of its restart (last status: %s); logs in %s",
		i, target, last, c.root)
	return ""
}

// snapshotReport says whether member i installed a snapshot since it started (asking at most
// 10 s: etcd can be slow to answer /metrics right after it installed one).
func (c *cluster) snapshotReport(i int) string {
	var n int
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if n, err = c.snapshotsInstalled(i); err == nil {
			break
		}
	}
	switch {
	case err != nil:
		return "snapshot install expected (" + err.Error() + ")"
	case n == 0:
		return "caught up from the log (no snapshot installed)"
	}
	return fmt.Sprintf("installed %d snapshot(s)", n)
}

// snapshotsInstalled is how many snapshots member i installed since it started, from its
// /metrics: cairn_snapshots_installed, or for etcd etcd_network_snapshot_receive_success
// summed over the senders (absent until the first).
func (c *cluster) snapshotsInstalled(i int) (int, error) {
	name := "cairn_snapshots_installed"
	if etcdBin() != "" {
		name = "etcd_network_snapshot_receive_success"
	}
	cx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(cx, http.MethodGet, c.member(i).url+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	total := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := strings.TrimPrefix(line, name)
		if !strings.HasPrefix(rest, " ") && !strings.HasPrefix(rest, "{") && !strings.HasPrefix(rest, "_total") {
			continue // another metric with this name as its prefix
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %q", name, line)
		}
		total += v
	}
	return int(total), sc.Err()
}
