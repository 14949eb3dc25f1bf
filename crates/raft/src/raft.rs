//! The node's state and its public inputs. Role-specific handling lives in `election.rs`,
//! `leader.rs` and `follower.rs`; what the driver gets back lives in `ready.rs`.

use bytes::Bytes;

use crate::config::{Config, ConfigError, ReadMode};
use crate::error::{ProposeError, ReadIndexError, TransferError};
use crate::log::RaftLog;
use crate::message::{Message, MessageBody};
use crate::progress::{Progress, Window};
use crate::reads::{ReadOnly, ReadRequest};
use crate::ready::{ReadState, ReadyMark};
use crate::rng::SplitMix64;
use crate::tracker::{apply_conf_change, Tracker};
use crate::types::{
    ConfChange, ConfChangeSingle, ConfState, Entry, EntryPayload, HardState, LogIndex, NodeId,
    ReadCtx, Role, Snapshot, SnapshotMeta, Term,
};

/// What a node finds on its disk when it starts: the latest snapshot, the log entries after it,
/// and the hard state. A brand-new node that joins an existing cluster starts from
/// `Persisted::default()` and learns the configuration from the leader.
#[derive(Clone, Debug, Default)]
pub struct Persisted {
    pub hard_state: HardState,
    pub snapshot: Snapshot,
    pub entries: Vec<Entry>,
}

impl Persisted {
    /// The state of a founding member of a new cluster: one committed entry at index 1 that adds
    /// the founding members. Keeping the founding configuration in the log (as etcd does) means a
    /// node that joins later learns it by replication like any other change.
    pub fn bootstrap(conf: ConfState) -> Persisted {
        let changes = conf
            .voters
            .iter()
            .map(|id| ConfChangeSingle::AddVoter(*id))
            .chain(conf.learners.iter().map(|id| ConfChangeSingle::AddLearner(*id)))
            .collect();
        let cc = ConfChange {
            changes,
            leave_joint: crate::types::LeaveJoint::Auto,
            ..ConfChange::default()
        };
        let entry =
            Entry { term: Term(1), index: LogIndex(1), payload: EntryPayload::ConfChange(cc) };
        Persisted {
            hard_state: HardState { term: Term(1), vote: None, commit: LogIndex(1) },
            snapshot: Snapshot::default(),
            entries: vec![entry],
        }
    }
}

/// Outcome of a snapshot transfer, reported by the driver's transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapshotStatus {
    Finished,
    Failed,
}

/// One Raft node's consensus state: a pure state machine driven by its inputs.
///
/// Inputs: [`Raft::step`], [`Raft::tick`], [`Raft::propose`], [`Raft::propose_conf_change`],
/// [`Raft::read_index`], [`Raft::transfer_leader`], [`Raft::report_snapshot`],
/// [`Raft::report_unreachable`], [`Raft::compact`]. Output: [`Raft::ready`], whose documentation
/// says what the driver must do with it, followed by [`Raft::advance`].
#[derive(Debug)]
pub struct Raft {
    pub(crate) cfg: Config,
    pub(crate) id: NodeId,
    /// Invariant: never decreases.
    pub(crate) term: Term,
    /// Invariant: `Some(id)` while candidate or leader.
    pub(crate) vote: Option<NodeId>,
    pub(crate) role: Role,
    /// Invariant: `Some(id)` exactly when leader, among roles that know themselves.
    pub(crate) leader: Option<NodeId>,
    pub(crate) log: RaftLog,
    pub(crate) tracker: Tracker,
    pub(crate) rng: SplitMix64,
    /// Ticks since the last election timeout reset (followers: since hearing from a leader).
    pub(crate) election_elapsed: u32,
    pub(crate) heartbeat_elapsed: u32,
    /// Invariant: in `[election_timeout, 2 * election_timeout)`.
    pub(crate) randomized_election_timeout: u32,
    /// Ticks since this core was created; the leader lease is measured in them.
    pub(crate) ticks: u64,
    /// Set at start in lease mode: the node refuses votes for one election timeout, because it
    /// may have acknowledged a leader's heartbeat before it restarted, and that leader may hold a
    /// lease on the strength of it. ReadIndex does not rely on leases, so safe mode skips this.
    pub(crate) startup_quiet: bool,
    /// Invariant (leader): no membership change is proposed while this exceeds `applied`.
    pub(crate) pending_conf_index: LogIndex,
    /// Conf change entries up to here have been applied to `tracker`.
    pub(crate) conf_applied_index: LogIndex,
    /// The configurations that took effect after the latest snapshot, by the index of the entry
    /// that made them, so the log can be compacted at an index below `applied` with the
    /// configuration as of that index ([`Raft::compact_to`]).
    /// Invariant: indexes increase, lie above the snapshot index and at most at `applied`; the
    /// last one (if any) is `tracker.conf()`.
    pub(crate) conf_history: Vec<(LogIndex, ConfState)>,
    /// Invariant: `Some` only while leader; the node leadership is being handed to.
    pub(crate) lead_transferee: Option<NodeId>,
    /// A TimeoutNow was sent this term: a forced election may be under way, so the lease is off
    /// for the rest of the term.
    pub(crate) lease_forfeited: bool,
    pub(crate) reads: ReadOnly,
    /// A follower's reads waiting to be forwarded in one message.
    pub(crate) forward_reads: Vec<ReadCtx>,
    /// Entries appended since the last broadcast; `ready` sends them in one batch.
    /// Invariant: only a leader has a broadcast pending.
    pub(crate) needs_bcast: bool,
    pub(crate) msgs_now: Vec<Message>,
    pub(crate) msgs_after_persist: Vec<Message>,
    pub(crate) read_states: Vec<ReadState>,
    /// The hard state handed out in the last `Ready` (durable once it was advanced).
    pub(crate) last_hard_state: HardState,
    /// Invariant: `durable_term <= term`; the term on disk.
    pub(crate) durable_term: Term,
    pub(crate) last_soft: (Role, Option<NodeId>),
    pub(crate) pending_ready: Option<ReadyMark>,
    /// Set when a leader names a commit index beyond this log: entries this node acknowledged
    /// are gone (its data was rolled back). `(last index here, the leader's commit)`.
    pub(crate) lost_log: Option<(LogIndex, LogIndex)>,
}

impl Raft {
    /// Restores a node from what it persisted. A new cluster's members start from
    /// [`Persisted::bootstrap`].
    pub fn new(cfg: Config, persisted: Persisted) -> Result<Raft, ConfigError> {
        cfg.validate()?;
        let Persisted { hard_state, snapshot, entries } = persisted;
        let conf = snapshot.meta.conf_state.clone();
        let log = RaftLog::restore(snapshot, entries, hard_state.commit, cfg.async_storage_writes);
        let window = Window { max_msgs: cfg.max_inflight_msgs, max_bytes: cfg.max_inflight_bytes };
        let tracker = Tracker::new(conf, log.last_index().next(), window);
        let rng = SplitMix64::new(cfg.seed ^ cfg.id.0.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let conf_applied_index = log.snapshot().meta.index;
        let mut raft = Raft {
            id: cfg.id,
            term: hard_state.term,
            vote: hard_state.vote,
            role: Role::Follower,
            leader: None,
            log,
            tracker,
            rng,
            election_elapsed: 0,
            heartbeat_elapsed: 0,
            randomized_election_timeout: cfg.election_timeout_ticks,
            ticks: 0,
            startup_quiet: cfg.read_mode == ReadMode::Lease,
            pending_conf_index: LogIndex::ZERO,
            conf_applied_index,
            conf_history: Vec::new(),
            lead_transferee: None,
            lease_forfeited: false,
            reads: ReadOnly::default(),
            forward_reads: Vec::new(),
            needs_bcast: false,
            msgs_now: Vec::new(),
            msgs_after_persist: Vec::new(),
            read_states: Vec::new(),
            last_hard_state: hard_state,
            durable_term: hard_state.term,
            last_soft: (Role::Follower, None),
            pending_ready: None,
            lost_log: None,
            cfg,
        };
        raft.reset_randomized_election_timeout();
        raft.check_invariants_debug();
        Ok(raft)
    }

    // ---- Inputs ----

    /// Handles a message from another node.
    pub fn step(&mut self, msg: Message) {
        self.step_inner(msg);
        self.check_invariants_debug();
    }

    /// Advances logical time by one tick.
    pub fn tick(&mut self) {
        self.ticks += 1;
        match self.role {
            Role::Leader => self.tick_leader(),
            _ => self.tick_election(),
        }
        self.check_invariants_debug();
    }

    /// Starts an election now, as if the election timer had fired (with pre-vote if configured).
    pub fn campaign(&mut self) {
        self.hup(false);
        self.check_invariants_debug();
    }

    /// Proposes application data. On a follower it is forwarded to the leader; either way the
    /// driver learns the outcome only by seeing the entry committed (identify requests by their
    /// data). A dropped proposal was appended nowhere.
    pub fn propose(&mut self, data: Bytes) -> Result<(), ProposeError> {
        let result = self.propose_payloads(vec![EntryPayload::Normal(data)]);
        self.check_invariants_debug();
        result
    }

    /// Proposes many entries at once; they are appended (or forwarded) together.
    pub fn propose_batch(&mut self, batch: Vec<Bytes>) -> Result<(), ProposeError> {
        let result = self.propose_payloads(batch.into_iter().map(EntryPayload::Normal).collect());
        self.check_invariants_debug();
        result
    }

    /// Proposes a membership change. It takes effect on each node when applied; one change at a
    /// time (a joint configuration counts as one change until it is left).
    pub fn propose_conf_change(&mut self, cc: ConfChange) -> Result<(), ProposeError> {
        if self.role == Role::Leader {
            self.validate_conf_change(&cc)?;
        }
        let result = self.propose_payloads(vec![EntryPayload::ConfChange(cc)]);
        self.check_invariants_debug();
        result
    }

    /// Asks for a linearizable read point. The answer comes as a [`ReadState`] in a later `Ready`:
    /// the read is safe once the driver has applied its index.
    pub fn read_index(&mut self, ctx: ReadCtx) -> Result<(), ReadIndexError> {
        let result = match self.role {
            Role::Leader => {
                self.leader_read(ReadRequest { ctx, from: None });
                Ok(())
            }
            _ if self.leader.is_some() => {
                self.forward_reads.push(ctx);
                Ok(())
            }
            _ => Err(ReadIndexError::NoLeader),
        };
        self.check_invariants_debug();
        result
    }

    /// Asks the leader to hand leadership to `target` (thesis §3.10).
    pub fn transfer_leader(&mut self, target: NodeId) -> Result<(), TransferError> {
        if !self.tracker.is_voter(target) {
            return Err(TransferError::NotVoter(target));
        }
        let result = match (self.role, self.leader) {
            (Role::Leader, _) => {
                self.start_transfer(target);
                Ok(())
            }
            (_, Some(leader)) => {
                self.send(leader, Term(0), MessageBody::TransferLeader { target });
                Ok(())
            }
            (_, None) => Err(TransferError::NoLeader),
        };
        self.check_invariants_debug();
        result
    }

    /// The driver's transport reports how sending a snapshot to `to` ended.
    pub fn report_snapshot(&mut self, to: NodeId, status: SnapshotStatus) {
        if self.role == Role::Leader {
            self.on_snapshot_status(to, status);
        }
        self.check_invariants_debug();
    }

    /// The driver's transport could not reach `to`: stop streaming to it and probe instead.
    pub fn report_unreachable(&mut self, to: NodeId) {
        if self.role == Role::Leader {
            if let Some(pr) = self.tracker.progress_mut(to) {
                if pr.state() == &crate::progress::ProgressState::Replicate {
                    pr.become_probe();
                }
            }
        }
    }

    /// The driver has captured the application state at the applied index in `data`; the core
    /// drops the log up to there and sends this snapshot to followers that fall behind it.
    /// Returns the snapshot's metadata for the driver to persist, or `None` if nothing was applied
    /// since the last compaction (or a received snapshot is still being installed).
    pub fn compact(&mut self, data: Bytes) -> Option<SnapshotMeta> {
        self.compact_to(self.log.applied(), data)
    }

    /// Like [`Raft::compact`], at an applied `index` that may lie below the applied index: a
    /// driver whose state machine becomes durable in the background compacts up to what is
    /// durable, while applying goes on. The snapshot carries the configuration as of `index`.
    /// Returns `None` (and changes nothing) if `index` is not above the current compaction point
    /// or not yet applied, or while a received snapshot is being installed.
    pub fn compact_to(&mut self, index: LogIndex, data: Bytes) -> Option<SnapshotMeta> {
        if index > self.log.applied() || index <= self.log.snapshot().meta.index {
            return None;
        }
        let term = self.log.term(index)?;
        let conf_state = self.conf_state_at(index);
        let meta = SnapshotMeta { index, term, conf_state };
        let compacted = self.log.compact(Snapshot { meta: meta.clone(), data });
        if compacted {
            self.conf_history.retain(|(at, _)| *at > index);
        }
        self.check_invariants_debug();
        compacted.then_some(meta)
    }

    /// The configuration after applying `index`, for an index from the snapshot to `applied`.
    fn conf_state_at(&self, index: LogIndex) -> ConfState {
        self.conf_history
            .iter()
            .rev()
            .find(|(at, _)| *at <= index)
            .map_or_else(|| self.log.snapshot().meta.conf_state.clone(), |(_, cs)| cs.clone())
    }

    // ---- Queries ----

    pub fn id(&self) -> NodeId {
        self.id
    }

    pub fn term(&self) -> Term {
        self.term
    }

    /// `Some((last, commit))` once a leader told this node of a commit index (`commit`) beyond
    /// its last entry (`last`). A leader only names what the node acknowledged, so the node lost
    /// acknowledged entries (a data directory restored from an older copy, a disk that lied about
    /// a sync). The node then ignores heartbeats rather than commit entries the leader may never
    /// have had; its driver must stop it and say why (etcd panics with "tocommit(..) is out of
    /// range").
    pub fn lost_log(&self) -> Option<(LogIndex, LogIndex)> {
        self.lost_log
    }

    pub fn role(&self) -> Role {
        self.role
    }

    pub fn leader(&self) -> Option<NodeId> {
        self.leader
    }

    pub fn hard_state(&self) -> HardState {
        HardState { term: self.term, vote: self.vote, commit: self.log.committed() }
    }

    pub fn commit_index(&self) -> LogIndex {
        self.log.committed()
    }

    pub fn applied_index(&self) -> LogIndex {
        self.log.applied()
    }

    pub fn last_index(&self) -> LogIndex {
        self.log.last_index()
    }

    pub fn first_index(&self) -> LogIndex {
        self.log.first_index()
    }

    /// The term of the entry at `index`, if the log still holds it.
    pub fn term_at(&self, index: LogIndex) -> Option<Term> {
        self.log.term(index)
    }

    /// The entries the core holds (everything after the latest snapshot).
    pub fn log_entries(&self) -> &[Entry] {
        self.log.entries()
    }

    /// The latest snapshot's metadata (the compaction point).
    pub fn snapshot_meta(&self) -> &SnapshotMeta {
        &self.log.snapshot().meta
    }

    /// The bytes of the entries the log holds in memory (each entry's `size_bytes`).
    pub fn log_bytes(&self) -> u64 {
        self.log.bytes()
    }

    /// The configuration as of the applied index.
    pub fn conf_state(&self) -> &ConfState {
        self.tracker.conf()
    }

    /// The leader's view of `id`'s log; `None` on non-leaders and for non-members.
    pub fn progress(&self, id: NodeId) -> Option<&Progress> {
        (self.role == Role::Leader).then(|| self.tracker.progress(id)).flatten()
    }

    pub fn lead_transferee(&self) -> Option<NodeId> {
        self.lead_transferee
    }

    /// Read rounds waiting for a quorum of heartbeat echoes.
    pub fn pending_read_rounds(&self) -> usize {
        self.reads.pending_rounds()
    }

    // ---- Internals shared by the role modules ----

    pub(crate) fn step_inner(&mut self, msg: Message) {
        if msg.term == Term(0) {
            self.step_local(msg);
            return;
        }
        if msg.term > self.term {
            if !self.accept_higher_term(&msg) {
                return;
            }
        } else if msg.term < self.term {
            self.on_stale_term(&msg);
            return;
        }
        match msg.body {
            MessageBody::Vote { .. } => self.on_vote_request(msg),
            _ => match self.role {
                Role::Leader => self.step_leader(msg),
                Role::Candidate | Role::PreCandidate => self.step_candidate(msg),
                Role::Follower => self.step_follower(msg),
            },
        }
    }

    /// Messages without a term: forwarded proposals, reads and transfer requests, and read
    /// answers. They never change the receiver's term.
    fn step_local(&mut self, msg: Message) {
        match msg.body {
            MessageBody::Propose { payloads } => {
                if self.role == Role::Leader {
                    let payloads = payloads
                        .into_iter()
                        .filter(|p| match p {
                            EntryPayload::ConfChange(cc) => self.validate_conf_change(cc).is_ok(),
                            EntryPayload::Normal(_) => true,
                        })
                        .collect();
                    // A leader that cannot take the proposal drops it, as a follower would.
                    let _ = self.propose_payloads(payloads);
                } else if let Some(leader) = self.leader {
                    self.send(leader, Term(0), MessageBody::Propose { payloads });
                }
            }
            MessageBody::ReadIndex { ctxs } if self.role == Role::Leader => {
                for ctx in ctxs {
                    self.leader_read(ReadRequest { ctx, from: Some(msg.from) });
                }
            }
            MessageBody::ReadIndexResp { ctxs, index } => {
                for ctx in ctxs {
                    self.read_states.push(ReadState { index, ctx });
                }
            }
            MessageBody::TransferLeader { target }
                if self.role == Role::Leader && self.tracker.is_voter(target) =>
            {
                self.start_transfer(target);
            }
            _ => {}
        }
    }

    pub(crate) fn propose_payloads(
        &mut self,
        payloads: Vec<EntryPayload>,
    ) -> Result<(), ProposeError> {
        if payloads.is_empty() {
            return Ok(());
        }
        match self.role {
            Role::Leader => {
                if self.lead_transferee.is_some() {
                    return Err(ProposeError::LeaderTransferring);
                }
                self.append_payloads(payloads);
                Ok(())
            }
            _ => match self.leader {
                Some(leader) => {
                    self.send(leader, Term(0), MessageBody::Propose { payloads });
                    Ok(())
                }
                None => Err(ProposeError::NoLeader),
            },
        }
    }

    pub(crate) fn validate_conf_change(&self, cc: &ConfChange) -> Result<(), ProposeError> {
        if self.pending_conf_index > self.log.applied() {
            return Err(ProposeError::ConfChangePending);
        }
        apply_conf_change(self.tracker.conf(), cc).map_err(ProposeError::InvalidConfChange)?;
        Ok(())
    }

    /// Queues a message. Whether it may leave before this node's pending writes are durable is
    /// decided here, once, so the rule cannot be forgotten at a call site.
    pub(crate) fn send(&mut self, to: NodeId, term: Term, body: MessageBody) {
        let msg = Message { from: self.id, to, term, body };
        // A leader's replication traffic may go out before its own fsync (thesis §10.2.1): the
        // leader counts itself toward commit only once its entries are durable. Its term and vote
        // must be durable already, because followers act on the term.
        let early = self.role == Role::Leader
            && self.durable_term == self.term
            && matches!(
                msg.body,
                MessageBody::Append { .. }
                    | MessageBody::Heartbeat { .. }
                    | MessageBody::Snapshot { .. }
                    | MessageBody::ReadIndexResp { .. }
            );
        if early {
            self.msgs_now.push(msg);
        } else {
            self.msgs_after_persist.push(msg);
        }
    }

    pub(crate) fn reset_randomized_election_timeout(&mut self) {
        let base = u64::from(self.cfg.election_timeout_ticks);
        self.randomized_election_timeout = self.rng.in_range(base, 2 * base) as u32;
    }

    /// Resets per-term state when the term or role changes.
    pub(crate) fn reset(&mut self, term: Term) {
        if self.term != term {
            self.term = term;
            self.vote = None;
            self.lease_forfeited = false;
        }
        self.leader = None;
        self.election_elapsed = 0;
        self.heartbeat_elapsed = 0;
        self.reset_randomized_election_timeout();
        self.lead_transferee = None;
        self.tracker.reset_votes();
        self.tracker.reset_progress(self.log.last_index().next());
        self.reads = ReadOnly::default();
        // A pending broadcast belongs to the leadership that appended: a leader that steps down
        // before its next Ready must not keep asking for one (has_ready would stay true on an
        // empty Ready forever). A new leader sets it again when it appends its first entry.
        self.needs_bcast = false;
    }

    pub(crate) fn lease_ticks(&self) -> u64 {
        u64::from(self.cfg.election_timeout_ticks - self.cfg.lease_margin_ticks)
    }

    pub(crate) fn lease_enabled(&self) -> bool {
        self.cfg.read_mode == ReadMode::Lease && !self.lease_forfeited
    }

    pub(crate) fn check_invariants_debug(&self) {
        if cfg!(debug_assertions) {
            self.check_invariants();
        }
    }

    /// Asserts every documented invariant of the core. Runs after each input in debug builds;
    /// the simulator calls it after every step in any build.
    pub fn check_invariants(&self) {
        self.log.check_invariants();
        self.tracker.check_invariants();
        self.reads.check_invariants();
        assert!(self.durable_term <= self.term, "durable term ahead of term");
        let t = self.cfg.election_timeout_ticks;
        assert!(
            (t..2 * t).contains(&self.randomized_election_timeout),
            "randomized election timeout out of range"
        );
        match self.role {
            Role::Leader => {
                assert_eq!(self.leader, Some(self.id), "leader does not know itself");
                assert_eq!(self.vote, Some(self.id), "leader did not vote for itself");
            }
            Role::Candidate => {
                assert_eq!(self.vote, Some(self.id), "candidate did not vote for itself");
                assert_eq!(self.leader, None, "candidate knows a leader");
            }
            Role::PreCandidate => assert_eq!(self.leader, None, "pre-candidate knows a leader"),
            Role::Follower => assert_ne!(self.leader, Some(self.id), "follower leads itself"),
        }
        assert!(
            self.lead_transferee.is_none() || self.role == Role::Leader,
            "transfer outside leadership"
        );
        assert!(
            !self.needs_bcast || self.role == Role::Leader,
            "broadcast pending outside leadership"
        );
        let snap = self.log.snapshot().meta.index;
        let mut prev = snap;
        for (at, _) in &self.conf_history {
            assert!(*at > prev && *at <= self.log.applied(), "conf history out of order");
            prev = *at;
        }
        if let Some((_, last)) = self.conf_history.last() {
            assert_eq!(last, self.tracker.conf(), "conf history does not end at the configuration");
        }
    }
}
