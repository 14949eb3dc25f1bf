//! `cairn bench`: a benchmark tool that speaks the etcd v3 API, so one tool measures cairn and
//! etcd alike, plus an embedded mode that drives `cairn::Engine` in-process.
//!
//! `--clients` is real concurrency: each client is a task with one request in flight, spread over
//! `--conns` gRPC connections. Failed requests are counted and reported by kind, never skipped.

pub mod args;
mod etcd;
mod lease;
mod procfs;
pub mod report;
pub mod target;
#[cfg(test)]
mod tests;
mod watch;

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use args::{BenchArgs, Consistency, Output, Workload};
use indicatif::{ProgressBar, ProgressStyle};
use report::{Report, Tally};
use target::{Embedded, Grpc, Target};

/// Workload-specific counters of a run (watch events delivered, server RSS, ...).
pub(crate) type Extra = BTreeMap<&'static str, u64>;
/// What a workload on streams returns: its tally, its duration and its counters.
pub(crate) type Outcome = Result<(Tally, Duration, Extra), String>;

/// Why `cairn bench` fails once a run is over.
#[derive(Debug)]
pub enum BenchError {
    /// Requests failed: the report was printed, but the run does not count.
    Failed { failed: u64, requests: u64, most_common: String },
    /// The report could not be written (a reader that went away is not this).
    Output(std::io::Error),
}

impl std::fmt::Display for BenchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BenchError::Failed { failed, requests, most_common } => {
                write!(f, "{failed} of {requests} requests failed (most often: {most_common})")
            }
            BenchError::Output(e) => write!(f, "writing the report: {e}"),
        }
    }
}

impl std::error::Error for BenchError {}

/// Prints the report on standard output, then fails if any request failed.
pub fn print(report: &Report, output: Output, precise: bool) -> Result<(), BenchError> {
    write_report(&mut std::io::stdout().lock(), &report.render(output, precise))?;
    report.failure().map_or(Ok(()), Err)
}

/// Writes the report. A reader that closed its end (`cairn bench | head -1`) has all it
/// wanted: that ends the output quietly, as `yes | head` ends, not with a panic.
fn write_report(w: &mut impl Write, text: &str) -> Result<(), BenchError> {
    match w.write_all(text.as_bytes()).and_then(|()| w.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.map_err(BenchError::Output),
    }
}

/// Merges the clients' tallies; a client that panicked counts as a failed request, so the
/// requests it did not make cannot pass unnoticed.
pub(crate) async fn merge(tasks: Vec<tokio::task::JoinHandle<Tally>>) -> Tally {
    let mut tally = Tally::new();
    for t in tasks {
        match t.await {
            Ok(part) => tally.merge(part),
            Err(e) => tally.record(Duration::ZERO, Err(format!("client task failed: {e}"))),
        }
    }
    tally
}

/// What each request does, after presets are resolved.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Put,
    Range { serializable: bool },
    TxnPut,
    Mixed { read_ratio: f64 },
}

/// A small, fast generator; benchmarks need spread, not cryptographic quality.
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Keys of `size` bytes: the number `n` in decimal, zero-padded (sequential keys sort in order).
pub(crate) fn key(n: u64, size: usize) -> Vec<u8> {
    let s = format!("{n:0>size$}");
    s.as_bytes()[s.len().saturating_sub(size)..].to_vec()
}

/// Applies the T4 presets: their client counts and key sizes.
fn resolve(mut a: BenchArgs) -> (BenchArgs, Option<Op>) {
    let op = match a.workload.clone() {
        Workload::Put => Some(Op::Put),
        Workload::TxnPut => Some(Op::TxnPut),
        Workload::Range { consistency, .. } => {
            Some(Op::Range { serializable: consistency == Consistency::S })
        }
        Workload::Mixed { read_ratio } => Some(Op::Mixed { read_ratio }),
        Workload::SeqPut | Workload::ParPut | Workload::SeqGet | Workload::ParGet => {
            let par = matches!(a.workload, Workload::ParPut | Workload::ParGet);
            a.clients = if par { 16 } else { 1 };
            a.conns = a.conns.max(if par { 4 } else { 1 });
            a.key_size = 64;
            if matches!(a.workload, Workload::SeqPut) {
                a.sequential_keys = true;
            }
            if matches!(a.workload, Workload::SeqGet | Workload::ParGet) {
                a.key_space = if a.key_space == 0 { 1000 } else { a.key_space };
                Some(Op::Range { serializable: false })
            } else {
                Some(Op::Put)
            }
        }
        Workload::Watch { .. }
        | Workload::WatchLatency
        | Workload::WatchIdle { .. }
        | Workload::LeaseKeepalive
        | Workload::LeaseGrantRevoke => None,
    };
    (a, op)
}

fn params(a: &BenchArgs) -> std::collections::BTreeMap<&'static str, String> {
    let mut p = std::collections::BTreeMap::new();
    p.insert("conns", a.conns.to_string());
    p.insert("clients", a.clients.to_string());
    p.insert("total", a.total.to_string());
    p.insert("key_size", a.key_size.to_string());
    p.insert("value_size", a.value_size.to_string());
    p.insert("sequential_keys", a.sequential_keys.to_string());
    p.insert("key_space", a.key_space.to_string());
    p.insert("rate", a.rate.to_string());
    p.insert("embedded", a.embedded.is_some().to_string());
    if a.embedded.is_some() {
        p.insert("members", a.members.to_string());
    }
    p
}

fn progress(total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    if let Ok(style) = ProgressStyle::with_template("{bar:40} {pos}/{len} {per_sec} eta {eta}") {
        bar.set_style(style);
    }
    bar
}

/// Runs `args.clients` clients until `args.total` requests are made. The bar counts requests
/// done: each client adds its own as they finish, so the count only grows (setting it to the
/// number of the request just done moved it back whenever an earlier one finished later, and
/// each move back restarted its rate at 0/s).
async fn drive<T: Target>(
    target: T,
    a: &BenchArgs,
    op: Op,
    range_key: Vec<u8>,
    bar: ProgressBar,
) -> (Tally, Duration) {
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for client in 0..a.clients.max(1) {
        let (target, next, bar, a, range_key) =
            (target.clone(), next.clone(), bar.clone(), a.clone(), range_key.clone());
        tasks.push(tokio::spawn(async move {
            let mut tally = Tally::new();
            let mut rng = Rng(
                0x9E37_79B9_7F4A_7C15 ^ (client as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03)
            );
            let value = vec![b'v'; a.value_size];
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= a.total {
                    break;
                }
                if a.rate > 0 {
                    // Global pacing: request i starts no earlier than i / rate seconds in.
                    let due = start + Duration::from_secs_f64(i as f64 / a.rate as f64);
                    tokio::time::sleep_until(due.into()).await;
                }
                let n = if a.sequential_keys { i } else { rng.next() };
                let n = if a.key_space > 0 { n % a.key_space } else { n };
                let k = key(n, a.key_size);
                let began = Instant::now();
                let result = match op {
                    Op::Put => target.put(client, k, value.clone()).await,
                    Op::TxnPut => target.txn_put(client, k, value.clone()).await,
                    Op::Range { serializable } => {
                        let k = if a.key_space > 0 { k } else { range_key.clone() };
                        target.range(client, k, serializable).await
                    }
                    Op::Mixed { read_ratio } => {
                        if (rng.next() % 10_000) as f64 / 10_000.0 < read_ratio {
                            target.range(client, k, false).await
                        } else {
                            target.put(client, k, value.clone()).await
                        }
                    }
                };
                tally.record(began.elapsed(), result);
                bar.inc(1);
            }
            tally
        }));
    }
    let tally = merge(tasks).await;
    let elapsed = start.elapsed();
    bar.finish_and_clear();
    (tally, elapsed)
}

/// Writes every key of `--key-space` once, so reads find them (not measured).
async fn prepare<T: Target>(target: &T, a: &BenchArgs, op: Op) -> Result<(), String> {
    if !matches!(op, Op::Range { .. } | Op::Mixed { .. }) || a.key_space == 0 {
        return Ok(());
    }
    let value = vec![b'v'; a.value_size];
    for n in 0..a.key_space.min(100_000) {
        target
            .put(0, key(n, a.key_size), value.clone())
            .await
            .map_err(|e| format!("preparing keys: {e}"))?;
    }
    Ok(())
}

/// Picks the endpoint to use: the first, or with `--target-leader` the one that leads.
async fn choose_endpoint(a: &BenchArgs, timeout: Duration) -> Result<(Grpc, String), String> {
    let mut first = None;
    for ep in &a.endpoints {
        let conn = Grpc::connect(ep, a.conns, timeout).await?;
        let (version, member, leader) =
            conn.status().await.unwrap_or_else(|_| ("unknown".into(), 0, 0));
        if !a.target_leader || (member != 0 && member == leader) {
            return Ok((conn, version));
        }
        first.get_or_insert((conn, version));
    }
    first.ok_or_else(|| "no endpoint given".to_string())
}

/// Runs a workload against a gRPC endpoint.
async fn run_grpc(conn: &Grpc, a: &BenchArgs, op: Option<Op>, range_key: Vec<u8>) -> Outcome {
    match (op, &a.workload) {
        (Some(op), _) => {
            prepare(conn, a, op).await?;
            let streams = a.idle_watchers.div_ceil(watch::IDLE_PER_STREAM);
            let idle = watch::open_idle(conn, a, a.idle_watchers, streams).await?;
            let (t, e) = drive(conn.clone(), a, op, range_key, progress(a.total)).await;
            let extra = Extra::from([("idle_watchers", a.idle_watchers as u64)]);
            drop(idle);
            Ok((t, e, extra))
        }
        (None, Workload::Watch { watchers, streams }) => {
            watch::fan_out(conn, a, *watchers, *streams).await
        }
        (None, Workload::WatchLatency) => watch::latency(conn, a).await,
        (None, Workload::WatchIdle { watchers, streams, hold_secs }) => {
            watch::idle(conn, a, *watchers, *streams, *hold_secs).await
        }
        (None, Workload::LeaseKeepalive) => lease::keepalive(conn, a).await,
        (None, Workload::LeaseGrantRevoke) => lease::grant_revoke(conn, a).await,
        (None, w) => Err(format!("{} has no runner", w.name())),
    }
}

/// Runs a workload against an engine in this process.
async fn run_embedded(
    a: &BenchArgs,
    dir: &std::path::Path,
    op: Option<Op>,
    range_key: Vec<u8>,
) -> Result<Report, String> {
    let name = a.workload.name();
    let Some(op) = op else {
        return Err(format!("{name} is not available in --embedded mode"));
    };
    if a.idle_watchers > 0 {
        return Err("--idle-watchers needs a gRPC endpoint, not --embedded".into());
    }
    let target = match a.members {
        1 => Embedded::open(dir)?,
        n => Embedded::open_cluster(dir, usize::from(n)).await?,
    };
    // The members stop whatever happened: a cluster left running would hold its ports.
    let driven = match prepare(&target, a, op).await {
        Ok(()) => Ok(drive(target.clone(), a, op, range_key, progress(a.total)).await),
        Err(e) => Err(e),
    };
    target.stop();
    let (tally, elapsed) = driven?;
    let server_version = match target.members() {
        1 => "cairn (embedded)".to_string(),
        n => format!("cairn (embedded, {n} members)"),
    };
    Ok(Report {
        workload: name.to_string(),
        endpoint: format!("embedded:{}", dir.display()),
        server_version,
        params: params(a),
        elapsed,
        tally,
        extra: Default::default(),
    })
}

/// Runs the benchmark the arguments describe.
pub async fn run(args: BenchArgs) -> Result<Report, String> {
    let timeout = Duration::from_secs(args.timeout_secs);
    let (a, op) = resolve(args);
    let range_key = match &a.workload {
        Workload::Range { key, .. } => key.as_bytes().to_vec(),
        _ => b"foo".to_vec(),
    };
    if let Some(dir) = &a.embedded {
        return run_embedded(&a, dir, op, range_key).await;
    }
    let (conn, version) = choose_endpoint(&a, timeout).await?;
    let sampler = a.server_pid.map(procfs::RssSampler::start);
    let (tally, elapsed, mut extra) = run_grpc(&conn, &a, op, range_key).await?;
    if let Some(s) = sampler {
        extra.extend(s.finish().await);
    }
    Ok(Report {
        workload: a.workload.name().to_string(),
        endpoint: conn.endpoint.clone(),
        server_version: version,
        params: params(&a),
        elapsed,
        tally,
        extra,
    })
}
