package harness

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRandomFreePortStaysInItsRangeAndAvoids: every port comes from below the ephemeral range,
// none is one the caller asked to avoid, and a port something listens on is never returned.
func TestRandomFreePortStaysInItsRangeAndAvoids(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	busy := l.Addr().(*net.TCPAddr).Port
	avoid := []int{PortsFrom, PortsFrom + 1, busy}
	for i := 0; i < 200; i++ {
		p := RandomFreePort(100, avoid...)
		if p < PortsFrom || p >= PortsTo {
			t.Fatalf("port %d is outside [%d, %d)", p, PortsFrom, PortsTo)
		}
		for _, a := range avoid {
			if p == a {
				t.Fatalf("port %d was to be avoided", p)
			}
		}
	}
	if p := RandomFreePort(0); p != 0 {
		t.Fatalf("no attempts, yet port %d", p)
	}
}

// TestTailKeepsTheEnd: a long log is cut from the front, a short or missing one is whole or "".
func TestTailKeepsTheEnd(t *testing.T) {
	path := filepath.Join(t.TempDir(), "server.log")
	if err := os.WriteFile(path, []byte("start\nmiddle\nthe reason it stopped\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := Tail(path, 22); got != "the reason it stopped\n" {
		t.Fatalf("tail %q", got)
	}
	if got := Tail(path, 1000); !strings.HasPrefix(got, "start\n") {
		t.Fatalf("a short log is not whole: %q", got)
	}
	if got := Tail(filepath.Join(t.TempDir(), "missing"), 10); got != "" {
		t.Fatalf("a missing log gives %q", got)
	}
}

// TestFailingServerExitsSayingWhy: the stand-in fails as the self-tests expect, on stderr.
func TestFailingServerExitsSayingWhy(t *testing.T) {
	cmd := exec.Command(FailingServer(t))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	if exit, ok := err.(*exec.ExitError); !ok || exit.ExitCode() != 3 {
		t.Fatalf("the stand-in did not exit with status 3: %v", err)
	}
	if !strings.Contains(stderr.String(), "cannot start, for the test") {
		t.Fatalf("the stand-in said %q on stderr", stderr.String())
	}
}

// TestCairnBinTakesCairnBinOrNamesTheMissingFile: $CAIRN_BIN wins when it exists; when it does
// not, the test fails with "no such file", which the xtask and CI logs are searched for.
func TestCairnBinTakesCairnBinOrNamesTheMissingFile(t *testing.T) {
	bin := FailingServer(t)
	t.Setenv("CAIRN_BIN", bin)
	if got := CairnBin(t); got != bin {
		t.Fatalf("CairnBin is %s, not $CAIRN_BIN %s", got, bin)
	}
	missing := filepath.Join(t.TempDir(), "missing")
	t.Setenv("CAIRN_BIN", missing)
	rec := &recorder{TB: t}
	func() {
		defer func() { _ = recover() }()
		CairnBin(rec)
	}()
	want := fmt.Sprintf("cairn did not start: no such file %s (CAIRN_BIN)", missing)
	if rec.fatal != want {
		t.Fatalf("CairnBin failed with %q, not %q", rec.fatal, want)
	}
}

// TestTargetDirIsCargos: cargo's own answer, so a CARGO_TARGET_DIR elsewhere is followed.
func TestTargetDirIsCargos(t *testing.T) {
	if _, err := exec.LookPath("cargo"); err != nil {
		t.Skip("cargo is not installed: TargetDir falls back to ../../target")
	}
	elsewhere := filepath.Join(t.TempDir(), "target")
	t.Setenv("CARGO_TARGET_DIR", elsewhere)
	if got := TargetDir(); got != elsewhere {
		t.Fatalf("TargetDir is %s, not $CARGO_TARGET_DIR %s", got, elsewhere)
	}
}

// recorder is a testing.TB whose Fatalf records the message and stops the caller with a
// panic, so a test can check what another function would have failed with.
type recorder struct {
	testing.TB
	fatal string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	panic("Fatalf")
}

// TestStopTermsThenKills: a process that exits on SIGTERM is not waited out; one that ignores
// it is killed once the grace has passed, and Stop returns only after it has been reaped.
func TestStopTermsThenKills(t *testing.T) {
	for _, c := range []struct {
		script     string
		atLeast    time.Duration
		terminated bool
	}{
		{"exec sleep 30", 0, true},
		// A shell builtin loop: no child that would outlive the shell's SIGKILL.
		{"trap '' TERM; echo ready; while :; do :; done", 300 * time.Millisecond, false},
	} {
		cmd := exec.Command("sh", "-c", c.script)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if !c.terminated {
			// The trap must be set before the SIGTERM, or the shell dies of it.
			_, _ = out.Read(make([]byte, 6))
		}
		exited := make(chan struct{})
		var waitErr error
		go func() { waitErr = cmd.Wait(); close(exited) }()
		started := time.Now()
		Stop(cmd.Process, exited, 300*time.Millisecond)
		took := time.Since(started)
		if took < c.atLeast || (c.terminated && took > 5*time.Second) {
			t.Fatalf("%q: Stop took %v", c.script, took)
		}
		want := "signal: killed"
		if c.terminated {
			want = "signal: terminated"
		}
		if waitErr == nil || waitErr.Error() != want {
			t.Fatalf("%q: the process ended with %v, not %s", c.script, waitErr, want)
		}
	}
}

// TestRandomFreePortNeverRepeatsItself: ports are free until their owner binds them, so a
// caller that picks several before starting anything must get different ones. 2,000 draws
// from 12,000 ports repeat with near certainty without the memory (birthday bound).
func TestRandomFreePortNeverRepeatsItself(t *testing.T) {
	seen := map[int]bool{}
	for i := 0; i < 2000; i++ {
		p := RandomFreePort(100)
		if p == 0 {
			t.Fatalf("no free port after %d draws", i)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice (draw %d)", p, i)
		}
		seen[p] = true
	}
}
