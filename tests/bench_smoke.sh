#!/usr/bin/env bash
# `cairn bench` against a real etcd (Debian's etcd-server) and against cairn: a few hundred
# requests of each workload, checking the counts in the JSON records, etcd's report layout
# (`--output etcd`), the exit status of failed runs and of a closed pipe. Loopback only; every
# wait is bounded; everything started here is stopped on exit. Ports are drawn from
# PORT_LO..PORT_LO+PORT_SPAN (default 20000..40000).
set -euo pipefail
BIN=${CAIRN_BIN:?set CAIRN_BIN to the cairn binary}
[[ -x "$BIN" ]] || { echo "bench smoke: cairn did not start: no such file $BIN" >&2; exit 1; }
ETCD=${ETCD_BIN:-$(command -v etcd || echo /usr/bin/etcd)}
DIR=$(mktemp -d /tmp/cairn-bench-smoke.XXXX)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$DIR"' EXIT
port() { echo $((${PORT_LO:-20000} + RANDOM % ${PORT_SPAN:-20000})); }
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
# etcd_layout NAME ARGS...: `--output etcd` prints etcd benchmark's report, line for line as its
# format strings build it, and the parse of scripts written for etcd's tool (scripts/compare.py:
# the last word of Requests/sec, the third of "99% in") reads it.
# ETCD_BENCHMARK (etcd's own tool, if present) is held to the same check: the check reads etcd.
BENCHMARK=${ETCD_BENCHMARK:-/opt/etcd-peers/v3.5.17/benchmark}
etcd_layout() {
  local name=$1; shift
  layout_check "$name" "$("$BIN" bench --endpoints "$EP" --total 300 --clients 4 --output etcd "$@" 2>/dev/null)"
  if [ -x "$BENCHMARK" ]; then
    # Its progress bar shares its stdout, on a line of its own.
    layout_check "$name (etcd's benchmark)" \
      "$("$BENCHMARK" --endpoints "$EP" --clients 4 "$@" --total 300 2>/dev/null | grep -v $'\r')"
  fi
}
layout_check() {
  local name=$1 out=$2
  if python3 - "$out" <<'PY'; then passed=$((passed + 1)); else echo "bench smoke: $name etcd layout failed:" >&2; echo "$out" >&2; exit 1; fi
import re, sys
lines = sys.argv[1].split("\n")
if re.fullmatch(r"bench with (linearizable|serializable) range", lines[0]):
    lines = lines[1:]
num = r"\d+\.\d{4}"
shapes = ["", "Summary:"] + [rf"  {k}:\t{num} secs\." for k in ("Total", "Slowest", "Fastest", "Average", "Stddev")] \
    + [rf"  Requests/sec:\t{num}", "", "Response time histogram:"] + [rf"  {num} \[\d+\]\t\|∎*"] * 11 \
    + ["", "Latency distribution:"] + [rf"  {p}% in {num} secs\." for p in ("10", "25", "50", "75", "90", "95", "99")]
for i, shape in enumerate(shapes):
    if i >= len(lines) or not re.fullmatch(shape, lines[i]):
        sys.exit(f"line {i}: {lines[i] if i < len(lines) else None!r} is not {shape!r}")
rps = float(next(l for l in lines if "Requests/sec" in l).split()[-1])
p99 = float(next(l for l in lines if "99% in" in l).split()[2]) * 1e6
sys.exit(0 if rps > 0 and p99 > 0 else 1)
PY
}
# A run whose requests fail exits non-zero with the cause; a report whose reader has gone
# (`| true` exits at once) ends quietly.
failed_runs() {
  local rc=0
  "$BIN" bench --endpoints "$EP" --total 5 --timeout-secs 1 --value-size 2000000 watch --watchers 2 \
    >/dev/null 2>"$DIR/failed.err" || rc=$?
  if [ "$rc" = 1 ] && grep -q "requests failed" "$DIR/failed.err"; then passed=$((passed + 1)); else
    echo "bench smoke: $1 failed watch run exited $rc:" >&2; cat "$DIR/failed.err" >&2; exit 1; fi
  { "$BIN" bench --endpoints "$EP" --total 200 --clients 4 --output etcd put 2>"$DIR/pipe.err"; echo $? >"$DIR/pipe.rc"; } | true
  { "$BIN" bench --endpoints "$EP" --total 200 --clients 4 put 2>>"$DIR/pipe.err"; echo $? >>"$DIR/pipe.rc"; } | head -1 >/dev/null
  if [ "$(cat "$DIR/pipe.rc")" = $'0\n0' ] && ! grep -q panicked "$DIR/pipe.err"; then passed=$((passed + 1)); else
    echo "bench smoke: $1 closed pipe exited $(cat "$DIR/pipe.rc"):" >&2; cat "$DIR/pipe.err" >&2; exit 1; fi
}
# Stops the server (PID) while lease keepalives run: the run fails, promptly, with the cause.
killed_mid_run() {
  timeout 120 "$BIN" bench --endpoints "$EP" --total 100000000 --clients 2 lease-keepalive \
    >/dev/null 2>"$DIR/killed.err" &
  local bench=$! rc=0
  sleep 1
  kill "$PID"; wait "$PID" 2>/dev/null || true
  wait "$bench" || rc=$?
  if [ "$rc" = 1 ] && grep -q "requests failed" "$DIR/killed.err"; then passed=$((passed + 1)); else
    echo "bench smoke: $1 lease run with its server killed exited $rc:" >&2; cat "$DIR/killed.err" >&2; exit 1; fi
}
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
etcd_layout "etcd put" put
etcd_layout "etcd range" range foo --consistency=s
failed_runs etcd
killed_mid_run etcd

EP_PORT=$(port); EP=127.0.0.1:$EP_PORT
"$BIN" serve --data-dir "$DIR/cairn" --listen-client-urls "http://$EP" 2>"$DIR/cairn.log" &
PIDS+=($!); PID=$!
wait_health "http://$EP" "$DIR/cairn.log"
for w in put "range foo --consistency l" "range foo --consistency s" txn-put "mixed --key-space 50" seq-put par-put par-get lease-keepalive lease-grant-revoke; do
  check "cairn $w" "$(run $w)" "res['requests'] == 200 and res['errors'] == 0 and r['server_version'].startswith('3.6.')"
done
watch_checks cairn
etcd_layout "cairn put" put
etcd_layout "cairn range" range foo --consistency=s
failed_runs cairn
killed_mid_run cairn
check "embedded put" "$("$BIN" bench --embedded "$DIR/embedded" --total 200 --clients 4 --json put 2>/dev/null)" "res['requests'] == 200 and res['errors'] == 0"
echo "bench smoke: $passed passed, 0 failed"
