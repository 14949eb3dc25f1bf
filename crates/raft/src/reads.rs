//! Linearizable reads on the leader: ReadIndex batched per heartbeat round, and the leader lease.
//!
//! Every heartbeat broadcast carries a fresh [`HeartbeatSeq`] and followers echo it. When a quorum
//! has echoed sequence `s`, the leader knows it was still leader when it sent broadcast `s`:
//! - every read queued before broadcast `s` was sent may be served at the commit index recorded
//!   when its round began (thesis §6.4); reads that arrive later wait for a later broadcast, so an
//!   index is never reused for a read that began after it was taken;
//! - with lease reads, no other leader can be elected until an election timeout after the
//!   followers received broadcast `s`, so the leader may answer alone until
//!   `sent_tick(s) + election_timeout - margin` (thesis §6.4.1).

use std::collections::{BTreeMap, VecDeque};

use crate::message::HeartbeatSeq;
use crate::types::{LogIndex, NodeId, ReadCtx};

/// Who asked for a read: this node's driver, or a follower that forwarded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ReadRequest {
    pub(crate) ctx: ReadCtx,
    pub(crate) from: Option<NodeId>,
}

/// Reads confirmed by one heartbeat broadcast.
#[derive(Debug)]
struct Round {
    seq: HeartbeatSeq,
    index: LogIndex,
    requests: Vec<ReadRequest>,
}

/// The leader's read bookkeeping for one term. Built anew whenever a node becomes leader.
#[derive(Debug, Default)]
pub(crate) struct ReadOnly {
    /// The latest broadcast. Invariant: every `sent` and `rounds` entry is at most this.
    seq: HeartbeatSeq,
    /// Send tick of recent broadcasts, oldest first, for the lease.
    sent: VecDeque<(HeartbeatSeq, u64)>,
    /// The highest broadcast each follower echoed.
    acked: BTreeMap<NodeId, HeartbeatSeq>,
    /// Rounds waiting for a quorum. Invariant: sequences increase.
    rounds: VecDeque<Round>,
    /// Reads not yet in a round; the next broadcast takes them all.
    queued: Vec<ReadRequest>,
    /// Reads that arrived before the leader committed an entry of its term: until then its commit
    /// index may be behind what an earlier leader committed (thesis §6.4 step 1).
    before_term_commit: Vec<ReadRequest>,
    /// Tick until which the lease lets the leader answer alone (exclusive).
    lease_until_tick: Option<u64>,
}

impl ReadOnly {
    pub(crate) fn queue(&mut self, req: ReadRequest) {
        self.queued.push(req);
    }

    pub(crate) fn wait_for_term_commit(&mut self, req: ReadRequest) {
        self.before_term_commit.push(req);
    }

    pub(crate) fn take_waiting_for_term_commit(&mut self) -> Vec<ReadRequest> {
        std::mem::take(&mut self.before_term_commit)
    }

    pub(crate) fn has_queued(&self) -> bool {
        !self.queued.is_empty()
    }

    /// Starts a heartbeat broadcast at `now_tick`; queued reads ride on it at `commit`.
    pub(crate) fn next_broadcast(&mut self, commit: LogIndex, now_tick: u64) -> HeartbeatSeq {
        self.seq = HeartbeatSeq(self.seq.0 + 1);
        self.sent.push_back((self.seq, now_tick));
        if !self.queued.is_empty() {
            let requests = std::mem::take(&mut self.queued);
            self.rounds.push_back(Round { seq: self.seq, index: commit, requests });
        }
        self.seq
    }

    pub(crate) fn current_seq(&self) -> HeartbeatSeq {
        self.seq
    }

    /// Records a follower's echo. Returns the reads now confirmed, with their index.
    pub(crate) fn ack(
        &mut self,
        from: NodeId,
        seq: HeartbeatSeq,
        quorum_seq: impl Fn(&BTreeMap<NodeId, HeartbeatSeq>) -> HeartbeatSeq,
        lease_ticks: Option<u64>,
    ) -> Vec<(LogIndex, ReadRequest)> {
        let slot = self.acked.entry(from).or_default();
        *slot = (*slot).max(seq);
        let confirmed = quorum_seq(&self.acked);
        if let Some(lease_ticks) = lease_ticks {
            if let Some(&(_, tick)) = self.sent.iter().find(|(s, _)| *s == confirmed) {
                let until = tick + lease_ticks;
                self.lease_until_tick = Some(self.lease_until_tick.map_or(until, |u| u.max(until)));
            }
        }
        while self.sent.front().is_some_and(|(s, _)| *s < confirmed) {
            self.sent.pop_front();
        }
        let mut released = Vec::new();
        while self.rounds.front().is_some_and(|r| r.seq <= confirmed) {
            if let Some(round) = self.rounds.pop_front() {
                released.extend(round.requests.into_iter().map(|r| (round.index, r)));
            }
        }
        released
    }

    /// Forgets broadcasts too old to extend the lease, bounding memory while followers are silent.
    pub(crate) fn prune(&mut self, now_tick: u64, lease_ticks: u64) {
        // Keep the newest entry so that a late quorum of echoes can still be matched.
        while self.sent.len() > 1
            && self.sent.front().is_some_and(|(_, t)| t + lease_ticks <= now_tick)
        {
            self.sent.pop_front();
        }
    }

    pub(crate) fn lease_valid(&self, now_tick: u64) -> bool {
        self.lease_until_tick.is_some_and(|until| now_tick < until)
    }

    pub(crate) fn revoke_lease(&mut self) {
        self.lease_until_tick = None;
    }

    pub(crate) fn pending_rounds(&self) -> usize {
        self.rounds.len()
    }

    pub(crate) fn check_invariants(&self) {
        for w in self.rounds.iter().collect::<Vec<_>>().windows(2) {
            assert!(w[0].seq < w[1].seq, "read rounds out of order");
        }
        assert!(self.rounds.iter().all(|r| r.seq <= self.seq), "round from the future");
        assert!(self.sent.iter().all(|(s, _)| *s <= self.seq), "broadcast from the future");
    }
}
