#!/usr/bin/env bash
# `cairn bench` against a real etcd (Debian's etcd-server) and against cairn: a few hundred
# requests of each workload, checking the counts in the JSON records. Loopback only; every wait
# is bounded; everything started here is stopped on exit.
set -euo pipefail
BIN=${CAIRN_BIN:?set CAIRN_BIN to the cairn binary}
[[ -x "$BIN" ]] || { echo "bench smoke: cairn did not start: no such file $BIN" >&2; exit 1; }
ETCD=${ETCD_BIN:-$(command -v etcd || echo /usr/bin/etcd)}
DIR=$(mktemp -d /tmp/cairn-bench-smoke.XXXX)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$DIR"' EXIT
port() { echo $((20000 + RANDOM % 20000)); }
# wait_health URL LOG: the server ($PID) answers on URL within 15 s; if it exits first or never
# answers, its LOG says why, at once.
wait_health() {
  for _ in $(seq 150); do
    curl -fs "$1/health" >/dev/null && return 0
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "bench smoke: the server did not start on $1; its log:" >&2; cat "$2" >&2; exit 1
}
passed=0
# check NAME JSON PYTHON-CONDITION: the record parses and the condition on it holds.
check() {
  if python3 -c "import json,sys; r=json.loads(sys.argv[1]); res=r['results']; sys.exit(0 if ($3) else 1)" "$2"; then
    passed=$((passed + 1))
  else
    echo "bench smoke: $1 failed: $2" >&2; exit 1
  fi
}
run() { "$BIN" bench --endpoints "$EP" --total 200 --clients 4 --conns 2 --json "$@" 2>/dev/null; }
# The watch workloads, the same checks for both systems; PID is the server's, for its RSS.
watch_checks() {
  check "$1 watch" "$(run watch --watchers 3)" "res['errors'] == 0 and res['extra']['events_delivered'] == 600 and res['extra']['events_per_sec'] > 0"
  check "$1 watch, shared streams" "$(run --server-pid "$PID" watch --watchers 50 --streams 4)" \
    "res['errors'] == 0 and res['extra']['events_delivered'] == 10000 and res['extra']['streams'] == 4 and res['extra']['server_rss_peak_kib'] > 0"
  check "$1 watch-latency" "$(run watch-latency)" \
    "res['errors'] == 0 and res['latency_us']['p99'] >= res['latency_us']['p50'] and res['extra']['put_to_event_p99_us'] > 0"
  check "$1 watch-idle" "$(run --server-pid "$PID" watch-idle --watchers 300 --streams 6 --hold-secs 0)" \
    "res['errors'] == 0 and res['ok'] == 300 and res['extra']['streams'] == 6 and res['extra']['idle_rss_after_kib'] > 0 and 'bytes_per_watcher' in res['extra']"
  check "$1 put beside idle watchers" "$(run --idle-watchers 250 put)" \
    "res['errors'] == 0 and res['ok'] == 200 and res['extra']['idle_watchers'] == 250"
}

EP_PORT=$(port); EP=127.0.0.1:$EP_PORT
"$ETCD" --data-dir "$DIR/etcd" --listen-client-urls "http://$EP" --advertise-client-urls "http://$EP" \
  --listen-peer-urls "http://127.0.0.1:$(port)" >"$DIR/etcd.log" 2>&1 &
PIDS+=($!); PID=$!
wait_health "http://$EP" "$DIR/etcd.log"
for w in put "range foo --consistency l" "range foo --consistency s" txn-put "mixed --key-space 50" seq-put par-put par-get lease-keepalive lease-grant-revoke; do
  check "etcd $w" "$(run $w)" "res['requests'] == 200 and res['errors'] == 0 and res['throughput_ops'] > 0"
done
watch_checks etcd

EP_PORT=$(port); EP=127.0.0.1:$EP_PORT
"$BIN" serve --data-dir "$DIR/cairn" --listen-client-urls "http://$EP" 2>"$DIR/cairn.log" &
PIDS+=($!); PID=$!
wait_health "http://$EP" "$DIR/cairn.log"
for w in put "range foo --consistency l" "range foo --consistency s" txn-put "mixed --key-space 50" seq-put par-put par-get lease-keepalive lease-grant-revoke; do
  check "cairn $w" "$(run $w)" "res['requests'] == 200 and res['errors'] == 0 and r['server_version'].startswith('3.6.')"
done
watch_checks cairn
check "embedded put" "$("$BIN" bench --embedded "$DIR/embedded" --total 200 --clients 4 --json put 2>/dev/null)" "res['requests'] == 200 and res['errors'] == 0"
echo "bench smoke: $passed passed, 0 failed"
