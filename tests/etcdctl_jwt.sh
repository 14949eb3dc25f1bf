#!/usr/bin/env bash
# etcdctl (Debian's etcd-client) against a cairn that signs its auth tokens as JWTs
# (`--auth-token jwt,pub-key=...,priv-key=...,sign-method=RS256`, the test keys in
# crates/server/tests/jwt-keys): users, roles and `auth enable` through etcdctl, then puts and
# gets with `--user`, refused with etcd's messages without credentials or with a wrong
# password. Loopback only; every wait is bounded; the server is stopped on exit.
#
# SMOKE_ETCD=/path/to/etcd runs the same checks against that etcd instead of $CAIRN_BIN.
set -euo pipefail
cd "$(dirname "$0")/.."
KEYS=$PWD/crates/server/tests/jwt-keys
TOKEN="jwt,pub-key=$KEYS/rsa.pub.pem,priv-key=$KEYS/rsa.pem,sign-method=RS256,ttl=5m"
DIR=$(mktemp -d /tmp/cairn-etcdctl-jwt.XXXX)
# shellcheck source=tests/smoke_lib.sh
. "$(dirname "$0")/smoke_lib.sh"
PORT=$(free_port)
URL=http://127.0.0.1:$PORT
start_member "$DIR/data" "$DIR/log" "$URL" --auth-token "$TOKEN"
cleanup() {
	kill $PID 2>/dev/null || true
	wait 2>/dev/null || true
	rm -rf "$DIR"
}
trap cleanup EXIT
export ETCDCTL_API=3
E=(etcdctl --endpoints="$URL" --command-timeout=5s)
passed=0
fail() {
	echo "etcdctl jwt: FAIL: $*" >&2
	echo "--- server log:" >&2
	tail -20 "$DIR/log" >&2
	exit 1
}
# `expect OUT ARGS...`: etcdctl ARGS succeeds and prints exactly OUT.
expect() {
	local want=$1 out
	shift
	out=$("${E[@]}" "$@" 2>&1) || fail "etcdctl $*: $out"
	[[ "$out" == "$want" ]] || fail "etcdctl $*: got [$out], want [$want]"
	passed=$((passed + 1))
}
# `refuse MESSAGE ARGS...`: etcdctl ARGS fails with MESSAGE in its output.
refuse() {
	local want=$1 out
	shift
	if out=$("${E[@]}" "$@" 2>&1); then fail "etcdctl $* succeeded: $out"; fi
	[[ "$out" == *"$want"* ]] || fail "etcdctl $*: got [$out], want [$want]"
	passed=$((passed + 1))
}
for _ in $(seq 100); do "${E[@]}" endpoint health >/dev/null 2>&1 && break; sleep 0.1; done
kill -0 $PID 2>/dev/null || fail "the server did not start"

expect "User root created" user add root:rootpw
expect "Role root created" role add root
expect "Role root is granted to user root" user grant-role root root
expect "User alice created" user add alice:alicepw
expect "Role app created" role add app
expect "Role app updated" role grant-permission app readwrite app/ --prefix=true
expect "Role app is granted to user alice" user grant-role alice app
expect "Authentication Enabled" auth enable

# Tokens are JWTs now: every command below authenticates, then sends the token.
expect OK --user alice:alicepw put app/k v1
expect $'app/k\nv1' --user alice:alicepw get app/k
expect $'app/k\nv1' --user root:rootpw get app/k
refuse "permission denied" --user alice:alicepw put other v
refuse "authentication failed, invalid user ID or password" --user alice:wrong get app/k
refuse "user name is empty" put app/k v2
expect "Authentication Disabled" --user root:rootpw auth disable
expect $'app/k\nv1' get app/k
echo "etcdctl jwt: $passed passed, 0 failed"
