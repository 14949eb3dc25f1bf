package cluster

// JWT auth tokens (--auth-token jwt,...) on a three-member cluster: a token issued by one member
// is accepted by the others without asking them (tokens are signed, not stored), it carries
// etcd's claims, and expired, forged, unsigned, malformed and outdated tokens get etcd's errors
// while every member goes on serving. CLUSTER_ETCD=/path/to/etcd runs it against etcd.

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// jwtKey writes an RSA key pair as PEM files in dir and returns the private key.
func jwtKey(t *testing.T, dir, name string) *rsa.PrivateKey {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	for file, block := range map[string]*pem.Block{
		name + ".pem":     {Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)},
		name + ".pub.pem": {Type: "PUBLIC KEY", Bytes: pub},
	} {
		if err := os.WriteFile(filepath.Join(dir, file), pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return key
}

// signJWT is an RS256 token with these claims, signed by key (alg overrides the header's).
func signJWT(t *testing.T, key *rsa.PrivateKey, alg string, claims map[string]any) string {
	t.Helper()
	enc := base64.RawURLEncoding.EncodeToString
	header, _ := json.Marshal(map[string]string{"alg": alg, "typ": "JWT"})
	body, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	msg := enc(header) + "." + enc(body)
	if key == nil {
		return msg + "."
	}
	sum := sha256.Sum256([]byte(msg))
	sig, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	return msg + "." + enc(sig)
}

// rawClients are a member's KV and Auth without clientv3's retries: each call gets that
// member's own answer.
func rawClients(t *testing.T, url string) (pb.KVClient, pb.AuthClient) {
	t.Helper()
	conn, err := grpc.Dial(strings.TrimPrefix(url, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewKVClient(conn), pb.NewAuthClient(conn)
}

func withToken(token string) (context.Context, context.CancelFunc) {
	cx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	return metadata.AppendToOutgoingContext(cx, "token", token), cancel
}

// wantCode checks a raw call's answer against etcd's error (code and message).
func wantCode(t *testing.T, what string, err error, want error) {
	t.Helper()
	got, w := status.Convert(err), status.Convert(want)
	if err == nil || got.Code() != w.Code() || got.Message() != w.Message() {
		t.Fatalf("%s: %v, want %v", what, err, want)
	}
}

func TestJWTTokensPassBetweenMembers(t *testing.T) {
	dir := t.TempDir()
	key := jwtKey(t, dir, "jwt")
	other := jwtKey(t, dir, "other")
	opts := "jwt,pub-key=" + filepath.Join(dir, "jwt.pub.pem") + ",priv-key=" + filepath.Join(dir, "jwt.pem") +
		",sign-method=RS256,ttl=1m"
	c := startCluster(t, 3, defaultBin(t), "--auth-token", opts, "--bcrypt-cost", "4")
	admin := c.client(c.endpoints()...)
	c.leader(admin)
	cx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(admin.UserAdd(cx, "root", "rootpw"))
	must(admin.UserGrantRole(cx, "root", "root"))
	must(admin.RoleAdd(cx, "reader"))
	must(admin.RoleGrantPermission(cx, "reader", "r/", "r0", clientv3.PermissionType(clientv3.PermRead)))
	must(admin.UserAdd(cx, "alice", "alicepw"))
	must(admin.UserGrantRole(cx, "alice", "reader"))
	must(admin.Put(cx, "r/1", "one"))
	must(admin.Put(cx, "secret", "s"))
	must(admin.AuthEnable(cx))
	as := func(i int, user string) *clientv3.Client {
		cl, err := clientv3.New(clientv3.Config{Endpoints: []string{c.members[i].url}, DialTimeout: 5 * time.Second,
			Username: user, Password: user + "pw", Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		return cl
	}
	root := as(1, "root")

	kvs := make([]pb.KVClient, 3)
	var auth0 pb.AuthClient
	for i, m := range c.members {
		kvs[i], _ = rawClients(t, m.url)
		if i == 0 {
			_, auth0 = rawClients(t, m.url)
		}
	}
	resp, err := auth0.Authenticate(cx, &pb.AuthenticateRequest{Name: "alice", Password: "alicepw"})
	if err != nil {
		t.Fatal(err)
	}
	// etcd's claims, readable by anyone (a JWT is signed, not encrypted).
	parts := strings.Split(resp.Token, ".")
	if len(parts) != 3 {
		t.Fatalf("not a JWT: %q", resp.Token)
	}
	body, _ := base64.RawURLEncoding.DecodeString(parts[1])
	var claims map[string]any
	if err := json.Unmarshal(body, &claims); err != nil || claims["username"] != "alice" {
		t.Fatalf("claims %s: %v", body, err)
	}
	exp, _ := claims["exp"].(float64)
	if d := time.Until(time.Unix(int64(exp), 0)); d < 50*time.Second || d > 70*time.Second {
		t.Fatalf("exp %v is not ttl=1m from now", d)
	}
	get := func(i int, token, k string) error {
		cx, cancel := withToken(token)
		defer cancel()
		_, err := kvs[i].Range(cx, &pb.RangeRequest{Key: []byte(k)})
		return err
	}
	for i := range c.members {
		if err := get(i, resp.Token, "r/1"); err != nil {
			t.Fatalf("member %d refused member 0's token: %v", i, err)
		}
		wantCode(t, "secret", get(i, resp.Token, "secret"), rpctypes.ErrGRPCPermissionDenied)
	}
	// A token signed here with the members' key passes; ones signed otherwise do not.
	rev := claims["revision"]
	valid := map[string]any{"username": "alice", "revision": rev, "exp": time.Now().Add(time.Minute).Unix()}
	if err := get(2, signJWT(t, key, "RS256", valid), "r/1"); err != nil {
		t.Fatalf("a token signed with the members' key: %v", err)
	}
	rootClaims := map[string]any{"username": "root", "revision": rev, "exp": time.Now().Add(time.Minute).Unix()}
	expired := map[string]any{"username": "alice", "revision": rev, "exp": time.Now().Add(-time.Minute).Unix()}
	bad := map[string]string{
		"forged (another key)": signJWT(t, other, "RS256", rootClaims),
		"expired":              signJWT(t, key, "RS256", expired),
		"alg none":             signJWT(t, nil, "none", rootClaims),
		"wrong alg in header":  signJWT(t, key, "RS512", rootClaims),
		"empty":                "",
		"binary":               "\x00\x01\xff.\x80.\x7f",
		"huge":                 strings.Repeat("e", 100_000),
		"truncated":            resp.Token[:len(resp.Token)-3],
		"simple-looking":       "abcdefabcdefabcd.17",
	}
	for what, token := range bad {
		err := get(1, token, "secret")
		if what == "huge" || what == "binary" {
			// Refused by gRPC (header size, invalid metadata) before or at the server; an error
			// in any case, never an answer.
			if err == nil {
				t.Fatalf("%s token got an answer", what)
			}
			continue
		}
		wantCode(t, what, err, rpctypes.ErrGRPCInvalidAuthToken)
	}
	// Any change to the auth store makes earlier tokens old; clientv3 authenticates again.
	must(root.UserAdd(cx, "bob", "bobpw"))
	for i := range c.members {
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			err := get(i, resp.Token, "r/1")
			if err != nil {
				wantCode(t, "an old token", err, rpctypes.ErrGRPCAuthOldRevision)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("member %d still takes a token older than the auth store", i)
			}
		}
	}
	if got, err := as(2, "alice").Get(cx, "r/1"); err != nil || len(got.Kvs) != 1 {
		t.Fatalf("the Go client with a password on member 2: %v %v", got, err)
	}
	must(root.Put(cx, "still", "serving"))
	c.failIfCrashed()
}
