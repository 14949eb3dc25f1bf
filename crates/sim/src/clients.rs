//! Simulated clients: each keeps at most one operation in flight at a member of its choosing,
//! proposes exactly what the engine would (`cairn_node::prepare`), and records every
//! invocation and answer in the history the checker judges.

use std::collections::BTreeMap;

use cairn_kv::{KvError, RangeRequest, RangeResponse};
use cairn_node::{prepare, EngineError, Limits, Reply};
use cairn_raft::{LogIndex, NodeId};

use crate::history::{History, OpKind, Outcome};
use crate::workload::{core_op, stack_op, Op};
use crate::world::World;

/// What etcd allows by default.
const LIMITS: Limits = Limits { max_request_bytes: 1536 * 1024, max_txn_ops: 128 };

#[derive(Debug)]
struct Pending {
    client: usize,
    member: NodeId,
    /// For a read: the request, and the highest commit index anywhere when it began.
    read: Option<(RangeRequest, LogIndex)>,
}

/// The clients and their operations in flight.
#[derive(Debug)]
pub struct Clients {
    busy: Vec<bool>,
    inflight: BTreeMap<u64, Pending>,
    /// Orders invocations and answers for the history's real-time order.
    clock: u64,
    pub(crate) writes: u64,
    pub(crate) reads: u64,
}

impl Clients {
    pub fn new(n: usize) -> Clients {
        Clients { busy: vec![false; n], inflight: BTreeMap::new(), clock: 0, writes: 0, reads: 0 }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn finish(&mut self, history: &mut History, op: u64, outcome: Outcome) {
        if let Some(p) = self.inflight.remove(&op) {
            self.busy[p.client] = false;
            let at = self.tick();
            history.complete(op, outcome, at);
        }
    }

    /// A proposal's answer, or a read that failed.
    pub fn write_answered(
        &mut self,
        history: &mut History,
        op: u64,
        answer: Result<Reply, EngineError>,
    ) {
        let is_read = self.inflight.get(&op).is_some_and(|p| p.read.is_some());
        let outcome = match answer {
            _ if is_read => Outcome::Unknown,
            Ok(Reply::Command(resp)) => Outcome::Write(Ok(resp)),
            // Applied, and applying it failed (etcd's rules at apply time).
            Err(EngineError::Kv(e)) => Outcome::Write(Err(e)),
            Err(e) if !e.outcome_unknown() => Outcome::Failed,
            Ok(
                Reply::Read
                | Reply::LeaderMoved
                | Reply::LeaseRenewed { .. }
                | Reply::LeaseTtl { .. },
            )
            | Err(_) => Outcome::Unknown,
        };
        self.finish(history, op, outcome);
    }

    /// The request of a read in flight, with the commit index when it began.
    pub fn read_request(&self, op: u64) -> Option<(RangeRequest, LogIndex)> {
        self.inflight.get(&op).and_then(|p| p.read.clone())
    }

    pub fn read_answered(
        &mut self,
        history: &mut History,
        op: u64,
        result: Result<RangeResponse, KvError>,
        at_index: u64,
    ) {
        self.finish(history, op, Outcome::Read { result, at_index });
    }

    /// A member crashed: its clients will never hear back.
    pub fn member_crashed(&mut self, history: &mut History, member: NodeId) {
        let ops: Vec<u64> =
            self.inflight.iter().filter(|(_, p)| p.member == member).map(|(op, _)| *op).collect();
        for op in ops {
            self.finish(history, op, Outcome::Unknown);
        }
    }

    pub fn idle(&self) -> Vec<usize> {
        (0..self.busy.len()).filter(|c| !self.busy[*c]).collect()
    }
}

/// Each idle client starts an operation now and then, at a random member that is up.
pub fn invoke_due(w: &mut World, up: &[NodeId], max_commit: LogIndex) {
    for client in w.clients.idle() {
        if !w.rng.chance(w.opts.client_rate) {
            continue;
        }
        let Some(&member) = w.rng.pick(up) else { return };
        invoke(w, client, member, max_commit);
    }
}

/// Starts one operation of `client` at `member`, drawn from the workload.
pub fn invoke(w: &mut World, client: usize, member: NodeId, max_commit: LogIndex) {
    let Some(replica) = w.members.get(&member).and_then(|m| m.replica.as_ref()) else { return };
    let current = replica.store().current_revision();
    let seq = w.clients.clock;
    let op =
        if w.opts.stack { stack_op(&mut w.rng, seq, current) } else { core_op(&mut w.rng, seq) };
    invoke_with(w, client, member, op, max_commit);
}

/// Starts `op` for `client` at `member`; returns its id.
pub fn invoke_op(w: &mut World, client: usize, member: NodeId, op: Op) -> Option<u64> {
    let max_commit = w.checker.max_commit;
    invoke_with(w, client, member, op, max_commit)
}

fn invoke_with(
    w: &mut World,
    client: usize,
    member: NodeId,
    op: Op,
    max_commit: LogIndex,
) -> Option<u64> {
    let m = w.members.get_mut(&member)?;
    let (Some(replica), Some(ids)) = (m.replica.as_mut(), m.ids.as_ref()) else { return None };
    let id = ids.next_id();
    let clients = &mut w.clients;
    clients.busy[client] = true;
    let at = clients.tick();
    match op {
        Op::Write(cmd) => {
            clients.writes += 1;
            w.history.invoke(id.0, OpKind::Write(cmd.clone()), at);
            clients.inflight.insert(id.0, Pending { client, member, read: None });
            match prepare(id, &cmd, LIMITS) {
                Ok(data) => replica.handle_propose(id, data, id.0),
                // Refused before proposing: certainly not applied.
                Err(_) => clients.finish(&mut w.history, id.0, Outcome::Failed),
            }
        }
        Op::Read(req) => {
            clients.reads += 1;
            w.history.invoke(id.0, OpKind::Read(req.clone()), at);
            let read = Some((req, max_commit));
            clients.inflight.insert(id.0, Pending { client, member, read });
            replica.handle_read(id.0);
        }
    }
    Some(id.0)
}
