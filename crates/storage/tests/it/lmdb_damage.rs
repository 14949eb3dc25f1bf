//! The LMDB backend on a full disk and on damaged files: clear errors naming the file.

use cairn_storage::lmdb::disk_full;

fn io(e: std::io::Error) -> heed::Error {
    heed::Error::Io(e)
}

#[test]
fn a_short_write_on_a_full_disk_says_no_space_left() {
    // LMDB reports a short write as EIO; with the disk (nearly) full, that is what it is.
    let eio = || io(std::io::Error::from_raw_os_error(5));
    let msg = disk_full(eio(), Some(4096)).to_string();
    assert_eq!(msg, "no space left on device");
    let enospc = io(std::io::Error::from_raw_os_error(28));
    assert_eq!(disk_full(enospc, None).to_string(), "no space left on device");
    // With room on the disk, or no way to know, EIO stays an IO error.
    assert!(disk_full(eio(), Some(10 << 30)).to_string().contains("os error 5"));
    assert!(disk_full(eio(), None).to_string().contains("os error 5"));
}

use std::path::{Path, PathBuf};

use bytes::Bytes;
use cairn_kv::backend::{Backend, BackendView, Meta, Record, WriteBatch};
use cairn_kv::{LeaseId, Revision, RevisionId};
use cairn_storage::lmdb::LmdbBackend;
use cairn_storage::lmdb_check;

const MAP: usize = 64 << 20;

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cairn-lmdb-damage-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// A database with branch pages, overflow pages (values larger than a page) and every named
/// database in use; returns its data file's bytes.
fn build(dir: &Path) -> Vec<u8> {
    let db = LmdbBackend::open(dir, MAP).expect("opens");
    let mut puts = Vec::new();
    for i in 1..=1500i64 {
        let len = if i % 100 == 0 { 9000 } else { 40 };
        let rec = Record {
            key: Bytes::from(format!("key-{i:05}")),
            value: Bytes::from("v".repeat(len)),
            create: Revision(i),
            version: 1,
            lease: LeaseId(0),
            tombstone: false,
        };
        puts.push((RevisionId { main: Revision(i), sub: 0 }, rec.encode()));
    }
    let meta = Meta { applied_index: 1500, current: Revision(1500), ..Meta::default() };
    let members = vec![(
        7,
        cairn_kv::MemberAttributes { name: "m".into(), client_urls: vec![], ..Default::default() }
            .encode(),
    )];
    let leases = vec![(LeaseId(3), Some(vec![0u8; 16]))];
    db.commit(WriteBatch { puts, members, leases, meta: Some(meta), ..WriteBatch::default() })
        .expect("commits");
    db.sync().expect("syncs");
    drop(db);
    std::fs::read(dir.join("data.mdb")).expect("reads")
}

/// Reads everything the backend holds; errors are fine, a crash is not.
fn read_all(db: &LmdbBackend) {
    let Ok(view) = db.view() else { return };
    let _ = view.meta();
    let _ = view.members();
    let _ = view.leases();
    let _ = view.scan(RevisionId { main: Revision(0), sub: 0 }, &mut |_, _| true);
}

#[test]
fn a_healthy_database_passes_the_check() {
    let dir = temp_dir("healthy");
    build(&dir);
    lmdb_check::check(&dir.join("data.mdb")).expect("a healthy file passes");
    std::fs::remove_dir_all(&dir).expect("cleans up");
}

/// Flips bytes in the page headers, node tables and meta pages of every page, one damage at a
/// time: opening either refuses, naming the file, or opens a database that reads without
/// crashing (a damaged key or value LMDB cannot tell from a real one).
#[test]
fn damaged_pages_are_refused_at_open_never_a_crash() {
    let dir = temp_dir("sweep");
    let good = build(&dir);
    let psize = 4096;
    let pages = good.len() / psize;
    assert!(pages > 10, "{pages} pages");
    let file = dir.join("data.mdb");
    let mut refused = 0;
    for page in 0..pages {
        for off in [0, 10, 12, 14, 16, 17, 20, 40, 41, 128, 136, 144, 2048, psize - 8] {
            let mut bad = good.clone();
            bad[page * psize + off] ^= 0xFF;
            std::fs::write(&file, &bad).expect("writes");
            match LmdbBackend::open(&dir, MAP) {
                Err(e) => {
                    let msg = e.to_string();
                    assert!(msg.contains(&file.display().to_string()), "{msg}");
                    refused += 1;
                }
                Ok(db) => read_all(&db),
            }
        }
    }
    assert!(refused > pages, "only {refused} damages refused");
    std::fs::remove_dir_all(&dir).expect("cleans up");
}

#[test]
fn a_child_page_number_past_the_file_names_the_file_and_page() {
    let dir = temp_dir("child");
    let good = build(&dir);
    // Page 0's meta: the main db's root, made to point past the end of the file.
    let mut bad = good.clone();
    let root_at = 16 + 24 + 48 + 40;
    bad[root_at..root_at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    bad[4096 + root_at..4096 + root_at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    std::fs::write(dir.join("data.mdb"), &bad).expect("writes");
    let msg = LmdbBackend::open(&dir, MAP).expect_err("refused").to_string();
    assert!(msg.contains("data.mdb is damaged"), "{msg}");
    assert!(msg.contains("outside the file"), "{msg}");
    assert!(msg.contains("log replays"), "offers the log: {msg}");
    std::fs::remove_dir_all(&dir).expect("cleans up");
}
