#!/usr/bin/env bash
# cluster.sh — run a 3- or 5-member cairn cluster on this machine (127.0.0.1), with etcd's flags.
#
#   scripts/cluster.sh start [N]   start N members (3 by default, or 5); waits until one leads
#   scripts/cluster.sh stop        stop every member (SIGTERM, then SIGKILL after 10 s) by PID
#   scripts/cluster.sh status      members and `etcdctl endpoint status`
#   scripts/cluster.sh endpoints   the client endpoints, comma-separated
#
# Member i (1..N) serves clients on 127.0.0.1:i2379 and peers on 127.0.0.1:i2380 (12379, 22379,
# ...). Data, logs and PID files live under $CAIRN_CLUSTER_DIR (default ./cairn-cluster).
# env: CAIRN_BIN (default: release/cairn in cargo's target directory, which honours
# CARGO_TARGET_DIR; built if missing), CAIRN_EXTRA (more flags).
set -euo pipefail

DIR=${CAIRN_CLUSTER_DIR:-./cairn-cluster}
# Cargo's target directory as cargo resolves it ($CARGO_TARGET_DIR, build.target-dir, target/).
target_dir() {
  cargo metadata --format-version 1 --no-deps 2> /dev/null |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])' 2> /dev/null ||
    echo target
}
BIN=${CAIRN_BIN:-$(target_dir)/release/cairn}

size() { cat "$DIR/size" 2>/dev/null || echo 0; }

endpoints() {
  local n i eps=""
  n=$(size)
  for ((i = 1; i <= n; i++)); do eps+="${eps:+,}127.0.0.1:${i}2379"; done
  echo "$eps"
}

start() {
  local n=$1 i initial=""
  [[ "$n" == 3 || "$n" == 5 ]] || { echo "N must be 3 or 5" >&2; exit 2; }
  [[ -n "${CAIRN_BIN:-}" ]] || [[ -x "$BIN" ]] || cargo build --release -p cairn
  [[ -x "$BIN" ]] || { echo "cairn did not start: no such file $BIN" >&2; exit 1; }
  mkdir -p "$DIR/log" "$DIR/run"
  if ls "$DIR"/run/*.pid > /dev/null 2>&1; then echo "a cluster runs under $DIR; stop it first" >&2; exit 1; fi
  echo "$n" > "$DIR/size"
  for ((i = 1; i <= n; i++)); do initial+="${initial:+,}m$i=http://127.0.0.1:${i}2380"; done
  for ((i = 1; i <= n; i++)); do
    # shellcheck disable=SC2086
    "$BIN" serve --name "m$i" --data-dir "$DIR/m$i" \
      --listen-client-urls "http://127.0.0.1:${i}2379" \
      --listen-peer-urls "http://127.0.0.1:${i}2380" \
      --initial-advertise-peer-urls "http://127.0.0.1:${i}2380" \
      --initial-cluster "$initial" --initial-cluster-token cairn-local ${CAIRN_EXTRA:-} \
      > "$DIR/log/m$i.log" 2>&1 < /dev/null &
    echo $! > "$DIR/run/m$i.pid"
  done
  local eps tries=0
  eps=$(endpoints)
  # A member that exits during start stops the wait at once, with its log.
  while true; do
    sleep 0.2
    for ((i = 1; i <= n; i++)); do
      if ! kill -0 "$(cat "$DIR/run/m$i.pid")" 2> /dev/null; then
        echo "member m$i exited during start; its log ($DIR/log/m$i.log) ends:" >&2
        tail -n 20 "$DIR/log/m$i.log" >&2
        stop
        exit 1
      fi
    done
    command -v etcdctl > /dev/null && etcdctl --endpoints="$eps" --dial-timeout=1s endpoint status 2>/dev/null | grep -q ', true,' && break
    tries=$((tries + 1))
    if ((tries > 150)); then echo "no leader after 30 s; logs in $DIR/log" >&2; exit 1; fi
  done
  echo "started $n members; endpoints=$eps"
}

stop() {
  local f pid waited
  for f in "$DIR"/run/*.pid; do
    [[ -e "$f" ]] || continue
    pid=$(cat "$f")
    kill -TERM "$pid" 2> /dev/null || true
  done
  for f in "$DIR"/run/*.pid; do
    [[ -e "$f" ]] || continue
    pid=$(cat "$f"); waited=0
    while kill -0 "$pid" 2> /dev/null; do
      if ((waited >= 100)); then kill -KILL "$pid" 2> /dev/null || true; fi
      sleep 0.1; waited=$((waited + 1))
    done
    rm -f "$f"
  done
}

case "${1:-}" in
  start) start "${2:-3}" ;;
  stop) stop ;;
  status) etcdctl --endpoints="$(endpoints)" endpoint status -w table ;;
  endpoints) endpoints ;;
  *) sed -n '2,12p' "$0"; exit 2 ;;
esac
