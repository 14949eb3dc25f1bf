package cluster

// Peer traffic over mutual TLS, started as an operator starts etcd: https:// peer URLs with
// --peer-cert-file, --peer-key-file, --peer-trusted-ca-file and --peer-client-cert-auth, client
// URLs plain http. The test makes its own PKI with crypto/x509 (a cluster CA, a certificate per
// member usable for server and client auth, and an unrelated CA of the same name with a member
// certificate of its own), and starts the processes itself: the shared harness routes peer
// traffic through a plain TCP proxy on http:// URLs, which is not what is tested here.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"cairn.dev/harness"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string // its certificate, PEM
}

func newSerial(t *testing.T) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func writePEM(t *testing.T, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// newTestCA makes a self-signed ECDSA P-256 CA named "cairn peer CA" and writes its
// certificate to dir/file. Two of them share the name but not the key: a member certificate of
// one must not pass for the other's, whatever the issuer name says.
func newTestCA(t *testing.T, dir, file string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          newSerial(t),
		Subject:               pkix.Name{CommonName: "cairn peer CA", Organization: []string{"cairn tests"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &testCA{cert: cert, key: key, file: filepath.Join(dir, file)}
	writePEM(t, ca.file, "CERTIFICATE", der)
	return ca
}

// issue makes a member certificate for name, valid for 127.0.0.1 and localhost and for both
// server and client auth (a peer serves its listener and dials the others with the same
// certificate, as etcd's docs recommend), and writes it and its key (PKCS#8) to dir.
func (ca *testCA) issue(t *testing.T, dir, name string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: newSerial(t),
		Subject:      pkix.Name{CommonName: name, Organization: []string{"cairn tests"}},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "PRIVATE KEY", keyDER)
	return certFile, keyFile
}

// tlsNode is one server process whose peers speak mutual TLS.
type tlsNode struct {
	name, dir, log     string
	clientURL, peerURL string // http://, https://
	cert, key, ca      string // --peer-cert-file, --peer-key-file, --peer-trusted-ca-file
	initial, state     string // --initial-cluster, --initial-cluster-state
	cmd                *exec.Cmd
	exited             chan struct{} // closed once the process has been reaped
	waitErr            error         // how it exited, once exited is closed
	expectExit         bool          // set before the test kills it
}

// tlsCluster holds the processes of one test; every one of them is killed (by PID) at cleanup.
type tlsCluster struct {
	t       *testing.T
	bin     []string
	root    string // data directories and logs; kept when the test fails
	mu      sync.Mutex
	nodes   []*tlsNode
	clients []*clientv3.Client
}

func newTLSCluster(t *testing.T) *tlsCluster {
	root, err := os.MkdirTemp("", "cairn-peer-tls-")
	if err != nil {
		t.Fatal(err)
	}
	c := &tlsCluster{t: t, bin: defaultBin(t), root: root}
	t.Cleanup(c.close)
	return c
}

// node makes (without starting) a member presenting certFile/keyFile and trusting caFile.
func (c *tlsCluster) node(name, certFile, keyFile, caFile string) *tlsNode {
	n := &tlsNode{
		name: name, dir: filepath.Join(c.root, name), log: filepath.Join(c.root, name+".log"),
		clientURL: fmt.Sprintf("http://127.0.0.1:%d", freePort(c.t)),
		peerURL:   fmt.Sprintf("https://127.0.0.1:%d", freePort(c.t)),
		cert:      certFile, key: keyFile, ca: caFile,
	}
	c.mu.Lock()
	c.nodes = append(c.nodes, n)
	c.mu.Unlock()
	return n
}

// initialCluster is the --initial-cluster of the given members.
func initialCluster(nodes ...*tlsNode) string {
	var parts []string
	for _, n := range nodes {
		parts = append(parts, n.name+"="+n.peerURL)
	}
	return strings.Join(parts, ",")
}

// start runs n with etcd's peer TLS flags (again with the same flags and data after a kill).
func (c *tlsCluster) start(n *tlsNode) {
	c.t.Helper()
	args := append(append([]string{}, c.bin[1:]...),
		"--name", n.name, "--data-dir", n.dir,
		"--listen-client-urls", n.clientURL, "--advertise-client-urls", n.clientURL,
		"--listen-peer-urls", n.peerURL, "--initial-advertise-peer-urls", n.peerURL,
		"--initial-cluster", n.initial, "--initial-cluster-state", n.state,
		"--initial-cluster-token", "peer-tls",
		"--heartbeat-interval", "50", "--election-timeout", "500",
		"--peer-cert-file", n.cert, "--peer-key-file", n.key,
		"--peer-trusted-ca-file", n.ca, "--peer-client-cert-auth")
	cmd := exec.Command(c.bin[0], args...)
	log, err := os.OpenFile(n.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	fmt.Fprintf(log, "---- %s start %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(args, " "))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		c.t.Fatal(err)
	}
	exited := make(chan struct{})
	c.mu.Lock()
	n.cmd, n.exited, n.waitErr, n.expectExit = cmd, exited, nil, false
	c.mu.Unlock()
	go func() {
		err := cmd.Wait()
		log.Close()
		c.mu.Lock()
		n.waitErr = err
		c.mu.Unlock()
		close(exited)
	}()
}

// kill sends SIGKILL to n's process (by PID) and waits, at most 15 s, until it is reaped.
func (c *tlsCluster) kill(n *tlsNode) {
	c.mu.Lock()
	cmd, exited := n.cmd, n.exited
	n.cmd, n.expectExit = nil, true
	c.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		c.t.Errorf("%s (pid %d) was not reaped within 15 s of SIGKILL", n.name, cmd.Process.Pid)
	}
}

// hasExited reports whether n's last process has ended, and how.
func (c *tlsCluster) hasExited(n *tlsNode) (bool, error) {
	c.mu.Lock()
	exited := n.exited
	c.mu.Unlock()
	if exited == nil {
		return false, nil
	}
	select {
	case <-exited:
		c.mu.Lock()
		defer c.mu.Unlock()
		return true, n.waitErr
	default:
		return false, nil
	}
}

// mustRun fails the test at once, quoting its log, if one of nodes exited without being killed.
func (c *tlsCluster) mustRun(nodes ...*tlsNode) {
	c.t.Helper()
	for _, n := range nodes {
		c.mu.Lock()
		expected := n.expectExit
		c.mu.Unlock()
		if gone, err := c.hasExited(n); gone && !expected {
			c.t.Fatalf("%s exited on its own (%v); its log ends:\n%s", n.name, err, harness.Tail(n.log, 3000))
		}
	}
}

// fatalf fails the test with the end of every log.
func (c *tlsCluster) fatalf(format string, args ...any) {
	c.t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, format, args...)
	c.mu.Lock()
	nodes := append([]*tlsNode(nil), c.nodes...)
	c.mu.Unlock()
	for _, n := range nodes {
		fmt.Fprintf(&b, "\n---- %s's log ends:\n%s", n.name, harness.Tail(n.log, 1500))
	}
	c.t.Fatal(b.String())
}

// close kills every process the test started, by PID, and removes the data and logs unless
// the test failed.
func (c *tlsCluster) close() {
	c.mu.Lock()
	nodes := append([]*tlsNode(nil), c.nodes...)
	clients := c.clients
	c.mu.Unlock()
	for _, n := range nodes {
		c.kill(n)
	}
	for _, cl := range clients {
		cl.Close()
	}
	if c.t.Failed() {
		c.t.Logf("data and logs kept in %s", c.root)
		return
	}
	os.RemoveAll(c.root)
}

// client is an etcd client of the given members' (plain http) client URLs, closed at cleanup.
func (c *tlsCluster) client(nodes ...*tlsNode) *clientv3.Client {
	var eps []string
	for _, n := range nodes {
		eps = append(eps, n.clientURL)
	}
	cl, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		c.t.Fatal(err)
	}
	c.mu.Lock()
	c.clients = append(c.clients, cl)
	c.mu.Unlock()
	return cl
}

// leader waits (at most 20 s) until every one of nodes names the same leader, one of them and
// not `not` (0: any), and returns it and its id.
func (c *tlsCluster) leader(admin *clientv3.Client, not uint64, nodes ...*tlsNode) (*tlsNode, uint64) {
	c.t.Helper()
	last := "no answer yet"
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		c.mustRun(nodes...)
		ids, lead, agreed := map[uint64]*tlsNode{}, uint64(0), true
		for _, n := range nodes {
			cx, cancel := context.WithTimeout(context.Background(), time.Second)
			s, err := admin.Status(cx, n.clientURL)
			cancel()
			if err != nil {
				agreed, last = false, fmt.Sprintf("%s: %v", n.name, err)
				break
			}
			if s.Leader == 0 || (lead != 0 && s.Leader != lead) {
				agreed, last = false, fmt.Sprintf("%s names leader %x, others %x", n.name, s.Leader, lead)
				break
			}
			lead, ids[s.Header.MemberId] = s.Leader, n
		}
		if l, ok := ids[lead]; agreed && ok && lead != not {
			return l, lead
		}
	}
	c.fatalf("no leader that %d members agree on within 20 s (%s)", len(nodes), last)
	return nil, 0
}

// put writes key=value through cl, trying for at most 15 s: right after a leader was lost the
// first attempts may reach a member that has not noticed yet (etcd answers the same).
func (c *tlsCluster) put(cl *clientv3.Client, key, value string) {
	c.t.Helper()
	var err error
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		cx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		_, err = cl.Put(cx, key, value)
		cancel()
		if err == nil {
			return
		}
	}
	c.fatalf("put %s within 15 s: %v", key, err)
}

// readsEverywhere requires a linearizable read of key on each of nodes (a client pinned to
// it) to return value.
func (c *tlsCluster) readsEverywhere(pinned map[*tlsNode]*clientv3.Client, key, value string, nodes ...*tlsNode) {
	c.t.Helper()
	for _, n := range nodes {
		cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := pinned[n].Get(cx, key)
		cancel()
		if err != nil {
			c.fatalf("linearizable read of %s on %s: %v", key, n.name, err)
		}
		if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != value {
			c.fatalf("linearizable read of %s on %s: %v, want %q", key, n.name, resp.Kvs, value)
		}
	}
}

// startTLSCluster starts three members with certificates of ca, and returns them with a client
// of all three and a client pinned to each.
func startTLSCluster(t *testing.T, pki string, ca *testCA) (*tlsCluster, []*tlsNode, *clientv3.Client, map[*tlsNode]*clientv3.Client) {
	c := newTLSCluster(t)
	var nodes []*tlsNode
	for i := 0; i < 3; i++ {
		name := fmt.Sprintf("m%d", i)
		cert, key := ca.issue(t, pki, name)
		nodes = append(nodes, c.node(name, cert, key, ca.file))
	}
	initial := initialCluster(nodes...)
	for _, n := range nodes {
		n.initial, n.state = initial, "new"
		c.start(n)
	}
	pinned := map[*tlsNode]*clientv3.Client{}
	for _, n := range nodes {
		pinned[n] = c.client(n)
	}
	return c, nodes, c.client(nodes...), pinned
}

// TestPeerTLSClusterElectsReplicatesAndRecovers: three members whose peers authenticate each
// other with certificates of one CA elect a leader; a write through one member is read
// linearizably on every member; MemberList shows the https:// peer URLs. The leader is then
// killed (SIGKILL): the other two elect a new leader over TLS and take writes; the old leader,
// restarted with the same data directory and flags, catches up (its serializable read sees a
// key written while it was down) and serves linearizable reads again.
func TestPeerTLSClusterElectsReplicatesAndRecovers(t *testing.T) {
	pki := t.TempDir()
	ca := newTestCA(t, pki, "ca.crt")
	c, nodes, all, pinned := startTLSCluster(t, pki, ca)

	began := time.Now()
	lead, leadID := c.leader(all, 0, nodes...)
	t.Logf("%s leads (elected %s after start)", lead.name, time.Since(began).Round(time.Millisecond))

	// A write through a follower, read linearizably on every member.
	var follower *tlsNode
	for _, n := range nodes {
		if n != lead {
			follower = n
			break
		}
	}
	c.put(pinned[follower], "tls/first", "through "+follower.name)
	c.readsEverywhere(pinned, "tls/first", "through "+follower.name, nodes...)

	// Every member lists the three with their https:// peer URLs and http:// client URLs.
	want := map[string]string{}
	for _, n := range nodes {
		want[n.name] = n.peerURL + " " + n.clientURL
	}
	for _, n := range nodes {
		var got map[string]string
		var err error
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			cx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			var list *clientv3.MemberListResponse
			list, err = pinned[n].MemberList(cx)
			cancel()
			if err != nil {
				continue
			}
			got = map[string]string{}
			for _, m := range list.Members {
				got[m.Name] = strings.Join(m.PeerURLs, ",") + " " + strings.Join(m.ClientURLs, ",")
			}
			if fmt.Sprint(got) == fmt.Sprint(want) {
				break
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			c.fatalf("%s lists members %v (err %v), want %v", n.name, got, err, want)
		}
	}

	// Kill -9 the leader: the two others elect another over TLS and take writes.
	var rest []*tlsNode
	for _, n := range nodes {
		if n != lead {
			rest = append(rest, n)
		}
	}
	killed := time.Now()
	c.kill(lead)
	next, _ := c.leader(all, leadID, rest...)
	t.Logf("killed %s; %s leads %s later", lead.name, next.name, time.Since(killed).Round(time.Millisecond))
	c.put(c.client(rest...), "tls/while-down", "written without "+lead.name)
	c.readsEverywhere(pinned, "tls/while-down", "written without "+lead.name, rest...)

	// Restarted with the same data and flags, the old leader catches up.
	restarted := time.Now()
	c.start(lead)
	var last string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		c.mustRun(nodes...)
		cx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := pinned[lead].Get(cx, "tls/while-down", clientv3.WithSerializable())
		cancel()
		if err == nil && len(resp.Kvs) == 1 && string(resp.Kvs[0].Value) == "written without "+lead.name {
			break
		}
		last = fmt.Sprintf("%v %v", resp, err)
		if time.Now().After(deadline) {
			c.fatalf("restarted %s did not catch up within 20 s (last serializable read: %s)", lead.name, last)
		}
	}
	t.Logf("restarted %s caught up %s after its start", lead.name, time.Since(restarted).Round(time.Millisecond))
	c.leader(all, 0, nodes...)
	c.put(pinned[lead], "tls/after", "through the restarted "+lead.name)
	c.readsEverywhere(pinned, "tls/after", "through the restarted "+lead.name, nodes...)
	c.mustRun(nodes...)
}

// peerHandshake opens a TLS connection to a member's peer listener (https://127.0.0.1:P) as a
// peer would, presenting certs, and reports whether the member accepted it: nil if it kept the
// connection open for a second after the handshake, else how it refused. Under TLS 1.3 a
// refused client certificate shows on the first read, not in the handshake.
func peerHandshake(peerURL string, roots *x509.CertPool, certs []tls.Certificate) error {
	addr := strings.TrimPrefix(peerURL, "https://")
	d := &net.Dialer{Timeout: 2 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{RootCAs: roots, Certificates: certs})
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(time.Second))
	_, err = conn.Read(make([]byte, 1))
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		return nil
	}
	return err
}

// standIn listens at peerURL with certFile/keyFile for at most `window`, and returns how the
// TLS handshakes of the connections that came in ended (nil: completed), stopping after five.
func standIn(t *testing.T, peerURL, certFile, keyFile string, window time.Duration) []error {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", strings.TrimPrefix(peerURL, "https://"))
	if err != nil {
		t.Fatalf("listening at %s: %v", peerURL, err)
	}
	defer l.Close()
	cfg := &tls.Config{Certificates: []tls.Certificate{pair}, ClientAuth: tls.RequestClientCert}
	var outcomes []error
	for deadline := time.Now().Add(window); len(outcomes) < 5 && time.Now().Before(deadline); {
		_ = l.(*net.TCPListener).SetDeadline(deadline)
		conn, err := l.Accept()
		if err != nil {
			break
		}
		_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
		s := tls.Server(conn, cfg)
		outcomes = append(outcomes, s.Handshake())
		s.Close()
	}
	return outcomes
}

// handshakeRefusals are the words a member logs when it refuses a peer's TLS handshake: etcd's
// "rejected connection" (its TLS handshake-failure log) and cairn's "closed a peer
// connection" (the inbound peer transport) followed by rustls' error.
var handshakeRefusals = []string{"rejected connection", "closed a peer connection"}

// TestPeerTLSRefusesAMemberCertifiedByAnotherCA: each member's peer listener accepts a TLS
// client with a certificate of the cluster's CA and refuses one with a certificate of another CA
// (of the same name) or none. A fourth member, added through the Cluster API with its https://
// peer URL and started with --initial-cluster-state existing, presents a certificate of the
// other CA (it trusts the cluster's CA itself, so it is the members that refuse it). It never
// becomes part of the working cluster: it never publishes its name, never serves a key written
// after it was added, and the three original members keep taking writes (3 of the 4 voters are
// a quorum) and log the refused handshakes. The members dialing its URL refuse the certificate
// served there too. It is then removed with MemberRemove and stopped, and the three serve on.
func TestPeerTLSRefusesAMemberCertifiedByAnotherCA(t *testing.T) {
	pki := t.TempDir()
	ca := newTestCA(t, pki, "ca.crt")
	other := newTestCA(t, pki, "other-ca.crt")
	c, nodes, all, pinned := startTLSCluster(t, pki, ca)
	c.leader(all, 0, nodes...)
	c.put(all, "tls/before", "before the impostor")

	// Each member's peer listener serves a certificate of the cluster's CA for 127.0.0.1 and
	// takes a peer presenting another certificate of that CA, but refuses one whose
	// certificate the other CA signed, and one without a certificate.
	cert, key := other.issue(t, pki, "m3")
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	load := func(certFile, keyFile string) []tls.Certificate {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		return []tls.Certificate{pair}
	}
	ours, theirs := load(ca.issue(t, pki, "probe")), load(cert, key)
	for _, n := range nodes {
		if err := peerHandshake(n.peerURL, roots, ours); err != nil {
			c.fatalf("%s refused a peer certified by the cluster's CA: %v", n.name, err)
		}
		err := peerHandshake(n.peerURL, roots, theirs)
		if err == nil {
			c.fatalf("%s accepted a peer certified by another CA", n.name)
		}
		t.Logf("%s refuses the other CA's certificate: %v", n.name, err)
		if err := peerHandshake(n.peerURL, roots, nil); err == nil {
			c.fatalf("%s accepted a peer without a certificate (--peer-client-cert-auth)", n.name)
		} else {
			t.Logf("%s refuses a peer without a certificate: %v", n.name, err)
		}
	}

	// Where each member's log is before the impostor starts: only what follows counts below.
	logFrom := map[*tlsNode]int{}
	for _, n := range nodes {
		if st, err := os.Stat(n.log); err == nil {
			logFrom[n] = int(st.Size())
		}
	}
	rogue := c.node("m3", cert, key, ca.file)
	// etcd refuses to add a voter ("unhealthy cluster") until its leader has been connected to
	// every member for 5 s (its HealthInterval); cairn asks only that it heard from each within
	// an election timeout. Retry while refused so.
	added, err := memberAddOnceHealthy(all, rogue.peerURL, false, 15*time.Second)
	if err != nil {
		c.fatalf("member add %s: %v", rogue.peerURL, err)
	}
	rogueID := added.Member.ID
	rogue.initial, rogue.state = initialCluster(append(append([]*tlsNode{}, nodes...), rogue)...), "existing"
	c.start(rogue)
	t.Logf("added %s as %x and started it with the other CA's certificate", rogue.name, rogueID)

	// For 8 s: the originals take a write every 200 ms, linearizably read on all three; the
	// impostor never sees one, and never shows up as started in the member list.
	rogueClient := c.client(rogue)
	writes, rogueAnswered := 0, 0
	var rogueExit error
	rogueGone := false
	for deadline := time.Now().Add(8 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		c.mustRun(nodes...)
		k, v := fmt.Sprintf("tls/with-impostor/%03d", writes), "without "+rogue.name
		cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := all.Put(cx, k, v)
		cancel()
		if err != nil {
			c.fatalf("the original members stopped taking writes after %s was added: %v", rogue.name, err)
		}
		writes++
		c.readsEverywhere(pinned, k, v, nodes...)
		if !rogueGone {
			if rogueGone, rogueExit = c.hasExited(rogue); !rogueGone {
				cx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
				resp, err := rogueClient.Get(cx, "tls/", clientv3.WithPrefix(), clientv3.WithSerializable())
				cancel()
				if err == nil {
					rogueAnswered++
					if len(resp.Kvs) != 0 {
						c.fatalf("%s, certified by another CA, has the cluster's keys: %v", rogue.name, resp.Kvs)
					}
				}
			}
		}
		cx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
		list, err := all.MemberList(cx)
		cancel()
		if err != nil {
			c.fatalf("member list: %v", err)
		}
		for _, m := range list.Members {
			if m.ID == rogueID && (m.Name != "" || len(m.ClientURLs) != 0) {
				c.fatalf("%s, certified by another CA, published itself: %v", rogue.name, m)
			}
		}
	}
	if rogueGone {
		t.Logf("%s exited by itself (%v); its log ends:\n%s", rogue.name, rogueExit, harness.Tail(rogue.log, 1500))
	} else {
		t.Logf("%s kept running, unjoined (answered %d serializable reads, none with a key); its log ends:\n%s",
			rogue.name, rogueAnswered, harness.Tail(rogue.log, 1500))
	}

	// The members logged that they refused its handshakes (since it started).
	refusals := map[string]int{}
	var sample string
	for _, n := range nodes {
		data, _ := os.ReadFile(n.log)
		if len(data) < logFrom[n] {
			c.fatalf("%s's log shrank", n.name)
		}
		for _, line := range strings.Split(string(data[logFrom[n]:]), "\n") {
			for _, w := range handshakeRefusals {
				if strings.Contains(line, w) {
					refusals[n.name]++
					if sample == "" {
						sample = line
					}
				}
			}
		}
	}
	if len(refusals) == 0 {
		c.fatalf("no member logged a refused TLS handshake from %s (looked for %q)", rogue.name, handshakeRefusals)
	}
	t.Logf("refused handshakes logged per member: %v; for instance:\n%s", refusals, sample)

	// In the other direction: the members dial the added member's peer URL and refuse the
	// certificate served there. The impostor exits at once (it cannot fetch the membership),
	// so a stand-in serves its certificate at its URL.
	if rogueGone {
		outcomes := standIn(t, rogue.peerURL, cert, key, 10*time.Second)
		alerts := 0
		for _, err := range outcomes {
			if err == nil {
				c.fatalf("a member completed a TLS handshake with a peer certified by another CA")
			}
			if strings.Contains(err.Error(), "remote error: tls:") {
				alerts++
			}
		}
		if alerts == 0 {
			c.fatalf("no member dialed %s and refused its certificate within 10 s (handshakes: %v)", rogue.peerURL, outcomes)
		}
		t.Logf("members dialing %s's URL refused its certificate: %v", rogue.name, outcomes)
	}

	// Remove it, stop it, and the three serve on.
	var removeErr error
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, removeErr = all.MemberRemove(cx, rogueID)
		cancel()
		if removeErr == nil {
			break
		}
	}
	if removeErr != nil {
		c.fatalf("member remove %x: %v", rogueID, removeErr)
	}
	c.kill(rogue)
	// The client's MemberList is linearizable: any member answers with the removal applied.
	cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	list, err := all.MemberList(cx)
	cancel()
	if err != nil {
		c.fatalf("member list: %v", err)
	}
	var names []string
	for _, m := range list.Members {
		names = append(names, m.Name)
	}
	sort.Strings(names)
	if strings.Join(names, ",") != "m0,m1,m2" {
		c.fatalf("after removing %s the members are %v", rogue.name, names)
	}
	c.leader(all, 0, nodes...)
	c.put(all, "tls/after-removal", "three again")
	c.readsEverywhere(pinned, "tls/after-removal", "three again", nodes...)
	c.readsEverywhere(pinned, "tls/before", "before the impostor", nodes...)
	c.mustRun(nodes...)
	t.Logf("%d writes while %s was a member, all read on the three originals", writes, rogue.name)
}
