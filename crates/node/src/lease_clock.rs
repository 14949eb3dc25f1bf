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
//!
//! No keepalive is renewed before a heartbeat round issued after it arrived has confirmed that
//! this member still leads (etcd's `ensureLeadership`): a leader cut off from the others goes
//! on believing it leads for up to two election timeouts, and would renew, from a stale store,
//! leases the new leader expires (simulator seed 312 of the stack mix with leases). One round
//! serves every keepalive that arrived before it was issued, as the core's ReadIndex batches
//! reads: a caller takes a ticket ([`LeaseClock::want_round`], the number of the next round to be
//! issued), the replica issues the round on its next turn ([`LeaseClock::issue_round`]) as a
//! ReadIndex, and settles it when that read is released or fails ([`LeaseClock::settle_round`]),
//! waking the callers. So a keepalive costs a share of one driver turn, not a turn of its own.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
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
    /// The log index of the last checkpoint proposed for each lease. Until the store has
    /// executed it, a keepalive must go through the log (a clear behind it): the checkpoint
    /// counts down from before the keepalive and would otherwise land after it, and a new
    /// leader would count down from it.
    pub(crate) checkpointing: HashMap<LeaseId, u64>,
    /// The driver's ticks count real time from here: tick `ticks + n` is due at
    /// `start + n × tick`. None until the driver runs (and under the simulator, which
    /// renews only through the replica).
    epoch: Option<Epoch>,
    /// Leadership confirmations; they outlive a leadership, so a ticket is never met by a
    /// round issued before it.
    rounds: Rounds,
}

/// The ticket of a sole voter's keepalives, confirmed by its own vote without a round.
const SOLE_VOTER: u64 = 0;

/// Heartbeat rounds that confirm this member's leadership for keepalives, numbered from 1 in
/// the order they are issued.
#[derive(Debug, Default)]
struct Rounds {
    /// The last round issued.
    issued: u64,
    /// The highest round that confirmed the leadership, and when, by the real clock (None
    /// under the simulator, whose callers never renew here).
    confirmed: u64,
    confirmed_at: Option<Instant>,
    /// The highest round that ended without confirming it (no leader, a timeout, a new term).
    failed: u64,
    /// A caller holds a ticket for a round not issued yet.
    wanted: bool,
    /// This member leads and is the only voter of its configuration, as of the replica's last
    /// turn: its own vote is a quorum, so a round would confirm the moment it is issued (the
    /// core answers such a leader's ReadIndex at once), and callers need not wait for one.
    sole: bool,
    /// Callers waiting for a round to end.
    wakers: Vec<Waker>,
}

#[derive(Clone, Copy, Debug)]
struct Epoch {
    start: Instant,
    ticks: u64,
    tick: Duration,
}

impl ClockState {
    /// Whether a checkpoint of `id` is proposed and not executed by a store that executed up
    /// to `executed`.
    pub(crate) fn checkpoint_in_flight(&self, id: LeaseId, executed: u64) -> bool {
        self.checkpointing.get(&id).is_some_and(|at| *at > executed)
    }

    /// The tick the driver has reached at `now`, or will once it catches up.
    fn tick_at(&self, now: Instant) -> Option<u64> {
        let e = self.epoch?;
        let nanos = now.saturating_duration_since(e.start).as_nanos();
        let elapsed = nanos / e.tick.as_nanos().max(1);
        Some(e.ticks.saturating_add(u64::try_from(elapsed).unwrap_or(u64::MAX)))
    }

    /// Forgets the clock: this member no longer leads (the epoch stays, it is the driver's,
    /// and so do the rounds' numbers). Returns the callers to wake: they must learn it.
    fn clear(&mut self) -> Vec<Waker> {
        let (epoch, mut rounds) = (self.epoch, std::mem::take(&mut self.rounds));
        let wakers = std::mem::take(&mut rounds.wakers);
        // Whoever held a ticket is woken to find this member no longer leads; the next
        // leadership's first ticket must wake the driver again.
        rounds.wanted = false;
        rounds.sole = false;
        *self = ClockState { epoch, rounds, ..ClockState::default() };
        wakers
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

    /// This member no longer leads: the clock is forgotten, and callers waiting for a round
    /// are woken to learn it.
    pub(crate) fn demote(&self) {
        let wakers = self.lock().clear();
        wakers.into_iter().for_each(Waker::wake);
    }

    /// A ticket for a keepalive that arrived: the round that will confirm the leadership for
    /// it, issued on the replica's next turn. `Ok((round, true))`: the first ticket since the
    /// last round was issued, so the caller must have the driver take a turn. `NotLeader`
    /// where this member does not lead (the caller forwards).
    pub(crate) fn want_round(&self) -> Result<(u64, bool), EngineError> {
        self.ticket(false)
    }

    /// [`LeaseClock::want_round`] for the engine's callers, who need no round while this
    /// member leads as the only voter: their ticket is then met by that alone. (The replica's
    /// own waiters always take a round, since only a round's end answers them.)
    pub(crate) fn want_confirmation(&self) -> Result<(u64, bool), EngineError> {
        self.ticket(true)
    }

    fn ticket(&self, sole_suffices: bool) -> Result<(u64, bool), EngineError> {
        let mut s = self.lock();
        if !s.primary {
            return Err(EngineError::NotLeader);
        }
        if sole_suffices && s.rounds.sole {
            return Ok((SOLE_VOTER, false));
        }
        let first = !s.rounds.wanted;
        s.rounds.wanted = true;
        Ok((s.rounds.issued + 1, first))
    }

    /// Whether this member leads as the only voter (the replica says so after every turn).
    /// Another voter can be added only through this leader's log, and can win an election only
    /// with this member's vote, which it grants on a turn that also demotes it here.
    pub(crate) fn set_sole_voter(&self, sole: bool) {
        let mut s = self.lock();
        s.rounds.sole = sole && s.primary;
    }

    /// The round to issue now, if a ticket waits for one: the replica asks the core for a
    /// ReadIndex under this number.
    pub(crate) fn issue_round(&self) -> Option<u64> {
        let mut s = self.lock();
        if !std::mem::take(&mut s.rounds.wanted) {
            return None;
        }
        s.rounds.issued += 1;
        Some(s.rounds.issued)
    }

    /// Round `n` ended, having confirmed the leadership or not; its callers are woken.
    pub(crate) fn settle_round(&self, n: u64, confirmed: bool) {
        let mut s = self.lock();
        let real = s.epoch.is_some();
        let r = &mut s.rounds;
        if confirmed {
            r.confirmed = r.confirmed.max(n);
            r.confirmed_at = real.then(Instant::now);
        } else {
            r.failed = r.failed.max(n);
        }
        let wakers = std::mem::take(&mut s.rounds.wakers);
        drop(s);
        wakers.into_iter().for_each(Waker::wake);
    }

    /// Whether the leadership is confirmed for ticket `round` at `now`: Ready(true) once a
    /// round at least as late confirmed it within the last tick; Ready(false) when the caller
    /// must ask the driver instead (this member stopped leading, the round failed, or the
    /// confirmation is older than a tick: a keepalive read long after it, by a task that was
    /// not polled, must not lean on it, since a deposed leader's grace covers only a little
    /// more than the round itself). Pending registers the caller's waker.
    pub(crate) fn poll_round(&self, round: u64, now: Instant, cx: &mut Context<'_>) -> Poll<bool> {
        let mut s = self.lock();
        if !s.primary {
            return Poll::Ready(false);
        }
        let tick = s.epoch.map_or(Duration::ZERO, |e| e.tick);
        let r = &mut s.rounds;
        if round == SOLE_VOTER {
            return Poll::Ready(r.sole);
        }
        if r.confirmed >= round {
            let at = r.confirmed_at;
            return Poll::Ready(at.is_some_and(|at| now.saturating_duration_since(at) <= tick));
        }
        if r.failed >= round {
            return Poll::Ready(false);
        }
        if !r.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            r.wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }

    /// A keepalive for `lease` (as the store has it, with its executed index) at `now`, once a
    /// round issued after it arrived confirmed the leadership ([`LeaseClock::poll_round`]),
    /// taken here if it can be: Ok(Some(ttl)) renewed it; Ok(None) leaves it to the driver; Err is
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
        // A stale checkpoint, or one on its way, must be cleared through Raft, which only the
        // driver proposes.
        let in_flight = s.checkpoint_in_flight(id, executed);
        if lease.remaining_ttl > 0 || in_flight || s.revoking.contains(&id) {
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
        Lease { id: LeaseId(id), ttl, remaining_ttl: 0, grant_index: 1 }
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
        let (clock, now) = leading(Duration::from_millis(2050), 30);
        clock.lock().checkpointing.insert(LeaseId(1), 8);
        let renew = |executed| clock.renew(LeaseId(1), Some(lease(1, 5)), executed, now);
        assert_eq!(renew(7), Ok(None), "a checkpoint on its way");
        assert_eq!(renew(8), Ok(Some(5)), "the checkpoint executed");
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
        clock.demote();
        assert_eq!(clock.renew(LeaseId(1), Some(lease(1, 5)), 7, now), Err(EngineError::NotLeader));
        assert!(clock.lock().epoch.is_some(), "the driver's epoch outlives leadership");
    }

    /// Counts its wake-ups, to see who is woken.
    struct Count(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Count {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    fn counting() -> (std::sync::Arc<Count>, Waker) {
        let count = std::sync::Arc::new(Count(std::sync::atomic::AtomicUsize::new(0)));
        (count.clone(), Waker::from(count))
    }

    #[test]
    fn a_ticket_is_met_only_by_a_round_issued_after_it_and_one_round_serves_many() {
        let (clock, now) = leading(Duration::ZERO, 30);
        let (woken, waker) = counting();
        let mut cx = Context::from_waker(&waker);
        assert_eq!(clock.issue_round(), None, "nobody waits");
        assert_eq!(clock.want_round(), Ok((1, true)), "the first wakes the driver");
        assert_eq!(clock.want_round(), Ok((1, false)), "the next shares the round");
        assert_eq!(clock.issue_round(), Some(1));
        assert_eq!(clock.issue_round(), None, "issued once");
        assert_eq!(clock.want_round(), Ok((2, true)), "arrived after round 1 was issued");
        assert_eq!(clock.poll_round(1, now, &mut cx), Poll::Pending);
        assert_eq!(clock.issue_round(), Some(2));
        clock.settle_round(1, true);
        assert_eq!(woken.0.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(clock.poll_round(1, Instant::now(), &mut cx), Poll::Ready(true));
        assert_eq!(clock.poll_round(2, Instant::now(), &mut cx), Poll::Pending);
        clock.settle_round(2, false);
        assert_eq!(clock.poll_round(2, Instant::now(), &mut cx), Poll::Ready(false), "failed");
    }

    #[test]
    fn a_stale_confirmation_or_a_lost_leadership_sends_keepalives_to_the_driver() {
        let (clock, _) = leading(Duration::ZERO, 30);
        let (woken, waker) = counting();
        let mut cx = Context::from_waker(&waker);
        let (round, _) = clock.want_round().expect("a leader takes tickets");
        clock.issue_round();
        clock.settle_round(round, true);
        let later = Instant::now() + 2 * TICK;
        assert_eq!(clock.poll_round(round, later, &mut cx), Poll::Ready(false), "two ticks old");
        let (round, _) = clock.want_round().expect("a leader takes tickets");
        assert_eq!(clock.poll_round(round, Instant::now(), &mut cx), Poll::Pending);
        clock.demote();
        assert_eq!(woken.0.load(std::sync::atomic::Ordering::SeqCst), 1, "woken to learn it");
        assert_eq!(clock.poll_round(round, Instant::now(), &mut cx), Poll::Ready(false));
        assert_eq!(clock.want_round(), Err(EngineError::NotLeader));
        clock.lock().primary = true;
        assert_eq!(clock.want_round(), Ok((round, true)), "numbers outlive a leadership");
    }

    #[test]
    fn a_sole_voter_is_confirmed_by_its_own_vote_until_it_is_not() {
        let (clock, now) = leading(Duration::ZERO, 30);
        let (_, waker) = counting();
        let mut cx = Context::from_waker(&waker);
        clock.set_sole_voter(true);
        let (round, first) = clock.want_confirmation().expect("a leader takes tickets");
        assert!(!first, "no round, no driver");
        assert_eq!(clock.issue_round(), None);
        assert_eq!(clock.want_round(), Ok((1, true)), "the replica's waiters take a round");
        assert_eq!(clock.poll_round(round, now, &mut cx), Poll::Ready(true));
        clock.set_sole_voter(false);
        assert_eq!(clock.poll_round(round, now, &mut cx), Poll::Ready(false), "a voter joined");
        clock.set_sole_voter(true);
        clock.demote();
        assert_eq!(clock.poll_round(round, now, &mut cx), Poll::Ready(false), "deposed");
        clock.set_sole_voter(true);
        assert!(!clock.lock().rounds.sole, "only a leader is a sole voter leader");
    }
}
