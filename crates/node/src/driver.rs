//! The driver thread: the only owner of the Raft core and the WAL.
//!
//! Each turn of its loop takes every queued request (so many proposals share one `Ready` and one
//! fsync), ticks the core when a tick is due, and handles each `Ready` in the order its contract
//! gives: persist to the WAL and fsync, apply committed entries to the store, answer the callers
//! whose commands were applied, release reads whose index is applied, then advance. Any storage
//! error stops the engine: every caller gets `Stopped` and nothing more is written (fail-stop).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use cairn_kv::{Command, CommandResponse, Prepared};
use cairn_raft::{
    ConfState, Config, EntryPayload, LogIndex, NodeId, Persisted, Raft, ReadCtx, Role, Snapshot,
};
use cairn_storage::fs::OsDir;
use cairn_storage::{Wal, WalOptions};
use tokio::sync::oneshot;

use crate::engine::{EngineConfig, Shared};
use crate::error::EngineError;

type Reply<T> = oneshot::Sender<Result<T, EngineError>>;

pub(crate) enum Input {
    Propose {
        id: u64,
        data: Bytes,
        reply: Reply<CommandResponse>,
    },
    /// Answered with the read index; the caller then waits until it is published.
    ReadIndex {
        reply: Reply<u64>,
    },
    Stop,
}

/// Work for the committer thread.
enum CommitJob {
    Batch(Prepared),
    /// Answered once everything sent before it is committed.
    Flush(std::sync::mpsc::Sender<()>),
}

/// Executed batches the committer may fall behind by before the driver waits (backpressure). It
/// holds more than one [`COMMIT_INTERVAL`] of batches at a few thousand batches per second, so
/// the driver rarely has to wake the committer early.
const COMMIT_QUEUE: usize = 256;

/// Requests a driver turn takes at most before handling the core's output.
const BATCH_MAX: usize = 4096;
/// History records physical compaction removes per step.
const COMPACT_STEP: usize = 1024;

pub(crate) struct Driver {
    raft: Raft,
    wal: Wal<OsDir>,
    shared: Arc<Shared>,
    rx: Receiver<Input>,
    tick: std::time::Duration,
    /// Proposals in flight, by request id.
    proposals: HashMap<u64, Reply<CommandResponse>>,
    /// Reads waiting for their read state, by context.
    reads: HashMap<u64, Reply<u64>>,
    committer: Option<SyncSender<CommitJob>>,
    committer_thread: Option<std::thread::JoinHandle<()>>,
    /// Physical compactions waiting for their removal to finish.
    physical: Vec<Reply<CommandResponse>>,
    physical_done: Vec<CommandResponse>,
    next_read: u64,
    snapshot_entries: u64,
    last_snapshot: LogIndex,
    /// Term and vote as last made durable.
    synced_term_vote: Option<(cairn_raft::Term, Option<NodeId>)>,
}

fn storage_failure(e: impl std::fmt::Display) -> EngineError {
    EngineError::Stopped(format!("storage failure: {e}"))
}

impl Driver {
    pub(crate) fn open(
        cfg: &EngineConfig,
        id: u64,
        member_dir: &Path,
        shared: Arc<Shared>,
        rx: Receiver<Input>,
    ) -> Result<Driver, EngineError> {
        let wal_dir =
            OsDir::create(member_dir.join("wal")).map_err(|e| EngineError::Open(e.to_string()))?;
        let (mut wal, rec) =
            Wal::open(wal_dir, WalOptions { segment_bytes: cfg.wal_segment_bytes })
                .map_err(|e| EngineError::Open(e.to_string()))?;
        let fresh = rec.entries.is_empty() && rec.snapshot.is_none() && rec.hard_state.term.0 == 0;
        let persisted = if fresh {
            // A new single-member cluster: persist the founding configuration before anything.
            let p = Persisted::bootstrap(ConfState::with_voters([NodeId(id)]));
            wal.append(&p.entries, Some(&p.hard_state))
                .map_err(|e| EngineError::Open(e.to_string()))?;
            wal.sync().map_err(|e| EngineError::Open(e.to_string()))?;
            p
        } else {
            let snapshot =
                rec.snapshot.map(|meta| Snapshot { meta, data: Bytes::new() }).unwrap_or_default();
            Persisted { hard_state: rec.hard_state, snapshot, entries: rec.entries }
        };
        let last_snapshot = persisted.snapshot.meta.index;
        let hard_state = persisted.hard_state;
        let mut rcfg = Config::new(NodeId(id));
        rcfg.election_timeout_ticks = cfg.election_ticks;
        rcfg.heartbeat_interval_ticks = cfg.heartbeat_ticks;
        rcfg.seed = id;
        let raft = Raft::new(rcfg, persisted).map_err(|e| EngineError::Open(e.to_string()))?;
        let (committer, jobs) = std::sync::mpsc::sync_channel(COMMIT_QUEUE);
        let committer_shared = shared.clone();
        let committer_thread = std::thread::Builder::new()
            .name(format!("cairn-commit-{}", cfg.name))
            .spawn(move || commit_loop(&committer_shared, &jobs))
            .map_err(|e| EngineError::Open(format!("spawn committer: {e}")))?;
        Ok(Driver {
            raft,
            wal,
            shared,
            rx,
            tick: cfg.tick_interval,
            proposals: HashMap::new(),
            reads: HashMap::new(),
            committer: Some(committer),
            committer_thread: Some(committer_thread),
            physical: Vec::new(),
            physical_done: Vec::new(),
            next_read: 0,
            snapshot_entries: cfg.snapshot_entries,
            last_snapshot,
            synced_term_vote: Some((hard_state.term, hard_state.vote)),
        })
    }

    /// Runs until stopped or a storage error. Reports on `started` once replay is done and this
    /// member leads.
    pub(crate) fn run(mut self, started: Sender<Result<(), EngineError>>) {
        let result = self.start().and_then(|()| {
            let _ = started.send(Ok(()));
            self.serve()
        });
        if let Err(e) = result {
            let why = e.to_string();
            self.shared.fail(why.clone());
            let _ = started.send(Err(e));
            self.fail_all(&why);
        }
        // The committer drains what was executed, then exits.
        self.committer = None;
        self.wake_committer();
        if let Some(t) = self.committer_thread.take() {
            let _ = t.join();
        }
    }

    /// Replays the log and elects this member (alone, it wins at once).
    fn start(&mut self) -> Result<(), EngineError> {
        self.drain_ready()?;
        for _ in 0..1000 {
            if self.raft.role() == Role::Leader
                && self.raft.applied_index() >= self.raft.commit_index()
            {
                return Ok(());
            }
            if self.raft.role() != Role::Leader {
                self.raft.campaign();
            }
            self.drain_ready()?;
        }
        Err(EngineError::Open(
            "this member did not become leader of its single-member cluster".into(),
        ))
    }

    fn serve(&mut self) -> Result<(), EngineError> {
        let mut next_tick = Instant::now() + self.tick;
        loop {
            let wait = next_tick.saturating_duration_since(Instant::now());
            let wait = if self.has_background_work() { std::time::Duration::ZERO } else { wait };
            match self.rx.recv_timeout(wait) {
                Ok(Input::Stop) => return self.stop(),
                Ok(input) => {
                    self.accept(input);
                    for _ in 1..BATCH_MAX {
                        match self.rx.try_recv() {
                            Ok(Input::Stop) => return self.stop(),
                            Ok(input) => self.accept(input),
                            Err(_) => break,
                        }
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return self.stop(),
            }
            if Instant::now() >= next_tick {
                self.raft.tick();
                next_tick += self.tick;
            }
            self.drain_ready()?;
            self.background()?;
        }
    }

    fn stop(&mut self) -> Result<(), EngineError> {
        self.fail_all("engine stopped");
        Ok(())
    }

    fn fail_all(&mut self, why: &str) {
        let err = || EngineError::Stopped(why.to_string());
        for (_, r) in self.proposals.drain() {
            let _ = r.send(Err(err()));
        }
        for (_, r) in self.reads.drain() {
            let _ = r.send(Err(err()));
        }
        for r in self.physical.drain(..) {
            let _ = r.send(Err(err()));
        }
    }

    fn accept(&mut self, input: Input) {
        match input {
            Input::Propose { id, data, reply } => match self.raft.propose(data) {
                Ok(()) => {
                    self.proposals.insert(id, reply);
                }
                Err(_) => {
                    let _ = reply.send(Err(EngineError::NoLeader));
                }
            },
            Input::ReadIndex { reply } => {
                self.next_read += 1;
                let ctx = ReadCtx(Bytes::copy_from_slice(&self.next_read.to_be_bytes()));
                match self.raft.read_index(ctx) {
                    Ok(()) => {
                        self.reads.insert(self.next_read, reply);
                    }
                    Err(_) => {
                        let _ = reply.send(Err(EngineError::NoLeader));
                    }
                }
            }
            Input::Stop => {}
        }
    }

    fn drain_ready(&mut self) -> Result<(), EngineError> {
        while self.raft.has_ready() {
            self.handle_ready()?;
        }
        Ok(())
    }

    fn handle_ready(&mut self) -> Result<(), EngineError> {
        let rd = self.raft.ready();
        // A single member sends no messages; with peers they go out here (issue: clustering).
        if !rd.entries.is_empty() || rd.hard_state.is_some() {
            self.wal.append(&rd.entries, rd.hard_state.as_ref()).map_err(storage_failure)?;
            // As etcd's MustSync: entries, term and vote must be durable before anything that
            // depends on them; a commit index alone need not be (after a crash it is learned
            // again), so it rides along with the next sync.
            let term_vote = rd.hard_state.map(|h| (h.term, h.vote));
            let must_sync = !rd.entries.is_empty()
                || term_vote.is_some_and(|tv| Some(tv) != self.synced_term_vote);
            if must_sync {
                self.wal.sync().map_err(storage_failure)?;
                if let Some(tv) = term_vote {
                    self.synced_term_vote = Some(tv);
                }
            }
        }
        self.apply(&rd.committed_entries)?;
        for rs in rd.read_states {
            let Ok(raw) = <[u8; 8]>::try_from(rs.ctx.0.as_ref()) else { continue };
            if let Some(reply) = self.reads.remove(&u64::from_be_bytes(raw)) {
                let _ = reply.send(Ok(rs.index.0));
            }
        }
        self.raft.advance();
        self.publish_status();
        self.maybe_snapshot()
    }

    fn apply(&mut self, entries: &[cairn_raft::Entry]) -> Result<(), EngineError> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut decoded: Vec<(u64, Option<(u64, Command)>)> = Vec::with_capacity(entries.len());
        for e in entries {
            let cmd = match &e.payload {
                EntryPayload::Normal(data) if !data.is_empty() => {
                    Some(crate::command::decode(data).map_err(storage_failure)?)
                }
                _ => None,
            };
            decoded.push((e.index.0, cmd));
        }
        let batch: Vec<_> =
            decoded.iter().map(|(i, c)| (*i, c.as_ref().map(|(_, cmd)| cmd))).collect();
        // These entries are durable in the WAL (this Ready was synced above). Executing makes
        // them visible to reads; the store commits them in the background.
        let (outcomes, prepared) = self.shared.store.execute(&batch).map_err(storage_failure)?;
        self.shared.executed.send_replace(prepared.applied_index());
        self.commit(CommitJob::Batch(prepared))?;
        for ((_, cmd), outcome) in decoded.into_iter().zip(outcomes) {
            let (Some((id, cmd)), Some(outcome)) = (cmd, outcome) else { continue };
            let Some(reply) = self.proposals.remove(&id) else { continue };
            let physical = matches!(&cmd, Command::Compact(c) if c.physical);
            match outcome {
                Ok(resp) if physical => {
                    self.physical.push(reply);
                    self.physical_done.push(resp);
                }
                Ok(resp) => {
                    let _ = reply.send(Ok(resp));
                }
                Err(e) => {
                    let _ = reply.send(Err(EngineError::Kv(e)));
                }
            }
        }
        Ok(())
    }

    /// Queues work for the committer. Batches do not wake it (it gathers for a whole interval,
    /// and a wakeup per batch costs a context switch per write batch); a flush or a full queue
    /// does.
    fn commit(&self, job: CommitJob) -> Result<(), EngineError> {
        let stopped = || storage_failure("the committer stopped");
        let committer = self.committer.as_ref().ok_or_else(stopped)?;
        let urgent = matches!(job, CommitJob::Flush(_));
        match committer.try_send(job) {
            Ok(()) if !urgent => return Ok(()),
            Ok(()) => {}
            Err(TrySendError::Full(job)) => {
                self.wake_committer();
                committer.send(job).map_err(|_| stopped())?;
            }
            Err(TrySendError::Disconnected(_)) => return Err(stopped()),
        }
        self.wake_committer();
        Ok(())
    }

    fn wake_committer(&self) {
        if let Some(t) = &self.committer_thread {
            t.thread().unpark();
        }
    }

    /// Waits until every executed batch is committed to the store.
    fn flush(&self) -> Result<(), EngineError> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.commit(CommitJob::Flush(tx))?;
        rx.recv().map_err(|_| storage_failure("the committer stopped"))
    }

    fn publish_status(&self) {
        let leader = self.raft.leader().map(|l| l.0);
        self.shared.leader.store(leader.unwrap_or(0), Ordering::Relaxed);
        self.shared.raft_term.store(self.raft.term().0, Ordering::Relaxed);
        let mut s = self.shared.status.lock().unwrap_or_else(|e| e.into_inner());
        s.leader = leader;
        s.raft_term = self.raft.term().0;
        s.raft_index = self.raft.last_index().0;
        s.raft_applied_index = self.raft.applied_index().0;
        drop(s);
        let sole = self.raft.role() == Role::Leader
            && self.raft.conf_state().voters.len() == 1
            && !self.raft.conf_state().is_joint();
        self.shared.sole_voter.store(sole, Ordering::SeqCst);
    }

    /// Compacts the Raft log and the WAL once enough entries were applied. The store is synced
    /// first: the WAL must keep every entry the store might lose in a crash.
    fn maybe_snapshot(&mut self) -> Result<(), EngineError> {
        let applied = self.raft.applied_index();
        if applied.0 < self.last_snapshot.0 + self.snapshot_entries {
            return Ok(());
        }
        // The WAL may drop entries only once the store holds them durably.
        self.flush()?;
        self.shared.store.sync().map_err(storage_failure)?;
        if let Some(meta) = self.raft.compact(Bytes::new()) {
            self.wal.save_compaction(&meta).map_err(storage_failure)?;
            self.wal.sync().map_err(storage_failure)?;
            self.wal.compact(meta.index).map_err(storage_failure)?;
            self.last_snapshot = meta.index;
        }
        Ok(())
    }

    fn has_background_work(&self) -> bool {
        self.shared.store.compaction_work()
    }

    /// One bounded step of physical compaction, so reads and writes never wait for all of it;
    /// answers physical compactions once the history below them is gone.
    fn background(&mut self) -> Result<(), EngineError> {
        if self.has_background_work() {
            self.shared.store.compact_step(COMPACT_STEP).map_err(storage_failure)?;
        }
        if !self.physical.is_empty() && self.shared.store.physically_compacted() {
            for (reply, resp) in self.physical.drain(..).zip(self.physical_done.drain(..)) {
                let _ = reply.send(Ok(resp));
            }
        }
        Ok(())
    }
}

/// How long the committer gathers executed batches into one backend transaction. Writes are
/// answered before this (the WAL holds them), so it costs no latency; it keeps the store's fsync
/// from contending with the WAL's on every write.
const COMMIT_INTERVAL: std::time::Duration = std::time::Duration::from_millis(25);

/// The committer thread: commits executed batches to the store, merging what arrives within
/// [`COMMIT_INTERVAL`] into one backend transaction. It sleeps through the interval and drains
/// the queue when it ends; the driver wakes it early only for a flush, a full queue or shutdown.
/// A failure stops the engine: the executed channel closes (waiting reads fail) and the driver's
/// next send fails.
fn commit_loop(shared: &Shared, jobs: &Receiver<CommitJob>) {
    let mut last_commit = Instant::now();
    while let Ok(first) = jobs.recv() {
        let mut batches = Vec::new();
        let mut flushes = Vec::new();
        let deadline = last_commit + COMMIT_INTERVAL;
        let mut next = Some(first);
        loop {
            while let Some(job) = next.take() {
                match job {
                    CommitJob::Batch(p) => batches.push(p),
                    CommitJob::Flush(tx) => flushes.push(tx),
                }
                if batches.len() < BATCH_MAX {
                    next = jobs.try_recv().ok();
                }
            }
            let now = Instant::now();
            if !flushes.is_empty() || batches.len() >= BATCH_MAX || now >= deadline {
                break;
            }
            // Woken early by the driver (see `Driver::commit`), or spuriously: either way the
            // queue is drained again and the deadline checked.
            std::thread::park_timeout(deadline - now);
            next = jobs.try_recv().ok();
        }
        if let Err(e) = shared.store.commit(batches) {
            shared.fail(format!("storage failure: {e}"));
            return;
        }
        last_commit = Instant::now();
        for tx in flushes {
            let _ = tx.send(());
        }
    }
}
