package cluster

import (
	"strings"
	"testing"
	"time"

	"cairn.dev/harness"
)

// TestAMemberThatCannotStartIsReportedAtOnce: members that exit during start are reported
// within moments, with their own output, so a leader wait stops at once instead of after 20 s.
func TestAMemberThatCannotStartIsReportedAtOnce(t *testing.T) {
	c := startCluster(t, 3, []string{harness.FailingServer(t)})
	deadline := time.Now().Add(5 * time.Second)
	for c.crashReport() == "" && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	report := c.crashReport()
	if !strings.Contains(report, "exited on its own") || !strings.Contains(report, "cannot start, for the test") {
		t.Fatalf("no report quoting the member within 5 s: %q", report)
	}
	// These exits are the test's point, not crashes of a cluster under test. Every member
	// exits: wait for the last report before clearing them, or one that lands after the clear
	// fails the test when the cluster closes (it did, once, in CI).
	for time.Now().Before(deadline) {
		c.mu.Lock()
		all := len(c.crashed) == len(c.members)
		c.mu.Unlock()
		if all {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.mu.Lock()
	c.crashed = nil
	c.mu.Unlock()
}
