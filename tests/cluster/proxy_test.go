package cluster

// The partition proxy. Every member advertises a peer URL that is a port of this proxy, which
// forwards to the member's real peer listener. A partition is a set of blocked member pairs:
// the proxy closes their open connections and black-holes new ones (accepts them, forwards
// nothing) until it heals, then closes those too so both sides reconnect to a clean stream.
//
// The proxy must know which member opened a connection without understanding the protocol
// (it also runs in front of etcd): the connecting socket's port is looked up in
// /proc/net/tcp{,6} to find its inode, and the inode among the members' open files.

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

type link struct {
	from, to int
	conns    []net.Conn
	held     bool // black-holed: nothing is forwarded
}

type proxy struct {
	t         *testing.T
	c         *cluster
	mu        sync.Mutex
	blocked   map[[2]int]bool
	links     map[*link]struct{}
	listeners []net.Listener
	unknown   int // connections whose owner was not found (closed at once)
	forwarded int // connections forwarded
	cut       int // forwarded connections closed by a partition
	holes     int // connections black-holed during a partition
	wg        sync.WaitGroup
}

func newProxy(t *testing.T, c *cluster) *proxy {
	p := &proxy{t: t, c: c, blocked: map[[2]int]bool{}, links: map[*link]struct{}{}}
	for j, m := range c.members {
		p.listen(j, m.proxyPort)
	}
	return p
}

// listen forwards connections to proxyPort to member j (also for a member added later).
func (p *proxy) listen(j, proxyPort int) {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", proxyPort))
	if err != nil {
		p.t.Fatal(err)
	}
	p.mu.Lock()
	p.listeners = append(p.listeners, l)
	p.mu.Unlock()
	p.wg.Add(1)
	go p.serve(j, l)
}

func pair(a, b int) [2]int {
	if a > b {
		a, b = b, a
	}
	return [2]int{a, b}
}

// partition blocks every pair of members that are in different groups.
func (p *proxy) partition(groups ...[]int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for x, g := range groups {
		for _, h := range groups[x+1:] {
			for _, a := range g {
				for _, b := range h {
					p.blocked[pair(a, b)] = true
				}
			}
		}
	}
	for l := range p.links {
		if p.blocked[pair(l.from, l.to)] && !l.held {
			p.cut++
			closeAll(l.conns)
		}
	}
}

// heal unblocks every pair and closes the black-holed connections.
func (p *proxy) heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blocked = map[[2]int]bool{}
	for l := range p.links {
		if l.held {
			closeAll(l.conns)
		}
	}
}

func (p *proxy) close() {
	p.mu.Lock()
	for _, l := range p.listeners {
		l.Close()
	}
	for l := range p.links {
		closeAll(l.conns)
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *proxy) stats() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return fmt.Sprintf("%d peer connections forwarded, %d cut by partitions, %d black-holed, "+
		"%d of unknown origin", p.forwarded, p.cut, p.holes, p.unknown)
}

func closeAll(conns []net.Conn) {
	for _, c := range conns {
		c.Close()
	}
}

func (p *proxy) serve(to int, l net.Listener) {
	defer p.wg.Done()
	for {
		conn, err := l.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.handle(to, conn)
		}()
	}
}

func (p *proxy) handle(to int, conn net.Conn) {
	from := p.owner(conn)
	if from < 0 {
		p.mu.Lock()
		p.unknown++
		p.mu.Unlock()
		conn.Close()
		return
	}
	l := &link{from: from, to: to, conns: []net.Conn{conn}}
	p.mu.Lock()
	if p.blocked[pair(from, to)] {
		l.held = true
		p.holes++
		p.links[l] = struct{}{}
		p.mu.Unlock()
		_, _ = io.Copy(io.Discard, conn)
		p.drop(l)
		return
	}
	p.mu.Unlock()
	upstream, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", p.c.member(to).peerPort), time.Second)
	if err != nil {
		conn.Close()
		return
	}
	p.mu.Lock()
	l.conns = append(l.conns, upstream)
	p.links[l] = struct{}{}
	p.forwarded++
	if p.blocked[pair(from, to)] { // partitioned while dialling
		closeAll(l.conns)
	}
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(upstream, conn)
	go pipe(conn, upstream)
	<-done
	p.drop(l)
	<-done
}

func (p *proxy) drop(l *link) {
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
	closeAll(l.conns)
}

// owner finds which member opened conn: a bounded retry covers a process that is still
// being reaped or started.
func (p *proxy) owner(conn net.Conn) int {
	remote := conn.RemoteAddr().(*net.TCPAddr).Port
	local := conn.LocalAddr().(*net.TCPAddr).Port
	for attempt := 0; attempt < 5; attempt++ {
		if inode := socketInode(remote, local); inode != "" {
			if i, ok := inodeOwner(inode, p.c.pids()); ok {
				return i
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return -1
}

// socketInode is the inode of the socket whose local port is localPort and whose peer's port
// is remotePort, from the kernel's TCP tables.
func socketInode(localPort, remotePort int) string {
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(table)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || fields[0] == "sl" {
				continue
			}
			if hexPort(fields[1]) == localPort && hexPort(fields[2]) == remotePort {
				f.Close()
				return fields[9]
			}
		}
		f.Close()
	}
	return ""
}

// hexPort reads the port of an address as /proc/net/tcp prints it ("0100007F:1F90").
func hexPort(addr string) int {
	colon := strings.LastIndexByte(addr, ':')
	if colon < 0 {
		return -1
	}
	v, err := strconv.ParseUint(addr[colon+1:], 16, 16)
	if err != nil {
		return -1
	}
	return int(v)
}

// inodeOwner finds which of the processes has the socket open.
func inodeOwner(inode string, pids map[int]int) (int, bool) {
	want := "socket:[" + inode + "]"
	for pid, i := range pids {
		dir := fmt.Sprintf("/proc/%d/fd", pid)
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range entries {
			if target, err := os.Readlink(dir + "/" + e.Name()); err == nil && target == want {
				return i, true
			}
		}
	}
	return 0, false
}
