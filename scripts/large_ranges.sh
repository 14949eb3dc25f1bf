#!/usr/bin/env bash
# Issue 16, item 8: a 1-client put's latency idle and while 4 clients each read a whole key
# space of 100,000 keys (etcd's `benchmark range`), on one fresh member.
#
#   scripts/large_ranges.sh              cairn (CAIRN_BIN, default release/cairn)
#   ETCD=1 scripts/large_ranges.sh       etcd 3.5.17 (ETCD_BIN)
#   FLOOR=1 scripts/large_ranges.sh      the machine's floor: the range clients read from a
#                                        second, identical cairn, so the put path shares the
#                                        cores with the same ranging work but not the process
#
# env: PORT (23999), KEYS (100000), VAL (256 bytes), RANGERS (4), ETCD_BIN, BENCHMARK (etcd's
# benchmark tool, built by ../shared/peers or at /opt/etcd-peers/v3.5.17/benchmark).
# Prints the put latency percentiles (microseconds) idle and while ranging, and the server's RSS.
set -euo pipefail
cd "$(dirname "$0")/.."
target_dir() { cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])'; }
CAIRN=${CAIRN_BIN:-$(target_dir)/release/cairn}
ETCD_BIN=${ETCD_BIN:-/opt/etcd-peers/v3.5.17/etcd}
BENCHMARK=${BENCHMARK:-/opt/etcd-peers/v3.5.17/benchmark}
PORT=${PORT:-23999}
KEYS=${KEYS:-100000}; VAL=${VAL:-256}; RANGERS=${RANGERS:-4}
D=$(mktemp -d /tmp/large-ranges.XXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$D"; }
trap cleanup EXIT

start() { # port dir
  local urls=(--listen-client-urls "http://127.0.0.1:$1" --advertise-client-urls "http://127.0.0.1:$1"
              --listen-peer-urls "http://127.0.0.1:$(($1 + 1))" --data-dir "$2")
  if [ "${ETCD:-}" = 1 ]; then "$ETCD_BIN" "${urls[@]}" >"$2.log" 2>&1 &
  else "$CAIRN" serve "${urls[@]}" >"$2.log" 2>&1 & fi
  PIDS+=($!)
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$1/health" >/dev/null && return; sleep 0.1; done
  echo "the server on port $1 did not start" >&2; exit 1
}
fill() { "$CAIRN" bench --endpoints "127.0.0.1:$1" --clients 16 --conns 4 --total "$KEYS" \
  --sequential-keys --value-size "$VAL" put >/dev/null; }
put() { "$CAIRN" bench --endpoints "127.0.0.1:$PORT" --clients 1 --total 2000 --value-size "$VAL" --json put |
  python3 -c 'import json,sys; l=json.load(sys.stdin)["results"]["latency_us"]; print({k: l[k] for k in ("p50","p90","p99","max")})'; }

start "$PORT" "$D/a"; fill "$PORT"
RPORT=$PORT
if [ "${FLOOR:-}" = 1 ]; then RPORT=$((PORT + 10)); start "$RPORT" "$D/b"; fill "$RPORT"; fi
echo "idle:    $(put)"
"$BENCHMARK" --endpoints "127.0.0.1:$RPORT" --clients "$RANGERS" --conns "$RANGERS" range 0 1 \
  --total 100000 >"$D/range.out" 2>&1 &
RANGE=$!
sleep 1
echo "ranging: $(put)"
echo "server RSS: $(( $(ps -o rss= -p "${PIDS[0]}") / 1024 )) MiB"
kill "$RANGE"; wait "$RANGE" 2>/dev/null || true
