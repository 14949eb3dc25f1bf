//! A crash between a snapshot's install in the store and the log's record of it
//! (`replica/snapshot.rs`): the store keeps the snapshot's metadata with the image, and the next
//! open records the install in the log before the core starts. Without that, the member's core
//! started behind its own store, unable to make a snapshot of it for anyone until a leader's
//! commit index passed it.

use cairn_kv::Revision;
use cairn_node::committer::Committer;
use cairn_node::{Bootstrap, StorageError};
use cairn_raft::{LogIndex, NodeId, SnapshotStatus};

use crate::replica::{config, member_3_cut_off_for_40_puts, put, Net, R};

const SNAPSHOT_ENTRIES: u64 = 5;

/// Member 3, cut off past the leader's compaction, is sent a snapshot; its log fails the
/// install's record after the store took the image, and the member loses power.
fn crash_inside_an_install() -> (Net, u64) {
    let mut net = member_3_cut_off_for_40_puts(SNAPSHOT_ENTRIES);
    net.park.insert(3);
    net.cut.clear();
    net.tick_all(3);
    assert!(!net.parked.is_empty(), "member 3 is being sent a snapshot");
    net.deliver_parked();
    // The transport reports a snapshot delivered once its file arrived whole.
    net.get(1).replica.handle_snapshot_report(NodeId(3), SnapshotStatus::Finished);
    let m = net.get(3);
    let before = m.replica.store().applied_index();
    m.disk.fail_after(0);
    let err = m.replica.process().unwrap_err();
    assert!(matches!(err, StorageError::Wal(_)), "{err:?}");
    let installed = m.replica.store().applied_index();
    assert!(installed > before, "the store took the image before the log failed");
    m.disk.crash(3);
    (net, installed)
}

fn reopen(net: &mut Net) -> &mut R {
    let m = net.get(3);
    let store = m.replica.store().clone();
    let cfg = config(3, SNAPSHOT_ENTRIES);
    m.replica = R::open(cfg, m.disk.clone(), store.clone(), Bootstrap::Joining, 0).unwrap();
    m.committer = Committer::new(store);
    &mut m.replica
}

#[test]
fn an_install_the_log_did_not_record_is_recorded_at_open() {
    let (mut net, installed) = crash_inside_an_install();
    let replica = reopen(&mut net);
    assert_eq!(replica.compacted_index(), LogIndex(installed), "the log records the install");
    assert_eq!(replica.raft().applied_index(), LogIndex(installed), "the core starts at the store");
    assert_eq!(replica.raft().last_index(), LogIndex(installed));
    // It catches up with the others, and the install is not recorded twice.
    net.tick_all(3);
    for i in 40..45 {
        net.get(1).propose(&put(&format!("k{i:02}"), "again"), i);
        net.stabilize();
    }
    let hashes: Vec<_> =
        (1..=3).map(|id| net.get(id).replica.store().hash_kv(Revision(0))).collect();
    assert_eq!(hashes[0].as_ref().unwrap().revision, Revision(46));
    assert!(hashes.iter().all(|h| h == &hashes[0]), "{hashes:?}");
    let last = net.get(3).replica.raft().last_index();
    net.get(3).disk.crash(3);
    let replica = reopen(&mut net);
    assert_eq!(replica.raft().last_index(), last, "a recorded install is left as it is");
}
