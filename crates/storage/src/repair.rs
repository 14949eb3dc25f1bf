//! The explicit repair of a damaged log: an operator's decision, never done on open.
//!
//! Opening refuses a log with damage no crash explains, and changes none of its bytes. Repair
//! truncates the log at the first damaged record: it copies the bytes it cuts into files beside
//! the segments (`<segment>.cut-<offset>`, which replay ignores), makes the copies durable, and
//! only then zeroes the damaged segment from that record on and removes every later segment.
//! What the cut held is lost to this member's log: entries it had acknowledged must come back
//! from the other members (or the member is replaced).
//!
//! Its promises are not lost: a vote cast in a term, forgotten, would let the member vote again
//! in that term, for another candidate, and two leaders could be elected in it. So repair reads
//! every record of the cut that still checks out, and the log then ends with a hard state whose
//! term and vote cover the cut's: the last hard state the cut held, or, where damaged bytes may
//! have held a later one, the next term with no vote (a member may always move to a later term;
//! that costs at most an election).

use cairn_raft::{HardState, NodeId, Term};

use crate::codec;
use crate::error::{io_err as io, WalError};
use crate::fs::{Dir, File};
use crate::record::{find_record, next_record, Next, KIND_ENTRY, KIND_HARD_STATE};
use crate::replay::{read_segment, Replayed};
use crate::wal::{segment_names, Wal, WalOptions};

/// One cut repair made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cut {
    /// The segment cut.
    pub file: String,
    /// Where in it the cut starts; the segment keeps what lies before.
    pub offset: u64,
    /// Why replay refused the bytes there.
    pub reason: &'static str,
    /// The file holding a copy of what was cut (from `offset` to the segment's last nonzero
    /// byte, or the whole segment when a whole later segment was removed).
    pub saved_as: String,
}

/// What a repair did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Repaired {
    /// The cuts, in order (none when the log opened as it was).
    pub cuts: Vec<Cut>,
    /// The term and vote the repaired log now ends with, when the cut held (or may have held) a
    /// later one than the bytes kept.
    pub promise: Option<Promise>,
}

/// The term and vote a repair wrote after the kept log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Promise {
    pub term: Term,
    pub vote: Option<NodeId>,
    /// Whether the cut showed this term and vote. If not, damaged bytes may have held a vote
    /// in the cut's last term, so the member moves past that term without one.
    pub read: bool,
}

/// Truncates the log in `dir` at its first damaged record, keeping copies of what it cuts, and
/// ends the log with the term and vote the cut held (see the module's comment). Run it only
/// while no member uses the directory. A damage that cutting cannot fix (entries missing between
/// segments) stays an error.
pub fn repair<D: Dir + Clone>(dir: &D) -> Result<Repaired, WalError> {
    let mut cuts = Vec::new();
    let mut seen = Seen::default();
    let names = segment_names(dir)?;
    if names.is_empty() {
        return Ok(Repaired::default());
    }
    // Each round cuts at least one segment's tail or removes segments: it ends.
    for _ in 0..=names.len() {
        let names = segment_names(dir)?;
        let (file, offset, reason) = match crate::replay::replay(dir, names.clone()) {
            Ok(replayed) => {
                let promise =
                    if cuts.is_empty() { None } else { keep_promises(dir, replayed, &seen)? };
                return Ok(Repaired { cuts, promise });
            }
            Err(WalError::Corrupt { file, offset, reason })
                if names.iter().any(|n| n.1 == file) =>
            {
                (file, offset, reason)
            }
            Err(e) => return Err(e),
        };
        let later: Vec<String> =
            names.iter().map(|n| n.1.clone()).skip_while(|n| *n != file).skip(1).collect();
        let saved_as = format!("{file}.cut-{offset}");
        cut_tail(dir, &file, offset, &saved_as, &mut seen)?;
        cuts.push(Cut { file, offset, reason, saved_as });
        for name in later {
            let saved_as = format!("{name}.cut-0");
            save(dir, &name, 0, &saved_as, &mut seen)?;
            dir.remove(&name).map_err(io("remove", &name))?;
            dir.sync().map_err(io("sync", "wal directory"))?;
            cuts.push(Cut { file: name, offset: 0, reason: "after a cut", saved_as });
        }
    }
    Err(WalError::Corrupt { file: "wal".into(), offset: 0, reason: "repair did not converge" })
}

/// Copies `name` from `offset` to its last nonzero byte into `saved_as`, durably, and notes in
/// `seen` the terms and votes the copied records hold; returns the end of the copied range.
fn save<D: Dir>(
    dir: &D,
    name: &str,
    offset: u64,
    saved_as: &str,
    seen: &mut Seen,
) -> Result<usize, WalError> {
    let file = dir.open(name).map_err(io("open", name))?;
    let data = read_segment(&file, name)?;
    let from = (offset as usize).min(data.len());
    let end = crate::record::last_nonzero(&data[from..]).map_or(from, |i| from + i + 1);
    seen.scan(&data[from..end]);
    let mut copy = dir.open(saved_as).map_err(io("create", saved_as))?;
    copy.set_len(0).map_err(io("truncate", saved_as))?;
    copy.write_at(0, &data[from..end]).map_err(io("write", saved_as))?;
    copy.sync_data().map_err(io("sync", saved_as))?;
    dir.sync().map_err(io("sync", "wal directory"))?;
    Ok(end)
}

/// Saves a copy of `name` from `offset` on (see [`save`]), then zeroes that range, durably.
fn cut_tail<D: Dir>(
    dir: &D,
    name: &str,
    offset: u64,
    saved_as: &str,
    seen: &mut Seen,
) -> Result<(), WalError> {
    let end = save(dir, name, offset, saved_as, seen)?;
    let from = offset as usize;
    if end > from {
        let mut file = dir.open(name).map_err(io("open", name))?;
        file.write_at(offset, &vec![0u8; end - from]).map_err(io("cut", name))?;
        file.sync_data().map_err(io("sync", name))?;
    }
    Ok(())
}

/// What the records of the cut said about the member's term and vote.
#[derive(Debug, Default)]
struct Seen {
    /// The highest term of any record read (entries, hard states).
    max_term: Term,
    /// The last hard state read, in log order. Hard states are written in order of term, so
    /// it has the highest term of those read, and its vote is the one that term ended with.
    last: Option<HardState>,
    /// Whether bytes that do not read as records lie after `last` (or anywhere, without one):
    /// they may have held a later hard state.
    unread_after_last: bool,
}

impl Seen {
    /// Reads every record of `data` that checks out, skipping over bytes that do not. `data`
    /// ends at its last nonzero byte (see [`save`]), so whatever does not read before its end
    /// is unread bytes.
    fn scan(&mut self, data: &[u8]) {
        let mut pos = 0;
        while pos < data.len() {
            if let Next::Record { kind, payload, next } = next_record(data, pos) {
                self.note(kind, payload);
                pos = next;
                continue;
            }
            self.unread_after_last = true;
            match find_record(data, pos + 1, data.len()) {
                Some(at) => pos = at,
                None => return,
            }
        }
    }

    fn note(&mut self, kind: u8, payload: &[u8]) {
        match kind {
            KIND_ENTRY => {
                if let Ok(e) = codec::decode_entry(payload) {
                    self.max_term = self.max_term.max(e.term);
                }
            }
            KIND_HARD_STATE => {
                if let Ok(hs) = codec::decode_hard_state(payload) {
                    self.max_term = self.max_term.max(hs.term);
                    self.last = Some(hs);
                    self.unread_after_last = false;
                }
            }
            // Snapshot markers carry terms of entries already covered by a hard state.
            _ => {}
        }
    }

    /// The term and vote the repaired log must end with, given the hard state it kept: `None`
    /// when the kept one already says as much.
    fn promise(&self, kept: HardState) -> Option<Promise> {
        match self.last {
            // Every byte after the last hard state read is a record read: nothing later was lost.
            Some(hs)
                if !self.unread_after_last && hs.term >= self.max_term && hs.term >= kept.term =>
            {
                let same = hs.term == kept.term && hs.vote == kept.vote;
                (!same).then_some(Promise { term: hs.term, vote: hs.vote, read: true })
            }
            _ => {
                let term = self.max_term.max(kept.term);
                Some(Promise { term: Term(term.0 + 1), vote: None, read: false })
            }
        }
    }
}

/// Ends the repaired log, as its last replay found it, with the term and vote the cut held (see
/// [`Seen::promise`]), durably.
fn keep_promises<D: Dir + Clone>(
    dir: &D,
    replayed: Replayed<D::File>,
    seen: &Seen,
) -> Result<Option<Promise>, WalError> {
    let kept = replayed.recovered.hard_state;
    let Some(promise) = seen.promise(kept) else { return Ok(None) };
    // New segments, should the hard state not fit, take the size of the one it follows.
    let last = replayed.segments.last().map(|s| s.1.clone()).unwrap_or_default();
    let size = replayed.active.size().map_err(io("size", &last))?;
    let mut wal = Wal::from_replay(dir.clone(), WalOptions { segment_bytes: size }, replayed);
    let hs = HardState { term: promise.term, vote: promise.vote, commit: kept.commit };
    wal.append(&[], Some(&hs))?;
    wal.sync()?;
    Ok(Some(promise))
}
