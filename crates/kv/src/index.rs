//! The in-memory key index: for every key, the revisions at which it changed, with the metadata
//! that Range needs without reading values (create revision, version, lease, deletion).

use std::collections::BTreeMap;
use std::ops::Bound;

use bytes::Bytes;

use crate::range::KeyRange;
use crate::types::{LeaseId, Revision, RevisionId};

/// One change of a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    pub rev: RevisionId,
    pub create: Revision,
    pub version: i64,
    pub lease: LeaseId,
    /// The key was deleted at `rev`.
    pub tombstone: bool,
}

/// All keys' change histories.
#[derive(Debug, Default)]
pub struct Index {
    /// Invariant: each list is non-empty and sorted by `rev`.
    keys: BTreeMap<Bytes, Vec<IndexEntry>>,
}

impl Index {
    /// Records a change; revisions must arrive in increasing order per key.
    pub fn push(&mut self, key: Bytes, entry: IndexEntry) {
        let list = self.keys.entry(key).or_default();
        debug_assert!(list.last().is_none_or(|e| e.rev < entry.rev));
        list.push(entry);
    }

    /// The key's state at `rev`: its last change at or before `rev`, unless that was a deletion.
    pub fn get(&self, key: &[u8], rev: Revision) -> Option<IndexEntry> {
        self.keys.get(key).and_then(|list| live_at(list, rev))
    }

    /// Visits the live keys of `range` at `rev` in key order until `visit` returns false.
    pub fn range(
        &self,
        range: &KeyRange,
        rev: Revision,
        mut visit: impl FnMut(&Bytes, IndexEntry) -> bool,
    ) {
        if let KeyRange::Single(k) = range {
            if let Some(e) = self.get(k, rev) {
                visit(k, e);
            }
            return;
        }
        let upper = range.end().map_or(Bound::Unbounded, Bound::Excluded);
        if range.end().is_some_and(|end| end <= range.start()) {
            return;
        }
        for (key, list) in self.keys.range::<Bytes, _>((Bound::Included(range.start()), upper)) {
            if let Some(e) = live_at(list, rev) {
                if !visit(key, e) {
                    return;
                }
            }
        }
    }

    /// Drops history that no read at or after `at` can see: for each key, every change before its
    /// last change at or before `at`, and that change too if it is a deletion before `at`. A
    /// deletion exactly at `at` stays, so a watch from `at` still sees it. Returns the revisions
    /// dropped, whose stored records may be removed.
    pub fn compact(&mut self, at: Revision) -> Vec<RevisionId> {
        let mut dropped = Vec::new();
        self.keys.retain(|_, list| {
            let upto = list.partition_point(|e| e.rev.main <= at);
            if upto == 0 {
                return true;
            }
            let last = list[upto - 1];
            let drop_last = last.tombstone && last.rev.main < at;
            let cut = if drop_last { upto } else { upto - 1 };
            dropped.extend(list.drain(..cut).map(|e| e.rev));
            !list.is_empty()
        });
        dropped
    }

    pub fn key_count(&self) -> usize {
        self.keys.len()
    }
}

fn live_at(list: &[IndexEntry], rev: Revision) -> Option<IndexEntry> {
    let n = list.partition_point(|e| e.rev.main <= rev);
    let e = *list.get(n.checked_sub(1)?)?;
    (!e.tombstone).then_some(e)
}
