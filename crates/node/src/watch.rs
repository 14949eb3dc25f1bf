//! Watch streams: a group of watchers ([`cairn_kv::watch::group::WatchGroup`]) fed from the
//! store's events, woken by the driver each time it executes new revisions.
//!
//! A stream owns nothing but its group and what it holds in hand: it reads events from the
//! store's ring of recent revisions, or from the stored history when a watcher is behind the
//! ring, and only when its owner asks for the next reply. A client that stops reading stops its
//! stream's reads; it costs no queue and no event is dropped, because it catches up from the
//! history later (or is canceled with the compaction revision, as etcd does, once that history
//! is compacted). The futures here need no particular runtime.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use cairn_kv::watch::group::{CreateError, WatchGroup, WatchReply};
use cairn_kv::watch::WatchSpec;
use cairn_kv::{History, Revision};
use tokio::sync::watch;

use crate::error::EngineError;
use crate::replica::Leadership;
use crate::shared::Shared;

/// Revisions one read takes at most (etcd's `watchBatchMaxRevs`).
const RUN_REVISIONS: usize = 1000;
/// Event references one step may hand to replies (a run's events times the watchers that get
/// them): bounds a step's memory with many watchers on one stream.
const STEP_REFS: usize = 1 << 20;
/// Reads one step makes before it yields its replies.
const STEP_READS: usize = 64;

/// One client's stream of watchers.
#[derive(Debug)]
pub struct WatchStream {
    shared: Arc<Shared>,
    group: WatchGroup,
    executed: watch::Receiver<Revision>,
}

impl WatchStream {
    pub(crate) fn new(shared: Arc<Shared>) -> WatchStream {
        let executed = shared.executed.clone();
        WatchStream { shared, group: WatchGroup::new(), executed }
    }

    fn head(&self) -> Revision {
        self.shared.store.current_revision()
    }

    /// Adds a watcher; its `created` reply (or the refusal, with etcd's reason) comes first
    /// from [`WatchStream::next`].
    pub fn create(&mut self, spec: WatchSpec) -> Result<i64, CreateError> {
        let head = self.head();
        self.group.create(spec, head)
    }

    /// Refuses a create the caller may not make (auth), as etcd does: a reply created and
    /// canceled, carrying etcd's error text as the reason.
    pub fn refuse(&mut self, reason: &'static str) {
        let head = self.head();
        self.group.refuse(cairn_kv::watch::group::CreateError::Denied(reason), head);
    }

    /// Cancels a watcher; acknowledged with a `canceled` reply. Unknown ids are ignored.
    pub fn cancel(&mut self, id: i64) {
        let head = self.head();
        self.group.cancel(id, head);
    }

    /// Asks for a progress reply (watch id -1) once every watcher is synced.
    pub fn request_progress(&mut self) {
        self.group.request_progress();
    }

    /// The periodic progress notice (etcd's `--watch-progress-notify-interval`); the caller
    /// owns the clock.
    pub fn progress_tick(&mut self) {
        self.step_now();
        let head = self.head();
        self.group.progress_tick(head);
    }

    /// Whether any watcher asked for periodic progress notices.
    pub fn wants_progress_ticks(&self) -> bool {
        self.group.wants_progress_ticks()
    }

    /// Whether replies are waiting to be taken (the owner may hold back new requests until
    /// they are, so a client that never reads cannot grow the queue).
    pub fn has_replies(&self) -> bool {
        self.group.has_replies()
    }

    /// Watchers on this stream.
    pub fn len(&self) -> usize {
        self.group.len()
    }

    /// Whether the stream has no watchers.
    pub fn is_empty(&self) -> bool {
        self.group.is_empty()
    }

    /// The next reply. Cancel-safe: dropping the future loses nothing.
    pub async fn next(&mut self) -> Result<WatchReply, EngineError> {
        loop {
            if let Some(reply) = self.group.pop() {
                return Ok(reply);
            }
            self.step()?;
            if self.group.has_replies() {
                continue;
            }
            if self.executed.changed().await.is_err() {
                return Err(self.stopped());
            }
        }
    }

    fn stopped(&self) -> EngineError {
        crate::engine::stopped(&self.shared)
    }

    fn step_now(&mut self) {
        if let Err(e) = self.step() {
            // The next call to `next` reports it again; nothing is lost by waiting.
            tracing::debug!("watch step failed: {e}");
        }
    }

    /// Reads what the watchers need and hands it to them.
    fn step(&mut self) -> Result<(), EngineError> {
        if self.shared.failed.load(Ordering::SeqCst) {
            return Err(self.stopped());
        }
        // Mark the wake-up seen before reading the head: anything executed after this read
        // wakes `next` again.
        self.executed.borrow_and_update();
        let head = self.head();
        let max = RUN_REVISIONS.min(STEP_REFS / (self.group.len() + 1)).max(1);
        let mut from = Revision(i64::MIN);
        for _ in 0..STEP_READS {
            let Some(wanted) = self.group.wanted(from, head) else { break };
            match self.shared.store.events(wanted, max)? {
                History::Compacted(c) => self.group.compacted(c),
                History::Events(None) => break,
                History::Events(Some(run)) => {
                    self.group.deliver(&run);
                    from = run.last.next();
                }
            }
        }
        self.group.settle(head);
        Ok(())
    }
}

/// The embedded API's watch: one watcher on a stream of its own.
#[derive(Debug)]
pub struct Watch {
    stream: WatchStream,
    id: i64,
}

impl Watch {
    pub(crate) fn new(mut stream: WatchStream, spec: WatchSpec) -> Result<Watch, EngineError> {
        let id = stream.create(spec).map_err(EngineError::Watch)?;
        // The `created` reply says nothing an embedder needs.
        stream.group.pop();
        Ok(Watch { stream, id })
    }

    /// This watcher's id.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// The next batch of events (whole revisions, in order), or a cancelation: a reply with
    /// `canceled` and `compact_revision` set means the history this watcher needed was
    /// compacted, and it ends.
    pub async fn next(&mut self) -> Result<WatchReply, EngineError> {
        self.stream.next().await
    }
}

/// Leadership as this member sees it, as it changes.
#[derive(Debug)]
pub struct LeadershipWatch {
    rx: watch::Receiver<Option<Leadership>>,
    shared: Arc<Shared>,
}

impl LeadershipWatch {
    pub(crate) fn new(shared: Arc<Shared>) -> LeadershipWatch {
        let mut rx = shared.leadership.clone();
        rx.mark_changed();
        LeadershipWatch { rx, shared }
    }

    /// The current leadership at first, then each change. Cancel-safe.
    pub async fn changed(&mut self) -> Result<Option<Leadership>, EngineError> {
        if self.rx.changed().await.is_err() {
            return Err(crate::engine::stopped(&self.shared));
        }
        Ok(*self.rx.borrow_and_update())
    }
}
