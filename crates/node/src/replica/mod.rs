//! One member of a cairn cluster as a state machine: the Raft core, the write-ahead log, the kv
//! store and the callers waiting on them, driven only by its inputs.
//!
//! The replica has no thread, clock or socket of its own (quinn-proto's and TigerBeetle's
//! replica's shape). Its inputs are `handle_*` calls: a client's proposal or read, a peer's
//! message, a tick of logical time, a report that the store is durable. [`Replica::process`]
//! then does what the core's `Ready` asks — it writes and fsyncs the log through the
//! [`cairn_storage::fs::Dir`] seam and executes committed entries in the store — and leaves the
//! rest as data in [`Work`]: messages for the transport, executed batches for the store's
//! committer, answers for the callers. Three things feed it: the driver thread in production
//! (real clock, `OsDir`, LMDB, and later the network), the simulator (simulated clock, network
//! and `FaultyDir`, an in-memory backend), and tests that assert the exact work one input causes.

mod apply;
mod compact;
mod lease;
mod log_sync;
mod members;
mod moves;
mod publish;
mod snapshot;
mod store_batches;

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use cairn_kv::backend::{Backend, BackendError};
use cairn_kv::{CommandResponse, Prepared, Store};
use cairn_raft::{
    ConfChange, ConfState, Entry, LogIndex, Message, NodeId, Persisted, ProposeError, Raft, Role,
    SnapshotMeta, SnapshotStatus, Term, TransferError,
};
use cairn_storage::fs::Dir;
use cairn_storage::{Recovered, Wal};

use crate::config::{Bug, ReplicaConfig};
use crate::error::{EngineError, OpenError, StorageError};
use crate::ids::{RequestId, RequestIds};
use crate::waiters::Waiters;
use cairn_kv::Command;

pub use apply::AppliedEntry;
pub use members::MemberChange;

/// What a caller is answered with when its request is done.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// The proposal was applied; this is what applying it produced.
    Command(CommandResponse),
    /// The read may run now: the store has executed everything committed before it began.
    Read,
    /// The member asked for leads now (or there was no leadership to hand over).
    LeaderMoved,
    /// A keepalive renewed the lease for this many seconds.
    LeaseRenewed {
        /// The lease's TTL.
        ttl: i64,
    },
    /// A lease's granted TTL and the seconds it has left (-1: no such lease).
    LeaseTtl {
        /// Seconds granted.
        granted: i64,
        /// Seconds left.
        remaining: i64,
    },
}

/// A change of leadership, as this member sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Leadership {
    /// The leader's member id, or `None` while there is none (an election is under way).
    pub leader: Option<NodeId>,
    /// The Raft term this is true in.
    pub term: Term,
}

/// What the replica leaves for its driver after [`Replica::process`]. The driver drains each
/// list (keeping their capacity) before the next call.
#[derive(Debug)]
pub struct Work<T> {
    /// Messages for the transport, in order. Snapshot messages carry the store's image.
    pub messages: Vec<Message>,
    /// Executed batches for the store's committer, in order ([`cairn_kv::Store::commit`]).
    pub commits: Vec<Prepared>,
    /// Make the store durable (commit every batch handed out so far, then
    /// [`cairn_kv::Store::sync`]) and report the durable index with
    /// [`Replica::handle_store_durable`]. The log is compacted up to it then.
    pub store_sync: Option<LogIndex>,
    /// The log holds writes up to this number that are not yet durable
    /// ([`cairn_raft::Config::async_storage_writes`]): sync the log, here with
    /// [`Replica::sync_log`] or on another thread through [`Replica::log_sync_handle`], and
    /// report it with [`Replica::handle_log_synced`]. Acknowledgements wait for that report.
    pub log_sync: Option<u64>,
    /// Callers to answer.
    pub answers: Vec<(T, Result<Reply, EngineError>)>,
    /// The leader or term changed.
    pub leadership: Option<Leadership>,
    /// With [`ReplicaConfig::observe`]: what happened, in order, for checkers.
    pub observed: Vec<Observed>,
    /// The membership or a member's peer URLs may have changed (a change applied, a snapshot
    /// installed, or the replica just opened): the transport's peers follow it.
    pub membership: bool,
}

impl<T> Default for Work<T> {
    fn default() -> Work<T> {
        Work {
            messages: Vec::new(),
            commits: Vec::new(),
            store_sync: None,
            log_sync: None,
            answers: Vec::new(),
            leadership: None,
            observed: Vec::new(),
            membership: false,
        }
    }
}

/// What a replica did, in order, reported with [`ReplicaConfig::observe`] on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observed {
    /// Entries written to the log (replacing any suffix from their first index on);
    /// `prev_term` is the term of the entry before the first, as the log held it.
    Persisted {
        /// The term of the entry before the first.
        prev_term: Option<Term>,
        /// The entries written.
        entries: Vec<Entry>,
    },
    /// A committed entry applied, with what executing it produced.
    Applied(AppliedEntry),
    /// A snapshot from a leader installed in the store and the log.
    Installed(SnapshotMeta),
    /// The log compacted up to here.
    Compacted(SnapshotMeta),
}

/// A proposal waiting to be applied: the caller, the entry data (to tell it from another
/// member's entry with a colliding id), and the term when it was made (to say whether
/// leadership changed before it timed out).
#[derive(Debug)]
struct Proposal<T> {
    token: T,
    data: Bytes,
    term: Term,
}

/// A read waiting for its read index (`None`) or for the store to execute that index.
#[derive(Debug)]
struct Read<T> {
    index: Option<LogIndex>,
    purpose: ReadFor<T>,
}

/// Who waits for a read.
#[derive(Debug)]
enum ReadFor<T> {
    /// A caller that reads the store.
    Store(T),
    /// Whoever waits for this round confirming the leadership for leases (`lease.rs`); a
    /// read released in a later term confirms nothing.
    Leases { round: u64, term: Term },
}

/// One member: the consensus core, its log, the store and everyone waiting on them.
pub struct Replica<D: Dir, B: Backend, T> {
    cfg: ReplicaConfig,
    raft: Raft,
    wal: Wal<D>,
    store: Arc<Store<B>>,
    ticks: u64,
    /// Proposals handed in since the last `process`, proposed together there.
    incoming: Vec<(RequestId, Bytes, T)>,
    proposals: Waiters<RequestId, Proposal<T>>,
    /// Proposals this member appended as leader, by index: if another entry is applied there,
    /// theirs is lost. Invariant: each id here is in `proposals` or was answered.
    proposal_index: BTreeMap<LogIndex, RequestId>,
    reads: Waiters<RequestId, Read<T>>,
    /// Reads whose index is known, by that index, until the store has executed it.
    reads_at: BTreeMap<LogIndex, Vec<RequestId>>,
    /// Physical compactions applied, answered once the history below them is removed. They
    /// wait for work already certain to finish, not on other members, so no deadline.
    physical: Vec<(T, CommandResponse)>,
    /// Callers waiting for leadership to move.
    moves: Vec<moves::Move<T>>,
    /// Ids of what the replica asks for itself: reads' contexts and its attributes' proposals.
    own_ids: RequestIds,
    /// Publishes this member's attributes, if it has any to publish.
    publisher: Option<publish::Publisher>,
    /// The leader's lease clock.
    lessor: lease::Lessor,
    /// Keepalives and TimeToLives waiting for a round to confirm the leadership, in the
    /// order of their rounds (see `handle_lease_renew`).
    lease_asks: std::collections::VecDeque<lease::LeaseAsk<T>>,
    /// Keepalives waiting for the log (see `handle_lease_renew`).
    renewals: Vec<lease::Renewal<T>>,
    /// Term and vote as last made durable.
    synced_term_vote: (Term, Option<NodeId>),
    /// A hard state that moved only the commit index, not yet written: it rides with the next
    /// write to the log (see `persist`).
    lazy_hard_state: Option<cairn_raft::HardState>,
    /// A store sync was asked for and not yet reported.
    store_sync_pending: bool,
    /// Executed batches waiting for the log's durable commit index (`store_batches.rs`).
    held_batches: store_batches::HeldBatches,
    /// Writes left for the driver to sync, and what waits for them (`log_sync.rs`).
    syncs: log_sync::Syncs,
    /// The store is durable up to here (reported by the committer).
    store_durable: LogIndex,
    leadership: Leadership,
    /// A snapshot image that arrived with a message the core has not yet asked to install.
    incoming_image: Option<(SnapshotMeta, Bytes)>,
    /// The image last sent, by the applied index it shows, so one round of snapshot messages
    /// encodes the store once.
    outgoing_image: Option<(LogIndex, Bytes)>,
    /// Followers whose snapshot could not be made this round.
    unsent_snapshots: Vec<NodeId>,
    work: Work<T>,
    failed: Option<StorageError>,
    /// The tick each peer was last heard from, for the membership's health checks and for
    /// keeping the log for followers that catch up (`compact.rs`).
    heard: std::collections::HashMap<NodeId, u64>,
    /// The tick at which a snapshot last reached each follower, as the transport reported,
    /// and the index the leader sent it at: until it acknowledges that index it is installing
    /// it, silent, and will need the log from there on (`compact.rs`).
    snapshot_delivered: std::collections::HashMap<NodeId, (u64, LogIndex)>,
    /// The tick since which each learner has stayed close to this leader's log, for
    /// automatic promotion (`members.rs`).
    close_since: std::collections::BTreeMap<NodeId, u64>,
}

/// The membership a brand-new data directory starts with: the founding members of a new
/// cluster, or nothing for a member that joins one and learns it from the leader.
#[derive(Clone, Debug)]
pub enum Bootstrap {
    /// Found a cluster of these voters.
    Founding(ConfState),
    /// Join a running cluster.
    Joining,
}

impl<D: Dir, B: Backend, T> Replica<D, B, T> {
    /// Opens a replica over its log directory and store. A directory whose log is empty is new:
    /// it starts as `bootstrap` says. Otherwise the log is replayed into the core; committed
    /// entries the store lacks are executed by the first [`Replica::process`].
    pub fn open(
        cfg: ReplicaConfig,
        dir: D,
        store: Arc<Store<B>>,
        bootstrap: Bootstrap,
        now_micros: u64,
    ) -> Result<Replica<D, B, T>, OpenError> {
        let wal_opts = cairn_storage::WalOptions::default();
        Self::open_with(cfg, dir, wal_opts, store, bootstrap, now_micros)
    }

    /// [`Replica::open`] with the log's options.
    pub fn open_with(
        cfg: ReplicaConfig,
        dir: D,
        wal_opts: cairn_storage::WalOptions,
        store: Arc<Store<B>>,
        bootstrap: Bootstrap,
        now_micros: u64,
    ) -> Result<Replica<D, B, T>, OpenError> {
        let (mut wal, mut persisted, mut compacted) = open_log(&cfg, dir, wal_opts, bootstrap)?;
        if let Some(meta) = unrecorded_install(&store, &persisted)? {
            finish_install(&mut wal, &mut persisted, &meta)?;
            compacted = meta.index;
        }
        let hs = persisted.hard_state;
        let id = cfg.raft.id;
        let raft = Raft::new(cfg.raft.clone(), persisted).map_err(OpenError::Raft)?;
        // What the log holds durably: its hard state's commit index, or its snapshot's.
        let commit = raft.commit_index();
        let applied = store.applied_index();
        // The log is compacted only up to what the store made durable: a store behind the
        // compaction point (a database replaced by an empty one) cannot be rebuilt from it.
        if applied < compacted.0 {
            return Err(OpenError::StoreBehindLog { applied, compacted });
        }
        let timeout = cfg.request_timeout_ticks;
        Ok(Replica {
            raft,
            wal,
            store_durable: LogIndex(store.applied_index()),
            store,
            ticks: 0,
            incoming: Vec::new(),
            proposals: Waiters::new(timeout),
            proposal_index: BTreeMap::new(),
            reads: Waiters::new(timeout),
            reads_at: BTreeMap::new(),
            physical: Vec::new(),
            moves: Vec::new(),
            own_ids: RequestIds::new(id.0, now_micros),
            publisher: publisher(&cfg, timeout),
            lessor: lease::Lessor::new(cfg.tick_micros, cfg.lease_revoke_rate),
            lease_asks: std::collections::VecDeque::new(),
            renewals: Vec::new(),
            synced_term_vote: (hs.term, hs.vote),
            lazy_hard_state: None,
            store_sync_pending: false,
            held_batches: store_batches::HeldBatches::default(),
            syncs: log_sync::Syncs::with_commit(commit),
            leadership: Leadership { leader: None, term: hs.term },
            incoming_image: None,
            outgoing_image: None,
            unsent_snapshots: Vec::new(),
            work: Work { membership: true, ..Work::default() },
            failed: None,
            heard: std::collections::HashMap::new(),
            snapshot_delivered: std::collections::HashMap::new(),
            close_since: std::collections::BTreeMap::new(),
            cfg,
        })
    }

    // ---- Inputs ----

    /// A client's proposal: `data` is the command encoded under `id` ([`crate::prepare`]).
    /// Answered with [`Reply::Command`] once applied here, or with an error.
    pub fn handle_propose(&mut self, id: RequestId, data: Bytes, token: T) {
        self.incoming.push((id, data, token));
    }

    /// A client's linearizable read: answered with [`Reply::Read`] once the store reflects every
    /// write committed before now (ReadIndex, thesis §6.4).
    pub fn handle_read(&mut self, token: T) {
        if self.cfg.has_bug(Bug::ReadWithoutIndex) {
            self.work.answers.push((token, Ok(Reply::Read)));
            return;
        }
        let id = self.own_ids.next_id();
        match self.raft.read_index(id.to_ctx()) {
            Ok(()) => {
                let read = Read { index: None, purpose: ReadFor::Store(token) };
                self.reads.register(id, read, self.ticks);
            }
            // The only refusal: no leader to ask.
            Err(_) => self.work.answers.push((token, Err(EngineError::NoLeader))),
        }
    }

    /// A read that will not be released: its caller, or its round's waiters, get `err`.
    fn read_failed(&mut self, read: Read<T>, err: EngineError) {
        match read.purpose {
            ReadFor::Store(token) => self.work.answers.push((token, Err(err))),
            ReadFor::Leases { round, .. } => self.lease_round_ended(round, Err(err)),
        }
    }

    /// A message from a peer. A snapshot's image is kept aside; the core sees the metadata.
    pub fn handle_message(&mut self, msg: Message) {
        self.heard.insert(msg.from, self.ticks);
        if let Some(msg) = self.accept_snapshot_image(msg) {
            self.raft.step(msg);
        }
    }

    /// One tick of logical time: the core's timers, and the waiters' deadlines.
    pub fn handle_tick(&mut self) {
        self.ticks += 1;
        self.raft.tick();
        let term = self.raft.term();
        for p in self.proposals.expire(self.ticks) {
            self.count_failed(1);
            let err = if p.term == term {
                EngineError::Timeout
            } else {
                EngineError::TimeoutDueToLeaderFail
            };
            self.work.answers.push((p.token, Err(err)));
        }
        for r in self.reads.expire(self.ticks) {
            self.read_failed(r, EngineError::Timeout);
        }
        self.expire_moves();
        self.expire_renewals();
        self.lessor_tick();
        self.auto_promote_tick();
    }

    /// The committer made the store durable up to `index` (asked for in [`Work::store_sync`]).
    pub fn handle_store_durable(&mut self, index: LogIndex) {
        self.store_sync_pending = false;
        self.store_durable = self.store_durable.max(index);
    }

    /// The transport reports how sending a snapshot to `to` ended.
    pub fn handle_snapshot_report(&mut self, to: NodeId, status: SnapshotStatus) {
        if status == SnapshotStatus::Finished {
            self.note_snapshot_delivered(to);
        }
        self.raft.report_snapshot(to, status);
    }

    /// The transport dropped messages to `to` (it is down, or its queue is full): the leader
    /// stops streaming appends to it and probes instead.
    pub fn handle_unreachable(&mut self, to: NodeId) {
        self.raft.report_unreachable(to);
    }

    /// Starts an election now.
    pub fn campaign(&mut self) {
        self.raft.campaign();
    }

    /// Proposes a membership change (the membership API arrives with clustering; the simulator
    /// drives it directly).
    pub fn propose_conf_change(&mut self, cc: ConfChange) -> Result<(), ProposeError> {
        self.raft.propose_conf_change(cc)
    }

    /// Asks the leader to hand leadership to `target`.
    pub fn transfer_leader(&mut self, target: NodeId) -> Result<(), TransferError> {
        self.raft.transfer_leader(target)
    }

    // ---- Driving ----

    /// Does everything the inputs so far made necessary: proposes what was handed in, then
    /// handles every `Ready` in the order its contract gives (send, persist and fsync, send what
    /// depends on it, install, apply, release reads), compacts the log up to what the store has
    /// made durable, and leaves the rest in [`Replica::work`]. A storage error stops the
    /// replica for good (fail-stop): this and every later call return it.
    pub fn process(&mut self) -> Result<(), StorageError> {
        self.process_with(&mut |_| {})
    }

    /// [`Replica::process`], handing `early` the messages a round waits for as soon as they
    /// may leave: a leader's appends before the log's fsync, so that the transport sends them
    /// while this member writes its own copy (thesis §10.2.1) and a write commits after the
    /// slower of the two, not after both in turn; and what follows a member's fsync (its
    /// acknowledgements, votes) before it applies. `early` drains what it sends; the rest stays
    /// in [`Work::messages`].
    pub fn process_with(
        &mut self,
        early: &mut dyn FnMut(&mut Vec<Message>),
    ) -> Result<(), StorageError> {
        self.fail_stop(|r| r.process_inner(early))
    }

    /// Runs `f` unless the replica has failed, and keeps `f`'s storage error for good: this
    /// and every later call return it (fail-stop).
    fn fail_stop(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<(), StorageError>,
    ) -> Result<(), StorageError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let result = f(self);
        if let Err(e) = &result {
            self.failed = Some(e.clone());
        }
        result
    }

    fn process_inner(
        &mut self,
        early: &mut dyn FnMut(&mut Vec<Message>),
    ) -> Result<(), StorageError> {
        if let Some((last, commit)) = self.raft.lost_log() {
            return Err(StorageError::LogLost { last, commit });
        }
        // What waited for a sync that has since reported leaves first, before anything newer.
        self.release_held()?;
        if !self.work.messages.is_empty() {
            early(&mut self.work.messages);
        }
        self.propose_incoming();
        self.issue_lease_round();
        self.handle_readies(early)?;
        // Once everything committed is applied: the store shows what the cluster holds.
        if self.maybe_publish() {
            self.handle_readies(early)?;
        }
        self.release_batches()?;
        self.drop_incoming_image();
        self.outgoing_image = None;
        self.release_reads();
        // The engine's callers skip rounds while this member's own vote is a quorum.
        self.lessor_sole_voter(self.is_sole_voter_leader());
        self.release_physical();
        self.maybe_compact_log()?;
        self.maybe_ask_store_sync();
        Ok(())
    }

    fn handle_readies(
        &mut self,
        early: &mut dyn FnMut(&mut Vec<Message>),
    ) -> Result<(), StorageError> {
        while self.raft.has_ready() {
            let rd = self.raft.ready();
            let empty = is_empty(&rd);
            self.handle_ready(rd, early)?;
            self.report_unsent_snapshots();
            // A core that asks for a Ready and puts nothing in it would have this loop spin
            // forever (simulator seed 167 found one): fail loudly instead.
            assert!(!empty || !self.raft.has_ready(), "the core keeps asking for empty Readies");
        }
        Ok(())
    }

    /// Proposes everything handed in since the last call as one batch (one message to the
    /// leader when this member follows).
    fn propose_incoming(&mut self) {
        if self.incoming.is_empty() {
            return;
        }
        let incoming = std::mem::take(&mut self.incoming);
        let batch: Vec<Bytes> = incoming.iter().map(|(_, data, _)| data.clone()).collect();
        let n = batch.len() as u64;
        match self.raft.propose_batch(batch) {
            Ok(()) => {
                let term = self.raft.term();
                // A leader appended them, in order, at the end of its log.
                let first = (self.raft.role() == Role::Leader)
                    .then(|| LogIndex(self.raft.last_index().0 + 1 - n));
                for (i, (id, data, token)) in incoming.into_iter().enumerate() {
                    if let Some(first) = first {
                        self.proposal_index.insert(LogIndex(first.0 + i as u64), id);
                    }
                    self.proposals.register(id, Proposal { token, data, term }, self.ticks);
                }
            }
            Err(e) => {
                self.count_failed(incoming.len());
                let err = match e {
                    ProposeError::LeaderTransferring => EngineError::LeaderTransfer,
                    _ => EngineError::NoLeader,
                };
                for (_, _, token) in incoming {
                    self.work.answers.push((token, Err(err.clone())));
                }
            }
        }
    }

    /// Answers every waiting caller with `err` (the replica is stopping).
    pub fn fail_all(&mut self, err: &EngineError) {
        self.count_failed(self.incoming.len() + self.proposals.len());
        for (_, _, token) in self.incoming.drain(..) {
            self.work.answers.push((token, Err(err.clone())));
        }
        for p in self.proposals.drain() {
            self.work.answers.push((p.token, Err(err.clone())));
        }
        for r in self.reads.drain() {
            self.read_failed(r, err.clone());
        }
        for (token, _) in self.physical.drain(..) {
            self.work.answers.push((token, Err(err.clone())));
        }
        self.fail_moves(err);
        self.fail_renewals(err);
        self.proposal_index.clear();
        self.reads_at.clear();
    }

    /// Counts proposals that will never commit (etcd's `proposals_failed_total`).
    fn count_failed(&self, n: usize) {
        if let Some(m) = &self.cfg.metrics {
            crate::metrics::EngineMetrics::add(&m.proposals_failed, n as u64);
        }
    }

    // ---- Outputs and queries ----

    /// What the last calls left for the driver.
    pub fn work(&mut self) -> &mut Work<T> {
        &mut self.work
    }

    /// The consensus core, for status and for checkers.
    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    /// The store this replica executes into.
    pub fn store(&self) -> &Arc<Store<B>> {
        &self.store
    }

    /// This member's id.
    pub fn id(&self) -> NodeId {
        self.raft.id()
    }

    /// This member leads and is the only voter: it alone decides what commits.
    pub fn is_sole_voter_leader(&self) -> bool {
        self.raft.role() == Role::Leader && self.is_sole_voter()
    }

    /// This member is the only voter of its configuration.
    pub fn is_sole_voter(&self) -> bool {
        let conf = self.raft.conf_state();
        !conf.is_joint() && conf.voters.len() == 1 && conf.voters.contains(&self.raft.id())
    }

    /// Callers waiting: proposals, reads, and the others (physical compactions, leadership
    /// moves, keepalives and TimeToLives).
    pub fn waiting(&self) -> (usize, usize, usize) {
        let leases = self.lease_asks.len() + self.renewals.len();
        let others = self.physical.len() + self.moves.len() + leases;
        (self.proposals.len() + self.incoming.len(), self.reads.len(), others)
    }
}

impl<D: Dir, B: Backend, T> std::fmt::Debug for Replica<D, B, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replica")
            .field("id", &self.raft.id())
            .field("term", &self.raft.term())
            .field("role", &self.raft.role())
            .field("applied", &self.raft.applied_index())
            .field("waiting", &self.waiting())
            .finish_non_exhaustive()
    }
}

fn is_empty(rd: &cairn_raft::Ready) -> bool {
    rd.messages_now.is_empty()
        && rd.snapshot.is_none()
        && rd.entries.is_empty()
        && rd.hard_state.is_none()
        && rd.messages_after_persist.is_empty()
        && rd.committed_entries.is_empty()
        && rd.read_states.is_empty()
        && rd.soft_state.is_none()
}

/// The founding entry records the founding members' peer URLs, so that a member that joins
/// later and replays the log from the start learns them as every founder did.
fn founding(conf: ConfState, peers: &[(u64, Vec<String>)]) -> Persisted {
    let mut p = Persisted::bootstrap(conf);
    if peers.is_empty() {
        return p;
    }
    let cmd = Command::Membership { peers: peers.to_vec(), removed: Vec::new() };
    for e in &mut p.entries {
        if let cairn_raft::EntryPayload::ConfChange(cc) = &mut e.payload {
            cc.context = crate::command::encode(0, &cmd);
        }
    }
    p
}

/// What the core restarts from: the log as replayed.
fn recovered(rec: Recovered) -> Persisted {
    let snapshot = rec
        .snapshot
        .map(|meta| cairn_raft::Snapshot { meta, data: Bytes::new() })
        .unwrap_or_default();
    Persisted { hard_state: rec.hard_state, snapshot, entries: rec.entries }
}

fn is_fresh(rec: &Recovered) -> bool {
    rec.entries.is_empty() && rec.snapshot.is_none() && rec.hard_state.term.0 == 0
}

/// Opens the log, founding it as `bootstrap` says if it is new: the log, what the core starts
/// from, and the index the log is compacted to.
fn open_log<D: Dir>(
    cfg: &ReplicaConfig,
    dir: D,
    wal_opts: cairn_storage::WalOptions,
    bootstrap: Bootstrap,
) -> Result<(Wal<D>, Persisted, LogIndex), OpenError> {
    let wal_err = |e| OpenError::Wal(Arc::new(e));
    let (mut wal, rec) = Wal::open(dir, wal_opts).map_err(wal_err)?;
    let compacted = rec.snapshot.as_ref().map_or(LogIndex::ZERO, |s| s.index);
    let persisted = match (is_fresh(&rec), bootstrap) {
        (true, Bootstrap::Founding(conf)) => {
            // Persist the founding configuration and peer URLs before anything else.
            let p = founding(conf, &cfg.founding_peers);
            wal.append(&p.entries, Some(&p.hard_state)).map_err(wal_err)?;
            p
        }
        // What replay read may sit unsynced in the page cache (the last run was killed before
        // its sync): it is made durable below, before anything acts on it, the core's synced
        // log and the store's batches (`store_batches.rs`) alike.
        (_, _) => recovered(rec),
    };
    wal.sync().map_err(wal_err)?;
    Ok((wal, persisted, compacted))
}

/// The snapshot the store was installed from, if the log never recorded that install: a crash
/// came between the store's install and the log's record of it (`snapshot.rs`). The store
/// records the snapshot's metadata in the install's own atomic write; the install is unrecorded
/// if the store still holds exactly that image (it has applied nothing since) and the log
/// neither holds the snapshot's entry nor is compacted to it or past it. The core installs a
/// snapshot only when its log does not hold that entry, so every entry the log does hold is
/// either covered by the snapshot or conflicts with it: none is lost by recording the install.
fn unrecorded_install<B: Backend>(
    store: &Store<B>,
    persisted: &Persisted,
) -> Result<Option<SnapshotMeta>, OpenError> {
    let Some(raw) = store.installed_from().map_err(OpenError::Backend)? else { return Ok(None) };
    let meta = cairn_storage::codec::decode_snapshot_meta(&raw)
        .map_err(|_| OpenError::Backend(BackendError::Corrupt("bad snapshot origin record")))?;
    let recorded = persisted.snapshot.meta.index >= meta.index
        || persisted.entries.iter().any(|e| e.index == meta.index && e.term == meta.term);
    Ok((!recorded && store.applied_index() == meta.index.0).then_some(meta))
}

/// Records in the log the install [`unrecorded_install`] found, durably, as the interrupted
/// install would have, and starts the core from it.
fn finish_install<D: Dir>(
    wal: &mut Wal<D>,
    persisted: &mut Persisted,
    meta: &SnapshotMeta,
) -> Result<(), OpenError> {
    let wal_err = |e| OpenError::Wal(Arc::new(e));
    tracing::warn!(
        index = meta.index.0,
        term = meta.term.0,
        "the store holds a snapshot the log did not record (a crash came between the two): \
         recording it"
    );
    wal.install_snapshot(meta).map_err(wal_err)?;
    wal.sync().map_err(wal_err)?;
    persisted.snapshot = cairn_raft::Snapshot { meta: meta.clone(), data: Bytes::new() };
    persisted.entries.clear();
    Ok(())
}

/// Decodes a committed entry's command, naming the entry if it does not decode.
fn decode_entry(index: LogIndex, data: &[u8]) -> Result<(RequestId, Command), StorageError> {
    crate::command::decode(data)
        .map(|(id, cmd)| (RequestId(id), cmd))
        .map_err(|error| StorageError::Entry { index, error })
}

/// The publisher of this member's attributes, if it publishes any (a cluster member does).
fn publisher(cfg: &ReplicaConfig, timeout: u64) -> Option<publish::Publisher> {
    cfg.publish.clone().map(|a| {
        let election = u64::from(cfg.raft.election_timeout_ticks);
        publish::Publisher::new(a, election, timeout)
    })
}
