//! Installing a snapshot survives a crash at any point. A member cut off long enough to need a
//! snapshot receives one, and its disk fails at each step of the install in turn: the store's
//! atomic replace, then each write of the log after it (the install record, its sync, the
//! entries after it). The member crashes, restarts from what its disks kept, and must catch up
//! to the same state as the others: the same revision, the same etcd HashKV and the same
//! members' attributes (every member publishes its own).

use std::collections::{BTreeMap, BTreeSet};

use cairn_kv::{Command, PutRequest, Revision};
use cairn_node::{prepare, Limits, ReplicaConfig};
use cairn_raft::{ConfState, Config, MessageBody, NodeId, Role, SnapshotStatus};
use cairn_sim::member::SimMember;
use cairn_sim::rng::Rng;

const LIMITS: Limits = Limits { max_request_bytes: 1 << 20, max_txn_ops: 128 };

/// Where the install fails.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// The store's replace fails.
    Store,
    /// The log's mutating operation number `k` after the store installed fails.
    Log(u64),
}

struct Cluster {
    members: BTreeMap<u64, SimMember>,
    cut: BTreeSet<u64>,
    rng: Rng,
    now: u64,
    /// Armed on member 3 when a snapshot reaches it.
    fault: Option<Fault>,
    crashes: u64,
}

fn config(id: u64) -> ReplicaConfig {
    let mut raft = Config::new(NodeId(id));
    raft.seed = 3;
    let mut cfg = ReplicaConfig::new(raft);
    cfg.request_timeout_ticks = 60;
    cfg.snapshot_entries = 5;
    // Compacted right up to what was applied, and nothing kept for member 3: it must install
    // snapshots for the faults to hit.
    cfg.snapshot_catchup_entries = 0;
    cfg.snapshot_catchup_max = 0;
    cfg
}

impl Cluster {
    fn new(seed: u64, fault: Fault) -> Cluster {
        let founding = ConfState::with_voters([NodeId(1), NodeId(2), NodeId(3)]);
        let mut members = BTreeMap::new();
        for id in 1..=3 {
            let mut m = SimMember::new(config(id), Some(founding.clone()), true, 20);
            m.start(0).unwrap();
            members.insert(id, m);
        }
        let rng = Rng::new(seed);
        Cluster { members, cut: BTreeSet::new(), rng, now: 0, fault: Some(fault), crashes: 0 }
    }

    fn member(&mut self, id: u64) -> &mut SimMember {
        self.members.get_mut(&id).unwrap()
    }

    /// Processes and delivers until nothing moves; a member whose storage fails crashes and
    /// restarts at once from its disks.
    fn settle(&mut self) {
        for _ in 0..2000 {
            self.now += 1;
            let mut moved = false;
            let mut mail = Vec::new();
            for id in 1..=3 {
                let m = self.members.get_mut(&id).unwrap();
                let replica = m.replica.as_mut().unwrap();
                let result = replica.process();
                let work = replica.work();
                moved |= !work.messages.is_empty();
                if !self.cut.contains(&id) {
                    mail.append(&mut work.messages);
                }
                work.messages.clear();
                work.answers.clear();
                let committer = m.committer.as_mut().unwrap();
                work.commits.drain(..).for_each(|b| committer.push(b));
                if work.store_sync.take().is_some() {
                    committer.want_sync();
                }
                match (result, committer.commit()) {
                    (Ok(()), Ok(Some(durable))) => {
                        replica.handle_store_durable(durable);
                        moved = true;
                    }
                    (Ok(()), Ok(None)) => {}
                    _ => {
                        m.crash(&mut self.rng, self.now);
                        m.start(self.now).unwrap();
                        self.crashes += 1;
                        moved = true;
                    }
                }
            }
            for msg in mail {
                if self.cut.contains(&msg.to.0) {
                    continue;
                }
                let (from, to) = (msg.from, msg.to);
                let snapshot = matches!(msg.body, MessageBody::Snapshot { .. });
                if to == NodeId(3) && snapshot {
                    self.arm();
                }
                self.member(to.0).replica().unwrap().handle_message(msg);
                if snapshot {
                    // The transport tells the leader the snapshot went out, as etcd's does.
                    let leader = self.member(from.0).replica().unwrap();
                    leader.handle_snapshot_report(to, SnapshotStatus::Finished);
                }
            }
            if !moved {
                return;
            }
        }
        panic!("the members did not settle");
    }

    /// Arms the fault on member 3, once.
    fn arm(&mut self) {
        let m = self.members.get_mut(&3).unwrap();
        match self.fault.take() {
            Some(Fault::Store) => m.backend.fail_next_commit(),
            Some(Fault::Log(k)) => m.disk.fail_after(k),
            None => {}
        }
    }

    fn tick(&mut self, ticks: usize) {
        for _ in 0..ticks {
            for m in self.members.values_mut() {
                m.replica().unwrap().handle_tick();
            }
            self.settle();
        }
    }

    fn put(&mut self, leader: u64, i: u64) {
        let m = self.member(leader);
        let id = m.ids.as_ref().unwrap().next_id();
        let key = format!("k{i:03}").into();
        let cmd = Command::Put(PutRequest { key, value: "v".into(), ..PutRequest::default() });
        m.replica().unwrap().handle_propose(id, prepare(id, &cmd, LIMITS).unwrap(), i);
    }
}

fn install_with(fault: Fault, seed: u64) {
    let mut c = Cluster::new(seed, fault);
    c.settle();
    c.member(1).replica().unwrap().campaign();
    c.settle();
    assert_eq!(c.member(1).replica.as_ref().unwrap().raft().role(), Role::Leader);
    c.cut.insert(3);
    for i in 0..40 {
        c.put(1, i);
        c.settle();
    }
    c.cut.clear();
    c.tick(3);
    assert!(c.fault.is_none(), "{fault:?}: member 3 never received a snapshot");
    // More writes after the install, so every write of the log after it is reached.
    for i in 40..45 {
        c.put(1, i);
        c.settle();
    }
    c.tick(30);
    assert!(c.crashes > 0, "{fault:?}: the fault never struck");
    let hashes: Vec<_> = (1..=3)
        .map(|id| c.member(id).replica.as_ref().unwrap().store().hash_kv(Revision(0)).unwrap())
        .collect();
    assert_eq!(hashes[0].revision, Revision(46), "{fault:?} seed {seed}");
    assert!(hashes.iter().all(|h| *h == hashes[0]), "{fault:?} seed {seed}: {hashes:?}");
    let shown: Vec<_> =
        (1..=3).map(|id| c.member(id).replica.as_ref().unwrap().store().members()).collect();
    assert_eq!(shown[0].len(), 3, "{fault:?} seed {seed}: {shown:?}");
    assert!(shown.iter().all(|s| *s == shown[0]), "{fault:?} seed {seed}: {shown:?}");
}

#[test]
fn a_failed_store_replace_leaves_the_old_state_and_the_member_catches_up() {
    for seed in 0..4 {
        install_with(Fault::Store, seed);
    }
}

#[test]
fn a_crash_at_each_log_write_after_the_store_installed_is_survived() {
    // Each seed decides what the crash keeps of the unsynced writes.
    for k in 0..6 {
        for seed in 0..4 {
            install_with(Fault::Log(k), seed);
        }
    }
}
