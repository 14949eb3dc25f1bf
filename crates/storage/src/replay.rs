//! Rebuilding the log's contents from its segments when it is opened.

use cairn_raft::{Entry, HardState, LogIndex, SnapshotMeta};

use crate::codec;
use crate::error::{io_err as io, WalError};
use crate::fs::{Dir, File};
use crate::record::{
    find_record, next_record, Next, KIND_ENTRY, KIND_HARD_STATE, KIND_INSTALL, KIND_SNAPSHOT,
};

/// What the log held when opened.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    pub hard_state: HardState,
    /// The latest compaction point, if the log was ever compacted.
    pub snapshot: Option<SnapshotMeta>,
    /// Entries after the snapshot, contiguous.
    pub entries: Vec<Entry>,
}

/// What replaying the segments found: the log's contents, and where writing resumes.
pub(crate) struct Replayed<F> {
    pub(crate) recovered: Recovered,
    /// (sequence number, file name, highest entry index) of each segment, oldest first.
    pub(crate) segments: Vec<(u64, String, LogIndex)>,
    /// The last segment, open for writing.
    pub(crate) active: F,
    /// Where the next record goes in `active`.
    pub(crate) offset: u64,
}

/// Applies one record to the state being rebuilt.
fn apply(
    rec: &mut Recovered,
    max_index: &mut LogIndex,
    kind: u8,
    payload: &[u8],
) -> Result<(), &'static str> {
    match kind {
        KIND_ENTRY => {
            let e: Entry = codec::decode_entry(payload).map_err(|e| e.0)?;
            // A rewritten index supersedes everything from there on (log suffix truncation).
            let keep = rec.entries.partition_point(|x| x.index < e.index);
            rec.entries.truncate(keep);
            *max_index = (*max_index).max(e.index);
            rec.entries.push(e);
        }
        KIND_HARD_STATE => rec.hard_state = codec::decode_hard_state(payload).map_err(|e| e.0)?,
        KIND_SNAPSHOT => {
            let meta = codec::decode_snapshot_meta(payload).map_err(|e| e.0)?;
            rec.entries.retain(|e| e.index > meta.index);
            rec.snapshot = Some(meta);
        }
        KIND_INSTALL => {
            rec.snapshot = Some(codec::decode_snapshot_meta(payload).map_err(|e| e.0)?);
            rec.entries.clear();
        }
        _ => return Err("unknown record kind"),
    }
    Ok(())
}

/// Replays segment `name` into `rec`. Returns the end of its valid data and the end of a torn
/// tail after it (equal when there is none), which only the last segment may have.
fn replay_segment<F: File>(
    file: &F,
    name: &str,
    is_last: bool,
    rec: &mut Recovered,
    max_index: &mut LogIndex,
) -> Result<(usize, usize), WalError> {
    let data = read_segment(file, name)?;
    let mut pos = 0;
    loop {
        let bad = match next_record(&data, pos) {
            Next::Record { kind, payload, next } => {
                apply(rec, max_index, kind, payload)
                    .map_err(|reason| corrupt(name, pos, reason))?;
                pos = next;
                continue;
            }
            Next::End => None,
            Next::Bad { reason, .. } => Some(reason),
        };
        return end_of_data(name, &data, pos, bad, is_last);
    }
}

pub(crate) fn read_segment<F: File>(file: &F, name: &str) -> Result<Vec<u8>, WalError> {
    let len = file.size().map_err(io("stat", name))?;
    let mut data = vec![0u8; len as usize];
    file.read_at(0, &mut data).map_err(io("read", name))?;
    Ok(data)
}

fn corrupt(name: &str, offset: usize, reason: &'static str) -> WalError {
    WalError::Corrupt { file: name.to_string(), offset: offset as u64, reason }
}

/// Decides what the bytes from `pos` (where the valid records stop; `bad` says why if a record
/// is damaged there) to the end of the segment are. Only zeros: the preallocated rest. Bytes
/// with no valid record among them, in the last segment: a write torn by a crash, never
/// acknowledged, to be cut off (zeroed) once the whole log replayed. Returns the ends of the
/// valid data and of the torn tail. Anything else is corruption, and the file is left exactly
/// as it is: a valid record after the damage, or damage in a sealed segment (synced in full
/// before the next one began), cannot come from a crash.
fn end_of_data(
    name: &str,
    data: &[u8],
    pos: usize,
    bad: Option<&'static str>,
    is_last: bool,
) -> Result<(usize, usize), WalError> {
    let Some(last_nonzero) = crate::record::last_nonzero(&data[pos..]).map(|i| pos + i) else {
        return Ok((pos, pos));
    };
    let reason = bad.unwrap_or("zero length field with data after it");
    if find_record(data, pos + 1, last_nonzero + 1).is_some() {
        return Err(corrupt(name, pos, followed(reason)));
    }
    if !is_last {
        return Err(corrupt(name, pos, reason));
    }
    Ok((pos, last_nonzero + 1))
}

/// The reason for damage that valid records follow, which no crash explains.
fn followed(reason: &'static str) -> &'static str {
    match reason {
        "checksum mismatch" => "checksum mismatch, with valid records after it",
        "record runs past the end of the file" => {
            "record length runs past the end of the file, with valid records after it"
        }
        "truncated header" => "truncated header, with valid records after it",
        _ => "zero length field, with valid records after it",
    }
}

/// Replays every segment in order; positions writing after the last valid record.
pub(crate) fn replay<D: Dir>(
    dir: &D,
    names: Vec<(u64, String)>,
) -> Result<Replayed<D::File>, WalError> {
    let mut rec = Recovered::default();
    let mut segments = Vec::with_capacity(names.len());
    let last = names.len() - 1;
    let mut active = None;
    let (mut offset, mut torn_end) = (0, 0);
    for (i, (seq, name)) in names.into_iter().enumerate() {
        let file = dir.open(&name).map_err(io("open", &name))?;
        let mut max_index = LogIndex::ZERO;
        let (end, torn) = replay_segment(&file, &name, i == last, &mut rec, &mut max_index)?;
        if i == last {
            active = Some((file, name.clone()));
            (offset, torn_end) = (end, torn);
        }
        segments.push((seq, name, max_index));
    }
    let snap = rec.snapshot.as_ref().map_or(LogIndex::ZERO, |s| s.index);
    rec.entries.retain(|e| e.index > snap);
    let contiguous = rec
        .entries
        .iter()
        .enumerate()
        .all(|(i, e)| e.index.0.checked_sub(snap.0) == Some(1 + i as u64));
    if !contiguous {
        return Err(WalError::Corrupt { file: "wal".into(), offset: 0, reason: "gap in the log" });
    }
    let (mut active, name) = active.expect("at least one segment");
    // Only now that the whole log replayed: a refused log keeps every byte.
    if torn_end > offset {
        let zeros = vec![0u8; torn_end - offset];
        active.write_at(offset as u64, &zeros).map_err(io("repair", &name))?;
        active.sync_data().map_err(io("sync", &name))?;
    }
    Ok(Replayed { recovered: rec, segments, active, offset: offset as u64 })
}
