package compat

// A verified client certificate's Common Name as the caller's identity once auth is on, as etcd
// decides it (EtcdServer.AuthInfoFromCtx): only with --client-cert-auth, only for a request
// without a token (a token, even a bad one, takes precedence), and a name that is no user is
// refused by the permission checks.

import (
	"context"
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
)

// startCertAuth starts a server on an https:// URL requiring certificates of p's CA, with
// the flags given (--client-cert-auth or not), auth enabled, root (certificate CN root) and
// alice (CN alice, no password) reading r/.
func startCertAuth(t *testing.T, p *pki, flags ...string) *server {
	t.Helper()
	s := &server{t: t, dataDir: t.TempDir(), port: freePort(t), peerPort: freePort(t)}
	s.url = fmt.Sprintf("https://127.0.0.1:%d", s.port)
	s.health = &http.Client{Timeout: 2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: p.config(t, p.clientCert, p.clientKey)}}
	s.start(append([]string{"--cert-file", p.cert, "--key-file", p.key, "--trusted-ca-file", p.ca,
		"--bcrypt-cost", "4"}, flags...)...)
	t.Cleanup(s.stop)
	c := certClient(t, s, p, "root", "")
	cx := ctx(t)
	must(c.UserAdd(cx, "root", "rootpw"))
	must(c.UserGrantRole(cx, "root", "root"))
	must(c.RoleAdd(cx, "reader"))
	must(c.RoleGrantPermission(cx, "reader", "r/", "r0", clientv3.PermissionType(clientv3.PermRead)))
	must(c.UserAddWithOptions(cx, "alice", "", &clientv3.UserAddOptions{NoPassword: true}))
	must(c.UserGrantRole(cx, "alice", "reader"))
	must(c.Put(cx, "r/1", "one"))
	must(c.Put(cx, "secret", "s"))
	must(c.AuthEnable(cx))
	return s
}

// certClient is a client presenting the certificate issued as name, with a user and password
// when user is not empty.
func certClient(t *testing.T, s *server, p *pki, name, user string) *clientv3.Client {
	t.Helper()
	cfg := p.config(t, p.dir+"/"+name+".pem", p.dir+"/"+name+"-key.pem")
	c, err := clientv3.New(clientv3.Config{Endpoints: []string{s.url}, DialTimeout: 5 * time.Second,
		TLS: cfg, Username: user, Password: user + "pw"})
	if err != nil {
		t.Fatalf("client as %s: %v", name, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestAuthClientCertCommonName(t *testing.T) {
	p := newPKI(t)
	ca := issuerOf(t, p)
	issue(t, p.dir, "root", "root", ca)
	issue(t, p.dir, "mallory", "mallory", ca)
	s := startCertAuth(t, p, "--client-cert-auth")
	alice, root := certClient(t, s, p, "alice", ""), certClient(t, s, p, "root", "")
	if got := must(alice.Get(ctx(t), "r/1")); len(got.Kvs) != 1 {
		t.Fatalf("alice by her certificate: %v", got.Kvs)
	}
	_, err := alice.Get(ctx(t), "secret")
	wantErr(t, err, rpctypes.ErrGRPCPermissionDenied, codes.PermissionDenied)
	_, err = alice.Put(ctx(t), "r/2", "x")
	wantErr(t, err, rpctypes.ErrGRPCPermissionDenied, codes.PermissionDenied)
	_, err = alice.UserList(ctx(t))
	wantErr(t, err, rpctypes.ErrGRPCPermissionDenied, codes.PermissionDenied)
	must(root.Put(ctx(t), "secret", "by root's certificate"))
	must(root.UserList(ctx(t)))
	// A watch stream is checked with its certificate at each create.
	cx, cancel := context.WithCancel(ctx(t))
	defer cancel()
	if denied := <-alice.Watch(cx, "secret"); !denied.Canceled {
		t.Fatalf("alice watched secret: %+v", denied)
	}
	if created := <-alice.Watch(cx, "r/", clientv3.WithPrefix(), clientv3.WithCreatedNotify()); !created.Created || created.Canceled {
		t.Fatalf("alice's watch on r/: %+v", created)
	}
	// A name that is no user is refused by the checks, not as a bad token.
	_, err = certClient(t, s, p, "mallory", "").Get(ctx(t), "r/1")
	wantErr(t, err, rpctypes.ErrGRPCPermissionDenied, codes.PermissionDenied)
	// A token takes precedence: root's password on alice's certificate acts as root...
	must(certClient(t, s, p, "alice", "root").Get(ctx(t), "secret"))
	// ...and a bad token is refused even on a good certificate.
	conn, err := grpc.Dial(strings.TrimPrefix(s.url, "https://"),
		grpc.WithTransportCredentials(credentials.NewTLS(p.config(t, p.dir+"/root.pem", p.dir+"/root-key.pem"))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	kv := pb.NewKVClient(conn)
	bad := metadata.AppendToOutgoingContext(ctx(t), "token", "garbage")
	_, err = kv.Range(bad, &pb.RangeRequest{Key: []byte("secret")})
	wantStatus(t, "a bad token with root's certificate", err, rpctypes.ErrGRPCInvalidAuthToken)
	must(kv.Range(ctx(t), &pb.RangeRequest{Key: []byte("secret")}))
}

// TestAuthClientCertWithoutCertAuth: a trusted CA file alone verifies certificates but, without
// --client-cert-auth, names no caller.
func TestAuthClientCertWithoutCertAuth(t *testing.T) {
	p := newPKI(t)
	issue(t, p.dir, "root", "root", issuerOf(t, p))
	s := startCertAuth(t, p)
	_, err := certClient(t, s, p, "alice", "").Get(ctx(t), "r/1")
	wantErr(t, err, rpctypes.ErrGRPCUserEmpty, codes.InvalidArgument)
}

// issuerOf is p's CA, read back from its files, to sign more certificates with.
func issuerOf(t *testing.T, p *pki) *issuer {
	t.Helper()
	der := func(name string) []byte {
		b, err := os.ReadFile(p.dir + "/" + name)
		if err != nil {
			t.Fatal(err)
		}
		block, _ := pem.Decode(b)
		if block == nil {
			t.Fatalf("%s: no PEM", name)
		}
		return block.Bytes
	}
	cert, err := x509.ParseCertificate(der("ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	key, err := x509.ParsePKCS8PrivateKey(der("ca-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	return &issuer{cert: cert, key: key.(*ecdsa.PrivateKey)}
}
