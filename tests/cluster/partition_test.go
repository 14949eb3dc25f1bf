package cluster

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestPartitionCutsOffTheLeader checks the proxy itself: a leader cut off from the others
// loses its quorum (a linearizable read through it fails) while the majority elects another
// leader and takes writes, which the cut-off member does not see until the partition heals.
func TestPartitionCutsOffTheLeader(t *testing.T) {
	c := startCluster(t, 3, defaultBin(t))
	admin := c.client(c.endpoints()...)
	old := c.leader(admin)
	c.proxy.partition([]int{old}, c.others(old))
	isolated := c.client(c.members[old].url)
	majority := c.client(c.members[c.others(old)[0]].url)
	cx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c.putAfterLeaderLoss(majority, "after", "partition")
	short, cancelShort := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancelShort()
	if _, err := isolated.Get(short, "after"); err == nil {
		t.Fatal("a member cut off from the others served a linearizable read")
	}
	stale, err := isolated.Get(cx, "after", clientv3.WithSerializable())
	if err != nil || len(stale.Kvs) != 0 {
		t.Fatalf("the cut-off member saw the majority's write (%v, %v): the partition leaks", stale, err)
	}
	c.proxy.heal()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := isolated.Get(cx, "after", clientv3.WithSerializable())
		if err == nil && len(got.Kvs) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cut-off member did not catch up within 10 s of healing (%v, %v)", got, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("proxy: %s", c.proxy.stats())
	if c.proxy.cut == 0 {
		t.Fatal("the partition cut no connection: the proxy was not in the path")
	}
	c.convergence(admin)
}
