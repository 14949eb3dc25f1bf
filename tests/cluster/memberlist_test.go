package cluster

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestMemberListShowsEveryMembersClientURLs: every member lists all three, each with the client
// URLs it advertises (members publish them through the log), which is what
// `etcdctl endpoint status --cluster` and clients' endpoint discovery rely on.
func TestMemberListShowsEveryMembersClientURLs(t *testing.T) {
	c := startCluster(t, 3, defaultBin(t))
	admin := c.client(c.endpoints()...)
	c.leader(admin)
	want := append([]string{}, c.endpoints()...)
	sort.Strings(want)
	var last string
	clients := map[string]*clientv3.Client{}
	for _, m := range c.members {
		clients[m.name] = c.client(m.url)
	}
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		ok := true
		for _, m := range c.members {
			cl := clients[m.name]
			cx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			resp, err := cl.MemberList(cx)
			cancel()
			if err != nil {
				ok, last = false, err.Error()
				break
			}
			var got []string
			for _, mm := range resp.Members {
				got = append(got, mm.ClientURLs...)
			}
			sort.Strings(got)
			if strings.Join(got, ",") != strings.Join(want, ",") {
				ok, last = false, m.name+" lists "+strings.Join(got, ",")
				break
			}
		}
		if ok {
			return
		}
	}
	t.Fatalf("member lists never showed every client URL (%s); want %v", last, want)
}

// TestMemberListIsLinearizableOnAFollower: etcd 3.5 answers the Go client's MemberList (which
// sets `linearizable`) only after a read barrier, so a follower cut off from the leader does not
// answer with a list that misses a committed change; asked for a serializable list, it answers
// from what it has applied. Once the partition heals it lists the change. The change is the
// removal of a learner, which etcd takes while a voter is unreachable (adding one it refuses).
func TestMemberListIsLinearizableOnAFollower(t *testing.T) {
	if major, minor := etcdVersion(t); major == 3 && minor < 5 {
		t.Skip("etcd 3.4's MemberList has no linearizable form")
	}
	c := startCluster(t, 3, defaultBin(t))
	admin := c.client(c.endpoints()...)
	lead := c.leader(admin)
	cut := c.others(lead)[0]
	leader, follower := c.client(c.members[lead].url), c.client(c.members[cut].url)
	cx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	added, err := memberAddOnceHealthy(leader, "http://127.0.0.1:1", true, 15*time.Second)
	if err != nil {
		t.Fatalf("member add: %v", err)
	}
	learner := added.Member.ID
	raw := pb.NewClusterClient(follower.ActiveConnection())
	serializable := func() []*pb.Member {
		resp, err := raw.MemberList(cx, &pb.MemberListRequest{Linearizable: false})
		if err != nil {
			t.Fatalf("a serializable MemberList on the follower: %v", err)
		}
		return resp.Members
	}
	for deadline := time.Now().Add(10 * time.Second); !lists(serializable(), learner); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the follower did not apply the learner's addition within 10 s")
		}
	}
	c.proxy.partition([]int{cut}, []int{lead, c.others(lead)[1]})
	if _, err := leader.MemberRemove(cx, learner); err != nil {
		t.Fatalf("member remove: %v", err)
	}
	short, cancelShort := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancelShort()
	if resp, err := follower.MemberList(short); err == nil {
		t.Fatalf("a follower cut off from the leader answered a linearizable MemberList: %d members", len(resp.Members))
	}
	if !lists(serializable(), learner) {
		t.Fatal("the cut-off follower applied the removal: the partition leaks")
	}
	c.proxy.heal()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		short, cancelShort := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := follower.MemberList(short)
		cancelShort()
		if err == nil {
			if len(resp.Members) != 3 || lists(resp.Members, learner) {
				t.Fatalf("a linearizable MemberList after healing: %v; the learner %x was removed", resp.Members, learner)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the follower did not answer a linearizable MemberList within 10 s of healing: %v", err)
		}
	}
}

func lists(members []*pb.Member, id uint64) bool {
	for _, m := range members {
		if m.ID == id {
			return true
		}
	}
	return false
}
