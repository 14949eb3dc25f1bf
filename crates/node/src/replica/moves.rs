//! Moving leadership on request (etcd's MoveLeader) and before a graceful stop, so a leader
//! that leaves does not cost the cluster an election timeout without a leader.

use cairn_kv::backend::Backend;
use cairn_raft::{NodeId, Role};
use cairn_storage::fs::Dir;

use super::{Replica, Reply};
use crate::error::EngineError;

/// A caller waiting for `target` to lead, until the tick `deadline`.
#[derive(Debug)]
pub(super) struct Move<T> {
    token: T,
    target: NodeId,
    deadline: u64,
}

impl<D: Dir, B: Backend, T> Replica<D, B, T> {
    /// Hands leadership to `target`; answered with [`Reply::LeaderMoved`] once it leads, with
    /// `NotLeader` if this member does not lead, `BadLeaderTransferee` if `target` is not a
    /// voter, and `LeaderTransferTimeout` if it does not lead within the request timeout.
    pub fn handle_move_leader(&mut self, target: NodeId, token: T) {
        if self.raft.role() != Role::Leader {
            self.work.answers.push((token, Err(EngineError::NotLeader)));
            return;
        }
        if !self.raft.conf_state().voters.contains(&target) {
            self.work.answers.push((token, Err(EngineError::BadLeaderTransferee)));
            return;
        }
        if target == self.raft.id() {
            self.work.answers.push((token, Ok(Reply::LeaderMoved)));
            return;
        }
        if self.raft.transfer_leader(target).is_err() {
            self.work.answers.push((token, Err(EngineError::NotLeader)));
            return;
        }
        let deadline = self.ticks + self.cfg.request_timeout_ticks;
        self.moves.push(Move { token, target, deadline });
    }

    /// Before a graceful stop: hands leadership to the voter whose log is most complete.
    /// Answered at once when there is nothing to hand over (this member does not lead, or it
    /// is the only voter).
    pub fn handle_handover(&mut self, token: T) {
        let me = self.raft.id();
        let best = self
            .raft
            .conf_state()
            .voters
            .iter()
            .filter(|v| **v != me)
            .max_by_key(|v| self.raft.progress(**v).map(|p| p.matched()))
            .copied();
        match best {
            Some(target) if self.raft.role() == Role::Leader => {
                self.handle_move_leader(target, token)
            }
            _ => self.work.answers.push((token, Ok(Reply::LeaderMoved))),
        }
    }

    /// Leadership changed: answers who waited for this leader.
    pub(super) fn answer_moves(&mut self) {
        let Some(leader) = self.leadership.leader else { return };
        let (done, waiting) = std::mem::take(&mut self.moves)
            .into_iter()
            .partition::<Vec<_>, _>(|m| m.target == leader);
        self.moves = waiting;
        for m in done {
            self.work.answers.push((m.token, Ok(Reply::LeaderMoved)));
        }
    }

    /// Fails moves whose deadline passed.
    pub(super) fn expire_moves(&mut self) {
        let now = self.ticks;
        let (late, waiting) = std::mem::take(&mut self.moves)
            .into_iter()
            .partition::<Vec<_>, _>(|m| m.deadline <= now);
        self.moves = waiting;
        for m in late {
            self.work.answers.push((m.token, Err(EngineError::LeaderTransferTimeout)));
        }
    }

    pub(super) fn fail_moves(&mut self, err: &EngineError) {
        for m in self.moves.drain(..) {
            self.work.answers.push((m.token, Err(err.clone())));
        }
    }
}
