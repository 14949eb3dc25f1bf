//! Elections: timers, pre-vote, campaigns, votes, and the role changes they cause (§5.2, §9.6).

use crate::config::PlantedBugSwitch;
use crate::message::{Message, MessageBody};
use crate::quorum::VoteResult;
use crate::raft::Raft;
use crate::types::{Entry, EntryPayload, NodeId, Role, Term};

impl Raft {
    /// A follower's or candidate's tick: campaign once the randomized election timeout passes.
    pub(crate) fn tick_election(&mut self) {
        self.election_elapsed = self.election_elapsed.saturating_add(1);
        if self.election_elapsed >= self.cfg.election_timeout_ticks {
            self.startup_quiet = false;
        }
        // Only a node that can campaign restarts its timer. One that cannot (a learner, a node
        // outside the configuration) must keep counting: its timer also decides whether it is
        // still in a leader's lease, and a timer reset forever would keep it refusing every vote
        // request (the simulator found a cluster stuck that way; etcd behaves the same).
        if self.election_elapsed >= self.randomized_election_timeout && self.promotable() {
            self.election_elapsed = 0;
            self.hup(false);
        }
    }

    /// Starts an election if this node may lead: a pre-vote round first when configured, unless
    /// the campaign was ordered by a leadership transfer.
    pub(crate) fn hup(&mut self, transfer: bool) {
        if self.role == Role::Leader || !self.promotable() {
            return;
        }
        if self.cfg.pre_vote && !transfer {
            self.start_campaign(true, false);
        } else {
            self.start_campaign(false, transfer);
        }
    }

    /// Only a voter whose applied configuration is current may campaign: with membership changes
    /// still unapplied it might count votes against a stale configuration (etcd does the same).
    pub(crate) fn promotable(&self) -> bool {
        let unapplied_conf_change = self.log.entries().iter().any(|e| {
            e.index > self.log.applied()
                && e.index <= self.log.committed()
                && matches!(e.payload, EntryPayload::ConfChange(_))
        });
        self.tracker.is_voter(self.id) && !unapplied_conf_change && !self.log_has_pending_snapshot()
    }

    fn log_has_pending_snapshot(&self) -> bool {
        self.log.applied() < self.log.snapshot().meta.index
    }

    fn start_campaign(&mut self, pre_vote: bool, transfer: bool) {
        let vote_term = if pre_vote {
            self.become_pre_candidate();
            self.term.next()
        } else {
            self.become_candidate();
            self.term
        };
        self.tracker.record_vote(self.id, true);
        if self.tracker.vote_result() == VoteResult::Won {
            // A sole voter wins at once.
            if pre_vote {
                self.start_campaign(false, transfer);
            } else {
                self.become_leader();
            }
            return;
        }
        let (last_index, last_term) = (self.log.last_index(), self.log.last_term());
        let voters: Vec<NodeId> =
            self.tracker.quorum().voters().into_iter().filter(|id| *id != self.id).collect();
        for to in voters {
            let body = MessageBody::Vote { pre_vote, last_index, last_term, transfer };
            self.send(to, vote_term, body);
        }
    }

    pub(crate) fn become_follower(&mut self, term: Term, leader: Option<NodeId>) {
        self.reset(term);
        self.role = Role::Follower;
        self.leader = leader;
    }

    fn become_pre_candidate(&mut self) {
        // A pre-candidate keeps its term and vote: it only asks whether it could win.
        self.role = Role::PreCandidate;
        self.leader = None;
        self.tracker.reset_votes();
        self.reset_randomized_election_timeout();
    }

    fn become_candidate(&mut self) {
        self.reset(self.term.next());
        self.role = Role::Candidate;
        self.vote = Some(self.id);
    }

    pub(crate) fn become_leader(&mut self) {
        assert_eq!(self.role, Role::Candidate, "only a candidate becomes leader");
        self.reset(self.term);
        self.role = Role::Leader;
        self.leader = Some(self.id);
        // Conf changes already in the log may still be unapplied: no new one until they are.
        self.pending_conf_index = self.log.last_index();
        let synced = self.log.synced();
        if let Some(pr) = self.tracker.progress_mut(self.id) {
            pr.become_replicate();
            pr.maybe_update(synced);
        }
        // Commit an entry of the new term: that commits everything before it (§5.4.2) and tells
        // the leader its true commit index, which ReadIndex needs (§6.4).
        self.append_payloads(vec![EntryPayload::Normal(bytes::Bytes::new())]);
    }

    /// A message with a higher term arrived. Returns false if it must be ignored.
    pub(crate) fn accept_higher_term(&mut self, msg: &Message) -> bool {
        match msg.body {
            MessageBody::Vote { pre_vote, transfer, .. } => {
                // While a leader is known to be alive (or may hold a lease granted by us before a
                // restart), refuse to help anyone depose it, unless the leader itself asked.
                let in_lease = self.cfg.check_quorum
                    && (self.leader.is_some() || self.startup_quiet)
                    && self.election_elapsed < self.cfg.election_timeout_ticks;
                if in_lease && !transfer {
                    return false;
                }
                if !pre_vote {
                    self.become_follower(msg.term, None);
                }
                true
            }
            // A granted pre-vote answers with the future term; it is not a reason to adopt it.
            MessageBody::VoteResp { pre_vote: true, granted: true } => true,
            MessageBody::Append { .. }
            | MessageBody::Heartbeat { .. }
            | MessageBody::Snapshot { .. } => {
                self.become_follower(msg.term, Some(msg.from));
                true
            }
            _ => {
                self.become_follower(msg.term, None);
                true
            }
        }
    }

    /// A message from an older term. Tell a deposed leader or a stale pre-candidate our term so
    /// it catches up; ignore the rest.
    pub(crate) fn on_stale_term(&mut self, msg: &Message) {
        match msg.body {
            MessageBody::Append { .. } | MessageBody::Heartbeat { .. }
                if self.cfg.check_quorum || self.cfg.pre_vote =>
            {
                // Without this, a leader partitioned away with check-quorum off never learns the
                // new term, and a pre-vote cluster can deadlock (etcd raft #5451).
                let body = MessageBody::AppendResp { index: self.log.committed(), reject: None };
                self.send(msg.from, self.term, body);
            }
            MessageBody::Vote { pre_vote: true, .. } => {
                let body = MessageBody::VoteResp { pre_vote: true, granted: false };
                self.send(msg.from, self.term, body);
            }
            _ => {}
        }
    }

    /// RequestVote (§5.2, §5.4.1) and pre-vote (§9.6), at a term no older than ours.
    pub(crate) fn on_vote_request(&mut self, msg: Message) {
        let MessageBody::Vote { pre_vote, last_index, last_term, .. } = msg.body else {
            return;
        };
        let can_vote = self.vote == Some(msg.from)
            || (self.vote.is_none() && self.leader.is_none())
            || (pre_vote && msg.term > self.term);
        let up_to_date = self.log.is_up_to_date(last_index, last_term)
            || self.cfg.has_bug(PlantedBugSwitch::VoteIgnoresLog);
        if can_vote && up_to_date {
            self.send(msg.from, msg.term, MessageBody::VoteResp { pre_vote, granted: true });
            if !pre_vote {
                self.election_elapsed = 0;
                self.vote = Some(msg.from);
            }
        } else {
            self.send(msg.from, self.term, MessageBody::VoteResp { pre_vote, granted: false });
        }
    }

    pub(crate) fn step_candidate(&mut self, msg: Message) {
        match msg.body {
            MessageBody::Append { .. }
            | MessageBody::Heartbeat { .. }
            | MessageBody::Snapshot { .. } => {
                // A leader of our term exists (§5.2): follow it.
                self.become_follower(msg.term, Some(msg.from));
                self.step_follower(msg);
            }
            MessageBody::VoteResp { pre_vote, granted } => {
                let ours = pre_vote == (self.role == Role::PreCandidate);
                if !ours {
                    return;
                }
                self.tracker.record_vote(msg.from, granted);
                match self.tracker.vote_result() {
                    VoteResult::Won if pre_vote => self.start_campaign(false, false),
                    VoteResult::Won => self.become_leader(),
                    VoteResult::Lost => self.become_follower(self.term, None),
                    VoteResult::Pending => {}
                }
            }
            _ => {}
        }
    }

    /// Appends entries of the leader's term and counts the leader's own copy once durable.
    pub(crate) fn append_payloads(&mut self, payloads: Vec<EntryPayload>) {
        let mut index = self.log.last_index();
        let term = self.term;
        let entries = payloads.into_iter().map(|payload| {
            index = index.next();
            if matches!(payload, EntryPayload::ConfChange(_)) {
                self.pending_conf_index = index;
            }
            Entry { term, index, payload }
        });
        let entries: Vec<Entry> = entries.collect();
        self.log.append_new(entries);
        self.needs_bcast = true;
        // A sole voter commits as soon as its own write is durable, in `advance`.
    }
}
