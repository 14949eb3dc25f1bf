//! Damage to the log that no crash explains: opening refuses it, names the file and offset and
//! changes no byte; only the explicit repair truncates, keeping a copy of what it cuts.

use bytes::Bytes;
use cairn_raft::{Entry, EntryPayload, HardState, LogIndex, NodeId, Term};
use cairn_storage::faulty::FaultyDir;
use cairn_storage::fs::{Dir, File, OsDir};
use cairn_storage::{repair, Promise, Repaired, Wal, WalError, WalOptions};

use crate::common;
use common::{image, read as bytes};

/// Start offsets of the records in a segment.
fn record_offsets(data: &[u8]) -> Vec<usize> {
    common::records(data).into_iter().map(|(start, _)| start).collect()
}

fn entry(i: u64) -> Entry {
    Entry {
        term: Term(1),
        index: LogIndex(i),
        payload: EntryPayload::Normal(Bytes::from(format!("value-{i}"))),
    }
}

fn entries(range: std::ops::RangeInclusive<u64>) -> Vec<Entry> {
    range.map(entry).collect()
}

const OPTS: WalOptions = WalOptions { segment_bytes: 1 << 20 };

/// One segment of 300 entries, synced, and the offsets of its records.
fn one_full_segment() -> (FaultyDir, String, Vec<usize>) {
    let dir = FaultyDir::default();
    let (mut wal, _) = Wal::open(dir.clone(), OPTS).expect("opens");
    for i in 1..=300 {
        wal.append(&entries(i..=i), None).expect("appends");
    }
    wal.sync().expect("syncs");
    drop(wal);
    let name = dir.list().expect("lists").pop().expect("a segment");
    let offsets = record_offsets(&bytes(&dir, &name));
    assert_eq!(offsets.len(), 300);
    (dir, name, offsets)
}

fn expect_corrupt_at(dir: &FaultyDir, name: &str, at: usize) {
    let before = image(dir);
    for _ in 0..2 {
        match Wal::open(dir.clone(), OPTS) {
            Err(WalError::Corrupt { file, offset, reason }) => {
                assert_eq!((file.as_str(), offset), (name, at as u64), "{reason}");
            }
            other => panic!("expected corruption at {at}, got {:?}", other.map(|r| r.1)),
        }
        assert!(image(dir) == before, "a refused open changes no byte");
    }
}

#[test]
fn a_damaged_length_with_valid_records_after_is_corruption_not_a_torn_tail() {
    // Each damage to record 100's length: longer than the file, longer within it, shorter.
    for (byte, xor) in [(1, 0x5A), (2, 0x01), (3, 0x08)] {
        let (dir, name, offsets) = one_full_segment();
        let at = offsets[100];
        let mut f = dir.open(&name).expect("opens");
        let mut b = [0u8];
        f.read_at((at + byte) as u64, &mut b).expect("reads");
        f.write_at((at + byte) as u64, &[b[0] ^ xor]).expect("writes");
        f.sync_data().expect("syncs");
        expect_corrupt_at(&dir, &name, at);
    }
}

#[test]
fn a_zeroed_length_with_valid_records_after_is_corruption() {
    let (dir, name, offsets) = one_full_segment();
    let at = offsets[150];
    dir.open(&name).expect("opens").write_at(at as u64, &[0, 0, 0, 0]).expect("writes");
    expect_corrupt_at(&dir, &name, at);
}

#[test]
fn bytes_after_the_data_of_a_sealed_segment_are_corruption() {
    let dir = FaultyDir::default();
    let (mut wal, _) = Wal::open(dir.clone(), WalOptions { segment_bytes: 400 }).expect("opens");
    for i in 1..=30 {
        wal.append(&entries(i..=i), None).expect("appends");
    }
    wal.sync().expect("syncs");
    drop(wal);
    // A sealed segment whose zero tail has room for a whole header: the damage is not next to
    // the last record, so only the check for bytes after the data can see it.
    let mut names = dir.list().expect("lists");
    names.sort();
    names.pop();
    let (first, end) = names
        .into_iter()
        .map(|n| {
            let data = bytes(&dir, &n);
            let end = data.iter().rposition(|b| *b != 0).expect("data") + 1;
            (n, end, data.len())
        })
        .find(|(_, end, len)| len - end > 16)
        .map(|(n, end, _)| (n, end))
        .expect("a sealed segment with a zero tail of 16 bytes");
    dir.corrupt(&first, end as u64 + 12);
    let before = image(&dir);
    match Wal::open(dir.clone(), WalOptions { segment_bytes: 400 }) {
        Err(WalError::Corrupt { file, offset, .. }) => {
            assert_eq!((file, offset), (first, end as u64))
        }
        other => panic!("expected corruption, got {:?}", other.map(|r| r.1)),
    }
    assert!(image(&dir) == before);
}

#[test]
fn a_torn_last_record_is_still_cut_and_nothing_valid_is_lost() {
    let (dir, name, offsets) = one_full_segment();
    // A crash tore the last record: its second half never reached the disk.
    let last = offsets[299];
    let data = bytes(&dir, &name);
    let end = data.iter().rposition(|b| *b != 0).expect("data") + 1;
    let mid = last + (end - last) / 2;
    dir.open(&name).expect("opens").write_at(mid as u64, &vec![0u8; end - mid]).expect("writes");
    let (_, rec) = Wal::open(dir.clone(), OPTS).expect("a torn tail opens");
    assert_eq!(rec.entries, entries(1..=299));
    assert!(bytes(&dir, &name)[last..].iter().all(|b| *b == 0), "the torn record is zeroed");
}

#[test]
fn repair_cuts_at_the_damage_keeps_a_copy_and_the_log_opens() {
    let dir = FaultyDir::default();
    let opts = WalOptions { segment_bytes: 400 };
    let (mut wal, _) = Wal::open(dir.clone(), opts).expect("opens");
    for i in 1..=40 {
        wal.append(&entries(i..=i), None).expect("appends");
    }
    wal.sync().expect("syncs");
    drop(wal);
    let mut names = dir.list().expect("lists");
    names.sort();
    assert!(names.len() > 3, "several segments: {names:?}");
    let damaged = names[1].clone();
    let data = bytes(&dir, &damaged);
    let at = record_offsets(&data)[2];
    dir.corrupt(&damaged, at as u64 + 12);
    assert!(Wal::open(dir.clone(), opts).is_err());

    let repaired = repair(&dir).expect("repairs");
    let cuts = &repaired.cuts;
    assert_eq!((cuts[0].file.as_str(), cuts[0].offset), (damaged.as_str(), at as u64));
    let end = data.iter().rposition(|b| *b != 0).expect("data") + 1;
    let mut cut = data[at..end].to_vec();
    cut[12] ^= 0x5A;
    assert_eq!(bytes(&dir, &cuts[0].saved_as), cut, "the copy holds exactly what was cut");
    assert_eq!(cuts.len(), names.len() - 1, "every later segment is moved aside");
    for later in &names[2..] {
        assert!(!dir.list().expect("lists").contains(later));
    }
    let (_, rec) = Wal::open(dir.clone(), opts).expect("the repaired log opens");
    let kept = rec.entries.len() as u64;
    assert!(kept > 0 && kept < 40);
    assert_eq!(rec.entries, entries(1..=kept));
    // No hard state was ever written, so none was read in the cut: the damaged bytes may have
    // held a vote in term 1, and the member moves on to term 2 without one.
    let promise = Promise { term: Term(2), vote: None, read: false };
    assert_eq!(repaired.promise, Some(promise));
    assert_eq!((rec.hard_state.term, rec.hard_state.vote), (Term(2), None));
    assert_eq!(repair(&dir).expect("nothing left to repair"), Repaired::default());
}

fn at_term(term: u64, i: u64) -> Entry {
    Entry { term: Term(term), ..entry(i) }
}

fn hard_state(term: u64, vote: u64, commit: u64) -> HardState {
    HardState { term: Term(term), vote: Some(NodeId(vote)), commit: LogIndex(commit) }
}

/// A member's log across an election: entries 1..=20 in term 1 (it voted for member 1), then a
/// vote for member 2 in term 3 and entries 21..=40 in term 3, each write with its hard state as
/// the driver writes them when `commits` (else the entries of term 3 come alone). Returns the
/// directory, the one segment's name, and where the last entry of term 1 and the vote for
/// member 2 lie in it.
fn across_an_election(commits: bool) -> (FaultyDir, String, usize, usize) {
    let dir = FaultyDir::default();
    let (mut wal, _) = Wal::open(dir.clone(), OPTS).expect("opens");
    for i in 1..=20 {
        wal.append(&[at_term(1, i)], Some(&hard_state(1, 1, i - 1))).expect("appends");
    }
    wal.append(&[], Some(&hard_state(3, 2, 20))).expect("votes");
    for i in 21..=40 {
        let hs = hard_state(3, 2, i - 1);
        wal.append(&[at_term(3, i)], commits.then_some(&hs)).expect("appends");
    }
    wal.sync().expect("syncs");
    drop(wal);
    let name = dir.list().expect("lists").pop().expect("a segment");
    let offsets = record_offsets(&bytes(&dir, &name));
    // An entry and a hard state per write of term 1, then the vote.
    let (last_of_term_1, vote) = (offsets[2 * 19], offsets[2 * 20]);
    (dir, name, last_of_term_1, vote)
}

/// The vote after the damage is kept: without it, the member would restart in term 1, free to
/// vote in term 3 again, for another candidate than the one it chose.
#[test]
fn repair_keeps_the_vote_the_cut_held() {
    let (dir, name, damaged, _) = across_an_election(true);
    dir.corrupt(&name, damaged as u64 + 12);
    let repaired = repair(&dir).expect("repairs");
    assert_eq!(repaired.cuts[0].offset, damaged as u64);
    let promise = Promise { term: Term(3), vote: Some(NodeId(2)), read: true };
    assert_eq!(repaired.promise, Some(promise));
    let (_, rec) = Wal::open(dir.clone(), OPTS).expect("the repaired log opens");
    assert_eq!(rec.entries.len(), 19, "the entries from the damage on are cut");
    assert_eq!(rec.hard_state, hard_state(3, 2, 18), "the vote of term 3 stays");
}

/// When the damaged record may itself be the last hard state (nothing after it reads as one),
/// its term and vote are unknown: the member moves past the highest term it can see.
#[test]
fn repair_moves_past_a_term_whose_vote_may_be_lost() {
    let (dir, name, _, vote) = across_an_election(false);
    dir.corrupt(&name, vote as u64 + 12);
    let repaired = repair(&dir).expect("repairs");
    assert_eq!(repaired.cuts[0].offset, vote as u64);
    let promise = Promise { term: Term(4), vote: None, read: false };
    assert_eq!(repaired.promise, Some(promise));
    let (_, rec) = Wal::open(dir.clone(), OPTS).expect("the repaired log opens");
    assert_eq!(rec.entries.len(), 20);
    assert_eq!((rec.hard_state.term, rec.hard_state.vote), (Term(4), None));
    assert_eq!(rec.hard_state.commit, LogIndex(19), "the commit index kept stays");
}

#[test]
fn on_real_files_the_error_names_the_path_and_offset() {
    let path = std::env::temp_dir().join(format!("cairn-wal-damage-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    let dir = OsDir::create(&path).expect("creates");
    let (mut wal, _) = Wal::open(dir.clone(), OPTS).expect("opens");
    wal.append(&entries(1..=50), None).expect("appends");
    wal.sync().expect("syncs");
    drop(wal);
    let name = dir.list().expect("lists").pop().expect("a segment");
    let at = record_offsets(&bytes(&dir, &name))[10];
    let mut f = dir.open(&name).expect("opens");
    f.write_at(at as u64 + 1, &[0x7F]).expect("writes");
    let before = std::fs::read(path.join(&name)).expect("reads");
    let err = Wal::open(dir.clone(), OPTS).expect_err("refuses").in_dir(&path);
    let msg = err.to_string();
    assert!(msg.contains(&path.join(&name).display().to_string()), "{msg}");
    assert!(msg.contains(&format!("offset {at}")), "{msg}");
    assert_eq!(std::fs::read(path.join(&name)).expect("reads"), before);
    std::fs::remove_dir_all(&path).expect("cleans up");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

    /// Wherever one byte of the log is damaged, the repaired log never lets the member vote in
    /// term 3 for anyone but the candidate it chose there: it ends in term 3 with that vote, or
    /// past term 3.
    #[test]
    fn a_repaired_log_never_forgets_a_vote(pick in proptest::prelude::any::<proptest::sample::Index>(), flip in 1u8..) {
        let (dir, name, _, _) = across_an_election(true);
        let data = bytes(&dir, &name);
        let end = data.iter().rposition(|b| *b != 0).expect("data") + 1;
        let at = pick.index(end);
        dir.open(&name).expect("opens").write_at(at as u64, &[data[at] ^ flip]).expect("damages");
        repair(&dir).expect("repairs");
        let (_, rec) = Wal::open(dir.clone(), OPTS).expect("the repaired log opens");
        let (term, vote) = (rec.hard_state.term, rec.hard_state.vote);
        proptest::prop_assert!(term > Term(3) || (term == Term(3) && vote == Some(NodeId(2))),
            "damage at {at}: term {term:?}, vote {vote:?}");
    }
}
