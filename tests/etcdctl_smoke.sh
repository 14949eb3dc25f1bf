#!/usr/bin/env bash
# etcdctl (Debian's etcd-client) against a cairn started here: put, get --prefix, del, txn,
# compaction, endpoint status, endpoint health, member list; leases (grant, put --lease,
# keep-alive --once, timetolive --keys, list, revoke), lock, elect and watch (--rev, --prefix).
# Loopback only; every wait is bounded; the server and every etcdctl started here are stopped
# on exit.
#
# SMOKE_ETCD=/path/to/etcd runs the same checks against that etcd instead of $CAIRN_BIN (every
# expectation here is a claim about etcd's behaviour); only the reported version is relaxed.
set -euo pipefail
if [[ -z "${SMOKE_ETCD:-}" ]]; then
	BIN=${CAIRN_BIN:?set CAIRN_BIN to the cairn binary (or SMOKE_ETCD to an etcd binary)}
	[[ -x "$BIN" ]] || { echo "etcdctl smoke: cairn did not start: no such file $BIN" >&2; exit 1; }
fi
DIR=$(mktemp -d /tmp/cairn-etcdctl.XXXX)
# shellcheck source=tests/smoke_lib.sh
. "$(dirname "$0")/smoke_lib.sh"
PORT=$(free_port)
URL=http://127.0.0.1:$PORT
start_member "$DIR/data" "$DIR/log" "$URL"
if [[ -n "${SMOKE_ETCD:-}" ]]; then
	VERSION="3." # etcd reports its own version
else
	VERSION="3.6." # cairn reports a version from etcd's 3.6 line
fi
# Background etcdctl processes (watch, lock, elect), each under `timeout`, are stopped too.
BG=()
cleanup() {
	for p in "${BG[@]}"; do kill "$p" 2>/dev/null || true; done
	kill $PID 2>/dev/null || true
	wait 2>/dev/null || true
	rm -rf "$DIR"
}
trap cleanup EXIT
export ETCDCTL_API=3
# The http:// form, as users write it: etcdctl 3.4 (Debian's) then sends the URL itself as the
# HTTP/2 :authority for endpoint status and hashkv, which etcd accepts.
E=(etcdctl --endpoints="$URL" --command-timeout=5s)
passed=0
ok() { passed=$((passed + 1)); }
fail() { echo "etcdctl smoke: $*" >&2; cat "$DIR/log" >&2; exit 1; }
# The server is up within 10 s, or the run stops at once (as soon as it exits) with its log.
up=0
for _ in $(seq 100); do
	curl -fs "$URL/health" >/dev/null && { up=1; break; }
	kill -0 $PID 2>/dev/null || break
	sleep 0.1
done
((up)) || fail "the server did not start on $URL"
# expect TEXT ARGS...: etcdctl ARGS succeeds and prints exactly TEXT.
expect() { local got; got=$("${E[@]}" "${@:2}" 2>&1) || fail "$* failed: $got"; [[ "$got" == "$1" ]] || fail "$*: expected [$1], got [$got]"; ok; }
# match REGEX ARGS...: etcdctl ARGS succeeds and its whole output matches REGEX (BASH_REMATCH
# keeps the groups).
match() { local got; got=$("${E[@]}" "${@:2}" 2>&1) || fail "$* failed: $got"; [[ "$got" =~ ^$1$ ]] || fail "$*: expected /$1/, got [$got]"; ok; }
# refuse TEXT ARGS...: etcdctl ARGS fails and says TEXT.
refuse() { local got; got=$("${E[@]}" "${@:2}" 2>&1) && fail "$* succeeded: $got"; [[ "$got" == *"$1"* ]] || fail "$*: expected an error with [$1], got [$got]"; ok; }
# revision: the store's current revision.
revision() { "${E[@]}" get revision-probe -w json | grep -o '"revision":[0-9]*' | cut -d: -f2; }
# spawn FILE TIMEOUT ARGS...: etcdctl ARGS in the background under `timeout`, output to FILE; its
# pid in LAST.
spawn() { timeout "$2" "${E[@]}" "${@:3}" >"$1" 2>&1 & LAST=$!; BG+=("$LAST"); }
# await FILE REGEX: wait (up to 10 s) until FILE's whole content matches REGEX.
await() {
	for _ in $(seq 100); do [[ "$(cat "$1")" =~ ^$2$ ]] && { ok; return; }; sleep 0.1; done
	fail "$1: expected /$2/, got [$(cat "$1")]"
}
# stop PID: end a background etcdctl (timeout passes the SIGTERM on) and reap it.
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

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
ok
out=$("${E[@]}" endpoint status -w simple 2>&1) || fail "endpoint status: $out"
[[ "$out" == *", $VERSION"* && "$out" == *", true, false,"* ]] || fail "endpoint status: $out"
ok
# The bare host:port form too.
out=$(etcdctl --endpoints="127.0.0.1:$PORT" endpoint status 2>&1) || fail "endpoint status: $out"
[[ "$out" == "127.0.0.1:$PORT, "*", $VERSION"* ]] || fail "endpoint status (host:port): $out"
ok
out=$("${E[@]}" endpoint hashkv 2>&1) || fail "endpoint hashkv: $out"
[[ "$out" =~ ^$URL,\ [0-9]+$ ]] || fail "endpoint hashkv: $out"
ok
out=$("${E[@]}" endpoint health 2>&1) || fail "endpoint health: $out"
[[ "$out" == *"is healthy"* ]] || fail "endpoint health: $out"
ok
out=$("${E[@]}" member list 2>&1) || fail "member list: $out"
[[ "$out" == *"started, default"* ]] || fail "member list: $out"
ok
[[ "$(curl -fs "$URL/livez")" == ok ]] || fail "/livez"
ok
[[ "$(curl -fs "$URL/readyz")" == ok ]] || fail "/readyz"
ok
[[ "$(curl -fs "$URL/health")" == '{"health":"true","reason":""}' ]] || fail "/health"
ok
out=$(curl -fs "$URL/version") || fail "/version"
[[ "$out" == '{"etcdserver":"'"$VERSION"*'","etcdcluster":"'"$VERSION"*'"'* ]] || fail "/version: $out"
ok
code=$(curl -s -o /dev/null -w '%{http_code}' "$URL/no-such-path") || fail "/no-such-path"
[[ "$code" == 404 ]] || fail "/no-such-path: HTTP $code, expected 404"
ok
if [[ -z "${SMOKE_ETCD:-}" ]]; then
	# etcd serves a JSON gateway under /v3/; cairn says it does not.
	out=$(curl -s -w ' %{http_code}' -X POST "$URL/v3/kv/range") || fail "/v3/kv/range"
	[[ "$out" == *"gRPC only"*" 404" ]] || fail "/v3/kv/range: $out"
	ok
fi
# Authentication is off until enabled, and there are no users yet.
expect "" user list

# Watch: --rev replays history (w/a was written before the watch started) and goes on live;
# --prefix leaves x out.
REV=$(revision)
expect OK put w/a 1
spawn "$DIR/wprefix" 10 watch --prefix --rev=$((REV + 1)) w/
WPREFIX=$LAST
spawn "$DIR/wkey" 10 watch --rev=$((REV + 1)) w/b
WKEY=$LAST
expect OK put x 1
expect OK put w/b 2
expect 1 del w/a
await "$DIR/wprefix" $'PUT\nw/a\n1\nPUT\nw/b\n2\nDELETE\nw/a'
await "$DIR/wkey" $'PUT\nw/b\n2'
stop "$WPREFIX"
stop "$WKEY"

# Leases. A TTL under etcd's minimum (2 s with the default 1 s election timeout) is raised to it.
match 'lease ([0-9a-f]+) granted with TTL\(2s\)' lease grant 1
SHORT=${BASH_REMATCH[1]}
expect "lease $SHORT revoked" lease revoke "$SHORT"
match 'lease ([0-9a-f]+) granted with TTL\(60s\)' lease grant 60
ID=${BASH_REMATCH[1]}
expect OK put --lease="$ID" lk1 v1
expect OK put --lease="$ID" lk2 v2
out=$("${E[@]}" get lk1 -w json 2>&1) || fail "get lk1: $out"
[[ "$out" == *"\"lease\":$((16#$ID))"* ]] || fail "put --lease attaches the key: $out"
ok
refuse "requested lease not found" put --lease=1234abcd nolease v
match "lease $ID granted with TTL\(60s\), remaining\((59|60)s\), attached keys\(\[(lk1 lk2|lk2 lk1)\]\)" lease timetolive "$ID" --keys
match "lease $ID granted with TTL\(60s\), remaining\((59|60)s\)" lease timetolive "$ID"
expect "lease $ID keepalived with TTL(60)" lease keep-alive --once "$ID"
expect $'found 1 leases\n'"$ID" lease list
# The revoke deletes both keys in one revision; a watch from before it sees both deletes.
REV=$(revision)
spawn "$DIR/wlease" 10 watch --prefix --rev=$((REV + 1)) lk
WLEASE=$LAST
expect "lease $ID revoked" lease revoke "$ID"
await "$DIR/wlease" $'DELETE\nlk1\n\nDELETE\nlk2'
stop "$WLEASE"
[[ "$(revision)" == $((REV + 1)) ]] || fail "a revoke deleting two keys takes one revision"
ok
expect "" get --prefix lk
expect "lease $ID already expired" lease timetolive "$ID" --keys
refuse "requested lease not found" lease revoke "$ID"
refuse "requested lease not found" lease keep-alive --once "$ID"
expect "found 0 leases" lease list

# Lock: a command run under the lock; a second locker waits while a holder has it.
expect held lock L echo held
spawn "$DIR/holder" 10 lock L sleep 2
HOLDER=$LAST
for _ in $(seq 50); do [[ -n "$("${E[@]}" get L --prefix --keys-only)" ]] && break; sleep 0.1; done
rc=0
out=$(timeout 1 "${E[@]}" lock L echo second 2>&1) || rc=$?
[[ $rc == 124 && "$out" != *second* ]] || fail "a second locker ran while the lock was held: rc $rc [$out]"
ok
out=$(timeout 10 "${E[@]}" lock L echo second 2>&1) || fail "lock after the holder: $out"
[[ "$out" == second ]] || fail "lock after the holder: [$out]"
ok
wait "$HOLDER" || fail "the holder's lock command failed: $(cat "$DIR/holder")"
expect "" get L --prefix --keys-only

# Elect: the first candidate leads, the second waits until the first ends (a SIGTERM makes
# etcdctl resign), and an observer (elect -l) sees both leaders in order.
spawn "$DIR/observer" 15 elect -l E
OBSERVER=$LAST
spawn "$DIR/p1" 10 elect E p1
P1=$LAST
await "$DIR/p1" $'E/[0-9a-f]+\np1'
rc=0
out=$(timeout 1 "${E[@]}" elect E p2 2>&1) || rc=$?
[[ $rc == 124 && "$out" != *p2* ]] || fail "a second candidate won while the first led: rc $rc [$out]"
ok
spawn "$DIR/p2" 10 elect E p2
P2=$LAST
sleep 0.3
[[ "$(cat "$DIR/p2")" == "" ]] || fail "the second candidate won while the first led: $(cat "$DIR/p2")"
stop "$P1"
await "$DIR/p2" $'E/[0-9a-f]+\np2'
await "$DIR/observer" $'E/[0-9a-f]+\np1\nE/[0-9a-f]+\np2'
stop "$P2"
stop "$OBSERVER"
echo "etcdctl smoke: $passed passed, 0 failed"
