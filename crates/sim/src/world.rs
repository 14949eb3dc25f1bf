//! One simulated run: members, network, clock, clients and faults, all driven by one seed.
//!
//! Time advances in units; a member's tick takes 19 to 21 units (its clock drift). Phase 1 runs
//! the clients under faults and checks safety after every step. Phase 2 (`liveness.rs`) heals
//! everything and requires a leader, progress and convergence within a bound, then checks the
//! whole client history.

use std::collections::BTreeMap;

use cairn_node::{EngineError, Observed, ReplicaConfig, Reply};
use cairn_raft::{ConfState, Config, LogIndex, NodeId};

use crate::checker::{Checker, Violation};
use crate::clients::Clients;
use crate::history::History;
use crate::leases::Leases;
use crate::member::SimMember;
use crate::network::{Faults, NetEvent, Network};
use crate::rng::Rng;
use crate::{Options, Stats};

pub(crate) const TICK_UNITS: u64 = 20;
/// Clock drift: each member's tick lasts `TICK_UNITS ± DRIFT_UNITS`. With a lease of 8 ticks
/// and a follower guard of at least 9 ticks, leases are safe while 8 × 21 <= 9 × 19.
const DRIFT_UNITS: u64 = 1;

#[derive(Debug)]
pub struct World {
    pub(crate) opts: Options,
    pub(crate) rng: Rng,
    pub(crate) now: u64,
    pub(crate) members: BTreeMap<NodeId, SimMember>,
    /// Per member: the last index it applied (or installed), for the in-order check.
    pub(crate) applied: BTreeMap<NodeId, LogIndex>,
    pub(crate) net: Network,
    pub(crate) checker: Checker,
    pub(crate) history: History,
    pub(crate) clients: Clients,
    pub(crate) leases: Leases,
    pub(crate) stats: Stats,
}

fn replica_config(opts: &Options, id: NodeId) -> ReplicaConfig {
    let mut raft = Config::new(id);
    raft.seed = opts.seed;
    raft.read_mode = opts.read_mode;
    raft.max_msg_bytes = opts.max_msg_bytes;
    raft.max_inflight_msgs = 4;
    raft.planted_bug = opts.bug;
    raft.async_storage_writes = opts.async_writes;
    let mut cfg = ReplicaConfig::new(raft);
    cfg.request_timeout_ticks = 40;
    cfg.snapshot_entries = opts.snapshot_entries;
    cfg.snapshot_catchup_entries = opts.snapshot_catchup_entries;
    cfg.snapshot_catchup_max = opts.snapshot_catchup_max;
    cfg.observe = true;
    cfg.planted_bug = opts.replica_bug;
    // Checkpoints every second of lease time (etcd's interval is 5 minutes), so that leases
    // of a few seconds get them, and new leaders count down from them.
    cfg.lease_checkpoint_seconds = 1;
    cfg
}

impl World {
    pub fn new(opts: Options) -> Result<World, Violation> {
        let mut rng = Rng::new(opts.seed);
        let voters: Vec<NodeId> = (1..=opts.voters as u64).map(NodeId).collect();
        let founding = ConfState::with_voters(voters.iter().copied());
        let total = opts.voters + opts.spares;
        let mut members = BTreeMap::new();
        let mut applied = BTreeMap::new();
        for id in (1..=total as u64).map(NodeId) {
            let conf = voters.contains(&id).then(|| founding.clone());
            let period = rng.between(TICK_UNITS - DRIFT_UNITS, TICK_UNITS + DRIFT_UNITS);
            let mut m = SimMember::new(replica_config(&opts, id), conf, opts.publish, period);
            m.start(0).map_err(Violation)?;
            applied.insert(
                id,
                m.replica.as_ref().map_or(LogIndex::ZERO, |r| r.raft().applied_index()),
            );
            members.insert(id, m);
        }
        let faults = Faults { drop: 0.02, duplicate: 0.02, max_delay: 30 };
        let cfg = replica_config(&opts, NodeId(1));
        let clients = Clients::new(opts.clients, cfg.min_lease_ttl());
        let grace = u64::from(cfg.raft.election_timeout_ticks);
        let (fast, slow) = (TICK_UNITS - DRIFT_UNITS, TICK_UNITS + DRIFT_UNITS);
        let leases = Leases::new(fast, slow, cfg.tick_micros, grace);
        Ok(World {
            opts,
            rng,
            now: 0,
            members,
            applied,
            net: Network::new(faults),
            checker: Checker::default(),
            history: History::default(),
            clients,
            leases,
            stats: Stats::default(),
        })
    }

    pub fn run(mut self) -> Result<Stats, (u64, Violation)> {
        let fault_end = self.opts.fault_ticks * TICK_UNITS;
        while self.now < fault_end {
            self.step(true).map_err(|v| (self.now, v))?;
        }
        self.liveness().map_err(|v| (self.now, v))?;
        self.stats.elections = self.checker.elections;
        self.stats.reads = self.checker.reads_checked;
        self.stats.messages = self.net.sent;
        self.stats.snapshots_cut = self.net.snapshots_cut;
        self.stats.snapshots_resumed = self.net.snapshots_resumed;
        self.stats.proposals = self.clients.writes;
        self.stats.acked = self.stats.kv.writes_acked;
        self.stats.leases = self.leases.stats;
        Ok(self.stats)
    }

    pub(crate) fn ids(&self) -> Vec<NodeId> {
        self.members.keys().copied().collect()
    }

    pub(crate) fn up_ids(&self) -> Vec<NodeId> {
        self.members.values().filter(|m| m.is_up()).map(|m| m.id).collect()
    }

    /// Leaders, newest term first.
    pub(crate) fn leaders(&self) -> Vec<NodeId> {
        let mut by_term: Vec<_> = self
            .members
            .values()
            .filter_map(|m| m.replica.as_ref())
            .filter(|r| r.raft().role() == cairn_raft::Role::Leader)
            .map(|r| (r.raft().term(), r.id()))
            .collect();
        by_term.sort();
        by_term.into_iter().rev().map(|(_, id)| id).collect()
    }

    /// One unit of time.
    pub(crate) fn step(&mut self, faults: bool) -> Result<(), Violation> {
        self.now += 1;
        crate::NOW.with(|n| n.set(self.now));
        self.restart_due()?;
        self.tick_due();
        self.deliver_due();
        self.syncs_due();
        if faults {
            self.workload();
            self.inject_faults();
        }
        for id in self.ids() {
            self.process(id, faults)?;
            self.run_committer(id, faults)?;
        }
        self.check_all()
    }

    fn restart_due(&mut self) -> Result<(), Violation> {
        let now = self.now;
        for m in self.members.values_mut() {
            if m.restart_at.is_some_and(|t| t <= now) {
                m.start(now)
                    .map_err(|e| Violation(format!("member {} cannot restart: {e}", m.id)))?;
                let at = m.replica.as_ref().map_or(LogIndex::ZERO, |r| r.raft().applied_index());
                self.applied.insert(m.id, at);
                self.stats.restarts += 1;
            }
        }
        Ok(())
    }

    fn tick_due(&mut self) {
        let now = self.now;
        for m in self.members.values_mut() {
            if m.next_tick_at <= now {
                m.next_tick_at += m.tick_period;
                if let Some(r) = m.replica() {
                    r.handle_tick();
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
                            "t={} deliver {}->{} term {} {}",
                            self.now,
                            msg.from,
                            msg.to,
                            msg.term,
                            msg.kind_name()
                        );
                    }
                    if let Some(r) = self.members.get_mut(&msg.to).and_then(|m| m.replica()) {
                        r.handle_message(msg);
                    }
                }
                NetEvent::SnapshotReport { leader, to, status } => {
                    if let Some(r) = self.members.get_mut(&leader).and_then(|m| m.replica()) {
                        r.handle_snapshot_report(to, status);
                    }
                }
            }
        }
    }

    /// Completes log syncs now and then, as a driver's sync thread does: through the handle
    /// taken when the sync was asked for, then reported. By default one in twenty units: a
    /// sync lasts about a tick, as long as a message may be delayed, so crashes and elections
    /// land inside the window between a write and its sync.
    fn syncs_due(&mut self) {
        for id in self.ids() {
            if !self.rng.chance(self.opts.sync_rate) {
                continue;
            }
            let m = self.members.get_mut(&id).expect("member");
            let (Some((write, mut file)), Some(replica)) = (m.log_sync.take(), m.replica.as_mut())
            else {
                continue;
            };
            match file.sync() {
                Ok(()) => replica.handle_log_synced(write),
                // A failed sync stops the member, as the driver does (fail-stop).
                Err(_) => self.crash(id),
            }
        }
    }

    /// Lets one member process its inputs, then carries out its work: messages onto the
    /// network, batches to its committer, answers to clients, observations to the checkers.
    fn process(&mut self, id: NodeId, faults: bool) -> Result<(), Violation> {
        let disk_fault = faults && self.rng.chance(0.00003 * self.opts.chaos);
        let lose_outbox = faults && self.rng.chance(0.00003 * self.opts.chaos);
        let m = self.members.get_mut(&id).expect("member");
        let Some(replica) = m.replica.as_mut() else { return Ok(()) };
        // An install's two steps (the store takes the image, then the log records it) are where
        // a crash leaves a store ahead of its log: the disk fails at the log's record there
        // often enough for seeds to reach the recovery at open.
        let install_fault =
            faults && replica.has_snapshot_to_install() && self.rng.chance(0.02 * self.opts.chaos);
        if disk_fault || install_fault {
            // The disk fails within the next few operations: the replica must stop.
            m.disk.fail_after(if install_fault { 0 } else { self.rng.between(0, 4) });
            self.stats.disk_faults += 1;
        }
        // Under asynchronous writes a driver may sync some turns inline (`LogSync::Auto`
        // switches by the disk's speed): one turn in ten here.
        replica.set_sync_later(!self.rng.chance(0.1));
        let result = replica.process();
        let work = replica.work();
        let messages: Vec<_> = work.messages.drain(..).collect();
        let answers: Vec<_> = work.answers.drain(..).collect();
        let observed: Vec<_> = work.observed.drain(..).collect();
        let commits: Vec<_> = work.commits.drain(..).collect();
        let sync = work.store_sync.take();
        let log_sync = work.log_sync.take();
        work.leadership = None;
        let mut result = result;
        if let (Some(write), Ok(())) = (log_sync, &result) {
            // Synced on the spot (as a driver with nothing else to do), or later through a
            // handle (`syncs_due`).
            if self.rng.chance(0.3) {
                result = replica.sync_log();
            } else {
                match replica.log_sync_handle() {
                    Ok(file) => m.log_sync = Some((write, file)),
                    Err(e) => result = Err(e),
                }
            }
        }
        if let Some(c) = m.committer.as_mut() {
            commits.into_iter().for_each(|b| c.push(b));
            if sync.is_some() {
                c.want_sync();
            }
        }
        // Messages queued before a storage failure left; those of a completed turn are lost if
        // the member crashes before sending them.
        let crashed = result.is_err() || lose_outbox;
        if result.is_err() || !lose_outbox {
            for msg in messages {
                self.net.send(msg, self.now, &mut self.rng);
            }
        }
        self.observe(id, observed)?;
        for (op, answer) in answers {
            self.answer(id, op, answer)?;
        }
        if crashed {
            self.crash(id);
        }
        Ok(())
    }

    /// Hands what a member did to the checkers.
    fn observe(&mut self, id: NodeId, observed: Vec<Observed>) -> Result<(), Violation> {
        for ev in observed {
            let last = self.applied.entry(id).or_default();
            match ev {
                Observed::Persisted { prev_term, entries } => {
                    self.checker.check_persisted(prev_term, &entries)?;
                }
                Observed::Applied(a) => {
                    if self.opts.trace {
                        let what = a.request.as_ref().map(|(rid, cmd)| (rid.0, cmd));
                        println!("t={} member {id} applied {}: {what:?}", self.now, a.entry.index);
                    }
                    self.checker.check_applied(id, last, &a.entry)?;
                    let request = a.request.map(|(rid, cmd)| (rid.0, cmd));
                    self.history.applied(id.0, a.entry.index.0, request, a.outcome)?;
                    for change in self.history.take_lease_changes() {
                        self.leases.changed(change, self.now)?;
                    }
                }
                Observed::Installed(meta) => {
                    self.checker.check_installed(id, last, meta.index)?;
                    self.stats.snapshots_installed += 1;
                }
                Observed::Compacted(_) => self.stats.compactions += 1,
            }
        }
        Ok(())
    }

    /// Delivers one answer to the client waiting for it.
    fn answer(
        &mut self,
        member: NodeId,
        op: u64,
        answer: Result<Reply, EngineError>,
    ) -> Result<(), Violation> {
        match answer {
            Ok(Reply::Read) => self.serve_read(member, op),
            other => {
                let store = self.members[&member].replica.as_ref().map(|r| r.store());
                let executed = store.map_or(0, |s| s.executed_index());
                match self.clients.write_answered(&mut self.history, op, other, executed) {
                    Some(ack) => self.leases.acknowledged(ack, self.now),
                    None => Ok(()),
                }
            }
        }
    }

    /// A read may run: it runs on the member's store now, as the caller's thread would.
    fn serve_read(&mut self, member: NodeId, op: u64) -> Result<(), Violation> {
        let m = &self.members[&member];
        let Some(store) = m.replica.as_ref().map(|r| r.store().clone()) else { return Ok(()) };
        let executed = store.executed_index();
        if let Some((req, commit_at_start)) = self.clients.read_request(op) {
            self.checker.check_read(member, LogIndex(executed), commit_at_start)?;
            let result = store.range(&req);
            self.clients.read_answered(&mut self.history, op, result, executed);
        }
        Ok(())
    }

    /// Runs a member's committer now and then, as its thread would: commit what was executed,
    /// sync when asked, remove compacted history in small steps.
    fn run_committer(&mut self, id: NodeId, faults: bool) -> Result<(), Violation> {
        if !self.rng.chance(0.05) {
            return Ok(());
        }
        let fail = faults && self.rng.chance(0.0005 * self.opts.chaos);
        let step = self.rng.between(1, 8) as usize;
        let m = self.members.get_mut(&id).expect("member");
        let (Some(c), Some(replica)) = (m.committer.as_mut(), m.replica.as_mut()) else {
            return Ok(());
        };
        if fail {
            m.backend.fail_next_commit();
            self.stats.disk_faults += 1;
        }
        let result = c.commit().and_then(|durable| {
            if let Some(index) = durable {
                replica.handle_store_durable(index);
            }
            c.compact_step(step)
        });
        if result.is_err() {
            // The store failed: the member stops (fail-stop) and its supervisor restarts it.
            self.crash(id);
        }
        Ok(())
    }

    /// Crashes a member: its clients learn nothing more (their outcome is unknown).
    pub(crate) fn crash(&mut self, id: NodeId) {
        if !self.members[&id].is_up() {
            return;
        }
        let restart = self.restart_time();
        let m = self.members.get_mut(&id).expect("member");
        m.crash(&mut self.rng, restart);
        self.clients.member_crashed(&mut self.history, id);
        self.stats.crashes += 1;
    }

    fn check_all(&mut self) -> Result<(), Violation> {
        for m in self.members.values_mut() {
            let Some(replica) = m.replica.as_ref() else { continue };
            let raft = replica.raft();
            if self.opts.trace {
                let state = trace_state(m.id, raft);
                if m.last_traced.as_ref() != Some(&state) {
                    println!("t={} {state}", self.now);
                    m.last_traced = Some(state);
                }
            }
            raft.check_invariants();
            let elections = self.checker.elections;
            self.checker.check_leader(raft)?;
            if self.checker.elections > elections {
                self.leases.leader_elected(self.now);
            }
            self.checker.check_commit(raft, &mut m.seen_commit)?;
            let executed = replica.store().executed_index();
            if executed < m.seen_executed {
                return Err(Violation(format!(
                    "member {} went back from executing {} to {executed}",
                    m.id, m.seen_executed
                )));
            }
            m.seen_executed = executed;
        }
        Ok(())
    }

    /// The clients' next operations, on members that are up and count themselves in the
    /// configuration: the endpoints a client of the cluster knows.
    fn workload(&mut self) {
        let up: Vec<NodeId> = self
            .members
            .values()
            .filter_map(|m| m.replica.as_ref())
            .filter(|r| r.raft().conf_state().members().contains(&r.id()))
            .map(|r| r.id())
            .collect();
        let max_commit = self.checker.max_commit;
        crate::clients::invoke_due(self, &up, max_commit);
    }
}

fn trace_state(id: NodeId, raft: &cairn_raft::Raft) -> String {
    format!(
        "member {id} {:?} term {} leader {:?} commit {} applied {} last {} conf {:?}",
        raft.role(),
        raft.term(),
        raft.leader(),
        raft.commit_index(),
        raft.applied_index(),
        raft.last_index(),
        raft.conf_state()
    )
}
