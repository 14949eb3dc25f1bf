package cluster

// A 3-member cluster of real processes under kill -9: writers on every member while the leader
// and followers are killed and restarted, then every member killed at once. Every acknowledged
// write must be readable afterwards, from every member, and the members must converge on the
// same revision and HashKV. With CLUSTER_ETCD it runs against an etcd cluster started with the
// same flags, which checks the test itself.

import (
	"context"
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

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
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("seed %d", seed)
	var extra []string
	if etcdBin() == "" && seed%2 == 1 {
		// Half the runs sync the log on its own thread, whatever the disk's speed.
		t.Log("asynchronous log syncs (--log-sync async)")
		extra = []string{"--log-sync", "async"}
	}
	c := startCluster(t, 3, defaultBin(t), extra...)
	all := c.client(c.endpoints()...)
	c.leader(all)
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
		c.heal()
	}
	time.Sleep(500 * time.Millisecond)
	// Every member at once, while writes are in flight.
	for i := range c.members {
		c.kill(i)
	}
	close(stop)
	acked := <-result
	c.heal()
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
	c.convergence(all)
}
