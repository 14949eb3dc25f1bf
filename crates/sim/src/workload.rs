//! What simulated clients ask: etcd KV operations, drawn from the seed.
//!
//! The core mix writes unique keys and reads them back, which is all the consensus checks need.
//! The stack mix works a small key space hard: puts (with `prev_kv`, `ignore_value`), deletes of
//! keys and ranges, transactions with every compare target (Kubernetes' create and update
//! shapes among them), compactions, and reads at the latest and at older revisions with limits,
//! sorting, `keys_only` and `count_only`, so that compaction and history are exercised too.
//! It also works leases: grants under ids the server picks and under a few ids clients pick
//! (which collide), TTLs of a few election timeouts, revokes, keepalives and TimeToLive, and puts
//! that attach keys to leases (some that no longer exist) or keep a key's lease
//! (`ignore_lease`).

use bytes::Bytes;
use cairn_kv::{
    Command, CompactRequest, Compare, CompareResult, CompareTarget, DeleteRangeRequest, LeaseId,
    PutRequest, RangeRequest, RequestOp, Revision, SortOrder, SortTarget, TxnRequest,
};

use crate::rng::Rng;

/// One client operation.
#[derive(Clone, Debug)]
pub enum Op {
    Write(Command),
    Read(RangeRequest),
    /// Renew a lease; the leader answers, so the member asked forwards it to the leader it
    /// knows (as cairn's server forwards keepalives).
    KeepAlive(LeaseId),
    /// A lease's TTLs, from the leader as a keepalive.
    TimeToLive(LeaseId),
}

/// Lease ids clients choose themselves; few, so grants collide and puts name leases revoked.
const CLIENT_LEASES: u64 = 3;
/// Longest TTL asked for, in seconds (ten election timeouts of the simulated clock's ticks):
/// leases expire, and are kept alive, many times in a run. Shorter ones are raised to the
/// minimum as the engine raises them.
const MAX_TTL: u64 = 4;

const KEYS: u64 = 8;

fn key(rng: &mut Rng) -> Bytes {
    Bytes::from(format!("k{}", rng.between(0, KEYS - 1)))
}

fn value(op: u64) -> Bytes {
    Bytes::from(format!("v{op}"))
}

/// The core mix: a put of a key no one wrote before, or a read of one written recently.
pub fn core_op(rng: &mut Rng, op: u64) -> Op {
    if rng.chance(0.6) {
        let key = Bytes::from(format!("p{op:08}"));
        Op::Write(Command::Put(PutRequest { key, value: value(op), ..PutRequest::default() }))
    } else {
        let back = rng.between(1, 20);
        let key = Bytes::from(format!("p{:08}", op.saturating_sub(back)));
        Op::Read(RangeRequest { key, ..RangeRequest::default() })
    }
}

/// The stack mix. `current` is the revision the chosen member's store is at, to aim
/// compactions and historical reads near the live range; `leases` are ids granted lately.
pub fn stack_op(rng: &mut Rng, op: u64, current: Revision, leases: &[LeaseId]) -> Op {
    let mut g = Gen { rng, op, current, leases };
    match g.rng.between(0, 99) {
        0..=24 => Op::Write(Command::Put(g.put())),
        25..=31 => Op::Write(Command::DeleteRange(delete(g.rng))),
        32..=44 => Op::Write(Command::Txn(g.txn(0))),
        45..=46 => {
            let back = g.rng.between(0, 12) as i64;
            let revision = Revision((current.0 - back).max(0));
            Op::Write(Command::Compact(CompactRequest { revision, physical: g.rng.chance(0.3) }))
        }
        47..=50 => {
            // Id 0: the member picks one, as the engine does.
            let id = if g.rng.chance(0.5) { LeaseId(0) } else { g.client_lease() };
            Op::Write(Command::LeaseGrant { id, ttl: g.rng.between(1, MAX_TTL) as i64 })
        }
        51..=52 => Op::Write(Command::LeaseRevoke { id: g.lease() }),
        53..=60 => Op::KeepAlive(g.lease()),
        61..=62 => Op::TimeToLive(g.lease()),
        _ => Op::Read(range(g.rng, current)),
    }
}

/// What the stack mix draws from.
struct Gen<'a> {
    rng: &'a mut Rng,
    op: u64,
    current: Revision,
    leases: &'a [LeaseId],
}

impl Gen<'_> {
    fn client_lease(&mut self) -> LeaseId {
        LeaseId(self.rng.between(1, CLIENT_LEASES) as i64)
    }

    /// Mostly a lease granted lately, else one a client picks (which may not exist).
    fn lease(&mut self) -> LeaseId {
        match self.rng.pick(self.leases) {
            Some(&id) if self.rng.chance(0.7) => id,
            _ => self.client_lease(),
        }
    }

    /// A put; some attach the key to a lease, some keep the lease it has.
    fn put(&mut self) -> PutRequest {
        let ignore_value = self.rng.chance(0.05);
        let ignore_lease = self.rng.chance(0.05);
        let lease = if !ignore_lease && self.rng.chance(0.3) { self.lease() } else { LeaseId(0) };
        PutRequest {
            key: key(self.rng),
            value: if ignore_value { Bytes::new() } else { value(self.op) },
            prev_kv: self.rng.chance(0.3),
            ignore_value,
            lease,
            ignore_lease,
        }
    }
}

fn delete(rng: &mut Rng) -> DeleteRangeRequest {
    let key = key(rng);
    let range_end = if rng.chance(0.3) {
        Bytes::from(format!("k{}", rng.between(0, KEYS)))
    } else {
        Bytes::new()
    };
    DeleteRangeRequest { key, range_end, prev_kv: rng.chance(0.5) }
}

fn compare(rng: &mut Rng, current: Revision) -> Compare {
    let recent = Revision((current.0 - rng.between(0, 6) as i64).max(0));
    let target = match rng.between(0, 4) {
        0 => CompareTarget::Version(rng.between(0, 3) as i64),
        1 => CompareTarget::Create(if rng.chance(0.5) { Revision(0) } else { recent }),
        2 => CompareTarget::Mod(if rng.chance(0.5) { Revision(0) } else { recent }),
        3 => CompareTarget::Value(Bytes::from(format!("v{}", rng.between(0, 40)))),
        _ => CompareTarget::Lease(LeaseId(rng.between(0, CLIENT_LEASES) as i64)),
    };
    let result = match rng.between(0, 3) {
        0 => CompareResult::Equal,
        1 => CompareResult::NotEqual,
        2 => CompareResult::Greater,
        _ => CompareResult::Less,
    };
    let range_end = if rng.chance(0.15) { Bytes::from_static(b"k5") } else { Bytes::new() };
    Compare { key: key(rng), range_end, target, result }
}

impl Gen<'_> {
    fn request_op(&mut self, depth: u32) -> RequestOp {
        match self.rng.between(0, 9) {
            0..=3 => RequestOp::Put(self.put()),
            4 | 5 => RequestOp::DeleteRange(delete(self.rng)),
            6 if depth < 2 => RequestOp::Txn(self.txn(depth + 1)),
            _ => RequestOp::Range(range(self.rng, self.current)),
        }
    }

    /// A transaction; its branches may write one key twice, which etcd refuses before
    /// proposing (a certain failure the checker also verifies).
    fn txn(&mut self, depth: u32) -> TxnRequest {
        let compares = self.rng.between(0, 2);
        let compare = (0..compares).map(|_| compare(self.rng, self.current)).collect();
        let success = (0..self.rng.between(0, 3)).map(|_| self.request_op(depth)).collect();
        let failure = (0..self.rng.between(0, 2)).map(|_| self.request_op(depth)).collect();
        TxnRequest { compare, success, failure }
    }
}

fn range(rng: &mut Rng, current: Revision) -> RangeRequest {
    let (key, range_end) = match rng.between(0, 3) {
        0 | 1 => (key(rng), Bytes::new()),
        2 => (Bytes::from_static(b"k"), Bytes::from_static(b"l")),
        _ => (key(rng), Bytes::from_static(b"\0")),
    };
    let revision = if rng.chance(0.25) {
        Revision((current.0 - rng.between(0, 15) as i64).max(0))
    } else {
        Revision(0)
    };
    let (sort_order, sort_target) = if rng.chance(0.2) {
        let order = if rng.chance(0.5) { SortOrder::Ascend } else { SortOrder::Descend };
        let target = match rng.between(0, 4) {
            0 => SortTarget::Key,
            1 => SortTarget::Version,
            2 => SortTarget::Create,
            3 => SortTarget::Mod,
            _ => SortTarget::Value,
        };
        (order, target)
    } else {
        (SortOrder::None, SortTarget::Key)
    };
    RangeRequest {
        key,
        range_end,
        limit: if rng.chance(0.2) { rng.between(1, 3) as i64 } else { 0 },
        revision,
        sort_order,
        sort_target,
        keys_only: rng.chance(0.1),
        count_only: rng.chance(0.1),
        ..RangeRequest::default()
    }
}
