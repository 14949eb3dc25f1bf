//! The leader's lease commands (expiries, checkpoints, a keepalive's clear) on the replicas of
//! `replica.rs` driven by hand: what happens when they commit long after they were proposed,
//! or after the lease they were made for was granted anew.

use cairn_kv::{Command, GrantCheckpoint, LeaseId};
use cairn_node::Reply;
use cairn_raft::EntryPayload;

use super::replica::{config, put, Net, R};

/// Entries applied between compactions: few, so a member cut off briefly needs a snapshot.
const EVERY: u64 = 10;

/// Three members, member 1 leading, recording long leases' remaining TTLs every
/// `checkpoint_seconds`.
fn cluster_checkpointing(checkpoint_seconds: u64) -> Net {
    cluster_compacting(checkpoint_seconds, EVERY)
}

/// [`cluster_checkpointing`], compacting the log every `every` entries applied.
fn cluster_compacting(checkpoint_seconds: u64, every: u64) -> Net {
    let mut net = Net::with_configs(&[1, 2, 3], |id| {
        let mut cfg = config(id, every);
        cfg.lease_checkpoint_seconds = checkpoint_seconds;
        cfg
    });
    net.stabilize();
    net.elect(1);
    net
}

/// Three members, member 1 leading.
fn cluster() -> Net {
    cluster_checkpointing(300)
}

/// Stalls the commit index while member 1 keeps its leadership (about 24 ticks): member 3
/// falls behind the compaction point and waits for a snapshot that stays parked, and member 2
/// is cut off. Member 3 still answers heartbeats, so the leader stays.
fn stall(net: &mut Net) {
    net.cut.insert(3);
    net.tick_all(12);
    for i in 0..30 {
        net.get(1).propose(&put(&format!("k{i:02}"), "v"), 1000 + i);
        net.stabilize();
        if i % 3 == 2 {
            net.tick_all(1);
        }
    }
    net.cut.clear();
    net.park.insert(3);
    net.tick_all(2);
    assert_eq!(net.parked.len(), 1, "member 3 is being sent a snapshot");
    net.cut.insert(2);
}

/// Delivers the snapshots parked for member 3, and lets it and the leader catch up.
fn unstall(net: &mut Net) {
    net.deliver_parked();
    net.stabilize();
    net.tick_all(3);
}

/// Ends the stall and runs until the leader answers something, for at most 10 ticks.
fn unstall_until_answered(net: &mut Net) {
    net.deliver_parked();
    for _ in 0..10 {
        net.stabilize();
        if !net.get(1).answers.is_empty() {
            return;
        }
        net.tick_all(1);
    }
}

/// The lease expiries in `r`'s log, in log order.
fn expiries_in_log(r: &R) -> Vec<(LeaseId, u64)> {
    let data = r.raft().log_entries().iter().filter_map(|e| match &e.payload {
        EntryPayload::Normal(d) if !d.is_empty() => Some(d.clone()),
        _ => None,
    });
    data.filter_map(|d| match cairn_node::command::decode(&d).unwrap().1 {
        Command::LeaseExpire { id, grant_index } => Some((id, grant_index)),
        _ => None,
    })
    .collect()
}

/// Ticks every member until the leader proposes something (within `max` ticks).
fn tick_until_proposed(net: &mut Net, max: usize) {
    let last = net.get(1).replica.raft().last_index();
    for _ in 0..max {
        net.tick_all(1);
        if net.get(1).replica.raft().last_index() > last {
            return;
        }
    }
    panic!("the leader proposed nothing in {max} ticks");
}

/// Simulator stack seed 3183 found an expired lease's revoke, proposed again because the first
/// proposal had not applied after 50 ticks, committing after a client revoked and granted the
/// same id anew: the new grant was revoked at once. The leader's revoke names the grant it
/// found expired, and applying it to a later grant changes nothing.
#[test]
fn an_expiry_that_commits_late_leaves_a_new_grant_of_the_same_id_alone() {
    let mut net = cluster();
    // 41 ticks: it outlives the stall's making and expires during the stall.
    net.get(1).propose(&Command::LeaseGrant { id: LeaseId(7), ttl: 4 }, 1);
    net.stabilize();
    let old = net.get(1).replica.store().lease(LeaseId(7)).expect("granted").grant_index;
    stall(&mut net);
    tick_until_proposed(&mut net, 30);
    // Applied after the expiry, the client's grant of the same id succeeds...
    net.get(1).propose(&Command::LeaseGrant { id: LeaseId(7), ttl: 4 }, 2);
    net.stabilize();
    let new = net.get(1).replica.raft().last_index().0;
    // ...and the expiry, not applied after 50 ticks, is proposed again, after the grant.
    tick_until_proposed(&mut net, 60);
    let expiries = expiries_in_log(&net.get(1).replica);
    assert_eq!(expiries, vec![(LeaseId(7), old), (LeaseId(7), old)]);
    unstall(&mut net);
    for id in [1, 3] {
        let lease = net.get(id).replica.store().lease(LeaseId(7));
        assert_eq!(lease.map(|l| l.grant_index), Some(new), "member {id} keeps the new grant");
    }
}

/// Simulator stack seed 4017 found a keepalive whose checkpoint's clear waited 2 s for a
/// stalled commit, and checkpoints the leader took meanwhile, counting down from before the
/// keepalive, applied after the clear: the keepalive was answered with the full TTL, the store
/// said less, and the next leader revoked the lease early. No checkpoint of a lease is taken
/// while its clear waits.
#[test]
fn no_checkpoint_lands_after_a_keepalives_clear() {
    let mut net = cluster_checkpointing(1);
    net.get(1).propose(&Command::LeaseGrant { id: LeaseId(7), ttl: 10 }, 1);
    net.stabilize();
    stall(&mut net);
    let lease = net.get(1).replica.store().lease(LeaseId(7)).expect("granted");
    assert!(lease.remaining_ttl > 0, "checkpointed before the stall: {lease:?}");
    net.get(1).answers.clear();
    net.get(1).replica.handle_lease_renew(LeaseId(7), 99);
    // The clear waits for the log, longer than a checkpoint interval.
    net.tick_all(15);
    assert!(net.get(1).answers.is_empty(), "{:?}", net.get(1).answers);
    unstall_until_answered(&mut net);
    assert_eq!(net.get(1).answers, vec![(99, Ok(Reply::LeaseRenewed { ttl: 10 }))]);
    // Renewed for its full TTL from the answer, which is what a new leader must find.
    let lease = net.get(1).replica.store().lease(LeaseId(7)).expect("renewed");
    assert_eq!(lease.remaining_ttl, 0, "a checkpoint from before the renewal landed after it");
}

/// A keepalive answered at once while a checkpoint the leader proposed before it was still on
/// its way would be followed in the log by that checkpoint, counting down from before the
/// keepalive. With one on its way the keepalive clears it through the log instead.
#[test]
fn a_keepalive_behind_a_checkpoint_on_its_way_clears_it() {
    // Checkpoints every 3 s: none during the stall's making, one during the stall.
    let mut net = cluster_checkpointing(3);
    net.get(1).propose(&Command::LeaseGrant { id: LeaseId(7), ttl: 10 }, 1);
    net.stabilize();
    stall(&mut net);
    let lease = net.get(1).replica.store().lease(LeaseId(7)).expect("granted");
    assert_eq!(lease.remaining_ttl, 0, "no checkpoint applied yet");
    tick_until_proposed(&mut net, 20);
    net.get(1).answers.clear();
    net.get(1).replica.handle_lease_renew(LeaseId(7), 99);
    net.stabilize();
    assert!(net.get(1).answers.is_empty(), "answered before the log: {:?}", net.get(1).answers);
    unstall_until_answered(&mut net);
    assert_eq!(net.get(1).answers, vec![(99, Ok(Reply::LeaseRenewed { ttl: 10 }))]);
    let lease = net.get(1).replica.store().lease(LeaseId(7)).expect("renewed");
    assert_eq!(lease.remaining_ttl, 0, "the checkpoint from before the renewal is cleared");
}

/// The lease checkpoints in `r`'s log, in log order.
fn checkpoints_in_log(r: &R) -> Vec<GrantCheckpoint> {
    let data = r.raft().log_entries().iter().filter_map(|e| match &e.payload {
        EntryPayload::Normal(d) if !d.is_empty() => Some(d.clone()),
        _ => None,
    });
    data.filter_map(|d| match cairn_node::command::decode(&d).unwrap().1 {
        Command::LeaseGrantCheckpoint { checkpoints } => Some(checkpoints),
        _ => None,
    })
    .flatten()
    .collect()
}

/// A checkpoint the leader took while a client's revoke and grant of the same id were in the
/// log ahead of it but not applied in its store counted down the old grant, and landed on the
/// new one: a new leader would have counted the new grant down from the old grant's clock, and
/// expired it early. Checkpoints name the grant they were taken for, and applied to a later
/// grant they change nothing.
#[test]
fn a_checkpoint_that_commits_late_leaves_a_new_grant_of_the_same_id_alone() {
    // Checkpoints every second: some during the stall's making, and one during the stall.
    let mut net = cluster_checkpointing(1);
    net.get(1).propose(&Command::LeaseGrant { id: LeaseId(7), ttl: 10 }, 1);
    net.stabilize();
    let old = net.get(1).replica.store().lease(LeaseId(7)).expect("granted").grant_index;
    stall(&mut net);
    // The client's revoke and grant go into the log, ahead of the next checkpoint, and wait
    // for the commit index with it.
    net.get(1).propose(&Command::LeaseRevoke { id: LeaseId(7) }, 2);
    net.get(1).propose(&Command::LeaseGrant { id: LeaseId(7), ttl: 10 }, 3);
    net.stabilize();
    let new = net.get(1).replica.raft().last_index().0;
    let before = checkpoints_in_log(&net.get(1).replica).len();
    tick_until_proposed(&mut net, 20);
    // Taken from a store that still holds the old grant, counted down from its clock.
    let taken = checkpoints_in_log(&net.get(1).replica).split_off(before);
    assert!(
        taken.iter().any(|c| c.id == LeaseId(7) && c.grant_index == old && c.remaining > 0),
        "a checkpoint of the old grant: {taken:?}"
    );
    unstall(&mut net);
    for id in [1, 3] {
        let lease = net.get(id).replica.store().lease(LeaseId(7)).expect("the new grant");
        assert_eq!(lease.grant_index, new, "member {id}");
        // What a new leader would count down from: the new grant's full TTL.
        assert_eq!(lease.remaining_ttl, 0, "member {id}: the old grant's checkpoint landed");
    }
}

/// The leader kept a revoked grant's checkpoint schedule going once the id was granted again,
/// beside the new grant's own: the new grant was recorded twice an interval (and once more for
/// every regrant of the id). Each grant has one schedule.
#[test]
fn a_lease_granted_again_is_checkpointed_once_an_interval() {
    // The log is not compacted during the test: every checkpoint stays in it to be counted.
    let mut net = cluster_compacting(1, 1000);
    net.get(1).propose(&Command::LeaseGrant { id: LeaseId(7), ttl: 10 }, 1);
    net.stabilize();
    // Half an interval on: the old grant's next checkpoint is half an interval from the new's.
    net.tick_all(5);
    net.get(1).propose(&Command::LeaseRevoke { id: LeaseId(7) }, 2);
    net.get(1).propose(&Command::LeaseGrant { id: LeaseId(7), ttl: 10 }, 3);
    net.stabilize();
    let new = net.get(1).replica.store().lease(LeaseId(7)).expect("granted again").grant_index;
    // Four intervals of 11 ticks (a second and the tick it may start in).
    net.tick_all(44);
    let of_new = checkpoints_in_log(&net.get(1).replica)
        .into_iter()
        .filter(|c| c.id == LeaseId(7) && c.grant_index == new)
        .count();
    assert_eq!(of_new, 4, "checkpoints of the new grant in four intervals");
}

#[test]
fn a_lease_renewed_on_a_new_leader_before_it_is_paged_in_is_still_checkpointed() {
    // Checkpoints every second; the log is not compacted during the test.
    let mut net = cluster_compacting(1, 1000);
    net.get(1).propose(&Command::LeaseGrant { id: LeaseId(7), ttl: 10 }, 1);
    net.stabilize();
    // A leadership transfer: member 2 campaigns at once, with no tick in between.
    net.get(1).replica.handle_move_leader(cairn_raft::NodeId(2), 98);
    net.stabilize();
    assert_eq!(net.get(2).replica.raft().role(), cairn_raft::Role::Leader);
    // Member 2 leads and has applied the grant, but pages the leases it inherits in on its
    // ticks: a keepalive now reaches it first.
    net.get(2).replica.handle_lease_renew(LeaseId(7), 99);
    net.stabilize();
    let renewed = net.get(2).answers.iter().any(|(t, a)| *t == 99 && a.is_ok());
    assert!(renewed, "the keepalive is answered: {:?}", net.get(2).answers);
    let before = checkpoints_in_log(&net.get(2).replica).len();
    // Four intervals of 11 ticks (a second and the tick it may start in).
    net.tick_all(44);
    let after = checkpoints_in_log(&net.get(2).replica)
        .into_iter()
        .skip(before)
        .filter(|c| c.id == LeaseId(7) && c.remaining > 0)
        .count();
    assert!(after >= 3, "the new leader records the lease's remaining TTL ({after} checkpoints)");
}
