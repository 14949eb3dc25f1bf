package cluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// refused runs the server with args and requires it to exit with an error within 15 s, saying
// `want` (cairn's message; with etcd only the exit is checked, its wording differs).
func refused(t *testing.T, args []string, want string) {
	t.Helper()
	bin := defaultBin(t)
	cmd := exec.Command(bin[0], append(append([]string{}, bin[1:]...), args...)...)
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("still running 15 s after %v: bad flags must stop it", args)
	}
	if err == nil {
		t.Fatalf("exited 0 with %v; output:\n%s", args, out)
	}
	if etcdBin() == "" && !strings.Contains(string(out), want) {
		t.Fatalf("the error does not say %q; output:\n%s", want, out)
	}
}

// TestBadClusterFlagsAreRefused: a member refuses, with etcd's wording where etcd has one, an
// --initial-cluster without itself, an advertised peer URL that is not its entry's, two members
// with one URL, and (cairn only: etcd ignores the initial flags once it has data) a data
// directory of another cluster.
func TestBadClusterFlagsAreRefused(t *testing.T) {
	p := func() string { return fmt.Sprintf("http://127.0.0.1:%d", freePort(t)) }
	a, b, c := p(), p(), p()
	client := func() []string {
		u := p()
		return []string{"--listen-client-urls", u, "--advertise-client-urls", u}
	}
	base := func(name, dir, advertise, initial, token string) []string {
		return append(client(), "--name", name, "--data-dir", dir,
			"--listen-peer-urls", advertise, "--initial-advertise-peer-urls", advertise,
			"--initial-cluster", initial, "--initial-cluster-token", token)
	}
	three := "m0=" + a + ",m1=" + b + ",m2=" + c
	t.Run("not listed", func(t *testing.T) {
		refused(t, base("m9", t.TempDir(), a, three, "t"), "couldn't find local name \"m9\"")
	})
	t.Run("advertised URL differs", func(t *testing.T) {
		refused(t, base("m0", t.TempDir(), b, three, "t"), "they must be the same")
	})
	t.Run("one URL for two members", func(t *testing.T) {
		refused(t, base("m0", t.TempDir(), a, "m0="+a+",m1="+a, "t"), "appears for more than one member")
	})
	t.Run("data directory of another cluster", func(t *testing.T) {
		if etcdBin() != "" {
			t.Skip("etcd reads its cluster from its data once it has some, and ignores the flags")
		}
		dir := t.TempDir()
		bin := defaultBin(t)
		first := exec.Command(bin[0], append(append([]string{}, bin[1:]...), base("m0", dir, a, three, "one")...)...)
		if err := first.Start(); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, err := os.Stat(filepath.Join(dir, "member")); err == nil {
				break
			}
			if time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(300 * time.Millisecond) // the identity is written as the member opens
		_ = first.Process.Kill()
		_ = first.Wait()
		// Another token makes this another member (ids hash the token); other peers keep the
		// member but make another cluster. Both are named.
		refused(t, base("m0", dir, a, three, "two"), "belongs to member")
		refused(t, base("m0", dir, a, "m0="+a+",m1="+b, "one"), "belongs to cluster")
	})
}
