//! Defragmenting the LMDB backend: commits go on during it and none is lost, the file shrinks,
//! and stopping at any step (what a crash there leaves) reopens to the same contents, never a
//! mix, with nothing left beside the database.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_kv::backend::{Backend, BackendView, Meta, Record, WriteBatch};
use cairn_kv::{AlarmMember, AlarmType, LeaseId, Revision, RevisionId};
use cairn_storage::lmdb::{DefragStep, LmdbBackend};

const MAP: usize = 1 << 30;

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cairn-defrag-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("creates the test directory");
    d
}

fn record(i: i64) -> Vec<u8> {
    let key = Bytes::from(format!("key{i:08}"));
    let value = Bytes::from(vec![b'v'; 4000]);
    Record { key, value, create: Revision(i), version: 1, lease: LeaseId(0), tombstone: false }
        .encode()
}

fn rev(i: i64) -> RevisionId {
    RevisionId { main: Revision(i), sub: 0 }
}

/// Commits `n` records from `from` on, 100 a batch, with alarms and a lease beside them.
fn fill(b: &LmdbBackend, from: i64, n: i64) {
    for start in (from..from + n).step_by(100) {
        let alarm = AlarmMember { member: 1, alarm: AlarmType::NoSpace };
        let batch = WriteBatch {
            puts: (start..(start + 100).min(from + n)).map(|i| (rev(i), record(i))).collect(),
            alarms: Some(cairn_kv::backend::encode_alarms(&[alarm].into_iter().collect())),
            leases: vec![(LeaseId(start), Some(vec![0; 16]))],
            meta: Some(Meta { applied_index: start as u64, ..Meta::default() }),
            ..WriteBatch::default()
        };
        b.commit(batch).expect("commits");
    }
}

/// Deletes every record but each tenth in `from..from + n`, freeing most pages.
fn thin(b: &LmdbBackend, from: i64, n: i64) {
    let deletes = (from..from + n).filter(|i| i % 10 != 0).map(rev).collect();
    b.commit(WriteBatch { deletes, ..WriteBatch::default() }).expect("deletes");
}

/// Everything a view shows, to compare whole databases.
fn contents(b: &LmdbBackend) -> (BTreeMap<RevisionId, Record>, Meta, usize, usize) {
    let view = b.view().expect("opens a view");
    let mut records = BTreeMap::new();
    view.scan(RevisionId::default(), &mut |r, rec| {
        records.insert(r, rec);
        true
    })
    .expect("scans");
    let meta = view.meta().expect("meta");
    (records, meta, view.leases().expect("leases").len(), view.alarms().expect("alarms").len())
}

fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("lists")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n != "db")
        .collect()
}

#[test]
fn commits_during_a_defragmentation_are_kept_and_the_file_shrinks() {
    let dir = temp_dir("concurrent");
    let b = Arc::new(LmdbBackend::open(&dir.join("db"), MAP).expect("opens"));
    fill(&b, 1, 4000);
    thin(&b, 1, 4000);
    let before = b.size_bytes();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (b, stop) = (b.clone(), stop.clone());
        std::thread::spawn(move || {
            let (mut next, mut longest) = (100_000i64, Duration::ZERO);
            // At least 200 records, whenever the copy ends, and at most 1,000: on a loaded
            // machine a slow copy let an unbounded writer grow the new file past the old one,
            // and 2,000 (with the 400 kept) left it at 52% of the old one once (CI, 11-28).
            while (!stop.load(Ordering::SeqCst) || next < 100_200) && next < 101_000 {
                let started = Instant::now();
                fill(&b, next, 10);
                longest = longest.max(started.elapsed());
                next += 10;
            }
            (next, longest)
        })
    };
    std::thread::sleep(Duration::from_millis(20));
    b.defragment().expect("defragments");
    stop.store(true, Ordering::SeqCst);
    let (end, longest) = writer.join().expect("the writer finishes");
    eprintln!("longest commit during the defragmentation: {longest:?}");
    let (records, meta, ..) = contents(&b);
    let kept = (1..4001).filter(|i| i % 10 == 0).count() + (end - 100_000) as usize;
    assert_eq!(records.len(), kept, "every commit made during the copy is in the new file");
    assert!(records.contains_key(&rev(end - 1)) && records.contains_key(&rev(4000)));
    assert_eq!(meta.applied_index, (end - 10) as u64, "the last commit's meta");
    let after = b.size_bytes();
    assert!(after < before / 2, "the file shrank: {before} -> {after}");
    drop(b);
    let b = LmdbBackend::open(&dir.join("db"), MAP).expect("reopens");
    assert_eq!(contents(&b).0.len(), kept, "the new file is the one on disk");
    assert!(leftovers(&dir).is_empty(), "left: {:?}", leftovers(&dir));
    drop(b);
    std::fs::remove_dir_all(&dir).expect("cleans up");
}

#[test]
fn a_crash_at_any_step_leaves_the_old_database_or_the_new_one() {
    for step in [DefragStep::Copied, DefragStep::CaughtUp, DefragStep::Exchanged] {
        let dir = temp_dir(&format!("{step:?}"));
        let db = dir.join("db");
        let b = LmdbBackend::open(&db, MAP).expect("opens");
        fill(&b, 1, 1000);
        thin(&b, 1, 1000);
        let expected = contents(&b);
        b.defragment_until(Some(step)).expect("runs up to the step");
        assert!(!leftovers(&dir).is_empty(), "{step:?}: the other directory is still there");
        // Commits after the step went to the old environment only if it was not exchanged;
        // none are made here, so old and new must hold the same.
        drop(b);
        let b = LmdbBackend::open(&db, MAP).expect("reopens after the crash");
        assert_eq!(contents(&b), expected, "{step:?}: the same contents, old or new");
        assert!(leftovers(&dir).is_empty(), "{step:?}: left {:?}", leftovers(&dir));
        // And it can be defragmented again, in the same process.
        b.defragment().expect("defragments again");
        assert_eq!(contents(&b), expected);
        drop(b);
        std::fs::remove_dir_all(&dir).expect("cleans up");
    }
}

/// etcd's `db_total_size_in_use`: freed pages are not in use, so after deleting most records
/// the in-use size falls well below the file's size, and a defragmentation brings the file
/// down to about what was in use.
#[test]
fn size_in_use_leaves_out_freed_pages() {
    let dir = temp_dir("in-use");
    let b = LmdbBackend::open(&dir.join("db"), MAP).expect("opens");
    fill(&b, 1, 2000);
    let (full, full_in_use) = (b.size_bytes(), b.size_in_use_bytes());
    assert!(full_in_use > 2000 * 4000 && full_in_use <= full, "{full_in_use} of {full}");
    thin(&b, 1, 2000);
    let (size, in_use) = (b.size_bytes(), b.size_in_use_bytes());
    assert!(size >= full, "deleting returns nothing to the file system: {full} -> {size}");
    assert!(in_use < full_in_use / 4, "in use after thinning: {in_use} (was {full_in_use})");
    b.defragment().expect("defragments");
    assert!(b.size_bytes() < size / 2, "the file shrank to about what was in use");
    assert!(b.size_in_use_bytes() <= b.size_bytes());
    drop(b);
    std::fs::remove_dir_all(&dir).expect("cleans up");
}
