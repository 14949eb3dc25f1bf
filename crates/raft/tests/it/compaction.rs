//! Log compaction at an index below the applied one, as a driver whose state machine becomes
//! durable in the background does it: the snapshot must describe the state at its own index,
//! configuration included.

use bytes::Bytes;
use cairn_raft::testkit::Cluster;
use cairn_raft::{ConfChange, ConfChangeSingle, Config, LeaveJoint, LogIndex, NodeId};

fn three() -> Cluster {
    let mut c = Cluster::new(&[1, 2, 3], Config::new);
    c.elect(1);
    c
}

#[test]
fn compacting_below_a_membership_change_keeps_the_configuration_of_that_index() {
    let mut c = three();
    c.raft(1).propose(Bytes::from_static(b"a")).unwrap();
    c.stabilize();
    let before_change = c.raft(1).applied_index();
    let old_conf = c.raft(1).conf_state().clone();
    let cc = ConfChange {
        changes: vec![ConfChangeSingle::AddLearner(NodeId(4))],
        leave_joint: LeaveJoint::Auto,
        ..ConfChange::default()
    };
    c.raft(1).propose_conf_change(cc).unwrap();
    c.raft(1).propose(Bytes::from_static(b"b")).unwrap();
    c.stabilize();
    let applied = c.raft(1).applied_index();
    assert!(applied > before_change.next(), "the change and a later entry are applied");
    assert!(c.raft(1).conf_state().learners.contains(&NodeId(4)));

    let meta = c.raft(1).compact_to(before_change, Bytes::new()).expect("compacted");
    assert_eq!(meta.index, before_change);
    assert_eq!(meta.conf_state, old_conf, "the configuration as of the compaction index");
    assert_eq!(c.raft(1).first_index(), before_change.next());

    let meta = c.raft(1).compact_to(applied, Bytes::new()).expect("compacted again");
    assert!(meta.conf_state.learners.contains(&NodeId(4)), "the change is below this point");
    c.raft(1).check_invariants();
}

#[test]
fn compaction_refuses_unapplied_or_already_compacted_indexes() {
    let mut c = three();
    c.raft(1).propose(Bytes::from_static(b"a")).unwrap();
    c.stabilize();
    let applied = c.raft(1).applied_index();
    assert_eq!(c.raft(1).compact_to(applied.next(), Bytes::new()), None, "not applied yet");
    assert!(c.raft(1).compact_to(applied, Bytes::new()).is_some());
    assert_eq!(c.raft(1).compact_to(applied, Bytes::new()), None, "already compacted");
    assert_eq!(c.raft(1).compact_to(LogIndex(1), Bytes::new()), None, "below the snapshot");
}

#[test]
fn a_node_restarted_from_a_compaction_below_a_change_applies_the_change_again() {
    // The snapshot at the earlier index plus the entries after it must rebuild the same
    // configuration the node had before the restart.
    let mut c = three();
    let before_change = c.raft(2).applied_index();
    let state_then = c.node(2).state.encode();
    let cc = ConfChange {
        changes: vec![ConfChangeSingle::AddLearner(NodeId(4))],
        leave_joint: LeaveJoint::Auto,
        ..ConfChange::default()
    };
    c.raft(1).propose_conf_change(cc).unwrap();
    c.stabilize();
    let node = c.node_mut(2);
    let meta = node.raft.compact_to(before_change, Bytes::new()).expect("compacted");
    node.storage.compact(cairn_raft::Snapshot { meta, data: state_then });
    let conf = node.raft.conf_state().clone();
    node.restart();
    c.stabilize();
    assert_eq!(c.raft(2).conf_state(), &conf);
    c.raft(2).check_invariants();
}
