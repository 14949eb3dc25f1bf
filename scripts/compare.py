#!/usr/bin/env python3
"""Side-by-side comparison of cairn and etcd on this machine.

Starts etcd and cairn in turn (single member, fsync on, 127.0.0.1 only), runs the workload matrix
of shared/design/benchmarks.md with `cairn bench` against each, alternating which system goes
first in each round, and writes bench/results/<date>.md (medians, ratios cairn/etcd) and a PNG
chart of the ratios. It records the disk's raw fdatasync latency before and after, cross-checks
one row with etcd's own `benchmark` tool, and measures idle and loaded RSS, start-to-healthy
time and binary size. Everything it starts is stopped; every run is bounded in time.

With --members N (3 or 5) it starts an N-member cluster of each system instead (free loopback
ports, fresh data dirs, waits for a leader with `etcdctl endpoint status`), runs the cluster matrix
(puts to the leader; linearizable and serializable ranges spread over every member), and writes
bench/results/<date>-<N>members.md with the floors beside it (fdatasync alone and a quorum of
concurrent ones on this one disk, loopback TCP and gRPC round trips, CPU per request) and each
member's RSS; cairn also runs the linearizable reads with `--read-mode lease`.

$CAIRN_BIN picks the cairn binary (default: release/cairn in cargo's target directory; locate.py).

    python3 scripts/compare.py            # full: 3 rounds, etcd 3.5.17 if built
    python3 scripts/compare.py --quick    # CI: 1 round, small totals, results under /tmp
    python3 scripts/compare.py --members 3   # 3-member clusters: bench/results/<date>-3members.md
    python3 scripts/compare.py --rows WL,LS  # only the rows whose ids start so: <date>-wl-ls.md

The watch and lease rows (WL, LS) are in compare_streams.py. A row that fails for one system is
reported as n/a with its error; the run goes on."""

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import compare_streams as streams
import locate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CAIRN = locate.cairn_bin()
PEERS = os.path.join(os.path.dirname(ROOT), "shared", "peers")
ETCD_BUILT = "/opt/etcd-peers/v3.5.17"

# (id, cairn bench arguments, what it measures). Totals are scaled down by --quick.
MATRIX = [
    ("W1 put 1 client", ["--conns", "1", "--clients", "1", "--sequential-keys", "--total", "10000", "put"]),
    ("W2 put 100 clients", ["--conns", "10", "--clients", "100", "--total", "10000", "put"]),
    ("R-l range 100 clients", ["--conns", "10", "--clients", "100", "--total", "10000", "range", "foo", "--consistency", "l"]),
    ("R-s range 100 clients", ["--conns", "10", "--clients", "100", "--total", "10000", "range", "foo", "--consistency", "s"]),
    ("HOT range l, 10 keys", ["--conns", "10", "--clients", "100", "--total", "10000", "--key-space", "10", "range", "--consistency", "l"]),
    ("T4 seq-put", ["--total", "5000", "--value-size", "256", "seq-put"]),
    ("T4 par-put", ["--total", "10000", "--value-size", "256", "par-put"]),
    ("T4 seq-get", ["--total", "5000", "seq-get"]),
    ("T4 par-get", ["--total", "10000", "par-get"]),
    ("T4 mixed 50/50", ["--conns", "4", "--clients", "16", "--key-size", "64", "--key-space", "1000", "--total", "10000", "mixed", "--read-ratio", "0.5"]),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fdatasync_latency():
    fd, path = tempfile.mkstemp(dir=ROOT)
    lat = []
    try:
        for _ in range(300):
            os.write(fd, b"x" * 256)
            t = time.perf_counter()
            os.fdatasync(fd)
            lat.append((time.perf_counter() - t) * 1e6)
    finally:
        os.close(fd)
        os.remove(path)
    lat.sort()
    return {"p50_us": round(lat[150]), "p99_us": round(lat[296])}


def quorum_fdatasync_latency(members, rounds=300):
    """The disk floor of a replicated write when every member shares this machine's disk: each
    round, `members` threads append 256 B to files of their own and fdatasync at the same moment
    (as a leader and its followers do for one entry); the round's latency is when a majority of
    them are done, which is the earliest a cluster can commit."""
    import threading
    quorum = members // 2 + 1
    files = [tempfile.mkstemp(dir=ROOT) for _ in range(members)]
    start = threading.Barrier(members + 1)
    done = [[0.0] * rounds for _ in range(members)]

    def writer(i):
        fd = files[i][0]
        for r in range(rounds):
            start.wait()
            os.write(fd, b"x" * 256)
            os.fdatasync(fd)
            done[i][r] = time.perf_counter()

    threads = [threading.Thread(target=writer, args=(i,), daemon=True) for i in range(members)]
    for t in threads:
        t.start()
    lat = []
    try:
        for r in range(rounds):
            t0 = time.perf_counter()
            start.wait()
            # The next round's barrier waits for every writer, so all are done by then.
            while any(done[i][r] == 0.0 for i in range(members)):
                time.sleep(0.0001)
            lat.append((sorted(done[i][r] for i in range(members))[quorum - 1] - t0) * 1e6)
    finally:
        for t in threads:
            t.join(timeout=10)
        for fd, path in files:
            os.close(fd)
            os.remove(path)
    lat.sort()
    return {"p50_us": round(lat[rounds // 2]), "p99_us": round(lat[rounds * 99 // 100])}


def build_replicated_floor():
    """Builds the `replicated_floor` example (crates/bench/examples); its path, or None."""
    try:
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "cairn-bench", "--example", "replicated_floor"],
                       cwd=ROOT, check=True, timeout=900, capture_output=True)
    except (OSError, subprocess.SubprocessError) as e:
        print(f"replicated floor: not built ({e})", file=sys.stderr)
        return None
    return os.path.join(locate.target_dir(), "release", "examples", "replicated_floor")


def replicated_floor(binary, members, total=3000):
    """The end-to-end floor of a 1-client put on `members` members sharing this machine: the
    example runs a client, a leader and followers as plain threads over loopback TCP, each
    fdatasyncing a preallocated log file, the leader answering at a quorum. None if it cannot
    be run."""
    if binary is None:
        return None
    try:
        out = subprocess.run([binary, str(members), str(total), ROOT], capture_output=True, text=True,
                             timeout=300, check=True)
        return json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        print(f"replicated floor: not measured ({e})", file=sys.stderr)
        return None


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class Server:
    """One single-member server on a loopback port, stopped on exit."""

    def __init__(self, name, binary, work):
        self.name, self.binary = name, binary
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.data = tempfile.mkdtemp(prefix=f"{name}-", dir=work)
        url = f"http://{self.endpoint}"
        if name == "cairn":
            cmd = [binary, "serve", "--data-dir", self.data, "--listen-client-urls", url]
        else:
            peer = f"http://127.0.0.1:{free_port()}"
            cmd = [binary, "--data-dir", self.data, "--listen-client-urls", url, "--advertise-client-urls", url,
                   "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", f"default={peer}"]
        self.log = open(os.path.join(self.data, "log"), "w")
        started = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=self.log)
        deadline = time.time() + 20
        while time.time() < deadline:
            if self.proc.poll() is not None:  # it exited: say why at once, in its own words
                self.log.flush()
                why = locate.tail(self.log.name)
                self.stop()
                raise RuntimeError(f"{name} did not start (exit {self.proc.returncode}):\n{why}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.05)
        else:
            self.stop()
            raise RuntimeError(f"{name} did not become healthy")
        self.start_ms = (time.perf_counter() - started) * 1000
        time.sleep(0.5)
        self.idle_rss = rss_kib(self.proc.pid)

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


def bench(endpoint, args, quick):
    """One `cairn bench --json` run: its results, or {"error": why} (never raises)."""
    if quick:
        args = [str(max(100, int(a) // 20)) if prev == "--total" else a for prev, a in zip([""] + args, args)]
    try:
        out = subprocess.run([CAIRN, "bench", "--endpoints", endpoint, "--json"] + args,
                             capture_output=True, text=True, timeout=600)
        # A run with failed requests exits 1 after printing its record: keep its error counts.
        if out.returncode != 0 and not out.stdout.startswith("{"):
            return {"error": out.stderr.strip()[-300:] or f"exit status {out.returncode}"}
        return json.loads(out.stdout)["results"]
    except (subprocess.TimeoutExpired, ValueError, KeyError) as e:
        return {"error": f"{type(e).__name__}: {e}"[:300]}


# The rows the single-node issue measures with etcd's own `benchmark` tool (W2 doubles as the
# cross-check of `cairn bench`, which runs the same row in MATRIX).
TOOL_ROWS = [
    ("W1 put 1 client", ["--conns=1", "--clients=1", "--total=10000", "put", "--sequential-keys", "--key-size=8", "--val-size=256"]),
    ("W2 put 100 clients", ["--conns=10", "--clients=100", "--total=50000", "put", "--key-size=8", "--val-size=256"]),
    ("R-l range 100 clients", ["--conns=10", "--clients=100", "--total=100000", "range", "foo", "--consistency=l"]),
    ("R-s range 100 clients", ["--conns=10", "--clients=100", "--total=100000", "range", "foo", "--consistency=s"]),
]


def cpu_seconds(pid):
    """User plus system CPU a process has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def etcd_benchmark(endpoint, server_pid, quick, wanted):
    """etcd's own tool on TOOL_ROWS, with the CPU each side spends per request: on a small
    machine the tool shares the cores, so its cost per request bounds any server's ratio."""
    tool = os.path.join(ETCD_BUILT, "benchmark")
    if not os.path.exists(tool):
        return None
    rows = {}
    for row, args in TOOL_ROWS:
        if not wanted(row):
            continue
        if quick:
            args = [f"--total={max(200, int(x.split('=')[1]) // 50)}" if x.startswith("--total=") else x for x in args]
        total = int(next(x for x in args if x.startswith("--total=")).split("=")[1])
        before, children = cpu_seconds(server_pid), resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run([tool, f"--endpoints={endpoint}", "--precise"] + args,
                             capture_output=True, text=True, timeout=600).stdout
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        client = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
        res = {"server_cpu_us": (cpu_seconds(server_pid) - before) * 1e6 / total, "client_cpu_us": client * 1e6 / total}
        for line in out.splitlines():
            if "Requests/sec" in line:
                res["throughput_ops"] = float(line.split()[-1])
            if "99% in" in line:
                res["p99_us"] = float(line.split()[2]) * 1e6
        rows[row] = res
    return rows


def median(xs):
    return statistics.median(xs) if xs else None


def row_prefixes(a):
    """--rows: comma-separated prefixes of row ids (e.g. W1,LS or C-W1,C-R-l); none means every row."""
    return [p.strip() for p in (a.rows or "").split(",") if p.strip()]


def row_wanted(a, row):
    prefixes = row_prefixes(a)
    return not prefixes or any(row.startswith(p) for p in prefixes)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="1 round, totals / 20: a test of the runner")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--etcd", help="etcd server binary (default: 3.5.17 if built, else Debian's)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--rows", help="comma-separated prefixes of row ids to run (e.g. WL,LS); default all")
    ap.add_argument("--members", type=int, default=1,
                    help="1: single members, the full matrix (default); 3 or 5: clusters, the cluster matrix, "
                         "report <date>-<N>members.md")
    a = ap.parse_args()
    if a.members < 1:
        ap.error("--members must be at least 1")
    rounds = 1 if a.quick else a.rounds
    locate.require(CAIRN, "compare")
    etcd = a.etcd or (os.path.join(ETCD_BUILT, "etcd") if os.path.exists(os.path.join(ETCD_BUILT, "etcd")) else shutil.which("etcd") or "/usr/bin/etcd")
    etcd_version = subprocess.run([etcd, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    if a.members > 1:
        return run_cluster(a, etcd, etcd_version)
    prefixes = row_prefixes(a)
    wanted = lambda row: row_wanted(a, row)
    work = tempfile.mkdtemp(prefix="cairn-compare-")
    fs_before = fdatasync_latency()
    results = {}  # (row, system) -> list of result dicts
    resources = {"etcd": [], "cairn": []}
    crosscheck = {}  # (row, system) -> list of etcd-benchmark-tool results
    try:
        for r in range(rounds):
            order = ["etcd", "cairn"] if r % 2 == 0 else ["cairn", "etcd"]
            for system in order:
                srv = Server(system, etcd if system == "etcd" else CAIRN, work)
                try:
                    subprocess.run([CAIRN, "bench", "--endpoints", srv.endpoint, "--total", "1", "put"],
                                   capture_output=True, timeout=60)
                    for row, args in filter(lambda m: wanted(m[0]), MATRIX):
                        res = bench(srv.endpoint, args, a.quick)
                        results.setdefault((row, system), []).append(res)
                        print(f"round {r + 1} {system:5} {row:24} {res.get('throughput_ops', 0):10.0f} ops/s"
                              f" errors {res.get('errors', '-')}", file=sys.stderr)
                    tool_rows = etcd_benchmark(srv.endpoint, srv.proc.pid, a.quick, wanted)
                    for row, res in (tool_rows or {}).items():
                        crosscheck.setdefault((row, system), []).append(res)
                        print(f"round {r + 1} {system:5} {row:24} {res.get('throughput_ops', 0):10.0f} ops/s"
                              f" (etcd's benchmark tool)", file=sys.stderr)
                    binary = etcd if system == "etcd" else CAIRN
                    streams.run_rows(system, r, srv, lambda: Server(system, binary, work), bench, a.quick, wanted,
                                     results, lambda line: print(line, file=sys.stderr))
                    resources[system].append({"start_ms": srv.start_ms, "idle_rss_kib": srv.idle_rss,
                                              "loaded_rss_kib": rss_kib(srv.proc.pid)})
                finally:
                    srv.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    fs_after = fdatasync_latency()
    write_report(a, results, resources, crosscheck, fs_before, fs_after, etcd, etcd_version, rounds, prefixes)


def summarize(results, row, system):
    runs = [x for x in results.get((row, system), []) if "throughput_ops" in x]
    failed = any(x.get("errors", 0) > 0 or "error" in x for x in results.get((row, system), []))
    if not runs or failed:
        return None
    out = {"ops": median([x["throughput_ops"] for x in runs]), "p99": median([x["latency_us"]["p99"] for x in runs])}
    cpu = [x["server_cpu_us"] + x["client_cpu_us"] for x in runs if "server_cpu_us" in x]
    if cpu:
        out["cpu_us"] = median(cpu)
        out["server_cpu_us"] = median([x["server_cpu_us"] for x in runs if "server_cpu_us" in x])
    busy = [x["machine_busy"] for x in runs if "machine_busy" in x]
    if busy:
        out["busy"] = median(busy)
    return out


def write_report(a, results, resources, crosscheck, fs_before, fs_after, etcd, etcd_version, rounds, prefixes):
    day = datetime.date.today().isoformat()
    out_dir = tempfile.mkdtemp(prefix="cairn-compare-report-") if a.quick else a.out
    os.makedirs(out_dir, exist_ok=True)
    stem = "-".join([day] + ["".join(c for c in p.lower() if c.isalnum()) for p in prefixes])
    md_path, png_path = os.path.join(out_dir, f"{stem}.md"), os.path.join(out_dir, f"{stem}.png")
    lines = [f"# cairn vs etcd, {day}", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} cores, Linux {platform.release()}; "
             f"loopback, single member each, fsync on. etcd: {etcd_version} (`{etcd}`); cairn: `{CAIRN}`.",
             f"Medians of {rounds} rounds; each round starts both systems fresh, alternating which goes first. "
             f"Client: `cairn bench` (key 8 B, value 256 B unless the row says otherwise).",
             f"Raw fdatasync before: p50 {fs_before['p50_us']} µs, p99 {fs_before['p99_us']} µs; "
             f"after: p50 {fs_after['p50_us']} µs, p99 {fs_after['p99_us']} µs."]
    if any((row, s) in results for row, _ in MATRIX for s in ("etcd", "cairn")):
        lines += ["", "| workload | etcd ops/s | cairn ops/s | cairn/etcd | etcd p99 µs | cairn p99 µs |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
    ratios = []
    for row, _ in MATRIX:
        if (row, "etcd") not in results and (row, "cairn") not in results:
            continue  # not selected by --rows
        e, c = summarize(results, row, "etcd"), summarize(results, row, "cairn")
        if e and c:
            ratio = c["ops"] / e["ops"]
            ratios.append((row, ratio))
            lines.append(f"| {row} | {e['ops']:.0f} | {c['ops']:.0f} | {ratio:.2f} | {e['p99']:.0f} | {c['p99']:.0f} |")
        else:
            why = lambda s: next(filter(None, map(streams.failure, results.get((row, s), []))), "no result")
            ops = lambda x, s: f"{x['ops']:.0f}" if x else f"n/a ({why(s)})"
            p99 = lambda x: f"{x['p99']:.0f}" if x else "n/a"
            lines.append(f"| {row} | {ops(e, 'etcd')} | {ops(c, 'cairn')} | n/a | {p99(e)} | {p99(c)} |")
    lines += tool_section(crosscheck, rounds) if crosscheck or not prefixes else []
    stream_lines, stream_ratios = streams.section(results, rounds)
    lines += stream_lines
    ratios += stream_ratios
    lines += ["", "Resources (medians):", "", "| | start to healthy ms | idle RSS MiB | RSS after the matrix MiB | binary MB |",
              "| --- | ---: | ---: | ---: | ---: |"]
    for system, binary in [("etcd", etcd), ("cairn", CAIRN)]:
        rs = resources[system]
        size = os.path.getsize(binary) / 1e6
        lines.append(f"| {system} | {median([x['start_ms'] for x in rs]):.0f} | {median([x['idle_rss_kib'] for x in rs]) / 1024:.1f} | "
                     f"{median([x['loaded_rss_kib'] for x in rs]) / 1024:.1f} | {size:.1f} |")
    lines += ["", f"![cairn/etcd throughput ratios]({stem}.png)", ""] if ratios else [""]
    with open(md_path, "w") as f:
        f.write("\n".join(lines))
    if ratios:
        chart(ratios, png_path, day)
    print("\n".join(lines))
    print(f"\nwrote {md_path}" + (f" and {png_path}" if ratios else ""), file=sys.stderr)


def tool_section(crosscheck, rounds):
    """The issue's rows measured with etcd's `benchmark` tool, with CPU per request on each side."""
    if not crosscheck:
        return ["", "etcd's `benchmark` tool is not built (../shared/peers/build-etcd.sh): its rows were skipped."]
    lines = ["", f"The same rows with etcd's own `benchmark` tool (medians of {rounds}). CPU is per request, "
             "in µs: the server's from /proc, the tool's from its rusage. The tool shares the machine's cores, "
             "so the ratio any server can reach on a CPU-bound row is at most (etcd server + tool) / tool.", "",
             "| workload | etcd ops/s | cairn ops/s | cairn/etcd | etcd p99 µs | cairn p99 µs "
             "| server CPU etcd → cairn | tool CPU vs etcd → vs cairn |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row, _ in TOOL_ROWS:
        m = {}
        for system in ("etcd", "cairn"):
            runs = [x for x in crosscheck.get((row, system), []) if "throughput_ops" in x]
            if runs:
                m[system] = {k: median([x[k] for x in runs]) for k in runs[0]}
        if len(m) < 2:
            lines.append(f"| {row} | n/a | n/a | n/a | n/a | n/a | n/a | n/a |")
            continue
        e, c = m["etcd"], m["cairn"]
        lines.append(f"| {row} | {e['throughput_ops']:.0f} | {c['throughput_ops']:.0f} | "
                     f"{c['throughput_ops'] / e['throughput_ops']:.2f} | {e.get('p99_us', 0):.0f} | {c.get('p99_us', 0):.0f} | "
                     f"{e['server_cpu_us']:.1f} → {c['server_cpu_us']:.1f} | {e['client_cpu_us']:.1f} → {c['client_cpu_us']:.1f} |")
    return lines


def chart(ratios, path, day):
    try:
        import matplotlib
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "matplotlib"], check=True)
        import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [r for r, _ in ratios]
    values = [v for _, v in ratios]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(names) + 1.5))
    ax.barh(names, values, color=["#2a7" if v >= 1 else "#c44" for v in values])
    ax.axvline(1.0, color="black", linewidth=1)
    ax.axvline(2.0, color="gray", linewidth=1, linestyle="--")
    ax.invert_yaxis()
    ax.set_xlabel("throughput, cairn / etcd (medians; >1 means cairn is faster)")
    ax.set_title(f"cairn vs etcd on this machine, {day}")
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:.2f}", va="center")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---------------------------------------------------------------------------------------------
# Cluster mode (--members N > 1): N members of each system on loopback, the cluster rows.

ETCDCTL = os.path.join(ETCD_BUILT, "etcdctl") if os.path.exists(os.path.join(ETCD_BUILT, "etcdctl")) else "/usr/bin/etcdctl"

# (id, where the clients go, cairn bench arguments). "leader": every request to the leader
# (--target-leader); "spread": clients split evenly over all members (see bench_spread).
# Totals are sized so 3 rounds of both systems fit in ~15 minutes on 2 cores; --quick divides by 20.
CLUSTER_MATRIX = [
    ("C-W1 put 1 client, leader", "leader", ["--conns", "1", "--clients", "1", "--sequential-keys", "--total", "4000", "put"]),
    ("C-W2 put 100 clients, leader", "leader", ["--conns", "10", "--clients", "100", "--total", "30000", "put"]),
    ("C-W3 put 1,000 clients, leader", "leader", ["--conns", "100", "--clients", "1000", "--total", "40000", "put"]),
    ("C-R-l range 100 clients, all", "spread", ["--conns", "10", "--clients", "100", "--total", "60000", "range", "foo", "--consistency", "l"]),
    ("C-R-l range 1,000 clients, all", "spread", ["--conns", "100", "--clients", "1000", "--total", "60000", "range", "foo", "--consistency", "l"]),
    ("C-R-s range 100 clients, all", "spread", ["--conns", "10", "--clients", "100", "--total", "60000", "range", "foo", "--consistency", "s"]),
    ("C-R-s range 1,000 clients, all", "spread", ["--conns", "100", "--clients", "1000", "--total", "60000", "range", "foo", "--consistency", "s"]),
]
# The floor of a read: one client, serializable, one member, so no Raft and no disk.
GRPC_RTT = ["--conns", "1", "--clients", "1", "--total", "3000", "range", "foo", "--consistency", "s"]


def arg_value(args, flag):
    return int(args[args.index(flag) + 1])


def with_arg(args, flag, value):
    args = list(args)
    args[args.index(flag) + 1] = str(value)
    return args


def scale_quick(args):
    """--quick: totals / 20, but at least two requests per client."""
    clients = arg_value(args, "--clients") if "--clients" in args else 1
    return with_arg(args, "--total", max(100, 2 * clients, arg_value(args, "--total") // 20))


def run_benches(cmds, timeout=600):
    """Runs `cairn bench --json` command lines at once; one result (or error) dict for each."""
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in cmds]
    deadline, outs = time.time() + timeout, []
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            outs.append({"error": "timed out"})
            continue
        # A run with failed requests exits 1 after printing its record: keep its error counts.
        if p.returncode != 0 and not out.startswith("{"):
            outs.append({"error": err.strip()[-300:]})
            continue
        try:
            doc = json.loads(out)
        except ValueError:
            outs.append({"error": f"unparsable output: {out[-200:]}"})
            continue
        res = doc["results"]
        res["endpoint"] = doc.get("endpoint")
        outs.append(res)
    return outs


def bench_leader(endpoints, args, quick):
    if quick:
        args = scale_quick(args)
    res = run_benches([[CAIRN, "bench", "--endpoints", ",".join(endpoints), "--target-leader", "--json"] + args])[0]
    res["endpoints_used"] = [res.get("endpoint")]
    return res


def bench_spread(endpoints, args, quick):
    """Clients spread evenly over every member. `cairn bench` opens all its connections to one
    endpoint (the first it is given), so this runs one `cairn bench` per member at once, each with
    its share of clients, connections and requests, and each given every endpoint with its own
    member first. Throughput is all successful requests over the longest run; p99 is the worst
    of the runs' p99s (the tool reports percentiles, not histograms, so they cannot be merged)."""
    if quick:
        args = scale_quick(args)
    n = len(endpoints)
    clients, conns, total = arg_value(args, "--clients"), arg_value(args, "--conns"), arg_value(args, "--total")
    cmds = []
    for i in range(n):
        share = lambda x: x // n + (1 if i < x % n else 0)
        part = with_arg(with_arg(with_arg(args, "--clients", max(1, share(clients))), "--conns", max(1, share(conns))),
                        "--total", max(1, share(total)))
        mine = endpoints[i:] + endpoints[:i]
        cmds.append([CAIRN, "bench", "--endpoints", ",".join(mine), "--json"] + part)
    runs = run_benches(cmds)
    bad = [r for r in runs if "error" in r]
    if bad:
        return {"error": bad[0]["error"]}
    ok = sum(r["ok"] for r in runs)
    secs = max(r["total_secs"] for r in runs)
    return {"throughput_ops": ok / max(secs, 1e-9), "ok": ok, "errors": sum(r["errors"] for r in runs),
            "total_secs": secs, "latency_us": {"p99": max(r["latency_us"]["p99"] for r in runs),
                                               "p50": max(r["latency_us"]["p50"] for r in runs)},
            "endpoints_used": [r.get("endpoint") for r in runs]}


def tcp_round_trip(n=5000):
    """A 1-byte ping-pong over loopback TCP between two Python threads: the transport's floor."""
    import threading
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(10)

    def echo():
        try:
            conn, _ = srv.accept()
        except OSError:
            return
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while True:
                b = conn.recv(1)
                if not b:
                    return
                conn.sendall(b)

    t = threading.Thread(target=echo, daemon=True)
    t.start()
    lat = []
    with socket.create_connection(srv.getsockname(), timeout=10) as c:
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(n):
            s = time.perf_counter()
            c.sendall(b"x")
            c.recv(1)
            lat.append((time.perf_counter() - s) * 1e6)
    t.join(timeout=10)
    srv.close()
    lat.sort()
    return {"p50_us": round(lat[len(lat) // 2]), "p99_us": round(lat[int(len(lat) * 0.99)])}


class Cluster:
    """N members of one system on loopback ports, fresh data dirs, each stopped by its PID."""

    def __init__(self, system, binary, work, n, extra=()):
        self.system = system
        used, ports = set(), []
        while len(ports) < 2 * n:
            p = free_port()
            if p not in used:
                used.add(p)
                ports.append(p)
        self.names = [f"m{i + 1}" for i in range(n)]
        self.endpoints = [f"127.0.0.1:{ports[2 * i]}" for i in range(n)]
        peers = [f"http://127.0.0.1:{ports[2 * i + 1]}" for i in range(n)]
        initial = ",".join(f"{m}={p}" for m, p in zip(self.names, peers))
        token = f"compare-{system}-{os.getpid()}-{time.time_ns()}"
        self.base = tempfile.mkdtemp(prefix=f"{system}-cluster-", dir=work)
        self.procs, self.logs = [], []
        started = time.perf_counter()
        try:
            for name, ep, peer in zip(self.names, self.endpoints, peers):
                url = f"http://{ep}"
                cmd = ([binary, "serve"] if system.startswith("cairn") else [binary]) + list(extra) + [
                    "--name", name, "--data-dir", os.path.join(self.base, name),
                    "--listen-client-urls", url, "--advertise-client-urls", url,
                    "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                    "--initial-cluster", initial, "--initial-cluster-state", "new", "--initial-cluster-token", token]
                log = open(os.path.join(self.base, f"{name}.log"), "w")
                self.logs.append(log)
                self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL))
            self.leader = self.wait_leader(30)
        except BaseException:
            self.stop()
            raise
        self.start_ms = (time.perf_counter() - started) * 1000
        time.sleep(1)
        self.idle_rss = [rss_kib(p.pid) for p in self.procs]

    def status(self):
        """{endpoint: (member_id, leader_id)} of the members that answer."""
        try:
            out = subprocess.run([ETCDCTL, "--endpoints", ",".join(self.endpoints), "--dial-timeout=1s",
                                  "--command-timeout=2s", "endpoint", "status", "-w", "json"],
                                 capture_output=True, text=True, timeout=15, env=dict(os.environ, ETCDCTL_API="3"))
            docs = json.loads(out.stdout or "[]")
        except (subprocess.TimeoutExpired, ValueError):
            return {}
        return {d["Endpoint"]: (d["Status"]["header"]["member_id"], d["Status"].get("leader", 0)) for d in docs}

    def wait_leader(self, seconds):
        """The endpoint of the leader, once every member answers and all name the same member."""
        deadline = time.time() + seconds
        while time.time() < deadline:
            dead = [n for n, p in zip(self.names, self.procs) if p.poll() is not None]
            if dead:  # the logs go with the data on stop: quote the first one
                why = locate.tail(os.path.join(self.base, f"{dead[0]}.log"))
                raise RuntimeError(f"{self.system} members {dead} exited; {dead[0]}'s log ends:\n{why}")
            st = self.status()
            if len(st) == len(self.endpoints):
                leaders = {lead for _, lead in st.values()}
                ids = {mid: ep for ep, (mid, _) in st.items()}
                if len(leaders) == 1 and next(iter(leaders)) in ids:
                    return ids[next(iter(leaders))]
            time.sleep(0.1)
        raise RuntimeError(f"{self.system}: no leader after {seconds} s")

    def leader_now(self):
        st = self.status()
        ids = {mid: ep for ep, (mid, _) in st.items()}
        leads = [lead for _, lead in st.values() if lead in ids]
        return ids[max(set(leads), key=leads.count)] if leads else None

    def stop(self):
        """SIGTERM every member, SIGKILL any still running 10 s later; then delete the data."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.time() + 10
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
        for log in self.logs:
            log.close()
        shutil.rmtree(self.base, ignore_errors=True)


def machine_ticks():
    """The machine's CPU time so far from /proc/stat: (busy, total), in clock ticks. Idle and
    iowait are not busy: a core waiting on the disk is free to run anything else."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    total = sum(fields[:8])
    return total - fields[3] - fields[4], total


def measured_cpu(cl, run):
    """Runs one row and adds what it cost in CPU: the members' (all of them) and the bench
    clients', in µs per successful request, and how busy the whole machine was (which also
    counts what no process is charged for: the kernel's network processing in softirq and its
    threads, such as the journal's)."""
    import resource
    before = sum(cpu_seconds(p.pid) for p in cl.procs)
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    client_before = ru.ru_utime + ru.ru_stime
    busy_before, total_before = machine_ticks()
    res = run()
    busy_after, total_after = machine_ticks()
    server = sum(cpu_seconds(p.pid) for p in cl.procs) - before
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    client = ru.ru_utime + ru.ru_stime - client_before
    ops = res.get("ok", 0)
    if ops:
        res["server_cpu_us"], res["client_cpu_us"] = server * 1e6 / ops, client * 1e6 / ops
    if total_after > total_before:
        res["machine_busy"] = (busy_after - busy_before) / (total_after - total_before)
    return res


# cairn with linearizable reads by lease: the matrix's linearizable read rows only.
LEASE_ROWS = [(row.replace("C-R-l", "C-R-lease"), where, args) for row, where, args in CLUSTER_MATRIX
              if row.startswith("C-R-l ")]


def run_system_round(a, r, system, binary, work, results, rtt, resources):
    n = a.members
    extra = ["--read-mode", "lease"] if system == "cairn-lease" else []
    cl = Cluster(system, binary, work, n, extra)
    print(f"round {r + 1} {system:5} {n} members up in {cl.start_ms:.0f} ms, leader {cl.leader}", file=sys.stderr)
    try:
        subprocess.run([CAIRN, "bench", "--endpoints", ",".join(cl.endpoints), "--target-leader",
                        "--total", "1", "put"], capture_output=True, timeout=60)
        for row, where, args in (LEASE_ROWS if system == "cairn-lease" else CLUSTER_MATRIX):
            if not row_wanted(a, row):
                continue
            res = measured_cpu(cl, lambda: (bench_leader if where == "leader" else bench_spread)(
                cl.endpoints, args, a.quick))
            results.setdefault((row, system), []).append(res)
            print(f"round {r + 1} {system:5} {row:32} {res.get('throughput_ops', 0):10.0f} ops/s"
                  f" p99 {res.get('latency_us', {}).get('p99', '-')} µs errors {res.get('errors', '-')}"
                  f" via {res.get('endpoints_used')} {res.get('error', '')}", file=sys.stderr)
        if system == "cairn-lease":
            return
        leader = cl.leader_now() or cl.leader
        res = run_benches([[CAIRN, "bench", "--endpoints", leader, "--json"]
                           + (scale_quick(GRPC_RTT) if a.quick else GRPC_RTT)])[0]
        rtt.setdefault(system, []).append(res)
        resources[system].append({
            "start_ms": cl.start_ms, "leader": cl.names[cl.endpoints.index(leader)],
            "idle_rss_kib": cl.idle_rss, "loaded_rss_kib": [rss_kib(p.pid) for p in cl.procs],
            "leader_changed": leader != cl.leader})
    finally:
        cl.stop()


def run_cluster(a, etcd, etcd_version):
    n, rounds = a.members, 1 if a.quick else a.rounds
    work = tempfile.mkdtemp(prefix="cairn-compare-")
    fs_before, tcp = fdatasync_latency(), tcp_round_trip()
    fs_before["quorum"] = quorum_fdatasync_latency(n)
    floor_bin = build_replicated_floor()
    fs_before["replicated"] = replicated_floor(floor_bin, n)
    results, rtt = {}, {}  # (row, system) -> list of result dicts; system -> list of results
    resources = {"etcd": [], "cairn": []}
    t0 = time.time()
    try:
        for r in range(rounds):
            order = ["etcd", "cairn", "cairn-lease"] if r % 2 == 0 else ["cairn-lease", "cairn", "etcd"]
            if not any(row_wanted(a, row) for row, _, _ in LEASE_ROWS):
                order.remove("cairn-lease")
            for system in order:
                run_system_round(a, r, system, etcd if system == "etcd" else CAIRN, work, results, rtt, resources)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"matrix took {time.time() - t0:.0f} s", file=sys.stderr)
    fs_after = fdatasync_latency()
    fs_after["quorum"] = quorum_fdatasync_latency(n)
    fs_after["replicated"] = replicated_floor(floor_bin, n)
    write_cluster_report(a, results, rtt, resources, fs_before, fs_after, tcp, etcd, etcd_version, rounds)


def write_cluster_report(a, results, rtt, resources, fs_before, fs_after, tcp, etcd, etcd_version, rounds):
    n = a.members
    day = datetime.date.today().isoformat()
    out_dir = tempfile.mkdtemp(prefix="cairn-compare-report-") if a.quick else a.out
    os.makedirs(out_dir, exist_ok=True)
    stem = f"{day}-{n}members"
    md_path, png_path = os.path.join(out_dir, f"{stem}.md"), os.path.join(out_dir, f"{stem}.png")
    lines = [f"# cairn vs etcd, {n}-member clusters, {day}", "",
             f"Machine: {platform.machine()}, {os.cpu_count()} cores, Linux {platform.release()}; "
             f"all {n} members of a cluster on this machine, on loopback, fsync on. "
             f"etcd: {etcd_version} (`{etcd}`); cairn: `{CAIRN}`.",
             f"Medians of {rounds} rounds; each round starts both clusters fresh (new data dirs), alternating which "
             f"goes first. Client: `cairn bench` (key 8 B, value 256 B). \"leader\" rows send every request to the "
             f"leader (`--target-leader`); \"all\" rows split clients, connections and requests evenly over the {n} "
             f"members, one `cairn bench` per member run at once: throughput is their successful requests over the "
             f"longest run, p99 the worst of their p99s.", "",
             "Floors on this machine:", "",
             f"- disk fdatasync (256 B appends): before p50 {fs_before['p50_us']} µs, p99 {fs_before['p99_us']} µs; "
             f"after p50 {fs_after['p50_us']} µs, p99 {fs_after['p99_us']} µs",
             f"- a quorum of {n} concurrent fdatasyncs on this one disk ({n} writers append 256 B and sync at once; "
             f"done when {n // 2 + 1} are): before p50 {fs_before['quorum']['p50_us']} µs, "
             f"p99 {fs_before['quorum']['p99_us']} µs; after p50 {fs_after['quorum']['p50_us']} µs, "
             f"p99 {fs_after['quorum']['p99_us']} µs. With the gRPC and peer round trips below, this bounds a "
             f"1-client put: at best 1 / (gRPC RTT + peer RTT + quorum fdatasync) per second",
             f"- loopback TCP round trip (1-byte ping-pong, Python): p50 {tcp['p50_us']} µs, p99 {tcp['p99_us']} µs"]
    floors = [f["replicated"] for f in (fs_before, fs_after) if f.get("replicated")]
    if floors:
        lines.append(
            f"- **a 1-client put, end to end** (`replicated_floor`: a client, a leader and {n - 1} followers as "
            f"plain threads over loopback TCP, each fdatasyncing a preallocated log, answered at a quorum; no "
            f"encoding, consensus or store): before and after "
            + "; ".join(f"{f['ops']} ops/s, p50 {f['p50_us']} µs, p99 {f['p99_us']} µs" for f in floors)
            + ". The sum of the parts above is a looser bound: measured apart, each part pays its own wakeups.")
    for system in ("etcd", "cairn"):
        runs = [x for x in rtt.get(system, []) if "throughput_ops" in x and not x.get("errors")]
        if runs:
            lines.append(f"- gRPC round trip to {system} (serializable range, 1 client, the leader): "
                         f"p50 {median([x['latency_us']['p50'] for x in runs]):.0f} µs, "
                         f"p99 {median([x['latency_us']['p99'] for x in runs]):.0f} µs, "
                         f"{median([x['throughput_ops'] for x in runs]):.0f} ops/s")
        else:
            lines.append(f"- gRPC round trip to {system}: failed")
    cores = os.cpu_count()
    lines += ["", f"CPU µs/req is what the {n} members and the bench clients together spent per successful "
              f"request (server part in brackets); the CPU floor is {cores} cores divided by it, the most a row "
              f"can do on this machine at that cost. Machine busy is the share of the {cores} cores busy "
              f"during cairn's run, counting what no process is charged for (the kernel's network "
              f"processing in softirq, its journal thread); a row near 100% is bound by the cores whatever "
              f"the CPU floor says.", "",
              "| workload | etcd ops/s | cairn ops/s | cairn/etcd | etcd p99 µs | cairn p99 µs "
              "| etcd CPU µs/req | cairn CPU µs/req | cairn CPU floor ops/s | cairn machine busy |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    ratios = []
    cell = lambda s, k, fmt="{:.0f}": fmt.format(s[k]) if s and k in s else "n/a" if s else "failed"
    cpu = lambda s: f"{s['cpu_us']:.0f} ({s['server_cpu_us']:.0f})" if s and "cpu_us" in s else "n/a"
    floor = lambda s: f"{cores * 1e6 / s['cpu_us']:.0f}" if s and s.get("cpu_us") else "n/a"
    busy = lambda s: f"{100 * s['busy']:.0f}%" if s and "busy" in s else "n/a"
    for row, _, _ in CLUSTER_MATRIX + LEASE_ROWS:
        if not row_wanted(a, row):
            continue
        lease = row.startswith("C-R-lease")
        e = summarize(results, row.replace("C-R-lease", "C-R-l"), "etcd")
        c = summarize(results, row, "cairn-lease" if lease else "cairn")
        ratio = f"{c['ops'] / e['ops']:.2f}" if e and c else "n/a"
        if e and c:
            ratios.append((row, c["ops"] / e["ops"]))
        shown = row + (" (cairn `--read-mode lease`; etcd: its ReadIndex row)" if lease else "")
        lines.append(f"| {shown} | {cell(e, 'ops')} | {cell(c, 'ops')} | {ratio} | {cell(e, 'p99')} "
                     f"| {cell(c, 'p99')} | {cpu(e)} | {cpu(c)} | {floor(c)} | {busy(c)} |")
    w1 = next((row for row, _, _ in CLUSTER_MATRIX if row.startswith("C-W1")), None)
    c1, e1 = summarize(results, w1, "cairn"), summarize(results, w1, "etcd")
    if floors and c1 and e1:
        best = median([f["ops"] for f in floors])
        lines += ["", f"C-W1 against the end-to-end floor ({best:.0f} ops/s, the median of the measurements "
                  f"above): cairn {100 * c1['ops'] / best:.0f}%, etcd {100 * e1['ops'] / best:.0f}%."]
    failures = [(row, s, x["error"]) for (row, s), xs in results.items() for x in xs if "error" in x]
    failures += [(row, s, f"{x['errors']} failed requests") for (row, s), xs in results.items() for x in xs if x.get("errors")]
    if failures:
        lines += ["", "Failures:", ""] + [f"- {s} {row}: {why}" for row, s, why in failures[:20]]
    lines += ["", "Resources: start to leader elected, and each member's RSS (MiB; medians of the rounds; "
              "the leader named is the last round's, after the matrix).", "",
              "| | start to leader ms | leader | idle RSS MiB per member | RSS after the run MiB per member | total after MiB |",
              "| --- | ---: | --- | --- | --- | ---: |"]
    for system in ("etcd", "cairn"):
        rs = resources[system]
        if not rs:
            lines.append(f"| {system} | n/a | n/a | n/a | n/a | n/a |")
            continue
        per = lambda k: [median([x[k][i] for x in rs]) / 1024 for i in range(n)]
        idle, loaded = per("idle_rss_kib"), per("loaded_rss_kib")
        names = [f"m{i + 1}" for i in range(n)]
        lines.append(f"| {system} | {median([x['start_ms'] for x in rs]):.0f} | {rs[-1]['leader']} | "
                     + ", ".join(f"{m} {v:.1f}" for m, v in zip(names, idle)) + " | "
                     + ", ".join(f"{m} {v:.1f}" for m, v in zip(names, loaded)) + f" | {sum(loaded):.1f} |")
    changed = [s for s in ("etcd", "cairn") for x in resources[s] if x["leader_changed"]]
    if changed:
        lines += ["", f"The leader changed during a run for: {', '.join(changed)}."]
    lines += ["", f"![cairn/etcd throughput ratios]({stem}.png)", ""]
    with open(md_path, "w") as f:
        f.write("\n".join(lines))
    if ratios:
        chart(ratios, png_path, f"{day}, {n} members")
    print("\n".join(lines))
    print(f"\nwrote {md_path}" + (f" and {png_path}" if ratios else ""), file=sys.stderr)


if __name__ == "__main__":
    main()
