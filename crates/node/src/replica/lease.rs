//! The leader's lease clock (etcd's lessor): when each lease expires, keepalives, remaining
//! TTLs, and the revokes and checkpoints it proposes.
//!
//! Which leases exist, their TTLs and the keys they hold are replicated state (the store's).
//! When one expires is decided by the leader alone, on its ticks, and carried out as a
//! `LeaseExpire` through Raft (a revoke of the grant it found expired, named by the grant's
//! log index), so a member that is not leader never revokes, and a revoke is applied
//! everywhere at the same point of the log. Followers keep no clock for leases.
//!
//! Taking over leadership must not cost O(leases) at once (etcd issue 9496): a new leader
//! schedules the leases it inherits a page per tick, each at `promotion + grace + remaining`
//! (grace: an election timeout, as etcd's). A lease not yet scheduled cannot expire before it
//! is, since its expiry is at least `grace` after the promotion and paging finishes within
//! `grace` ticks for up to `PROMOTE_PAGE × grace` leases (200,000 with the defaults); beyond
//! that, later pages may expire late, never early. A page of 20,000 costs about 3 ms of the
//! driver's tick (measured: 0.9 ms per 10,000, 14 ms per 100,000), so a million leases cost 50
//! ticks of 3 ms rather than one stall of 150 ms. Expired leases are revoked at most at the
//! configured rate (etcd's 1,000 a second by default), so a revoke storm never starves writes.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::Arc;

use cairn_kv::backend::Backend;
use cairn_kv::{Command, GrantCheckpoint, Lease, LeaseId};
use cairn_storage::fs::Dir;

use super::{Read, ReadFor, Replica, Reply};
use crate::config::Bug;
use crate::error::EngineError;
use crate::lease_clock::{span_ticks, ClockState, LeaseClock};

/// Leases a new leader schedules per tick.
const PROMOTE_PAGE: usize = 20_000;
/// etcd's `maxLeaseCheckpointBatchSize`.
const CHECKPOINT_BATCH: usize = 1000;
/// Ticks before a revoke that was proposed and not applied is proposed again.
const REVOKE_RETRY_TICKS: u64 = 50;

/// The leader's clock for leases. Empty on a member that does not lead.
#[derive(Debug)]
pub(super) struct Lessor {
    tick_micros: u64,
    /// Leadership and expiries, shared with the engine's callers, who renew leases there.
    clock: Arc<LeaseClock>,
    /// Leases by the time they are next looked at: at most one entry per lease, at or before
    /// its expiry (a keepalive only moves the expiry later; the entry, once due, is put back
    /// at the new expiry), so keepalives never grow the queue.
    queue: BinaryHeap<Reverse<(u64, LeaseId)>>,
    /// The time of each lease's entry in `queue`.
    queued: HashMap<LeaseId, u64>,
    /// Leases from this id on are not scheduled yet; they expire at the tick given plus their
    /// remaining TTL.
    promoting: Option<(LeaseId, u64)>,
    /// When each long lease's remaining TTL is next recorded, with the index of the grant it
    /// was scheduled for ([`Lease::grant_index`]).
    checkpoints: BinaryHeap<Reverse<(u64, LeaseId, u64)>>,
    /// Revokes allowed per tick.
    revoke_budget: usize,
}

impl Lessor {
    /// A clock of `tick_micros` per tick, revoking at most `revokes_per_second`.
    pub(super) fn new(tick_micros: u64, revokes_per_second: u64) -> Lessor {
        let tick_micros = tick_micros.max(1);
        let per_tick = revokes_per_second.saturating_mul(tick_micros).div_ceil(1_000_000).max(1);
        Lessor {
            tick_micros,
            clock: Arc::new(LeaseClock::new(tick_micros)),
            queue: BinaryHeap::new(),
            queued: HashMap::new(),
            promoting: None,
            checkpoints: BinaryHeap::new(),
            revoke_budget: usize::try_from(per_tick).unwrap_or(usize::MAX),
        }
    }

    fn ticks(&self, seconds: i64) -> u64 {
        span_ticks(seconds, self.tick_micros)
    }

    /// Whole seconds in `ticks`, rounded down (etcd reports remaining TTLs so).
    fn seconds(&self, ticks: u64) -> i64 {
        i64::try_from(ticks.saturating_mul(self.tick_micros) / 1_000_000).unwrap_or(i64::MAX)
    }

    fn schedule(&mut self, s: &mut ClockState, id: LeaseId, at: u64) {
        s.expiry.insert(id, at);
        // An entry at or before `at` will find the new expiry when it comes due.
        if self.queued.get(&id).is_none_or(|q| *q > at) {
            self.queued.insert(id, at);
            self.queue.push(Reverse((at, id)));
        }
    }

    /// When a lease expires: scheduled, or (while promoting) when it will be.
    fn expires(&self, s: &ClockState, lease: &Lease) -> Option<u64> {
        if let Some(at) = s.expiry.get(&lease.id) {
            return Some(*at);
        }
        let (cursor, base) = self.promoting?;
        (lease.id >= cursor).then(|| base + self.ticks(remaining(lease)))
    }
}

/// A keepalive waiting for the log ([`Replica::handle_lease_renew`]).
#[derive(Debug)]
pub(super) struct Renewal<T> {
    id: LeaseId,
    /// The grant it renews ([`Lease::grant_index`]): its clear names it.
    grant_index: u64,
    token: T,
    /// The tick at which it is answered with a timeout.
    deadline: u64,
    wait: Wait,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wait {
    /// The lease expired: its revoke.
    Revoke,
    /// The lease's checkpoint is being cleared.
    Clear,
}

/// A keepalive or TimeToLive waiting for the round that confirms the leadership for it
/// ([`Replica::handle_lease_renew`]).
#[derive(Debug)]
pub(super) struct LeaseAsk<T> {
    round: u64,
    query: LeaseQuery,
    token: T,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LeaseQuery {
    Renew(LeaseId),
    Ttl(LeaseId),
}

/// What a new leader counts down from: the last checkpoint, or the full TTL.
fn remaining(lease: &Lease) -> i64 {
    if lease.remaining_ttl > 0 {
        lease.remaining_ttl
    } else {
        lease.ttl
    }
}

impl<D: Dir, B: Backend, T> Replica<D, B, T> {
    /// The clock the engine's callers renew leases on.
    pub(crate) fn lease_clock(&self) -> Arc<LeaseClock> {
        self.lessor.clock.clone()
    }

    /// Ticks of logical time so far.
    pub(crate) fn ticks(&self) -> u64 {
        self.ticks
    }

    /// This member became leader: its clock starts; what it inherits is scheduled a page per
    /// tick, after a grace period.
    pub(super) fn lessor_promote(&mut self) {
        let grace = u64::from(self.cfg.raft.election_timeout_ticks);
        let mut s = self.lessor.clock.lock();
        s.primary = true;
        s.ready_at = self.raft.last_index().0;
        drop(s);
        self.lessor.promoting = Some((LeaseId(i64::MIN), self.ticks + grace));
    }

    /// This member no longer leads: it forgets its clock (the next leader keeps its own), and
    /// keepalives waiting for a revoke or a clear it proposed are sent to the next leader.
    pub(super) fn lessor_demote(&mut self) {
        let clock = self.lessor.clock.clone();
        self.lessor = Lessor::new(self.cfg.tick_micros, self.cfg.lease_revoke_rate);
        // The callers renewing on the clock learn it there and come to the driver.
        clock.demote();
        self.lessor.clock = clock;
        for r in self.renewals.drain(..) {
            self.work.answers.push((r.token, Err(EngineError::NotLeader)));
        }
    }

    /// Applied here: a lease was granted. The leader starts its clock.
    pub(super) fn lessor_granted(&mut self, lease: Lease) {
        let clock = self.lessor.clock.clone();
        let mut s = clock.lock();
        if s.primary {
            let at = self.ticks + self.lease_ticks(lease.ttl);
            self.lessor.schedule(&mut s, lease.id, at);
            drop(s);
            self.schedule_checkpoint(&lease);
        }
    }

    /// Ticks a lease of `ttl` seconds runs from now.
    fn lease_ticks(&self, ttl: i64) -> u64 {
        let ticks = self.lessor.ticks(ttl);
        if self.cfg.has_bug(Bug::LeaseExpiresEarly) {
            return ticks / 2;
        }
        ticks
    }

    /// Applied here: a lease is gone. Keepalives that waited for it learn so.
    pub(super) fn lessor_revoked(&mut self, id: LeaseId) {
        let mut s = self.lessor.clock.lock();
        s.expiry.remove(&id);
        s.revoking.remove(&id);
        s.checkpointing.remove(&id);
        drop(s);
        // Its queue entry, if any, is dropped when it comes due.
        let (gone, wait): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.renewals).into_iter().partition(|r| r.id == id);
        self.renewals = wait;
        let not_found = || Err(EngineError::Kv(cairn_kv::KvError::LeaseNotFound));
        self.work.answers.extend(gone.into_iter().map(|r| (r.token, not_found())));
    }

    /// Every waiting keepalive and TimeToLive is answered `err` (the replica is stopping).
    pub(super) fn fail_renewals(&mut self, err: &EngineError) {
        for r in self.renewals.drain(..) {
            self.work.answers.push((r.token, Err(err.clone())));
        }
        for a in self.lease_asks.drain(..) {
            self.work.answers.push((a.token, Err(err.clone())));
        }
    }

    /// Keepalives that waited past their deadline for the log are answered with a timeout.
    pub(super) fn expire_renewals(&mut self) {
        let now = self.ticks;
        let (late, wait): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.renewals).into_iter().partition(|r| r.deadline <= now);
        self.renewals = wait;
        let late = late.into_iter().map(|r| (r.token, Err(EngineError::Timeout)));
        self.work.answers.extend(late);
    }

    /// Leases longer than the checkpoint interval (etcd's `LeaseCheckpointInterval`) get their
    /// remaining TTL recorded that often, so a new leader neither restarts them from their full
    /// TTL nor forgets how far they ran.
    fn schedule_checkpoint(&mut self, lease: &Lease) {
        let every = i64::try_from(self.cfg.lease_checkpoint_seconds).unwrap_or(i64::MAX);
        if lease.ttl > every {
            let at = self.ticks + self.lessor.ticks(every);
            self.lessor.checkpoints.push(Reverse((at, lease.id, lease.grant_index)));
        }
    }

    fn lessor_ready(&self) -> Result<(), EngineError> {
        let s = self.lessor.clock.lock();
        if !s.primary {
            return Err(EngineError::NotLeader);
        }
        if self.store.executed_index() < s.ready_at {
            // Leases granted under the previous leader may not be applied here yet.
            return Err(EngineError::NoLeader);
        }
        Ok(())
    }

    /// A keepalive: the lease runs for its full TTL again from now. Answered with its TTL, or
    /// `LeaseNotFound`, or `NotLeader` on a member that does not lead (the caller forwards).
    ///
    /// Before anything, the leadership is confirmed by a heartbeat round issued after the
    /// keepalive arrived (`Replica::issue_lease_round`), as etcd's `ensureLeadership` does: a
    /// leader cut off from the others goes on believing it leads for up to two election
    /// timeouts, and renewed leases, from its stale store, that the new leader expires by its
    /// own clock (simulator seed 312 of the stack mix with leases). One round serves every
    /// keepalive and TimeToLive that arrived before it, here and on the engine's callers'
    /// threads alike (`lease_clock.rs`).
    ///
    /// Then two keepalives are answered only once the log agrees, or a client would be told
    /// its lease runs a full TTL more and then lose it early:
    /// - of a lease that expired, whose revoke is proposed (or will be on the next tick,
    ///   within the revoke rate): it waits for the revoke and is answered `LeaseNotFound`, as
    ///   in etcd (simulator seed 4 of the stack mix with leases found the early revoke);
    /// - of a lease with a checkpoint: the checkpoint is cleared through the log, and the
    ///   keepalive answered once that is applied, since a new leader counts down from the
    ///   checkpoint it finds (etcd answers at once and has this race; seed 176 found it).
    ///
    /// A member that stops leading answers them `NotLeader`, and the caller asks the next.
    pub fn handle_lease_renew(&mut self, id: LeaseId, token: T) {
        self.confirm_leadership(LeaseQuery::Renew(id), token);
    }

    /// A lease's granted and remaining TTL (etcd's TimeToLive), as the leader's clock has it
    /// once its leadership is confirmed, as for a keepalive; a lease that does not exist has
    /// TTL -1 (not an error, as in etcd).
    pub fn handle_lease_ttl(&mut self, id: LeaseId, token: T) {
        self.confirm_leadership(LeaseQuery::Ttl(id), token);
    }

    /// Answers `query` once a round issued after now confirms this member still leads; a
    /// member that does not lead answers at once.
    fn confirm_leadership(&mut self, query: LeaseQuery, token: T) {
        let ticket = self.lessor_ready().and_then(|()| self.lessor.clock.want_round());
        match ticket {
            Ok((round, _)) => self.lease_asks.push_back(LeaseAsk { round, query, token }),
            Err(e) => self.work.answers.push((token, Err(e))),
        }
    }

    /// Issues the round that keepalives and TimeToLives wait for, if any waits: a ReadIndex,
    /// released once a quorum confirmed the leadership (or, in lease read mode, at once while
    /// the leader's lease holds) and the store executed what was committed then.
    pub(super) fn issue_lease_round(&mut self) {
        let Some(round) = self.lessor.clock.issue_round() else { return };
        // The core may have stepped down before the lessor heard of it; its read would go to
        // the next leader, and confirm that one's leadership, not this member's.
        if self.raft.role() != cairn_raft::Role::Leader {
            return self.lease_round_ended(round, Err(EngineError::NotLeader));
        }
        let id = self.own_ids.next_id();
        let purpose = ReadFor::Leases { round, term: self.raft.term() };
        match self.raft.read_index(id.to_ctx()) {
            Ok(()) => self.reads.register(id, Read { index: None, purpose }, self.ticks),
            Err(_) => self.lease_round_ended(round, Err(EngineError::NoLeader)),
        }
    }

    /// Tells the engine's callers whether this member leads as the only voter (see
    /// `LeaseClock::set_sole_voter`).
    pub(super) fn lessor_sole_voter(&self, sole: bool) {
        self.lessor.clock.set_sole_voter(sole);
    }

    /// Round `round` ended: confirmed (its read released in the term it was issued in), or
    /// not, with the error its waiters get. The engine's callers are woken to renew on the
    /// clock; the replica's own waiters are answered here.
    pub(super) fn lease_round_ended(&mut self, round: u64, result: Result<(), EngineError>) {
        self.lessor.clock.settle_round(round, result.is_ok());
        while self.lease_asks.front().is_some_and(|a| a.round <= round) {
            let Some(ask) = self.lease_asks.pop_front() else { break };
            match (&result, ask.query) {
                (Err(e), _) => self.work.answers.push((ask.token, Err(e.clone()))),
                (Ok(()), LeaseQuery::Renew(id)) => self.renew_confirmed(id, ask.token),
                (Ok(()), LeaseQuery::Ttl(id)) => self.ttl_confirmed(id, ask.token),
            }
        }
    }

    /// A keepalive whose leadership was confirmed.
    pub(super) fn renew_confirmed(&mut self, id: LeaseId, token: T) {
        let found = self.lessor_ready().and_then(|()| {
            self.store.lease(id).ok_or(EngineError::Kv(cairn_kv::KvError::LeaseNotFound))
        });
        let lease = match found {
            Ok(lease) => lease,
            Err(e) => return self.work.answers.push((token, Err(e))),
        };
        let deadline = self.ticks + self.cfg.request_timeout_ticks;
        let clock = self.lessor.clock.clone();
        let mut s = clock.lock();
        let expired = s.revoking.contains(&id)
            || self.lessor.expires(&s, &lease).is_some_and(|at| at <= self.ticks);
        let grant_index = lease.grant_index;
        if expired {
            self.renewals.push(Renewal { id, grant_index, token, deadline, wait: Wait::Revoke });
            return;
        }
        // A lease this leader has not scheduled yet (it inherited it, and pages such leases in
        // on its ticks) gets its checkpoints here: paging skips a lease a keepalive already
        // scheduled, and it would otherwise be recorded by no one for this whole leadership.
        let unscheduled = !s.expiry.contains_key(&id);
        // From now on, so that checkpoints taken before the clear is applied are not stale.
        let at = self.ticks + self.lease_ticks(lease.ttl);
        self.lessor.schedule(&mut s, id, at);
        // A checkpoint proposed and not applied yet counts down from before this renewal, and
        // would land after it: a clear proposed now lands after that one.
        let in_flight = s.checkpoint_in_flight(id, self.store.executed_index());
        drop(s);
        if unscheduled {
            self.schedule_checkpoint(&lease);
        }
        if lease.remaining_ttl > 0 || in_flight {
            // It names the grant it renews: should the lease be revoked and granted anew
            // before it applies, the new grant's checkpoint is not this keepalive's to clear.
            let clear = GrantCheckpoint { id, grant_index, remaining: 0 };
            let clear = Command::LeaseGrantCheckpoint { checkpoints: vec![clear] };
            if self.propose_own(clear) {
                self.renewals.push(Renewal { id, grant_index, token, deadline, wait: Wait::Clear });
            } else {
                self.work.answers.push((token, Err(EngineError::LeaderTransfer)));
            }
            return;
        }
        self.work.answers.push((token, Ok(Reply::LeaseRenewed { ttl: lease.ttl })));
    }

    /// Applied here: checkpoints of grants. Keepalives that waited for their grant's to be
    /// cleared are answered, and the lease runs its full TTL from now; unless it expired while
    /// the clear waited for the log and its revoke is proposed: that keepalive waits for the
    /// revoke, as one of an expired lease does (simulator stack seed 726 found a keepalive told
    /// its lease ran 2 s more while the commit index stalled behind a follower catching up, and
    /// the lease revoked at once).
    ///
    /// The clock follows only a clear that applied to the grant its keepalive renewed. One that
    /// met a later grant of the same id changed nothing in the store, so it must change nothing
    /// here either: the later grant keeps the expiry its own grant or keepalives gave it, and
    /// a keepalive waiting for that grant's own clear goes on waiting for it. Its keepalive
    /// learns that its grant is gone (its revoke, applied first, answers it; should the store
    /// not show the grant, it is answered so here).
    pub(super) fn lessor_checkpointed(&mut self, checkpoints: &[GrantCheckpoint]) {
        let cleared = |r: &Renewal<T>| {
            r.wait == Wait::Clear
                && checkpoints
                    .iter()
                    .any(|c| c.id == r.id && c.grant_index == r.grant_index && c.remaining == 0)
        };
        let (done, wait): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.renewals).into_iter().partition(cleared);
        self.renewals = wait;
        let clock = self.lessor.clock.clone();
        for r in done {
            let answer = match self.store.lease(r.id) {
                Some(lease) if lease.grant_index == r.grant_index => {
                    // Looked at and renewed under one lock, as `renew_confirmed` does.
                    let mut s = clock.lock();
                    if s.revoking.contains(&r.id) {
                        drop(s);
                        self.renewals.push(Renewal { wait: Wait::Revoke, ..r });
                        continue;
                    }
                    let at = self.ticks + self.lease_ticks(lease.ttl);
                    self.lessor.schedule(&mut s, r.id, at);
                    Ok(Reply::LeaseRenewed { ttl: lease.ttl })
                }
                // Revoked (and perhaps granted anew) later in the same batch of entries.
                _ => Err(EngineError::Kv(cairn_kv::KvError::LeaseNotFound)),
            };
            self.work.answers.push((r.token, answer));
        }
    }

    /// A TimeToLive whose leadership was confirmed.
    pub(super) fn ttl_confirmed(&mut self, id: LeaseId, token: T) {
        let answer = self.lessor_ready().map(|()| match self.store.lease(id) {
            None => Reply::LeaseTtl { granted: 0, remaining: -1 },
            Some(lease) => {
                let s = self.lessor.clock.lock();
                let at = self.lessor.expires(&s, &lease);
                let left = at.map_or(0, |at| at.saturating_sub(self.ticks));
                Reply::LeaseTtl { granted: lease.ttl, remaining: self.lessor.seconds(left) }
            }
        });
        self.work.answers.push((token, answer));
    }

    /// One tick of the leader's lease clock: schedules a page of inherited leases, revokes
    /// what expired (within the rate), records long leases' remaining TTLs.
    pub(super) fn lessor_tick(&mut self) {
        if !self.lessor.clock.lock().primary {
            return;
        }
        self.promote_page();
        self.revoke_expired();
        self.checkpoint_due();
    }

    fn promote_page(&mut self) {
        let Some((cursor, base)) = self.lessor.promoting else { return };
        if self.store.executed_index() < self.lessor.clock.lock().ready_at {
            // The store may not show yet a checkpoint cleared (or a lease revoked) under the
            // previous leader. Waiting costs nothing: nothing expires before `base`, a grace
            // period away, and pages that come late expire late.
            return;
        }
        let page = self.store.lease_page(cursor, PROMOTE_PAGE);
        let clock = self.lessor.clock.clone();
        let mut s = clock.lock();
        for lease in &page {
            // A keepalive or a grant since the promotion scheduled it already.
            if !s.expiry.contains_key(&lease.id) {
                let at = base + self.lessor.ticks(remaining(lease));
                self.lessor.schedule(&mut s, lease.id, at);
                self.schedule_checkpoint(lease);
            }
        }
        drop(s);
        self.lessor.promoting = match page.last() {
            Some(last) if page.len() == PROMOTE_PAGE && last.id.0 < i64::MAX => {
                Some((LeaseId(last.id.0 + 1), base))
            }
            _ => None,
        };
    }

    /// Revokes what expired. The clock stays locked throughout, so a keepalive is either taken
    /// before a lease is found expired (and it is not) or finds it among those revoking.
    fn revoke_expired(&mut self) {
        if self.cfg.has_bug(Bug::LeaseNeverExpires) {
            return;
        }
        let now = self.ticks;
        let mut budget = self.lessor.revoke_budget;
        let clock = self.lessor.clock.clone();
        let mut s = clock.lock();
        while budget > 0 {
            let Some(Reverse((at, id))) = self.lessor.queue.peek().copied() else { break };
            if at > now {
                break;
            }
            self.lessor.queue.pop();
            if self.lessor.queued.get(&id) != Some(&at) {
                continue; // superseded by an earlier entry for the same lease
            }
            self.lessor.queued.remove(&id);
            let Some(&expires) = s.expiry.get(&id) else { continue };
            let Some(lease) = self.store.lease(id) else {
                s.expiry.remove(&id);
                s.revoking.remove(&id);
                continue; // revoked
            };
            if expires > now {
                // Renewed since it was queued: look again at the new expiry.
                self.lessor.queued.insert(id, expires);
                self.lessor.queue.push(Reverse((expires, id)));
                continue;
            }
            // Looked at again later, in case the proposal is lost; applying it unschedules it.
            // Its expiry stays in the past and it is marked revoking, so keepalives and
            // TimeToLive see it expired. A proposal the core refused (a leadership transfer
            // under way) is tried again on the next tick: waiting the full retry let an expired
            // lease live 5 s longer per transfer (simulator seed 13 of the stack mix with
            // leases).
            s.revoking.insert(id);
            // It names the grant it found expired: this proposal, or the retry below, may commit
            // after the lease was revoked and granted again under the same id, and must then
            // leave the new grant alone. Simulator stack seed 3183 found a retry applied after a
            // client's grant, 5734 a first proposal behind a client's revoke and grant this
            // store had not applied yet. etcd's revoke by id alone, retried after 3 s, has
            // the same race.
            let expire = Command::LeaseExpire { id, grant_index: lease.grant_index };
            let retry = if self.propose_own(expire) { now + REVOKE_RETRY_TICKS } else { now + 1 };
            self.lessor.queued.insert(id, retry);
            self.lessor.queue.push(Reverse((retry, id)));
            budget -= 1;
        }
    }

    /// Records the remaining TTL of long leases whose interval came, in one proposal.
    ///
    /// Not of a lease whose keepalive waits for its checkpoint's clear: the keepalive is
    /// answered, and the lease renewed from then, when the clear is applied, so a checkpoint
    /// taken before that counts down from the earlier renewal and would land after the clear,
    /// and a new leader would count down from it (simulator stack seed 4017: a clear that
    /// waited 2 s for a stalled commit, two checkpoints proposed meanwhile, and the lease
    /// revoked 0.4 s before its renewed TTL after a leader change). Its next one is taken an
    /// interval later.
    fn checkpoint_due(&mut self) {
        let now = self.ticks;
        if self.lessor.checkpoints.peek().is_none_or(|Reverse((at, ..))| *at > now) {
            return;
        }
        let mut batch = Vec::new();
        let clearing: HashSet<LeaseId> =
            self.renewals.iter().filter(|r| r.wait == Wait::Clear).map(|r| r.id).collect();
        let clock = self.lessor.clock.clone();
        let s = clock.lock();
        while batch.len() < CHECKPOINT_BATCH {
            let Some(Reverse((at, id, grant))) = self.lessor.checkpoints.peek().copied() else {
                break;
            };
            if at > now {
                break;
            }
            self.lessor.checkpoints.pop();
            let (Some(lease), Some(expires)) = (self.store.lease(id), s.expiry.get(&id)) else {
                continue;
            };
            if lease.grant_index != grant {
                // Scheduled for an earlier grant of the id. The grant the store holds was
                // scheduled when it was granted (or when this member took over), so going on
                // with this one too would record that lease twice an interval, and once more
                // for every time the id is revoked and granted again.
                continue;
            }
            // Nor of one found expired, whose revoke is on its way: without it a new leader
            // counts down from the previous checkpoint, later, never earlier. (In stack seed
            // 3183 one landed after a client revoked the lease and granted the id anew, and
            // the new grant counted down from it; checkpoints now name their grant, so that
            // one would change nothing.)
            if !clearing.contains(&id) && !s.revoking.contains(&id) {
                let left = self.lessor.seconds(expires.saturating_sub(now)).max(1);
                // The store may not have applied yet a client's revoke and grant of the same
                // id that committed ahead of this batch: naming the grant it counted down
                // keeps the new one's TTL its own.
                batch.push(GrantCheckpoint { id, grant_index: lease.grant_index, remaining: left });
            }
            self.schedule_checkpoint(&lease);
        }
        drop(s);
        if batch.is_empty() {
            return;
        }
        let ids: Vec<LeaseId> = batch.iter().map(|c| c.id).collect();
        // A refused batch is recorded at the next interval; until then a new leader counts
        // down from the previous checkpoint, which is later, never earlier.
        if self.propose_own(Command::LeaseGrantCheckpoint { checkpoints: batch }) {
            let at = self.raft.last_index().0;
            let mut s = clock.lock();
            s.checkpointing.extend(ids.into_iter().map(|id| (id, at)));
        }
    }

    /// Proposes a command of the replica's own, answered to no one: the applied state is the
    /// answer. Only the leader proposes for leases. Returns whether the core took it; a
    /// refusal (a transfer under way) is retried by the clock.
    fn propose_own(&mut self, cmd: Command) -> bool {
        // The core may have stepped down this very tick (check-quorum) before the lessor heard
        // of it; a proposal now would be forwarded to the next leader as if it had decided.
        if self.raft.role() != cairn_raft::Role::Leader {
            return false;
        }
        let data = crate::command::encode(self.own_ids.next_id().0, &cmd);
        self.raft.propose(data).is_ok()
    }
}
