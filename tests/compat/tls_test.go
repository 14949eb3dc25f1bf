package compat

// TLS on the client port with the official client and etcdctl: mutual TLS with a CA made here,
// a client without a certificate, with one of another CA, or speaking plain HTTP/2 is refused,
// and the server goes on serving the clients it trusts.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// pki is a CA with a server certificate (localhost, 127.0.0.1) and a client certificate
// (CN alice), and a client certificate of another CA, as PEM files in one directory.
type pki struct {
	dir                       string
	ca, cert, key             string
	clientCert, clientKey     string
	strangerCert, strangerKey string
	pool                      *x509.CertPool
}

type issuer struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func writePEM(t *testing.T, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// issue signs a certificate for cn with parent (self-signed when parent is nil) and writes it
// and its key to dir/name.pem and dir/name-key.pem.
func issue(t *testing.T, dir, name, cn string, parent *issuer) *issuer {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
	}
	signer := &issuer{cert: tmpl, key: key}
	if parent == nil {
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
		tmpl.KeyUsage |= x509.KeyUsageCertSign
		tmpl.ExtKeyUsage, tmpl.DNSNames, tmpl.IPAddresses = nil, nil, nil
	} else {
		signer = parent
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer.cert, &key.PublicKey, signer.key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(dir, name+".pem"), "CERTIFICATE", der)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(dir, name+"-key.pem"), "PRIVATE KEY", keyDER)
	return &issuer{cert: cert, key: key}
}

func newPKI(t *testing.T) *pki {
	dir := t.TempDir()
	ca := issue(t, dir, "ca", "compat test CA", nil)
	issue(t, dir, "server", "server", ca)
	issue(t, dir, "alice", "alice", ca)
	other := issue(t, dir, "other-ca", "another CA", nil)
	issue(t, dir, "stranger", "alice", other)
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	f := func(n string) string { return filepath.Join(dir, n) }
	return &pki{dir: dir, ca: f("ca.pem"), cert: f("server.pem"), key: f("server-key.pem"),
		clientCert: f("alice.pem"), clientKey: f("alice-key.pem"),
		strangerCert: f("stranger.pem"), strangerKey: f("stranger-key.pem"), pool: pool}
}

// config is a client's TLS: trusting the CA, presenting certFile/keyFile unless empty.
func (p *pki) config(t *testing.T, certFile, keyFile string) *tls.Config {
	cfg := &tls.Config{RootCAs: p.pool, ServerName: "localhost"}
	if certFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg
}

// startMutualTLS starts a server on an https:// URL that requires client certificates of p's CA.
func startMutualTLS(t *testing.T, p *pki) *server {
	s := &server{t: t, dataDir: t.TempDir(), port: freePort(t), peerPort: freePort(t)}
	s.url = fmt.Sprintf("https://127.0.0.1:%d", s.port)
	s.health = &http.Client{Timeout: 2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: p.config(t, p.clientCert, p.clientKey)}}
	s.start("--cert-file", p.cert, "--key-file", p.key, "--trusted-ca-file", p.ca, "--client-cert-auth")
	t.Cleanup(s.stop)
	return s
}

// put tries a Put and a Get as a client with cfg (nil: plain HTTP/2) on endpoint, within
// `within` (a refused client would retry until then).
func put(endpoint string, cfg *tls.Config, key string, within time.Duration) error {
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: within, TLS: cfg})
	if err != nil {
		return err
	}
	defer c.Close()
	cx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	if _, err := c.Put(cx, key, "v"); err != nil {
		return err
	}
	got, err := c.Get(cx, key)
	if err != nil {
		return err
	}
	if len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "v" {
		return fmt.Errorf("get %s: %v", key, got.Kvs)
	}
	return nil
}

func TestMutualTLSWithTheOfficialClient(t *testing.T) {
	p := newPKI(t)
	s := startMutualTLS(t, p)
	const served, refused = 5 * time.Second, 700 * time.Millisecond
	if err := put(s.url, p.config(t, p.clientCert, p.clientKey), "a", served); err != nil {
		t.Fatalf("a client with a certificate of the trusted CA: %v", err)
	}
	if err := put(s.url, p.config(t, "", ""), "b", refused); err == nil {
		t.Fatal("a client without a certificate was served")
	}
	if err := put(s.url, p.config(t, p.strangerCert, p.strangerKey), "c", refused); err == nil {
		t.Fatal("a client with another CA's certificate was served")
	}
	plain := strings.Replace(s.url, "https://", "http://", 1)
	if err := put(plain, nil, "d", refused); err == nil {
		t.Fatal("a plain HTTP/2 client was served on the TLS port")
	}
	if err := put(s.url, p.config(t, p.clientCert, p.clientKey), "e", served); err != nil {
		t.Fatalf("the server stopped serving trusted clients after refusing others: %v", err)
	}
}

// etcdctlBin is etcd 3.5's etcdctl where installed, else the one on PATH (Debian's 3.4).
func etcdctlBin(t *testing.T) string {
	if b := os.Getenv("ETCDCTL_BIN"); b != "" {
		return b
	}
	if _, err := os.Stat("/opt/etcd-peers/v3.5.17/etcdctl"); err == nil {
		return "/opt/etcd-peers/v3.5.17/etcdctl"
	}
	b, err := exec.LookPath("etcdctl")
	if err != nil {
		t.Fatal("etcdctl not found: install etcd-client or set ETCDCTL_BIN")
	}
	return b
}

func TestMutualTLSWithEtcdctl(t *testing.T) {
	p := newPKI(t)
	s := startMutualTLS(t, p)
	ctl := func(cert, key string, args ...string) (string, error) {
		all := []string{"--endpoints=" + s.url, "--command-timeout=3s", "--dial-timeout=1s", "--cacert=" + p.ca}
		if cert != "" {
			all = append(all, "--cert="+cert, "--key="+key)
		}
		cmd := exec.Command(etcdctlBin(t), append(all, args...)...)
		cmd.Env = append(os.Environ(), "ETCDCTL_API=3")
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	if out, err := ctl(p.clientCert, p.clientKey, "put", "k", "v"); err != nil || out != "OK" {
		t.Fatalf("etcdctl put: %v: %s", err, out)
	}
	if out, err := ctl(p.clientCert, p.clientKey, "get", "k", "--print-value-only"); err != nil || out != "v" {
		t.Fatalf("etcdctl get: %v: %s", err, out)
	}
	if out, err := ctl("", "", "get", "k"); err == nil {
		t.Fatalf("etcdctl without a client certificate was served: %s", out)
	}
}
