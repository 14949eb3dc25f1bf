//! Property tests of the quorum and membership logic against naive versions (in the spirit of
//! etcd raft's `quorum/quick_test.go`).

use std::collections::{BTreeMap, BTreeSet};

use cairn_raft::{
    apply_conf_change, ConfChange, ConfChangeSingle, ConfState, JointConfig, LeaveJoint,
    MajorityConfig, NodeId, VoteResult,
};
use proptest::prelude::*;

fn voters() -> impl Strategy<Value = BTreeSet<NodeId>> {
    prop::collection::btree_set((1u64..12).prop_map(NodeId), 0..9)
}

fn acks() -> impl Strategy<Value = BTreeMap<NodeId, u64>> {
    prop::collection::btree_map((1u64..12).prop_map(NodeId), 0u64..20, 0..12)
}

/// The largest value that at least a majority of voters has reached, found by brute force.
fn naive_committed(voters: &BTreeSet<NodeId>, acks: &BTreeMap<NodeId, u64>) -> u64 {
    if voters.is_empty() {
        return u64::MAX;
    }
    let majority = voters.len() / 2 + 1;
    (0..=20u64)
        .rev()
        .find(|&v| {
            voters.iter().filter(|id| acks.get(id).copied().unwrap_or(0) >= v).count() >= majority
        })
        .unwrap_or(0)
}

fn naive_vote(voters: &BTreeSet<NodeId>, votes: &BTreeMap<NodeId, bool>) -> VoteResult {
    if voters.is_empty() {
        return VoteResult::Won;
    }
    let yes = voters.iter().filter(|id| votes.get(id) == Some(&true)).count();
    let no = voters.iter().filter(|id| votes.get(id) == Some(&false)).count();
    let majority = voters.len() / 2 + 1;
    if yes >= majority {
        VoteResult::Won
    } else if no > voters.len() - majority {
        VoteResult::Lost
    } else {
        VoteResult::Pending
    }
}

proptest! {
    #[test]
    fn majority_committed_index_matches_naive(v in voters(), a in acks()) {
        let got = MajorityConfig::new(v.clone()).committed_index(|id| a.get(&id).copied());
        prop_assert_eq!(got, naive_committed(&v, &a));
    }

    #[test]
    fn majority_vote_matches_naive(
        v in voters(),
        votes in prop::collection::btree_map((1u64..12).prop_map(NodeId), any::<bool>(), 0..12),
    ) {
        let got = MajorityConfig::new(v.clone()).vote_result(|id| votes.get(&id).copied());
        prop_assert_eq!(got, naive_vote(&v, &votes));
    }

    #[test]
    fn joint_needs_both_majorities(v1 in voters(), v2 in voters(), a in acks()) {
        let joint = JointConfig { incoming: MajorityConfig::new(v1.clone()), outgoing: MajorityConfig::new(v2.clone()) };
        let got = joint.committed_index(|id| a.get(&id).copied());
        prop_assert_eq!(got, naive_committed(&v1, &a).min(naive_committed(&v2, &a)));
    }

    #[test]
    fn joint_vote_needs_both_halves(
        v1 in voters(),
        v2 in voters(),
        votes in prop::collection::btree_map((1u64..12).prop_map(NodeId), any::<bool>(), 0..12),
    ) {
        let joint = JointConfig { incoming: MajorityConfig::new(v1.clone()), outgoing: MajorityConfig::new(v2.clone()) };
        let got = joint.vote_result(|id| votes.get(&id).copied());
        let (a, b) = (naive_vote(&v1, &votes), naive_vote(&v2, &votes));
        let want = if a == VoteResult::Won && b == VoteResult::Won {
            VoteResult::Won
        } else if a == VoteResult::Lost || b == VoteResult::Lost {
            VoteResult::Lost
        } else {
            VoteResult::Pending
        };
        prop_assert_eq!(got, want);
    }

    /// Any sequence of accepted changes keeps the configuration well formed, and a change enters
    /// a joint configuration exactly when it alters more than one voter of a non-empty set.
    #[test]
    fn conf_changes_keep_configurations_well_formed(
        steps in prop::collection::vec((0u8..4, prop::collection::vec((0u8..3, 1u64..8), 0..4)), 1..30),
    ) {
        let mut cs = ConfState::with_voters([NodeId(1), NodeId(2), NodeId(3)]);
        for (kind, changes) in steps {
            let changes: Vec<ConfChangeSingle> = changes
                .into_iter()
                .map(|(k, id)| match k {
                    0 => ConfChangeSingle::AddVoter(NodeId(id)),
                    1 => ConfChangeSingle::AddLearner(NodeId(id)),
                    _ => ConfChangeSingle::Remove(NodeId(id)),
                })
                .collect();
            let leave_joint = if kind == 0 { LeaveJoint::Explicit } else { LeaveJoint::Auto };
            let cc = ConfChange { changes, leave_joint, ..ConfChange::default() };
            let Ok(next) = apply_conf_change(&cs, &cc) else { continue };
            prop_assert!(!next.voters.is_empty());
            prop_assert!(next.voters.is_disjoint(&next.learners));
            prop_assert!(next.voters.is_disjoint(&next.learners_next));
            prop_assert!(next.voters_outgoing.is_disjoint(&next.learners));
            prop_assert!(next.is_joint() || next.learners_next.is_empty());
            if cc.changes.is_empty() {
                prop_assert!(!next.is_joint());
                prop_assert_eq!(&next.voters, &cs.voters);
            } else {
                let moved = next.voters.symmetric_difference(&cs.voters).count();
                prop_assert_eq!(next.is_joint(), moved > 1);
                if next.is_joint() {
                    prop_assert_eq!(&next.voters_outgoing, &cs.voters);
                }
            }
            cs = next;
        }
    }
}
