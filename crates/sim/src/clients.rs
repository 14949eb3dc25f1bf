//! Simulated clients: each keeps at most one operation in flight at a member of its choosing,
//! proposes exactly what the engine would (`cairn_node::prepare`), and records every
//! invocation and answer in the history the checker judges. Lease grants are proposed as the
//! engine proposes them (an id the member picks when the client gives none, the TTL raised to
//! the minimum); keepalives and TimeToLive go to the leader the member asked knows of, as the
//! server forwards them.

use std::collections::BTreeMap;

use cairn_kv::{Command, KvError, LeaseId, RangeRequest, RangeResponse};
use cairn_node::{prepare, EngineError, Limits, Reply, RequestIds};
use cairn_raft::{LogIndex, NodeId};

use crate::history::{History, LeaseAnswer, OpKind, Outcome};
use crate::leases::LeaseAck;
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
    /// For a lease query: the lease, and the index the answering store had executed.
    lease: Option<(LeaseId, u64)>,
}

/// Lease ids granted lately, that clients keep alive, revoke and attach keys to.
const KNOWN_LEASES: usize = 6;

/// The clients and their operations in flight.
#[derive(Debug)]
pub struct Clients {
    busy: Vec<bool>,
    inflight: BTreeMap<u64, Pending>,
    /// Orders invocations and answers for the history's real-time order.
    clock: u64,
    pub(crate) writes: u64,
    pub(crate) reads: u64,
    /// Lease ids granted lately (whether or not the grant succeeded), newest last.
    leases: Vec<LeaseId>,
    /// The shortest TTL the engine grants: shorter requests are raised to it.
    min_ttl: i64,
}

impl Clients {
    pub fn new(n: usize, min_ttl: i64) -> Clients {
        Clients {
            busy: vec![false; n],
            inflight: BTreeMap::new(),
            clock: 0,
            writes: 0,
            reads: 0,
            leases: Vec::new(),
            min_ttl,
        }
    }

    /// A grant as the engine proposes it: under an id the member picks when the client gave
    /// none (unique across members and lives), with the TTL raised to the minimum. The lease
    /// joins those clients know.
    fn as_engine_grants(&mut self, cmd: Command, ids: &RequestIds) -> Command {
        let Command::LeaseGrant { id, ttl } = cmd else { return cmd };
        let mut id = id;
        while id.0 == 0 {
            id = LeaseId((ids.next_id().0 & (i64::MAX as u64)) as i64);
        }
        if !self.leases.contains(&id) {
            if self.leases.len() == KNOWN_LEASES {
                self.leases.remove(0);
            }
            self.leases.push(id);
        }
        Command::LeaseGrant { id, ttl: ttl.max(self.min_ttl) }
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

    /// A proposal's answer, a lease query's (from a store that has executed the log up to
    /// `executed`), or a read that failed. Returns what a lease acknowledgement promised.
    pub fn write_answered(
        &mut self,
        history: &mut History,
        op: u64,
        answer: Result<Reply, EngineError>,
        executed: u64,
    ) -> Option<LeaseAck> {
        let pending = self.inflight.get(&op)?;
        let is_read = pending.read.is_some();
        if let Some((id, at_index)) = pending.lease {
            return self.lease_answered(history, op, id, (at_index, executed), answer);
        }
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
        None
    }

    /// A keepalive's or TimeToLive's answer. One that did not reach the lease (no leader, not
    /// the leader) changed nothing: it failed.
    fn lease_answered(
        &mut self,
        history: &mut History,
        op: u64,
        id: LeaseId,
        (at_index, answered_index): (u64, u64),
        answer: Result<Reply, EngineError>,
    ) -> Option<LeaseAck> {
        let (outcome, ack) = match answer {
            Ok(Reply::LeaseRenewed { ttl }) => {
                (Ok(LeaseAnswer::Renewed { ttl }), Some(LeaseAck::Renewed { id, ttl }))
            }
            Ok(Reply::LeaseTtl { granted, remaining }) => (
                Ok(LeaseAnswer::Ttl { granted, remaining }),
                Some(LeaseAck::Ttl { id, granted, remaining }),
            ),
            Err(EngineError::Kv(e)) => (Err(e), None),
            _ => {
                self.finish(history, op, Outcome::Failed);
                return None;
            }
        };
        self.finish(history, op, Outcome::Lease { result: outcome, at_index, answered_index });
        ack
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
    let op = if w.opts.stack {
        stack_op(&mut w.rng, seq, current, &w.clients.leases)
    } else {
        core_op(&mut w.rng, seq)
    };
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
    if let Op::KeepAlive(lease) | Op::TimeToLive(lease) = op {
        return ask_leader(w, client, member, &op, lease);
    }
    let m = w.members.get_mut(&member)?;
    let (Some(replica), Some(ids)) = (m.replica.as_mut(), m.ids.as_ref()) else { return None };
    let id = ids.next_id();
    let clients = &mut w.clients;
    clients.busy[client] = true;
    let at = clients.tick();
    match op {
        Op::Write(cmd) => {
            let cmd = clients.as_engine_grants(cmd, ids);
            clients.writes += 1;
            w.history.invoke(id.0, OpKind::Write(cmd.clone()), at);
            clients.inflight.insert(id.0, Pending { client, member, read: None, lease: None });
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
            clients.inflight.insert(id.0, Pending { client, member, read, lease: None });
            replica.handle_read(id.0);
        }
        Op::KeepAlive(_) | Op::TimeToLive(_) => unreachable!("asked of the leader above"),
    }
    Some(id.0)
}

/// A keepalive or TimeToLive, sent to `member` and forwarded to the leader it knows of (if
/// that one is up), as cairn's server forwards them. The replica answers at once, from its
/// store as executed now, which is the index the history judges the answer at.
fn ask_leader(
    w: &mut World,
    client: usize,
    member: NodeId,
    op: &Op,
    lease: LeaseId,
) -> Option<u64> {
    let asked = w.members.get(&member)?.replica.as_ref()?;
    let to = asked
        .raft()
        .leader()
        .filter(|l| w.members.get(l).is_some_and(|m| m.is_up()))
        .unwrap_or(member);
    let id = w.members.get(&member)?.ids.as_ref()?.next_id();
    let replica = w.members.get_mut(&to)?.replica.as_mut()?;
    let clients = &mut w.clients;
    clients.busy[client] = true;
    let at = clients.tick();
    let kind = match op {
        Op::KeepAlive(_) => OpKind::KeepAlive(lease),
        _ => OpKind::TimeToLive(lease),
    };
    w.history.invoke(id.0, kind, at);
    let at_index = replica.store().executed_index();
    let pending = Pending { client, member: to, read: None, lease: Some((lease, at_index)) };
    clients.inflight.insert(id.0, pending);
    match op {
        Op::KeepAlive(_) => replica.handle_lease_renew(lease, id.0),
        _ => replica.handle_lease_ttl(lease, id.0),
    }
    Some(id.0)
}
