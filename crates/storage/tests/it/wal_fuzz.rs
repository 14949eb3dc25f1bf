//! Fuzzing WAL replay (proptest, on stable): whatever bytes the segments hold, opening never
//! panics; a refused open changes no byte; an open that succeeds recovers every record the
//! damage left intact (never a silent truncation of a valid record).
//!
//! CI runs a few cases per property. A longer run is one command:
//! `PROPTEST_CASES=20000 cargo test --release -p cairn-storage --test wal_fuzz`.

use bytes::Bytes;
use cairn_raft::{Entry, EntryPayload, HardState, LogIndex, NodeId, Term};
use cairn_storage::faulty::FaultyDir;
use cairn_storage::fs::{Dir, File};
use cairn_storage::{Wal, WalError, WalOptions};
use proptest::prelude::*;

use crate::common;
use common::{image, read};

const SEGMENT: u64 = 600;

fn opts() -> WalOptions {
    WalOptions { segment_bytes: SEGMENT }
}

/// Cases per property: `PROPTEST_CASES` if set, else a short run for CI.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(64);
    ProptestConfig { cases, ..ProptestConfig::default() }
}

fn write<D: Dir>(dir: &D, name: &str, data: &[u8]) {
    let mut f = dir.open(name).expect("opens");
    f.set_len(data.len() as u64).expect("sizes");
    f.write_at(0, data).expect("writes");
    f.sync_data().expect("syncs");
}

/// Opens the log and checks what any outcome must satisfy: a refusal is `Corrupt` and leaves
/// every byte as it was. Returns the recovered entries when the log opened.
fn open_checked(dir: &FaultyDir) -> Result<Option<Vec<Entry>>, TestCaseError> {
    let before = image(dir);
    match Wal::open(dir.clone(), opts()) {
        Ok((_, rec)) => Ok(Some(rec.entries)),
        Err(WalError::Corrupt { .. }) => {
            prop_assert!(image(dir) == before, "a refused open changed bytes");
            Ok(None)
        }
        Err(e) => Err(TestCaseError::fail(format!("not a corruption error: {e}"))),
    }
}

/// Frames a record as the log does: `len u32 | crc32c u32 | kind u8 | payload`.
fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut body = vec![kind];
    body.extend_from_slice(payload);
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// Per segment, its name and each entry record's (offset, end, entry index).
type Layout = Vec<(String, Vec<(usize, usize, u64)>)>;

/// A log written by the log itself: entries 1..=n in batches, some with a hard state, synced.
/// Returns the directory and, per segment, each entry record's (offset, end, index).
fn written_log(batches: &[(u8, bool)]) -> (FaultyDir, Layout) {
    let dir = FaultyDir::default();
    let (mut wal, _) = Wal::open(dir.clone(), opts()).expect("opens");
    let mut next = 1u64;
    for (count, with_hs) in batches {
        let batch: Vec<Entry> = (next..next + u64::from(*count))
            .map(|i| Entry {
                term: Term(1),
                index: LogIndex(i),
                payload: EntryPayload::Normal(Bytes::from(format!("v{i}"))),
            })
            .collect();
        next += u64::from(*count);
        let hs = HardState { term: Term(1), vote: Some(NodeId(1)), commit: LogIndex(next - 1) };
        wal.append(&batch, with_hs.then_some(&hs)).expect("appends");
    }
    wal.sync().expect("syncs");
    drop(wal);
    let layout = image(&dir).into_iter().map(|(name, data)| (name, entry_records(&data))).collect();
    (dir, layout)
}

/// Each entry record of a well-formed segment as (offset, end, entry index).
fn entry_records(data: &[u8]) -> Vec<(usize, usize, u64)> {
    let entries = common::records(data).into_iter().filter(|&(start, _)| data[start + 8] == 1);
    entries
        .map(|(start, end)| {
            let index =
                u64::from_be_bytes(data[start + 17..start + 25].try_into().expect("8 bytes"));
            (start, end, index)
        })
        .collect()
}

/// A change to one segment: xor bytes at an offset, or cut the file short.
#[derive(Clone, Debug)]
enum Damage {
    Xor { segment: usize, offset: usize, bytes: Vec<u8> },
    Truncate { segment: usize, len: usize },
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        4 => (any::<usize>(), 0..SEGMENT as usize, prop::collection::vec(1u8..=255, 1..6))
            .prop_map(|(segment, offset, bytes)| Damage::Xor { segment, offset, bytes }),
        1 => (any::<usize>(), 0..SEGMENT as usize)
            .prop_map(|(segment, len)| Damage::Truncate { segment, len }),
    ]
}

/// Applies `d` to the directory; returns the damaged (segment name, byte range).
fn apply(dir: &FaultyDir, names: &[String], d: &Damage) -> (String, usize, usize) {
    let (segment, from, to) = match d {
        Damage::Xor { segment, offset, bytes } => (*segment, *offset, offset + bytes.len()),
        Damage::Truncate { segment, len } => (*segment, *len, usize::MAX),
    };
    let name = names[segment % names.len()].clone();
    let mut data = read(dir, &name);
    match d {
        Damage::Xor { bytes, .. } => {
            for (i, x) in bytes.iter().enumerate() {
                if let Some(b) = data.get_mut(from + i) {
                    *b ^= x;
                }
            }
        }
        Damage::Truncate { .. } => data.truncate(from),
    }
    write(dir, &name, &data);
    (name, from, to)
}

proptest! {
    #![proptest_config(config())]

    /// Arbitrary bytes, alone or after a valid record, as the only segment: never a panic.
    #[test]
    fn arbitrary_segment_bytes_never_panic(
        junk in prop::collection::vec(any::<u8>(), 0..700),
        valid_prefix in any::<bool>(),
    ) {
        let dir = FaultyDir::default();
        let mut data = if valid_prefix { frame(2, &[0; 24]) } else { Vec::new() };
        data.extend_from_slice(&junk);
        write(&dir, "0000000000000001-0000000000000001.wal", &data);
        open_checked(&dir)?;
    }

    /// Well-framed records (valid checksums) of any kind with any payload: decoding and
    /// applying them never panics.
    #[test]
    fn framed_records_with_arbitrary_payloads_never_panic(
        records in prop::collection::vec((0u8..6, prop::collection::vec(any::<u8>(), 0..80)), 0..12),
        segments in 1usize..3,
    ) {
        let dir = FaultyDir::default();
        for s in 0..segments {
            let data: Vec<u8> = records
                .iter()
                .skip(s)
                .flat_map(|(kind, payload)| frame(*kind, payload))
                .collect();
            write(&dir, &format!("{:016x}-{:016x}.wal", s + 1, 1), &data);
        }
        open_checked(&dir)?;
    }

    /// A log the log wrote, then damaged: if it opens, every entry record the damage left
    /// intact comes back.
    #[test]
    fn damage_never_silently_drops_an_intact_record(
        batches in prop::collection::vec((1u8..5, any::<bool>()), 1..40),
        damages in prop::collection::vec(damage(), 1..3),
    ) {
        let (dir, layout) = written_log(&batches);
        let names: Vec<String> = layout.iter().map(|(n, _)| n.clone()).collect();
        let hit: Vec<(String, usize, usize)> =
            damages.iter().map(|d| apply(&dir, &names, d)).collect();
        let Some(recovered) = open_checked(&dir)? else { return Ok(()) };
        for (name, records) in &layout {
            for (start, end, index) in records {
                let touched = hit.iter().any(|(n, from, to)| n == name && from < end && to > start);
                if !touched {
                    prop_assert!(
                        recovered.iter().any(|e| e.index.0 == *index),
                        "entry {} in {} is intact but was dropped", index, name
                    );
                }
            }
        }
    }
}
