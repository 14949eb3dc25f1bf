package cluster

import (
	"context"
	"testing"
	"time"
)

// TestLeaseReadAfterLeaderStall: with reads by lease, a leader stopped (SIGSTOP) while the
// others elect a new leader and take a write must not answer a read queued during its stall
// with the old value when it resumes: it has to count the time that passed first.
func TestLeaseReadAfterLeaderStall(t *testing.T) {
	if etcdBin() != "" {
		t.Skip("etcd has no lease read mode to configure")
	}
	bin := append(defaultBin(t), "--read-mode", "lease")
	c := startCluster(t, 3, bin)
	admin := c.client(c.endpoints()...)
	for round := 0; round < 3; round++ {
		old := c.leader(admin)
		stale := c.client(c.members[old].url)
		cx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if _, err := stale.Put(cx, "k", "before"); err != nil {
			t.Fatalf("put through the leader: %v", err)
		}
		c.pause(old)
		fresh := c.client(c.members[c.others(old)[0]].url)
		c.putAfterLeaderLoss(fresh, "k", "after")
		// A read sent to the stopped leader waits in its socket until it resumes.
		got := make(chan string, 1)
		go func() {
			resp, err := stale.Get(cx, "k")
			switch {
			case err != nil:
				got <- "error: " + err.Error()
			case len(resp.Kvs) == 0:
				got <- "(absent)"
			default:
				got <- string(resp.Kvs[0].Value)
			}
		}()
		time.Sleep(200 * time.Millisecond)
		c.resume(old)
		if v := <-got; v == "before" {
			t.Fatalf("round %d: the stalled leader answered from an expired lease: %q", round, v)
		} else {
			t.Logf("round %d: the stalled leader answered %q", round, v)
		}
		cancel()
	}
}
