//! The store makes durable only what the log durably holds committed
//! (`replica/store_batches.rs`). Were it ahead, a restarted member's core would start with its
//! applied index below the store's, unable to make a snapshot of the store until it learned a
//! later commit index: a restarted leader whose quorum needed snapshots never committed again.

use std::sync::Arc;

use cairn_kv::backend::MemBackend;
use cairn_kv::Store;
use cairn_node::committer::Committer;
use cairn_node::Bootstrap;

use crate::replica::{config, put, Member, Net, R};

/// Commits and syncs everything the member's committer was handed, loses what the log did not
/// sync, and reopens the log: `(the reopened core's commit index, the store's durable index,
/// its executed index)`.
fn crash_and_reopen(m: &mut Member, id: u64) -> (u64, u64, u64) {
    m.committer.want_sync();
    m.committer.commit().unwrap();
    let store = m.committer.store().clone();
    m.disk.crash(id);
    let reopened =
        R::open(config(id, 100), m.disk.clone(), store.clone(), Bootstrap::Joining, 0).unwrap();
    (reopened.raft().commit_index().0, store.applied_index(), store.executed_index())
}

fn three_members_after_puts(puts: u64) -> Net {
    let mut net = Net::new(&[1, 2, 3], 100);
    net.stabilize();
    net.elect(1);
    for i in 0..puts {
        net.get(1).propose(&put(&format!("k{i}"), "v"), i);
        net.stabilize();
    }
    net
}

/// The commit index of the last write rides lazily with the next one: until then, the last
/// batch waits.
#[test]
fn a_batch_waits_for_a_durable_commit_index() {
    let mut net = three_members_after_puts(5);
    for id in [1, 2] {
        let (commit, durable, executed) = crash_and_reopen(net.get(id), id);
        assert!(
            durable <= commit,
            "member {id}: store durable at {durable}, log's commit {commit}"
        );
        assert!(durable < executed, "member {id}: the last write waits for the next");
    }
}

/// A quiet log writes its commit index alone a tick later, and the store catches up.
#[test]
fn a_quiet_log_writes_its_commit_index_alone_after_a_tick() {
    let mut net = three_members_after_puts(1);
    net.tick_all(2);
    for id in [1, 2, 3] {
        let (commit, durable, executed) = crash_and_reopen(net.get(id), id);
        assert_eq!((durable, commit), (executed, executed), "member {id}");
    }
}

/// Before a graceful stop, every batch goes to the committer after the commit index is made
/// durable: the store stops as current as the log.
#[test]
fn a_stop_hands_over_every_batch() {
    let mut net = three_members_after_puts(5);
    for id in [1, 2] {
        let m = net.get(id);
        m.replica.release_all_batches().unwrap();
        m.replica.work().commits.drain(..).for_each(|b| m.committer.push(b));
        let (commit, durable, executed) = crash_and_reopen(m, id);
        assert_eq!((durable, commit), (executed, executed), "member {id}");
    }
}

/// A store ahead of its log (after a crash between a snapshot's install in the store and its
/// record in the log, or written before batches waited) replays entries it holds: their batch
/// changes nothing and goes to the committer at once, instead of a hard state being written
/// for it on every turn while no leader's commit index passes the store.
#[test]
fn a_store_ahead_of_its_log_writes_nothing_while_cut_off() {
    let mut net = three_members_after_puts(0);
    net.cut.insert(3);
    for i in 0..10 {
        net.get(1).propose(&put(&format!("k{i}"), "v"), i);
        net.stabilize();
    }
    // Member 3 restarts with the store of member 1, ahead of its own log.
    let image = net.get(1).replica.store().image().unwrap();
    let store = Arc::new(Store::open(MemBackend::default()).unwrap());
    store.install(&image).unwrap();
    let m = net.get(3);
    m.replica =
        R::open(config(3, 100), m.disk.clone(), store.clone(), Bootstrap::Joining, 0).unwrap();
    m.committer = Committer::new(store.clone());
    assert!(m.replica.raft().commit_index().0 < store.applied_index());
    net.tick_all(1);
    let ops = net.get(3).disk.op_count();
    net.tick_all(20);
    assert_eq!(net.get(3).disk.op_count(), ops, "a cut-off member with a quiet log writes nothing");
    // Back with the others, it catches up.
    net.cut.clear();
    net.tick_all(3);
    let hashes: Vec<_> = [1, 3]
        .map(|id| net.get(id).replica.store().hash_kv(cairn_kv::Revision(0)).unwrap())
        .to_vec();
    assert_eq!(hashes[0], hashes[1]);
}

/// What replay read may sit unsynced in the page cache (the last run was killed before its
/// sync): opening makes it durable before anything acts on it.
#[test]
fn opening_syncs_what_replay_read() {
    let asynchronous = |id| {
        let mut c = config(id, 100);
        c.raft.async_storage_writes = true;
        c
    };
    let mut net = Net::with_configs(&[1, 2, 3], asynchronous);
    net.stabilize();
    net.elect(1);
    net.get(1).propose(&put("k", "v"), 1);
    net.get(1).replica.process().unwrap();
    let m = net.get(1);
    assert!(m.disk.unsynced_ops() > 0, "the write is left for the driver to sync");
    let store = m.replica.store().clone();
    let _reopened = R::open(asynchronous(1), m.disk.clone(), store, Bootstrap::Joining, 0).unwrap();
    assert_eq!(m.disk.unsynced_ops(), 0);
}
