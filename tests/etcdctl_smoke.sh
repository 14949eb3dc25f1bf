#!/usr/bin/env bash
# etcdctl (Debian's etcd-client) against a cairn started here: put, get --prefix, del, txn,
# compaction, endpoint status, endpoint health, member list. Loopback only; every wait is
# bounded; the server is stopped on exit.
set -euo pipefail
BIN=${CAIRN_BIN:?set CAIRN_BIN to the cairn binary}
DIR=$(mktemp -d /tmp/cairn-etcdctl.XXXX)
PORT=$((20000 + RANDOM % 20000))
URL=http://127.0.0.1:$PORT
"$BIN" serve --data-dir "$DIR" --listen-client-urls "$URL" 2>"$DIR/log" &
PID=$!
trap 'kill $PID 2>/dev/null || true; wait $PID 2>/dev/null || true; rm -rf "$DIR"' EXIT
for _ in $(seq 100); do curl -fs "$URL/health" >/dev/null && break; sleep 0.1; done
export ETCDCTL_API=3
# etcdctl 3.4 sends "http://host:port" as the HTTP/2 :authority for endpoint status, which
# cairn's HTTP/2 stack rejects as malformed; the bare host:port form works (see README).
E=(etcdctl --endpoints="127.0.0.1:$PORT" --command-timeout=5s)
fail() { echo "etcdctl smoke: $*" >&2; cat "$DIR/log" >&2; exit 1; }
expect() { local got; got=$("${E[@]}" "${@:2}" 2>&1) || fail "$* failed: $got"; [[ "$got" == "$1" ]] || fail "$*: expected [$1], got [$got]"; }

expect OK put foo bar
expect OK put foo2 baz
expect $'foo\nbar\nfoo2\nbaz' get --prefix foo
expect 1 del foo2
expect $'foo\nbar' get --prefix foo
expect $'SUCCESS\n\nOK' txn <<<$'value("foo") = "bar"\n\nput foo updated\n\nput foo failed\n'
expect $'foo\nupdated' get foo
expect "compacted revision 4" compaction 4
out=$("${E[@]}" get foo --rev=2 2>&1) && fail "read below the compaction succeeded: $out"
[[ "$out" == *"required revision has been compacted"* ]] || fail "compacted read: $out"
out=$("${E[@]}" endpoint status -w simple 2>&1) || fail "endpoint status: $out"
[[ "$out" == *"3.6."* && "$out" == *", true, false,"* ]] || fail "endpoint status: $out"
out=$("${E[@]}" endpoint health 2>&1) || fail "endpoint health: $out"
[[ "$out" == *"is healthy"* ]] || fail "endpoint health: $out"
out=$("${E[@]}" member list 2>&1) || fail "member list: $out"
[[ "$out" == *"started, default"* ]] || fail "member list: $out"
[[ "$(curl -fs "$URL/livez")" == ok ]] || fail "/livez"
[[ "$(curl -fs "$URL/readyz")" == ok ]] || fail "/readyz"
[[ "$(curl -fs "$URL/health")" == '{"health":"true","reason":""}' ]] || fail "/health"
echo "etcdctl smoke: 14 passed, 0 failed"
