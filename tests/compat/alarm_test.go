package compat

// Space and maintenance as operators drive them: past --quota-backend-bytes a NOSPACE alarm is
// raised and writes that add data fail while reads, deletes and compaction work; `etcdctl defrag`
// returns the space, `etcdctl alarm disarm` clears the alarm, and writes work again.

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
)

// etcdctl is etcd 3.5's etcdctl when installed, else Debian's: $ETCDCTL overrides both.
func etcdctl(t *testing.T) string {
	t.Helper()
	for _, p := range []string{os.Getenv("ETCDCTL"), "/opt/etcd-peers/v3.5.17/etcdctl", "/usr/bin/etcdctl"} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Skip("no etcdctl: set ETCDCTL")
	return ""
}

func runEtcdctl(t *testing.T, s *server, args ...string) string {
	t.Helper()
	cmd := exec.Command(etcdctl(t), append([]string{"--endpoints", s.url, "--command-timeout", "20s"}, args...)...)
	cmd.Env = append(os.Environ(), "ETCDCTL_API=3")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("etcdctl %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func TestQuotaAlarmDefragAndDisarm(t *testing.T) {
	s := startServer(t, "", "--quota-backend-bytes", fmt.Sprint(4<<20))
	c := s.client()
	value := strings.Repeat("x", 64<<10)
	written := 0
	for ; ; written++ {
		if written > 1000 {
			t.Fatal("the quota never refused a write")
		}
		_, err := c.Put(ctx(t), fmt.Sprintf("k%04d", written), value)
		if err != nil {
			wantErr(t, err, rpctypes.ErrGRPCNoSpace, codes.ResourceExhausted)
			break
		}
	}
	st, err := c.Status(ctx(t), s.url)
	if err != nil {
		t.Fatal(err)
	}
	member := st.Header.MemberId
	want := fmt.Sprintf("memberID:%d alarm:NOSPACE ", member)
	if len(st.Errors) != 1 || st.Errors[0] != want {
		t.Fatalf("status errors %q, want [%q]", st.Errors, want)
	}
	alarms, err := c.AlarmList(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(alarms.Alarms) != 1 || alarms.Alarms[0].MemberID != member ||
		alarms.Alarms[0].Alarm != etcdserverpb.AlarmType_NOSPACE {
		t.Fatalf("alarms %v, want NOSPACE on %x", alarms.Alarms, member)
	}
	if out := runEtcdctl(t, s, "alarm", "list"); !strings.Contains(out, fmt.Sprintf("memberID:%d alarm:NOSPACE", member)) {
		t.Fatalf("etcdctl alarm list: %q", out)
	}
	// Even a small write is refused while the alarm is raised; reads, deletes and compaction work.
	_, err = c.Put(ctx(t), "small", "v")
	wantErr(t, err, rpctypes.ErrGRPCNoSpace, codes.ResourceExhausted)
	if _, err := c.Grant(ctx(t), 60); err == nil {
		t.Fatal("a lease grant passed the NOSPACE alarm")
	}
	if g, err := c.Get(ctx(t), "k0000"); err != nil || len(g.Kvs) != 1 {
		t.Fatalf("read under the alarm: %v %v", g, err)
	}
	d, err := c.Delete(ctx(t), "k", clientv3.WithPrefix())
	if err != nil || d.Deleted != int64(written) {
		t.Fatalf("delete under the alarm: %v %v (want %d)", d, err, written)
	}
	if _, err := c.Compact(ctx(t), d.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	if out := runEtcdctl(t, s, "defrag"); !strings.Contains(out, "Finished defragmenting etcd member") {
		t.Fatalf("etcdctl defrag: %q", out)
	}
	after, err := c.Status(ctx(t), s.url)
	if err != nil {
		t.Fatal(err)
	}
	if after.DbSize >= st.DbSize/2 {
		t.Fatalf("defragmentation left the database at %d bytes (from %d)", after.DbSize, st.DbSize)
	}
	if out := runEtcdctl(t, s, "alarm", "disarm"); !strings.Contains(out, "alarm:NOSPACE") {
		t.Fatalf("etcdctl alarm disarm: %q", out)
	}
	alarms, err = c.AlarmList(ctx(t))
	if err != nil || len(alarms.Alarms) != 0 {
		t.Fatalf("alarms after disarm: %v %v", alarms, err)
	}
	if _, err := c.Put(ctx(t), "small", "v"); err != nil {
		t.Fatalf("a write after disarming: %v", err)
	}
	// The hash of the whole database answers, and settles once writes are committed (etcd's
	// and cairn's backends both commit in batches, so the first may come before the last write).
	stub := etcdserverpb.NewMaintenanceClient(c.ActiveConnection())
	var last uint32
	for i := 0; ; i++ {
		h, err := stub.Hash(ctx(t), &etcdserverpb.HashRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if h.Hash == last && h.Hash != 0 {
			break
		}
		if i == 20 {
			t.Fatalf("the hash never settled: %d then %d", last, h.Hash)
		}
		last = h.Hash
		time.Sleep(200 * time.Millisecond)
	}
}
