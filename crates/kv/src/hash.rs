//! etcd's `HashKV`: a CRC-32C over the key history up to a revision, which members compare to
//! detect divergence. cairn reproduces etcd's bytes, so the same history hashes the same in both.
//!
//! etcd (`server/storage/mvcc/hash.go` and `kvstore.go` `hashByRev`; `server/mvcc/` in v3.5)
//! hashes its bolt bucket `key` in key order, which is revision order:
//! - the hash starts with the bucket name, `key`;
//! - each stored revision with `main <= rev` contributes its bucket key and its value;
//! - a revision at or below the compaction point is skipped unless it is in `keep`: the
//!   revisions a compaction at `rev` would keep (`Keep(rev)`: per key, its live revision at
//!   `rev`); when `keep` is empty nothing is skipped this way;
//! - a tombstone exactly at the compaction revision is skipped (etcd up to 3.5.15 deleted it
//!   when compacting, later versions keep it; skipping it makes both hash alike).
//!
//! The bucket key (`revision.go`) is the main revision as 8 big-endian bytes, the byte `_`, the
//! sub revision as 8 big-endian bytes, and a trailing `t` for a deletion. The value
//! (`kvstore_txn.go`) is the protobuf encoding of `mvccpb.KeyValue { key = 1, create_revision =
//! 2, mod_revision = 3, version = 4, value = 5, lease = 6 }` for a put, and of `KeyValue { key }`
//! alone for a deletion; proto3 omits zero and empty fields and writes the rest in field order.
//!
//! `rev` 0 means the current revision; a positive `rev` below the compaction point fails as
//! compacted (equal to it is allowed), above the current one as a future revision. A negative
//! `rev` is not refused by etcd either: it hashes no revision.
//!
//! Checked against etcd v3.5.17 and v3.6.10 (their mvcc package over bbolt, restarted after each
//! compaction) on hundreds of random histories of puts, deletions, transactions and compactions,
//! at every revision: equal hashes, revisions and errors. Two differences remain, both because
//! etcd's answer depends on more than the history:
//! - A running etcd answers `HashKV` at one of its ten latest compaction revisions from a cache
//!   filled while compacting (`scheduleCompaction`), computed with the previous compaction point
//!   and reported with it as `compact_revision`; after a restart it computes the hash as here.
//!   cairn keeps no history of compaction points and always computes.
//! - etcd hashes what bbolt holds, and with an empty `keep` (no key live at `rev`) every stored
//!   revision at or below the compaction point that is not a tombstone at it counts, so until
//!   its background compaction has removed the superseded ones its answer depends on that
//!   progress. cairn hashes the history its key index references as if compaction were
//!   complete (what etcd holds once it is), so the answer never depends on the progress of
//!   index or physical compaction.

use crate::backend::Record;
use crate::index::{live_at, Index};
use crate::types::{Revision, RevisionId};

/// The answer to `HashKV`, as etcd's `KeyValueHash`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvHash {
    /// The hash (CRC-32C, as etcd).
    pub hash: u32,
    /// The revision hashed up to (the current one when 0 was asked for).
    pub revision: Revision,
    /// The store's compaction point when hashed (-1 if never compacted).
    pub compact_revision: Revision,
}

/// The name of etcd's bolt bucket of the key history, where the hash starts.
const BUCKET: &[u8] = b"key";

/// The revisions etcd's hash at `rev` covers, with compaction at `compacted`, in revision order.
/// `rev` must be resolved already (not 0).
pub(crate) fn hashed_revisions(
    index: &Index,
    rev: Revision,
    compacted: Revision,
) -> Vec<RevisionId> {
    // etcd's `keep` is the live revision of every key at `rev`; only its emptiness matters
    // beyond the per-key test below.
    let keep_empty = index.iter().all(|(_, list)| live_at(list, rev).is_none());
    // At or below the compaction point, a key contributes its revision in `keep` (live at
    // `rev`); with `keep` empty, whatever compaction left of it: its live revision at the
    // compaction point (a tombstone left there is skipped anyway).
    let floor = if keep_empty { compacted } else { rev };
    let mut out = Vec::new();
    for (_, list) in index.iter() {
        let above = list.iter().filter(|e| e.rev.main > compacted && e.rev.main <= rev);
        out.extend(above.map(|e| e.rev));
        if let Some(e) = live_at(list, floor) {
            if e.rev.main <= compacted && e.rev.main <= rev {
                out.push(e.rev);
            }
        }
    }
    out.sort_unstable();
    out
}

/// etcd's running hash.
#[derive(Debug)]
pub(crate) struct Hasher {
    crc: u32,
    scratch: Vec<u8>,
}

impl Hasher {
    pub(crate) fn new() -> Hasher {
        Hasher { crc: crc32c::crc32c(BUCKET), scratch: Vec::new() }
    }

    /// Adds one stored change: its bucket key, then its value.
    pub(crate) fn write(&mut self, rev: RevisionId, record: &Record) {
        self.scratch.clear();
        bucket_key(rev, record.tombstone, &mut self.scratch);
        key_value(rev, record, &mut self.scratch);
        self.crc = crc32c::crc32c_append(self.crc, &self.scratch);
    }

    pub(crate) fn finish(&self) -> u32 {
        self.crc
    }
}

/// etcd's bucket key of a revision: main, `_`, sub, and `t` for a deletion.
pub fn bucket_key(rev: RevisionId, tombstone: bool, out: &mut Vec<u8>) {
    out.extend_from_slice(&(rev.main.0 as u64).to_be_bytes());
    out.push(b'_');
    out.extend_from_slice(&u64::from(rev.sub).to_be_bytes());
    if tombstone {
        out.push(b't');
    }
}

/// The `mvccpb.KeyValue` etcd stores for a change at `rev`, protobuf-encoded.
pub fn key_value(rev: RevisionId, record: &Record, out: &mut Vec<u8>) {
    bytes_field(1, &record.key, out);
    if record.tombstone {
        return;
    }
    int_field(2, record.create.0, out);
    int_field(3, rev.main.0, out);
    int_field(4, record.version, out);
    bytes_field(5, &record.value, out);
    int_field(6, record.lease.0, out);
}

/// A length-delimited field (wire type 2), omitted when empty.
fn bytes_field(number: u64, value: &[u8], out: &mut Vec<u8>) {
    if value.is_empty() {
        return;
    }
    varint(number << 3 | 2, out);
    varint(value.len() as u64, out);
    out.extend_from_slice(value);
}

/// An `int64` field (wire type 0: the two's complement as a varint), omitted when zero.
fn int_field(number: u64, value: i64, out: &mut Vec<u8>) {
    if value == 0 {
        return;
    }
    varint(number << 3, out);
    varint(value as u64, out);
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_match_protobuf() {
        let enc = |v: u64| {
            let mut out = Vec::new();
            varint(v, &mut out);
            out
        };
        assert_eq!(enc(0), [0]);
        assert_eq!(enc(1), [1]);
        assert_eq!(enc(127), [0x7f]);
        assert_eq!(enc(128), [0x80, 0x01]);
        assert_eq!(enc(300), [0xac, 0x02]);
        // A negative int64 takes ten bytes.
        assert_eq!(enc(-1i64 as u64), [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
    }
}
