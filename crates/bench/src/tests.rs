//! The tool's own pieces: progress, printing, exit status, help, and the parts of a run that
//! need no server.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::{CommandFactory, Parser};
use indicatif::ProgressBar;

use crate::report::{Report, Tally};
use crate::target::{OpError, Target};
use crate::{drive, write_report, BenchArgs, BenchError, Op};

#[derive(Parser, Debug)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

fn args(line: &[&str]) -> BenchArgs {
    let argv = std::iter::once("bench").chain(line.iter().copied());
    Cli::try_parse_from(argv).expect("the test's command line parses").bench
}

/// Request `slow` takes `delay`; every other request takes a millisecond.
#[derive(Clone, Debug)]
struct Uneven {
    slow: u64,
    delay: Duration,
}

impl Uneven {
    async fn answer(&self, key: Vec<u8>) -> Result<(), OpError> {
        let n: u64 = String::from_utf8_lossy(&key).parse().expect("sequential keys are numbers");
        if n == self.slow {
            tokio::time::sleep(self.delay).await;
        } else {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(())
    }
}

impl Target for Uneven {
    async fn put(&self, _: usize, key: Vec<u8>, _: Vec<u8>) -> Result<(), OpError> {
        self.answer(key).await
    }
    async fn range(&self, _: usize, key: Vec<u8>, _: bool) -> Result<(), OpError> {
        self.answer(key).await
    }
    async fn txn_put(&self, _: usize, key: Vec<u8>, _: Vec<u8>) -> Result<(), OpError> {
        self.answer(key).await
    }
}

/// One client holds request 64 while the other goes on well past 128: the bar must never show
/// fewer requests than it showed before (a bar set to the number of the request just finished
/// fell back to 64 when that one came back, and its rate restarted at 0/s).
#[tokio::test(flavor = "current_thread")]
async fn progress_never_moves_back() {
    let a = args(&["--total", "600", "--clients", "2", "--sequential-keys", "put"]);
    let bar = ProgressBar::hidden();
    bar.set_length(a.total);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (watch, log) = (bar.clone(), seen.clone());
    let sampler = tokio::spawn(async move {
        loop {
            log.lock().expect("not poisoned").push(watch.position());
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
    let target = Uneven { slow: 64, delay: Duration::from_millis(300) };
    let (tally, _) = drive(target, &a, Op::Put, b"foo".to_vec(), bar.clone()).await;
    sampler.abort();
    let seen = seen.lock().expect("not poisoned").clone();
    assert_eq!(tally.ok, 600);
    assert!(seen.len() > 5, "the sampler ran during the run: {seen:?}");
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "the bar moved back: {seen:?}");
    assert_eq!(bar.position(), 600);
}

/// A writer whose reader has gone, as stdout piped to `head -1` after head exits.
#[derive(Debug)]
struct Closed(std::io::ErrorKind);

impl std::io::Write for Closed {
    fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
        Err(self.0.into())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_closed_pipe_ends_the_output_quietly() {
    let r = write_report(&mut Closed(std::io::ErrorKind::BrokenPipe), "Summary\n");
    assert!(r.is_ok(), "{r:?}");
    let r = write_report(&mut Closed(std::io::ErrorKind::StorageFull), "Summary\n");
    assert!(matches!(r, Err(BenchError::Output(_))), "{r:?}");
}

/// A finished run of `workload` with these latencies and failed requests, for tests of what is
/// printed from it.
pub(crate) fn report(
    workload: &str,
    latencies_us: impl IntoIterator<Item = u64>,
    errors: &[(&str, u64)],
) -> Report {
    let mut tally = Tally::new();
    for us in latencies_us {
        tally.record(Duration::from_micros(us), Ok(()));
    }
    for (e, n) in errors {
        (0..*n).for_each(|_| tally.record(Duration::ZERO, Err(e.to_string())));
    }
    Report {
        workload: workload.into(),
        endpoint: "test".into(),
        server_version: "test".into(),
        params: Default::default(),
        elapsed: Duration::from_millis(500),
        tally,
        extra: Default::default(),
    }
}

#[test]
fn a_run_with_failed_requests_fails() {
    assert!(report("put", [100, 200], &[]).failure().is_none());
    let failed = report("put", [100], &[("watch events missing", 3), ("Unavailable: gone", 1)]);
    let e = failed.failure().expect("a run with failed requests fails");
    assert_eq!(e.to_string(), "4 of 5 requests failed (most often: 3 x watch events missing)");
}

/// Every flag and workload explains itself in `cairn bench --help` and `cairn bench <w> --help`.
#[test]
fn every_flag_and_workload_has_help() {
    let cmd = Cli::command();
    let mut missing = Vec::new();
    for arg in cmd.get_arguments() {
        if arg.get_help().is_none() {
            missing.push(format!("--{}", arg.get_id()));
        }
    }
    for sub in cmd.get_subcommands() {
        if sub.get_about().is_none() {
            missing.push(sub.get_name().to_string());
        }
        for arg in sub.get_arguments().filter(|a| !a.is_global_set()) {
            if arg.get_help().is_none() {
                missing.push(format!("{} {}", sub.get_name(), arg.get_id()));
            }
        }
    }
    assert!(missing.is_empty(), "no help text: {missing:?}");
    let help = Cli::command().render_long_help().to_string();
    for preset in ["seq-put", "par-put", "seq-get", "par-get"] {
        let line = help.lines().find(|l| l.trim_start().starts_with(preset)).expect("listed");
        assert!(line.contains("client") && line.contains("key"), "{preset}: {line}");
    }
}

#[tokio::test]
async fn watch_and_lease_runs_fail_where_nothing_listens() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let ep = format!("127.0.0.1:{port}");
    for w in ["watch", "watch-latency", "lease-keepalive", "lease-grant-revoke"] {
        let r = crate::run(args(&["--endpoints", &ep, "--total", "5", w])).await;
        let e = r.expect_err("nothing listens there");
        assert!(e.contains("cannot connect"), "{w}: {e}");
    }
}

/// A data directory of its own, removed when the test ends, passed or failed.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("cairn-bench-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        TempDir(d)
    }

    fn path(&self) -> &str {
        self.0.to_str().expect("a UTF-8 temp path")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `--embedded DIR --members 3`: three engines in one cluster, clients spread over them, so
/// two of every three writes are forwarded by a follower and two of every three linearizable
/// reads confirmed through one; every request is counted, none fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_embedded_members_serve_every_request() {
    let dir = TempDir::new("members");
    let common = ["--embedded", dir.path(), "--members", "3", "--clients", "6", "--total", "300"];
    for workload in [&["put"][..], &["range", "--consistency", "l"], &["txn-put"]] {
        let line: Vec<&str> = common.iter().chain(workload).copied().collect();
        let run = crate::run(args(&line));
        let report = tokio::time::timeout(Duration::from_secs(120), run)
            .await
            .expect("the run ends in time")
            .expect("the run succeeds");
        assert_eq!(report.tally.ok, 300, "{workload:?}");
        assert!(report.failure().is_none(), "{workload:?}: {:?}", report.failure());
        assert_eq!(report.server_version, "cairn (embedded, 3 members)");
        assert_eq!(report.params.get("members").map(String::as_str), Some("3"));
        // Each run founds a cluster of its own.
        let _ = std::fs::remove_dir_all(&dir.0);
    }
}

#[tokio::test(flavor = "current_thread")]
async fn members_found_a_new_cluster_only() {
    let dir = TempDir::new("reused");
    std::fs::create_dir_all(dir.0.join("m0").join("member")).expect("a stale member");
    let r = crate::run(args(&["--embedded", dir.path(), "--members", "3", "put"])).await;
    let e = r.expect_err("a directory of an earlier cluster is refused");
    assert!(e.contains("give it an empty directory"), "{e}");
    let e = Cli::try_parse_from(["bench", "--members", "3", "put"]).expect_err("needs --embedded");
    assert!(e.to_string().contains("--embedded"), "{e}");
}
