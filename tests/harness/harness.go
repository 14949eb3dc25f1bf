// Package harness holds what the Go suites under tests/ (compat, cluster, kubernetes) share to
// drive a real cairn: finding the binary, picking ports, writing stand-in servers and reading
// log tails. It uses the standard library only, so a module that takes it through a local
// `replace` needs nothing from the network for it.
//
// Paths are relative to the working directory of `go test`, which is the calling test's package
// directory: tests/<module>, two levels below the workspace root, as this module is too.
package harness

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// CairnBin is the binary under test: $CAIRN_BIN, or the workspace's release, then debug build
// in cargo's target directory. It fails the test, naming what is missing, if there is none.
func CairnBin(t testing.TB) string {
	t.Helper()
	if b := os.Getenv("CAIRN_BIN"); b != "" {
		if _, err := os.Stat(b); err != nil {
			t.Fatalf("cairn did not start: no such file %s (CAIRN_BIN)", b)
		}
		return b
	}
	dir := TargetDir()
	for _, p := range []string{filepath.Join(dir, "release", "cairn"), filepath.Join(dir, "debug", "cairn")} {
		if _, err := os.Stat(p); err == nil {
			abs, _ := filepath.Abs(p)
			return abs
		}
	}
	t.Fatalf("cairn binary not found in %s: build it (cargo build --release -p cairn) or set CAIRN_BIN", dir)
	return ""
}

// TargetDir is cargo's target directory as cargo resolves it ($CARGO_TARGET_DIR,
// build.target-dir), or ../../target where cargo cannot be asked.
func TargetDir() string {
	out, err := exec.Command("cargo", "metadata", "--format-version", "1", "--no-deps",
		"--manifest-path", "../../Cargo.toml").Output()
	var meta struct {
		TargetDirectory string `json:"target_directory"`
	}
	if err != nil || json.Unmarshal(out, &meta) != nil || meta.TargetDirectory == "" {
		return "../../target"
	}
	return meta.TargetDirectory
}

// Lowest and highest+1 ports RandomFreePort draws from: below Linux's ephemeral range (32768
// and up), so that no outgoing connection of a server, a proxy or a client can take a port
// between the check and its owner's bind. A fault run makes hundreds of connections.
const (
	PortsFrom = 20000
	PortsTo   = 32000
)

// RandomFreePort draws up to `attempts` ports from [PortsFrom, PortsTo) at random, passing over
// those in avoid and those it returned lately in this process, and returns the first one nothing
// listens on now; 0 if none was free. Each caller fails its test in its own words.
//
// A port is free only until its owner binds it: a cluster picks nine ports before its first
// member starts, so without the memory of what it handed out two members could be given the
// same port (CI saw it: "Address already in use" from the third member).
func RandomFreePort(attempts int, avoid ...int) int {
	handed.mu.Lock()
	defer handed.mu.Unlock()
	for i := 0; i < attempts; i++ {
		p := PortsFrom + rand.Intn(PortsTo-PortsFrom)
		taken := handed.set[p]
		for _, a := range avoid {
			taken = taken || a == p
		}
		if taken {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		l.Close()
		handed.remember(p)
		return p
	}
	return 0
}

// rememberedPorts is how many of the latest ports RandomFreePort will not hand out again: far
// more than one test holds at once, and a third of the range, so that long fault runs still
// find free ports quickly.
const rememberedPorts = (PortsTo - PortsFrom) / 3

// handedPorts is the memory of the ports RandomFreePort returned, oldest first in order.
type handedPorts struct {
	mu    sync.Mutex
	set   map[int]bool
	order []int
}

var handed = handedPorts{set: map[int]bool{}}

func (h *handedPorts) remember(p int) {
	h.set[p] = true
	h.order = append(h.order, p)
	if len(h.order) > rememberedPorts {
		delete(h.set, h.order[0])
		h.order = h.order[1:]
	}
}

// Tail is the last max bytes of the file at path ("" if it cannot be read): the end of a
// server's log, which says why it stopped, without flooding the test output.
func Tail(path string, max int) string {
	b, _ := os.ReadFile(path)
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

// FailingServer writes a stand-in for cairn into a fresh temporary directory: it exits at once
// with status 3, saying "fake cairn: cannot start, for the test" on stderr. The harnesses' own
// tests start it to check that such a server is reported at once, in its own words.
func FailingServer(t testing.TB) string {
	t.Helper()
	fake := filepath.Join(t.TempDir(), "cairn")
	script := "#!/bin/sh\necho 'fake cairn: cannot start, for the test' >&2\nexit 3\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return fake
}

// Stop ends one started process: SIGTERM, then SIGKILL if it has not exited within grace, and
// returns once exited (closed when the process has been reaped) is. It signals through the
// os.Process, which targets that PID and cannot hit a reused one once the process is reaped.
func Stop(p *os.Process, exited <-chan struct{}, grace time.Duration) {
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(grace):
		_ = p.Signal(syscall.SIGKILL)
		<-exited
	}
}
