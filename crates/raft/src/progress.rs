//! What a leader knows about each follower's log (etcd's `tracker/progress.go`, thesis §10.2).

use std::collections::VecDeque;

use crate::types::LogIndex;

/// How a leader sends entries to one follower.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProgressState {
    /// The follower's match index is unknown: send one Append at a time and wait for the answer.
    Probe,
    /// The follower is caught up to `next - 1`: stream Appends optimistically within the window.
    Replicate,
    /// The follower needs the snapshot at `pending`; send nothing until it is reported.
    Snapshot { pending: LogIndex },
}

/// The leader's view of one follower.
#[derive(Clone, Debug)]
pub struct Progress {
    /// The highest index known to match the leader's log.
    /// Invariant: `matched < next`.
    matched: LogIndex,
    /// The next index to send.
    next: LogIndex,
    state: ProgressState,
    /// In `Probe`, an Append is outstanding; cleared by a response or a heartbeat response.
    probe_sent: bool,
    /// Appends in flight in `Replicate`, by last index and bytes.
    /// Invariant: empty unless in `Replicate`; last indexes increase.
    inflights: Inflights,
    /// Heard from since the last check-quorum round.
    pub(crate) recent_active: bool,
    pub(crate) is_learner: bool,
}

impl Progress {
    pub(crate) fn new(next: LogIndex, is_learner: bool, window: Window) -> Progress {
        Progress {
            matched: LogIndex::ZERO,
            next,
            state: ProgressState::Probe,
            probe_sent: false,
            inflights: Inflights::new(window),
            recent_active: false,
            is_learner,
        }
    }

    pub fn matched(&self) -> LogIndex {
        self.matched
    }

    pub fn next(&self) -> LogIndex {
        self.next
    }

    pub fn state(&self) -> &ProgressState {
        &self.state
    }

    pub(crate) fn become_probe(&mut self) {
        // After a snapshot, resume right after it rather than at the old match.
        let after = match self.state {
            ProgressState::Snapshot { pending } => pending.max(self.matched).next(),
            _ => self.matched.next(),
        };
        self.state = ProgressState::Probe;
        self.next = after;
        self.probe_sent = false;
        self.inflights.reset();
    }

    pub(crate) fn become_replicate(&mut self) {
        self.state = ProgressState::Replicate;
        self.next = self.matched.next();
        self.probe_sent = false;
        self.inflights.reset();
    }

    pub(crate) fn become_snapshot(&mut self, pending: LogIndex) {
        self.state = ProgressState::Snapshot { pending };
        self.probe_sent = false;
        self.inflights.reset();
    }

    /// Whether the leader must hold back Appends to this follower.
    pub(crate) fn is_paused(&self) -> bool {
        match self.state {
            ProgressState::Probe => self.probe_sent,
            ProgressState::Replicate => self.inflights.full(),
            ProgressState::Snapshot { .. } => true,
        }
    }

    /// Records an Append carrying entries up to `last` (`bytes` in all).
    pub(crate) fn sent_entries(&mut self, last: Option<LogIndex>, bytes: u64) {
        match self.state {
            ProgressState::Replicate => {
                if let Some(last) = last {
                    self.next = last.next();
                    self.inflights.add(last, bytes);
                }
            }
            ProgressState::Probe => self.probe_sent = true,
            ProgressState::Snapshot { .. } => {}
        }
    }

    /// A follower acknowledged `index`. Returns whether the match index moved.
    pub(crate) fn maybe_update(&mut self, index: LogIndex) -> bool {
        let moved = index > self.matched;
        if moved {
            self.matched = index;
            self.probe_sent = false;
        }
        self.next = self.next.max(index.next());
        self.inflights.free_to(index);
        moved
    }

    /// A follower rejected an Append at `rejected`; `hint` is where its log may match. Returns
    /// whether the rejection was news (not a stale answer to an older Append).
    pub(crate) fn maybe_decr_to(&mut self, rejected: LogIndex, hint: LogIndex) -> bool {
        if self.state == ProgressState::Replicate {
            // Stale if we already know the follower matches at or beyond the rejected index.
            if rejected <= self.matched {
                return false;
            }
            self.next = self.matched.next();
            return true;
        }
        // In probe, only the answer to the latest probe (at next - 1) counts.
        if self.next.prev() != rejected {
            return false;
        }
        self.next = LogIndex(rejected.0.min(hint.0 + 1)).max(self.matched.next());
        self.probe_sent = false;
        true
    }

    /// A heartbeat response proves the follower is reachable: allow the next probe, and free one
    /// slot of a full window, whose Appends may all have been lost.
    pub(crate) fn on_heartbeat_resp(&mut self) {
        self.probe_sent = false;
        if self.state == ProgressState::Replicate && self.inflights.full() {
            self.inflights.free_first();
        }
    }

    pub(crate) fn check_invariants(&self) {
        assert!(self.matched < self.next, "progress match {} >= next {}", self.matched, self.next);
        if self.state != ProgressState::Replicate {
            assert!(self.inflights.is_empty(), "inflights outside replicate");
        }
    }
}

/// Limits of the in-flight window.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Window {
    pub(crate) max_msgs: usize,
    /// 0 means no byte limit.
    pub(crate) max_bytes: u64,
}

/// Appends sent to a follower and not yet acknowledged (the pipelining window).
#[derive(Clone, Debug)]
pub struct Inflights {
    window: Window,
    /// (last index, bytes) per Append. Invariant: last indexes increase; `len <= max_msgs`.
    queue: VecDeque<(LogIndex, u64)>,
    /// Invariant: the sum of `queue`'s bytes.
    bytes: u64,
}

impl Inflights {
    pub(crate) fn new(window: Window) -> Inflights {
        Inflights { window, queue: VecDeque::new(), bytes: 0 }
    }

    pub(crate) fn full(&self) -> bool {
        self.queue.len() >= self.window.max_msgs
            || (self.window.max_bytes > 0 && self.bytes >= self.window.max_bytes)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub(crate) fn add(&mut self, last: LogIndex, bytes: u64) {
        debug_assert!(self.queue.back().is_none_or(|(l, _)| *l < last));
        self.queue.push_back((last, bytes));
        self.bytes += bytes;
    }

    /// Frees every Append whose last index is at most `index`.
    pub(crate) fn free_to(&mut self, index: LogIndex) {
        while let Some(&(last, bytes)) = self.queue.front() {
            if last > index {
                break;
            }
            self.queue.pop_front();
            self.bytes -= bytes;
        }
    }

    pub(crate) fn free_first(&mut self) {
        if let Some((_, bytes)) = self.queue.pop_front() {
            self.bytes -= bytes;
        }
    }

    pub(crate) fn reset(&mut self) {
        self.queue.clear();
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Op {
        Send { entries: u64, bytes: u64 },
        Ack(u64),
        Reject { rejected: u64, hint: u64 },
        Heartbeat,
        Probe,
        Replicate,
        Snapshot(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u64..4, 1u64..50).prop_map(|(entries, bytes)| Op::Send { entries, bytes }),
            (0u64..40).prop_map(Op::Ack),
            (0u64..40, 0u64..40).prop_map(|(rejected, hint)| Op::Reject { rejected, hint }),
            Just(Op::Heartbeat),
            Just(Op::Probe),
            Just(Op::Replicate),
            (0u64..40).prop_map(Op::Snapshot),
        ]
    }

    proptest! {
        /// The window agrees with a plain queue of (last index, bytes), and the progress
        /// invariants (`matched < next`, no in-flight Appends outside replicate) always hold.
        #[test]
        fn progress_and_window_match_a_naive_model(ops in prop::collection::vec(op(), 1..80)) {
            let window = Window { max_msgs: 3, max_bytes: 100 };
            let mut pr = Progress::new(LogIndex(1), false, window);
            let mut naive: VecDeque<(u64, u64)> = VecDeque::new();
            let mut last_index = 10u64;
            for op in ops {
                match op {
                    Op::Send { entries, bytes } => {
                        if pr.is_paused() {
                            continue;
                        }
                        let last = (entries > 0).then(|| LogIndex(pr.next().0 + entries - 1));
                        if let Some(l) = last {
                            last_index = last_index.max(l.0);
                            if pr.state() == &ProgressState::Replicate {
                                naive.push_back((l.0, bytes));
                            }
                        }
                        pr.sent_entries(last, bytes);
                    }
                    Op::Ack(i) => {
                        let i = i.min(last_index);
                        pr.maybe_update(LogIndex(i));
                        naive.retain(|(l, _)| *l > i);
                    }
                    Op::Reject { rejected, hint } => {
                        if pr.maybe_decr_to(LogIndex(rejected), LogIndex(hint))
                            && pr.state() == &ProgressState::Replicate
                        {
                            pr.become_probe();
                            naive.clear();
                        }
                    }
                    Op::Heartbeat => {
                        let was_full = pr.state() == &ProgressState::Replicate && pr.inflights.full();
                        pr.on_heartbeat_resp();
                        if was_full {
                            naive.pop_front();
                        }
                    }
                    Op::Probe => {
                        pr.become_probe();
                        naive.clear();
                    }
                    Op::Replicate => {
                        pr.become_replicate();
                        naive.clear();
                    }
                    Op::Snapshot(i) => {
                        pr.become_snapshot(LogIndex(i));
                        naive.clear();
                    }
                }
                pr.check_invariants();
                let naive_bytes: u64 = naive.iter().map(|(_, b)| b).sum();
                let naive_full = naive.len() >= 3 || naive_bytes >= 100;
                prop_assert_eq!(pr.inflights.full(), naive_full);
                prop_assert_eq!(pr.inflights.is_empty(), naive.is_empty());
                prop_assert_eq!(pr.inflights.bytes, naive_bytes);
            }
        }
    }
}
