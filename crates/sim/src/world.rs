//! One simulated run: nodes, network, clock, workload and faults, all driven by one seed.
//!
//! Time advances in units; a node's tick takes 19 to 21 units (its clock drift). Phase 1 runs the
//! workload under faults and checks safety after every step. Phase 2 heals everything and
//! requires a leader and progress within a bound (liveness).

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use cairn_raft::testkit::MemStorage;
use cairn_raft::{
    ConfChange, ConfChangeSingle, ConfState, Config, EntryPayload, LeaveJoint, LogIndex, NodeId,
    Persisted, ReadCtx, Role,
};

use crate::checker::{Checker, Violation};
use crate::network::{Faults, NetEvent, Network};
use crate::node::{CrashPoint, SimNode};
use crate::rng::Rng;
use crate::{Options, Stats};

const TICK_UNITS: u64 = 20;
/// Clock drift: each node's tick lasts `TICK_UNITS ± DRIFT_UNITS`. With a lease of 8 ticks and a
/// follower guard of at least 9 ticks, leases are safe while 8 × 21 <= 9 × 19.
const DRIFT_UNITS: u64 = 1;

#[derive(Debug)]
pub struct World {
    opts: Options,
    rng: Rng,
    now: u64,
    nodes: BTreeMap<NodeId, SimNode>,
    net: Network,
    checker: Checker,
    next_client_id: u64,
    /// Proposals in flight: client id -> the node the client asked.
    proposals: BTreeMap<u64, NodeId>,
    /// Reads in flight: read id -> (node asked, commit index when the read began).
    reads: BTreeMap<u64, (NodeId, LogIndex)>,
    stats: Stats,
}

fn encode_id(tag: u8, id: u64) -> Bytes {
    let mut v = Vec::with_capacity(9);
    v.push(tag);
    v.extend_from_slice(&id.to_be_bytes());
    Bytes::from(v)
}

fn decode_id(tag: u8, raw: &[u8]) -> Option<u64> {
    if raw.len() != 9 || raw[0] != tag {
        return None;
    }
    Some(u64::from_be_bytes(raw[1..].try_into().ok()?))
}

const PROPOSAL: u8 = b'p';
const READ: u8 = b'r';

impl World {
    pub fn new(opts: Options) -> World {
        let mut rng = Rng::new(opts.seed);
        let voters: Vec<NodeId> = (1..=opts.voters as u64).map(NodeId).collect();
        let total = opts.voters + opts.spares;
        let mut nodes = BTreeMap::new();
        for id in (1..=total as u64).map(NodeId) {
            let mut cfg = Config::new(id);
            cfg.seed = opts.seed;
            cfg.read_mode = opts.read_mode;
            cfg.max_msg_bytes = opts.max_msg_bytes;
            cfg.max_inflight_msgs = 4;
            cfg.planted_bug = opts.bug;
            let disk = if voters.contains(&id) {
                MemStorage::from(Persisted::bootstrap(ConfState::with_voters(
                    voters.iter().copied(),
                )))
            } else {
                MemStorage::default()
            };
            let period = rng.between(TICK_UNITS - DRIFT_UNITS, TICK_UNITS + DRIFT_UNITS);
            nodes.insert(id, SimNode::new(cfg, disk, period));
        }
        let faults = Faults { drop: 0.02, duplicate: 0.02, max_delay: 30 };
        World {
            opts,
            rng,
            now: 0,
            nodes,
            net: Network::new(faults),
            checker: Checker::default(),
            next_client_id: 0,
            proposals: BTreeMap::new(),
            reads: BTreeMap::new(),
            stats: Stats::default(),
        }
    }

    pub fn run(mut self) -> Result<Stats, (u64, Violation)> {
        let fault_end = self.opts.fault_ticks * TICK_UNITS;
        while self.now < fault_end {
            self.step(true).map_err(|v| (self.now, v))?;
        }
        self.liveness().map_err(|v| (self.now, v))?;
        self.stats.elections = self.checker.elections;
        self.stats.reads = self.checker.reads_checked;
        self.stats.acked = self.checker.acked.len() as u64;
        self.stats.messages = self.net.sent;
        Ok(self.stats)
    }

    fn ids(&self) -> Vec<NodeId> {
        self.nodes.keys().copied().collect()
    }

    fn up_ids(&self) -> Vec<NodeId> {
        self.nodes.values().filter(|n| n.is_up()).map(|n| n.id).collect()
    }

    fn leaders(&self) -> Vec<NodeId> {
        let mut by_term: Vec<(cairn_raft::Term, NodeId)> = self
            .nodes
            .values()
            .filter_map(|n| n.raft.as_ref())
            .filter(|r| r.role() == Role::Leader)
            .map(|r| (r.term(), r.id()))
            .collect();
        by_term.sort();
        by_term.into_iter().rev().map(|(_, id)| id).collect()
    }

    /// One unit of time.
    fn step(&mut self, faults: bool) -> Result<(), Violation> {
        self.now += 1;
        crate::NOW.with(|n| n.set(self.now));
        self.restart_due();
        self.tick_due();
        self.deliver_due();
        if faults {
            // Phase 2 sends only its probe, so convergence has a fixed target.
            self.workload();
            self.inject_faults();
        }
        self.handle_readies(faults)?;
        self.check_all()
    }

    fn restart_due(&mut self) {
        let now = self.now;
        for node in self.nodes.values_mut() {
            if node.restart_at.is_some_and(|t| t <= now) {
                node.start();
                node.next_tick_at = now + node.tick_period;
                self.stats.restarts += 1;
            }
        }
    }

    fn tick_due(&mut self) {
        let now = self.now;
        for node in self.nodes.values_mut() {
            if node.next_tick_at <= now {
                node.next_tick_at += node.tick_period;
                if let Some(raft) = node.raft.as_mut() {
                    raft.tick();
                }
            }
        }
    }

    fn deliver_due(&mut self) {
        while let Some(ev) = self.net.pop_due(self.now) {
            match ev {
                NetEvent::Deliver(msg) => {
                    if self.opts.trace {
                        println!(
                            "t={} deliver {}->{} term {} {:?}",
                            self.now, msg.from, msg.to, msg.term, msg.body
                        );
                    }
                    if let Some(raft) = self.nodes.get_mut(&msg.to).and_then(|n| n.raft.as_mut()) {
                        raft.step(msg);
                    }
                }
                NetEvent::SnapshotReport { leader, to, status } => {
                    if let Some(raft) = self.nodes.get_mut(&leader).and_then(|n| n.raft.as_mut()) {
                        raft.report_snapshot(to, status);
                    }
                }
            }
        }
    }

    fn workload(&mut self) {
        let up = self.up_ids();
        if self.rng.chance(self.opts.propose_rate) {
            if let Some(&id) = self.rng.pick(&up) {
                self.next_client_id += 1;
                let cid = self.next_client_id;
                let raft = self.nodes.get_mut(&id).and_then(|n| n.raft.as_mut());
                if raft.is_some_and(|r| r.propose(encode_id(PROPOSAL, cid)).is_ok()) {
                    self.proposals.insert(cid, id);
                    self.stats.proposals += 1;
                }
            }
        }
        if self.rng.chance(self.opts.read_rate) {
            if let Some(&id) = self.rng.pick(&up) {
                self.next_client_id += 1;
                let rid = self.next_client_id;
                let commit_at_start = self.checker.max_commit;
                let raft = self.nodes.get_mut(&id).and_then(|n| n.raft.as_mut());
                if raft.is_some_and(|r| r.read_index(ReadCtx(encode_id(READ, rid))).is_ok()) {
                    self.reads.insert(rid, (id, commit_at_start));
                }
            }
        }
        if self.opts.membership && self.rng.chance(0.002) {
            self.propose_membership_change();
        }
        if self.rng.chance(0.001) {
            self.transfer_leadership();
        }
        if self.rng.chance(0.01) {
            if let Some(&id) = self.rng.pick(&up) {
                let node = self.nodes.get_mut(&id).expect("picked from nodes");
                let lag = node
                    .raft
                    .as_ref()
                    .map_or(0, |r| r.applied_index().0.saturating_sub(r.first_index().0));
                if lag > 20 {
                    node.compact();
                    self.stats.compactions += 1;
                }
            }
        }
    }

    fn propose_membership_change(&mut self) {
        let Some(&leader) = self.leaders().first() else { return };
        let raft = self.nodes[&leader].raft.as_ref().expect("leader is up");
        let conf = raft.conf_state().clone();
        let all: BTreeSet<NodeId> = self.nodes.keys().copied().collect();
        let outsiders: Vec<NodeId> = all.difference(&conf.members()).copied().collect();
        let learners: Vec<NodeId> = conf.learners.iter().copied().collect();
        let voters: Vec<NodeId> = conf.voters.iter().copied().collect();
        let cc = if conf.is_joint() {
            ConfChange { changes: Vec::new(), leave_joint: LeaveJoint::Auto }
        } else {
            let mut options: Vec<Vec<ConfChangeSingle>> = Vec::new();
            if let Some(&o) = self.rng.pick(&outsiders) {
                options.push(vec![ConfChangeSingle::AddLearner(o)]);
            }
            if let Some(&l) = self.rng.pick(&learners) {
                if voters.len() < 5 {
                    options.push(vec![ConfChangeSingle::AddVoter(l)]);
                }
                if let Some(&v) = self.rng.pick(&voters) {
                    // Swap a learner in for a voter: a joint change.
                    options.push(vec![ConfChangeSingle::AddVoter(l), ConfChangeSingle::Remove(v)]);
                }
                options.push(vec![ConfChangeSingle::Remove(l)]);
            }
            if voters.len() > 3 {
                if let Some(&v) = self.rng.pick(&voters) {
                    options.push(vec![ConfChangeSingle::Remove(v)]);
                    options.push(vec![ConfChangeSingle::AddLearner(v)]);
                }
            }
            let Some(changes) = self.rng.pick(&options).cloned() else { return };
            let leave_joint =
                if self.rng.chance(0.5) { LeaveJoint::Auto } else { LeaveJoint::Explicit };
            ConfChange { changes, leave_joint }
        };
        let raft = self.nodes.get_mut(&leader).and_then(|n| n.raft.as_mut()).expect("leader is up");
        if raft.propose_conf_change(cc).is_ok() {
            self.stats.conf_changes += 1;
        }
    }

    fn transfer_leadership(&mut self) {
        let Some(&leader) = self.leaders().first() else { return };
        let raft = self.nodes.get_mut(&leader).and_then(|n| n.raft.as_mut()).expect("leader is up");
        let voters: Vec<NodeId> = raft.conf_state().voters.iter().copied().collect();
        if let Some(&target) = self.rng.pick(&voters) {
            if raft.transfer_leader(target).is_ok() {
                self.stats.transfers += 1;
            }
        }
    }

    fn inject_faults(&mut self) {
        let ids = self.ids();
        let up = self.up_ids();
        let down = ids.len() - up.len();
        // Crash at most a minority of the founding voters' count at once, so the run makes progress.
        if down < (self.opts.voters - 1) / 2 && self.rng.chance(0.0015 * self.opts.chaos) {
            if let Some(&id) = self.rng.pick(&up) {
                let restart = self.now + self.rng.between(5, 60) * TICK_UNITS;
                self.nodes.get_mut(&id).expect("up node").crash(restart);
                self.stats.crashes += 1;
            }
        }
        if self.rng.chance(0.002 * self.opts.chaos) {
            if self.net.is_partitioned() {
                self.net.heal();
            } else {
                self.partition(&ids);
            }
            self.stats.partitions += 1;
        }
    }

    fn partition(&mut self, ids: &[NodeId]) {
        match self.rng.between(0, 2) {
            0 => {
                if let Some(&id) = self.rng.pick(ids) {
                    self.net.isolate(id, ids);
                }
            }
            1 => {
                // Split into two random groups.
                let side: Vec<bool> = ids.iter().map(|_| self.rng.chance(0.5)).collect();
                for (i, &a) in ids.iter().enumerate() {
                    for (j, &b) in ids.iter().enumerate() {
                        if side[i] != side[j] {
                            self.net.cut_link(a, b);
                        }
                    }
                }
            }
            _ => {
                // One-way: a node can send but not hear, or the reverse.
                let (Some(&a), Some(&b)) = (self.rng.pick(ids), self.rng.pick(ids)) else { return };
                self.net.cut_link(a, b);
            }
        }
    }

    fn handle_readies(&mut self, faults: bool) -> Result<(), Violation> {
        for id in self.ids() {
            let crash = if faults && self.rng.chance(0.0005 * self.opts.chaos) {
                Some(if self.rng.chance(0.5) {
                    CrashPoint::BeforePersist
                } else {
                    CrashPoint::AfterPersist
                })
            } else {
                None
            };
            let before = self.nodes[&id].sm;
            let Some(handled) = self.nodes.get_mut(&id).and_then(|n| n.handle_ready(crash)) else {
                continue;
            };
            for m in handled.messages {
                self.net.send(m, self.now, &mut self.rng);
            }
            if handled.crashed {
                let restart = self.now + self.rng.between(5, 60) * TICK_UNITS;
                self.nodes.get_mut(&id).expect("node").crash(restart);
                self.stats.crashes += 1;
                continue;
            }
            let node = &self.nodes[&id];
            let raft = node.raft.as_ref().expect("up after handling");
            self.checker.check_appended(raft, &handled.entries)?;
            let after = node.sm;
            self.checker.check_applied(
                id,
                before,
                handled.snapshot.as_ref(),
                &handled.applied,
                after,
            )?;
            for e in &handled.applied {
                if let EntryPayload::Normal(d) = &e.payload {
                    if let Some(cid) = decode_id(PROPOSAL, d) {
                        if self.proposals.get(&cid) == Some(&id) {
                            self.proposals.remove(&cid);
                            self.checker.acked.insert(cid, e.index);
                        }
                    }
                }
            }
            self.serve_reads(id)?;
        }
        Ok(())
    }

    fn serve_reads(&mut self, id: NodeId) -> Result<(), Violation> {
        let served = self.nodes.get_mut(&id).expect("node").take_servable_reads();
        for (index, ctx) in served {
            let Some(rid) = decode_id(READ, &ctx.0) else { continue };
            // A forwarded read may come back after a restart of the asking node; only the
            // original request counts.
            if let Some((asked, commit_at_start)) = self.reads.remove(&rid) {
                if asked == id {
                    self.checker.check_read(id, index, commit_at_start)?;
                }
            }
        }
        Ok(())
    }

    fn check_all(&mut self) -> Result<(), Violation> {
        for node in self.nodes.values_mut() {
            let Some(raft) = node.raft.as_ref() else { continue };
            if self.opts.trace {
                let state = (
                    raft.role(),
                    raft.term(),
                    raft.leader(),
                    raft.commit_index(),
                    raft.last_index(),
                );
                if node.last_traced != Some(state) {
                    println!(
                        "t={} node {} {:?} term {} leader {:?} commit {} last {} conf {:?}",
                        self.now,
                        node.id,
                        state.0,
                        state.1,
                        state.2,
                        state.3,
                        state.4,
                        raft.conf_state()
                    );
                    node.last_traced = Some(state);
                }
            }
            raft.check_invariants();
            self.checker.check_leader(raft)?;
            self.checker.check_commit(raft, &mut node.seen_commit)?;
        }
        Ok(())
    }

    /// Phase 2: heal, restart, stop injecting faults, and require service within a bound.
    fn liveness(&mut self) -> Result<(), Violation> {
        self.net.heal();
        self.net.faults = Faults { drop: 0.0, duplicate: 0.0, ..self.net.faults };
        for node in self.nodes.values_mut() {
            if !node.is_up() {
                node.restart_at = Some(self.now);
            }
        }
        let deadline = self.now + self.opts.liveness_ticks * TICK_UNITS;
        let probe = encode_id(PROPOSAL, u64::MAX);
        let mut probe_index = None;
        while self.now < deadline {
            self.step(false)?;
            if self.now.is_multiple_of(5 * TICK_UNITS) && probe_index.is_none() {
                if let Some(&leader) = self.leaders().first() {
                    let raft = self.nodes.get_mut(&leader).and_then(|n| n.raft.as_mut());
                    let _ = raft.map(|r| r.propose(probe.clone()));
                }
            }
            probe_index = probe_index.or_else(|| self.find_applied(&probe));
            if let Some(index) = probe_index {
                if self.converged(index) {
                    return self.check_acked_kept();
                }
            }
        }
        Err(Violation(format!(
            "liveness: no leader committing and converging within {} ticks after faults stopped (leaders: {:?}, probe at {:?})",
            self.opts.liveness_ticks,
            self.leaders(),
            probe_index
        )))
    }

    fn find_applied(&self, probe: &Bytes) -> Option<LogIndex> {
        let leader = *self.leaders().first()?;
        let raft = self.nodes[&leader].raft.as_ref()?;
        raft.log_entries()
            .iter()
            .find(|e| {
                e.index <= raft.applied_index() && e.payload == EntryPayload::Normal(probe.clone())
            })
            .map(|e| e.index)
    }

    /// Every member of the leader's configuration applied the probe, and all agree on the state.
    fn converged(&self, probe: LogIndex) -> bool {
        let Some(&leader) = self.leaders().first() else { return false };
        let Some(raft) = self.nodes[&leader].raft.as_ref() else { return false };
        let members = raft.conf_state().members();
        members.iter().all(|id| self.nodes[id].is_up() && self.nodes[id].sm.applied >= probe)
    }

    /// No acknowledged proposal lost: every acknowledged entry is applied by every member, with
    /// the same state at its index as when it was acknowledged.
    fn check_acked_kept(&self) -> Result<(), Violation> {
        let max_acked = self.checker.acked.values().copied().max().unwrap_or_default();
        let leader = *self.leaders().first().ok_or(Violation("no leader at the end".into()))?;
        let members = self.nodes[&leader].raft.as_ref().map(|r| r.conf_state().members());
        for id in members.unwrap_or_default() {
            let node = &self.nodes[&id];
            if node.sm.applied < max_acked {
                return Err(Violation(format!(
                    "acknowledged entry {max_acked} not applied on member {} (at {})",
                    node.id, node.sm.applied
                )));
            }
        }
        for (&cid, &index) in &self.checker.acked {
            if self.checker.state_after(index).is_none() {
                return Err(Violation(format!("acknowledged proposal {cid} at {index} vanished")));
            }
        }
        Ok(())
    }
}
