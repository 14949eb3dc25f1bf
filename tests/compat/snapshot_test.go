package compat

// Backup with etcd's own tools: `etcdctl snapshot save` (3.5, and Debian's 3.4) and the Go
// client's Maintenance.Snapshot download cairn's snapshot; `cairn snapshot status` reads it and
// `cairn snapshot restore` builds a member that serves every key back.

import (
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"cairn.dev/harness"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// etcdctls are the etcdctl binaries present: $ETCDCTL, etcd 3.5's, Debian's 3.4.
func etcdctls() []string {
	var found []string
	for _, p := range []string{os.Getenv("ETCDCTL"), "/opt/etcd-peers/v3.5.17/etcdctl", "/usr/bin/etcdctl"} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			found = append(found, p)
		}
	}
	return found
}

func cairnCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command(harness.CairnBin(t), args...).CombinedOutput()
	return string(out), err
}

// snapshotStatus is what `cairn snapshot status -w json` prints, in etcdutl's field names.
type snapshotStatus struct {
	Hash      uint32 `json:"hash"`
	Revision  int64  `json:"revision"`
	TotalKey  int    `json:"totalKey"`
	TotalSize int64  `json:"totalSize"`
}

func TestSnapshotSaveStatusRestore(t *testing.T) {
	if etcdBin() != "" {
		t.Skip("cairn's snapshot file is cairn's own: etcd's is a bbolt file")
	}
	tools := etcdctls()
	if len(tools) == 0 {
		t.Fatal("no etcdctl found (set ETCDCTL)")
	}
	s := startServer(t, "")
	c := s.client()
	lease, err := c.Grant(ctx(t), 3600)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 300; i++ {
		key := "k/" + strings.Repeat("x", i%7) + string(rune('a'+i%26))
		if _, err := c.Put(ctx(t), key, strings.Repeat("v", i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Put(ctx(t), "leased", "l", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Delete(ctx(t), "k/a"); err != nil {
		t.Fatal(err)
	}
	before, err := c.Get(ctx(t), "", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Compact(ctx(t), before.Header.Revision-10); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	var saved string
	for i, tool := range tools {
		path := filepath.Join(dir, "snap"+string(rune('0'+i))+".db")
		out, err := exec.Command(tool, "--endpoints", s.url, "snapshot", "save", path).CombinedOutput()
		if err != nil {
			t.Fatalf("%s snapshot save: %v\n%s", tool, err, out)
		}
		st, err := cairnCmd(t, "snapshot", "status", path, "-w", "json")
		if err != nil {
			t.Fatalf("cairn snapshot status on %s's file: %v\n%s", tool, err, st)
		}
		var status snapshotStatus
		if err := json.Unmarshal([]byte(st), &status); err != nil {
			t.Fatalf("status output %q: %v", st, err)
		}
		if status.Revision != before.Header.Revision || status.TotalKey == 0 {
			t.Fatalf("%s's snapshot: status %+v, revision %d expected", tool, status, before.Header.Revision)
		}
		saved = path
	}

	// The Go client's download is the same file format.
	rd, err := c.Snapshot(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(rd)
	rd.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(body)%512 != 32 {
		t.Fatalf("the client's download is %d bytes: not sectors plus a SHA-256", len(body))
	}
	clientFile := filepath.Join(dir, "client.db")
	if err := os.WriteFile(clientFile, body, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := cairnCmd(t, "snapshot", "status", clientFile); err != nil {
		t.Fatalf("status of the client's download: %v\n%s", err, out)
	}

	// Total loss, then restore from etcdctl's file.
	s.stop()
	restored := filepath.Join(t.TempDir(), "restored")
	if out, err := cairnCmd(t, "snapshot", "restore", saved, "--data-dir", restored); err != nil {
		t.Fatalf("restore: %v\n%s", err, out)
	}
	r := startServer(t, restored)
	after, err := r.client().Get(ctx(t), "", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if after.Header.Revision != before.Header.Revision || len(after.Kvs) != len(before.Kvs) {
		t.Fatalf("restored: revision %d with %d keys, expected %d with %d",
			after.Header.Revision, len(after.Kvs), before.Header.Revision, len(before.Kvs))
	}
	for i, kv := range after.Kvs {
		want := before.Kvs[i]
		if string(kv.Key) != string(want.Key) || string(kv.Value) != string(want.Value) ||
			kv.CreateRevision != want.CreateRevision || kv.ModRevision != want.ModRevision ||
			kv.Version != want.Version || kv.Lease != want.Lease {
			t.Fatalf("restored %v, expected %v", kv, want)
		}
	}
	ttl, err := r.client().TimeToLive(ctx(t), lease.ID)
	if err != nil || ttl.GrantedTTL != 3600 {
		t.Fatalf("the lease after restore: %+v, %v", ttl, err)
	}

	// A truncated file is refused, with no directory left behind.
	data, err := os.ReadFile(saved)
	if err != nil {
		t.Fatal(err)
	}
	cut := filepath.Join(dir, "cut.db")
	if err := os.WriteFile(cut, data[:len(data)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "never")
	out, err := cairnCmd(t, "snapshot", "restore", cut, "--data-dir", target)
	if err == nil || !strings.Contains(out, "truncated") {
		t.Fatalf("a truncated file: %v\n%s", err, out)
	}
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Fatalf("a refused restore left %s behind", target)
	}
}
