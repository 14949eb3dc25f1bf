//! End-to-end behaviour of small clusters on the lossless in-memory network.

use bytes::Bytes;
use cairn_raft::testkit::Cluster;
use cairn_raft::{Config, NodeId, Role};

fn cfg(id: NodeId) -> Config {
    Config { seed: 7, ..Config::new(id) }
}

#[test]
fn three_nodes_elect_replicate_and_apply() {
    let mut c = Cluster::new(&[1, 2, 3], cfg);
    c.elect(1);
    assert_eq!(c.leader(), Some(NodeId(1)));
    c.raft(1).propose(Bytes::from_static(b"a")).unwrap();
    c.raft(2).propose(Bytes::from_static(b"b")).unwrap(); // forwarded
    c.stabilize();
    for id in 1..=3 {
        assert_eq!(c.node(id).state.data, vec![Bytes::from_static(b"a"), Bytes::from_static(b"b")]);
    }
}

#[test]
fn new_leader_after_isolation_keeps_committed_entries() {
    let mut c = Cluster::new(&[1, 2, 3], cfg);
    c.elect(1);
    c.raft(1).propose(Bytes::from_static(b"x")).unwrap();
    c.stabilize();
    c.isolate(1);
    c.run_ticks(40);
    let leader = c.leader().expect("a new leader");
    assert_ne!(leader, NodeId(1));
    assert_ne!(c.node(1).raft.role(), Role::Leader, "check-quorum deposes the isolated leader");
    c.heal();
    c.raft(leader.0).propose(Bytes::from_static(b"y")).unwrap();
    c.run_ticks(20);
    for id in 1..=3 {
        assert_eq!(c.node(id).state.data, vec![Bytes::from_static(b"x"), Bytes::from_static(b"y")]);
    }
}
