//! The driver thread: a thin shell that feeds the replica real inputs and carries out its work.
//!
//! Each turn takes every queued request (so many proposals share one `Ready` and one fsync),
//! ticks the replica when a tick of the real clock is due, lets it process, and then carries out
//! what it left: executed batches and sync requests to the committer thread, answers to the
//! callers, status to the shared state. All decisions are the replica's; this file only moves
//! data between threads. A storage error stops the engine: every caller is answered and nothing
//! more is written (fail-stop).

use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_raft::Role;
use cairn_storage::lmdb::LmdbBackend;
use cairn_transport::{MessagePoll, PollHandle, Transport};
use tokio::sync::oneshot;

use crate::committer::{self, Job, Report};
use crate::error::{EngineError, StopCause, StorageError};
use crate::ids::RequestId;
use crate::log_syncer::LogSyncer;
use crate::metrics::{EngineMetrics, TimedDir};
use crate::peers::PeerInput;
use crate::replica::{Replica, Reply};
use crate::shared::Shared;
use crate::spin::SpinPolicy;

/// How a caller waits for its answer.
pub(crate) type Token = oneshot::Sender<Result<Reply, EngineError>>;

pub(crate) type EngineReplica = Replica<TimedDir, LmdbBackend, Token>;

pub(crate) enum Input {
    Propose {
        id: RequestId,
        data: Bytes,
        reply: Token,
    },
    Read {
        reply: Token,
    },
    MoveLeader {
        target: u64,
        reply: Token,
    },
    Handover {
        reply: Token,
    },
    MemberChange {
        id: RequestId,
        change: crate::replica::MemberChange,
        reply: Token,
    },
    LeaseRenew {
        id: cairn_kv::LeaseId,
        reply: Token,
    },
    LeaseTtl {
        id: cairn_kv::LeaseId,
        reply: Token,
    },
    /// A keepalive took a ticket for a round (`lease_clock.rs`); the turn it causes issues it.
    LeaseRound,
    Committer(Report),
    /// The log's sync thread made writes up to this number durable.
    LogSynced(u64),
    /// The log's sync thread failed: the engine stops.
    LogSyncFailed(StorageError),
    Peer(PeerInput),
    Stop,
}

impl Input {
    /// A client's request: what waits, with its client, behind a sync on the driver's thread.
    fn is_request(&self) -> bool {
        matches!(
            self,
            Input::Propose { .. }
                | Input::Read { .. }
                | Input::LeaseRenew { .. }
                | Input::LeaseTtl { .. }
        )
    }
}

impl std::fmt::Debug for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Input")
    }
}

/// The driver's input queue as its senders hold it: queuing an input wakes the driver if it
/// sleeps. The driver sleeps on its [`MessagePoll`], which also watches the peers' message
/// sockets (`cairn_transport::poll`), so one wait covers both.
#[derive(Clone, Debug)]
pub(crate) struct InputTx {
    tx: mpsc::Sender<Input>,
    wake: PollHandle,
}

impl InputTx {
    /// Queues `input`; an error if the driver has stopped (the input is dropped).
    pub(crate) fn send(&self, input: Input) -> Result<(), DriverGone> {
        self.tx.send(input).map_err(|_| DriverGone)?;
        self.wake.wake();
        Ok(())
    }

    /// Where the transport hands the peers' message connections to the driver.
    pub(crate) fn poll(&self) -> PollHandle {
        self.wake.clone()
    }
}

/// The driver has stopped: it takes no more inputs.
#[derive(Debug)]
pub(crate) struct DriverGone;

/// The driver's input queue: its senders' side, and the driver's (the queue and the poll it
/// sleeps on).
pub(crate) fn channel() -> std::io::Result<(InputTx, Receiver<Input>, MessagePoll)> {
    let (tx, rx) = mpsc::channel();
    let (poll, wake) = MessagePoll::new()?;
    Ok((InputTx { tx, wake }, rx, poll))
}

/// What the driver tells those who wait on the member: watch streams and leadership watchers.
#[derive(Debug)]
pub(crate) struct Notify {
    pub(crate) executed: tokio::sync::watch::Sender<cairn_kv::Revision>,
    pub(crate) leadership: tokio::sync::watch::Sender<Option<crate::replica::Leadership>>,
}

/// Requests a turn takes at most before the replica processes them.
const BATCH_MAX: usize = 4096;
/// Bytes of entries (appended by peers, proposed by clients) after which a turn takes no more
/// inputs. A follower catching up is sent up to 256 messages of 1 MiB at once; taken in one
/// turn, their write and apply kept a learner silent for more than an election timeout, and
/// its leader, taking it for down, stopped keeping the log for it and sent it a second 1 GB
/// snapshot (`scripts/snapshot_join.sh`, 2026-11-28). 4 MiB is tens of milliseconds of work.
const TURN_BYTES: u64 = 4 << 20;

/// Bytes of the peers' sockets a turn reads at least, however much its queue brought.
const PEER_READ_MIN: u64 = 256 << 10;

/// Whether a round waits for this message: an append carrying entries, or an answer (to an
/// append, a vote, a read index).
fn awaited(m: &cairn_raft::Message) -> bool {
    use cairn_raft::MessageBody as B;
    match &m.body {
        B::Append { entries, .. } => !entries.is_empty(),
        B::AppendResp { .. } | B::VoteResp { .. } | B::ReadIndexResp { .. } => true,
        _ => false,
    }
}

/// Takes `first`, then what else is queued, into `batch`: up to [`BATCH_MAX`] inputs, or
/// until they bring [`TURN_BYTES`] of entries. Returns the bytes of entries taken.
fn take_turn(rx: &Receiver<Input>, first: Input, batch: &mut Vec<Input>) -> u64 {
    let mut bytes = weight(&first);
    batch.push(first);
    while batch.len() < BATCH_MAX && bytes < TURN_BYTES {
        let Ok(input) = rx.try_recv() else { break };
        bytes += weight(&input);
        batch.push(input);
    }
    bytes
}

/// Every sender of the queue is gone: the engine was dropped.
struct Disconnected;

/// The entry bytes an input brings to a turn (see [`TURN_BYTES`]).
fn weight(input: &Input) -> u64 {
    match input {
        Input::Propose { data, .. } => data.len() as u64,
        Input::Peer(PeerInput::Message(msg)) => crate::peer_inbox::cost(msg),
        _ => 0,
    }
}

pub(crate) struct Driver {
    replica: EngineReplica,
    committer: committer::Handle,
    /// The log's sync thread, with asynchronous storage writes.
    syncer: Option<LogSyncer>,
    shared: Arc<Shared>,
    rx: Receiver<Input>,
    /// Where the driver sleeps, and reads its peers' messages.
    poll: MessagePoll,
    /// Messages read off the peers' sockets in a turn (kept to reuse its allocation).
    peer_msgs: Vec<cairn_raft::Message>,
    tick: Duration,
    /// The peers of a cluster; a single member has none.
    transport: Option<Transport>,
    /// The leader last published, so that a change is logged once.
    leader: Option<(u64, u64)>,
    notify: Notify,
    /// This member was removed from the cluster: it stops serving.
    removed: bool,
    /// The inputs of the current turn (kept to reuse its allocation).
    batch: Vec<Input>,
    /// Whether the driver waits awake for its next input after a turn that had work
    /// (`spin.rs`).
    spin: SpinPolicy,
}

impl Driver {
    pub(crate) fn new(
        replica: EngineReplica,
        (committer, syncer): (committer::Handle, Option<LogSyncer>),
        shared: Arc<Shared>,
        (rx, poll): (Receiver<Input>, MessagePoll),
        (tick, spin_wait): (Duration, Duration),
        transport: Option<Transport>,
        notify: Notify,
    ) -> Driver {
        Driver {
            replica,
            committer,
            syncer,
            shared,
            rx,
            poll,
            peer_msgs: Vec::new(),
            tick,
            transport,
            leader: None,
            notify,
            removed: false,
            batch: Vec::new(),
            spin: SpinPolicy::new(spin_wait),
        }
    }

    /// Executes what the log holds beyond the store, and elects this member at once if it is
    /// its configuration's only voter (no one else could; waiting out an election timeout
    /// would only delay the first request). A member of a larger cluster waits for its timers.
    pub(crate) fn start(&mut self) -> Result<(), StorageError> {
        self.turn()?;
        if self.replica.is_sole_voter() && self.replica.raft().role() != Role::Leader {
            self.replica.campaign();
            self.turn()?;
        }
        Ok(())
    }

    /// Serves until stopped or a storage error, then answers everyone still waiting.
    pub(crate) fn run(mut self) {
        let cause = match self.serve() {
            Ok(()) if self.removed => {
                self.shared.removed.store(true, Ordering::SeqCst);
                StopCause::Removed
            }
            Ok(()) => StopCause::Shutdown,
            Err(e) => {
                self.shared.fail(e.clone());
                StopCause::Storage(e)
            }
        };
        self.shared.failed.store(true, Ordering::SeqCst);
        if !matches!(cause, StopCause::Storage(_)) {
            self.hand_over_every_batch();
        }
        self.replica.fail_all(&EngineError::Stopped(cause));
        self.answer();
        // The committer commits what it was handed, then exits.
        self.committer.stop();
    }

    /// On a graceful stop, the executed batches still waiting for the log's commit index go
    /// to the committer after it is made durable, so the store stops as current as the log.
    /// A failure here loses nothing: the log replays those entries at the next start.
    fn hand_over_every_batch(&mut self) {
        if let Err(e) = self.replica.release_all_batches() {
            tracing::warn!("the store stops behind the log, which replays the rest at start: {e}");
            return;
        }
        for batch in self.replica.work().commits.drain(..) {
            if self.committer.send(Job::Batch(batch)).is_err() {
                return;
            }
        }
    }

    fn serve(&mut self) -> Result<(), StorageError> {
        let start = Instant::now();
        let mut next_tick = start + self.tick;
        // From here the replica's ticks follow the real clock: callers renewing leases convert
        // their moment into the tick this loop reaches by then.
        self.replica.lease_clock().start(start, self.replica.ticks(), self.tick);
        // Whether the last turn had work: then the next input is likely to come soon.
        let mut worked = false;
        loop {
            let first = self.next_input(next_tick, worked);
            // The clock before any input: a member that stalled (SIGSTOP, a VM pause) must
            // count every tick that passed before it judges a read by its lease, or the lease
            // would outlive itself. One tick per turn would let a queued read in first.
            while Instant::now() >= next_tick {
                self.replica.handle_tick();
                next_tick += self.tick;
            }
            let mut taken = 0;
            worked = matches!(first, Ok(Some(_)));
            match first {
                Ok(Some(input)) => {
                    let mut batch = std::mem::take(&mut self.batch);
                    taken = take_turn(&self.rx, input, &mut batch);
                    if let Some(s) = &mut self.syncer {
                        s.took_requests(batch.iter().filter(|i| i.is_request()).count());
                    }
                    for input in batch.drain(..) {
                        if !self.accept(input)? {
                            return Ok(());
                        }
                    }
                    self.batch = batch;
                }
                Ok(None) => {}
                Err(Disconnected) => return Ok(()),
            }
            // Then what the peers' sockets hold, up to the rest of the turn's bytes, and some
            // even when the queue took them all: a leader under a flood of proposals must still
            // read its followers' answers and heartbeats.
            let budget = TURN_BYTES.saturating_sub(taken).max(PEER_READ_MIN);
            self.poll.read(budget, &mut self.peer_msgs);
            worked |= !self.peer_msgs.is_empty();
            for msg in self.peer_msgs.drain(..) {
                self.replica.handle_message(msg);
            }
            self.turn()?;
            if self.removed {
                return Ok(());
            }
        }
    }

    /// The first input of a turn: one queued, or none when a peer's socket has bytes left
    /// unread or a tick is due. Otherwise sleeps until an input is queued, a peer's socket has
    /// bytes, or the next tick; after a turn that `worked`, it may first wait awake for them
    /// (`spin.rs`).
    fn next_input(
        &mut self,
        next_tick: Instant,
        worked: bool,
    ) -> Result<Option<Input>, Disconnected> {
        let take = |rx: &Receiver<Input>| match rx.try_recv() {
            Ok(input) => Ok(Some(input)),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => Err(Disconnected),
        };
        if let Some(input) = take(&self.rx)? {
            return Ok(Some(input));
        }
        let wait = next_tick.saturating_duration_since(Instant::now());
        if self.poll.has_unread() || wait.is_zero() {
            return Ok(None);
        }
        let awake = if worked { self.spin.begin() } else { None };
        if let Some(max) = awake {
            let bound = max.min(wait);
            let start = Instant::now();
            loop {
                if let Some(input) = take(&self.rx)? {
                    self.spin.record(true);
                    return Ok(Some(input));
                }
                if self.poll.peek() {
                    self.spin.record(true);
                    return Ok(None);
                }
                if start.elapsed() >= bound {
                    // A tick cut short is not a miss: the tick is the event.
                    if bound == max {
                        self.spin.record(false);
                    }
                    break;
                }
                // The core first to any thread that wants it: this takes only idle time.
                std::thread::yield_now();
            }
        }
        // The wait awake took part of the time to the tick, or all of it.
        let wait = next_tick.saturating_duration_since(Instant::now());
        if wait.is_zero() {
            return Ok(None);
        }
        // Announced before the last look at the queue: a sender that queues after that look
        // sees the announcement and wakes the sleep.
        self.poll.prepare_sleep();
        let queued = take(&self.rx);
        if !matches!(queued, Ok(None)) {
            self.poll.awake();
            return queued;
        }
        self.poll.sleep(wait);
        take(&self.rx)
    }

    /// Hands one input to the replica; false for a stop.
    fn accept(&mut self, input: Input) -> Result<bool, StorageError> {
        match input {
            Input::Propose { id, data, reply } => self.replica.handle_propose(id, data, reply),
            Input::Read { reply } => self.replica.handle_read(reply),
            Input::MoveLeader { target, reply } => {
                self.replica.handle_move_leader(cairn_raft::NodeId(target), reply)
            }
            Input::Handover { reply } => self.replica.handle_handover(reply),
            Input::MemberChange { id, change, reply } => {
                self.replica.handle_member_change(id, change, reply)
            }
            Input::LeaseRenew { id, reply } => self.replica.handle_lease_renew(id, reply),
            Input::LeaseTtl { id, reply } => self.replica.handle_lease_ttl(id, reply),
            // The replica issues the round the ticket waits for when it processes this turn.
            Input::LeaseRound => {}
            Input::Committer(Report::Durable(index)) => self.replica.handle_store_durable(index),
            // Physical compaction finished; the next process answers who waits for it.
            Input::Committer(Report::CompactionDone) => {}
            Input::Committer(Report::Failed(e)) => return Err(StorageError::Backend(e)),
            Input::LogSynced(write) => self.replica.handle_log_synced(write),
            Input::LogSyncFailed(e) => return Err(e),
            Input::Peer(PeerInput::Message(msg)) => {
                self.shared.peer_inbox.taken(crate::peer_inbox::cost(&msg));
                self.replica.handle_message(msg)
            }
            Input::Peer(PeerInput::SnapshotSent { to, status }) => {
                if status == cairn_raft::SnapshotStatus::Finished {
                    tracing::info!("sent a snapshot to member {:016x}", to.0);
                    EngineMetrics::add(&self.shared.metrics.snapshots_sent, 1);
                }
                self.replica.handle_snapshot_report(to, status)
            }
            Input::Peer(PeerInput::Unreachable(to)) => self.replica.handle_unreachable(to),
            // Only a member that applied the removal says so, so it is committed: this member
            // missed it (cut off before it reached it) and stops as if it had applied it.
            Input::Peer(PeerInput::Removed(by)) if !self.removed => {
                tracing::error!(
                    "the member has been permanently removed from the cluster (member {:016x} refused it)",
                    by.0
                );
                self.removed = true;
            }
            Input::Peer(PeerInput::Removed(_)) => {}
            Input::Stop => return Ok(false),
        }
        Ok(true)
    }

    fn turn(&mut self) -> Result<(), StorageError> {
        if let Some(syncer) = &mut self.syncer {
            // A failed sync stops the engine before anything else is written or synced.
            syncer.check()?;
            let writes = self.replica.log_write_totals();
            let later = syncer.on_thread(&self.shared.metrics.wal_fsync, writes);
            self.replica.set_sync_later(later);
        }
        let transport = &self.transport;
        self.replica.process_with(&mut |msgs| {
            let Some(t) = transport else { return };
            // Entries and answers are what a round waits for: written on this thread if the
            // peer's queue is empty. The rest (a commit's broadcast, heartbeats) is queued, a
            // cheaper hand-off, so that it does not delay the apply and answers after it.
            if msgs.iter().any(awaited) {
                t.send_now(msgs.drain(..));
            } else {
                t.send(msgs.drain(..));
            }
        })?;
        self.carry_out()
    }

    /// Carries out what the replica left in its work.
    fn carry_out(&mut self) -> Result<(), StorageError> {
        // The sync first, so the fsync starts before the rest is carried out.
        if let Some(write) = self.replica.work().log_sync.take() {
            let syncer = self.syncer.as_mut().expect("writes are left to sync only with a syncer");
            let segment = self.replica.log_segment();
            let file = match syncer.needs_handle(segment) {
                true => Some(self.replica.log_sync_handle()?),
                false => None,
            };
            syncer.sync(write, file)?;
        }
        let work = self.replica.work();
        match &self.transport {
            Some(t) => t.send(work.messages.drain(..)),
            // A single member has no one to send to.
            None => work.messages.clear(),
        }
        for batch in work.commits.drain(..) {
            self.committer.send(Job::Batch(batch))?;
        }
        if work.store_sync.take().is_some() {
            self.committer.send(Job::Sync)?;
        }
        if let Some(l) = work.leadership.take() {
            self.notify.leadership.send_replace(Some(l));
        }
        if std::mem::take(&mut work.membership) {
            self.follow_membership();
        }
        // Watch streams read the events themselves; this only wakes them, and only if the
        // revision moved (executions and snapshot installs move it).
        let head = self.shared.store.current_revision();
        self.notify.executed.send_if_modified(|r| std::mem::replace(r, head) != head);
        // Status first: a caller answered (a leader move, a write) sees the state its answer
        // reflects.
        self.publish_status();
        self.answer();
        Ok(())
    }

    /// The applied membership changed: callers see it, the transport dials who was added (or
    /// moved) and forgets who was removed. A member that knows no configuration yet (joining,
    /// before its first entry or snapshot) keeps the peers its flags name.
    fn follow_membership(&mut self) {
        let conf = self.replica.raft().conf_state().clone();
        if conf.voters.is_empty() {
            return;
        }
        let me = self.replica.id();
        if let Some(t) = &mut self.transport {
            let mut peers = std::collections::BTreeMap::new();
            for id in conf.members().into_iter().filter(|id| *id != me) {
                peers.insert(id, self.replica.peer_urls(id.0));
            }
            t.set_peer_urls(peers);
        }
        let removed = !conf.members().contains(&me)
            && self.shared.store.member(me.0).is_some_and(|a| a.removed);
        let old = std::mem::replace(
            &mut *self.shared.conf.lock().unwrap_or_else(|e| e.into_inner()),
            conf.clone(),
        );
        // One line per membership change (the first configuration, at start, is one too).
        if old != conf {
            let ids = |s: &std::collections::BTreeSet<cairn_raft::NodeId>| {
                s.iter().map(|id| format!("{:016x}", id.0)).collect::<Vec<_>>().join(",")
            };
            tracing::info!(
                voters = ids(&conf.voters),
                learners = ids(&conf.learners),
                "membership is now {} voters and {} learners",
                conf.voters.len(),
                conf.learners.len()
            );
        }
        if removed && !self.removed {
            // etcd's words, so an operator searching for them finds the cause.
            tracing::error!("the member has been permanently removed from the cluster");
            self.removed = true;
        }
    }

    fn answer(&mut self) {
        for (token, answer) in self.replica.work().answers.drain(..) {
            let _ = token.send(answer);
        }
    }

    fn publish_status(&mut self) {
        let raft = self.replica.raft();
        let leader = raft.leader().map(|l| l.0);
        let seen = leader.map(|l| (l, raft.term().0));
        if seen != self.leader {
            // What an operator reads first when a cluster misbehaves, as etcd logs it.
            match seen {
                Some((l, term)) => tracing::info!(term, "leader is {l:016x}"),
                None => tracing::warn!(term = raft.term().0, "no leader"),
            }
            // As etcd counts: a leader other than the one last seen (none counts as other).
            if leader.is_some_and(|l| self.leader.is_none_or(|(old, _)| old != l)) {
                EngineMetrics::add(&self.shared.metrics.leader_changes, 1);
            }
            self.leader = seen;
        }
        let m = &self.shared.metrics;
        EngineMetrics::set(&m.committed_index, raft.commit_index().0);
        EngineMetrics::set(&m.applied_index, raft.applied_index().0);
        EngineMetrics::set(&m.proposals_pending, self.replica.waiting().0 as u64);
        self.shared.leader.store(leader.unwrap_or(0), Ordering::Relaxed);
        self.shared.raft_term.store(raft.term().0, Ordering::Relaxed);
        let mut s = self.shared.status.lock().unwrap_or_else(|e| e.into_inner());
        s.leader = leader;
        s.raft_term = raft.term().0;
        s.raft_index = raft.last_index().0;
        s.raft_applied_index = raft.applied_index().0;
        drop(s);
        self.shared.sole_voter.store(self.replica.is_sole_voter_leader(), Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn append(bytes: usize) -> Input {
        use cairn_raft::{Entry, EntryPayload, LogIndex, Message, MessageBody, NodeId, Term};
        let entry = Entry {
            term: Term(1),
            index: LogIndex(1),
            payload: EntryPayload::Normal(Bytes::from(vec![0; bytes])),
        };
        let body = MessageBody::Append {
            prev_index: LogIndex(0),
            prev_term: Term(0),
            entries: vec![entry],
            commit: LogIndex(0),
        };
        Input::Peer(PeerInput::Message(Message {
            from: NodeId(2),
            to: NodeId(1),
            term: Term(1),
            body,
        }))
    }

    #[test]
    fn a_turn_takes_a_few_mib_of_entries_and_leaves_the_rest_queued() {
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..256 {
            tx.send(append(1 << 20)).expect("queued");
        }
        let mut batch = Vec::new();
        take_turn(&rx, rx.try_recv().expect("queued"), &mut batch);
        assert_eq!(batch.len(), 4, "four appends of 1 MiB reach the bound");
        assert_eq!(rx.try_iter().count(), 252, "the rest wait for the next turns");
    }

    #[test]
    fn a_turn_takes_every_small_input_queued_up_to_the_count_bound() {
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..5000 {
            tx.send(Input::LeaseRound).expect("queued");
        }
        let mut batch = Vec::new();
        take_turn(&rx, Input::LeaseRound, &mut batch);
        assert_eq!(batch.len(), BATCH_MAX);
    }
}
