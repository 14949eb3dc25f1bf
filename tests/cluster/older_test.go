package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestMemberBackWithAnOlderLog: a follower's data directory is put back to an older copy (a
// restore from an old backup, a disk image rolled back) while the others moved on. The leader
// knows the follower acknowledged entries its log no longer has, so the follower must stop with
// a clear error rather than serve or commit what it holds (etcd panics: "tocommit(..) is out of
// range"), and the other members must keep every acknowledged write and converge.
func TestMemberBackWithAnOlderLog(t *testing.T) {
	c := startCluster(t, 3, defaultBin(t))
	admin := c.client(c.endpoints()...)
	lead := c.leader(admin)
	f := c.others(lead)[0]
	put := func(from, to int) {
		cl := c.client(c.members[lead].url)
		for i := from; i < to; i++ {
			cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := cl.Put(cx, fmt.Sprintf("older-%05d", i), fmt.Sprint(i))
			cancel()
			if err != nil {
				t.Fatalf("put %d: %v", i, err)
			}
		}
	}
	put(0, 200)
	c.kill(f)
	old := t.TempDir()
	if out, err := exec.Command("cp", "-a", c.members[f].dir+"/.", old).CombinedOutput(); err != nil {
		t.Fatalf("copy: %v %s", err, out)
	}
	c.heal()
	put(200, 1500)
	c.kill(f)
	if err := os.RemoveAll(c.members[f].dir); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", old+"/.", c.members[f].dir).CombinedOutput(); err != nil {
		t.Fatalf("restore: %v %s", err, out)
	}
	c.start(f)
	if !c.awaitExit(f, 15*time.Second) {
		t.Fatalf("m%d serves on with a log that lost acknowledged entries", f)
	}
	logged, _ := os.ReadFile(c.root + "/" + c.members[f].name + ".log")
	want := "lost entries"
	if etcdBin() != "" {
		want = "is out of range"
	}
	if !strings.Contains(string(logged), want) {
		t.Fatalf("m%d stopped without saying why (want %q):\n%s", f, want, logged)
	}
	var survivors []*member
	for i, m := range c.members {
		if i != f {
			survivors = append(survivors, m)
		}
	}
	c.convergenceOf(admin, survivors)
	for _, m := range survivors {
		cl := c.client(m.url)
		cx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := cl.Get(cx, "older-", clientv3.WithPrefix())
		cancel()
		if err != nil || len(resp.Kvs) != 1500 {
			t.Fatalf("%s: %v, %d of 1500 acknowledged writes", m.name, err, len(resp.Kvs))
		}
	}
}
