//! The in-memory key index: for every key, the revisions at which it changed, with the metadata
//! that Range needs without reading values (create revision, version, lease, deletion).

use std::ops::Bound;
use std::sync::Arc;

use bytes::Bytes;

use crate::backend::Record;
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
    /// The value's length (saturated), so a range knows what it will read before it reads it.
    /// It fits in the padding after `tombstone`: the entry stays 48 bytes.
    pub value_len: u32,
}

impl IndexEntry {
    /// The entry of a stored change.
    pub fn of(rev: RevisionId, record: &Record) -> IndexEntry {
        IndexEntry {
            rev,
            create: record.create,
            version: record.version,
            lease: record.lease,
            tombstone: record.tombstone,
            value_len: u32::try_from(record.value.len()).unwrap_or(u32::MAX),
        }
    }
}

/// All keys' change histories.
///
/// A persistent map: [`Index::snapshot`] is a copy in constant time that shares every node, and
/// a change copies only the nodes (and the key's changes) that a snapshot still shares.
/// So a large range walks a snapshot without the store's lock, and a write never waits for it
/// (store/read.rs). Lookups and changes cost about what a `BTreeMap`'s do; a walk in key order
/// about 1.5 times as much.
#[derive(Clone, Debug, Default)]
pub struct Index {
    keys: imbl::OrdMap<Bytes, Changes>,
}

/// A key's changes, sorted by revision; never empty. Most keys have one, kept inline: behind an
/// `Arc` of its own, a key's single change cost 37 more bytes (300,000 keys: 229 against
/// 217 MiB of RSS with a `BTreeMap` of vectors).
#[derive(Clone, Debug)]
enum Changes {
    One(IndexEntry),
    /// Shared with the snapshots taken since its last change, which copies it.
    Many(Arc<Vec<IndexEntry>>),
}

impl Changes {
    fn as_slice(&self) -> &[IndexEntry] {
        match self {
            Changes::One(e) => std::slice::from_ref(e),
            Changes::Many(list) => list,
        }
    }

    fn push(&mut self, entry: IndexEntry) {
        debug_assert!(self.as_slice().last().is_none_or(|e| e.rev < entry.rev));
        match self {
            Changes::One(e) => *self = Changes::Many(Arc::new(vec![*e, entry])),
            Changes::Many(list) => Arc::make_mut(list).push(entry),
        }
    }

    /// Drops the first `cut` changes, fewer than all, into `dropped`.
    fn drop_first(&mut self, cut: usize, dropped: &mut Vec<RevisionId>) {
        let Changes::Many(list) = self else { return };
        let list = Arc::make_mut(list);
        dropped.extend(list.drain(..cut).map(|e| e.rev));
        if let [only] = list[..] {
            *self = Changes::One(only);
        }
    }
}

impl Index {
    /// Records a change; revisions must arrive in increasing order per key.
    pub fn push(&mut self, key: Bytes, entry: IndexEntry) {
        match self.keys.get_mut(&key) {
            Some(changes) => changes.push(entry),
            None => {
                self.keys.insert(key, Changes::One(entry));
            }
        }
    }

    /// The index as it is now, unchanged by later changes to this one.
    pub fn snapshot(&self) -> Index {
        self.clone()
    }

    /// The key's state at `rev`: its last change at or before `rev`, unless that was a deletion.
    pub fn get(&self, key: &[u8], rev: Revision) -> Option<IndexEntry> {
        self.keys.get(key).and_then(|changes| live_at(changes.as_slice(), rev))
    }

    /// Visits the live keys of `range` at `rev` in key order until `visit` returns false.
    pub fn range(
        &self,
        range: &KeyRange,
        rev: Revision,
        visit: impl FnMut(&Bytes, IndexEntry) -> bool,
    ) {
        self.range_from(range, rev, None, visit);
    }

    /// Like [`Index::range`], from key `from` on (inclusive; `None`: the range's start).
    pub fn range_from(
        &self,
        range: &KeyRange,
        rev: Revision,
        from: Option<&[u8]>,
        mut visit: impl FnMut(&Bytes, IndexEntry) -> bool,
    ) {
        let lower: &[u8] = match from {
            Some(f) if f > range.start().as_ref() => f,
            _ => range.start(),
        };
        if let KeyRange::Single(k) = range {
            if let Some(e) = self.get(k, rev).filter(|_| lower <= k.as_ref()) {
                visit(k, e);
            }
            return;
        }
        if range.end().is_some_and(|end| end.as_ref() <= lower) {
            return;
        }
        let upper = range.end().map_or(Bound::Unbounded, |e| Bound::Excluded(e.as_ref()));
        for (key, changes) in self.keys.range::<_, [u8]>((Bound::Included(lower), upper)) {
            if let Some(e) = live_at(changes.as_slice(), rev) {
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
            .range::<_, Bytes>((start, Bound::Unbounded))
            .take(max.saturating_add(1))
            .map(|(k, _)| k.clone())
            .collect();
        let resume = if keys.len() > max { keys.last().cloned() } else { None };
        let mut dropped = Vec::new();
        for k in keys.iter().take(max) {
            let Some(changes) = self.keys.get(k) else { continue };
            let list = changes.as_slice();
            let cut = compaction_cut(list, at);
            if cut == 0 {
                // Nothing to drop: a change would copy the nodes a snapshot shares for nothing.
                continue;
            }
            if cut == list.len() {
                dropped.extend(list.iter().map(|e| e.rev));
                self.keys.remove(k);
            } else if let Some(changes) = self.keys.get_mut(k) {
                changes.drop_first(cut, &mut dropped);
            }
        }
        (dropped, resume)
    }

    /// The revisions compaction at `at` keeps, in revision order: what the index references once
    /// a compaction at `at` (or below) in progress is complete.
    pub fn retained(&self, at: Revision) -> Vec<RevisionId> {
        let mut out: Vec<RevisionId> = self
            .keys
            .values()
            .map(Changes::as_slice)
            .flat_map(|list| list[compaction_cut(list, at)..].iter().map(|e| e.rev))
            .collect();
        out.sort_unstable();
        out
    }

    /// Every key with its changes, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&Bytes, &[IndexEntry])> {
        self.keys.iter().map(|(k, changes)| (k, changes.as_slice()))
    }

    pub fn key_count(&self) -> usize {
        self.keys.len()
    }
}

/// How many of a key's changes (sorted by revision) compaction at `at` drops: every change before
/// its last change at or before `at`, and that one too if it is a deletion before `at`.
fn compaction_cut(list: &[IndexEntry], at: Revision) -> usize {
    let upto = list.partition_point(|e| e.rev.main <= at);
    match upto.checked_sub(1).and_then(|i| list.get(i)) {
        Some(last) if last.tombstone && last.rev.main < at => upto,
        Some(_) => upto - 1,
        None => 0,
    }
}

/// A key's state at `rev`: its last change at or before `rev`, unless that was a deletion.
pub(crate) fn live_at(list: &[IndexEntry], rev: Revision) -> Option<IndexEntry> {
    let n = list.partition_point(|e| e.rev.main <= rev);
    let e = *list.get(n.checked_sub(1)?)?;
    (!e.tombstone).then_some(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(main: i64, tombstone: bool) -> IndexEntry {
        IndexEntry {
            rev: RevisionId { main: Revision(main), sub: 0 },
            create: Revision(1),
            version: main,
            lease: LeaseId(0),
            tombstone,
            value_len: 1,
        }
    }

    fn all(index: &Index) -> Vec<(Bytes, Vec<IndexEntry>)> {
        index.iter().map(|(k, list)| (k.clone(), list.to_vec())).collect()
    }

    /// A snapshot is the index as it was: changes, deletions and compactions of the index after
    /// it do not reach it (a large range walks one without the store's lock).
    #[test]
    fn a_snapshot_is_unchanged_by_later_changes() {
        let mut index = Index::default();
        for (i, key) in ["a", "b", "c"].into_iter().enumerate() {
            index.push(Bytes::from(key), entry(i as i64 + 1, false));
        }
        let snapshot = index.snapshot();
        let before = all(&index);
        index.push(Bytes::from("a"), entry(4, false));
        index.push(Bytes::from("b"), entry(5, true));
        index.push(Bytes::from("d"), entry(6, false));
        let (dropped, _) = index.compact_some(Revision(6), None, usize::MAX);
        assert_eq!(dropped.len(), 3, "a@1, and b's change and deletion");
        assert_eq!(all(&snapshot), before);
        assert_eq!(snapshot.get(b"b", Revision(6)).map(|e| e.version), Some(2));
        assert_eq!(index.get(b"b", Revision(6)), None);
        assert_eq!((snapshot.key_count(), index.key_count()), (3, 3));
        let a: Vec<_> = index.iter().filter(|(k, _)| k.as_ref() == b"a").collect();
        assert_eq!(a[0].1, [entry(4, false)], "a's one change left");
    }
}
