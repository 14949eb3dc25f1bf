package cluster

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAMemberThatCannotStartIsReportedAtOnce: members that exit during start are reported
// within moments, with their own output, so a leader wait stops at once instead of after 20 s.
func TestAMemberThatCannotStartIsReportedAtOnce(t *testing.T) {
	fake := filepath.Join(t.TempDir(), "cairn")
	script := "#!/bin/sh\necho 'fake cairn: cannot start, for the test'\nexit 3\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	c := startCluster(t, 3, []string{fake})
	deadline := time.Now().Add(5 * time.Second)
	for c.crashReport() == "" && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	report := c.crashReport()
	if !strings.Contains(report, "exited on its own") || !strings.Contains(report, "cannot start, for the test") {
		t.Fatalf("no report quoting the member within 5 s: %q", report)
	}
	// These exits are the test's point, not crashes of a cluster under test.
	c.mu.Lock()
	c.crashed = nil
	c.mu.Unlock()
}
