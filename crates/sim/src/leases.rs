//! The lease checker: when a member revokes a lease on its own because it expired, was that
//! too early, and once the cluster is healed, does every lease that nobody keeps alive go?
//!
//! **What cairn promises** (`crates/node/src/replica/lease.rs`, ARCHITECTURE.md's Leases): a
//! lease's expiry is decided by the leader's clock, in ticks. A keepalive the leader answers at
//! its tick `k` moves the expiry to `k + ceil(ttl / tick) + 1`, and a grant the leader applies
//! at tick `k` sets it so. The leader applies an entry as it commits it, before any other member
//! can, so a grant's TTL starts at its first application anywhere; the member that answers the
//! client may apply it, and answer, much later (as in etcd). A new leader gives every lease it
//! inherits an election timeout of grace on top of its full TTL (or its last checkpoint's
//! remaining TTL). The revoke is proposed no earlier than the expiry tick, and takes effect when
//! the first member applies it. So in the simulator's time, where a member's tick lasts
//! `TICK_UNITS ± DRIFT_UNITS` units, a lease renewed for `ttl` seconds at time `a`, or granted
//! and first applied then, is not revoked as expired before `a + ttl × ticks per second × the
//! shortest tick`: the TTL as the fastest clock in the cluster counts it. Across leader changes
//! that holds as long as a new leader's grace covers the time its deposed predecessor went on
//! answering keepalives, which is what the check finds out under faults.
//!
//! **Liveness:** after healing no client keeps a lease alive, so each must be revoked within
//! `grace + ceil(ttl / tick) + 1 + SLACK_TICKS` of the slowest clock's ticks from the later of
//! its last acknowledgement and the promotion of the leader that revokes it, and none may be
//! left when the run converges.

use std::collections::BTreeMap;

use cairn_kv::LeaseId;

use crate::checker::Violation;
use crate::history::LeaseChange;

/// A lease's life promised to a client: what the lease checker holds the leader's clock
/// to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseAck {
    /// A keepalive renewed the lease for `ttl` seconds.
    Renewed { id: LeaseId, ttl: i64 },
    /// TimeToLive answered with the lease's granted TTL and seconds left.
    Ttl { id: LeaseId, granted: i64, remaining: i64 },
}

/// Ticks a leader may take, past an expiry, to propose the revoke and have it applied: the
/// tick that notices it, and replication over the healed network (delays up to 30 units).
const SLACK_TICKS: u64 = 5;

/// A lease's life promised to a client.
#[derive(Clone, Copy, Debug)]
struct Promise {
    /// When the client was told, in simulated time.
    at: u64,
    /// "granted" or "renewed".
    what: &'static str,
    ttl: i64,
    /// No revoke by expiry before this.
    until: u64,
}

/// What the lease checker saw, for the run's counters.
#[derive(Clone, Copy, Debug, Default)]
pub struct LeaseStats {
    pub acks: u64,
    pub expiries_checked: u64,
}

#[derive(Debug)]
pub struct Leases {
    /// Simulated time units in the shortest and the longest tick of any member.
    shortest_tick: u64,
    longest_tick: u64,
    /// Ticks in a second of lease time.
    ticks_per_second: u64,
    /// A new leader's grace, in ticks (an election timeout).
    grace_ticks: u64,
    /// The latest promise to a client, per lease, until the lease is revoked.
    promised: BTreeMap<LeaseId, Promise>,
    /// When the newest leader took over.
    promoted_at: u64,
    /// When the faults stopped, once they have.
    healed_at: Option<u64>,
    pub stats: LeaseStats,
}

impl Leases {
    pub fn new(shortest_tick: u64, longest_tick: u64, tick_micros: u64, grace_ticks: u64) -> Self {
        Leases {
            shortest_tick,
            longest_tick,
            ticks_per_second: 1_000_000 / tick_micros.max(1),
            grace_ticks,
            promised: BTreeMap::new(),
            promoted_at: 0,
            healed_at: None,
            stats: LeaseStats::default(),
        }
    }

    /// A leader of a new term appeared at `now`.
    pub fn leader_elected(&mut self, now: u64) {
        self.promoted_at = now;
    }

    /// Faults stopped at `now`: from here on, expired leases must go within the bound.
    pub fn healed(&mut self, now: u64) {
        self.healed_at = Some(now);
    }

    /// The lease runs `ttl` seconds by the fastest clock from `now`.
    fn promise(&mut self, id: LeaseId, ttl: i64, what: &'static str, now: u64) {
        let until = now + self.ticks(ttl).saturating_mul(self.shortest_tick);
        self.promised.insert(id, Promise { at: now, what, ttl, until });
    }

    /// A grant or revoke first applied at `now`. A grant starts the lease's TTL then: the
    /// leader counts from when it applies the grant, which is as soon as it commits and before
    /// any other member can apply it (the member that answers the client may do so later).
    pub fn changed(&mut self, change: LeaseChange, now: u64) -> Result<(), Violation> {
        match change {
            LeaseChange::Granted { id, ttl } => {
                self.promise(id, ttl, "granted", now);
                Ok(())
            }
            LeaseChange::Revoked { id, ttl, own } => self.revoked(id, ttl, own, now),
        }
    }

    /// A client was told `ack` at `now`. A renewal promises the lease its TTL by the fastest
    /// clock; a TimeToLive must not report more left than a new leader's grace on top of the
    /// TTL.
    pub fn acknowledged(&mut self, ack: LeaseAck, now: u64) -> Result<(), Violation> {
        self.stats.acks += 1;
        match ack {
            LeaseAck::Renewed { id, ttl } => self.promise(id, ttl, "renewed", now),
            LeaseAck::Ttl { id, granted, remaining } => {
                let grace = self.grace_ticks.div_ceil(self.ticks_per_second.max(1));
                if remaining > granted + grace as i64 {
                    return Err(Violation(format!(
                        "lease {}: TimeToLive at t={now} reports {remaining}s left of a {granted}s lease (a new leader's grace is {grace}s)",
                        id.0
                    )));
                }
            }
        }
        Ok(())
    }

    /// The first member applied a revoke of `id` at `now`, of a lease of `ttl` seconds; `own`
    /// if a member proposed it on its own, because the lease expired.
    fn revoked(
        &mut self,
        id: LeaseId,
        ttl: Option<i64>,
        own: bool,
        now: u64,
    ) -> Result<(), Violation> {
        let promise = self.promised.remove(&id);
        if !own {
            return Ok(());
        }
        self.stats.expiries_checked += 1;
        if let Some(p) = promise.filter(|p| now < p.until) {
            return Err(Violation(format!(
                "lease {} revoked as expired at t={now}, but it was {} for {}s at t={}: not before t={} even by the fastest clock",
                id.0, p.what, p.ttl, p.at, p.until
            )));
        }
        let (Some(healed), Some(ttl)) = (self.healed_at, ttl) else { return Ok(()) };
        let from = promise.map_or(0, |p| p.at).max(self.promoted_at).max(healed);
        let ticks = self.grace_ticks + self.ticks(ttl) + 1 + SLACK_TICKS;
        let by = from + ticks * self.longest_tick;
        if now > by {
            return Err(Violation(format!(
                "liveness: lease {} ({ttl}s) revoked at t={now}, later than t={by} ({ticks} ticks after t={from}, when the cluster was healed with a leader and no keepalive)",
                id.0
            )));
        }
        Ok(())
    }

    /// Ticks that `seconds` take.
    fn ticks(&self, seconds: i64) -> u64 {
        u64::try_from(seconds).unwrap_or(0).saturating_mul(self.ticks_per_second)
    }
}
