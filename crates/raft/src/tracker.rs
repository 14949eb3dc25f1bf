//! Membership: the active configuration, each member's progress, and the votes of an election.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::ConfChangeError;
use crate::progress::{Progress, Window};
use crate::quorum::{JointConfig, MajorityConfig, VoteResult};
use crate::types::{ConfChange, ConfChangeSingle, ConfState, LeaveJoint, LogIndex, NodeId};

/// Computes the configuration that results from applying `cc` to `cs`.
///
/// Pure, so the leader validates a proposal with the same code every node later applies it with.
pub fn apply_conf_change(cs: &ConfState, cc: &ConfChange) -> Result<ConfState, ConfChangeError> {
    if cc.changes.is_empty() {
        return leave_joint(cs);
    }
    if cs.is_joint() {
        return Err(ConfChangeError::AlreadyJoint);
    }
    check_distinct(&cc.changes)?;
    let mut next = cs.clone();
    // From no voters at all (bootstrap) there is no old majority to protect: apply directly.
    // Otherwise more than one voter changing needs a joint configuration (thesis §4.3).
    let incoming = incoming_voters(&cs.voters, &cc.changes);
    if !cs.voters.is_empty() && incoming.symmetric_difference(&cs.voters).count() > 1 {
        next.voters_outgoing = cs.voters.clone();
        next.auto_leave = cc.leave_joint == LeaveJoint::Auto;
    }
    for change in &cc.changes {
        apply_single(cs, &mut next, *change)?;
    }
    if next.voters.is_empty() {
        return Err(ConfChangeError::NoVoters);
    }
    Ok(next)
}

/// Leaves a joint configuration: the incoming voters stay, outgoing voters marked to become
/// learners become learners.
fn leave_joint(cs: &ConfState) -> Result<ConfState, ConfChangeError> {
    if !cs.is_joint() {
        return Err(ConfChangeError::NotJoint);
    }
    let mut next = cs.clone();
    next.voters_outgoing.clear();
    let demoted = std::mem::take(&mut next.learners_next);
    next.learners.extend(demoted);
    next.auto_leave = false;
    Ok(next)
}

fn target(change: ConfChangeSingle) -> NodeId {
    match change {
        ConfChangeSingle::AddVoter(id)
        | ConfChangeSingle::AddLearner(id)
        | ConfChangeSingle::Remove(id) => id,
    }
}

fn check_distinct(changes: &[ConfChangeSingle]) -> Result<(), ConfChangeError> {
    let mut seen = BTreeSet::new();
    for c in changes {
        if !seen.insert(target(*c)) {
            return Err(ConfChangeError::DuplicateNode(target(*c)));
        }
    }
    Ok(())
}

fn incoming_voters(voters: &BTreeSet<NodeId>, changes: &[ConfChangeSingle]) -> BTreeSet<NodeId> {
    let mut incoming = voters.clone();
    for c in changes {
        match *c {
            ConfChangeSingle::AddVoter(id) => incoming.insert(id),
            ConfChangeSingle::AddLearner(id) | ConfChangeSingle::Remove(id) => incoming.remove(&id),
        };
    }
    incoming
}

fn apply_single(
    old: &ConfState,
    next: &mut ConfState,
    change: ConfChangeSingle,
) -> Result<(), ConfChangeError> {
    let id = target(change);
    next.voters.remove(&id);
    next.learners.remove(&id);
    next.learners_next.remove(&id);
    match change {
        ConfChangeSingle::AddVoter(_) => {
            next.voters.insert(id);
        }
        // A voter of the outgoing half stays a voter until the joint config is left.
        ConfChangeSingle::AddLearner(_) if next.voters_outgoing.contains(&id) => {
            next.learners_next.insert(id);
        }
        ConfChangeSingle::AddLearner(_) => {
            next.learners.insert(id);
        }
        ConfChangeSingle::Remove(_) if !old.members().contains(&id) => {
            return Err(ConfChangeError::NotMember(id));
        }
        ConfChangeSingle::Remove(_) => {}
    }
    Ok(())
}

/// The active configuration with the leader's per-member progress and the current election's
/// votes.
#[derive(Debug)]
pub(crate) struct Tracker {
    conf: ConfState,
    /// Invariant: mirrors `conf`'s voter halves.
    quorum: JointConfig,
    /// Invariant: holds exactly the members of `conf`.
    progress: BTreeMap<NodeId, Progress>,
    /// Votes received in the current election, by voter.
    votes: BTreeMap<NodeId, bool>,
    window: Window,
}

impl Tracker {
    pub(crate) fn new(conf: ConfState, next: LogIndex, window: Window) -> Tracker {
        let mut t = Tracker {
            conf: ConfState::default(),
            quorum: JointConfig::default(),
            progress: BTreeMap::new(),
            votes: BTreeMap::new(),
            window,
        };
        t.set_conf(conf, next);
        t
    }

    /// Switches to `conf`; members that are new start probing at `next`.
    pub(crate) fn set_conf(&mut self, conf: ConfState, next: LogIndex) {
        self.quorum = JointConfig {
            incoming: MajorityConfig::new(conf.voters.clone()),
            outgoing: MajorityConfig::new(conf.voters_outgoing.clone()),
        };
        let members = conf.members();
        self.progress.retain(|id, _| members.contains(id));
        for id in &members {
            let is_learner = !self.quorum.contains(*id);
            let window = self.window;
            self.progress
                .entry(*id)
                .or_insert_with(|| Progress::new(next, is_learner, window))
                .is_learner = is_learner;
        }
        self.votes.retain(|id, _| members.contains(id));
        self.conf = conf;
    }

    pub(crate) fn conf(&self) -> &ConfState {
        &self.conf
    }

    pub(crate) fn quorum(&self) -> &JointConfig {
        &self.quorum
    }

    pub(crate) fn is_voter(&self, id: NodeId) -> bool {
        self.quorum.contains(id)
    }

    /// Whether `id` is the only voter: then it decides everything alone.
    pub(crate) fn is_sole_voter(&self, id: NodeId) -> bool {
        !self.quorum.is_joint()
            && self.quorum.incoming.voters().len() == 1
            && self.quorum.incoming.voters().contains(&id)
    }

    pub(crate) fn progress(&self, id: NodeId) -> Option<&Progress> {
        self.progress.get(&id)
    }

    pub(crate) fn progress_mut(&mut self, id: NodeId) -> Option<&mut Progress> {
        self.progress.get_mut(&id)
    }

    pub(crate) fn peers(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.progress.keys().copied()
    }

    /// Every member starts over: probe from `next`, nothing known to match.
    pub(crate) fn reset_progress(&mut self, next: LogIndex) {
        for (id, pr) in self.progress.iter_mut() {
            let is_learner = !self.quorum.contains(*id);
            *pr = Progress::new(next, is_learner, self.window);
        }
    }

    /// The highest index a quorum of voters has persisted.
    pub(crate) fn committed_index(&self) -> LogIndex {
        LogIndex(self.quorum.committed_index(|id| self.progress.get(&id).map(|p| p.matched().0)))
    }

    pub(crate) fn reset_votes(&mut self) {
        self.votes.clear();
    }

    pub(crate) fn record_vote(&mut self, id: NodeId, granted: bool) {
        self.votes.entry(id).or_insert(granted);
    }

    pub(crate) fn vote_result(&self) -> VoteResult {
        self.quorum.vote_result(|id| self.votes.get(&id).copied())
    }

    /// Whether a quorum was heard from since the last check; `me` always counts.
    pub(crate) fn quorum_active(&self, me: NodeId) -> bool {
        self.quorum.vote_result(|id| {
            Some(id == me || self.progress.get(&id).is_some_and(|p| p.recent_active))
        }) == VoteResult::Won
    }

    pub(crate) fn clear_recent_active(&mut self) {
        for pr in self.progress.values_mut() {
            pr.recent_active = false;
        }
    }

    pub(crate) fn check_invariants(&self) {
        assert_eq!(
            self.progress.keys().copied().collect::<BTreeSet<_>>(),
            self.conf.members(),
            "progress does not cover exactly the members"
        );
        for (id, pr) in &self.progress {
            pr.check_invariants();
            assert_eq!(pr.is_learner, !self.quorum.contains(*id), "learner flag of {id} wrong");
        }
        let c = &self.conf;
        assert!(c.voters.is_disjoint(&c.learners), "voter is also a learner");
        assert!(c.voters.is_disjoint(&c.learners_next), "voter is also a next learner");
        assert!(c.voters_outgoing.is_disjoint(&c.learners), "outgoing voter is a learner");
        assert!(c.is_joint() || c.learners_next.is_empty(), "learners_next outside joint");
    }
}
