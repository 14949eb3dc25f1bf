//! Majority and joint quorums: which index a quorum has reached, and how an election went.

use std::collections::BTreeSet;

use crate::types::NodeId;

/// The outcome of counting votes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VoteResult {
    Won,
    Lost,
    /// Not decided yet: enough voters have not answered.
    Pending,
}

/// A set of voters decided by simple majority.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MajorityConfig {
    voters: BTreeSet<NodeId>,
}

impl MajorityConfig {
    pub fn new(voters: BTreeSet<NodeId>) -> MajorityConfig {
        MajorityConfig { voters }
    }

    pub fn voters(&self) -> &BTreeSet<NodeId> {
        &self.voters
    }

    /// The largest value that a majority of voters has reached, given each voter's value (`None`
    /// counts as zero). An empty configuration returns `u64::MAX`, so that in a joint
    /// configuration an empty half never holds the other back.
    pub fn committed_index(&self, acked: impl Fn(NodeId) -> Option<u64>) -> u64 {
        if self.voters.is_empty() {
            return u64::MAX;
        }
        // Small clusters are the rule; a stack array avoids an allocation on the commit path.
        let mut stack = [0u64; 7];
        let mut heap;
        let values: &mut [u64] = if self.voters.len() <= stack.len() {
            &mut stack[..self.voters.len()]
        } else {
            heap = vec![0u64; self.voters.len()];
            &mut heap
        };
        for (slot, id) in values.iter_mut().zip(&self.voters) {
            *slot = acked(*id).unwrap_or(0);
        }
        values.sort_unstable_by(|a, b| b.cmp(a));
        values[self.voters.len() / 2]
    }

    /// Counts votes; `None` means the voter has not answered.
    pub fn vote_result(&self, vote: impl Fn(NodeId) -> Option<bool>) -> VoteResult {
        if self.voters.is_empty() {
            return VoteResult::Won;
        }
        let (mut yes, mut missing) = (0, 0);
        for id in &self.voters {
            match vote(*id) {
                Some(true) => yes += 1,
                Some(false) => {}
                None => missing += 1,
            }
        }
        let quorum = self.voters.len() / 2 + 1;
        if yes >= quorum {
            VoteResult::Won
        } else if yes + missing >= quorum {
            VoteResult::Pending
        } else {
            VoteResult::Lost
        }
    }
}

/// The configuration while membership changes: decisions need a majority of both halves
/// (thesis §4.3). Outside a change, `outgoing` is empty and only `incoming` counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JointConfig {
    pub incoming: MajorityConfig,
    pub outgoing: MajorityConfig,
}

impl JointConfig {
    pub fn is_joint(&self) -> bool {
        !self.outgoing.voters.is_empty()
    }

    pub fn contains(&self, id: NodeId) -> bool {
        self.incoming.voters.contains(&id) || self.outgoing.voters.contains(&id)
    }

    /// Every voter of either half.
    pub fn voters(&self) -> BTreeSet<NodeId> {
        self.incoming.voters.union(&self.outgoing.voters).copied().collect()
    }

    pub fn committed_index(&self, acked: impl Fn(NodeId) -> Option<u64>) -> u64 {
        let a = self.incoming.committed_index(&acked);
        let b = self.outgoing.committed_index(&acked);
        a.min(b)
    }

    pub fn vote_result(&self, vote: impl Fn(NodeId) -> Option<bool>) -> VoteResult {
        let a = self.incoming.vote_result(&vote);
        let b = self.outgoing.vote_result(&vote);
        match (a, b) {
            (VoteResult::Won, VoteResult::Won) => VoteResult::Won,
            (VoteResult::Lost, _) | (_, VoteResult::Lost) => VoteResult::Lost,
            _ => VoteResult::Pending,
        }
    }
}
