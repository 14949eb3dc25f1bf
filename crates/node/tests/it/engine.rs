//! The engine end to end on real files: operations, restarts, log compaction, exclusive use of
//! the data directory, and a crash test that kills a writing process and checks that every
//! acknowledged write survives.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command as Proc, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_kv::*;
use cairn_node::{Engine, EngineConfig, EngineError, OpenError};

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cairn-engine-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn b(s: impl Into<String>) -> Bytes {
    Bytes::from(s.into())
}

fn get_req(k: &str) -> RangeRequest {
    RangeRequest { key: b(k), ..RangeRequest::default() }
}

fn put_req(k: &str, v: &str) -> PutRequest {
    PutRequest { key: b(k), value: b(v), ..PutRequest::default() }
}

#[tokio::test]
async fn every_operation_works_end_to_end() {
    let dir = temp_dir("ops");
    let e = Engine::open(EngineConfig::new("ops", &dir)).unwrap();
    assert_eq!(e.status().revision, Revision(1));
    let r1 = e.put(put_req("a", "1")).await.unwrap();
    assert_eq!(r1.revision, Revision(2));
    let r2 = e.put(PutRequest { prev_kv: true, ..put_req("a", "2") }).await.unwrap();
    assert_eq!(r2.prev_kv.unwrap().value, b("1"));
    let got = e.range(get_req("a")).await.unwrap();
    assert_eq!((got.kvs[0].version, got.revision), (2, Revision(3)));
    let serial = e.range(RangeRequest { serializable: true, ..get_req("a") }).await.unwrap();
    assert_eq!(serial.kvs, got.kvs);
    // The Kubernetes create shape: succeed only if the key does not exist.
    let create = TxnRequest {
        compare: vec![Compare {
            key: b("b"),
            range_end: Bytes::new(),
            target: CompareTarget::Mod(Revision(0)),
            result: CompareResult::Equal,
        }],
        success: vec![RequestOp::Put(put_req("b", "x"))],
        failure: vec![],
    };
    assert!(e.txn(create.clone()).await.unwrap().succeeded);
    assert!(!e.txn(create).await.unwrap().succeeded);
    let del =
        e.delete_range(DeleteRangeRequest { key: b("a"), ..Default::default() }).await.unwrap();
    assert_eq!(del.deleted, 1);
    e.compact(CompactRequest { revision: Revision(3), physical: true }).await.unwrap();
    let old = e.range(RangeRequest { revision: Revision(2), ..get_req("a") }).await;
    assert_eq!(old, Err(EngineError::Kv(KvError::Compacted)));
    assert_eq!(e.range(get_req("")).await, Err(EngineError::Kv(KvError::EmptyKey)));
    let big =
        PutRequest { key: b("big"), value: Bytes::from(vec![0u8; 2 << 20]), ..Default::default() };
    assert_eq!(e.put(big).await, Err(EngineError::RequestTooLarge));
    let status = e.status();
    assert_eq!(status.leader, Some(status.member_id));
    e.stop();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn restarts_keep_every_acknowledged_write_across_log_compaction() {
    let dir = temp_dir("restart");
    let mut cfg = EngineConfig::new("restart", &dir);
    cfg.snapshot_entries = 50;
    // A margin well under the writes, so the log is compacted many times across the restarts.
    cfg.snapshot_catchup_entries = 20;
    cfg.wal_segment_bytes = 16 << 10;
    for round in 0..3 {
        let e = Engine::open(cfg.clone()).unwrap();
        for i in 0..200 {
            e.put(put_req(&format!("k{round}-{i:03}"), &format!("v{i}"))).await.unwrap();
        }
        e.stop();
    }
    let e = Engine::open(cfg).unwrap();
    let all =
        RangeRequest { key: b("k"), range_end: b("l"), count_only: true, ..Default::default() };
    assert_eq!(e.range(all).await.unwrap().count, 600);
    assert_eq!(e.status().revision, Revision(601));
    let wal_files = std::fs::read_dir(dir.join("member/wal")).unwrap().count();
    assert!(wal_files < 20, "old WAL segments are removed after compaction: {wal_files}");
    e.stop();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_data_directory_serves_one_engine_at_a_time() {
    let dir = temp_dir("lock");
    let first = Engine::open(EngineConfig::new("one", &dir)).unwrap();
    match Engine::open(EngineConfig::new("two", &dir)) {
        Err(EngineError::Open(e @ OpenError::Locked { .. })) => {
            assert!(e.to_string().contains("in use"), "{e}")
        }
        other => panic!("expected the directory to be locked, got {other:?}"),
    }
    first.stop();
    drop(first);
    Engine::open(EngineConfig::new("again", &dir)).unwrap().stop();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Run as a child process by the crash test: writes keys forever, printing each acknowledged
/// one. Does nothing when run as an ordinary test.
#[test]
fn crash_child_writer() {
    let Ok(dir) = std::env::var("CAIRN_CRASH_DIR") else { return };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut cfg = EngineConfig::new("crash", Path::new(&dir));
        cfg.snapshot_entries = 100;
        cfg.snapshot_catchup_entries = 30;
        cfg.wal_segment_bytes = 32 << 10;
        let e = Engine::open(cfg).unwrap();
        let start: u64 = std::env::var("CAIRN_CRASH_START").unwrap().parse().unwrap();
        let count: u64 =
            std::env::var("CAIRN_CRASH_COUNT").map_or(u64::MAX, |c| c.parse().unwrap());
        for i in start..start.saturating_add(count) {
            let key = format!("key{i:08}");
            e.put(put_req(&key, &format!("value{i}"))).await.unwrap();
            println!("ACK {key}");
        }
        println!("IDLE");
        std::thread::sleep(Duration::from_secs(600));
    });
}

/// The store commits executed writes on its own within its commit interval, with no flush and
/// no further writes to wake it: after an idle pause and a SIGKILL, the LMDB store alone (no WAL
/// replay) holds every write.
#[test]
fn the_store_commits_in_the_background_without_being_asked() {
    let dir = temp_dir("bgcommit");
    let exe = std::env::current_exe().unwrap();
    let mut child = Proc::new(&exe)
        .args(["--exact", "engine::crash_child_writer", "--nocapture", "--test-threads=1"])
        .env("CAIRN_CRASH_DIR", &dir)
        .env("CAIRN_CRASH_START", "0")
        .env("CAIRN_CRASH_COUNT", "50")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let idle = lines.map_while(Result::ok).any(|l| l == "IDLE");
    // Many commit intervals, so the check does not depend on scheduling luck.
    std::thread::sleep(Duration::from_millis(500));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(idle, "the writer did not finish its writes");
    let backend =
        cairn_storage::lmdb::LmdbBackend::open(&dir.join("member").join("db"), 1 << 30).unwrap();
    let store = cairn_kv::Store::open(backend).unwrap();
    assert_eq!(store.key_count(), 50, "the store must hold every write without a replay");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_killed_writer_loses_no_acknowledged_write() {
    let dir = temp_dir("crash");
    let exe = std::env::current_exe().unwrap();
    let mut acked: Vec<String> = Vec::new();
    for (round, kill_after) in [5usize, 40, 1, 150, 17].into_iter().enumerate() {
        let mut child = Proc::new(&exe)
            .args(["--exact", "engine::crash_child_writer", "--nocapture", "--test-threads=1"])
            .env("CAIRN_CRASH_DIR", &dir)
            .env("CAIRN_CRASH_START", (round * 100_000).to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen = 0;
        while seen < kill_after && Instant::now() < deadline {
            match lines.next() {
                Some(Ok(line)) => {
                    if let Some(key) = line.strip_prefix("ACK ") {
                        acked.push(key.to_string());
                        seen += 1;
                    }
                }
                _ => break,
            }
        }
        child.kill().unwrap(); // SIGKILL: no chance to flush anything
        child.wait().unwrap();
        assert_eq!(seen, kill_after, "round {round}: the writer stopped early");
        let e = Engine::open(EngineConfig::new("check", &dir)).unwrap();
        for key in &acked {
            let got = e.range(get_req(key)).await.unwrap();
            assert_eq!(got.kvs.len(), 1, "round {round}: acknowledged {key} was lost");
        }
        e.stop();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Writes are answered before the store's commit is published; a linearizable read that starts
/// after an answer must still see that write (and a serializable read may lag, but never beyond
/// what was published).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_linearizable_read_sees_every_write_answered_before_it() {
    let dir = temp_dir("linearizable");
    let e = std::sync::Arc::new(Engine::open(EngineConfig::new("lin", &dir)).unwrap());
    let mut tasks = Vec::new();
    for t in 0..16 {
        let e = e.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..200 {
                let key = format!("t{t}");
                let w = e.put(put_req(&key, &i.to_string())).await.unwrap();
                let r = e.range(get_req(&key)).await.unwrap();
                assert_eq!(r.kvs[0].value, b(i.to_string()), "task {t} round {i}");
                assert!(r.revision >= w.revision, "the read's revision covers the write");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    e.stop();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A hostile request must not stop the engine: every transaction validation admits decodes and
/// applies; deeper ones are refused up front.
#[tokio::test]
async fn deeply_nested_transactions_are_applied_or_refused_never_fatal() {
    let dir = temp_dir("nesting");
    let e = Engine::open(EngineConfig::new("nest", &dir)).unwrap();
    let nest = |depth: usize| {
        let mut t = TxnRequest {
            compare: vec![],
            success: vec![RequestOp::Put(put_req("deep", "v"))],
            failure: vec![],
        };
        for _ in 1..depth {
            t = TxnRequest { compare: vec![], success: vec![RequestOp::Txn(t)], failure: vec![] };
        }
        t
    };
    let max = cairn_kv::validate::MAX_TXN_DEPTH;
    assert!(e.txn(nest(max)).await.unwrap().succeeded);
    assert_eq!(e.txn(nest(max + 1)).await, Err(EngineError::Kv(KvError::TxnTooDeep)));
    assert_eq!(e.range(get_req("deep")).await.unwrap().kvs.len(), 1, "the engine still serves");
    assert!(e.status().failure.is_none());
    e.stop();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A storage error stops the engine (fail-stop: writes and reads refused, the reason reported),
/// and nothing acknowledged is lost: reopened with room, the WAL brings every write back.
#[tokio::test]
async fn a_storage_failure_stops_the_engine_and_loses_nothing_acknowledged() {
    let dir = temp_dir("failstop");
    let mut cfg = EngineConfig::new("failstop", &dir);
    cfg.lmdb_map_bytes = 256 << 10; // LMDB fills up after a few hundred KiB
    let e = Engine::open(cfg.clone()).unwrap();
    let mut acked = Vec::new();
    let value = "x".repeat(2000);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let stopped = loop {
        assert!(std::time::Instant::now() < deadline, "the store never filled up");
        let key = format!("k{:05}", acked.len());
        match e.put(put_req(&key, &value)).await {
            Ok(_) => acked.push(key),
            Err(err) => break err,
        }
    };
    assert!(matches!(stopped, EngineError::Stopped(_)), "{stopped:?}");
    let failure = e.status().failure.expect("the cause is reported");
    assert!(failure.to_string().contains("lmdb"), "{failure}");
    assert!(matches!(e.range(get_req("k00000")).await, Err(EngineError::Stopped(_))));
    assert_eq!(e.leader(), None);
    e.stop();
    drop(e);
    cfg.lmdb_map_bytes = 64 << 20;
    let e = Engine::open(cfg).unwrap();
    for key in &acked {
        assert_eq!(e.range(get_req(key)).await.unwrap().kvs.len(), 1, "acknowledged {key} lost");
    }
    assert!(acked.len() > 10, "only {} writes before the failure", acked.len());
    e.stop();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A single member has no one to tell its client URLs: it publishes nothing, and its log holds
/// the founding entry and its own leadership's entry alone.
#[test]
fn a_single_member_publishes_nothing() {
    let dir = temp_dir("solo-publish");
    let mut cfg = EngineConfig::new("solo", &dir);
    cfg.advertise_client_urls = vec!["http://127.0.0.1:2379".into()];
    let e = Engine::open(cfg).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(e.members().is_empty());
    assert_eq!(e.status().raft_index, 2);
    e.stop();
    drop(e);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// With the log synced on its own thread (`LogSync::Async`), writes from many callers share
/// syncs, go on across segment changes (each needs a new handle on the sync thread), and are
/// all there after a restart, in either mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn asynchronous_log_syncs_keep_every_acknowledged_write() {
    let dir = temp_dir("async-sync");
    let mut cfg = EngineConfig::new("async", &dir);
    cfg.log_sync = cairn_node::LogSync::Async;
    cfg.wal_segment_bytes = 16 << 10;
    let e = std::sync::Arc::new(Engine::open(cfg.clone()).unwrap());
    let writers: Vec<_> = (0..16)
        .map(|t| {
            let e = e.clone();
            tokio::spawn(async move {
                for i in 0..100 {
                    e.put(put_req(&format!("t{t:02}-{i:03}"), "value")).await.unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.await.unwrap();
    }
    let (fsyncs, _) = e.metrics().wal_fsync.totals();
    assert!(fsyncs > 0, "the log was never synced");
    e.stop();
    drop(e);
    let segments = std::fs::read_dir(dir.join("member/wal")).unwrap().count();
    assert!(segments > 2, "the writes must span several segments: {segments}");
    // Reopened inline, then async again: what either wrote, the other reads.
    for mode in [cairn_node::LogSync::Inline, cairn_node::LogSync::Async] {
        cfg.log_sync = mode;
        let e = Engine::open(cfg.clone()).unwrap();
        let all =
            RangeRequest { key: b("t"), range_end: b("u"), count_only: true, ..Default::default() };
        assert_eq!(e.range(all).await.unwrap().count, 1600, "{mode:?}");
        e.put(put_req(&format!("after-{mode:?}"), "v")).await.unwrap();
        e.stop();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
