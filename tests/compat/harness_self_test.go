package compat

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cairn.dev/harness"
)

// TestStartFailsFastWithTheServersOutput: a server that exits during start fails the start at
// once, in its own words, rather than after the health wait; a missing binary says so.
func TestStartFailsFastWithTheServersOutput(t *testing.T) {
	fake := harness.FailingServer(t)
	started := time.Now()
	_, err := launch(exec.Command(fake), "http://127.0.0.1:1", 15*time.Second)
	if err == nil || !strings.Contains(err.Error(), "cannot start, for the test") {
		t.Fatalf("the start's error does not quote the server: %v", err)
	}
	if took := time.Since(started); took > 5*time.Second {
		t.Fatalf("a server that exited at once took %v to be reported", took)
	}
	_, err = launch(exec.Command(filepath.Join(t.TempDir(), "missing")), "http://127.0.0.1:1", 15*time.Second)
	if err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("a missing binary is not named as such: %v", err)
	}
}
