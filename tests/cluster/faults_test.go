package cluster

// The fault schedule: a seeded list of faults, each applied to a member chosen when it starts
// (the leader, or one of the followers), held for a while, then healed. The schedule is
// printed before a run, so a failure names what to replay (FAULT_SEEDS=<seed>); the timing of
// a replay differs, the faults and their order do not.

import (
	"context"
	"fmt"
	"math/rand"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

type faultKind string

const (
	killLeader      faultKind = "kill -9 the leader"
	killFollower    faultKind = "kill -9 a follower"
	killMajority    faultKind = "kill -9 the leader and a follower"
	killAll         faultKind = "kill -9 every member"
	pauseLeader     faultKind = "SIGSTOP the leader"
	pauseFollower   faultKind = "SIGSTOP a follower"
	isolateLeader   faultKind = "partition the leader from the others"
	isolateFollower faultKind = "partition a follower from the others"
	moveLeader      faultKind = "move leadership to a follower"
	restartLeader   faultKind = "SIGTERM the leader (it hands over), then restart it"
	// The membership faults (memfaults_test.go). The hold is how long the removed follower
	// runs on before it is killed, the caught-up learner stays, or the follower stays down (at
	// least). A member that joins from an empty data directory, or comes back once the log was
	// compacted past it, catches up by snapshot (--snapshot-count 500, and the history is long).
	replaceFollower  faultKind = "replace a follower (remove it, wipe it, add a fresh learner, promote it)"
	cycleLearner     faultKind = "add a learner, then remove it once caught up"
	killPastSnapshot faultKind = "kill -9 a follower until the log is compacted past it"
)

var allFaults = []faultKind{killLeader, killFollower, killMajority, killAll, pauseLeader,
	pauseFollower, isolateLeader, isolateFollower, moveLeader, restartLeader,
	replaceFollower, cycleLearner, killPastSnapshot}

type fault struct {
	kind   faultKind
	hold   time.Duration // how long the fault lasts before it is healed
	gap    time.Duration // healthy time after it
	choice int           // which follower, when the fault takes one
}

func (f fault) String() string {
	return fmt.Sprintf("%s for %v, then %v healthy", f.kind, f.hold, f.gap)
}

// schedule draws n faults from seed, from kinds (every kind when nil).
func schedule(seed int64, n int, kinds []faultKind) []fault {
	if kinds == nil {
		kinds = allFaults
	}
	rng := rand.New(rand.NewSource(seed))
	out := make([]fault, n)
	for i := range out {
		out[i] = fault{
			kind:   kinds[rng.Intn(len(kinds))],
			hold:   time.Duration(500+rng.Intn(1500)) * time.Millisecond,
			gap:    time.Duration(300+rng.Intn(1200)) * time.Millisecond,
			choice: rng.Intn(2),
		}
	}
	return out
}

func describe(faults []fault) string {
	var b strings.Builder
	for i, f := range faults {
		fmt.Fprintf(&b, "\n  %2d. %s", i+1, f)
	}
	return b.String()
}

// inject applies one fault, holds it, heals the cluster and waits the gap. It returns what it
// did, with the members it chose.
func (c *cluster) inject(admin *clientv3.Client, f fault) string {
	lead := c.leader(admin)
	follower := c.follower(lead, f.choice)
	// single applies act to one member and says which.
	single := func(target int, act func(int)) string {
		act(target)
		return fmt.Sprintf("%s (m%d)", f.kind, target)
	}
	isolate := func(i int) { c.proxy.partition([]int{i}, c.others(i)) }
	var did string
	switch f.kind {
	case killLeader:
		did = single(lead, c.kill)
	case killFollower:
		did = single(follower, c.kill)
	case pauseLeader:
		did = single(lead, c.pause)
	case pauseFollower:
		did = single(follower, c.pause)
	case isolateLeader:
		did = single(lead, isolate)
	case isolateFollower:
		did = single(follower, isolate)
	case restartLeader:
		did = single(lead, func(i int) { c.signal(i, syscall.SIGTERM) })
	case killMajority:
		did = fmt.Sprintf("%s (m%d, m%d)", f.kind, lead, follower)
		c.kill(lead)
		c.kill(follower)
	case killAll:
		did = string(f.kind)
		for _, i := range c.live() {
			c.kill(i)
		}
	case moveLeader:
		did = fmt.Sprintf("%s (m%d to m%d): %v", f.kind, lead, follower, c.move(lead, follower))
	case replaceFollower, cycleLearner, killPastSnapshot:
		// They hold for f.hold themselves, and heal what they leave.
		started := time.Now()
		did = fmt.Sprintf("%s (%s; took %v)", f.kind, c.injectMembership(admin, f, follower),
			time.Since(started).Round(10*time.Millisecond))
		time.Sleep(f.gap)
		return did
	}
	time.Sleep(f.hold)
	c.heal()
	time.Sleep(f.gap)
	return did
}

// follower is the leader's choice-th follower among the members not removed, counting round
// from the leader (in a cluster that never changed, member (lead+1+choice) mod 3, as the
// schedules of the first harness chose it).
func (c *cluster) follower(lead, choice int) int {
	live := c.live()
	at := -1
	for k, i := range live {
		if i == lead {
			at = k
		}
	}
	if at < 0 || len(live) < 2 {
		c.t.Fatalf("the leader m%d is not among the members %v", lead, live)
	}
	return live[(at+1+choice%(len(live)-1))%len(live)]
}

// others is every member not removed from the cluster but i.
func (c *cluster) others(i int) []int {
	var out []int
	for _, j := range c.live() {
		if j != i {
			out = append(out, j)
		}
	}
	return out
}

// move asks leader `from` to hand leadership to member `to`; its answer is reported, not
// judged (a transfer may time out while the target catches up).
func (c *cluster) move(from, to int) string {
	cl := c.client(c.members[from].url)
	id, err := c.memberID(cl, to)
	if err != nil {
		return "target unreachable: " + err.Error()
	}
	cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := cl.MoveLeader(cx, id); err != nil {
		return "refused: " + err.Error()
	}
	return "done"
}
