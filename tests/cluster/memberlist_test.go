package cluster

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

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
