//! Watch: the events each revision produced, the recent ones kept in memory, and the pure
//! bookkeeping of a stream of watchers ([`group::WatchGroup`]).
//!
//! Events come from the apply path: [`crate::Store::execute`] records the events of every
//! revision it executes in a bounded [`EventRing`], under the same lock that makes the revision
//! visible, so the ring never lags or skips what reads see. A watcher that is behind the ring
//! (it started in the past, or its client read slowly) is caught up from the stored history
//! ([`crate::Store::events`] reads either), so nothing is ever dropped and no stream needs a
//! queue of its own: memory is the ring (shared, bounded in bytes) plus what each stream holds
//! in hand.
//!
//! An event is built once and shared (`Arc`) by every watcher that receives it, prev_kv
//! included; [`Event::wire`] lets the layer that encodes events for a protocol keep its
//! encoding beside the event, so that too happens once however many watchers send it (etcd
//! copies and encodes per watcher: etcd issue 16839).

pub mod group;
mod slots;
mod watchers;

use std::collections::VecDeque;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;

use crate::types::{KeyValue, Revision};

/// What happened to a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// The key was created or changed.
    Put,
    /// The key was deleted (or its lease revoked).
    Delete,
}

/// One change, as a watcher receives it (etcd's `mvccpb.Event`).
#[derive(Debug)]
pub struct Event {
    /// A put or a delete.
    pub kind: EventKind,
    /// For a put, the key's new state; for a delete, only the key and the deletion's revision
    /// (as etcd).
    pub kv: KeyValue,
    /// The key's state just before, when it existed and that revision is not compacted. Sent
    /// only to watchers that ask for it.
    pub prev_kv: Option<KeyValue>,
    /// Encodings kept by the layer above, without and with `prev_kv`.
    wire: [OnceLock<Bytes>; 2],
    /// The key's [`key_hash`], once a stream asked for it (0: not yet).
    key_hash: AtomicU64,
}

/// The hash of a watched key, the same for every stream of the process: an event's key is
/// hashed once ([`Event::key_hash`]) and looked up with that hash in every stream's key index,
/// rather than hashed again by each of thousands of idle streams. Randomly seeded once per
/// process, as each table's own hasher was, so clients cannot choose colliding keys. Never 0.
pub(crate) fn key_hash(key: &[u8]) -> u64 {
    static HASHER: OnceLock<RandomState> = OnceLock::new();
    HASHER.get_or_init(RandomState::new).hash_one(key).max(1)
}

impl Event {
    /// An event, with no encoding kept yet.
    pub fn new(kind: EventKind, kv: KeyValue, prev_kv: Option<KeyValue>) -> Event {
        Event { kind, kv, prev_kv, wire: Default::default(), key_hash: AtomicU64::new(0) }
    }

    /// Its key's [`key_hash`], computed by the first stream that asks.
    pub(crate) fn key_hash(&self) -> u64 {
        match self.key_hash.load(Ordering::Relaxed) {
            0 => {
                let h = key_hash(&self.kv.key);
                self.key_hash.store(h, Ordering::Relaxed);
                h
            }
            h => h,
        }
    }

    /// Whether this put created the key (etcd's `IsCreate`).
    pub fn is_create(&self) -> bool {
        self.kind == EventKind::Put && self.kv.version == 1
    }

    /// This event's encoding for a protocol, computed by `encode` the first time it is asked
    /// for (with or without prev_kv) and shared by every later caller.
    pub fn wire(&self, with_prev: bool, encode: impl FnOnce(&Event, bool) -> Bytes) -> Bytes {
        self.wire[usize::from(with_prev)].get_or_init(|| encode(self, with_prev)).clone()
    }

    /// Bytes this event holds, for the ring's budget.
    pub fn size_bytes(&self) -> usize {
        const OVERHEAD: usize = 96;
        let kv = |kv: &KeyValue| kv.key.len() + kv.value.len();
        OVERHEAD + kv(&self.kv) + self.prev_kv.as_ref().map_or(0, kv)
    }

    /// The revision this event belongs to.
    pub fn revision(&self) -> Revision {
        self.kv.mod_revision
    }
}

/// Every event of one revision, in the order the request made them.
#[derive(Debug)]
pub struct RevisionEvents {
    /// The revision.
    pub revision: Revision,
    /// Its events.
    pub events: Vec<Arc<Event>>,
}

impl RevisionEvents {
    /// Bytes these events hold, for the ring's budget.
    pub fn size_bytes(&self) -> usize {
        self.events.iter().map(|e| e.size_bytes()).sum()
    }
}

/// The events of the revisions `first..=last`, in order. A revision may have no events (the
/// store's first revision has none), so the run says what it covers.
#[derive(Clone, Debug)]
pub struct EventRun {
    /// The first revision covered.
    pub first: Revision,
    /// The last revision covered.
    pub last: Revision,
    /// The revisions that have events, in order.
    pub revisions: Vec<Arc<RevisionEvents>>,
}

/// A copy of `kv` that owns its bytes: a value sliced out of a large buffer (a Raft entry, a
/// peer's frame) would otherwise keep the whole buffer alive for as long as the event lives.
pub(crate) fn owned(kv: KeyValue) -> KeyValue {
    KeyValue {
        key: Bytes::copy_from_slice(&kv.key),
        value: Bytes::copy_from_slice(&kv.value),
        ..kv
    }
}

/// The events of the latest revisions, contiguous, bounded in bytes (but always holding the
/// latest revision, however large).
#[derive(Debug)]
pub struct EventRing {
    revisions: VecDeque<Arc<RevisionEvents>>,
    bytes: usize,
    max_bytes: usize,
}

/// The ring's default budget.
pub const RING_BYTES: usize = 16 << 20;

impl EventRing {
    /// An empty ring of `max_bytes`.
    pub fn new(max_bytes: usize) -> EventRing {
        EventRing { revisions: VecDeque::new(), bytes: 0, max_bytes }
    }

    /// Appends the next revision's events. A revision that does not follow the last one (after
    /// an install replaced the store) starts the ring over.
    pub fn push(&mut self, rev: RevisionEvents) {
        if self.last().is_some_and(|last| last.next() != rev.revision) {
            self.clear();
        }
        self.bytes += rev.size_bytes();
        self.revisions.push_back(Arc::new(rev));
        while self.bytes > self.max_bytes && self.revisions.len() > 1 {
            if let Some(old) = self.revisions.pop_front() {
                self.bytes -= old.size_bytes();
            }
        }
    }

    /// The ring's budget.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// Forgets every revision.
    pub fn clear(&mut self) {
        self.revisions.clear();
        self.bytes = 0;
    }

    /// The oldest revision held.
    pub fn first(&self) -> Option<Revision> {
        self.revisions.front().map(|r| r.revision)
    }

    /// The newest revision held.
    pub fn last(&self) -> Option<Revision> {
        self.revisions.back().map(|r| r.revision)
    }

    /// The revisions from `from` on, up to `max` of them and about `max_bytes` (at least one
    /// revision), if the ring holds `from`.
    pub fn from(
        &self,
        from: Revision,
        max: usize,
        max_bytes: usize,
    ) -> Option<Vec<Arc<RevisionEvents>>> {
        let first = self.first()?;
        if from < first || self.last().is_some_and(|l| from > l) {
            return None;
        }
        let skip = usize::try_from(from.0 - first.0).ok()?;
        let mut bytes = 0;
        let mut out = Vec::new();
        for rev in self.revisions.iter().skip(skip).take(max) {
            if !out.is_empty() && bytes >= max_bytes {
                break;
            }
            bytes += rev.size_bytes();
            out.push(rev.clone());
        }
        Some(out)
    }
}

/// Which events a watcher wants (etcd's `WatchCreateRequest`, checked).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchSpec {
    /// An empty key means `"\0"`, the smallest key.
    pub key: Bytes,
    /// As in Range: empty for one key, `"\0"` for every key from `key` on.
    pub range_end: Bytes,
    /// The first revision to deliver: 0 means the one after the current revision; an older one
    /// replays history; a negative one is refused.
    pub start_revision: Revision,
    /// Deliver each event with the key's state before it.
    pub prev_kv: bool,
    /// Leave out puts.
    pub no_put: bool,
    /// Leave out deletes.
    pub no_delete: bool,
    /// Periodic empty responses while the watcher is idle and synced.
    pub progress_notify: bool,
    /// Split responses larger than the request limit (done by the layer that encodes).
    pub fragment: bool,
    /// Chosen by the client; 0 lets the stream pick.
    pub watch_id: i64,
}

impl WatchSpec {
    /// Watches one key, from the next write.
    pub fn key(key: impl Into<Bytes>) -> WatchSpec {
        WatchSpec { key: key.into(), ..WatchSpec::default() }
    }

    /// Watches every key that starts with `prefix` (every key, for an empty prefix), from the
    /// next write.
    pub fn prefix(prefix: impl Into<Bytes>) -> WatchSpec {
        let (key, range_end) = crate::types::prefix_range(prefix.into());
        WatchSpec { key, range_end, ..WatchSpec::default() }
    }

    /// The key range with etcd's rules for watches (an empty key is `"\0"`).
    pub fn range(&self) -> crate::range::KeyRange {
        let key = if self.key.is_empty() { Bytes::from_static(b"\0") } else { self.key.clone() };
        crate::range::KeyRange::new(&key, &self.range_end)
    }

    /// Whether `e` is for this watcher (range and filters).
    pub fn wants(&self, range: &crate::range::KeyRange, e: &Event) -> bool {
        let filtered = match e.kind {
            EventKind::Put => self.no_put,
            EventKind::Delete => self.no_delete,
        };
        !filtered && range.contains(&e.kv.key)
    }
}
