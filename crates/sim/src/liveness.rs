//! Phase 2: heal everything, restart every member, stop the faults, and require service and
//! convergence within a bound; then judge the whole run.
//!
//! Converged means: a probe write, sent through a client to the leader, is acknowledged; every
//! member of the leader's configuration has executed the same log prefix (through the probe)
//! and, when members publish, holds every one of them's current attributes; they hold the same
//! revision, the same kv hash (etcd's `HashKV`) and the same members' attributes (which the
//! hash does not cover); and each member's data and leases (with their TTLs, checkpoints and
//! keys) equal the model's. Then every lease must be revoked, since no client keeps one alive
//! any more (`leases.rs` bounds when each goes), and the client history must be linearizable.

use bytes::Bytes;
use cairn_kv::{Command, PutRequest, RangeRequest, Revision};
use cairn_raft::{LogIndex, NodeId};

use crate::checker::Violation;
use crate::network::Faults;
use crate::workload::Op;
use crate::world::{World, TICK_UNITS};

impl World {
    pub(crate) fn liveness(&mut self) -> Result<(), Violation> {
        self.net.heal();
        self.net.faults = Faults { drop: 0.0, duplicate: 0.0, ..self.net.faults };
        for m in self.members.values_mut() {
            if !m.is_up() {
                m.restart_at = Some(self.now);
            }
        }
        self.leases.healed(self.now);
        let deadline = self.now + self.opts.liveness_ticks * TICK_UNITS;
        let mut probe: Option<u64> = None;
        let mut converged = false;
        while self.now < deadline {
            self.step(false)?;
            if !converged {
                if self.now.is_multiple_of(5 * TICK_UNITS)
                    && probe.is_none_or(|op| self.probe_failed(op))
                {
                    probe = self.send_probe();
                }
                let Some(index) = probe.and_then(|op| self.history.acked_index(op)) else {
                    continue;
                };
                let Some(members) = self.converged(LogIndex(index)) else { continue };
                self.check_converged(&members)?;
                converged = true;
            }
            if self.history.live_leases().is_empty() {
                self.stats.kv = self.history.check()?;
                return Ok(());
            }
        }
        Err(Violation(format!(
            "liveness: no leader committing, converging and revoking every lease within {} ticks after faults stopped (converged: {converged}, leaders: {:?}, probe {:?}, attributes missing: {:?}, leases left: {:?})",
            self.opts.liveness_ticks,
            self.leaders(),
            probe.map(|op| (op, self.history.acked_index(op))),
            self.unpublished(),
            self.history.live_leases()
        )))
    }

    /// (member, whose attributes it does not show as current), for the leader's configuration.
    fn unpublished(&self) -> Vec<(NodeId, NodeId)> {
        let Some(leader) = self.leaders().first().copied() else { return Vec::new() };
        let Some(raft) = self.members[&leader].replica.as_ref().map(|r| r.raft()) else {
            return Vec::new();
        };
        let members = raft.conf_state().members();
        let mut missing = Vec::new();
        for id in &members {
            let Some(replica) = self.members[id].replica.as_ref() else { continue };
            let shown = replica.store().members();
            for m in &members {
                if self.opts.publish && shown.get(&m.0) != Some(&self.members[m].attributes()) {
                    missing.push((*id, *m));
                }
            }
        }
        missing
    }

    /// The probe's answer came back and was not a success: send another.
    fn probe_failed(&self, op: u64) -> bool {
        self.history.is_complete(op) && self.history.acked_index(op).is_none()
    }

    /// Sends a probe write to the leader through an idle client.
    fn send_probe(&mut self) -> Option<u64> {
        let leader = *self.leaders().first()?;
        let client = *self.clients.idle().first()?;
        let put = PutRequest {
            key: Bytes::from_static(b"probe"),
            value: Bytes::from(format!("t{}", self.now)),
            ..PutRequest::default()
        };
        crate::clients::invoke_op(self, client, leader, Op::Write(Command::Put(put)))
    }

    /// The members of the leader's configuration if all of them are up and have executed the
    /// same prefix, through `probe` and up to the leader's commit index.
    fn converged(&self, probe: LogIndex) -> Option<Vec<NodeId>> {
        let leader = *self.leaders().first()?;
        let raft = self.members[&leader].replica.as_ref()?.raft();
        let (commit, members) = (raft.commit_index(), raft.conf_state().members());
        let mut executed = Vec::new();
        for id in &members {
            let replica = self.members[id].replica.as_ref()?;
            executed.push(replica.store().executed_index());
        }
        let all_at_commit = executed.iter().all(|e| *e == commit.0);
        let members: Vec<NodeId> = members.into_iter().collect();
        (all_at_commit && commit >= probe && self.published(&members)).then_some(members)
    }

    /// Every one of `members` shows every one's current attributes (with publishing off, there
    /// is nothing to wait for). A member that never manages to publish fails liveness.
    fn published(&self, members: &[NodeId]) -> bool {
        if !self.opts.publish {
            return true;
        }
        members.iter().all(|id| {
            let Some(replica) = self.members[id].replica.as_ref() else { return false };
            let shown = replica.store().members();
            members.iter().all(|m| shown.get(&m.0) == Some(&self.members[m].attributes()))
        })
    }

    /// Every member holds the same revision, the same kv hash, the same members' attributes,
    /// and the model's data.
    fn check_converged(&self, members: &[NodeId]) -> Result<(), Violation> {
        let mut first: Option<(NodeId, cairn_kv::KvHash)> = None;
        let mut attributes = None;
        let everything = RangeRequest {
            key: Bytes::from_static(b"\0"),
            range_end: Bytes::from_static(b"\0"),
            ..RangeRequest::default()
        };
        for id in members {
            let store =
                self.members[id].replica.as_ref().expect("converged members are up").store();
            let hash = store
                .hash_kv(Revision(0))
                .map_err(|e| Violation(format!("member {id}: hash_kv failed: {e}")))?;
            match &first {
                None => first = Some((*id, hash)),
                Some((other, h)) if *h != hash => {
                    return Err(Violation(format!(
                        "convergence: members {other} and {id} differ: {h:?} and {hash:?}"
                    )))
                }
                Some(_) => {}
            }
            let shown = store.members();
            match &attributes {
                None => attributes = Some((*id, shown)),
                Some((other, a)) if *a != shown => {
                    return Err(Violation(format!(
                        "convergence: members {other} and {id} show different attributes: {a:?} and {shown:?}"
                    )))
                }
                Some(_) => {}
            }
            let got = store.range(&everything);
            let want = self.history.expected_range(&everything, store.executed_index());
            if got != want {
                return Err(Violation(format!(
                    "convergence: member {id} holds {got:?}, the model {want:?}"
                )));
            }
            self.check_leases(*id, store)?;
        }
        Ok(())
    }

    /// A member's leases, their TTLs, checkpoints and keys, are the model's.
    fn check_leases(
        &self,
        id: NodeId,
        store: &cairn_kv::Store<crate::backend::SimBackend>,
    ) -> Result<(), Violation> {
        let (got, want) = (store.leases(), self.history.model_leases());
        if got != want {
            return Err(Violation(format!(
                "convergence: member {id} holds leases {got:?}, the model {want:?}"
            )));
        }
        for lease in want {
            let (got, want) = (store.lease_keys(lease.id), self.history.model_lease_keys(lease.id));
            if got != want {
                return Err(Violation(format!(
                    "convergence: member {id} attaches {got:?} to lease {}, the model {want:?}",
                    lease.id.0
                )));
            }
        }
        Ok(())
    }
}
