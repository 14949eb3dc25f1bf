//! What the store's tests share: a backend that survives a store's restart, and generators of
//! random requests over a small key space (so keys collide and histories grow).

#![allow(dead_code)] // Each test crate uses a different part.

use std::sync::Arc;

use bytes::Bytes;
use cairn_kv::backend::{Backend, BackendError, MemBackend, WriteBatch};
use cairn_kv::*;
use proptest::prelude::*;

/// Shares one in-memory backend between store incarnations, like a file reopened after restart.
#[derive(Clone, Debug, Default)]
pub struct Shared(pub Arc<MemBackend>);

impl Backend for Shared {
    type View<'a> = <MemBackend as Backend>::View<'a>;
    fn view(&self) -> Result<Self::View<'_>, BackendError> {
        self.0.view()
    }
    fn commit(&self, batch: WriteBatch) -> Result<(), BackendError> {
        self.0.commit(batch)
    }
    fn replace(&self, batch: WriteBatch) -> Result<(), BackendError> {
        self.0.replace(batch)
    }
    fn sync(&self) -> Result<(), BackendError> {
        self.0.sync()
    }
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
}

pub fn key() -> impl Strategy<Value = Bytes> {
    prop::sample::select(vec!["a", "ab", "b", "ba", "c", "d"])
        .prop_map(|k| Bytes::from(k.to_string()))
}

pub fn range_end() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        3 => Just(Bytes::new()),
        1 => Just(Bytes::from_static(&[0])),
        2 => prop::sample::select(vec!["b", "c", "e", "a"]).prop_map(|k| Bytes::from(k.to_string())),
    ]
}

pub fn rev() -> impl Strategy<Value = Revision> {
    prop_oneof![3 => Just(Revision(0)), 2 => (-1i64..40).prop_map(Revision)]
}

pub fn range_req() -> impl Strategy<Value = RangeRequest> {
    let sort = (0u8..3, 0u8..5).prop_map(|(o, t)| {
        let order = [SortOrder::None, SortOrder::Ascend, SortOrder::Descend][o as usize];
        let target = [
            SortTarget::Key,
            SortTarget::Version,
            SortTarget::Create,
            SortTarget::Mod,
            SortTarget::Value,
        ][t as usize];
        (order, target)
    });
    let filters = (0i64..3, 0i64..20, 0i64..3, 0i64..20).prop_map(|(a, b, c, d)| {
        let f = |on: i64, v: i64| Revision(if on == 0 { v } else { 0 });
        (f(a, b), f(a + 1, b + 5), f(c, d), f(c + 1, d + 5))
    });
    (key(), range_end(), 0i64..4, rev(), sort, any::<bool>(), any::<bool>(), filters).prop_map(
        |(key, range_end, limit, revision, (sort_order, sort_target), keys_only, count_only, f)| {
            RangeRequest {
                key,
                range_end,
                limit,
                revision,
                sort_order,
                sort_target,
                keys_only,
                count_only: count_only && keys_only,
                min_mod_revision: f.0,
                max_mod_revision: f.1,
                min_create_revision: f.2,
                max_create_revision: f.3,
                ..RangeRequest::default()
            }
        },
    )
}

pub fn put_req() -> impl Strategy<Value = PutRequest> {
    (
        key(),
        "[xyz]{0,2}",
        any::<bool>(),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.1),
        prop_oneof![4 => Just(0i64), 1 => 1i64..4],
    )
        .prop_map(|(key, v, prev_kv, ignore_value, ignore_lease, lease)| PutRequest {
            key,
            value: Bytes::from(v),
            lease: LeaseId(lease),
            prev_kv,
            ignore_value,
            ignore_lease,
        })
}

pub fn delete_req() -> impl Strategy<Value = DeleteRangeRequest> {
    (key(), range_end(), any::<bool>()).prop_map(|(key, range_end, prev_kv)| DeleteRangeRequest {
        key,
        range_end,
        prev_kv,
    })
}

pub fn compare() -> impl Strategy<Value = Compare> {
    let target = prop_oneof![
        (0i64..4).prop_map(CompareTarget::Version),
        (0i64..30).prop_map(|r| CompareTarget::Create(Revision(r))),
        (0i64..30).prop_map(|r| CompareTarget::Mod(Revision(r))),
        "[xyz]{0,2}".prop_map(|v| CompareTarget::Value(Bytes::from(v))),
        (0i64..2).prop_map(|l| CompareTarget::Lease(LeaseId(l))),
    ];
    let result = prop::sample::select(vec![
        CompareResult::Equal,
        CompareResult::Greater,
        CompareResult::Less,
        CompareResult::NotEqual,
    ]);
    (key(), prop_oneof![4 => Just(Bytes::new()), 1 => range_end()], target, result)
        .prop_map(|(key, range_end, target, result)| Compare { key, range_end, target, result })
}

pub fn op(depth: u32) -> BoxedStrategy<RequestOp> {
    let leaf = prop_oneof![
        range_req().prop_map(RequestOp::Range),
        put_req().prop_map(RequestOp::Put),
        delete_req().prop_map(RequestOp::DeleteRange),
    ];
    if depth == 0 {
        leaf.boxed()
    } else {
        prop_oneof![4 => leaf, 1 => txn(depth - 1).prop_map(RequestOp::Txn)].boxed()
    }
}

pub fn txn(depth: u32) -> impl Strategy<Value = TxnRequest> {
    (
        prop::collection::vec(compare(), 0..3),
        prop::collection::vec(op(depth), 0..4),
        prop::collection::vec(op(depth), 0..4),
    )
        .prop_map(|(compare, success, failure)| TxnRequest { compare, success, failure })
}

pub fn everything() -> RangeRequest {
    RangeRequest {
        key: Bytes::from_static(&[0]),
        range_end: Bytes::from_static(&[0]),
        ..RangeRequest::default()
    }
}

/// A read of every key at `rev` (0: the current revision).
pub fn everything_at(rev: i64) -> RangeRequest {
    RangeRequest { revision: Revision(rev), ..everything() }
}

/// A member publishing its attributes, or the membership setting peer URLs and removing
/// members; three members, so they overwrite each other's.
pub fn publish() -> impl Strategy<Value = Command> {
    let urls = || prop::collection::vec("http://[a-c]{1,2}:2379", 0..3);
    let publish = (1u64..4, "[a-z]{0,3}", urls()).prop_map(|(member, name, client_urls)| {
        Command::PublishMember {
            member,
            attributes: MemberAttributes { name, client_urls, ..Default::default() },
        }
    });
    let peers = prop::collection::vec((1u64..4, urls()), 0..2);
    let removed = prop::collection::vec(1u64..4, 0..2);
    let membership =
        (peers, removed).prop_map(|(peers, removed)| Command::Membership { peers, removed });
    prop_oneof![3 => publish, 1 => membership]
}

/// Lease grants, revokes, expiries and checkpoints (by id, as an older cairn wrote them, and of
/// a grant) over three lease ids (so they collide).
pub fn lease_cmd() -> impl Strategy<Value = Command> {
    let id = || (1i64..4).prop_map(LeaseId);
    prop_oneof![
        2 => (id(), 1i64..100).prop_map(|(id, ttl)| Command::LeaseGrant { id, ttl }),
        2 => id().prop_map(|id| Command::LeaseRevoke { id }),
        // Grant indexes small enough to name a grant of the run now and then.
        1 => (id(), 0u64..40).prop_map(|(id, grant_index)| Command::LeaseExpire { id, grant_index }),
        1 => prop::collection::vec((id(), 0i64..100), 0..3)
            .prop_map(|checkpoints| Command::LeaseCheckpoint { checkpoints }),
        // As for expiries, grant indexes that now and then name a grant of the run.
        1 => prop::collection::vec((id(), 0u64..40, 0i64..100), 0..3).prop_map(|checkpoints| {
            let checkpoints = checkpoints
                .into_iter()
                .map(|(id, grant_index, remaining)| GrantCheckpoint { id, grant_index, remaining })
                .collect();
            Command::LeaseGrantCheckpoint { checkpoints }
        }),
    ]
}

/// Any mutating command, compactions, member attributes and leases included.
pub fn command() -> impl Strategy<Value = Command> {
    let compact = |r| Command::Compact(CompactRequest { revision: Revision(r), physical: false });
    prop_oneof![
        6 => put_req().prop_map(Command::Put),
        2 => delete_req().prop_map(Command::DeleteRange),
        3 => txn(1).prop_map(Command::Txn),
        1 => (0i64..30).prop_map(compact),
        1 => publish(),
        2 => lease_cmd(),
    ]
}

/// A store driven as the engine drives it (commands executed at once, commits deferred and
/// grouped), next to the model it must match.
#[derive(Debug)]
pub struct Driven {
    pub backend: Shared,
    pub store: Store<Shared>,
    pub model: cairn_kv::model::Model,
    pub raft_index: u64,
    pub pending: Vec<Prepared>,
}

impl Driven {
    pub fn new() -> Driven {
        let backend = Shared::default();
        let store = Store::open(backend.clone()).expect("an empty store opens");
        Driven { backend, store, model: Default::default(), raft_index: 0, pending: Vec::new() }
    }

    /// Executes `cmd` at the next Raft index; its outcome must be the model's.
    pub fn execute(&mut self, cmd: &Command) {
        self.raft_index += 1;
        let (mut outs, prepared) =
            self.store.execute(&[(self.raft_index, Some(cmd))]).expect("execute");
        let got = outs.pop().flatten().expect("an outcome");
        assert_eq!(got, self.model.apply_at(self.raft_index, cmd), "command {cmd:?}");
        self.pending.push(prepared);
    }

    pub fn flush(&mut self) {
        self.store.commit(std::mem::take(&mut self.pending)).expect("commit");
    }
}
