//! The client history and its judge: is what the clients saw linearizable against etcd's KV
//! semantics (the executable model in `cairn_kv::model`)?
//!
//! The simulator sees the committed log itself, which makes the check exact instead of a
//! search. The log, as members apply it, is the only possible order of the writes: the model
//! replays it and must produce every result any member's store produced (so every member
//! computes the same revisions, with no gaps, and the same answers). Then, for each client:
//! - an acknowledged write is in the log exactly once, carrying the command the client sent, and
//!   its answer is the model's result at its index; a write answered as certainly failed is not
//!   in the log; an unknown one (timed out, member crashed, never answered) is there at most
//!   once; no request id is in the log twice, and none that no client sent;
//! - a read ran against a store that had executed the log up to some index (the simulator
//!   records which), and its answer is the model's at that point;
//! - real time is respected: give a write at index `j` the point `2j` and a read after index `e`
//!   the point `2e + 1`; if A finished before B began, A's point is below B's (two reads may
//!   share one). Writes whose outcome is unknown but that are in the log count as B.
//!
//! Together these say the history has a linearization: the log order of the writes, with each
//! read placed after the index it saw. (etcd's robustness tests check histories with a search
//! over possible orders, because a black-box client cannot see the log; seeing it, the order is
//! known and the check is linear apart from sorting.)
//!
//! **How the log is learned.** Members report entries as they apply them, and the first report
//! of an index defines the log there. It must be the next index after those already known: a
//! member applies in order, so whoever first applies index `i` has applied, and reported, every
//! index below it; a member that installed a snapshot at `s` resumes at `s + 1`, and the member
//! the snapshot came from had applied through `s`. So nothing is buffered: the model applies each
//! index when it is first learned, and every report, first or later, is compared at once with
//! the model's result there. An index beyond the next is reported as a violation (a gap).
//! Whether each member applies its own indexes in order is the Raft checker's business
//! (`Checker::check_applied`).
//!
//! **Entries no client sent.** Members propose for themselves: their attributes
//! (`PublishMember`), and, as leader, the revokes of expired leases and lease checkpoints. The
//! model applies them like any other entry. A revoke is a client's if that client sent exactly
//! that command under that request id and it is not in the log already; otherwise it is a
//! member's own (a member's own request ids may equal its clients', as in production, where the
//! replica tells them apart by the entry's bytes and so takes the first as the client's too;
//! such a revoke may then turn out to be a member's, if the client was told its own failed, so
//! a revoke taken for a client's is judged leniently: it may be in the log though its client
//! was told it failed, and it places that client's operation in real time only if the client
//! was told it was applied; for the lease checker, it counts as the client's).
//! The successful revokes a member made on its own are handed to the lease checker
//! (`leases.rs`), which judges when they happened.
//!
//! **Lease queries** (keepalive, TimeToLive) are answered by the leader from its store without
//! a log entry, so they are judged as reads: the simulator records the index the leader's store
//! had executed when it answered, the answer must be the model's for the lease there, and the
//! query takes the point `2e + 1` in the real-time check.

use std::collections::BTreeMap;
use std::fmt;

use cairn_kv::model::Model;
use cairn_kv::{Command, CommandResponse, KvError, LeaseId, RangeRequest, RangeResponse, Revision};

use crate::checker::Violation;

/// A client operation; for a write, also the Raft request id its log entry carries.
pub type OpId = u64;

/// What a client asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpKind {
    Write(Command),
    Read(RangeRequest),
    KeepAlive(LeaseId),
    TimeToLive(LeaseId),
}

/// A lease granted or revoked, reported when the log is first known to hold it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseChange {
    Granted {
        id: LeaseId,
        ttl: i64,
    },
    /// `ttl` is the lease's (`None`: it did not exist); `own` if a member revoked it on its
    /// own, because it expired.
    Revoked {
        id: LeaseId,
        ttl: Option<i64>,
        own: bool,
    },
}

/// What the leader answered a lease query with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseAnswer {
    /// A keepalive renewed the lease for this many seconds.
    Renewed { ttl: i64 },
    /// TimeToLive: the granted TTL and the seconds left (0 and -1 for a lease that is not).
    Ttl { granted: i64, remaining: i64 },
}

/// What a client was told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The write was applied, with this result (an error here is etcd's apply-time refusal,
    /// such as `KeyNotFound` for `ignore_value` on a missing key).
    Write(Result<CommandResponse, KvError>),
    /// The read ran after its member's store had executed the log up to `at_index`.
    Read { result: Result<RangeResponse, KvError>, at_index: u64 },
    /// A lease query was asked of a store that had executed the log up to `at_index`, and
    /// answered when it had executed it up to `answered_index`.
    Lease { result: Result<LeaseAnswer, KvError>, at_index: u64, answered_index: u64 },
    /// Certainly not applied: refused before it was proposed, or its entry was replaced.
    Failed,
    /// Unknown: timed out, or the member crashed.
    Unknown,
}

#[derive(Debug)]
struct Op {
    kind: OpKind,
    invoked: u64,
    completed: Option<(u64, Outcome)>,
}

impl Op {
    fn noun(&self) -> &'static str {
        match self.kind {
            OpKind::Write(_) => "write",
            OpKind::Read(_) => "read",
            OpKind::KeepAlive(_) => "keepalive",
            OpKind::TimeToLive(_) => "time-to-live",
        }
    }

    /// Whether `outcome` is an answer this kind of operation can get.
    fn fits(&self, outcome: &Outcome) -> bool {
        matches!(
            (&self.kind, outcome),
            (_, Outcome::Failed | Outcome::Unknown)
                | (OpKind::Write(_), Outcome::Write(_))
                | (OpKind::Read(_), Outcome::Read { .. })
                | (OpKind::KeepAlive(_) | OpKind::TimeToLive(_), Outcome::Lease { .. })
        )
    }
}

/// One index of the log as the model applied it.
#[derive(Debug)]
struct LogEntry {
    /// The operation that proposed it and its command; `None` for an entry without one.
    request: Option<(OpId, Command)>,
    /// Proposed by a member for itself, not by a client.
    own: bool,
    /// A revoke taken for a client's that a member may have proposed for itself under the
    /// same request id (see the module's comment): the client may have been told it failed.
    maybe_own: bool,
    /// The model's result for it; `None` without a command.
    result: Option<Result<CommandResponse, KvError>>,
    /// The model's current and compacted revisions after it, for reads that ran here.
    current: Revision,
    compacted: Revision,
}

/// What a history check covered, so a green run shows it checked something.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HistoryStats {
    /// Writes answered as applied (with a result or an apply-time error).
    pub writes_acked: u64,
    pub writes_failed: u64,
    /// Writes never answered for sure; `unknown_applied` of them are in the log.
    pub writes_unknown: u64,
    pub unknown_applied: u64,
    pub reads_checked: u64,
    /// Reads that got no answer (their member crashed, or they timed out).
    pub reads_unanswered: u64,
    pub log_entries: u64,
    /// Entries in which a member published its attributes.
    pub publishes: u64,
    /// Member executions compared with the model.
    pub executions_checked: u64,
    /// Leases granted, and revoked by members on their own (expired) or by clients.
    pub lease_grants: u64,
    pub lease_expiries: u64,
    pub lease_revokes: u64,
    /// Entries recording leases' remaining TTLs.
    pub lease_checkpoints: u64,
    /// Keepalives and TimeToLives answered, judged against the model.
    pub lease_queries_checked: u64,
}

impl HistoryStats {
    pub fn add(&mut self, o: &HistoryStats) {
        self.writes_acked += o.writes_acked;
        self.writes_failed += o.writes_failed;
        self.writes_unknown += o.writes_unknown;
        self.unknown_applied += o.unknown_applied;
        self.reads_checked += o.reads_checked;
        self.reads_unanswered += o.reads_unanswered;
        self.log_entries += o.log_entries;
        self.publishes += o.publishes;
        self.executions_checked += o.executions_checked;
        self.lease_grants += o.lease_grants;
        self.lease_expiries += o.lease_expiries;
        self.lease_revokes += o.lease_revokes;
        self.lease_checkpoints += o.lease_checkpoints;
        self.lease_queries_checked += o.lease_queries_checked;
    }
}

impl fmt::Display for HistoryStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
"{} writes acknowledged, {} certainly failed, {} unknown ({} of them applied); {} reads checked, {} unanswered; {} log entries ({} publishing attributes), {} executions compared with the model; leases: {} granted, {} expired, {} revoked by clients, {} checkpoint entries, {} keepalives and TTLs checked",
            self.writes_acked,
            self.writes_failed,
            self.writes_unknown,
            self.unknown_applied,
            self.reads_checked,
            self.reads_unanswered,
            self.log_entries,
            self.publishes,
            self.executions_checked,
            self.lease_grants,
            self.lease_expiries,
            self.lease_revokes,
            self.lease_checkpoints,
            self.lease_queries_checked
        )
    }
}

/// The recorded history and the log, with the model replaying the log as it is learned.
///
/// Invariant: `log[i]` is index `i + 1`, and `model` has applied exactly `log`.
/// Invariant: `position` maps every client's request id in `log` to its index, and each appears
/// once. A member's own entries (its attributes, lease expiries and checkpoints) are in `log`
/// but not in `position`: no client sent them, and their ids come from the member's own counter.
#[derive(Debug, Default)]
pub struct History {
    /// Ordered by id, so a failing seed names the same violation on every replay.
    ops: BTreeMap<OpId, Op>,
    log: Vec<LogEntry>,
    position: BTreeMap<OpId, u64>,
    model: Model,
    executions_checked: u64,
    /// Each lease's TTL from each index at which it was granted or revoked (`None`: gone), so
    /// a lease query can be judged at any index.
    leases: BTreeMap<LeaseId, Vec<(u64, Option<i64>)>>,
    /// Successful grants and revokes learned and not yet taken.
    lease_changes: Vec<LeaseChange>,
    /// The time of the last invocation or answer: times must increase.
    last_at: u64,
    /// The first misuse of `invoke`/`complete` (an id reused, a time going back); `check`
    /// reports it, since the real-time check would be meaningless.
    misuse: Option<String>,
}

macro_rules! violation {
    ($($arg:tt)*) => { return Err(Violation(format!($($arg)*))) };
}

impl History {
    /// Client `op` asked `kind` at time `at`.
    pub fn invoke(&mut self, op: OpId, kind: OpKind, at: u64) {
        self.note_time(op, at);
        if self.ops.contains_key(&op) {
            self.note_misuse(format!("operation {op} invoked twice (again at t={at})"));
            return;
        }
        self.ops.insert(op, Op { kind, invoked: at, completed: None });
    }

    /// Client `op` was told `outcome` at time `at`. An operation never completed is unknown.
    pub fn complete(&mut self, op: OpId, outcome: Outcome, at: u64) {
        self.note_time(op, at);
        let Some(o) = self.ops.get_mut(&op) else {
            self.note_misuse(format!("operation {op} answered at t={at} but never invoked"));
            return;
        };
        let mismatched = !o.fits(&outcome);
        let problem = if o.completed.is_some() {
            format!("operation {op} answered twice (again at t={at})")
        } else if mismatched {
            format!("{} {op} answered with {outcome:?}", o.noun())
        } else {
            o.completed = Some((at, outcome));
            return;
        };
        self.note_misuse(problem);
    }

    fn note_time(&mut self, op: OpId, at: u64) {
        if at <= self.last_at {
            let last = self.last_at;
            self.note_misuse(format!("operation {op} recorded at t={at}, not after t={last}"));
        }
        self.last_at = self.last_at.max(at);
    }

    fn note_misuse(&mut self, what: String) {
        self.misuse.get_or_insert(what);
    }

    pub fn is_complete(&self, op: OpId) -> bool {
        self.ops.get(&op).is_some_and(|o| o.completed.is_some())
    }

    /// The index of a write that was acknowledged (applied, whatever its result).
    pub fn acked_index(&self, op: OpId) -> Option<u64> {
        match self.ops.get(&op)?.completed {
            Some((_, Outcome::Write(_))) => self.position.get(&op).copied(),
            _ => None,
        }
    }

    /// How far the log is known: the highest index any member has applied.
    pub fn log_len(&self) -> u64 {
        self.log.len() as u64
    }

    /// What a read gives after the log up to `at_index` was applied.
    pub fn expected_range(
        &self,
        req: &RangeRequest,
        at_index: u64,
    ) -> Result<RangeResponse, KvError> {
        let (current, compacted) = self.state_after(at_index);
        self.model.range_as_of(req, current, compacted)
    }

    fn state_after(&self, index: u64) -> (Revision, Revision) {
        match index.checked_sub(1).and_then(|i| self.log.get(i as usize)) {
            Some(a) => (a.current, a.compacted),
            None => (Revision::INITIAL, Revision::NEVER_COMPACTED),
        }
    }

    /// `member` applied log entry `index`, carrying `entry` (`None` for an entry without a
    /// command), and its store produced `outcome` (`None` without a command, or when the store
    /// already held the entry). Checks state-machine safety and the result against the model.
    pub fn applied(
        &mut self,
        member: u64,
        index: u64,
        entry: Option<(OpId, Command)>,
        outcome: Option<Result<CommandResponse, KvError>>,
    ) -> Result<(), Violation> {
        let known = self.log_len();
        if index == 0 || index > known + 1 {
            violation!(
                "member {member} applied index {index}, but the log is known only through {known}: a gap"
            );
        }
        if index == known + 1 {
            self.learn(member, index, entry)?;
        } else {
            let first = &self.log[(index - 1) as usize].request;
            if *first != entry {
                violation!(
                    "state-machine safety: member {member} applied {} at index {index}, but {} was applied there first",
                    describe(&entry),
                    describe(first)
                );
            }
        }
        let Some(got) = outcome else { return Ok(()) };
        self.executions_checked += 1;
        let at = &self.log[(index - 1) as usize];
        let Some(want) = &at.result else {
            violation!(
                "member {member} executed index {index} to {got:?}, but that entry carries no command"
            );
        };
        if *want != got {
            violation!(
                "member {member} executed index {index} ({}) to {got:?}, but the model gives {want:?}",
                describe(&at.request)
            );
        }
        Ok(())
    }

    /// The first sighting of `index`: append it and let the model apply it.
    fn learn(
        &mut self,
        member: u64,
        index: u64,
        entry: Option<(OpId, Command)>,
    ) -> Result<(), Violation> {
        let mut result = None;
        let own = entry.as_ref().is_some_and(|(op, cmd)| self.is_own(*op, cmd));
        if let Some((op, cmd)) = &entry {
            if !own {
                if let Some(&earlier) = self.position.get(op) {
                    violation!(
                        "request {op} is in the log twice: at index {earlier} and at index {index} (applied by member {member})"
                    );
                }
                self.position.insert(*op, index);
            }
            let applied = self.model.apply_at(index, cmd);
            self.note_leases(index, cmd, &applied, own);
            result = Some(applied);
        }
        let (current, compacted) = (self.model.current(), self.model.compacted());
        let maybe_own = !own && matches!(&entry, Some((_, Command::LeaseRevoke { .. })));
        self.log.push(LogEntry { request: entry, own, maybe_own, result, current, compacted });
        Ok(())
    }

    fn maybe_own(&self, index: u64) -> bool {
        index.checked_sub(1).and_then(|i| self.log.get(i as usize)).is_some_and(|e| e.maybe_own)
    }

    /// Whether a member proposed `cmd` under `op` for itself (see the module's comment).
    fn is_own(&self, op: OpId, cmd: &Command) -> bool {
        match cmd {
            Command::PublishMember { .. }
            | Command::Membership { .. }
            | Command::LeaseExpire { .. }
            | Command::LeaseCheckpoint { .. }
            | Command::LeaseGrantCheckpoint { .. } => true,
            Command::LeaseRevoke { .. } => {
                let sent = matches!(self.ops.get(&op), Some(Op { kind: OpKind::Write(c), .. }) if c == cmd);
                !sent || self.position.contains_key(&op)
            }
            _ => false,
        }
    }

    /// Follows the leases a learned entry granted or revoked.
    fn note_leases(
        &mut self,
        index: u64,
        cmd: &Command,
        result: &Result<CommandResponse, KvError>,
        own: bool,
    ) {
        match (cmd, result) {
            (_, Ok(CommandResponse::LeaseGrant { lease, .. })) => {
                self.leases.entry(lease.id).or_default().push((index, Some(lease.ttl)));
                self.lease_changes.push(LeaseChange::Granted { id: lease.id, ttl: lease.ttl });
            }
            (Command::LeaseRevoke { id } | Command::LeaseExpire { id, .. }, Ok(_)) => {
                let ttl = self.lease_at(*id, index - 1);
                self.leases.entry(*id).or_default().push((index, None));
                self.lease_changes.push(LeaseChange::Revoked { id: *id, ttl, own });
            }
            _ => {}
        }
    }

    /// The successful grants and revokes learned since the last call, in log order.
    pub fn take_lease_changes(&mut self) -> Vec<LeaseChange> {
        std::mem::take(&mut self.lease_changes)
    }

    /// A lease's TTL after the log up to `index` was applied; `None` if it did not exist.
    pub fn lease_at(&self, id: LeaseId, index: u64) -> Option<i64> {
        let changes = self.leases.get(&id)?;
        let k = changes.partition_point(|(i, _)| *i <= index);
        k.checked_sub(1).and_then(|k| changes[k].1)
    }

    /// The leases that exist after the whole known log, in id order.
    pub fn live_leases(&self) -> Vec<LeaseId> {
        let end = self.log_len();
        self.leases.keys().copied().filter(|id| self.lease_at(*id, end).is_some()).collect()
    }

    /// The model's leases after the whole known log, for comparing with a store's.
    pub fn model_leases(&self) -> Vec<cairn_kv::Lease> {
        self.model.leases().values().copied().collect()
    }

    /// The live keys the model attaches to `id` after the whole known log.
    pub fn model_lease_keys(&self, id: LeaseId) -> Vec<bytes::Bytes> {
        self.model.lease_keys(id)
    }

    /// Judges the whole history, at the end of a run.
    pub fn check(&self) -> Result<HistoryStats, Violation> {
        if let Some(what) = &self.misuse {
            violation!("history misrecorded: {what}");
        }
        self.check_log_requests()?;
        let mut stats = self.log_stats();
        for (&id, op) in &self.ops {
            self.check_op(id, op, &mut stats)?;
        }
        self.check_real_time()?;
        Ok(stats)
    }

    /// What the log holds, counted.
    fn log_stats(&self) -> HistoryStats {
        let mut stats = HistoryStats {
            log_entries: self.log_len(),
            executions_checked: self.executions_checked,
            ..HistoryStats::default()
        };
        for e in &self.log {
            let ok = matches!(e.result, Some(Ok(_)));
            match &e.request {
                Some((_, Command::PublishMember { .. })) => stats.publishes += 1,
                Some((
                    _,
                    Command::LeaseCheckpoint { .. } | Command::LeaseGrantCheckpoint { .. },
                )) => stats.lease_checkpoints += 1,
                Some((_, Command::LeaseGrant { .. })) if ok => stats.lease_grants += 1,
                Some((_, Command::LeaseRevoke { .. } | Command::LeaseExpire { .. }))
                    if ok && e.own =>
                {
                    stats.lease_expiries += 1
                }
                Some((_, Command::LeaseRevoke { .. })) if ok => stats.lease_revokes += 1,
                _ => {}
            }
        }
        stats
    }

    /// Every request in the log is a write some client sent, with the command it sent.
    fn check_log_requests(&self) -> Result<(), Violation> {
        for (i, entry) in self.log.iter().enumerate() {
            let Some((op, cmd)) = &entry.request else { continue };
            if entry.own {
                continue;
            }
            let index = i + 1;
            match self.ops.get(op).map(|o| &o.kind) {
                None => violation!("index {index} carries request {op}, which no client sent"),
                Some(OpKind::Read(_) | OpKind::KeepAlive(_) | OpKind::TimeToLive(_)) => {
                    violation!("index {index} carries request {op}, which is no write")
                }
                Some(OpKind::Write(sent)) if sent != cmd => violation!(
                    "index {index} carries request {op} as {cmd:?}, but the client sent {sent:?}"
                ),
                Some(OpKind::Write(_)) => {}
            }
        }
        Ok(())
    }

    fn check_op(&self, id: OpId, op: &Op, stats: &mut HistoryStats) -> Result<(), Violation> {
        match (&op.kind, op.completed.as_ref().map(|c| &c.1)) {
            (OpKind::Write(_), Some(Outcome::Write(got))) => {
                self.check_acked_write(id, got)?;
                stats.writes_acked += 1;
            }
            (OpKind::Write(_), Some(Outcome::Failed)) => {
                if let Some(index) = self.position.get(&id).filter(|i| !self.maybe_own(**i)) {
                    violation!(
                        "write {id} was answered as failed, but it is in the log at index {index}"
                    );
                }
                stats.writes_failed += 1;
            }
            (OpKind::Write(_), _) => {
                stats.writes_unknown += 1;
                stats.unknown_applied += u64::from(self.position.contains_key(&id));
            }
            (OpKind::Read(req), Some(Outcome::Read { result, at_index })) => {
                self.check_read(id, req, result, *at_index)?;
                stats.reads_checked += 1;
            }
            (OpKind::Read(_), _) => stats.reads_unanswered += 1,
            (
                OpKind::KeepAlive(lease) | OpKind::TimeToLive(lease),
                Some(Outcome::Lease { result, at_index, answered_index }),
            ) => {
                self.check_lease_query(id, *lease, op, result, (*at_index, *answered_index))?;
                stats.lease_queries_checked += 1;
            }
            (OpKind::KeepAlive(_) | OpKind::TimeToLive(_), _) => {}
        }
        Ok(())
    }

    /// A keepalive or TimeToLive answered as the model has the lease at some index its store
    /// had executed while the query waited (see `lease_point`).
    fn check_lease_query(
        &self,
        id: OpId,
        lease: LeaseId,
        op: &Op,
        got: &Result<LeaseAnswer, KvError>,
        (from, to): (u64, u64),
    ) -> Result<(), Violation> {
        if to > self.log_len() || from > to {
            violation!(
                "{} {id} ran after indexes {from} to {to}, but the log is known only through {}",
                op.noun(),
                self.log_len()
            );
        }
        if self.lease_point(lease, &op.kind, got, (from, to)).is_none() {
            let ttl = self.lease_at(lease, to);
            violation!(
                "{} {id} of lease {} after index {from} (answered after {to}) was answered {got:?}, but the model has the lease {} there",
                op.noun(),
                lease.0,
                ttl.map_or("nonexistent".to_string(), |t| format!("with TTL {t}"))
            );
        }
        Ok(())
    }

    /// The last index from `from` to `to` after which the model's lease matches the answer.
    /// A query is answered from the store as executed when it is asked, or, for a keepalive
    /// of an expired lease, when its revoke is applied; the simulator knows the store's index
    /// when it asked and when it heard back. Taking the last index that fits is the most
    /// lenient placement for operations that began before the answer, and costs nothing for
    /// those that begin after it, which a correct cluster places at or after `to`.
    fn lease_point(
        &self,
        lease: LeaseId,
        kind: &OpKind,
        got: &Result<LeaseAnswer, KvError>,
        (from, to): (u64, u64),
    ) -> Option<u64> {
        let fits = |ttl: Option<i64>| match (kind, got, ttl) {
            (OpKind::KeepAlive(_), Ok(LeaseAnswer::Renewed { ttl: t }), Some(want)) => *t == want,
            (OpKind::KeepAlive(_), Err(KvError::LeaseNotFound), None) => true,
            (OpKind::TimeToLive(_), Ok(LeaseAnswer::Ttl { granted, remaining }), Some(want)) => {
                *granted == want && *remaining >= 0
            }
            (OpKind::TimeToLive(_), Ok(LeaseAnswer::Ttl { granted: 0, remaining: -1 }), None) => {
                true
            }
            _ => false,
        };
        // The lease is the same from one change to the next: try `to`, and the index before
        // each change in between.
        let changes = self.leases.get(&lease).map_or(&[][..], |c| &c[..]);
        let before_changes = changes.iter().rev().map(|(i, _)| i.saturating_sub(1));
        std::iter::once(to)
            .chain(before_changes)
            .filter(|e| (from..=to).contains(e))
            .find(|e| fits(self.lease_at(lease, *e)))
    }

    fn check_acked_write(
        &self,
        id: OpId,
        got: &Result<CommandResponse, KvError>,
    ) -> Result<(), Violation> {
        let Some(&index) = self.position.get(&id) else {
            violation!("acknowledged write {id} is not in the log: lost (answered {got:?})");
        };
        let want = &self.log[(index - 1) as usize].result;
        if want.as_ref() != Some(got) {
            violation!(
                "write {id} at index {index} was answered {got:?}, but the model gives {want:?}"
            );
        }
        Ok(())
    }

    fn check_read(
        &self,
        id: OpId,
        req: &RangeRequest,
        got: &Result<RangeResponse, KvError>,
        at_index: u64,
    ) -> Result<(), Violation> {
        if at_index > self.log_len() {
            violation!(
                "read {id} ran after index {at_index}, but the log is known only through {}",
                self.log_len()
            );
        }
        let want = self.expected_range(req, at_index);
        if &want != got {
            violation!(
                "read {id} of {req:?} after index {at_index} was answered {got:?}, but the model gives {want:?}"
            );
        }
        Ok(())
    }

    /// Where the log places an operation, if anywhere: a write at index `j` at `2j`, a read
    /// that saw the log through `e` at `2e + 1`.
    fn point(&self, id: OpId, op: &Op) -> Option<u64> {
        match (&op.kind, &op.completed) {
            (_, Some((_, Outcome::Read { at_index, .. }))) => {
                Some(at_index.saturating_mul(2).saturating_add(1))
            }
            (
                OpKind::KeepAlive(lease) | OpKind::TimeToLive(lease),
                Some((_, Outcome::Lease { result, at_index, answered_index })),
            ) => {
                let window = (*at_index, *answered_index);
                let e = self.lease_point(*lease, &op.kind, result, window).unwrap_or(*at_index);
                Some(e.saturating_mul(2).saturating_add(1))
            }
            // A revoke a member may have made for itself places a client's write only if the
            // client was told it was applied.
            (OpKind::Write(_), Some((_, Outcome::Write(_)))) => {
                self.position.get(&id).map(|i| 2 * i)
            }
            (OpKind::Write(_), _) => {
                self.position.get(&id).filter(|i| !self.maybe_own(**i)).map(|i| 2 * i)
            }
            _ => None,
        }
    }

    /// If A finished before B began, A's point is below B's (two reads may share one). Sorted
    /// by finish time, the operations finished before B began are a prefix, so B is compared
    /// with the highest point in that prefix: O(n log n) in all.
    fn check_real_time(&self) -> Result<(), Violation> {
        // (finished, point, id) of every operation that was answered and has a point.
        let mut answered: Vec<(u64, u64, OpId)> = self
            .ops
            .iter()
            .filter_map(|(&id, op)| match &op.completed {
                Some((at, Outcome::Write(_) | Outcome::Read { .. } | Outcome::Lease { .. })) => {
                    Some((*at, self.point(id, op)?, id))
                }
                _ => None,
            })
            .collect();
        answered.sort_unstable();
        // highest[k]: the highest (point, id) among the first k + 1 to finish.
        let highest: Vec<(u64, OpId)> = answered
            .iter()
            .scan((0, 0), |best, &(_, p, id)| {
                if p >= best.0 {
                    *best = (p, id);
                }
                Some(*best)
            })
            .collect();
        for (&b, op) in &self.ops {
            let Some(point) = self.point(b, op) else { continue };
            let finished_before = answered.partition_point(|x| x.0 < op.invoked);
            let Some(&(p, a)) = finished_before.checked_sub(1).map(|k| &highest[k]) else {
                continue;
            };
            let read_after_read = !point.is_multiple_of(2) && p == point;
            if p >= point && !read_after_read {
                return Err(self.real_time_violation(a, p, b, point));
            }
        }
        Ok(())
    }

    fn real_time_violation(&self, a: OpId, a_point: u64, b: OpId, b_point: u64) -> Violation {
        let (op_a, op_b) = (&self.ops[&a], &self.ops[&b]);
        let finished = op_a.completed.as_ref().map_or(0, |c| c.0);
        Violation(format!(
            "real-time order: {} {a} finished at t={finished} before {} {b} began at t={}, but the log places {b} {} and {a} {}",
            op_a.noun(),
            op_b.noun(),
            op_b.invoked,
            place(b_point),
            place(a_point),
        ))
    }
}

/// A point in words.
fn place(point: u64) -> String {
    if point.is_multiple_of(2) {
        format!("at index {}", point / 2)
    } else {
        format!("after index {}", point / 2)
    }
}

fn describe(entry: &Option<(OpId, Command)>) -> String {
    match entry {
        Some((op, cmd)) => format!("request {op} ({cmd:?})"),
        None => "an entry without a command".to_string(),
    }
}
