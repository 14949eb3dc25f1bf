#!/usr/bin/env bash
# Issue 11's measurements: one member holding PUTS values of 4 KiB, then a learner added with
# `etcdctl member add --learner` and started empty while 16 clients write. Prints the size of
# the store, the writes per second before and during the join, how long the new member took
# from its start until it applied within 200 entries of the leader, every snapshot the leader
# sent (with how long each took), every one the learner installed, and both database sizes.
#
#   scripts/snapshot_join.sh                                   no limit on snapshot transfers
#   EXTRA="--snapshot-send-rate 50000000" scripts/snapshot_join.sh
#
# env: PUTS (50000: about 200 MB of values), VALUE (4096: bytes per value; 4000 fills LMDB's
# pages, where 4096 takes two), CAIRN_BIN (default release/cairn), ETCDCTL
# (default etcdctl on PATH; 3.4 or later), BASE port (32379: clients BASE and BASE+10, peers
# BASE+1 and BASE+2).
set -euo pipefail
cd "$(dirname "$0")/.."
target_dir() { cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])'; }
B=${CAIRN_BIN:-$(target_dir)/release/cairn}
CTL=${ETCDCTL:-etcdctl}
PUTS=${PUTS:-50000}; VALUE=${VALUE:-4096}; EXTRA=${EXTRA:-}
BASE=${BASE:-32379}; C0=$BASE; P0=$((BASE + 1)); P1=$((BASE + 2)); C1=$((BASE + 10))
D=$(mktemp -d /tmp/snapshot-join.XXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; [ -n "${KEEP:-}" ] || rm -rf "$D"; }
trap cleanup EXIT
initial="m0=http://127.0.0.1:$P0"
# shellcheck disable=SC2086
"$B" --name m0 --data-dir "$D/m0" --listen-client-urls "http://127.0.0.1:$C0" \
  --advertise-client-urls "http://127.0.0.1:$C0" --listen-peer-urls "http://127.0.0.1:$P0" \
  --initial-advertise-peer-urls "http://127.0.0.1:$P0" --initial-cluster "$initial" $EXTRA \
  >"$D/m0.log" 2>&1 &
PIDS+=($!)
sleep 1
"$B" bench --endpoints "127.0.0.1:$C0" --conns 4 --clients 32 --total "$PUTS" --value-size "$VALUE" put >/dev/null
echo "store: $(du -sb "$D/m0/member/db" | cut -f1) bytes of LMDB file after $PUTS puts of $VALUE bytes"
WRITES=${WRITES:-150000}
writes() { "$B" bench --endpoints "127.0.0.1:$C0" --conns 4 --clients 16 --total "$WRITES" --value-size 256 put | grep Throughput; }
echo "writes before the join: $(writes)"
ETCDCTL_API=3 "$CTL" --endpoints "127.0.0.1:$C0" member add m1 --learner --peer-urls="http://127.0.0.1:$P1" >/dev/null
started=$(date +%s.%N)
"$B" --name m1 --data-dir "$D/m1" --listen-client-urls "http://127.0.0.1:$C1" \
  --advertise-client-urls "http://127.0.0.1:$C1" --listen-peer-urls "http://127.0.0.1:$P1" \
  --initial-advertise-peer-urls "http://127.0.0.1:$P1" --initial-cluster-state existing \
  --initial-cluster "$initial,m1=http://127.0.0.1:$P1" >"$D/m1.log" 2>&1 &
PIDS+=($!)
learner=$!
writes > "$D/during.txt" &
writer=$!
applied() { curl -s -m 1 "127.0.0.1:$1/metrics" | awk '$1=="etcd_server_proposals_applied_total" {printf "%d", $2}'; }
anon=0
for _ in $(seq 1 3000); do
  now=$(awk '/RssAnon/ {print $2}' "/proc/$learner/status" 2>/dev/null || echo 0)
  [ "${now:-0}" -gt "$anon" ] && anon=$now
  a0=$(applied "$C0" || true); a1=$(applied "$C1" || true)
  cpu0=$(awk '{print $14 + $15}' "/proc/${PIDS[0]}/stat"); cpu1=$(awk '{print $14 + $15}' "/proc/$learner/stat" 2>/dev/null || echo 0)
  [ -n "$a0" ] && echo "$(date +%s.%N) $a0 $cpu0 $cpu1" >> "$D/samples"
  if [ -n "$a0" ] && [ -n "$a1" ] && [ "$a1" -gt 1000 ] && [ "$a1" -ge $((a0 - 200)) ]; then break; fi
  sleep 0.05
done
echo "join: $(python3 -c "import time; print(round(time.time() - $started, 2))") s from the learner's start to applied within 200 entries"
wait "$writer"
echo "writes during the join: $(cat "$D/during.txt")"
grep -h "sent a snapshot peer" "$D/m0.log" | sed 's/^/  leader: /'
grep -h "installed a snapshot" "$D/m1.log" | sed 's/^/  learner: /'
# The leader's applied entries per second while it sent each snapshot and while the learner
# installed it, from the samples above and the two logs' times.
python3 - "$D" <<'PY'
import datetime, re, sys
d = sys.argv[1]
samples = [tuple(map(float, l.split())) for l in open(f"{d}/samples")]
HZ = 100  # clock ticks a second in /proc/<pid>/stat
def at(t, col=1):
    for s0, s1 in zip(samples, samples[1:]):
        (t0, a0), (t1, a1) = (s0[0], s0[col]), (s1[0], s1[col])
        if t0 <= t <= t1:
            return a0 + (a1 - a0) * (t - t0) / (t1 - t0)
    return None
def stamp(line):
    return datetime.datetime.fromisoformat(line.split()[0].replace("Z", "+00:00")).timestamp()
def rate(a, b):
    x, y = at(a), at(b)
    if x is None or y is None or b <= a:
        return "n/a (outside the samples)"
    cpu = [(at(b, c) - at(a, c)) / HZ / (b - a) for c in (2, 3)]
    return f"{(y - x) / (b - a):,.0f}/s over {b - a:.2f} s; CPU: leader {cpu[0]:.2f}, learner {cpu[1]:.2f} cores"
sent = [l for l in open(f"{d}/m0.log") if "sent a snapshot peer" in l]
installed = [stamp(l) for l in open(f"{d}/m1.log") if "installed a snapshot" in l]
for line in sent:
    end = stamp(line)
    took = re.search(r"took=([0-9.]+)(ms|s)", line)
    secs = float(took.group(1)) / (1000 if took.group(2) == "ms" else 1)
    print(f"  writes applied while sending: {rate(end - secs, end)}")
    done = [t for t in installed if t >= end]
    if done:
        print(f"  writes applied while the learner installed: {rate(end, done[0])}")
PY
echo "leader's memory: anonymous $(awk '/RssAnon/ {print $2, $3}' "/proc/${PIDS[0]}/status") at the end"
echo "learner's memory: peak RSS $(awk '/VmHWM/ {print $2, $3}' "/proc/$learner/status") (with the pages of files it maps), anonymous at most $anon kB (sampled every 50 ms)"
echo "LMDB files: leader $(du -sb "$D/m0/member/db" | cut -f1) bytes, learner $(du -sb "$D/m1/member/db" | cut -f1) bytes"
