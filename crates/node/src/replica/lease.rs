//! The leader's lease clock (etcd's lessor): when each lease expires, keepalives, remaining
//! TTLs, and the revokes and checkpoints it proposes.
//!
//! Which leases exist, their TTLs and the keys they hold are replicated state (the store's).
//! When one expires is decided by the leader alone, on its ticks, and carried out as a
//! `LeaseRevoke` through Raft, so a member that is not leader never revokes, and a revoke is
//! applied everywhere at the same point of the log. Followers keep no clock for leases.
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
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;

use cairn_kv::backend::Backend;
use cairn_kv::{Command, Lease, LeaseId};
use cairn_storage::fs::Dir;

use super::{Replica, Reply};
use crate::error::EngineError;
use crate::lease_clock::{span_ticks, ClockState, LeaseClock};

/// Leases a new leader schedules per tick.
const PROMOTE_PAGE: usize = 20_000;
/// etcd's default `LeaseCheckpointInterval`: leases longer than this get their remaining TTL
/// recorded this often, so a new leader neither restarts them from their full TTL nor forgets
/// how far they ran.
const CHECKPOINT_SECONDS: u64 = 300;
/// etcd's `maxLeaseCheckpointBatchSize`.
const CHECKPOINT_BATCH: usize = 1000;
/// Ticks before a revoke that was proposed and not applied is proposed again.
const REVOKE_RETRY_TICKS: u64 = 50;

/// The leader's clock for leases. Empty on a member that does not lead.
#[derive(Debug)]
pub(super) struct Lessor<T> {
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
    /// When each long lease's remaining TTL is next recorded.
    checkpoints: BinaryHeap<Reverse<(u64, LeaseId)>>,
    /// Revokes allowed per tick.
    revoke_budget: usize,
    /// Keepalives for expired leases. As etcd's lessor does, they wait for the revoke and are
    /// answered `LeaseNotFound` once it is applied (or `NotLeader` if this member stops
    /// leading first): renewing the lease would be a lie, since the revoke deletes it anyway.
    waiting: HashMap<LeaseId, Vec<T>>,
}

impl<T> Lessor<T> {
    /// A clock of `tick_micros` per tick, revoking at most `revokes_per_second`.
    pub(super) fn new(tick_micros: u64, revokes_per_second: u64) -> Lessor<T> {
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
            waiting: HashMap::new(),
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
    /// keepalives waiting here go to the next leader.
    pub(super) fn lessor_demote(&mut self) {
        let clock = self.lessor.clock.clone();
        clock.lock().clear();
        let waiting = std::mem::take(&mut self.lessor.waiting);
        self.lessor = Lessor::new(self.cfg.tick_micros, self.cfg.lease_revoke_rate);
        self.lessor.clock = clock;
        for token in waiting.into_values().flatten() {
            self.work.answers.push((token, Err(EngineError::NotLeader)));
        }
    }

    /// Answers the keepalives waiting for revokes with `err` (the replica is stopping).
    pub(super) fn fail_lease_waiters(&mut self, err: &EngineError) {
        for token in std::mem::take(&mut self.lessor.waiting).into_values().flatten() {
            self.work.answers.push((token, Err(err.clone())));
        }
    }

    /// Applied here: a lease was granted. The leader starts its clock.
    pub(super) fn lessor_granted(&mut self, lease: Lease) {
        let clock = self.lessor.clock.clone();
        let mut s = clock.lock();
        if s.primary {
            let at = self.ticks + self.lessor.ticks(lease.ttl);
            self.lessor.schedule(&mut s, lease.id, at);
            drop(s);
            self.schedule_checkpoint(&lease);
        }
    }

    /// Applied here: a lease is gone; keepalives that waited for it learn so.
    pub(super) fn lessor_revoked(&mut self, id: LeaseId) {
        let mut s = self.lessor.clock.lock();
        s.expiry.remove(&id);
        s.revoking.remove(&id);
        drop(s);
        // Its queue entry, if any, is dropped when it comes due.
        for token in self.lessor.waiting.remove(&id).into_iter().flatten() {
            let gone = EngineError::Kv(cairn_kv::KvError::LeaseNotFound);
            self.work.answers.push((token, Err(gone)));
        }
    }

    fn schedule_checkpoint(&mut self, lease: &Lease) {
        if lease.ttl > CHECKPOINT_SECONDS as i64 {
            let at = self.ticks + self.lessor.ticks(CHECKPOINT_SECONDS as i64);
            self.lessor.checkpoints.push(Reverse((at, lease.id)));
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
    /// `LeaseNotFound` (once the revoke is applied, if the lease expired), or `NotLeader` on a
    /// member that does not lead (the caller forwards).
    pub fn handle_lease_renew(&mut self, id: LeaseId, token: T) {
        let found = self.lessor_ready().and_then(|()| {
            self.store.lease(id).ok_or(EngineError::Kv(cairn_kv::KvError::LeaseNotFound))
        });
        let lease = match found {
            Ok(lease) => lease,
            Err(e) => {
                self.work.answers.push((token, Err(e)));
                return;
            }
        };
        let clock = self.lessor.clock.clone();
        let mut s = clock.lock();
        let expired = s.revoking.contains(&id)
            || self.lessor.expires(&s, &lease).is_some_and(|at| at <= self.ticks);
        if expired {
            self.lessor.waiting.entry(id).or_default().push(token);
            return;
        }
        let at = self.ticks + self.lessor.ticks(lease.ttl);
        self.lessor.schedule(&mut s, id, at);
        drop(s);
        if lease.remaining_ttl > 0 {
            // Its last checkpoint is stale now: clear it, as etcd does, or a new leader
            // would count down from there.
            self.propose_own(Command::LeaseCheckpoint { checkpoints: vec![(id, 0)] });
        }
        self.work.answers.push((token, Ok(Reply::LeaseRenewed { ttl: lease.ttl })));
    }

    /// A lease's granted and remaining TTL (etcd's TimeToLive), as the leader's clock has it;
    /// a lease that does not exist has TTL -1 (not an error, as in etcd).
    pub fn handle_lease_ttl(&mut self, id: LeaseId, token: T) {
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
            if self.store.lease(id).is_none() {
                s.expiry.remove(&id);
                s.revoking.remove(&id);
                continue; // revoked
            }
            if expires > now {
                // Renewed since it was queued: look again at the new expiry.
                self.lessor.queued.insert(id, expires);
                self.lessor.queue.push(Reverse((expires, id)));
                continue;
            }
            // Looked at again later, in case the proposal is lost; applying it unschedules it.
            self.lessor.schedule(&mut s, id, now + REVOKE_RETRY_TICKS);
            s.revoking.insert(id);
            self.propose_own(Command::LeaseRevoke { id });
            budget -= 1;
        }
    }

    fn checkpoint_due(&mut self) {
        let now = self.ticks;
        let mut batch = Vec::new();
        let clock = self.lessor.clock.clone();
        let s = clock.lock();
        while batch.len() < CHECKPOINT_BATCH {
            let Some(Reverse((at, id))) = self.lessor.checkpoints.peek().copied() else { break };
            if at > now {
                break;
            }
            self.lessor.checkpoints.pop();
            let (Some(lease), Some(expires)) = (self.store.lease(id), s.expiry.get(&id)) else {
                continue;
            };
            let left = self.lessor.seconds(expires.saturating_sub(now)).max(1);
            batch.push((id, left));
            self.schedule_checkpoint(&lease);
        }
        drop(s);
        if !batch.is_empty() {
            self.propose_own(Command::LeaseCheckpoint { checkpoints: batch });
        }
    }

    /// Proposes a command of the replica's own, answered to no one: the applied state is the
    /// answer. Only the leader proposes for leases; a refusal (a transfer under way) is
    /// retried by the clock.
    fn propose_own(&mut self, cmd: Command) {
        // The core may have stepped down this very tick (check-quorum) before the lessor heard
        // of it; a proposal now would be forwarded to the next leader as if it had decided.
        if self.raft.role() != cairn_raft::Role::Leader {
            return;
        }
        let data = crate::command::encode(self.own_ids.next_id().0, &cmd);
        let _ = self.raft.propose(data);
    }
}
