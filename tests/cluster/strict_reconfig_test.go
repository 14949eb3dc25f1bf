package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// TestMembershipChangesWithAVoterDown: etcd's strict reconfiguration checks, which cairn
// always applies. With one of three voters killed, the leader refuses to add a member (a
// learner or a voter: it is not connected to every voter) and to remove a running follower
// (the two left would need the dead one), each with "etcdserver: unhealthy cluster"; it
// removes the dead voter, which is no part of the running quorum.
func TestMembershipChangesWithAVoterDown(t *testing.T) {
	c := startCluster(t, 3, defaultBin(t))
	admin := c.client(c.endpoints()...)
	lead := c.leader(admin)
	dead, live := c.others(lead)[0], c.others(lead)[1]
	deadID, err := c.memberID(admin, dead)
	if err != nil {
		t.Fatal(err)
	}
	liveID, err := c.memberID(admin, live)
	if err != nil {
		t.Fatal(err)
	}
	leader := c.client(c.members[lead].url)
	c.kill(dead)
	// cairn counts a voter as connected for an election timeout after it last heard from it.
	time.Sleep(3 * time.Second)
	cx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := leader.MemberAddAsLearner(cx, []string{"http://127.0.0.1:1"}); !errors.Is(err, rpctypes.ErrUnhealthy) {
		t.Errorf("adding a learner with a voter down: %v; want %v", err, rpctypes.ErrUnhealthy)
	}
	if _, err := leader.MemberAdd(cx, []string{"http://127.0.0.1:2"}); !errors.Is(err, rpctypes.ErrUnhealthy) {
		t.Errorf("adding a voter with a voter down: %v; want %v", err, rpctypes.ErrUnhealthy)
	}
	if _, err := leader.MemberRemove(cx, liveID); !errors.Is(err, rpctypes.ErrUnhealthy) {
		t.Errorf("removing the running follower with the other down: %v; want %v", err, rpctypes.ErrUnhealthy)
	}
	if _, err := leader.MemberRemove(cx, deadID); err != nil {
		t.Fatalf("removing the dead voter: %v", err)
	}
	list, err := leader.MemberList(cx)
	if err != nil || len(list.Members) != 2 {
		t.Fatalf("after removing the dead voter the list is %v (%v); want 2 members", list, err)
	}
}
