"""The watch and lease rows of compare.py (single member): watch latency, watch fan-out, memory
per idle watcher, lease grant+revoke and keepalive, each measured with `cairn bench` against a
server whose pid is known, so the tool reads the server's VmRSS from /proc (`--server-pid`) and
this module adds the CPU each side spent (the server's from /proc/<pid>/stat, the bench
client's from rusage).

A row that fails for one system (cairn answers Lease RPCs Unimplemented until it serves them)
is reported as n/a with the error, and the other system's numbers still stand.
"""

import os
import resource
import statistics

# (id, kind, cairn bench arguments, needs a fresh server). Totals and idle watchers are scaled
# down by --quick. Idle memory is read on a server of its own, started for the row: a server
# that ran other rows first may have free heap the new watchers fit in, which would hide them.
ROWS = [
    ("WL watch latency", "latency", ["--total", "2000", "watch-latency"], False),
    ("WL watch fan-out 10", "fanout", ["--total", "2000", "watch", "--watchers", "10"], False),
    # etcd's `benchmark watch` defaults: 10 streams of 100 watchers.
    ("WL watch fan-out 1,000", "fanout",
     ["--conns", "10", "--total", "1000", "watch", "--watchers", "1000", "--streams", "10"], False),
    ("WL idle watchers 10,000", "idle",
     ["--conns", "10", "watch-idle", "--watchers", "10000", "--streams", "100", "--hold-secs", "3"], True),
    ("WL idle watchers 10,000 on one stream", "idle",
     ["--conns", "10", "watch-idle", "--watchers", "10000", "--streams", "1", "--hold-secs", "3"], True),
    # What watchers that match nothing cost writes: the same puts without and with them.
    ("WL put 100 clients, no watchers", "kv",
     ["--conns", "10", "--clients", "100", "--total", "20000", "put"], False),
    ("WL put 100 clients, 10,000 idle watchers", "kv",
     ["--conns", "10", "--clients", "100", "--total", "20000", "--idle-watchers", "10000", "put"], False),
    ("LS lease grant+revoke 100 clients", "ops",
     ["--conns", "10", "--clients", "100", "--total", "5000", "lease-grant-revoke"], False),
    ("LS lease keepalive 100 streams", "ops",
     ["--conns", "10", "--clients", "100", "--total", "50000", "lease-keepalive"], False),
]

# The targets, as a bound on cairn/etcd of a row's headline measure.
AT_MOST, AT_LEAST = "at most", "at least"


def cpu_seconds(pid):
    """User plus system CPU a process has used so far (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scaled(args, quick):
    """--quick: totals / 20 (at least 100) and thousands of watchers / 20."""
    if not quick:
        return list(args)
    out = []
    for prev, a in zip([""] + list(args), args):
        if prev == "--total":
            a = str(max(100, int(a) // 20))
        elif prev in ("--watchers", "--idle-watchers") and int(a) >= 5000:
            a = str(int(a) // 20)
        elif prev == "--hold-secs":
            a = "1"
        out.append(a)
    return out


def run_row(bench, endpoint, pid, args, quick):
    """One row against a running server: the tool's results plus server and client CPU."""
    before, ru = cpu_seconds(pid), resource.getrusage(resource.RUSAGE_CHILDREN)
    res = bench(endpoint, ["--server-pid", str(pid)] + scaled(args, quick), False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    res["server_cpu_s"] = cpu_seconds(pid) - before
    res["client_cpu_s"] = (after.ru_utime + after.ru_stime) - (ru.ru_utime + ru.ru_stime)
    return res


def run_rows(system, r, srv, fresh_server, bench, quick, wanted, results, log):
    """Runs the rows `wanted` selects for one system in round `r`: the others on `srv`, each
    that needs a fresh server on one `fresh_server()` starts (and stops) for it. Results go to
    results[(row, system)]; a row that fails is recorded with its error, never raised."""
    for row, kind, args, fresh in ROWS:
        if not wanted(row):
            continue
        own = fresh_server() if fresh else None
        try:
            s = own or srv
            res = run_row(bench, s.endpoint, s.proc.pid, args, quick)
        finally:
            if own:
                own.stop()
        results.setdefault((row, system), []).append(res)
        head = MEASURES[kind][0 if kind != "latency" else 1]
        value, why = measure([res], head[1])
        shown = (head[2].format(value) if value is not None else f"n/a ({why})")
        log(f"round {r + 1} {system:5} {row:34} {head[0]}: {shown}")


def failure(res):
    """Why a run does not count, or None."""
    if "error" in res:
        return res["error"].splitlines()[-1] if res["error"] else "failed"
    if res.get("errors"):
        kinds = res.get("error_kinds") or {}
        top = max(kinds, key=kinds.get) if kinds else "errors"
        return f"{res['errors']} of {res.get('requests', '?')} failed: {top}"
    return None


def _extra(k, scale=1.0):
    return lambda r: r["extra"][k] * scale if k in r.get("extra", {}) else None


def _per_event(k):
    return lambda r: r[k] * 1e6 / r["extra"]["events_delivered"] if r.get("extra", {}).get("events_delivered") else None


def _before_ack(r):
    return 100.0 * r["extra"]["events_before_ack"] / r["ok"] if r.get("ok") and "events_before_ack" in r.get("extra", {}) else None


# kind -> [(measure, extractor, format, target or None)]; the first with a target is the
# row's headline (and, for throughputs, its bar in the chart).
MEASURES = {
    "latency": [
        ("put acknowledged → event, p50 µs", lambda r: r["latency_us"]["p50"], "{:.0f}", None),
        ("put acknowledged → event, p99 µs", lambda r: r["latency_us"]["p99"], "{:.0f}", (AT_MOST, 1.0)),
        ("events that arrived before their put's ack, %", _before_ack, "{:.0f}", None),
        ("put sent → event, p50 µs (etcd benchmark's measure)", _extra("put_to_event_p50_us"), "{:.0f}", None),
        ("put sent → event, p99 µs", _extra("put_to_event_p99_us"), "{:.0f}", None),
    ],
    "fanout": [
        ("events delivered/s", _extra("events_per_sec"), "{:.0f}", (AT_LEAST, 2.0)),
        ("server RSS peak MiB", _extra("server_rss_peak_kib", 1 / 1024), "{:.1f}", None),
        ("server CPU µs/event", _per_event("server_cpu_s"), "{:.2f}", None),
        ("bench client CPU µs/event", _per_event("client_cpu_s"), "{:.2f}", None),
    ],
    "idle": [
        ("server RSS growth per idle watcher, bytes", _extra("bytes_per_watcher"), "{:.0f}", (AT_MOST, 0.1)),
        ("server RSS before → with the watchers, MiB",
         lambda r: (r["extra"]["idle_rss_before_kib"] / 1024, r["extra"]["idle_rss_after_kib"] / 1024)
         if "idle_rss_after_kib" in r.get("extra", {}) else None, "{:.1f} → {:.1f}", None),
        ("watchers created/s", lambda r: r["throughput_ops"], "{:.0f}", None),
    ],
    "kv": [
        ("ops/s", lambda r: r["throughput_ops"], "{:.0f}", None),
        ("p99 µs", lambda r: r["latency_us"]["p99"], "{:.0f}", None),
    ],
    "ops": [
        ("ops/s", lambda r: r["throughput_ops"], "{:.0f}", (AT_LEAST, 2.0)),
        ("p99 µs", lambda r: r["latency_us"]["p99"], "{:.0f}", None),
        ("server CPU µs/op", lambda r: r["server_cpu_s"] * 1e6 / r["ok"] if r.get("ok") else None, "{:.1f}", None),
    ],
}


def _median(values):
    if isinstance(values[0], tuple):
        return tuple(statistics.median(v) for v in zip(*values))
    return statistics.median(values)


def measure(runs, fn):
    """The median of a measure over a system's runs, or (None, why) when a run failed."""
    why = next((w for w in map(failure, runs) if w), None)
    if why or not runs:
        return None, why or "not run"
    values = [v for v in (fn(r) for r in runs) if v is not None]
    return (_median(values), None) if values else (None, "not reported")


def section(results, rounds):
    """The report's lines for the rows that ran; and the chart's throughput ratios."""
    ran = [r for r in ROWS if (r[0], "etcd") in results or (r[0], "cairn") in results]
    if not ran:
        return [], []
    lines = ["", f"Watch and lease rows (medians of {rounds}; `cairn bench` with `--server-pid`, so RSS is the "
             "server's VmRSS). Latency: one watcher, one writer of sequential puts on the same connection; an "
             "event that arrives before its put's ack counts 0. Fan-out: one writer of sequential puts, events/s "
             "from the first put to the last event received; CPU per event delivered. Idle watchers: each on a "
             "key of its own, created one at a time per stream as etcd's clientv3 creates them, on a fresh server, RSS growth from before the first watcher (connections open) to "
             "3 s after the last, divided by the watchers; streams and their buffers are included. Lease "
             "grant+revoke: one op is a grant then a revoke. Targets are the issue's, on cairn/etcd.", "",
             "| workload | measure | etcd | cairn | cairn/etcd | issue's target |",
             "| --- | --- | ---: | ---: | ---: | --- |"]
    chart = []
    for row, kind, _, _ in ran:
        for i, (name, fn, fmt, target) in enumerate(MEASURES[kind]):
            e, e_why = measure(results.get((row, "etcd"), []), fn)
            c, c_why = measure(results.get((row, "cairn"), []), fn)
            # A failed run's error is shown once, on the row's first measure.
            e_why, c_why = (e_why, c_why) if i == 0 else ("" if e_why else None, "" if c_why else None)
            cell = lambda v, why: (fmt.format(*v) if isinstance(v, tuple) else fmt.format(v)) if v is not None \
                else f"n/a ({why})" if why else "n/a"
            both = e is not None and c is not None and not isinstance(e, tuple) and e > 0
            ratio = c / e if both else None
            goal = ""
            if target:
                goal = f"{target[0]} {target[1]:g}"
                if ratio is not None:
                    met = ratio <= target[1] if target[0] == AT_MOST else ratio >= target[1]
                    goal += ": met" if met else ": not met"
                    if target[0] == AT_LEAST:
                        chart.append((f"{row} ({name})", ratio))
            lines.append(f"| {row} | {name} | {cell(e, e_why)} | {cell(c, c_why)} | "
                         f"{'n/a' if ratio is None else f'{ratio:.2f}'} | {goal} |")
    return lines, chart
