//! The watchers of one stream (etcd's `watchStream` with its synced and unsynced groups), as a
//! pure state machine: no clock, no IO.
//!
//! Each watcher knows the next revision it must receive. The owner of a group (the node's watch
//! stream) asks [`WatchGroup::wanted`] which revision to fetch, fetches a run of revisions from
//! there (from the ring, or the stored history when that is older), and hands it to
//! [`WatchGroup::deliver`]; replies queue in the group, in the order the client must see them.
//! A watcher whose next revision equals the head's successor is *synced*. A watcher behind the
//! head catches up by the same path as one at the head, so there is one code path for both, and
//! a watcher that falls behind (its client read slowly) simply catches up from the history:
//! no event is ever dropped, and nothing queues per watcher.
//!
//! Replies follow etcd's wire behaviour (v3rpc `watch.go`, mvcc `watchable_store.go`):
//! - a create is answered `created` with the head revision; a bad one `created` and `canceled`
//!   with watch id -1 and etcd's reason;
//! - event replies carry whole revisions, and their header revision is the last revision the
//!   reply covers for that watcher, never beyond an event it has not sent;
//! - a watcher whose next revision was compacted is canceled with `compact_revision` set;
//! - a progress request is answered with watch id -1 and the head revision once every watcher
//!   is synced (etcd answers only if they already are; waiting instead still never claims an
//!   event not yet sent, and spares the client its retries); with no watchers, not at all, as
//!   etcd.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use super::watchers::{Flags, Watchers};
use super::{Event, EventRun, WatchSpec};
use crate::range::KeyRange;
use crate::types::Revision;

/// etcd's `clientv3.InvalidWatchID`: progress for the whole stream, or a refused create.
pub const INVALID_WATCH_ID: i64 = -1;

/// Watchers one stream may hold: each costs about a hundred bytes, so a client cannot grow a
/// member's memory without bound through one stream.
pub const MAX_WATCHERS: usize = 100_000;
/// Bytes of keys and range ends the watchers of one stream may hold, for the same reason: keys
/// may be as large as a request.
pub const MAX_KEY_BYTES: usize = 64 << 20;

/// Why a create was refused, with etcd's reason text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateError {
    /// A negative start revision (etcd 3.6 refuses it as compacted).
    Compacted,
    /// `key >= range_end`.
    EmptyRange,
    /// The client chose an id already in use on this stream.
    DuplicateId,
    /// The stream holds [`MAX_WATCHERS`], or [`MAX_KEY_BYTES`] of keys.
    TooManyWatchers,
    /// The caller may not watch these keys (auth): etcd's error text.
    Denied(&'static str),
}

impl CreateError {
    /// etcd's reason, as a refused watch's `cancel_reason` carries it.
    pub fn reason(self) -> &'static str {
        match self {
            CreateError::Compacted => "etcdserver: mvcc: required revision has been compacted",
            CreateError::EmptyRange => "mvcc: watcher range is empty",
            CreateError::DuplicateId => "mvcc: duplicate watch ID provided on the WatchStream",
            CreateError::TooManyWatchers => "cairn: too many watchers on one stream",
            CreateError::Denied(why) => why,
        }
    }
}

/// One reply on the stream (etcd's `WatchResponse`, without the header's ids).
#[derive(Clone, Debug, Default)]
pub struct WatchReply {
    /// The watcher this reply is for; -1 for a progress reply to the whole stream.
    pub watch_id: i64,
    /// The header revision.
    pub revision: Revision,
    /// The watcher was created (the first reply of each watcher).
    pub created: bool,
    /// The watcher ended (canceled, compacted, or refused): no more replies for it.
    pub canceled: bool,
    /// Set (with `canceled`) when the watcher's next revision was compacted.
    pub compact_revision: Revision,
    /// Why the watcher ended, when something other than its owner ended it (etcd's text).
    pub cancel_reason: &'static str,
    /// The events, whole revisions in revision order; empty in a progress reply.
    pub events: Vec<Arc<Event>>,
    /// Whether the events go out with their prev_kv.
    pub prev_kv: bool,
    /// Whether the watcher asked for large replies to be split.
    pub fragment: bool,
}

/// The watchers of one stream and the replies they have produced.
#[derive(Debug, Default)]
pub struct WatchGroup {
    watchers: Watchers,
    /// Watchers canceled by compaction: as in etcd, their ids stay taken until the client
    /// cancels them, which is acknowledged.
    compacted: BTreeSet<i64>,
    /// etcd's `nextID`: automatic ids count up from 0, skipping ids in use.
    next_id: i64,
    progress_requested: bool,
    out: VecDeque<WatchReply>,
    /// Watchers that asked for periodic progress notices (asked on every turn of a stream's
    /// loop, so counted rather than scanned).
    with_progress: usize,
}

impl WatchGroup {
    /// A group without watchers.
    pub fn new() -> WatchGroup {
        WatchGroup::default()
    }

    /// Adds a watcher; `head` is the store's current revision. Returns its id, or the refusal
    /// (both are also queued as replies).
    pub fn create(&mut self, spec: WatchSpec, head: Revision) -> Result<i64, CreateError> {
        match self.check(&spec) {
            Ok(id) => {
                let next = if spec.start_revision.0 == 0 || spec.start_revision > head {
                    spec.start_revision.max(head.next())
                } else {
                    spec.start_revision
                };
                self.with_progress += usize::from(spec.progress_notify);
                self.watchers.insert(id, &spec, next);
                self.out.push_back(WatchReply {
                    watch_id: id,
                    revision: head,
                    created: true,
                    ..WatchReply::default()
                });
                Ok(id)
            }
            Err(e) => {
                self.refuse(e, head);
                Err(e)
            }
        }
    }

    /// Refuses a create without looking at it: a reply created and canceled, with the reason.
    pub fn refuse(&mut self, e: CreateError, head: Revision) {
        self.out.push_back(WatchReply {
            watch_id: INVALID_WATCH_ID,
            revision: head,
            created: true,
            canceled: true,
            cancel_reason: e.reason(),
            ..WatchReply::default()
        });
    }

    fn check(&mut self, spec: &WatchSpec) -> Result<i64, CreateError> {
        if spec.start_revision.0 < 0 {
            return Err(CreateError::Compacted);
        }
        if let KeyRange::Between(start, end) = spec.range() {
            if start >= end {
                return Err(CreateError::EmptyRange);
            }
        }
        let key_bytes = self.watchers.key_bytes() + spec.key.len() + spec.range_end.len();
        if self.watchers.len() + self.compacted.len() >= MAX_WATCHERS || key_bytes > MAX_KEY_BYTES {
            return Err(CreateError::TooManyWatchers);
        }
        let taken = |id: &i64| self.watchers.contains(*id) || self.compacted.contains(id);
        if spec.watch_id != 0 {
            if taken(&spec.watch_id) {
                return Err(CreateError::DuplicateId);
            }
            return Ok(spec.watch_id);
        }
        while taken(&self.next_id) {
            self.next_id += 1;
        }
        self.next_id += 1;
        Ok(self.next_id - 1)
    }

    /// Removes a watcher and acknowledges it; an unknown id is ignored, as etcd does.
    fn remove(&mut self, id: i64) -> bool {
        let Some(w) = self.watchers.remove(id) else { return false };
        self.with_progress -= usize::from(w.flags.has(Flags::PROGRESS));
        true
    }

    /// Removes a watcher and queues its `canceled` reply; unknown ids are ignored.
    pub fn cancel(&mut self, id: i64, head: Revision) {
        if self.remove(id) || self.compacted.remove(&id) {
            self.out.push_back(WatchReply {
                watch_id: id,
                revision: head,
                canceled: true,
                ..WatchReply::default()
            });
        }
    }

    /// A client's progress request; answered by [`WatchGroup::settle`] once every watcher is
    /// synced. A stream with no watchers gets no answer (etcd sends none).
    pub fn request_progress(&mut self) {
        if self.watchers.len() > 0 {
            self.progress_requested = true;
        }
    }

    /// The lowest revision some watcher still needs, at or after `from`, up to `head`.
    pub fn wanted(&self, from: Revision, head: Revision) -> Option<Revision> {
        if from > head {
            return None;
        }
        self.watchers.lowest_next(from..=head)
    }

    /// Hands over a run of consecutive revisions. Every watcher whose next revision lies in the
    /// run receives its events from there to the end of the run, in one reply; watchers outside
    /// it are untouched.
    pub fn deliver(&mut self, run: &EventRun) {
        let last = run.last;
        for (slot, events) in self.watchers.deliver(run.first, last, &run.revisions) {
            let w = self.watchers.get_mut(slot);
            w.flags.set(Flags::SENT, true);
            self.out.push_back(WatchReply {
                watch_id: w.id,
                revision: last,
                events,
                prev_kv: w.flags.has(Flags::PREV_KV),
                fragment: w.flags.has(Flags::FRAGMENT),
                ..WatchReply::default()
            });
        }
    }

    /// The history below `compacted` is gone: watchers that still need it are canceled with
    /// `compact_revision`, as etcd cancels them (its reply carries header revision 0 and no
    /// reason; clients read `compact_revision`).
    pub fn compacted(&mut self, compacted: Revision) {
        for id in self.watchers.below(compacted) {
            self.remove(id);
            self.compacted.insert(id);
            self.out.push_back(WatchReply {
                watch_id: id,
                canceled: true,
                compact_revision: compacted,
                ..WatchReply::default()
            });
        }
    }

    /// Answers a pending progress request if every watcher is synced at `head`.
    pub fn settle(&mut self, head: Revision) {
        if !self.progress_requested {
            return;
        }
        if self.watchers.len() == 0 {
            self.progress_requested = false;
            return;
        }
        // Synced: at the head's successor. A watcher waiting for a future start revision is not
        // (etcd since #20221): a progress notice below its start would let a resuming client
        // ask for events it never wanted.
        if self.watchers.all_at(head.next()) {
            self.progress_requested = false;
            self.out.push_back(WatchReply {
                watch_id: INVALID_WATCH_ID,
                revision: head,
                ..WatchReply::default()
            });
        }
    }

    /// The periodic progress notice: each synced watcher that asked for notices and was sent no
    /// events since the last tick gets an empty reply at `head`.
    pub fn progress_tick(&mut self, head: Revision) {
        for (w, next) in self.watchers.iter_mut() {
            let f = w.flags;
            if f.has(Flags::PROGRESS) && !f.has(Flags::SENT) && next == head.next() {
                self.out.push_back(WatchReply {
                    watch_id: w.id,
                    revision: head,
                    ..WatchReply::default()
                });
            }
            w.flags.set(Flags::SENT, false);
        }
    }

    /// Whether any watcher asked for periodic progress notices.
    pub fn wants_progress_ticks(&self) -> bool {
        self.with_progress > 0
    }

    /// The next reply to send.
    pub fn pop(&mut self) -> Option<WatchReply> {
        let reply = self.out.pop_front();
        if self.out.is_empty() && self.out.capacity() > 0 {
            // An idle stream keeps no queue: a member may hold thousands of them.
            self.out = VecDeque::new();
        }
        reply
    }

    /// Whether replies wait in the queue.
    pub fn has_replies(&self) -> bool {
        !self.out.is_empty()
    }

    /// Watchers in the group.
    pub fn len(&self) -> usize {
        self.watchers.len()
    }

    /// Whether the group has no watchers.
    pub fn is_empty(&self) -> bool {
        self.watchers.len() == 0
    }
}
