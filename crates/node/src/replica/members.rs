//! Membership changes asked through the Cluster API (etcd's MemberAdd, MemberRemove,
//! MemberUpdate and MemberPromote), decided by the leader.
//!
//! The leader checks a change against the applied membership and what it knows of the other
//! members (as etcd's `--strict-reconfig-check`, always on), then proposes it: a Raft
//! membership change whose context carries a [`Command::Membership`] (the member's peer URLs,
//! or its removal), so the change and the peer URLs every member dials apply together, from the
//! log or a snapshot, and survive restarts in the store. An update of peer URLs alone changes no
//! vote and is an ordinary entry. The caller is answered when the entry applies here, as a
//! write is.

use cairn_kv::backend::Backend;
use cairn_kv::Command;
use cairn_raft::{ConfChange, ConfChangeSingle, NodeId, ProposeError, Role};
use cairn_storage::fs::Dir;

use super::{Proposal, Replica};
use crate::error::{EngineError, MembershipError};
use crate::ids::RequestId;

/// A change to the membership, as the Cluster API asks for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberChange {
    /// Add a member (a learner, or a voter) reached at `peer_urls`, under an id the caller
    /// derived as etcd does.
    Add {
        /// The new member's id.
        id: u64,
        /// Where its peers reach it.
        peer_urls: Vec<String>,
        /// Add it as a learner (it votes only once promoted).
        learner: bool,
    },
    /// Remove a member for good.
    Remove {
        /// The member's id.
        id: u64,
    },
    /// Change where a member's peers reach it.
    Update {
        /// The member's id.
        id: u64,
        /// Its new peer URLs.
        peer_urls: Vec<String>,
    },
    /// Make a learner a voter.
    Promote {
        /// The learner's id.
        id: u64,
    },
}

/// What a change becomes in the log: the Raft membership steps (none for an update) and the
/// command recording it in the store.
type Plan = (Vec<ConfChangeSingle>, Command);

fn refuse(e: MembershipError) -> EngineError {
    EngineError::Membership(e)
}

/// A learner is ready to vote once its log holds 90% of the leader's (etcd's `readyPercent`).
fn caught_up(learner: u64, leader: u64) -> bool {
    u128::from(learner) * 10 >= u128::from(leader) * 9
}

impl<D: Dir, B: Backend, T> Replica<D, B, T> {
    /// A membership change, proposed under `id` once checked; answered with
    /// [`super::Reply::Command`] when applied here, or refused with etcd's error. Only the
    /// leader decides: another member answers [`EngineError::NotLeader`].
    pub fn handle_member_change(&mut self, id: RequestId, change: MemberChange, token: T) {
        let (changes, cmd) = match self.plan_member_change(&change) {
            Ok(plan) => plan,
            Err(e) => return self.work.answers.push((token, Err(e))),
        };
        let data = crate::command::encode(id.0, &cmd);
        if changes.is_empty() {
            return self.handle_propose(id, data, token);
        }
        let cc = ConfChange { changes, context: data.clone(), ..ConfChange::default() };
        match self.raft.propose_conf_change(cc) {
            Ok(()) => {
                let term = self.raft.term();
                self.proposal_index.insert(self.raft.last_index(), id);
                self.proposals.register(id, Proposal { token, data, term }, self.ticks);
            }
            Err(e) => {
                let err = match e {
                    ProposeError::ConfChangePending => refuse(MembershipError::ChangeInProgress),
                    ProposeError::LeaderTransferring => EngineError::LeaderTransfer,
                    ProposeError::InvalidConfChange(_) => refuse(MembershipError::NotEnoughStarted),
                    _ => EngineError::NoLeader,
                };
                self.work.answers.push((token, Err(err)));
            }
        }
    }

    fn plan_member_change(&self, change: &MemberChange) -> Result<Plan, EngineError> {
        if self.raft.role() != Role::Leader {
            return Err(EngineError::NotLeader);
        }
        let membership = |peers: Vec<(u64, Vec<String>)>, removed: Vec<u64>| Command::Membership {
            peers,
            removed,
        };
        match change {
            MemberChange::Add { id, peer_urls, learner } => {
                if self.raft.conf_state().members().contains(&NodeId(*id)) {
                    return Err(refuse(MembershipError::IdExists));
                }
                if self.store.member(*id).is_some_and(|a| a.removed) {
                    return Err(refuse(MembershipError::IdRemoved));
                }
                self.check_urls_free(*id, peer_urls)?;
                let step = if *learner {
                    self.check_all_voters_heard()?;
                    let conf = self.raft.conf_state();
                    if conf.learners.len() + conf.learners_next.len() >= self.cfg.max_learners {
                        return Err(refuse(MembershipError::TooManyLearners));
                    }
                    ConfChangeSingle::AddLearner(NodeId(*id))
                } else {
                    self.check_voter_added(false)?;
                    ConfChangeSingle::AddVoter(NodeId(*id))
                };
                Ok((vec![step], membership(vec![(*id, peer_urls.clone())], vec![])))
            }
            MemberChange::Remove { id } => {
                self.check_member(*id)?;
                if self.raft.conf_state().voters.contains(&NodeId(*id)) {
                    self.check_voter_removed(NodeId(*id))?;
                }
                Ok((vec![ConfChangeSingle::Remove(NodeId(*id))], membership(vec![], vec![*id])))
            }
            MemberChange::Update { id, peer_urls } => {
                self.check_member(*id)?;
                self.check_urls_free(*id, peer_urls)?;
                Ok((vec![], membership(vec![(*id, peer_urls.clone())], vec![])))
            }
            MemberChange::Promote { id } => {
                self.check_member(*id)?;
                if !self.raft.conf_state().learners.contains(&NodeId(*id)) {
                    return Err(refuse(MembershipError::NotLearner));
                }
                let matched = |n: NodeId| self.raft.progress(n).map_or(0, |p| p.matched().0);
                let leader = matched(self.raft.id()).max(self.raft.last_index().0);
                if !caught_up(matched(NodeId(*id)), leader) {
                    return Err(refuse(MembershipError::LearnerNotReady));
                }
                self.check_voter_added(true)?;
                Ok((vec![ConfChangeSingle::AddVoter(NodeId(*id))], membership(vec![], vec![])))
            }
        }
    }

    /// Automatic promotion (`--auto-promote-learners`, [`crate::AutoPromote`]), on each tick
    /// of a leader: the first learner that has stayed close to this leader's log long enough,
    /// and that passes MemberPromote's checks, is proposed as a voter, answered to no one (the
    /// applied membership is the answer). One change at a time, as Raft allows; a learner
    /// whose promotion the core refuses this tick is tried again on the next.
    pub(super) fn auto_promote_tick(&mut self) {
        let Some(policy) = self.cfg.auto_promote else { return };
        if self.raft.role() != Role::Leader {
            self.close_since.clear();
            return;
        }
        let learners = self.raft.conf_state().learners.clone();
        self.close_since.retain(|id, _| learners.contains(id));
        let matched = |r: &Self, n: NodeId| r.raft.progress(n).map_or(0, |p| p.matched().0);
        let leader = matched(self, self.raft.id()).max(self.raft.last_index().0);
        let mut due = None;
        for id in learners {
            let at = matched(self, id);
            let close = caught_up(at, leader)
                && leader.saturating_sub(at) <= policy.max_lag
                && self.recently_heard(id);
            if !close {
                self.close_since.remove(&id);
                continue;
            }
            let since = *self.close_since.entry(id).or_insert(self.ticks);
            if due.is_none() && self.ticks - since >= policy.stable_ticks {
                due = Some(id);
            }
        }
        let Some(id) = due else { return };
        let Ok((changes, cmd)) = self.plan_member_change(&MemberChange::Promote { id: id.0 })
        else {
            return;
        };
        let data = crate::command::encode(self.own_ids.next_id().0, &cmd);
        let cc = ConfChange { changes, context: data, ..ConfChange::default() };
        if self.raft.propose_conf_change(cc).is_ok() {
            tracing::info!(learner = %format!("{:x}", id.0), lag = leader.saturating_sub(matched(self, id)), "promoting a learner that has caught up");
            self.close_since.remove(&id);
        }
    }

    /// The member exists: not removed, and named by the configuration.
    fn check_member(&self, id: u64) -> Result<(), EngineError> {
        if self.raft.conf_state().members().contains(&NodeId(id)) {
            return Ok(());
        }
        if self.store.member(id).is_some_and(|a| a.removed) {
            return Err(refuse(MembershipError::IdRemoved));
        }
        Err(refuse(MembershipError::IdNotFound))
    }

    /// No other member is reached at any of `urls`.
    fn check_urls_free(&self, id: u64, urls: &[String]) -> Result<(), EngineError> {
        for other in self.raft.conf_state().members() {
            if other.0 != id && self.peer_urls(other.0).iter().any(|u| urls.contains(u)) {
                return Err(refuse(MembershipError::PeerUrlExists));
            }
        }
        Ok(())
    }

    /// etcd's `IsReadyToAddVotingMember` and `IsReadyToPromoteMember`: with one more voter, the
    /// started ones must still be a quorum. A new member has not started, except as the second
    /// of a one-member cluster (etcd's exception, or a single member could never grow); a
    /// learner being promoted counts as started. Adding also needs every voter heard
    /// ([`Self::check_all_voters_heard`]); promoting does not, as in etcd.
    fn check_voter_added(&self, promoting: bool) -> Result<(), EngineError> {
        let voters = &self.raft.conf_state().voters;
        let started = voters.iter().filter(|v| self.started(**v)).count();
        let (members, started) = (voters.len() + 1, started + usize::from(promoting));
        let growing_one = !promoting && started == 1 && members == 2;
        if !growing_one && started < members / 2 + 1 {
            return Err(refuse(MembershipError::NotEnoughStarted));
        }
        if !promoting {
            self.check_all_voters_heard()?;
        }
        Ok(())
    }

    /// etcd's `isConnectedFullySince` check in `mayAddMember`, made for any addition, a
    /// learner's too: the leader must have heard from every voter, else a quorum that the new
    /// member's traffic or catch-up would rely on may already be lost.
    fn check_all_voters_heard(&self) -> Result<(), EngineError> {
        let voters = &self.raft.conf_state().voters;
        if voters.iter().all(|v| self.recently_heard(*v)) {
            return Ok(());
        }
        Err(refuse(MembershipError::Unhealthy))
    }

    /// etcd's `IsReadyToRemoveVotingMember` and `mayRemoveMember`: the started voters left must
    /// be a quorum of those left (the last voter is never removed); a voter not heard from is
    /// then removed at once, as it is no part of the running quorum; any other only if the
    /// voters heard from, less it, are still a quorum of those left.
    fn check_voter_removed(&self, id: NodeId) -> Result<(), EngineError> {
        let voters = &self.raft.conf_state().voters;
        let left = voters.len().saturating_sub(1);
        let started = voters.iter().filter(|v| **v != id && self.started(**v)).count();
        if left == 0 || started < left / 2 + 1 {
            return Err(refuse(MembershipError::NotEnoughStarted));
        }
        if id != self.raft.id() && !self.recently_heard(id) {
            return Ok(());
        }
        let active = voters.iter().filter(|v| self.recently_heard(**v)).count();
        if active - 1 < left / 2 + 1 {
            return Err(refuse(MembershipError::Unhealthy));
        }
        Ok(())
    }

    /// etcd's `IsStarted`: the member has published its name (it ran at least once). This
    /// member counts as started, publishing or not: it is running.
    fn started(&self, id: NodeId) -> bool {
        id == self.raft.id() || self.store.member(id.0).is_some_and(|a| !a.name.is_empty())
    }

    /// This member, or one it heard from within an election timeout.
    pub(super) fn recently_heard(&self, id: NodeId) -> bool {
        let window = u64::from(self.cfg.raft.election_timeout_ticks);
        id == self.raft.id() || self.heard.get(&id).is_some_and(|t| self.ticks <= t + window)
    }

    /// Where `id`'s peers reach it: as the membership recorded, or the founding flags for a
    /// founding member of a log that predates recorded peer URLs.
    pub fn peer_urls(&self, id: u64) -> Vec<String> {
        match self.store.member(id) {
            Some(a) if !a.peer_urls.is_empty() => a.peer_urls,
            _ => self
                .cfg
                .founding_peers
                .iter()
                .find(|(m, _)| *m == id)
                .map(|(_, urls)| urls.clone())
                .unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::caught_up;

    #[test]
    fn a_learner_is_ready_at_ninety_percent_of_the_leaders_log() {
        assert!(caught_up(90, 100));
        assert!(!caught_up(89, 100));
        assert!(caught_up(0, 0));
        assert!(caught_up(u64::MAX, u64::MAX), "no overflow");
    }
}
