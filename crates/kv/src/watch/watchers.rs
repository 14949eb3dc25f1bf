//! The watchers of one stream, stored for memory and for matching events, not for scanning.
//!
//! Two costs decide how many watchers a member can hold: the bytes each idle watcher takes, and
//! the work each new revision causes. So a watcher is packed into 16 bytes, with its key and
//! range end (and their lengths) in one buffer the stream's watchers share; the id and key
//! indexes hold only slot numbers (2 bytes each while they fit, see [`super::slots`]), hashed
//! with one hasher for the whole process so that an event's key is hashed once for every
//! stream; and the watchers that are level with one another (the *cohort*, usually every synced
//! watcher) share one next revision instead of each keeping its own, so a revision is matched
//! to the watchers its keys name (a hash lookup per event, plus the range watchers) instead of
//! visiting every watcher. Watchers that are not level with the cohort (they started in the
//! past, or wait for a future start) are kept in an ordered set by next revision: they are
//! found by the revision a read covers, and join the cohort as soon as they reach it.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::RangeInclusive;
use std::sync::Arc;

use super::slots::SlotIndex;
use super::{Event, EventKind, WatchSpec};
use crate::types::Revision;

/// A watcher's options, one bit each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Flags(u8);

impl Flags {
    pub const PREV_KV: u8 = 1;
    pub const NO_PUT: u8 = 1 << 1;
    pub const NO_DELETE: u8 = 1 << 2;
    pub const PROGRESS: u8 = 1 << 3;
    pub const FRAGMENT: u8 = 1 << 4;
    /// Sent events since the last progress tick (etcd then skips its notice).
    pub const SENT: u8 = 1 << 5;
    /// Level with the cohort: its next revision is the cohort's, not its own field.
    const COHORT: u8 = 1 << 6;
    /// Watches exactly one key (etcd: an empty range end), so it is indexed by its key.
    const SINGLE: u8 = 1 << 7;

    pub fn has(self, bit: u8) -> bool {
        self.0 & bit != 0
    }

    pub fn set(&mut self, bit: u8, on: bool) {
        if on {
            self.0 |= bit;
        } else {
            self.0 &= !bit;
        }
    }
}

/// One watcher, packed into 16 bytes: its key (`"\0"` for an empty one, as etcd reads it) and
/// then its range end, as the client sent it, are in the stream's [`Keys`] at `at`, after
/// their lengths. Lengths there rather than here: two varints of a byte each for the usual
/// key, against 8 bytes in every slot, on a structure whose size is the cost of an idle watcher.
#[derive(Debug)]
pub(super) struct Watcher {
    pub id: i64,
    at: u32,
    pub flags: Flags,
}

impl Watcher {
    /// Its key and range end.
    fn entry<'k>(&self, keys: &'k Keys) -> (&'k [u8], &'k [u8]) {
        keys.entry(self.at)
    }

    fn key<'k>(&self, keys: &'k Keys) -> &'k [u8] {
        self.entry(keys).0
    }

    /// Watches exactly one key (etcd: an empty range end).
    fn single(&self) -> bool {
        self.flags.has(Flags::SINGLE)
    }

    /// Whether `e` is for this watcher: its range (etcd's rules: a range end of `"\0"` means
    /// every key from the key on) and its filters.
    fn wants(&self, keys: &Keys, e: &Event) -> bool {
        let filtered = match e.kind {
            EventKind::Put => self.flags.has(Flags::NO_PUT),
            EventKind::Delete => self.flags.has(Flags::NO_DELETE),
        };
        let (k, (key, end)) = (e.kv.key.as_ref(), self.entry(keys));
        let within = match end {
            [] => k == key,
            [0] => k >= key,
            end => k >= key && k < end,
        };
        !filtered && within
    }
}

/// The keys and range ends of a stream's watchers, back to back in one buffer: a key of tens
/// of bytes in an allocation of its own would cost as much again in pointer and allocator
/// overhead. Each entry is the key's length and the range end's (LEB128 varints), then the key
/// and the range end. A removed watcher leaves a hole; the buffer is rewritten once holes are
/// most of it.
#[derive(Debug, Default)]
struct Keys {
    bytes: Vec<u8>,
    dead: usize,
}

impl Keys {
    /// Appends an entry for `key` and `end`; returns where it starts.
    fn push(&mut self, key: &[u8], end: &[u8]) -> u32 {
        let at = u32::try_from(self.bytes.len()).expect("key bytes per stream are bounded");
        let mut head = [0u8; 10];
        let mut n = put_varint(&mut head, key.len());
        n += put_varint(&mut head[n..], end.len());
        make_room(&mut self.bytes, n + key.len() + end.len());
        self.bytes.extend_from_slice(&head[..n]);
        self.bytes.extend_from_slice(key);
        self.bytes.extend_from_slice(end);
        at
    }

    /// Where the entry at `at` keeps its key (from the buffer's start), and the key's and range
    /// end's lengths.
    fn layout(&self, at: u32) -> (usize, usize, usize) {
        let b = &self.bytes[at as usize..];
        let (key_len, n) = get_varint(b);
        let (end_len, m) = get_varint(&b[n..]);
        (at as usize + n + m, key_len, end_len)
    }

    /// The key and range end of the entry at `at`.
    fn entry(&self, at: u32) -> (&[u8], &[u8]) {
        let (key, key_len, end_len) = self.layout(at);
        let end = key + key_len;
        (&self.bytes[key..end], &self.bytes[end..end + end_len])
    }

    /// The bytes the entry at `at` takes, its lengths included.
    fn entry_len(&self, at: u32) -> usize {
        let (key, key_len, end_len) = self.layout(at);
        key - at as usize + key_len + end_len
    }

    fn live(&self) -> usize {
        self.bytes.len() - self.dead
    }
}

/// Writes `v` as a LEB128 varint at the start of `out` (room for 5 bytes); returns its length.
fn put_varint(out: &mut [u8], v: usize) -> usize {
    let mut v = u32::try_from(v).expect("keys are bounded by the request limit");
    let mut n = 0;
    while v >= 0x80 {
        out[n] = (v as u8) | 0x80;
        v >>= 7;
        n += 1;
    }
    out[n] = v as u8;
    n + 1
}

/// Reads the LEB128 varint at the start of `b` (written by [`put_varint`]): its value and
/// length.
fn get_varint(b: &[u8]) -> (usize, usize) {
    let (mut v, mut n) = (0usize, 0);
    loop {
        let byte = b[n];
        v |= usize::from(byte & 0x7f) << (7 * n);
        n += 1;
        if byte < 0x80 {
            return (v, n);
        }
    }
}

/// Makes room for `more` elements. A small buffer grows by a quarter rather than doubling: a
/// stream's watchers are long-lived and mostly idle, so spare capacity is memory held for as
/// long as the stream is open (doubling left a stream of 100 watchers 28 slots it never used).
/// A large one doubles as usual: the allocator maps it apart, and the many buffers left behind
/// by quarter steps cost more than the spare capacity (10,000 watchers on one stream: 72 bytes
/// of RSS each when doubling, 89-96 with quarter steps).
fn make_room<T>(v: &mut Vec<T>, more: usize) {
    const SMALL_BYTES: usize = 32 << 10;
    if v.capacity() - v.len() >= more {
        return;
    }
    if v.capacity() * std::mem::size_of::<T>() < SMALL_BYTES {
        v.reserve_exact(more.max(v.len() / 4).max(4));
    } else {
        v.reserve(more);
    }
}

/// The watchers of one stream.
#[derive(Debug, Default)]
pub(super) struct Watchers {
    slots: Vec<Watcher>,
    keys: Keys,
    /// Slot numbers, hashed by their watcher's id.
    by_id: SlotIndex,
    /// Slot numbers of single-key watchers, hashed by their key.
    by_key: SlotIndex,
    /// Slot numbers of range watchers, hashed by their watcher's id.
    ranges: SlotIndex,
    /// The next revision of every watcher in the cohort.
    cohort_next: Revision,
    cohort_len: usize,
    /// Watchers outside the cohort, by (next revision, id), and each one's next revision by
    /// id (a watcher's slot has no room for it: most are in the cohort).
    apart: BTreeSet<(Revision, i64)>,
    apart_next: BTreeMap<i64, Revision>,
}

impl Watchers {
    /// Ids hash with the process' key hasher: one seed, and no hasher kept per stream.
    fn hash_id(id: i64) -> u64 {
        super::key_hash(&id.to_le_bytes())
    }

    fn hash_key(key: &[u8]) -> u64 {
        super::key_hash(key)
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn contains(&self, id: i64) -> bool {
        self.slot(id).is_some()
    }

    fn slot(&self, id: i64) -> Option<u32> {
        let slots = &self.slots;
        self.by_id.find(Self::hash_id(id), |s| slots[s as usize].id == id)
    }

    /// Adds a watcher (its id is free) whose next revision is `next`.
    pub fn insert(&mut self, id: i64, spec: &WatchSpec, next: Revision) {
        let key: &[u8] = if spec.key.is_empty() { b"\0" } else { &spec.key };
        let at = self.keys.push(key, &spec.range_end);
        let mut flags = Flags::default();
        flags.set(Flags::PREV_KV, spec.prev_kv);
        flags.set(Flags::NO_PUT, spec.no_put);
        flags.set(Flags::NO_DELETE, spec.no_delete);
        flags.set(Flags::PROGRESS, spec.progress_notify);
        flags.set(Flags::FRAGMENT, spec.fragment);
        flags.set(Flags::SINGLE, spec.range_end.is_empty());
        let w = Watcher { id, at, flags };
        let slot = u32::try_from(self.slots.len()).expect("watchers per stream are bounded");
        let (hid, hkey) = (Self::hash_id(id), Self::hash_key(key));
        let single = w.single();
        make_room(&mut self.slots, 1);
        self.slots.push(w);
        let slots = &self.slots;
        self.by_id.insert(hid, slot, |s| Self::id_hash(slots, s));
        if single {
            let keys = &self.keys;
            let rehash = |s: u32| Self::hash_key(slots[s as usize].key(keys));
            self.by_key.insert(hkey, slot, rehash);
        } else {
            self.ranges.insert(hid, slot, |s| Self::id_hash(slots, s));
        }
        self.place(slot, next);
    }

    fn id_hash(slots: &[Watcher], s: u32) -> u64 {
        Self::hash_id(slots[s as usize].id)
    }

    /// Puts a watcher whose next revision is `next` in the cohort if it is level with it (or
    /// founds the cohort if there is none), else apart.
    fn place(&mut self, slot: u32, next: Revision) {
        if self.cohort_len == 0 {
            self.cohort_next = next;
        }
        let w = &mut self.slots[slot as usize];
        if next == self.cohort_next {
            w.flags.set(Flags::COHORT, true);
            self.cohort_len += 1;
        } else {
            w.flags.set(Flags::COHORT, false);
            self.apart.insert((next, w.id));
            self.apart_next.insert(w.id, next);
        }
    }

    /// Removes a watcher; returns it.
    pub fn remove(&mut self, id: i64) -> Option<Watcher> {
        let slot = self.slot(id)?;
        self.unindex(slot);
        let w = &self.slots[slot as usize];
        if w.flags.has(Flags::COHORT) {
            self.cohort_len -= 1;
        } else if let Some(next) = self.apart_next.remove(&id) {
            self.apart.remove(&(next, id));
        }
        let last = u32::try_from(self.slots.len() - 1).expect("bounded");
        if slot != last {
            // The last watcher moves into the freed slot: its index entries follow it.
            self.repoint(last, slot);
        }
        let w = self.slots.swap_remove(slot as usize);
        self.keys.dead += self.keys.entry_len(w.at);
        if self.keys.dead > self.keys.live().max(4096) {
            self.rewrite_keys();
        }
        Some(w)
    }

    /// Rewrites the key buffer without its holes, and gives back what the slots no longer use.
    fn rewrite_keys(&mut self) {
        let mut bytes = Vec::with_capacity(self.keys.live());
        for w in &mut self.slots {
            let (at, len) = (w.at as usize, self.keys.entry_len(w.at));
            let moved = u32::try_from(bytes.len()).expect("key bytes per stream are bounded");
            bytes.extend_from_slice(&self.keys.bytes[at..at + len]);
            w.at = moved;
        }
        self.keys = Keys { bytes, dead: 0 };
        if self.slots.len() < self.slots.capacity() / 4 {
            self.slots.shrink_to(self.slots.len() * 2);
        }
    }

    /// Bytes of keys and range ends the watchers hold.
    pub fn key_bytes(&self) -> usize {
        self.keys.live()
    }

    /// The index tables that hold `slot`, with its hash in each: by id, then by key for a
    /// single-key watcher or among the ranges for a range watcher.
    fn index_entries(&mut self, slot: u32) -> [(&mut SlotIndex, u64); 2] {
        let w = &self.slots[slot as usize];
        let hid = Self::hash_id(w.id);
        let second = if w.single() {
            (&mut self.by_key, Self::hash_key(w.key(&self.keys)))
        } else {
            (&mut self.ranges, hid)
        };
        [(&mut self.by_id, hid), second]
    }

    fn unindex(&mut self, slot: u32) {
        for (table, hash) in self.index_entries(slot) {
            table.remove(hash, slot);
        }
    }

    fn repoint(&mut self, from: u32, to: u32) {
        for (table, hash) in self.index_entries(from) {
            table.repoint(hash, from, to);
        }
    }

    /// The lowest next revision within `within`.
    pub fn lowest_next(&self, within: RangeInclusive<Revision>) -> Option<Revision> {
        let cohort = Some(self.cohort_next).filter(|n| self.cohort_len > 0 && within.contains(n));
        let (lo, hi) = within.into_inner();
        let apart = self.apart.range((lo, i64::MIN)..=(hi, i64::MAX)).next().map(|(n, _)| *n);
        match (cohort, apart) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether every watcher's next revision is `next`.
    pub fn all_at(&self, next: Revision) -> bool {
        let cohort = self.cohort_len == 0 || self.cohort_next == next;
        let apart = self.apart.first().is_none_or(|(n, _)| *n == next)
            && self.apart.last().is_none_or(|(n, _)| *n == next);
        cohort && apart
    }

    /// The ids of the watchers whose next revision is below `rev`.
    pub fn below(&self, rev: Revision) -> Vec<i64> {
        let mut ids: Vec<i64> = self.apart.range(..(rev, i64::MIN)).map(|(_, id)| *id).collect();
        if self.cohort_len > 0 && self.cohort_next < rev {
            ids.extend(self.slots.iter().filter(|w| w.flags.has(Flags::COHORT)).map(|w| w.id));
        }
        ids
    }

    /// Matches the revisions of `revs` (consecutive, `first..=last`) to the watchers whose next
    /// revision lies in them, and moves those watchers past `last`. Returns, for each watcher
    /// that got events, its slot and its events in order; watchers are in id order.
    pub fn deliver(
        &mut self,
        first: Revision,
        last: Revision,
        revs: &[Arc<super::RevisionEvents>],
    ) -> Vec<(u32, Vec<Arc<Event>>)> {
        let mut hits: Vec<(u32, &Arc<Event>)> = Vec::new();
        // Watchers apart, each from its own next revision.
        let apart: Vec<(Revision, i64)> =
            self.apart.range((first, i64::MIN)..=(last, i64::MAX)).copied().collect();
        // Their slots, to place them again once the run is delivered (nothing moves slots
        // meanwhile).
        let mut moved = Vec::with_capacity(apart.len());
        for &(next, id) in &apart {
            self.apart.remove(&(next, id));
            self.apart_next.remove(&id);
            let slot = self.slot(id).expect("indexed");
            moved.push(slot);
            let w = &self.slots[slot as usize];
            let events = revs.iter().filter(|r| r.revision >= next).flat_map(|r| &r.events);
            hits.extend(events.filter(|e| w.wants(&self.keys, e)).map(|e| (slot, e)));
        }
        if self.cohort_len > 0 && (first..=last).contains(&self.cohort_next) {
            let from = self.cohort_next;
            for e in revs.iter().filter(|r| r.revision >= from).flat_map(|r| &r.events) {
                self.match_cohort(e, &mut hits);
            }
            self.cohort_next = last.next();
        }
        for slot in moved {
            self.place(slot, last.next());
        }
        let slots = &self.slots;
        // Stable: each watcher's events stay in revision order.
        hits.sort_by_key(|&(s, _)| slots[s as usize].id);
        let mut out: Vec<(u32, Vec<Arc<Event>>)> = Vec::new();
        for (slot, e) in hits {
            match out.last_mut() {
                Some((s, events)) if *s == slot => events.push(e.clone()),
                _ => out.push((slot, vec![e.clone()])),
            }
        }
        out
    }

    /// Cohort watchers that want `e`: those on its key, and the range watchers that hold it.
    fn match_cohort<'e>(&self, e: &'e Arc<Event>, hits: &mut Vec<(u32, &'e Arc<Event>)>) {
        let key = e.kv.key.as_ref();
        let in_cohort = |w: &Watcher| w.flags.has(Flags::COHORT) && w.wants(&self.keys, e);
        self.by_key.each_with_hash(e.key_hash(), |s| {
            let w = &self.slots[s as usize];
            if w.key(&self.keys) == key && in_cohort(w) {
                hits.push((s, e));
            }
        });
        self.ranges.each(|s| {
            if in_cohort(&self.slots[s as usize]) {
                hits.push((s, e));
            }
        });
    }

    pub fn get_mut(&mut self, slot: u32) -> &mut Watcher {
        &mut self.slots[slot as usize]
    }

    /// Every watcher, with its next revision.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&mut Watcher, Revision)> {
        let (cohort_next, slots, apart) = (self.cohort_next, &mut self.slots, &self.apart_next);
        slots.iter_mut().map(move |w| {
            let next = match apart.get(&w.id) {
                Some(next) if !w.flags.has(Flags::COHORT) => *next,
                _ => cohort_next,
            };
            (w, next)
        })
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::super::group::{CreateError, WatchGroup, MAX_KEY_BYTES};
    use super::super::{Event, EventRun, RevisionEvents};
    use super::*;
    use crate::types::KeyValue;

    fn put(key: &[u8], rev: i64) -> Arc<Event> {
        let kv = KeyValue {
            key: Bytes::copy_from_slice(key),
            mod_revision: Revision(rev),
            version: 1,
            ..KeyValue::default()
        };
        Arc::new(Event::new(EventKind::Put, kv, None))
    }

    fn on(key: &str, range_end: &[u8]) -> WatchSpec {
        WatchSpec {
            key: Bytes::from(key.to_string()),
            range_end: Bytes::copy_from_slice(range_end),
            ..WatchSpec::default()
        }
    }

    /// After many cancels (holes rewritten out of the key buffer, slots moved and repointed),
    /// every remaining watcher still gets exactly the events on its keys, through the key
    /// index, and canceled ones get nothing.
    #[test]
    fn watchers_match_their_keys_after_cancels_move_them() {
        let mut g = WatchGroup::new();
        let head = Revision(1);
        let ids: Vec<i64> = (0..2000)
            .map(|i| g.create(on(&format!("k{i:04}"), b""), head).expect("created"))
            .collect();
        let prefix = g.create(on("k1", b"k2"), head).expect("created");
        let everything = g.create(on("", b"\0"), head).expect("created");
        while g.pop().is_some() {}
        for id in ids.iter().filter(|id| *id % 3 != 0) {
            g.cancel(*id, head);
        }
        while g.pop().is_some() {}
        let events: Vec<Arc<Event>> =
            (0..2000).map(|i| put(format!("k{i:04}").as_bytes(), 2)).collect();
        let rev = Arc::new(RevisionEvents { revision: Revision(2), events });
        g.deliver(&EventRun { first: Revision(2), last: Revision(2), revisions: vec![rev] });
        let mut got = std::collections::BTreeMap::new();
        while let Some(r) = g.pop() {
            let keys: Vec<Bytes> = r.events.iter().map(|e| e.kv.key.clone()).collect();
            assert!(got.insert(r.watch_id, keys).is_none(), "one reply per watcher");
        }
        assert_eq!(got.remove(&everything).map(|k| k.len()), Some(2000));
        assert_eq!(got.remove(&prefix).map(|k| k.len()), Some(1000));
        let kept: Vec<i64> = ids.iter().copied().filter(|id| id % 3 == 0).collect();
        assert_eq!(got.keys().copied().collect::<Vec<_>>(), kept);
        for (id, keys) in got {
            assert_eq!(keys, vec![Bytes::from(format!("k{id:04}"))]);
        }
        assert_eq!(g.wanted(Revision(0), Revision(2)), None, "every watcher moved past 2");
    }

    /// A stream past 65,536 watchers (its index tables widened) still matches every watcher,
    /// the latest ones too, and cancels move slots across the old bound.
    #[test]
    fn a_stream_past_sixteen_bit_slots_matches_every_watcher() {
        let mut g = WatchGroup::new();
        let head = Revision(1);
        let n = 70_000;
        let ids: Vec<i64> =
            (0..n).map(|i| g.create(on(&format!("w{i}"), b""), head).expect("created")).collect();
        while g.pop().is_some() {}
        for &id in &ids[..10] {
            g.cancel(id, head);
        }
        while g.pop().is_some() {}
        let keys = [5, 10, 65_535, 65_536, n - 1];
        let events: Vec<Arc<Event>> =
            keys.iter().map(|i| put(format!("w{i}").as_bytes(), 2)).collect();
        let rev = Arc::new(RevisionEvents { revision: Revision(2), events });
        g.deliver(&EventRun { first: Revision(2), last: Revision(2), revisions: vec![rev] });
        let mut got = Vec::new();
        while let Some(r) = g.pop() {
            got.push(r.watch_id);
        }
        got.sort_unstable();
        assert_eq!(got, vec![ids[10], ids[65_535], ids[65_536], ids[n - 1]]);
    }

    /// An idle watcher's cost is mostly its slot: keep it packed.
    #[test]
    fn a_watcher_slot_is_16_bytes() {
        assert_eq!(std::mem::size_of::<Watcher>(), 16);
    }

    /// Entries of every length class read back as written, next to one another.
    #[test]
    fn key_entries_read_back_whatever_their_lengths() {
        let mut keys = Keys::default();
        let sizes = [0usize, 1, 127, 128, 300, 16_383, 16_384, 1 << 20];
        let mut at = Vec::new();
        for (i, &k) in sizes.iter().enumerate() {
            let end = sizes[sizes.len() - 1 - i];
            at.push(keys.push(&vec![b'k'; k], &vec![b'e'; end]));
        }
        for (i, &k) in sizes.iter().enumerate() {
            let end = sizes[sizes.len() - 1 - i];
            let (key, range_end) = keys.entry(at[i]);
            assert_eq!((key.len(), range_end.len()), (k, end));
            assert!(key.iter().all(|&b| b == b'k') && range_end.iter().all(|&b| b == b'e'));
            let next = at.get(i + 1).map_or(keys.bytes.len(), |&a| a as usize);
            assert_eq!(keys.entry_len(at[i]), next - at[i] as usize);
        }
    }

    /// Keys are as large as requests: a stream's watchers hold a bounded number of key bytes
    /// (each entry's lengths counted: 3 bytes for a 1 MiB key, 1 for an empty range end).
    #[test]
    fn key_bytes_per_stream_are_bounded() {
        let mut g = WatchGroup::new();
        let big = "k".repeat(1 << 20);
        let mut made = 0;
        let refused = loop {
            match g.create(on(&big, b""), Revision(1)) {
                Ok(_) => made += 1,
                Err(e) => break e,
            }
            assert!(made <= MAX_KEY_BYTES >> 20, "no bound");
        };
        assert_eq!(refused, CreateError::TooManyWatchers);
        assert_eq!(made, MAX_KEY_BYTES / ((1 << 20) + 4));
    }
}
