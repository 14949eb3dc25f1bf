//! Ranges read in bounded steps, so that no read holds the store's lock for long.
//!
//! A read takes the index read lock; execution takes the write lock. Read whole, a range of
//! 100,000 keys held the lock for over a second, and every write (and so every client) waited
//! for it. [`RangeRead`] reads the same answer in steps of a bounded number of keys, taking the
//! lock for each step and giving it up between them.
//!
//! Every step reads at the revision the read started at, so the answer is the one a read under
//! one lock would give: the index keeps every revision at or above the compaction point, new
//! writes only add later revisions, and each step opens a fresh backend view under the lock, so
//! every record its index entries point to is in the overlay or in that view. What could break
//! that is a compaction to a revision above the read's, executed while it runs: a read *pins*
//! its revision, and the store does not shed index history (nor so remove records) above the
//! lowest pinned revision until the pin is gone. A compaction still takes effect at once for new
//! reads; only its physical cleanup waits. An install (a snapshot replacing the whole state)
//! cannot wait for readers, so a read that spans one fails with [`KvError::Interrupted`].
//!
//! A read goes in two phases. *Planning* walks the index only: it counts the keys and sums the
//! bytes the answer will hold (the index keeps each value's length), so that a caller can bound
//! the memory of the reads in flight before any value is read. *Reading* walks the same keys
//! again, at the same revision, and reads the values. A small range (one step's worth) is read
//! whole under one lock, as before.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::backend::{Backend, BackendError, BackendView};
use crate::index::IndexEntry;
use crate::range::{self, KeyRange};
use crate::types::{KeyValue, RangeRequest, RangeResponse, Revision, SortTarget};
use crate::KvError;

use super::{Inner, Store};

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
        };
        plan(&inner.index, &mut read, step_keys);
        if read.planned() && read.count as usize <= step_keys && read.bytes <= step_bytes {
            // Small: read it whole under this same lock, as one read always was.
            let view = self.backend.view()?;
            read.answer = Some(inner.reader(&view).range_at(req, header)?);
            read.phase = Phase::Done;
        }
        Ok(read)
    }

    /// Takes the read one step further: planning (up to `step_keys` keys of the index), or
    /// reading (up to `step_keys` keys or `step_bytes` bytes of values). The store's lock is held
    /// for this step only.
    pub fn range_step(
        &self,
        read: &mut RangeRead,
        step_keys: usize,
        step_bytes: u64,
    ) -> Result<(), KvError> {
        self.range_step_holding(read, step_keys, step_bytes, &NoHolding)
    }

    /// [`Store::range_step`], calling `holding` just before the step takes the store's lock
    /// and just after it gives it up (whatever the step's outcome).
    pub fn range_step_holding(
        &self,
        read: &mut RangeRead,
        step_keys: usize,
        step_bytes: u64,
        holding: &dyn Holding,
    ) -> Result<(), KvError> {
        holding.before();
        let held = Held(holding);
        let inner = self.read();
        if inner.epoch != read.epoch {
            return Err(KvError::Interrupted);
        }
        match &read.phase {
            Phase::Planning(_) => {
                plan(&inner.index, read, step_keys);
                Ok(())
            }
            Phase::Reading(from) => {
                let from = from.clone();
                let taken = take_step(&inner, read, from, step_keys, step_bytes)?;
                // Opened under the lock, the view holds every record the overlay does not (see
                // the module's comment); reading from it needs the lock no longer. A reading
                // thread that loses its core mid-step (a busy machine, a low-priority thread)
                // then holds up no write: only the index walk is done under the lock.
                let view = self.backend.view()?;
                drop(inner);
                drop(held);
                read_values(&view, read, taken)
            }
            Phase::Done => Ok(()),
        }
    }
}

/// What a range step does around its hold of the store's lock
/// ([`Store::range_step_holding`]). A writer waits for every reader that holds the lock, so a
/// reader on a low-priority thread that loses its core inside a hold makes the writer wait until
/// it gets one back: milliseconds on a busy machine. Such a reader can hold the lock at a
/// normal priority instead.
pub trait Holding {
    /// Just before the step takes the lock.
    fn before(&self);
    /// Just after the step gives the lock up, or fails while holding it.
    fn after(&self);
}

/// Nothing around the hold.
struct NoHolding;

impl Holding for NoHolding {
    fn before(&self) {}
    fn after(&self) {}
}

/// Calls [`Holding::after`] when dropped: on every way out of a hold.
struct Held<'a>(&'a dyn Holding);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.after();
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

/// A key a reading step takes: its index entry, and its value if it was found in the overlay
/// of unflushed records (or is not wanted), else `None`: to be read from the backend's view.
type Taken = (Bytes, IndexEntry, Option<Bytes>);

/// The index half of a reading step, under the lock: the next keys the answer takes, with the
/// values that only the overlay holds.
fn take_step(
    inner: &Inner,
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
    inner.index.range_from(&range, read.rev, from.as_deref(), |k, e| {
        if already + taken.len() >= read.hits {
            return false;
        }
        if taken.len() >= step_keys || bytes >= step_bytes {
            next = Some(k.clone());
            return false;
        }
        bytes += read.entry_bytes(k, &e);
        let value = match with_value {
            true => inner.unflushed.get(&e.rev).map(|r| r.value.clone()),
            false => Some(Bytes::new()),
        };
        taken.push((k.clone(), e, value));
        true
    });
    let done = already + taken.len() >= read.hits;
    if !done && next.is_none() {
        // The plan saw more keys than are left at its revision: history it counted on was shed
        // (the pin failed). Never loop on it; the client retries.
        return Err(KvError::Interrupted);
    }
    read.phase = if done { Phase::Done } else { Phase::Reading(next) };
    Ok(taken)
}

/// The values half of a reading step, without the lock: the values the overlay did not hold.
fn read_values<V: BackendView>(
    view: &V,
    read: &mut RangeRead,
    taken: Vec<Taken>,
) -> Result<(), KvError> {
    if read.kvs.is_empty() {
        // Only now, once a caller has had the plan's size: the answer's vector, whole.
        read.kvs.reserve_exact(read.hits);
    }
    for (key, e, value) in taken {
        let value = match value {
            Some(value) => value,
            None => match view.get(e.rev).map_err(KvError::Backend)? {
                Some(record) => record.value,
                None => return Err(KvError::Backend(BackendError::MissingRecord(e.rev))),
            },
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
