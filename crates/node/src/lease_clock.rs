//! The part of the leader's lease clock (`replica/lease.rs`) that the engine's callers share with
//! the driver: whether this member keeps the clock, and when each lease expires. A keepalive is
//! the commonest lease request (every client renews every lease every third of its TTL), and
//! answering it through the driver thread cost a channel round trip and two thread wake-ups
//! each (in the keepalive benchmark the driver thread alone took 15% of the server's CPU, and
//! the futex calls that woke it and its callers 8% more, by perf). Here the caller renews under
//! a short lock instead, on the same terms as the driver would, and leaves to the driver only
//! what needs it: a lease not scheduled yet, an expired one (answered once its revoke is
//! applied), one whose checkpoint must be cleared through Raft.
//!
//! Time is still counted in the driver's ticks, so the replica keeps no clock: the driver says
//! when its ticks started counting real time ([`LeaseClock::start`]), and a caller converts the
//! moment of its keepalive into the tick the driver has reached by then, or will reach once it
//! catches up. A renewal at tick `r` runs to `r + ticks(ttl)`, which is the driver's own rule, so
//! a lease renewed here does not expire before its TTL even when the driver lags behind.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cairn_kv::{KvError, Lease, LeaseId};

use crate::error::EngineError;

/// Shared between the replica's lessor and the engine's callers.
#[derive(Debug)]
pub(crate) struct LeaseClock {
    tick_micros: u64,
    state: Mutex<ClockState>,
}

/// What the lock guards.
#[derive(Debug, Default)]
pub(crate) struct ClockState {
    /// Whether this member leads and keeps the clock.
    pub(crate) primary: bool,
    /// Executed index from which the leader's store holds every lease committed before it
    /// took over: renewals and TTLs are answered only from then.
    pub(crate) ready_at: u64,
    /// When each scheduled lease expires, in ticks.
    pub(crate) expiry: HashMap<LeaseId, u64>,
    /// Leases found expired whose revoke is proposed and not applied yet: a keepalive must not
    /// bring them back (the revoke would still delete them), so the driver answers it.
    pub(crate) revoking: HashSet<LeaseId>,
    /// The driver's ticks count real time from here: tick `ticks + n` is due at
    /// `start + n × tick`. None until the driver runs (and under the simulator, which
    /// renews only through the replica).
    epoch: Option<Epoch>,
}

#[derive(Clone, Copy, Debug)]
struct Epoch {
    start: Instant,
    ticks: u64,
    tick: Duration,
}

impl ClockState {
    /// The tick the driver has reached at `now`, or will once it catches up.
    fn tick_at(&self, now: Instant) -> Option<u64> {
        let e = self.epoch?;
        let nanos = now.saturating_duration_since(e.start).as_nanos();
        let elapsed = nanos / e.tick.as_nanos().max(1);
        Some(e.ticks.saturating_add(u64::try_from(elapsed).unwrap_or(u64::MAX)))
    }

    /// Forgets the clock: this member no longer leads (the epoch stays, it is the driver's).
    pub(crate) fn clear(&mut self) {
        let epoch = self.epoch;
        *self = ClockState { epoch, ..ClockState::default() };
    }
}

/// Ticks that surely span `seconds` from now: one more than the whole ticks in it, since now is
/// somewhere inside the current tick (without it a lease could expire up to a tick before its
/// TTL).
pub(crate) fn span_ticks(seconds: i64, tick_micros: u64) -> u64 {
    let micros = u64::try_from(seconds).unwrap_or(0).saturating_mul(1_000_000);
    micros.div_ceil(tick_micros.max(1)) + 1
}

impl LeaseClock {
    pub(crate) fn new(tick_micros: u64) -> LeaseClock {
        LeaseClock { tick_micros: tick_micros.max(1), state: Mutex::new(ClockState::default()) }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, ClockState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The driver's ticks count real time from `start`, where the replica's count is `ticks`
    /// and each lasts `tick`.
    pub(crate) fn start(&self, start: Instant, ticks: u64, tick: Duration) {
        self.lock().epoch = Some(Epoch { start, ticks, tick });
    }

    /// A keepalive for `lease` (as the store has it, with its executed index) at `now`, taken
    /// here if it can be: Ok(Some(ttl)) renewed it; Ok(None) leaves it to the driver; Err is
    /// the answer (`NotLeader`: the caller forwards it to the leader).
    pub(crate) fn renew(
        &self,
        id: LeaseId,
        lease: Option<Lease>,
        executed: u64,
        now: Instant,
    ) -> Result<Option<i64>, EngineError> {
        let mut s = self.lock();
        if !s.primary {
            return Err(EngineError::NotLeader);
        }
        if executed < s.ready_at {
            // Leases granted under the previous leader may not be applied here yet.
            return Err(EngineError::NoLeader);
        }
        let Some(lease) = lease.filter(|l| l.id == id) else {
            return Err(EngineError::Kv(KvError::LeaseNotFound));
        };
        // A stale checkpoint must be cleared through Raft, which only the driver proposes.
        if lease.remaining_ttl > 0 || s.revoking.contains(&id) {
            return Ok(None);
        }
        let Some(tick) = s.tick_at(now) else { return Ok(None) };
        let at = tick + span_ticks(lease.ttl, self.tick_micros);
        match s.expiry.get_mut(&id) {
            // Expired (the driver answers once the revoke is applied), or a renewal that would
            // move the expiry earlier (the driver queues an earlier look at it): the driver's.
            Some(expiry) if *expiry > tick && at >= *expiry => {
                *expiry = at;
                Ok(Some(lease.ttl))
            }
            // Not scheduled yet (a new leader pages its leases in), or just revoked.
            _ => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: Duration = Duration::from_millis(100);

    fn lease(id: i64, ttl: i64) -> Lease {
        Lease { id: LeaseId(id), ttl, remaining_ttl: 0 }
    }

    /// A leader's clock whose driver started `ago` before `now` at tick 0, with lease 1
    /// expiring at `expiry`.
    fn leading(ago: Duration, expiry: u64) -> (LeaseClock, Instant) {
        let clock = LeaseClock::new(100_000);
        let now = Instant::now();
        clock.start(now - ago, 0, TICK);
        let mut s = clock.lock();
        s.primary = true;
        s.expiry.insert(LeaseId(1), expiry);
        drop(s);
        (clock, now)
    }

    #[test]
    fn a_renewal_runs_a_full_ttl_from_the_real_tick_even_if_the_driver_lags() {
        // 2.05 s after the driver started, tick 20 is due, whatever the driver counted so far.
        let (clock, now) = leading(Duration::from_millis(2050), 30);
        assert_eq!(clock.renew(LeaseId(1), Some(lease(1, 5)), 0, now), Ok(Some(5)));
        // 20 + 50 whole ticks + 1 for the part of tick 20 already gone.
        assert_eq!(clock.lock().expiry[&LeaseId(1)], 71);
    }

    #[test]
    fn expired_revoking_or_unscheduled_leases_are_left_to_the_driver() {
        let (clock, now) = leading(Duration::from_millis(2050), 20);
        assert_eq!(clock.renew(LeaseId(1), Some(lease(1, 5)), 0, now), Ok(None), "expired");
        let (clock, now) = leading(Duration::from_millis(2050), 30);
        clock.lock().revoking.insert(LeaseId(1));
        assert_eq!(clock.renew(LeaseId(1), Some(lease(1, 5)), 0, now), Ok(None), "revoking");
        let (clock, now) = leading(Duration::ZERO, 30);
        assert_eq!(clock.renew(LeaseId(2), Some(lease(2, 5)), 0, now), Ok(None), "unscheduled");
        let stale = Lease { remaining_ttl: 3, ..lease(1, 5) };
        assert_eq!(clock.renew(LeaseId(1), Some(stale), 0, now), Ok(None), "checkpointed");
        // Inherited with grace beyond a full TTL from now: the driver queues the earlier look.
        let (clock, now) = leading(Duration::ZERO, 500);
        assert_eq!(clock.renew(LeaseId(1), Some(lease(1, 5)), 0, now), Ok(None), "earlier");
        assert_eq!(clock.lock().expiry[&LeaseId(1)], 500, "untouched");
        // Before the driver runs there is no real tick to count from.
        let clock = LeaseClock::new(100_000);
        let mut s = clock.lock();
        s.primary = true;
        s.expiry.insert(LeaseId(1), 30);
        drop(s);
        assert_eq!(clock.renew(LeaseId(1), Some(lease(1, 5)), 0, Instant::now()), Ok(None));
    }

    #[test]
    fn only_a_ready_leader_renews_and_a_missing_lease_is_not_found() {
        let (clock, now) = leading(Duration::ZERO, 30);
        assert_eq!(
            clock.renew(LeaseId(3), None, 0, now),
            Err(EngineError::Kv(KvError::LeaseNotFound))
        );
        clock.lock().ready_at = 7;
        assert_eq!(clock.renew(LeaseId(1), Some(lease(1, 5)), 6, now), Err(EngineError::NoLeader));
        assert_eq!(clock.renew(LeaseId(1), Some(lease(1, 5)), 7, now), Ok(Some(5)));
        clock.lock().clear();
        assert_eq!(clock.renew(LeaseId(1), Some(lease(1, 5)), 7, now), Err(EngineError::NotLeader));
        assert!(clock.lock().epoch.is_some(), "the driver's epoch outlives leadership");
    }
}
