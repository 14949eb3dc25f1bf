//! Ranges read in bounded steps from a snapshot of the index, so that no read holds the store's
//! lock for long.
//!
//! A read takes the index read lock; execution takes the write lock. Read whole, a range of
//! 100,000 keys held the lock for over a second, and every write (and so every client) waited
//! for it. A large [`RangeRead`] takes the lock once, to copy the index (a persistent map: the
//! copy takes constant time, see `index.rs`), and walks that copy without the lock, in steps of
//! a bounded number of keys. Walked in steps under the lock instead, a reader on a low-priority
//! thread that lost its core inside a step made every write wait until it got one back: 1-27 ms
//! on a busy machine (bench/results/2026-11-29-large-ranges-lock.md). Now no write waits for a
//! range, whatever its thread's priority.
//!
//! Every step reads at the revision the read started at, from the index as it was then, so the
//! answer is the one a read under one lock would give. Values come from the overlay of
//! uncommitted records or from a backend view. Only records above the store's committed
//! revision when the read began can be in the overlay: a step looks those up under the lock
//! (records leave the overlay only after they are committed), then reads the others from a
//! view it opens after. What could remove a record the read needs is a compaction to a revision
//! above the read's, executed while it runs: a read *pins* its revision, and the store does not
//! shed index history (nor so remove records) above the lowest pinned revision until the pin is
//! gone. A compaction still takes effect at once for new reads; only its physical cleanup
//! waits. An install (a snapshot replacing the whole state) cannot wait for readers, so a read
//! that spans one fails with [`KvError::Interrupted`].
//!
//! A read goes in two phases. *Planning* walks the index only: it counts the keys and sums the
//! bytes the answer will hold (the index keeps each value's length), so that a caller can bound
//! the memory of the reads in flight before any value is read. *Reading* walks the same keys
//! again, at the same revision, and reads the values. A small range (one step's worth) is read
//! whole under one lock, as before, and copies nothing.
//!
//! The copy costs writes a little while a large read runs: a change copies the index nodes (and
//! the key's list of changes) that the copy still shares, once each. What the copy holds on to
//! is bounded by the writes made while the read runs.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::backend::{Backend, BackendError, BackendView};
use crate::index::{Index, IndexEntry};
use crate::range::{self, KeyRange};
use crate::types::{KeyValue, RangeRequest, RangeResponse, Revision, SortTarget};
use crate::KvError;

use super::Store;

/// Bytes a key-value costs in a response beyond its key and value: its protobuf framing and
/// fields (at most 6 tags, 5 varints, 3 lengths), rounded up.
pub const KV_OVERHEAD_BYTES: u64 = 64;

/// The revisions that reads in progress pin, with how many reads pin each.
#[derive(Debug, Default)]
pub(super) struct Pins(Mutex<BTreeMap<Revision, usize>>);

impl Pins {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Revision, usize>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The lowest pinned revision, if any read is in progress.
    pub(super) fn lowest(&self) -> Option<Revision> {
        self.lock().keys().next().copied()
    }
}

/// A pinned revision, released when dropped.
#[derive(Debug)]
struct Pin {
    pins: Arc<Pins>,
    rev: Revision,
}

impl Pin {
    fn new(pins: &Arc<Pins>, rev: Revision) -> Pin {
        *pins.lock().entry(rev).or_default() += 1;
        Pin { pins: pins.clone(), rev }
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut map = self.pins.lock();
        if let Some(n) = map.get_mut(&self.rev) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.rev);
            }
        }
    }
}

/// Where a read is.
#[derive(Debug)]
enum Phase {
    /// Walking the index from this key on (`None`: from the range's start).
    Planning(Option<Bytes>),
    /// Reading values from this key on.
    Reading(Option<Bytes>),
    Done,
}

/// A range read in progress (see the module's comment). Holds its revision pinned until dropped.
#[derive(Debug)]
pub struct RangeRead {
    req: RangeRequest,
    /// The revision every step reads at.
    rev: Revision,
    /// The store's current revision when the read started: the response header's, as etcd's.
    header: Revision,
    epoch: u64,
    _pin: Pin,
    phase: Phase,
    count: i64,
    /// The index when the read began, which steps walk without the store's lock (empty for a
    /// read done at once).
    index: Index,
    /// The store's committed revision when the read began: only records above it may be in
    /// the overlay of uncommitted records.
    committed: Revision,
    /// Keys the answer takes before `range::finish` (limit + 1 when it can stop early).
    hits: usize,
    bytes: u64,
    kvs: Vec<KeyValue>,
    /// A small range's whole answer, read at once.
    answer: Option<RangeResponse>,
}

impl RangeRead {
    /// Whether planning is done: [`RangeRead::bytes`] is then final.
    pub fn planned(&self) -> bool {
        !matches!(self.phase, Phase::Planning(_))
    }

    /// Whether the answer is complete ([`RangeRead::finish`] gives it).
    pub fn done(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }

    /// The bytes the answer's keys and values will take (with [`KV_OVERHEAD_BYTES`] each), as
    /// planned so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The answer. Call once [`RangeRead::done`].
    pub fn finish(mut self) -> RangeResponse {
        debug_assert!(self.done());
        if let Some(answer) = self.answer.take() {
            return answer;
        }
        let more = range::finish(&self.req, &mut self.kvs);
        RangeResponse { revision: self.header, kvs: self.kvs, more, count: self.count }
    }

    /// Whether the read takes the next key it walks (as `Reader::range_at` decides).
    fn takes(&self, taken: usize) -> bool {
        let r = &self.req;
        !r.count_only && (range::needs_full_scan(r) || r.limit <= 0 || (taken as i64) <= r.limit)
    }

    /// Whether values are read (keys_only skips them unless they are needed to sort).
    fn with_values(&self) -> bool {
        !self.req.keys_only || self.req.sort_target == SortTarget::Value
    }

    fn entry_bytes(&self, key: &Bytes, e: &IndexEntry) -> u64 {
        let value = if self.with_values() { u64::from(e.value_len) } else { 0 };
        key.len() as u64 + value + KV_OVERHEAD_BYTES
    }
}

/// Visits the live keys of `range` at `rev` from `from` (inclusive) on, at most `max` of them;
/// returns the key to resume at, `None` when the range is done or `visit` returned false.
fn walk(
    index: &crate::index::Index,
    range: &KeyRange,
    rev: Revision,
    from: Option<&Bytes>,
    max: usize,
    mut visit: impl FnMut(&Bytes, IndexEntry) -> bool,
) -> Option<Bytes> {
    let mut walked = 0usize;
    let mut resume = None;
    index.range_from(range, rev, from.map(|k| k.as_ref()), |k, e| {
        if walked == max {
            resume = Some(k.clone());
            return false;
        }
        walked += 1;
        visit(k, e)
    });
    resume
}

impl<B: Backend> Store<B> {
    /// Starts a range read: checks its revision and pins it. If the range is no larger than
    /// `step_keys` keys and `step_bytes` bytes, it is read whole at once (the read is then
    /// [`RangeRead::done`]).
    pub fn range_begin(
        &self,
        req: &RangeRequest,
        step_keys: usize,
        step_bytes: u64,
    ) -> Result<RangeRead, KvError> {
        let inner = self.read();
        let header = inner.exec_current;
        let rev = if req.revision.0 <= 0 { header } else { req.revision };
        if rev > header {
            return Err(KvError::FutureRev);
        }
        if rev < inner.exec_compacted {
            return Err(KvError::Compacted);
        }
        let mut read = RangeRead {
            req: req.clone(),
            rev,
            header,
            epoch: inner.epoch,
            _pin: Pin::new(&self.pins, rev),
            phase: Phase::Planning(None),
            count: 0,
            hits: 0,
            bytes: 0,
            kvs: Vec::new(),
            answer: None,
            index: Index::default(),
            committed: inner.current,
        };
        plan(&inner.index, &mut read, step_keys);
        if read.planned() && read.count as usize <= step_keys && read.bytes <= step_bytes {
            // Small: read it whole under this same lock, as one read always was.
            let view = self.backend.view()?;
            read.answer = Some(inner.reader(&view).range_at(req, header)?);
            read.phase = Phase::Done;
        } else if !read.done() {
            read.index = inner.index.snapshot();
        }
        Ok(read)
    }

    /// Takes the read one step further: planning (up to `step_keys` keys of the index), or
    /// reading (up to `step_keys` keys or `step_bytes` bytes of values). A step walks the read's
    /// copy of the index; it takes the store's lock only to look up records that may not be
    /// committed yet, and briefly.
    pub fn range_step(
        &self,
        read: &mut RangeRead,
        step_keys: usize,
        step_bytes: u64,
    ) -> Result<(), KvError> {
        if self.installs.load(Ordering::SeqCst) != read.epoch {
            return Err(KvError::Interrupted);
        }
        let index = std::mem::take(&mut read.index);
        let taken = match &read.phase {
            Phase::Planning(_) => {
                plan(&index, read, step_keys);
                Ok(Vec::new())
            }
            Phase::Reading(from) => {
                let from = from.clone();
                take_step(&index, read, from, step_keys, step_bytes)
            }
            Phase::Done => Ok(Vec::new()),
        };
        read.index = index;
        let mut taken = taken?;
        if taken.is_empty() {
            return Ok(());
        }
        self.read_overlay(read, &mut taken);
        let filled = read_values(&self.backend, read, taken);
        // An install bumps `installs` before it swaps the backend's records, and a view that
        // saw the new records was opened after the swap: checked after the reads, a step that
        // read any of them sees the bump.
        if self.installs.load(Ordering::SeqCst) != read.epoch {
            return Err(KvError::Interrupted);
        }
        filled
    }

    /// The values of `taken` that only the overlay of uncommitted records may hold: those
    /// above the revision committed when the read began. A record that has left the overlay
    /// since was committed first, so the view opened after this finds it.
    fn read_overlay(&self, read: &RangeRead, taken: &mut [Taken]) {
        let mut recent =
            taken.iter_mut().filter(|(_, e, v)| v.is_none() && e.rev.main > read.committed);
        let Some(first) = recent.next() else { return };
        let inner = self.read();
        for (_, e, value) in std::iter::once(first).chain(recent) {
            *value = inner.unflushed.get(&e.rev).map(|r| r.value.clone());
        }
    }
}

/// One planning step: counts keys and sums the bytes of those the answer takes.
fn plan(index: &crate::index::Index, read: &mut RangeRead, step_keys: usize) {
    let Phase::Planning(from) = &read.phase else { return };
    let range = KeyRange::new(&read.req.key, &read.req.range_end);
    let (mut count, mut hits, mut bytes) = (read.count, read.hits, read.bytes);
    let resume = walk(index, &range, read.rev, from.as_ref(), step_keys, |k, e| {
        count += 1;
        if read.takes(hits) {
            hits += 1;
            bytes += read.entry_bytes(k, &e);
        }
        true
    });
    (read.count, read.hits, read.bytes) = (count, hits, bytes);
    read.phase = match resume {
        Some(k) => Phase::Planning(Some(k)),
        None if read.hits == 0 => Phase::Done,
        None => Phase::Reading(None),
    };
}

/// A key a reading step takes: its index entry, and its value if it is known without the
/// backend (read from the overlay, or not wanted), else `None`.
type Taken = (Bytes, IndexEntry, Option<Bytes>);

/// The index half of a reading step: the next keys the answer takes.
fn take_step(
    index: &Index,
    read: &mut RangeRead,
    from: Option<Bytes>,
    step_keys: usize,
    step_bytes: u64,
) -> Result<Vec<Taken>, KvError> {
    let range = KeyRange::new(&read.req.key, &read.req.range_end);
    let with_value = read.with_values();
    let (step_keys, step_bytes) = (step_keys.max(1), step_bytes.max(1));
    let mut taken: Vec<Taken> = Vec::new();
    let (mut bytes, mut next) = (0u64, None);
    let already = read.kvs.len();
    index.range_from(&range, read.rev, from.as_deref(), |k, e| {
        if already + taken.len() >= read.hits {
            return false;
        }
        if taken.len() >= step_keys || bytes >= step_bytes {
            next = Some(k.clone());
            return false;
        }
        bytes += read.entry_bytes(k, &e);
        taken.push((k.clone(), e, (!with_value).then(Bytes::new)));
        true
    });
    let done = already + taken.len() >= read.hits;
    if !done && next.is_none() {
        // The plan saw more keys than the walk finds: the two walked different indexes. Never
        // loop on it; the client retries.
        return Err(KvError::Interrupted);
    }
    read.phase = if done { Phase::Done } else { Phase::Reading(next) };
    Ok(taken)
}

/// The values half of a reading step, without the lock: the values the overlay did not hold,
/// from a view opened at the first of them.
fn read_values<B: Backend>(
    backend: &B,
    read: &mut RangeRead,
    taken: Vec<Taken>,
) -> Result<(), KvError> {
    if read.kvs.is_empty() {
        // Only now, once a caller has had the plan's size: the answer's vector, whole.
        read.kvs.reserve_exact(read.hits);
    }
    let mut view = None;
    for (key, e, value) in taken {
        let value = match value {
            Some(value) => value,
            None => {
                let view = match &mut view {
                    Some(view) => view,
                    None => view.insert(backend.view()?),
                };
                match view.get(e.rev).map_err(KvError::Backend)? {
                    Some(record) => record.value,
                    None => return Err(KvError::Backend(BackendError::MissingRecord(e.rev))),
                }
            }
        };
        read.kvs.push(KeyValue {
            key,
            create_revision: e.create,
            mod_revision: e.rev.main,
            version: e.version,
            value,
            lease: e.lease,
        });
    }
    Ok(())
}
