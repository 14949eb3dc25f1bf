//! How much log a member keeps when it compacts: the margin behind every compaction (etcd's
//! `SnapshotCatchUpEntries`), and the leader's hold for followers that are catching up, with
//! its bound. On the replicas of `replica.rs`, driven by hand over its lossless network.

use cairn_kv::Revision;
use cairn_raft::{LogIndex, MessageBody, NodeId, ProgressState, SnapshotStatus};

use super::replica::{config, put, Net};

/// Entries applied between compactions.
const EVERY: u64 = 10;
/// Entries kept behind every compaction.
const MARGIN: u64 = 5;

/// Three members that compact every [`EVERY`] entries, keeping `margin` behind, and whose
/// leader keeps up to `max` more for followers catching up; member 1 leads.
fn cluster(margin: u64, max: u64) -> Net {
    let mut net = Net::with_configs(&[1, 2, 3], |id| {
        let mut cfg = config(id, EVERY);
        cfg.snapshot_catchup_entries = margin;
        cfg.snapshot_catchup_max = max;
        cfg
    });
    net.stabilize();
    net.elect(1);
    net
}

/// Writes `n` keys through the leader, with a tick after every third, so that members that
/// are not cut off keep answering its heartbeats. Returns the longest log the leader held
/// after a write (applied entries past its compaction point).
fn write(net: &mut Net, tag: &str, n: u64) -> u64 {
    let mut longest = 0;
    for i in 0..n {
        net.get(1).propose(&put(&format!("{tag}{i:03}"), "v"), i);
        net.stabilize();
        longest = longest.max(log_len(net, 1));
        if i % 3 == 2 {
            net.tick_all(1);
        }
    }
    longest
}

/// Applied entries past member `id`'s compaction point.
fn log_len(net: &mut Net, id: u64) -> u64 {
    let r = &net.get(id).replica;
    r.raft().applied_index().0 - r.compacted_index().0
}

fn compacted(net: &mut Net, id: u64) -> LogIndex {
    net.get(id).replica.compacted_index()
}

/// Cuts member 3 off until it no longer counts as heard and the leader compacted past it,
/// then lets it back with snapshots to it parked: the leader sends one, which waits.
fn behind_and_sent_a_snapshot(net: &mut Net) {
    net.cut.insert(3);
    net.tick_all(12);
    write(net, "a", 30);
    let behind = net.get(3).replica.raft().applied_index();
    assert!(compacted(net, 1) > behind, "the leader compacted past member 3");
    net.cut.clear();
    net.park.insert(3);
    net.tick_all(2);
    assert_eq!(net.parked.len(), 1, "member 3 is being sent a snapshot");
}

/// The index of the snapshot the leader is sending member 3.
fn pending(net: &mut Net) -> LogIndex {
    match net.get(1).replica.raft().progress(NodeId(3)).map(|p| p.state().clone()) {
        Some(ProgressState::Snapshot { pending }) => pending,
        other => panic!("member 3 is not waiting for a snapshot: {other:?}"),
    }
}

/// Delivers the parked snapshot, stops parking, and lets every member catch up.
fn deliver(net: &mut Net) {
    net.deliver_parked();
    net.stabilize();
    net.tick_all(3);
}

fn assert_converged(net: &mut Net) {
    let hashes: Vec<_> =
        (1..=3).map(|id| net.get(id).replica.store().hash_kv(Revision(0)).unwrap()).collect();
    assert!(hashes.iter().all(|h| *h == hashes[0]), "{hashes:?}");
}

#[test]
fn every_member_keeps_the_margin_behind_its_compactions() {
    let margin = 7;
    let mut net = cluster(margin, 0);
    write(&mut net, "k", 100);
    for id in 1..=3 {
        let r = &net.get(id).replica;
        let (applied, compacted) = (r.raft().applied_index().0, r.compacted_index().0);
        assert!(compacted > 50, "member {id} compacted its log: {compacted}");
        let kept = applied - compacted;
        assert!((margin..margin + EVERY).contains(&kept), "member {id} kept {kept} entries");
        assert_eq!(r.raft().first_index().0, compacted + 1);
        assert_eq!(r.raft().log_entries().len() as u64, kept, "member {id} holds them");
    }
}

/// Scenario of bench/results/2026-11-28-snapshot-join.md: the leader goes on writing while a
/// member receives and installs a snapshot. Returns how many snapshots the member was sent
/// before it caught up.
fn snapshots_to_catch_up(max: u64) -> (Net, usize) {
    let mut net = cluster(MARGIN, max);
    behind_and_sent_a_snapshot(&mut net);
    let image = match &net.parked[0].body {
        MessageBody::Snapshot { snapshot } => snapshot.meta.index,
        other => panic!("{other:?}"),
    };
    // Far more than a compaction's worth, margin included, while the image is on its way.
    let syncs = net.syncs[&1];
    write(&mut net, "b", 4 * (EVERY + MARGIN));
    if max > 0 {
        assert!(compacted(&mut net, 1) <= pending(&mut net), "the leader kept member 3's entries");
        // No compaction can follow, so the store is not asked to sync for one.
        assert_eq!(net.syncs[&1], syncs, "store syncs asked for while compaction was held");
    } else {
        assert!(compacted(&mut net, 1) > image, "without the hold it compacted past the image");
    }
    deliver(&mut net);
    assert_converged(&mut net);
    let sent = net.snapshots[&3];
    (net, sent)
}

#[test]
fn a_member_sent_a_snapshot_while_writes_go_on_catches_up_with_that_one_snapshot() {
    let (mut net, sent) = snapshots_to_catch_up(1000);
    assert_eq!(sent, 1, "one snapshot, then the log");
    // Caught up, it holds nothing back: the leader's log is back to the margin's size.
    let longest = write(&mut net, "c", 3 * EVERY);
    assert!(longest < MARGIN + EVERY, "the leader kept {longest} entries");
    assert_converged(&mut net);
}

/// The same scenario without the hold needs another snapshot: what the test above guards.
#[test]
fn without_the_hold_a_member_sent_a_snapshot_while_writes_go_on_needs_another() {
    let (_, sent) = snapshots_to_catch_up(0);
    assert!(sent >= 2, "sent {sent} snapshots");
}

#[test]
fn a_follower_that_is_down_holds_nothing_back() {
    let mut net = cluster(MARGIN, 1000);
    net.cut.insert(3);
    net.tick_all(12);
    let behind = net.get(3).replica.raft().applied_index();
    let longest = write(&mut net, "k", 100);
    assert!(longest < MARGIN + EVERY, "the leader kept {longest} entries");
    assert!(compacted(&mut net, 1) > behind);
}

/// A member installing a large image answers nothing until it is done: once the transport
/// reports the image delivered, the leader keeps its entries through etcd's 30 s grace (300
/// ticks of 100 ms), and not after.
#[test]
fn a_follower_silent_after_a_delivered_snapshot_holds_the_log_only_for_the_install_grace() {
    let mut net = cluster(MARGIN, 1000);
    behind_and_sent_a_snapshot(&mut net);
    let pending = pending(&mut net);
    net.get(1).replica.handle_snapshot_report(NodeId(3), SnapshotStatus::Finished);
    net.parked.clear();
    net.cut.insert(3);
    let longest = write(&mut net, "b", 40);
    assert!(longest >= 40, "the leader kept the entries the installing member needs");
    assert!(compacted(&mut net, 1) <= pending);
    net.tick_all(300);
    let longest = write(&mut net, "c", 2 * EVERY);
    assert!(compacted(&mut net, 1) > pending, "the grace is over");
    assert!(log_len(&mut net, 1) < MARGIN + EVERY, "back to the margin (longest {longest})");
}

/// Once it has installed its snapshot, a member that goes silent is down, grace or not
/// (tests/cluster found one, killed a moment after it joined, holding the log for 30 s).
#[test]
fn a_follower_that_installed_its_snapshot_and_went_down_holds_nothing_back() {
    let mut net = cluster(MARGIN, 1000);
    behind_and_sent_a_snapshot(&mut net);
    net.get(1).replica.handle_snapshot_report(NodeId(3), SnapshotStatus::Finished);
    deliver(&mut net);
    assert_eq!(net.snapshots[&3], 1);
    net.cut.insert(3);
    net.tick_all(12);
    let longest = write(&mut net, "b", 40);
    assert!(longest < MARGIN + EVERY, "the leader kept {longest} entries");
}

#[test]
fn a_slow_follower_holds_back_no_more_than_the_bound() {
    let max = 30;
    let mut net = cluster(MARGIN, max);
    behind_and_sent_a_snapshot(&mut net);
    let pending = pending(&mut net);
    // Member 3 answers heartbeats, but its snapshot never arrives.
    let longest = write(&mut net, "b", 150);
    assert!(longest > MARGIN + EVERY, "the leader held entries for member 3: {longest}");
    assert!(longest <= MARGIN + max + EVERY, "the leader kept {longest} entries");
    assert!(compacted(&mut net, 1) > pending, "and then compacted past what it needs");
    assert!(log_len(&mut net, 1) < MARGIN + EVERY, "holding nothing more for it");
    // The image it finally gets is too old to catch up from: it needs another, and gets it.
    deliver(&mut net);
    assert_converged(&mut net);
    assert!(net.snapshots[&3] >= 2);
}

/// The hold also stops once the leader's log holds [`ReplicaConfig::snapshot_catchup_max_bytes`]:
/// the entry bound alone would let large entries hold gigabytes.
#[test]
fn a_slow_follower_holds_back_no_more_than_the_byte_bound() {
    let mut net = Net::with_configs(&[1, 2, 3], |id| {
        let mut cfg = config(id, EVERY);
        cfg.snapshot_catchup_entries = MARGIN;
        cfg.snapshot_catchup_max = 1_000;
        // About 20 of the puts `write` makes, with the margin's and the interval's entries.
        cfg.snapshot_catchup_max_bytes = 3_000;
        cfg
    });
    net.stabilize();
    net.elect(1);
    behind_and_sent_a_snapshot(&mut net);
    let bytes_bound = 3_000;
    let longest = write(&mut net, "b", 150);
    assert!(longest > MARGIN + EVERY, "the leader held entries for member 3: {longest}");
    let bytes = net.get(1).replica.raft().log_bytes();
    assert!(bytes < bytes_bound * 2, "the log holds {bytes} bytes");
    assert!(longest < 150, "the leader kept {longest} entries: the byte bound did not stop it");
    deliver(&mut net);
    assert_converged(&mut net);
    assert!(net.snapshots[&3] >= 2);
}
