#!/usr/bin/env python3
"""What cairn costs to ship and to run, beside etcd, and what a change costs on the bench rows.

    python3 scripts/footprint.py footprint [--runs 5]
        Binary size, start time and idle RSS of cairn and etcd 3.5.17 (single member, fsync on,
        127.0.0.1, a fresh data directory each run). Start time is measured twice, the same way
        for both: from the fork of the process until its client port accepts a TCP connection,
        and until the first `etcdctl endpoint health` (etcd 3.5.17's etcdctl, run in a loop) that
        succeeds. RSS is VmRSS from /proc: one second after the first healthy answer, and again
        one second after 10,000 puts (8-byte keys, 256-byte values, 16 clients, `cairn bench`).
        Medians of --runs runs; the two systems alternate within each run.

    python3 scripts/footprint.py cost OLD_BIN NEW_BIN [--rounds 3]
        The same `cairn bench` rows (put 1 and 16 clients, linearizable range 16 clients, txn
        put 16 clients) against a fresh server of each binary, interleaved OLD NEW OLD NEW ...
        because the machine is shared and its noise is large. Prints per-row medians of
        throughput and of server CPU per request (from /proc, less noisy than throughput), the
        ratio NEW/OLD, and the spread between runs of the same binary: a difference smaller
        than that spread is noise.

$CAIRN_BIN picks the cairn binary for `footprint` and for the bench client (see locate.py);
$ETCD_DIR the directory of etcd and etcdctl (default /opt/etcd-peers/v3.5.17). Results go to
stdout as Markdown tables; bench/results/2026-11-23-footprint.md and
-cost-of-operations.md were written from them."""

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import locate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ETCD_DIR = os.environ.get("ETCD_DIR", "/opt/etcd-peers/v3.5.17")
ETCDCTL = os.path.join(ETCD_DIR, "etcdctl")

# (row, cairn bench arguments) for `cost`. The 1-client put row writes keys 0..4999 first, so
# the range row reads a key that exists (`--key-space` would write its keys inside the run, and
# their CPU would count as the reads').
COST_ROWS = [
    ("put 1 client", ["--conns", "1", "--clients", "1", "--sequential-keys", "--total", "5000", "put"]),
    ("put 16 clients", ["--conns", "4", "--clients", "16", "--total", "20000", "put"]),
    ("range (l) 16 clients", ["--conns", "4", "--clients", "16", "--total", "50000", "range", "00000042"]),
    ("txn put 16 clients", ["--conns", "4", "--clients", "16", "--total", "20000", "txn-put"]),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid):
    """User plus system CPU a process has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    """One single-member cairn or etcd on free loopback ports, in a fresh data directory."""

    def __init__(self, system, binary, work):
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.data = tempfile.mkdtemp(prefix=f"{system}-", dir=work)
        url = f"http://{self.endpoint}"
        if system == "etcd":
            peer = f"http://127.0.0.1:{free_port()}"
            cmd = [binary, "--data-dir", self.data, "--listen-client-urls", url, "--advertise-client-urls", url,
                   "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                   "--initial-cluster", f"default={peer}"]
        else:
            cmd = [binary, "serve", "--data-dir", self.data, "--listen-client-urls", url]
        self.log = open(os.path.join(work, f"{os.path.basename(self.data)}.log"), "w")
        started = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log)
        self.accept_ms = self._until(started, self._accepts) * 1000
        self.health_ms = self._until(started, self._healthy) * 1000

    def _until(self, started, probe, seconds=20):
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"server exited during start (status {self.proc.returncode})")
            if probe():
                return time.perf_counter() - started
            time.sleep(0.001)
        self.stop()
        raise RuntimeError("server did not start within 20 s")

    def _accepts(self):
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.1).close()
            return True
        except OSError:
            return False

    def _healthy(self):
        out = subprocess.run([ETCDCTL, "--endpoints", self.endpoint, "--dial-timeout=1s", "--command-timeout=1s",
                              "endpoint", "health"], capture_output=True, text=True, timeout=10,
                             env=dict(os.environ, ETCDCTL_API="3"))
        return out.returncode == 0 and "is healthy" in out.stdout + out.stderr

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.data, ignore_errors=True)


def bench(client, endpoint, args):
    """One `cairn bench --json` run's results; raises when a request failed."""
    out = subprocess.run([client, "bench", "--endpoints", endpoint, "--json"] + args,
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"cairn bench {' '.join(args)}: {out.stderr.strip()[-300:] or out.stdout[-300:]}")
    return json.loads(out.stdout)["results"]


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def footprint(a, client, work):
    systems = [("cairn", client), ("etcd", os.path.join(ETCD_DIR, "etcd"))]
    runs = {s: [] for s, _ in systems}
    for r in range(a.runs):
        for system, binary in systems if r % 2 == 0 else systems[::-1]:
            srv = Server(system, binary, work)
            try:
                time.sleep(1)
                idle = rss_mib(srv.proc.pid)
                bench(client, srv.endpoint, ["--conns", "4", "--clients", "16", "--total", "10000", "put"])
                time.sleep(1)
                runs[system].append({"accept_ms": srv.accept_ms, "health_ms": srv.health_ms,
                                     "idle_rss": idle, "rss_after_puts": rss_mib(srv.proc.pid)})
            finally:
                srv.stop()
            print(f"run {r + 1} {system}: {runs[system][-1]}", file=sys.stderr)
    print(f"| | binary MB | port accepts ms | first `endpoint health` ms | idle RSS MiB | RSS after 10,000 puts MiB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for system, binary in systems:
        m = lambda k: median([x[k] for x in runs[system]])
        size = os.path.getsize(binary) / 1e6
        print(f"| {system} | {size:.1f} | {m('accept_ms'):.0f} | {m('health_ms'):.0f} | {m('idle_rss'):.1f} | "
              f"{m('rss_after_puts'):.1f} |")
    print(f"\nMedians of {a.runs} runs; every run: " + json.dumps(runs))


def cost(a, client, work):
    bins = [("old", a.old), ("new", a.new)]
    runs = {(b, row): [] for b, _ in bins for row, _ in COST_ROWS}
    for r in range(a.rounds):
        for name, binary in bins:
            srv = Server("cairn", binary, work)
            try:
                for row, args in COST_ROWS:
                    before = cpu_seconds(srv.proc.pid)
                    res = bench(client, srv.endpoint, args)
                    cpu_us = (cpu_seconds(srv.proc.pid) - before) * 1e6 / res["ok"]
                    runs[(name, row)].append({"ops_per_sec": res["throughput_ops"], "cpu_us": cpu_us,
                                              "p99_us": res["latency_us"]["p99"]})
                    print(f"round {r + 1} {name} {row}: {runs[(name, row)][-1]}", file=sys.stderr)
            finally:
                srv.stop()
    print("| row | old ops/s | new ops/s | new/old | same-binary spread | old CPU µs/op | new CPU µs/op | "
          "new/old CPU | old p99 µs | new p99 µs |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row, _ in COST_ROWS:
        o, n = runs[("old", row)], runs[("new", row)]
        med = lambda rs, k: median([x[k] for x in rs])
        # The spread of one binary's runs around their median: the larger of the two binaries'.
        spread = max((max(x["ops_per_sec"] for x in rs) - min(x["ops_per_sec"] for x in rs)) / med(rs, "ops_per_sec")
                     for rs in (o, n))
        print(f"| {row} | {med(o, 'ops_per_sec'):.0f} | {med(n, 'ops_per_sec'):.0f} | "
              f"{med(n, 'ops_per_sec') / med(o, 'ops_per_sec'):.3f} | {spread * 100:.0f}% | "
              f"{med(o, 'cpu_us'):.1f} | {med(n, 'cpu_us'):.1f} | {med(n, 'cpu_us') / med(o, 'cpu_us'):.3f} | "
              f"{med(o, 'p99_us'):.0f} | {med(n, 'p99_us'):.0f} |")
    print(f"\nMedians of {a.rounds} rounds, interleaved old new old new ...; every run: "
          + json.dumps({f"{b} {row}": v for (b, row), v in runs.items()}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    fp = sub.add_parser("footprint", help="size, start time and RSS of cairn and etcd")
    fp.add_argument("--runs", type=int, default=5)
    c = sub.add_parser("cost", help="bench rows against two cairn binaries, interleaved")
    c.add_argument("old")
    c.add_argument("new")
    c.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    client = locate.cairn_bin()
    locate.require(client, "footprint.py")
    work = tempfile.mkdtemp(prefix="footprint-", dir=ROOT)
    try:
        footprint(a, client, work) if a.cmd == "footprint" else cost(a, client, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
