//! The explicit repair of a damaged log: an operator's decision, never done on open.
//!
//! Opening refuses a log with damage no crash explains, and changes none of its bytes. Repair
//! truncates the log at the first damaged record: it copies the bytes it cuts into files beside
//! the segments (`<segment>.cut-<offset>`, which replay ignores), makes the copies durable, and
//! only then zeroes the damaged segment from that record on and removes every later segment.
//! What the cut held is lost to this member's log: entries it had acknowledged must come back
//! from the other members (or the member is replaced).

use crate::error::{io_err as io, WalError};
use crate::fs::{Dir, File};
use crate::replay::read_segment;
use crate::wal::segment_names;

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

/// Truncates the log in `dir` at its first damaged record, keeping copies of what it cuts, and
/// returns the cuts (none when the log opens as it is). Run it only while no member uses the
/// directory. A damage that cutting cannot fix (entries missing between segments) stays an error.
pub fn repair<D: Dir>(dir: &D) -> Result<Vec<Cut>, WalError> {
    let mut cuts = Vec::new();
    let names = segment_names(dir)?;
    if names.is_empty() {
        return Ok(cuts);
    }
    // Each round cuts at least one segment's tail or removes segments: it ends.
    for _ in 0..=names.len() {
        let names = segment_names(dir)?;
        let (file, offset, reason) = match crate::replay::replay(dir, names.clone()) {
            Ok(_) => return Ok(cuts),
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
        cut_tail(dir, &file, offset, &saved_as)?;
        cuts.push(Cut { file, offset, reason, saved_as });
        for name in later {
            let saved_as = format!("{name}.cut-0");
            save(dir, &name, 0, &saved_as)?;
            dir.remove(&name).map_err(io("remove", &name))?;
            dir.sync().map_err(io("sync", "wal directory"))?;
            cuts.push(Cut { file: name, offset: 0, reason: "after a cut", saved_as });
        }
    }
    Err(WalError::Corrupt { file: "wal".into(), offset: 0, reason: "repair did not converge" })
}

/// Copies `name` from `offset` to its last nonzero byte into `saved_as`, durably; returns the
/// end of the copied range.
fn save<D: Dir>(dir: &D, name: &str, offset: u64, saved_as: &str) -> Result<usize, WalError> {
    let file = dir.open(name).map_err(io("open", name))?;
    let data = read_segment(&file, name)?;
    let from = (offset as usize).min(data.len());
    let end = crate::record::last_nonzero(&data[from..]).map_or(from, |i| from + i + 1);
    let mut copy = dir.open(saved_as).map_err(io("create", saved_as))?;
    copy.set_len(0).map_err(io("truncate", saved_as))?;
    copy.write_at(0, &data[from..end]).map_err(io("write", saved_as))?;
    copy.sync_data().map_err(io("sync", saved_as))?;
    dir.sync().map_err(io("sync", "wal directory"))?;
    Ok(end)
}

/// Saves a copy of `name` from `offset` on (see [`save`]), then zeroes that range, durably.
fn cut_tail<D: Dir>(dir: &D, name: &str, offset: u64, saved_as: &str) -> Result<(), WalError> {
    let end = save(dir, name, offset, saved_as)?;
    let from = offset as usize;
    if end > from {
        let mut file = dir.open(name).map_err(io("open", name))?;
        file.write_at(offset, &vec![0u8; end - from]).map_err(io("cut", name))?;
        file.sync_data().map_err(io("sync", name))?;
    }
    Ok(())
}
