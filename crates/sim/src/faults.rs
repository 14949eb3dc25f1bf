//! The fault menu of phase 1: crashes of a minority, power loss of the whole cluster, network
//! partitions of every shape, membership changes and leadership transfers.

use std::collections::BTreeSet;

use cairn_raft::{ConfChange, ConfChangeSingle, LeaveJoint, NodeId};

use crate::world::{World, TICK_UNITS};

impl World {
    pub(crate) fn inject_faults(&mut self) {
        let ids = self.ids();
        let up = self.up_ids();
        let down = ids.len() - up.len();
        // Crash at most a minority of the founding voters' count at once, so the run makes
        // progress between crashes.
        if down < (self.opts.voters - 1) / 2 && self.rng.chance(0.0015 * self.opts.chaos) {
            if let Some(&id) = self.rng.pick(&up) {
                self.crash(id);
            }
        }
        if self.rng.chance(self.opts.power_loss_rate) && !up.is_empty() {
            // Every member loses power at once: only what each disk made durable survives.
            for id in up {
                self.crash(id);
            }
            self.stats.power_losses += 1;
        }
        if self.rng.chance(0.002 * self.opts.chaos) {
            if self.net.is_partitioned() {
                self.net.heal();
            } else {
                self.partition(&ids);
            }
            self.stats.partitions += 1;
        }
        if self.opts.membership && self.rng.chance(0.002) {
            self.propose_membership_change();
        }
        if self.rng.chance(0.001) {
            self.transfer_leadership();
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
                // One-way: a member can send but not hear, or the reverse.
                let (Some(&a), Some(&b)) = (self.rng.pick(ids), self.rng.pick(ids)) else { return };
                self.net.cut_link(a, b);
            }
        }
    }

    fn propose_membership_change(&mut self) {
        let Some(&leader) = self.leaders().first() else { return };
        let Some(replica) = self.members[&leader].replica.as_ref() else { return };
        let conf = replica.raft().conf_state().clone();
        let all: BTreeSet<NodeId> = self.members.keys().copied().collect();
        let outsiders: Vec<NodeId> = all.difference(&conf.members()).copied().collect();
        let learners: Vec<NodeId> = conf.learners.iter().copied().collect();
        let voters: Vec<NodeId> = conf.voters.iter().copied().collect();
        let cc = if conf.is_joint() {
            ConfChange {
                changes: Vec::new(),
                leave_joint: LeaveJoint::Auto,
                ..ConfChange::default()
            }
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
            ConfChange { changes, leave_joint, ..ConfChange::default() }
        };
        let replica = self.members.get_mut(&leader).and_then(|m| m.replica()).expect("leader");
        if replica.propose_conf_change(cc).is_ok() {
            self.stats.conf_changes += 1;
        }
    }

    fn transfer_leadership(&mut self) {
        let Some(&leader) = self.leaders().first() else { return };
        let replica = self.members.get_mut(&leader).and_then(|m| m.replica()).expect("leader");
        let voters: Vec<NodeId> = replica.raft().conf_state().voters.iter().copied().collect();
        if let Some(&target) = self.rng.pick(&voters) {
            if replica.transfer_leader(target).is_ok() {
                self.stats.transfers += 1;
            }
        }
    }

    /// When a crashed member comes back.
    pub(crate) fn restart_time(&mut self) -> u64 {
        self.now + self.rng.between(5, 60) * TICK_UNITS
    }
}
