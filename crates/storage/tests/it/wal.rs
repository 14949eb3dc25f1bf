//! The write-ahead log: round trips, truncation, rotation, compaction, corruption, and crash
//! consistency against a model (any crash recovers a state at or after the last sync).

use bytes::Bytes;
use cairn_raft::{ConfState, Entry, EntryPayload, HardState, LogIndex, NodeId, SnapshotMeta, Term};
use cairn_storage::faulty::FaultyDir;
use cairn_storage::fs::{Dir, OsDir};
use cairn_storage::{Recovered, Wal, WalError, WalOptions};
use proptest::prelude::*;

fn entry(index: u64, term: u64, data: &str) -> Entry {
    Entry {
        term: Term(term),
        index: LogIndex(index),
        payload: EntryPayload::Normal(Bytes::from(data.to_string())),
    }
}

fn entries(range: std::ops::RangeInclusive<u64>, term: u64) -> Vec<Entry> {
    range.map(|i| entry(i, term, &format!("e{i}t{term}"))).collect()
}

fn hs(term: u64, commit: u64) -> HardState {
    HardState { term: Term(term), vote: Some(NodeId(1)), commit: LogIndex(commit) }
}

fn small() -> WalOptions {
    WalOptions { segment_bytes: 400 }
}

fn reopen(dir: &FaultyDir, opts: WalOptions) -> Recovered {
    Wal::open(dir.clone(), opts).expect("reopens").1
}

#[test]
fn appended_and_synced_records_come_back() {
    let dir = FaultyDir::default();
    let (mut wal, rec) = Wal::open(dir.clone(), WalOptions::default()).unwrap();
    assert_eq!(rec, Recovered::default());
    wal.append(&entries(1..=10, 1), Some(&hs(1, 7))).unwrap();
    wal.sync().unwrap();
    let rec = reopen(&dir, WalOptions::default());
    assert_eq!(rec.entries, entries(1..=10, 1));
    assert_eq!(rec.hard_state, hs(1, 7));
}

#[test]
fn rewriting_an_index_truncates_the_suffix() {
    let dir = FaultyDir::default();
    let (mut wal, _) = Wal::open(dir.clone(), WalOptions::default()).unwrap();
    wal.append(&entries(1..=10, 1), None).unwrap();
    wal.append(&entries(6..=8, 2), Some(&hs(2, 5))).unwrap();
    wal.sync().unwrap();
    let rec = reopen(&dir, WalOptions::default());
    let mut want = entries(1..=5, 1);
    want.extend(entries(6..=8, 2));
    assert_eq!(rec.entries, want);
}

#[test]
fn segments_rotate_and_compaction_removes_old_ones() {
    let dir = FaultyDir::default();
    let (mut wal, _) = Wal::open(dir.clone(), small()).unwrap();
    for i in 1..=60 {
        wal.append(&entries(i..=i, 1), Some(&hs(1, i - 1))).unwrap();
    }
    wal.sync().unwrap();
    let before = wal.segment_count();
    assert!(before > 5, "small segments rotate: {before}");
    assert_eq!(reopen(&dir, small()).entries, entries(1..=60, 1));
    let meta =
        SnapshotMeta { index: LogIndex(40), term: Term(1), conf_state: ConfState::default() };
    wal.save_compaction(&meta).unwrap();
    wal.sync().unwrap();
    wal.compact(LogIndex(40)).unwrap();
    assert!(wal.segment_count() < before);
    let rec = reopen(&dir, small());
    assert_eq!(rec.snapshot, Some(meta));
    assert_eq!(rec.entries, entries(41..=60, 1));
    assert_eq!(rec.hard_state, hs(1, 59), "the hard state survives its segment's removal");
}

#[test]
fn an_installed_snapshot_replaces_the_whole_log() {
    let dir = FaultyDir::default();
    let (mut wal, _) = Wal::open(dir.clone(), WalOptions::default()).unwrap();
    wal.append(&entries(1..=10, 1), None).unwrap();
    let meta = SnapshotMeta { index: LogIndex(5), term: Term(3), conf_state: ConfState::default() };
    wal.install_snapshot(&meta).unwrap();
    wal.append(&entries(6..=7, 3), Some(&hs(3, 6))).unwrap();
    wal.sync().unwrap();
    let rec = reopen(&dir, WalOptions::default());
    assert_eq!(rec.snapshot, Some(meta));
    assert_eq!(rec.entries, entries(6..=7, 3), "stale entries 8..10 of term 1 are gone");
}

#[test]
fn corruption_in_the_middle_stops_with_file_and_offset() {
    let dir = FaultyDir::default();
    let (mut wal, _) = Wal::open(dir.clone(), small()).unwrap();
    for i in 1..=30 {
        wal.append(&entries(i..=i, 1), None).unwrap();
    }
    wal.sync().unwrap();
    let first = dir.list().unwrap().into_iter().min().unwrap();
    dir.corrupt(&first, 20);
    match Wal::open(dir.clone(), small()) {
        Err(WalError::Corrupt { file, offset, .. }) => {
            assert_eq!(file, first);
            assert_eq!(offset, 0, "the damaged record starts the segment");
            let msg = WalError::Corrupt { file, offset, reason: "checksum mismatch" }.to_string();
            assert!(msg.contains(&first) && msg.contains("offset 0"), "{msg}");
        }
        other => panic!("expected corruption, got {other:?}"),
    }
}

#[test]
fn a_torn_tail_on_real_files_is_cut_and_writing_continues() {
    let path = std::env::temp_dir().join(format!("cairn-wal-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    let dir = OsDir::create(&path).unwrap();
    let (mut wal, _) = Wal::open(dir.clone(), WalOptions { segment_bytes: 1 << 16 }).unwrap();
    wal.append(&entries(1..=3, 1), Some(&hs(1, 3))).unwrap();
    wal.sync().unwrap();
    drop(wal);
    // Simulate a torn write: half a record of garbage after the valid data.
    let name = dir.list().unwrap().pop().unwrap();
    let mut f = dir.open(&name).unwrap();
    use cairn_storage::fs::File;
    let mut head = [0u8; 4096];
    f.read_at(0, &mut head).unwrap();
    let end = head.iter().rposition(|b| *b != 0).unwrap() + 1;
    f.write_at(end as u64, &[0, 0, 0, 40, 1, 2, 3, 4, 1, 9, 9]).unwrap();
    drop(f);
    let (mut wal, rec) = Wal::open(dir.clone(), WalOptions { segment_bytes: 1 << 16 }).unwrap();
    assert_eq!(rec.entries, entries(1..=3, 1));
    wal.append(&entries(4..=4, 1), None).unwrap();
    wal.sync().unwrap();
    drop(wal);
    let (_, rec) = Wal::open(dir, WalOptions { segment_bytes: 1 << 16 }).unwrap();
    assert_eq!(rec.entries, entries(1..=4, 1));
    std::fs::remove_dir_all(&path).unwrap();
}

#[derive(Clone, Debug)]
enum Op {
    /// Append `count` entries from `back` below the next index (a conflicting rewrite if > 0).
    Append {
        back: u64,
        count: u64,
        term_bump: bool,
        with_hs: bool,
    },
    Sync,
    Crash(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0u64..4, 1u64..5, any::<bool>(), any::<bool>())
            .prop_map(|(back, count, term_bump, with_hs)| Op::Append { back, count, term_bump, with_hs }),
        3 => Just(Op::Sync),
        1 => any::<u64>().prop_map(Op::Crash),
    ]
}

/// The naive model: the log and hard state after every record, and which was last synced.
struct Model {
    entries: Vec<Entry>,
    hs: HardState,
    states: Vec<(Vec<Entry>, HardState)>,
    synced: usize,
    term: u64,
}

impl Model {
    fn record(&mut self) {
        self.states.push((self.entries.clone(), self.hs));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// After any crash, the log reopens to exactly one of the states it passed through since
    /// the last sync: nothing synced is lost, and nothing half-written appears.
    #[test]
    fn crashes_recover_a_state_at_or_after_the_last_sync(ops in prop::collection::vec(op(), 1..60)) {
        let dir = FaultyDir::default();
        let (mut wal, _) = Wal::open(dir.clone(), small()).unwrap();
        let mut m = Model { entries: vec![], hs: HardState::default(), states: vec![], synced: 0, term: 1 };
        m.record();
        for op in ops {
            match op {
                Op::Append { back, count, term_bump, with_hs } => {
                    let next = m.entries.len() as u64 + 1;
                    // Never rewrite what the hard state says is committed.
                    let start = next.saturating_sub(back).max(m.hs.commit.0 + 1);
                    if term_bump {
                        m.term += 1;
                    }
                    let new = entries(start..=start + count - 1, m.term);
                    let hard = with_hs.then(|| hs(m.term, start - 1));
                    wal.append(&new, hard.as_ref()).unwrap();
                    for e in new {
                        m.entries.truncate(e.index.0 as usize - 1);
                        m.entries.push(e);
                        m.record();
                    }
                    if let Some(h) = hard {
                        m.hs = h;
                        m.record();
                    }
                }
                Op::Sync => {
                    wal.sync().unwrap();
                    m.synced = m.states.len() - 1;
                }
                Op::Crash(seed) => {
                    drop(wal);
                    dir.crash(seed);
                    let (w, rec) = Wal::open(dir.clone(), small()).expect("a crash never corrupts");
                    wal = w;
                    let k = m.states[m.synced..]
                        .iter()
                        .position(|(e, h)| *e == rec.entries && *h == rec.hard_state);
                    prop_assert!(k.is_some(), "recovered {:?} is no state since the last sync", rec);
                    let k = m.synced + k.unwrap_or(0);
                    m.states.truncate(k + 1);
                    let (e, h) = m.states[k].clone();
                    m.entries = e;
                    m.hs = h;
                    // What was recovered is on disk now: treat it as synced.
                    wal.sync().unwrap();
                    m.synced = k;
                }
            }
        }
    }

    /// An IO error at any point stops the log (every later call fails), and after a crash it
    /// reopens with everything synced before the error.
    #[test]
    fn any_io_failure_fails_stop_and_loses_nothing_synced(fail_at in 0u64..80, seed in any::<u64>()) {
        let dir = FaultyDir::default();
        let (mut wal, _) = Wal::open(dir.clone(), small()).unwrap();
        dir.fail_after(fail_at);
        let mut synced = Vec::new();
        let mut failed = false;
        for i in 1..=40u64 {
            let r = wal.append(&entries(i..=i, 1), None).and_then(|()| wal.sync());
            match r {
                Ok(()) => synced = entries(1..=i, 1),
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        if failed {
            prop_assert!(matches!(wal.append(&entries(99..=99, 1), None), Err(WalError::Poisoned)));
            prop_assert!(matches!(wal.sync(), Err(WalError::Poisoned)));
        }
        drop(wal);
        dir.crash(seed);
        let rec = reopen(&dir, small());
        prop_assert!(rec.entries.len() >= synced.len());
        prop_assert_eq!(&rec.entries[..synced.len()], &synced[..]);
    }
}
