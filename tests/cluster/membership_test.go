package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// etcdctlBin is etcd 3.5.17's etcdctl (ETCDCTL overrides it).
func etcdctlBin(t *testing.T) string {
	bin := os.Getenv("ETCDCTL")
	if bin == "" {
		bin = "/opt/etcd-peers/v3.5.17/etcdctl"
	}
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("no etcdctl at %s (set ETCDCTL)", bin)
	}
	return bin
}

// etcdctl runs one command as an operator types it, and returns its output and whether it
// succeeded.
func etcdctl(t *testing.T, endpoint string, args ...string) (string, bool) {
	t.Helper()
	cx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	all := append([]string{"--endpoints=" + endpoint, "--command-timeout=10s"}, args...)
	out, err := exec.CommandContext(cx, etcdctlBin(t), all...).CombinedOutput()
	return string(out), err == nil
}

// TestEtcdctlMemberCommands: `etcdctl member add/list/update/promote/remove` against a running
// member, with etcd's answers and refusals (a learner that never started is not ready to
// promote; one learner at most; a removed member is not found). Holds for etcd 3.4 too.
func TestEtcdctlMemberCommands(t *testing.T) {
	c := startCluster(t, 1, defaultBin(t))
	c.leader(c.client(c.endpoints()...))
	ep := c.members[0].url
	must := func(want string, args ...string) string {
		t.Helper()
		out, ok := etcdctl(t, ep, args...)
		if !ok || !strings.Contains(out, want) {
			t.Fatalf("etcdctl %v: want %q, got (ok=%v) %s", args, want, ok, out)
		}
		return out
	}
	refused := func(want string, args ...string) {
		t.Helper()
		out, ok := etcdctl(t, ep, args...)
		if ok || !strings.Contains(out, want) {
			t.Fatalf("etcdctl %v: want a refusal %q, got (ok=%v) %s", args, want, ok, out)
		}
	}
	peer := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	out := must("added to cluster", "member", "add", "m1", "--peer-urls="+peer, "--learner")
	if !strings.Contains(out, `ETCD_INITIAL_CLUSTER_STATE="existing"`) {
		t.Fatalf("member add does not tell how to start the member: %s", out)
	}
	// etcdctl pads the id to 16 columns with spaces (%16x).
	id := regexp.MustCompile(`Member +([0-9a-f]+) added`).FindStringSubmatch(out)
	if id == nil {
		t.Fatalf("no member id in %s", out)
	}
	list := must(peer, "member", "list")
	if !strings.Contains(list, "unstarted") || !strings.Contains(list, "true") {
		t.Fatalf("the list does not show an unstarted learner: %s", list)
	}
	own := fmt.Sprintf("http://127.0.0.1:%d", c.members[0].proxyPort)
	refused("Peer URLs already exists", "member", "add", "m2", "--peer-urls="+own)
	refused("too many learner members in cluster", "member", "add", "m2",
		fmt.Sprintf("--peer-urls=http://127.0.0.1:%d", freePort(t)), "--learner")
	moved := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	must("updated in cluster", "member", "update", id[1], "--peer-urls="+moved)
	must(moved, "member", "list")
	refused("can only promote a learner member which is in sync with leader", "member", "promote", id[1])
	must("removed from cluster", "member", "remove", id[1])
	refused("member not found", "member", "remove", id[1])
	refused("member not found", "member", "promote", id[1])
	if list := must(c.members[0].url, "member", "list"); strings.Count(strings.TrimSpace(list), "\n") != 0 {
		t.Fatalf("one member should remain: %s", list)
	}
}
