package cluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestWatchAndLeasesOnFollowers: a watch served by a follower sees every write made through
// another member, in order; a lease granted and kept alive only through a follower (which
// forwards keepalives to the leader) outlives its TTL, survives kill -9 of the leader (the
// next leader inherits it with a grace period), and expires once the keepalives stop, its key
// deleted with an event the follower's watch delivers.
func TestWatchAndLeasesOnFollowers(t *testing.T) {
	c := startCluster(t, 3, defaultBin(t))
	admin := c.client(c.endpoints()...)
	l := c.leader(admin)
	others := c.others(l)
	follower := c.client(c.members[others[0]].url)
	writer := c.client(c.members[others[1]].url)
	x, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	events := follower.Watch(clientv3.WithRequireLeader(x), "co/", clientv3.WithPrefix(), clientv3.WithPrevKV())
	lease, err := follower.Grant(x, 2)
	if err != nil {
		t.Fatalf("grant through a follower: %v", err)
	}
	if _, err := follower.Put(x, "co/held", "v", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatalf("put with the lease: %v", err)
	}
	keep, stopKeeping := context.WithCancel(x)
	alive, err := follower.KeepAlive(keep, lease.ID)
	if err != nil {
		t.Fatalf("keepalive through a follower: %v", err)
	}
	go func() {
		for range alive {
		}
	}()
	for i := 0; i < 20; i++ {
		if _, err := writer.Put(x, fmt.Sprintf("co/k%02d", i), "v"); err != nil {
			t.Fatalf("put: %v", err)
		}
	}
	time.Sleep(3 * time.Second) // past the TTL: only the keepalives hold it
	c.kill(l)
	c.putAfterLeaderLoss(writer, "co/after", "v")
	time.Sleep(3 * time.Second) // the keepalives now reach the new leader
	ttl, err := follower.TimeToLive(x, lease.ID)
	if err != nil || ttl.TTL <= 0 {
		t.Fatalf("the lease did not survive the leader's kill -9 with keepalives: %+v %v", ttl, err)
	}
	stopKeeping()

	want := []string{"PUT co/held"}
	for i := 0; i < 20; i++ {
		want = append(want, fmt.Sprintf("PUT co/k%02d", i))
	}
	want = append(want, "PUT co/after", "DELETE co/held")
	var got []string
	var last int64
	for len(got) < len(want) {
		select {
		case resp, ok := <-events:
			if !ok || resp.Err() != nil {
				t.Fatalf("the follower's watch ended after %v: %v", got, resp.Err())
			}
			for _, ev := range resp.Events {
				if ev.Kv.ModRevision < last {
					t.Fatalf("revision went back: %d after %d", ev.Kv.ModRevision, last)
				}
				last = ev.Kv.ModRevision
				got = append(got, fmt.Sprintf("%s %s", ev.Type, ev.Kv.Key))
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("events so far %v, want %v", got, want)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("the follower's watch saw %v, want %v", got, want)
	}
}
