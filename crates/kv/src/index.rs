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
        self.compact_some(at, None, usize::MAX).0
    }

    /// Like [`Index::compact`], for at most `max` keys from `from` (inclusive) on, so a large
    /// index is compacted in bounded steps. Returns the dropped revisions and where to resume
    /// (`None` when done).
    pub fn compact_some(
        &mut self,
        at: Revision,
        from: Option<&Bytes>,
        max: usize,
    ) -> (Vec<RevisionId>, Option<Bytes>) {
        let start = from.map_or(Bound::Unbounded, Bound::Included);
        let keys: Vec<Bytes> = self
            .keys
            .range::<Bytes, _>((start, Bound::Unbounded))
            .take(max.saturating_add(1))
            .map(|(k, _)| k.clone())
            .collect();
        let resume = if keys.len() > max { keys.last().cloned() } else { None };
        let mut dropped = Vec::new();
        for k in keys.iter().take(max) {
            let Some(list) = self.keys.get_mut(k) else { continue };
            let upto = list.partition_point(|e| e.rev.main <= at);
            if upto == 0 {
                continue;
            }
            let last = list[upto - 1];
            let cut = if last.tombstone && last.rev.main < at { upto } else { upto - 1 };
            dropped.extend(list.drain(..cut).map(|e| e.rev));
            if list.is_empty() {
                self.keys.remove(k);
            }
        }
        (dropped, resume)
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
