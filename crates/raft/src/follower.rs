//! The follower: accepting entries (§5.3), heartbeats, snapshots (§7), and transfer orders.

use crate::message::{Message, MessageBody, RejectHint};
use crate::raft::Raft;
use crate::types::{LogIndex, Role};

impl Raft {
    pub(crate) fn step_follower(&mut self, msg: Message) {
        match msg.body {
            MessageBody::Append { prev_index, prev_term, entries, commit } => {
                self.heard_from_leader(&msg.from);
                let resp = self.on_append(prev_index, prev_term, &entries, commit);
                self.send(msg.from, self.term, resp);
            }
            MessageBody::Heartbeat { commit, seq } => {
                self.heard_from_leader(&msg.from);
                // The leader sends at most the index we acknowledged. Beyond our log, we lost
                // acknowledged entries: committing what we hold instead could apply entries
                // the leader never had, so we answer nothing and report it.
                if commit > self.log.last_index() {
                    self.lost_log = Some((self.log.last_index(), commit));
                    return;
                }
                self.log.commit_to(commit);
                self.send(msg.from, self.term, MessageBody::HeartbeatResp { seq });
            }
            MessageBody::Snapshot { snapshot } => {
                self.heard_from_leader(&msg.from);
                let index = self.on_snapshot(snapshot);
                self.send(msg.from, self.term, MessageBody::AppendResp { index, reject: None });
            }
            MessageBody::TimeoutNow => {
                // Our leader asks us to take over: campaign now, skipping pre-vote (§3.10).
                self.hup(true);
            }
            _ => {}
        }
    }

    fn heard_from_leader(&mut self, from: &crate::types::NodeId) {
        self.election_elapsed = 0;
        self.startup_quiet = false;
        self.leader = Some(*from);
    }

    /// Returns the AppendResp to send once this Ready is durable.
    fn on_append(
        &mut self,
        prev_index: LogIndex,
        prev_term: crate::types::Term,
        entries: &[crate::types::Entry],
        commit: LogIndex,
    ) -> MessageBody {
        if prev_index < self.log.committed() {
            // Everything up to our commit index matches any leader's log (§5.4): say how far.
            return MessageBody::AppendResp { index: self.log.committed(), reject: None };
        }
        match self.log.maybe_append(prev_index, prev_term, entries) {
            Some(last_new) => {
                // Only what we know matches the leader may be committed here.
                self.log.commit_to(commit.min(last_new));
                MessageBody::AppendResp { index: last_new, reject: None }
            }
            None => {
                let (index, term) = self
                    .log
                    .find_conflict_by_term(prev_index.min(self.log.last_index()), prev_term);
                MessageBody::AppendResp {
                    index: prev_index,
                    reject: Some(RejectHint { index, term }),
                }
            }
        }
    }

    /// Installs a leader's snapshot unless our log already covers it. Returns the index to
    /// acknowledge.
    fn on_snapshot(&mut self, snapshot: crate::types::Snapshot) -> LogIndex {
        let meta = &snapshot.meta;
        if meta.index <= self.log.committed() {
            return self.log.committed();
        }
        if self.log.match_term(meta.index, meta.term) {
            // We hold the snapshot's last entry already; it is committed, so just say so.
            self.log.commit_to(meta.index);
            return meta.index;
        }
        let index = meta.index;
        let conf = meta.conf_state.clone();
        self.log.install_snapshot(snapshot);
        self.tracker.set_conf(conf, self.log.last_index().next());
        self.conf_applied_index = index;
        self.conf_history.clear();
        debug_assert_eq!(self.role, Role::Follower);
        index
    }
}
