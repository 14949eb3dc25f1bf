//! The leader: replication (§5.3), commitment (§5.4.2), heartbeats, check-quorum, ReadIndex and
//! leases (§6.4), snapshots for lagging followers (§7) and leadership transfer (§3.10).

use crate::config::PlantedBugSwitch;
use crate::message::{Message, MessageBody, RejectHint};
use crate::progress::ProgressState;
use crate::raft::{Raft, SnapshotStatus};
use crate::reads::ReadRequest;
use crate::ready::ReadState;
use crate::types::{LogIndex, NodeId, Term};

impl Raft {
    pub(crate) fn tick_leader(&mut self) {
        self.heartbeat_elapsed += 1;
        self.election_elapsed += 1;
        if self.election_elapsed >= self.cfg.election_timeout_ticks {
            self.election_elapsed = 0;
            if self.cfg.check_quorum {
                if !self.tracker.quorum_active(self.id) {
                    // Without a quorum this leader cannot commit, and a new leader may already
                    // exist: step down so clients go elsewhere (thesis §6.2).
                    self.become_follower(self.term, None);
                    return;
                }
                self.tracker.clear_recent_active();
            }
            // A transfer that did not finish within an election timeout is abandoned.
            self.lead_transferee = None;
        }
        if self.heartbeat_elapsed >= self.cfg.heartbeat_interval_ticks {
            self.heartbeat_elapsed = 0;
            self.bcast_heartbeat();
        }
        let lease_ticks = self.lease_ticks();
        self.reads.prune(self.ticks, lease_ticks);
    }

    pub(crate) fn step_leader(&mut self, msg: Message) {
        let from = msg.from;
        match msg.body {
            MessageBody::AppendResp { index, reject } => {
                if let Some(pr) = self.tracker.progress_mut(from) {
                    pr.recent_active = true;
                } else {
                    return;
                }
                match reject {
                    Some(hint) => self.on_append_reject(from, index, hint),
                    None => self.on_append_ack(from, index),
                }
            }
            MessageBody::HeartbeatResp { seq } => {
                let Some(pr) = self.tracker.progress_mut(from) else {
                    return;
                };
                pr.recent_active = true;
                pr.on_heartbeat_resp();
                if pr.matched() < self.log.last_index() {
                    // Appends may have been lost: send one even if it carries no entries. A
                    // follower missing entries rejects it, and the leader probes back (etcd does
                    // the same).
                    self.maybe_send_append(from, true);
                }
                self.on_heartbeat_echo(from, seq);
            }
            _ => {}
        }
    }

    fn on_append_reject(&mut self, from: NodeId, rejected: LogIndex, hint: RejectHint) {
        // The follower told us its term at its hint; skip back over everything of a later term
        // in our log in one step rather than one index per round trip.
        let next_probe = if hint.term > Term(0) {
            self.log.find_conflict_by_term(hint.index, hint.term).0
        } else {
            hint.index
        };
        let Some(pr) = self.tracker.progress_mut(from) else {
            return;
        };
        if pr.maybe_decr_to(rejected, next_probe) {
            if pr.state() == &ProgressState::Replicate {
                pr.become_probe();
            }
            self.maybe_send_append(from, true);
        }
    }

    fn on_append_ack(&mut self, from: NodeId, index: LogIndex) {
        let Some(pr) = self.tracker.progress_mut(from) else {
            return;
        };
        let was_paused = pr.is_paused();
        if !pr.maybe_update(index) {
            return;
        }
        match *pr.state() {
            ProgressState::Probe => pr.become_replicate(),
            ProgressState::Snapshot { pending } if pr.matched() >= pending => {
                pr.become_probe();
                pr.become_replicate();
            }
            _ => {}
        }
        if self.maybe_commit() {
            self.bcast_append();
        } else if was_paused {
            // It was skipped while paused, so it may not know the commit index: tell it.
            self.maybe_send_append(from, true);
        }
        // Fill the window while there is more to send.
        while self.maybe_send_append(from, false) {}
        if self.lead_transferee == Some(from)
            && self.tracker.progress(from).is_some_and(|p| p.matched() == self.log.last_index())
        {
            self.send_timeout_now(from);
        }
    }

    /// Commits the highest index a quorum has persisted, if it belongs to this term (§5.4.2: an
    /// entry of an earlier term is never committed by counting replicas). Returns whether the
    /// commit index moved.
    pub(crate) fn maybe_commit(&mut self) -> bool {
        let index = self.tracker.committed_index();
        if index <= self.log.committed() {
            return false;
        }
        let current_term = self.log.term(index) == Some(self.term);
        if !current_term && !self.cfg.has_bug(PlantedBugSwitch::CommitPreviousTerm) {
            return false;
        }
        let first_of_term = self.log.term(self.log.committed()) != Some(self.term);
        self.log.commit_to(index);
        if first_of_term {
            for req in self.reads.take_waiting_for_term_commit() {
                self.leader_read(req);
            }
        }
        true
    }

    pub(crate) fn bcast_append(&mut self) {
        let peers: Vec<NodeId> = self.tracker.peers().filter(|id| *id != self.id).collect();
        for id in peers {
            self.maybe_send_append(id, true);
        }
    }

    /// Sends `to` the entries it lacks, or a snapshot if we compacted them away. With
    /// `send_if_empty` an Append goes out even without entries, to carry the commit index.
    /// Returns whether a message was sent.
    pub(crate) fn maybe_send_append(&mut self, to: NodeId, send_if_empty: bool) -> bool {
        let Some(pr) = self.tracker.progress(to) else {
            return false;
        };
        if pr.is_paused() {
            return false;
        }
        let next = pr.next();
        let prev_index = next.prev();
        let Some(prev_term) = self.log.term(prev_index) else {
            return self.send_snapshot(to);
        };
        let entries = if next >= self.log.first_index() {
            self.log.slice(next, self.log.last_index(), self.cfg.max_msg_bytes)
        } else {
            Vec::new()
        };
        if entries.is_empty() && !send_if_empty {
            return false;
        }
        let last = entries.last().map(|e| e.index);
        let bytes = entries.iter().map(|e| e.size_bytes()).sum();
        if let Some(pr) = self.tracker.progress_mut(to) {
            pr.sent_entries(last, bytes);
        }
        let commit = self.log.committed();
        self.send(to, self.term, MessageBody::Append { prev_index, prev_term, entries, commit });
        true
    }

    fn send_snapshot(&mut self, to: NodeId) -> bool {
        let snapshot = self.log.snapshot().clone();
        if let Some(pr) = self.tracker.progress_mut(to) {
            pr.become_snapshot(snapshot.meta.index);
        }
        self.send(to, self.term, MessageBody::Snapshot { snapshot });
        true
    }

    pub(crate) fn on_snapshot_status(&mut self, to: NodeId, status: SnapshotStatus) {
        let Some(pr) = self.tracker.progress_mut(to) else {
            return;
        };
        if !matches!(pr.state(), ProgressState::Snapshot { .. }) {
            return;
        }
        if status == SnapshotStatus::Failed {
            // Forget the pending snapshot so that probing starts over from the match index.
            pr.become_snapshot(pr.matched());
        }
        // Resume probing; the follower's answer (or the next heartbeat) moves it on.
        pr.become_probe();
        pr.sent_entries(None, 0);
    }

    /// Sends a heartbeat to every member, starting a new broadcast that carries queued reads.
    pub(crate) fn bcast_heartbeat(&mut self) {
        let seq = self.reads.next_broadcast(self.log.committed(), self.ticks);
        let peers: Vec<NodeId> = self.tracker.peers().filter(|id| *id != self.id).collect();
        for to in peers {
            let Some(pr) = self.tracker.progress(to) else {
                continue;
            };
            // Never tell a follower a commit index beyond what it is known to hold.
            let commit = pr.matched().min(self.log.committed());
            self.send(to, self.term, MessageBody::Heartbeat { commit, seq });
        }
        // Alone, the leader's own echo is the quorum.
        self.on_heartbeat_echo(self.id, seq);
    }

    fn on_heartbeat_echo(&mut self, from: NodeId, seq: crate::message::HeartbeatSeq) {
        let me = self.id;
        let current = self.reads.current_seq();
        let quorum = self.tracker.quorum().clone();
        let lease = self.lease_enabled().then(|| self.lease_ticks());
        let released = self.reads.ack(
            from,
            seq,
            |acked| {
                let s = quorum.committed_index(|id| {
                    Some(if id == me { current.0 } else { acked.get(&id).map_or(0, |s| s.0) })
                });
                crate::message::HeartbeatSeq(s)
            },
            lease,
        );
        for (index, req) in released {
            self.answer_read(index, req);
        }
    }

    /// A read on the leader: served now, after the next heartbeat round, or after this term's
    /// first commit.
    pub(crate) fn leader_read(&mut self, req: ReadRequest) {
        if self.log.term(self.log.committed()) != Some(self.term) {
            self.reads.wait_for_term_commit(req);
        } else if self.tracker.is_sole_voter(self.id)
            || (self.lease_enabled() && self.reads.lease_valid(self.ticks))
            || self.cfg.has_bug(PlantedBugSwitch::ReadSkipsQuorum)
        {
            self.answer_read(self.log.committed(), req);
        } else {
            self.reads.queue(req);
        }
    }

    fn answer_read(&mut self, index: LogIndex, req: ReadRequest) {
        match req.from {
            None => self.read_states.push(ReadState { index, ctx: req.ctx }),
            Some(from) if from == self.id => {
                self.read_states.push(ReadState { index, ctx: req.ctx });
            }
            Some(from) => {
                let body = MessageBody::ReadIndexResp { ctxs: vec![req.ctx], index };
                self.send(from, Term(0), body);
            }
        }
    }

    pub(crate) fn start_transfer(&mut self, target: NodeId) {
        if target == self.id || self.lead_transferee == Some(target) {
            return;
        }
        self.lead_transferee = Some(target);
        // The transfer gets one election timeout to finish.
        self.election_elapsed = 0;
        let caught_up =
            self.tracker.progress(target).is_some_and(|p| p.matched() == self.log.last_index());
        if caught_up {
            self.send_timeout_now(target);
        } else {
            self.maybe_send_append(target, true);
        }
    }

    pub(crate) fn send_timeout_now(&mut self, to: NodeId) {
        // The target will campaign past the followers' lease check, so this leader's lease can no
        // longer be trusted for the rest of the term.
        self.lease_forfeited = true;
        self.reads.revoke_lease();
        self.send(to, self.term, MessageBody::TimeoutNow);
    }

    /// Sends what was batched since the last `Ready`: new entries and queued reads.
    pub(crate) fn flush_leader(&mut self) {
        if self.needs_bcast {
            self.needs_bcast = false;
            self.bcast_append();
        }
        if self.reads.has_queued() {
            self.heartbeat_elapsed = 0;
            self.bcast_heartbeat();
        }
    }
}
