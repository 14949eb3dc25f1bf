//! Backup and restore after total loss: a snapshot saved through `Maintenance.Snapshot` while
//! writes go on, the data directory destroyed, `cairn snapshot restore` into a new one, and a
//! member started there finds every key, value, revision, version and lease of the snapshot's
//! revision. Damaged snapshot files are refused.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cairn_node::{Engine, EngineConfig};
use cairn_proto::etcdserverpb as pb;
use cairn_proto::etcdserverpb::lease_client::LeaseClient;
use cairn_proto::etcdserverpb::maintenance_client::MaintenanceClient;

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cairn-backup-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn cairn(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cairn")).args(args).output().expect("the binary runs")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// A key as a read shows it: key, value, create and mod revisions, version, lease.
type Kv = (Bytes, Bytes, i64, i64, i64, i64);

/// Puts, overwrites, deletes, a lease with keys, and a compaction (whose revision it returns):
/// every kind of history.
async fn write_history(s: &mut common::Server, lease: i64) -> i64 {
    let put = |key: String, value: Vec<u8>, lease: i64| pb::PutRequest {
        key: key.into_bytes(),
        value,
        lease,
        ..Default::default()
    };
    for round in 0..3u8 {
        for i in 0..200 {
            let value = vec![b'a' + round; 1024];
            s.kv.put(put(format!("key/{i:04}"), value, 0)).await.expect("puts");
        }
    }
    for i in (0..200).step_by(7) {
        let del = pb::DeleteRangeRequest {
            key: format!("key/{i:04}").into_bytes(),
            ..Default::default()
        };
        s.kv.delete_range(del).await.expect("deletes");
    }
    let at = s.kv.put(put("mark".into(), b"m".to_vec(), 0)).await.expect("puts");
    let rev = at.into_inner().header.expect("a header").revision;
    let compacted = rev - 50;
    s.kv.compact(pb::CompactionRequest { revision: compacted, physical: true })
        .await
        .expect("compacts");
    for i in 0..5 {
        s.kv.put(put(format!("leased/{i}"), b"l".to_vec(), lease)).await.expect("puts");
    }
    compacted
}

/// Every key at `revision`, as the server reads it.
async fn read_all(s: &mut common::Server, revision: i64) -> Vec<Kv> {
    let req = pb::RangeRequest { key: vec![0], range_end: vec![0], revision, ..Default::default() };
    let kvs = s.kv.range(req).await.expect("reads").into_inner().kvs;
    kvs.into_iter()
        .map(|k| {
            let (key, value) = (Bytes::from(k.key), Bytes::from(k.value));
            (key, value, k.create_revision, k.mod_revision, k.version, k.lease)
        })
        .collect()
}

/// Saves a snapshot through the API while a writer keeps writing; returns the file, the
/// revision the first message names, and how many writes landed while it was read.
async fn save_while_writing(s: &common::Server) -> (Vec<u8>, i64, u64) {
    let url = format!("http://127.0.0.1:{}", s.port);
    let written = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (mut kv, written, stop) = (s.kv.clone(), written.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let n = written.fetch_add(1, Ordering::SeqCst);
                let req = pb::PutRequest {
                    key: format!("during/{n}").into_bytes(),
                    value: vec![b'd'; 512],
                    ..Default::default()
                };
                kv.put(req).await.expect("writes go on");
            }
        })
    };
    let mut m = MaintenanceClient::connect(url).await.expect("connects");
    let mut stream = m.snapshot(pb::SnapshotRequest {}).await.expect("streams").into_inner();
    let (mut file, mut revision, mut first_writes) = (Vec::new(), 0, 0);
    let mut last_remaining = u64::MAX;
    let mut digest = None;
    while let Some(msg) = stream.message().await.expect("a message") {
        assert_eq!(msg.version, "3.6.0", "every message names the storage version");
        if let Some(h) = &msg.header {
            revision = h.revision;
            first_writes = written.load(Ordering::SeqCst);
        }
        if digest.is_some() {
            panic!("a message after the digest");
        }
        if msg.remaining_bytes == 0 && last_remaining == 0 {
            digest = Some(msg.blob);
            continue;
        }
        file.extend_from_slice(&msg.blob);
        assert!(msg.remaining_bytes < last_remaining, "remaining bytes count down");
        last_remaining = msg.remaining_bytes;
        // A slow client: the writer gets ahead while the stream is open.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let during = written.load(Ordering::SeqCst) - first_writes;
    stop.store(true, Ordering::SeqCst);
    writer.await.expect("the writer ends");
    let digest = digest.expect("the stream ends with the digest");
    assert_eq!(digest.len(), 32);
    file.extend_from_slice(&digest);
    (file, revision, during)
}

/// Opens the restored directory as a member and reads everything back.
async fn restored_state(dir: &Path) -> (Vec<Kv>, i64, i64, Vec<cairn_kv::Lease>) {
    let engine = Engine::open(EngineConfig::new("restored", dir)).expect("the member starts");
    let req = cairn_kv::RangeRequest {
        key: Bytes::from_static(b"\0"),
        range_end: Bytes::from_static(b"\0"),
        ..Default::default()
    };
    let kvs = engine.range(req).await.expect("reads").kvs;
    let kvs = kvs
        .into_iter()
        .map(|k| (k.key, k.value, k.create_revision.0, k.mod_revision.0, k.version, k.lease.0))
        .collect();
    let status = engine.status();
    let leases = engine.leases();
    engine.stop();
    (kvs, status.revision.0, status.compact_revision.0, leases)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_saved_while_writing_restores_every_key_and_revision() {
    let mut s = common::server("backup-total-loss").await;
    let url = format!("http://127.0.0.1:{}", s.port);
    let mut leases = LeaseClient::connect(url).await.expect("connects");
    let grant = pb::LeaseGrantRequest { ttl: 3600, id: 0 };
    let lease = leases.lease_grant(grant).await.expect("grants").into_inner().id;
    let compacted = write_history(&mut s, lease).await;

    let (file, revision, during) = save_while_writing(&s).await;
    assert!(during > 0, "writes went on while the snapshot was read");
    assert_eq!(file.len() % 512, 32, "etcdctl's check: sectors plus the SHA-256");
    let expected = read_all(&mut s, revision).await;
    assert!(expected.len() > 150, "the history holds its keys: {}", expected.len());

    // Total loss: the server stops and its data directory is removed.
    let dir =
        std::env::temp_dir().join(format!("cairn-test-backup-total-loss-{}", std::process::id()));
    drop(s);
    for _ in 0..100 {
        if !dir.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!dir.exists(), "the data directory is gone");

    let work = temp_dir("total-loss");
    std::fs::create_dir_all(&work).expect("a work directory");
    let path = work.join("snap.db");
    std::fs::write(&path, &file).expect("writes the file");
    let restored = work.join("restored");
    let out = cairn(&[
        "snapshot",
        "restore",
        path.to_str().expect("utf-8"),
        "--data-dir",
        restored.to_str().expect("utf-8"),
    ]);
    assert!(out.status.success(), "restore: {}", text(&out));

    let (kvs, current, compact_revision, leases) = restored_state(&restored).await;
    assert_eq!(current, revision, "the snapshot's revision is the current one");
    assert_eq!(kvs, expected, "every key, value, revision, version and lease");
    assert_eq!(compact_revision, compacted, "the compaction point survives");
    assert!(leases.iter().any(|l| l.id.0 == lease && l.ttl == 3600), "the lease: {leases:?}");

    // Into a directory that holds something: refused, and nothing in it changes.
    let again = cairn(&[
        "snapshot",
        "restore",
        path.to_str().expect("utf-8"),
        "--data-dir",
        restored.to_str().expect("utf-8"),
    ]);
    assert!(!again.status.success());
    assert!(text(&again).contains("not empty"), "{}", text(&again));
    let _ = std::fs::remove_dir_all(&work);
}

/// What `cairn snapshot restore` says of `file`, which it must refuse, leaving no directory.
fn refused(work: &Path, name: &str, file: &[u8], flags: &[&str]) -> String {
    let path = work.join(name);
    std::fs::write(&path, file).expect("writes the file");
    let dir = work.join(format!("{name}.restored"));
    let mut args = vec![
        "snapshot",
        "restore",
        path.to_str().expect("utf-8"),
        "--data-dir",
        dir.to_str().expect("utf-8"),
    ];
    args.extend_from_slice(flags);
    let out = cairn(&args);
    assert!(!out.status.success(), "{name} was accepted: {}", text(&out));
    assert!(!dir.exists(), "{name}: a refused restore leaves nothing behind");
    text(&out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_and_damaged_files_are_refused() {
    let mut s = common::server("backup-damage").await;
    for i in 0..50 {
        let req = pb::PutRequest {
            key: format!("k{i}").into_bytes(),
            value: vec![b'v'; 100],
            ..Default::default()
        };
        s.kv.put(req).await.expect("puts");
    }
    let (file, _, _) = save_while_writing(&s).await;
    drop(s);
    let work = temp_dir("damage");
    std::fs::create_dir_all(&work).expect("a work directory");

    let cut = refused(&work, "truncated", &file[..file.len() - 1000], &[]);
    assert!(cut.contains("truncated"), "{cut}");
    let no_digest = refused(&work, "no-digest", &file[..file.len() - 32], &[]);
    assert!(no_digest.contains("snapshot missing hash but --skip-hash-check=false"), "{no_digest}");
    let mut flipped = file.clone();
    flipped[300] ^= 0x10;
    let bad = refused(&work, "flipped", &flipped, &[]);
    assert!(bad.contains("expected sha256"), "{bad}");
    // Skipping the digest still checks the image's own checksum.
    let skipped = refused(&work, "flipped-skip", &flipped, &["--skip-hash-check"]);
    assert!(skipped.contains("checksum mismatch"), "{skipped}");
    let not_ours = refused(&work, "bbolt", &vec![0u8; 4096 + 32], &[]);
    assert!(not_ours.contains("not a cairn snapshot file"), "{not_ours}");

    // The intact file: status reads it, restore takes it.
    let path = work.join("good.db");
    std::fs::write(&path, &file).expect("writes the file");
    let status = cairn(&["snapshot", "status", path.to_str().expect("utf-8"), "-w", "json"]);
    assert!(status.status.success(), "{}", text(&status));
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).expect("json");
    assert_eq!(json["totalSize"], (file.len() - 32) as u64);
    assert!(json["revision"].as_i64().expect("a revision") >= 51);
    let _ = std::fs::remove_dir_all(&work);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_server_ends_a_snapshot_its_client_stopped_reading() {
    let mut s = common::server("backup-stop").await;
    for i in 0..1000 {
        let req = pb::PutRequest {
            key: format!("k{i:04}").into_bytes(),
            value: vec![b'v'; 4096],
            ..Default::default()
        };
        s.kv.put(req).await.expect("puts");
    }
    let url = format!("http://127.0.0.1:{}", s.port);
    let mut m = MaintenanceClient::connect(url).await.expect("connects");
    let mut stream = m.snapshot(pb::SnapshotRequest {}).await.expect("streams").into_inner();
    stream.message().await.expect("a message").expect("the first piece");
    // The client reads no more; the server stops. It must not wait for the client.
    let dir = std::env::temp_dir().join(format!("cairn-test-backup-stop-{}", std::process::id()));
    drop(s.stop);
    for _ in 0..200 {
        if !dir.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!dir.exists(), "the server stopped within 10 s");
    drop(stream);
}
