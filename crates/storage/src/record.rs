//! The record framing of WAL segments, shared by writing and replay.
//!
//! ```text
//! len u32 | crc32c u32 | kind u8 | payload        (big endian; len counts kind and payload,
//!                                                  the crc covers kind and payload)
//! ```
//!
//! A zero `len` ends the data of a segment (segments are preallocated with zeros).

pub(crate) const HEADER_BYTES: usize = 9;
/// A Raft log entry.
pub(crate) const KIND_ENTRY: u8 = 1;
/// Term, vote and commit index.
pub(crate) const KIND_HARD_STATE: u8 = 2;
/// A compaction point: entries at or below its index are gone.
pub(crate) const KIND_SNAPSHOT: u8 = 3;
/// An installed snapshot: every earlier entry is gone.
pub(crate) const KIND_INSTALL: u8 = 4;

/// Appends one framed record to `out`; `payload` writes its body.
pub(crate) fn put_record(out: &mut Vec<u8>, kind: u8, payload: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER_BYTES]);
    out[start + 8] = kind;
    payload(out);
    let len = (out.len() - start - 8) as u32;
    let crc = crc32c::crc32c(&out[start + 8..]);
    out[start..start + 4].copy_from_slice(&len.to_be_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_be_bytes());
}

/// What [`next_record`] finds at a position.
pub(crate) enum Next<'a> {
    /// A zero length field, or the end of the file: no more data in this segment.
    End,
    Record {
        kind: u8,
        payload: &'a [u8],
        next: usize,
    },
    /// The record at this position is cut short or fails its checksum.
    Bad {
        reason: &'static str,
    },
}

/// Where the last nonzero byte of `data` is, if any. A segment is preallocated (64 MiB of zeros
/// by default) and every open checks the rest of the last one after its records, so this runs
/// over tens of megabytes at each start: it compares 64 bytes at a time, which the compiler
/// turns into vector instructions, where a byte loop took about 60 ms of a 100 ms start.
pub(crate) fn last_nonzero(data: &[u8]) -> Option<usize> {
    const BLOCK: usize = 64;
    let whole = data.len() - data.len() % BLOCK;
    if let Some(i) = data[whole..].iter().rposition(|b| *b != 0) {
        return Some(whole + i);
    }
    let block = data[..whole]
        .chunks_exact(BLOCK)
        .rposition(|c| c.iter().fold(0u8, |acc, b| acc | b) != 0)?;
    let start = block * BLOCK;
    data[start..start + BLOCK].iter().rposition(|b| *b != 0).map(|i| start + i)
}

/// Where the first whole record (a length that fits, a known kind, a matching checksum) starts
/// in `data[from..limit]`, if anywhere. Replay asks this after a bad record: a crash tears only
/// the end of what was written, so any valid record after the damage means it is not a torn
/// write. A record's length field is nonzero, so no record starts after the last nonzero byte.
pub(crate) fn find_record(data: &[u8], from: usize, limit: usize) -> Option<usize> {
    (from..limit).find(|&p| {
        if p + HEADER_BYTES > data.len() || !(KIND_ENTRY..=KIND_INSTALL).contains(&data[p + 8]) {
            return false;
        }
        matches!(next_record(data, p), Next::Record { .. })
    })
}

/// Reads the record at `pos`, checking its length and checksum.
pub(crate) fn next_record(data: &[u8], pos: usize) -> Next<'_> {
    if pos + HEADER_BYTES > data.len() {
        return if data[pos..].iter().all(|b| *b == 0) {
            Next::End
        } else {
            Next::Bad { reason: "truncated header" }
        };
    }
    let len = u32::from_be_bytes(data[pos..pos + 4].try_into().unwrap_or_default()) as usize;
    if len == 0 {
        return Next::End;
    }
    let end = pos + 8 + len;
    if end > data.len() {
        return Next::Bad { reason: "record runs past the end of the file" };
    }
    let crc = u32::from_be_bytes(data[pos + 4..pos + 8].try_into().unwrap_or_default());
    if crc32c::crc32c(&data[pos + 8..end]) != crc {
        return Next::Bad { reason: "checksum mismatch" };
    }
    Next::Record { kind: data[pos + 8], payload: &data[pos + 9..end], next: end }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::last_nonzero;

    proptest! {
        /// The block scan finds what a byte-by-byte scan finds, wherever the last nonzero byte
        /// falls against the 64-byte blocks.
        #[test]
        fn the_last_nonzero_byte_is_found_as_a_byte_scan_finds_it(
            len in 0usize..600,
            marks in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..), 0..4),
        ) {
            let mut data = vec![0u8; len];
            if len > 0 {
                for (at, byte) in marks {
                    data[at.index(len)] = byte;
                }
            }
            prop_assert_eq!(last_nonzero(&data), data.iter().rposition(|b| *b != 0));
        }
    }
}
