//! The `cairn` binary on damaged files: a damaged log record refuses to start, naming the file
//! and offset and changing no byte; `cairn wal repair` truncates there, keeping a copy.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_kv::PutRequest;
use cairn_node::{Engine, EngineConfig};

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cairn-damaged-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// Runs the binary with `args`, killing it (by its pid) if it outlives `limit`.
fn run(args: &[&str], limit: Duration) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("waits").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("collects output")
}

/// Writes `n` keys through an engine on `dir`, then stops it. `snapshot_entries` sets how
/// often the log is compacted.
async fn write_keys(dir: &Path, n: usize, snapshot_entries: u64) {
    let mut cfg = EngineConfig::new("damaged", dir);
    cfg.snapshot_entries = snapshot_entries;
    // Nothing kept behind a compaction: the log is compacted right up to what was applied.
    cfg.snapshot_catchup_entries = 0;
    let e = Engine::open(cfg).expect("opens");
    for i in 0..n {
        let req = PutRequest {
            key: Bytes::from(format!("k{i}")),
            value: Bytes::from(format!("v{i}")),
            ..PutRequest::default()
        };
        e.put(req).await.expect("puts");
    }
    // The log is compacted once the committer has made the store durable (it commits on an
    // interval): give it time, then apply one more entry so the driver compacts before the
    // stop. Without this the compaction sometimes came after the stop and the log was whole.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let req =
        PutRequest { key: Bytes::from("last"), value: Bytes::from("v"), ..PutRequest::default() };
    e.put(req).await.expect("puts");
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    e.stop();
}

/// The last segment's path and the start offsets of its records.
fn last_segment(dir: &Path) -> (PathBuf, Vec<usize>) {
    let wal = dir.join("member/wal");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&wal)
        .expect("lists")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "wal"))
        .collect();
    names.sort();
    let path = names.pop().expect("a segment");
    let data = std::fs::read(&path).expect("reads");
    let mut offsets = Vec::new();
    let mut pos = 0;
    while pos + 9 <= data.len() {
        let len = u32::from_be_bytes(data[pos..pos + 4].try_into().expect("4 bytes")) as usize;
        if len == 0 {
            break;
        }
        offsets.push(pos);
        pos += 8 + len;
    }
    (path, offsets)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_damaged_log_record_refuses_to_start_until_repaired() {
    let dir = temp_dir("wal");
    write_keys(&dir, 200, 10_000).await;
    let (segment, offsets) = last_segment(&dir);
    assert!(offsets.len() > 200, "{} records", offsets.len());
    let at = offsets[offsets.len() / 2];
    let mut data = std::fs::read(&segment).expect("reads");
    data[at + 2] ^= 0x40;
    std::fs::write(&segment, &data).expect("damages a record's length");

    let d = dir.to_str().expect("utf-8");
    let serve = ["--data-dir", d, "--listen-client-urls", "http://127.0.0.1:0"];
    let out = run(&serve, Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "refuses to start: {stderr}");
    assert!(stderr.contains(&segment.display().to_string()), "names the file: {stderr}");
    assert!(stderr.contains(&format!("offset {at}")), "names the offset: {stderr}");
    assert_eq!(std::fs::read(&segment).expect("reads"), data, "changes no byte");

    let out = run(&["wal", "repair", "--data-dir", d], Duration::from_secs(30));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout} {}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(&format!("cut at offset {at}")), "{stdout}");
    let copy = PathBuf::from(format!("{}.cut-{at}", segment.display()));
    let cut = std::fs::read(&copy).expect("the cut bytes are kept");
    assert_eq!(cut[..], data[at..at + cut.len()]);
    assert!(std::fs::read(&segment).expect("reads")[at..].iter().all(|b| *b == 0));

    // The database applied entries the cut removed: serving on would reuse their indexes.
    let out = run(&serve, Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "refuses to start: {stderr}");
    assert!(stderr.contains("the log lost entries"), "{stderr}");
    std::fs::remove_dir_all(&dir).expect("cleans up");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_database_is_rebuilt_from_a_log_that_covers_it() {
    let dir = temp_dir("rebuild");
    write_keys(&dir, 50, 10_000).await;
    std::fs::remove_dir_all(dir.join("member/db")).expect("removes the database");
    let e = Engine::open(EngineConfig::new("damaged", &dir)).expect("replays into a new database");
    let got = e.get("k49").await.expect("reads");
    assert_eq!(got.map(|kv| kv.value), Some(Bytes::from("v49")));
    e.stop();
    std::fs::remove_dir_all(&dir).expect("cleans up");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_database_the_compacted_log_cannot_rebuild_refuses_to_start() {
    let dir = temp_dir("compacted");
    write_keys(&dir, 60, 10).await;
    std::fs::remove_dir_all(dir.join("member/db")).expect("removes the database");
    match Engine::open(EngineConfig::new("damaged", &dir)) {
        Err(e) => assert!(e.to_string().contains("cannot rebuild the database"), "{e}"),
        Ok(e) => {
            e.stop();
            panic!("opened an empty database over a compacted log");
        }
    }
    std::fs::remove_dir_all(&dir).expect("cleans up");
}
