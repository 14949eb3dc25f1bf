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

/// Regression (simulator seed 11728): a node that cannot campaign must still leave a leader's
/// lease once it stops hearing from it, or it refuses every vote request forever and a cluster
/// that needs its vote never elects a leader.
#[test]
fn a_node_that_cannot_campaign_still_leaves_the_lease_and_votes() {
    use cairn_raft::testkit::{MemNode, MemStorage};
    use cairn_raft::{LogIndex, Message, MessageBody, Term};
    for seed in 0..20 {
        // Outside any configuration: never promotable.
        let mut n = MemNode::new(Config { seed, ..Config::new(NodeId(5)) }, MemStorage::default());
        n.raft.step(Message {
            from: NodeId(4),
            to: NodeId(5),
            term: Term(4),
            body: MessageBody::Heartbeat { commit: LogIndex(0), seq: Default::default() },
        });
        n.handle_ready();
        for _ in 0..40 {
            n.raft.tick();
        }
        n.raft.step(Message {
            from: NodeId(1),
            to: NodeId(5),
            term: Term(5),
            body: MessageBody::Vote {
                pre_vote: true,
                last_index: LogIndex(88),
                last_term: Term(4),
                transfer: false,
            },
        });
        let msgs = n.handle_ready().unwrap_or_default();
        let granted =
            msgs.iter().any(|m| matches!(m.body, MessageBody::VoteResp { granted: true, .. }));
        assert!(granted, "seed {seed}: a silent leader's lease must run out");
    }
}

/// Regression (whole-stack simulator seed 167): a leader that appended a proposal and stepped
/// down before its next Ready kept asking for a broadcast it could no longer send, so
/// `has_ready` stayed true on empty Readies forever and a driver draining Readies spun.
#[test]
fn a_leader_that_steps_down_with_a_broadcast_pending_quiesces() {
    use cairn_raft::{HeartbeatSeq, LogIndex, Message, MessageBody, Term};
    let mut c = Cluster::new(&[1, 2, 3], cfg);
    c.elect(1);
    c.raft(1).propose(Bytes::from_static(b"a")).unwrap();
    let term = c.raft(1).term();
    // A newer leader's heartbeat arrives before node 1 handles its Ready.
    c.raft(1).step(Message {
        from: NodeId(2),
        to: NodeId(1),
        term: Term(term.0 + 1),
        body: MessageBody::Heartbeat { commit: LogIndex(0), seq: HeartbeatSeq(1) },
    });
    assert_eq!(c.raft(1).role(), Role::Follower);
    for _ in 0..3 {
        if !c.raft(1).has_ready() {
            return;
        }
        c.process_ready(NodeId(1));
    }
    panic!("a follower keeps reporting a Ready with nothing in it");
}

/// A follower whose data was rolled back (restored from an older copy) hears a leader name a
/// commit index beyond its log, which it must have acknowledged: it reports the loss, answers
/// nothing and commits nothing, rather than commit entries the leader may never have had.
#[test]
fn a_heartbeat_beyond_the_log_reports_a_lost_log() {
    use cairn_raft::testkit::{MemNode, MemStorage};
    use cairn_raft::{HeartbeatSeq, LogIndex, Message, MessageBody, Term};
    let mut n = MemNode::new(cfg(NodeId(2)), MemStorage::default());
    let beat = |commit| Message {
        from: NodeId(1),
        to: NodeId(2),
        term: Term(3),
        body: MessageBody::Heartbeat { commit: LogIndex(commit), seq: HeartbeatSeq(1) },
    };
    n.raft.step(beat(0));
    let answered = n.handle_ready().unwrap_or_default();
    assert!(answered.iter().any(|m| matches!(m.body, MessageBody::HeartbeatResp { .. })));
    assert_eq!(n.raft.lost_log(), None);
    n.raft.step(beat(1505));
    assert_eq!(n.raft.lost_log(), Some((LogIndex(0), LogIndex(1505))));
    let answered = n.handle_ready().unwrap_or_default();
    assert!(answered.is_empty(), "answered {answered:?}");
    assert_eq!(n.raft.commit_index(), LogIndex(0));
}

/// A leader that removes itself hands leadership to the voter left with its whole log as its
/// removal applies: the cluster has a leader again without a single tick (it used to wait out
/// an election timeout).
#[test]
fn a_leader_removing_itself_hands_leadership_over_without_an_election_timeout() {
    use cairn_raft::{ConfChange, ConfChangeSingle};
    let mut c = Cluster::new(&[1, 2, 3], cfg);
    c.elect(1);
    c.raft(1).propose(Bytes::from_static(b"a")).unwrap();
    c.stabilize();
    let cc =
        ConfChange { changes: vec![ConfChangeSingle::Remove(NodeId(1))], ..ConfChange::default() };
    c.raft(1).propose_conf_change(cc).unwrap();
    c.stabilize();
    assert_ne!(c.node(1).raft.role(), Role::Leader, "the removed leader stepped down");
    let leader = c.leader().expect("a leader with no tick");
    assert!(leader == NodeId(2) || leader == NodeId(3), "{leader:?}");
    c.raft(leader.0).propose(Bytes::from_static(b"b")).unwrap();
    c.stabilize();
    for id in 2..=3 {
        assert_eq!(c.node(id).state.data.last(), Some(&Bytes::from_static(b"b")));
    }
}
