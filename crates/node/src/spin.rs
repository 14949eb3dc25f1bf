//! Waiting awake: a thread that expects its next event soon looks for it, for a while, instead
//! of sleeping.
//!
//! A sleeping thread must be woken: whoever has its event writes an eventfd (or a socket), and
//! the thread, asleep in `epoll_wait` on a core that halted, is scheduled again. On a VM without
//! halt polling (this project's benchmark machine: `haltpoll.guest_halt_poll_ns=0`) that costs
//! 40-110 µs, and a put on 3 members pays it several times on its path: the leader's driver for
//! the proposal and for the acknowledgements, each follower's driver for the append, the
//! leader's runtime thread for the answer. Two waits are awake for up to `--spin-wait`:
//! - the driver's, after a turn that had work (`driver.rs`): it looks at its queue and its
//!   peers' sockets;
//! - a lone request's caller, waiting for its answer ([`AnswerSpin`]): it looks at its channel
//!   between the runtime's other work (`yield_now`, which also polls the runtime's sockets
//!   without sleeping). Only a request with no other in flight does: with others in flight the
//!   runtime has their work to do and its thread would not sleep anyway, and callers that all
//!   waited awake cost 100-client puts 4-15%.
//!
//! Each look first yields the core to any thread that wants it ([`std::thread::yield_now`],
//! `sched_yield`), so a wait takes only time no one else would use: without that, the callers
//! waiting awake held up the drivers sharing their cores and a 1-client put's p99 rose by a
//! third, and drivers waiting awake lost 15-20% of the puts. With it, 1-client puts on 3
//! members went from a median of 1,476 to 2,192 ops/s with the callers' wait, and from 2,165 to
//! 2,547-2,619 with the drivers' as well (bench/results/2026-11-29-spin-wait.md).
//!
//! A wait is skipped while fewer than half of the recent waits caught their event within the
//! bound ([`SpinPolicy`]): a member whose events come later (a slow disk, an idle cluster's
//! heartbeats) sleeps at once, but for one wait in eight, which looks again to see whether they
//! have become faster. Judging by the time events take would be a trap: a sleeper's time
//! includes the very wakeup waiting awake saves, so once asleep a member would look too slow to
//! ever wait awake again (an earlier rule did exactly that, and lost the gain in two of three
//! runs).
//!
//! The time a wait takes shows as the member's CPU use. Under a CPU quota it is not idle time:
//! it counts against the quota, so `cairn serve` sets no wait there (`cpu_quota.rs` in the
//! server).

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::oneshot::{self, error::TryRecvError};

/// The share of waits that caught their event is kept in 1/1024ths.
const ALL: u32 = 1024;
/// One wait in this many looks whatever the share, to measure it again.
const PROBE_EVERY: u32 = 8;

/// Whether a thread waits awake, and for how long at most: the bound, and how recent waits
/// fared.
#[derive(Debug)]
pub(crate) struct SpinPolicy {
    /// The longest a wait is awake; zero never.
    max: Duration,
    /// A moving average of whether waits caught their event within `max`, in 1/1024ths; it
    /// starts at all of them.
    caught: AtomicU32,
    /// Waits so far, to pick the probes.
    tries: AtomicU32,
}

impl SpinPolicy {
    pub(crate) fn new(max: Duration) -> SpinPolicy {
        SpinPolicy { max, caught: AtomicU32::new(ALL), tries: AtomicU32::new(0) }
    }

    /// How long this wait may be awake: `None` to sleep at once.
    pub(crate) fn begin(&self) -> Option<Duration> {
        let nth = self.tries.fetch_add(1, Ordering::Relaxed);
        let awake = !self.max.is_zero() && waits_awake(self.caught.load(Ordering::Relaxed), nth);
        awake.then_some(self.max)
    }

    /// How a wait that began awake ended: its event caught, or the bound passed first.
    pub(crate) fn record(&self, caught: bool) {
        let old = self.caught.load(Ordering::Relaxed);
        // Each user's waits follow one another, so a race loses at most one sample.
        self.caught.store(average(old, caught), Ordering::Relaxed);
    }
}

/// The engine's requests in flight, and the policy of lone ones' waits.
#[derive(Debug)]
pub(crate) struct AnswerSpin {
    policy: SpinPolicy,
    in_flight: AtomicUsize,
}

/// One request in flight, counted from before it is sent until its answer or its drop.
#[derive(Debug)]
pub(crate) struct Asking<'a> {
    spin: &'a AnswerSpin,
    /// No other request of the engine was in flight when this one began.
    lone: bool,
}

impl AnswerSpin {
    pub(crate) fn new(max: Duration) -> AnswerSpin {
        AnswerSpin { policy: SpinPolicy::new(max), in_flight: AtomicUsize::new(0) }
    }

    /// Counts a request in flight: call before it is sent, so that a second caller that sends
    /// meanwhile sees this one.
    pub(crate) fn begin(&self) -> Asking<'_> {
        let before = self.in_flight.fetch_add(1, Ordering::SeqCst);
        Asking { spin: self, lone: before == 0 }
    }
}

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        self.spin.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Asking<'_> {
    /// Waits for the answer: awake for up to the bound if this request is lone and the policy
    /// allows, then parked. `None`: the sender is gone.
    pub(crate) async fn wait<T>(self, rx: &mut oneshot::Receiver<T>) -> Option<T> {
        let policy = &self.spin.policy;
        let Some(max) = self.lone.then(|| policy.begin()).flatten() else {
            return rx.await.ok();
        };
        let start = Instant::now();
        loop {
            match rx.try_recv() {
                Ok(answer) => {
                    policy.record(true);
                    return Some(answer);
                }
                // A receiver that saw the end must not be polled again.
                Err(TryRecvError::Closed) => return None,
                Err(TryRecvError::Empty) if start.elapsed() >= max => {
                    policy.record(false);
                    return rx.await.ok();
                }
                Err(TryRecvError::Empty) => {
                    // The core first to any thread that wants it.
                    std::thread::yield_now();
                    tokio::task::yield_now().await
                }
            }
        }
    }
}

/// Whether the `nth` wait is awake, given the share `caught` (in 1/1024ths) of recent waits
/// that caught their event within the bound: while it is half or more, and for every eighth
/// wait whatever it is.
fn waits_awake(caught: u32, nth: u32) -> bool {
    caught >= ALL / 2 || nth.is_multiple_of(PROBE_EVERY)
}

/// An exponential moving average of catches, with weight 1/8 for the new one.
fn average(old: u32, caught: bool) -> u32 {
    let sample = if caught { ALL } else { 0 };
    old - old / 8 + sample / 8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lone_requests_wait_awake_while_most_are_caught_and_probe_otherwise() {
        assert!(waits_awake(ALL, 1));
        assert!(waits_awake(ALL / 2, 3));
        assert!(!waits_awake(ALL / 2 - 1, 3), "mostly missed: parked");
        let probes = (0..64).filter(|&n| waits_awake(0, n)).count();
        assert_eq!(probes, 8, "one in eight still waits awake");
    }

    #[test]
    fn the_share_caught_follows_the_outcomes() {
        let mut share = ALL;
        let mut misses = 0;
        while share >= ALL / 2 {
            share = average(share, false);
            misses += 1;
        }
        assert_eq!(misses, 6, "six misses in a row turn it off");
        assert!(average(share, true) >= ALL / 2, "one hit then turns it on again");
        for _ in 0..100 {
            share = average(share, true);
        }
        assert!(share > ALL - 8 && share <= ALL, "{share}");
    }

    #[test]
    fn waiting_awake_is_off_with_a_zero_bound() {
        let policy = SpinPolicy::new(Duration::ZERO);
        assert!((0..16).all(|_| policy.begin().is_none()));
    }

    #[test]
    fn a_policy_that_misses_sleeps_but_probes() {
        let policy = SpinPolicy::new(Duration::from_micros(500));
        assert_eq!(policy.begin(), Some(Duration::from_micros(500)));
        for _ in 0..6 {
            policy.record(false);
        }
        let awake = (0..64).filter(|_| policy.begin().is_some()).count();
        assert_eq!(awake, 8, "only the probes wait awake");
        policy.record(true);
        assert!(policy.begin().is_some(), "a probe that caught its event turns it on again");
    }

    #[test]
    fn only_a_request_alone_in_flight_is_lone() {
        let spin = AnswerSpin::new(Duration::from_millis(1));
        let first = spin.begin();
        let second = spin.begin();
        assert!(first.lone);
        assert!(!second.lone);
        drop(first);
        drop(second);
        assert!(spin.begin().lone, "both ended: the next is alone again");
    }

    #[tokio::test]
    async fn an_answer_sent_while_a_lone_request_waits_awake_is_caught() {
        let spin = AnswerSpin::new(Duration::from_secs(5));
        spin.policy.caught.store(ALL / 2, Ordering::Relaxed);
        let (tx, mut rx) = oneshot::channel();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            tx.send(7u32).expect("the receiver waits");
        });
        assert_eq!(spin.begin().wait(&mut rx).await, Some(7));
        sender.join().expect("the sender ends");
        assert!(spin.policy.caught.load(Ordering::Relaxed) > ALL / 2, "counted as caught");
        assert_eq!(spin.in_flight.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn an_answer_later_than_the_bound_is_still_taken_parked() {
        let spin = AnswerSpin::new(Duration::from_micros(200));
        let (tx, mut rx) = oneshot::channel();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            tx.send(()).expect("the receiver waits");
        });
        assert_eq!(spin.begin().wait(&mut rx).await, Some(()));
        sender.join().expect("the sender ends");
        assert!(spin.policy.caught.load(Ordering::Relaxed) < ALL, "counted as missed");
    }

    #[tokio::test]
    async fn a_dropped_sender_ends_the_wait() {
        let spin = AnswerSpin::new(Duration::from_secs(5));
        let (tx, mut rx) = oneshot::channel::<()>();
        drop(tx);
        assert_eq!(spin.begin().wait(&mut rx).await, None);
    }
}
