package compat

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestStartFailsFastWithTheServersOutput: a server that exits during start fails the start at
// once, in its own words, rather than after the health wait; a missing binary says so.
func TestStartFailsFastWithTheServersOutput(t *testing.T) {
	fake := filepath.Join(t.TempDir(), "cairn")
	script := "#!/bin/sh\necho 'fake cairn: cannot start, for the test' >&2\nexit 3\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
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
