//! The store against the executable model: random commands and reads over a small key space,
//! with restarts (index rebuilt from the backend) and physical compaction mixed in. Every
//! response and error must be identical.

use std::sync::Arc;

use bytes::Bytes;
use cairn_kv::backend::{Backend, BackendError, MemBackend, WriteBatch};
use cairn_kv::model::Model;
use cairn_kv::*;

use proptest::prelude::*;

/// Shares one in-memory backend between store incarnations, like a file reopened after restart.
#[derive(Clone, Debug, Default)]
struct Shared(Arc<MemBackend>);

impl Backend for Shared {
    type View<'a> = <MemBackend as Backend>::View<'a>;
    fn view(&self) -> Result<Self::View<'_>, BackendError> {
        self.0.view()
    }
    fn commit(&self, batch: WriteBatch) -> Result<(), BackendError> {
        self.0.commit(batch)
    }
    fn sync(&self) -> Result<(), BackendError> {
        self.0.sync()
    }
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
}

fn key() -> impl Strategy<Value = Bytes> {
    prop::sample::select(vec!["a", "ab", "b", "ba", "c", "d"])
        .prop_map(|k| Bytes::from(k.to_string()))
}

fn range_end() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        3 => Just(Bytes::new()),
        1 => Just(Bytes::from_static(&[0])),
        2 => prop::sample::select(vec!["b", "c", "e", "a"]).prop_map(|k| Bytes::from(k.to_string())),
    ]
}

fn rev() -> impl Strategy<Value = Revision> {
    prop_oneof![3 => Just(Revision(0)), 2 => (-1i64..40).prop_map(Revision)]
}

fn range_req() -> impl Strategy<Value = RangeRequest> {
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

fn put_req() -> impl Strategy<Value = PutRequest> {
    (
        key(),
        "[xyz]{0,2}",
        any::<bool>(),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.05),
    )
        .prop_map(|(key, v, prev_kv, ignore_value, ignore_lease, lease)| PutRequest {
            key,
            value: Bytes::from(v),
            lease: LeaseId(i64::from(lease)),
            prev_kv,
            ignore_value,
            ignore_lease,
        })
}

fn delete_req() -> impl Strategy<Value = DeleteRangeRequest> {
    (key(), range_end(), any::<bool>()).prop_map(|(key, range_end, prev_kv)| DeleteRangeRequest {
        key,
        range_end,
        prev_kv,
    })
}

fn compare() -> impl Strategy<Value = Compare> {
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

fn op(depth: u32) -> BoxedStrategy<RequestOp> {
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

fn txn(depth: u32) -> impl Strategy<Value = TxnRequest> {
    (
        prop::collection::vec(compare(), 0..3),
        prop::collection::vec(op(depth), 0..4),
        prop::collection::vec(op(depth), 0..4),
    )
        .prop_map(|(compare, success, failure)| TxnRequest { compare, success, failure })
}

#[derive(Clone, Debug)]
enum Step {
    Cmd(Command),
    Read(RangeRequest),
    Restart,
    PhysicalCompaction,
    /// Commit every execution not yet committed.
    Flush,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => put_req().prop_map(|p| Step::Cmd(Command::Put(p))),
        2 => delete_req().prop_map(|d| Step::Cmd(Command::DeleteRange(d))),
        4 => txn(1).prop_map(|t| Step::Cmd(Command::Txn(t))),
        1 => (0i64..30).prop_map(|r| Step::Cmd(Command::Compact(CompactRequest { revision: Revision(r), physical: false }))),
        5 => range_req().prop_map(Step::Read),
        1 => Just(Step::Restart),
        1 => Just(Step::PhysicalCompaction),
        2 => Just(Step::Flush),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Commands run through `execute` with commits deferred and grouped, as the engine does.
    /// Outcomes must match the model at once and reads see every execution; a restart loses the
    /// uncommitted executions, and replaying them (as the WAL would) gives the same outcomes.
    #[test]
    fn store_matches_the_model(steps in prop::collection::vec(step(), 1..80)) {
        let backend = Shared::default();
        let mut store = Store::open(backend.clone()).unwrap();
        let mut model = Model::default();
        let mut published = Model::default();
        let mut raft_index = 0u64;
        let mut pending = Vec::new();
        let mut uncommitted: Vec<(u64, Command, Outcome)> = Vec::new();
        for s in steps {
            match s {
                Step::Cmd(cmd) => {
                    raft_index += 1;
                    let (mut outs, prepared) = store.execute(&[(raft_index, Some(&cmd))]).unwrap();
                    let got = outs.pop().flatten().expect("an outcome");
                    let want = model.apply(&cmd);
                    prop_assert_eq!(&got, &want, "command {:?}", cmd);
                    pending.push(prepared);
                    uncommitted.push((raft_index, cmd, Some(got)));
                }
                Step::Flush => {
                    store.commit(std::mem::take(&mut pending)).unwrap();
                    uncommitted.clear();
                    published = model.clone();
                    prop_assert_eq!(store.current_revision(), model.current());
                }
                Step::Read(req) => prop_assert_eq!(store.range(&req), model.range(&req), "read {:?}", req),
                Step::Restart => {
                    drop(store);
                    pending.clear();
                    store = Store::open(backend.clone()).unwrap();
                    prop_assert_eq!(store.current_revision(), published.current());
                    prop_assert_eq!(store.range(&everything()), published.range(&everything()));
                    for (i, cmd, outcome) in &uncommitted {
                        let (mut outs, prepared) = store.execute(&[(*i, Some(cmd))]).unwrap();
                        prop_assert_eq!(&outs.pop().flatten(), outcome, "replay of {} differs", i);
                        pending.push(prepared);
                    }
                }
                Step::PhysicalCompaction => {
                    store.compact_step(2).unwrap();
                }
            }
        }
        store.commit(pending).unwrap();
        while store.compact_step(3).unwrap() {}
        prop_assert_eq!(store.applied_index(), raft_index);
        prop_assert_eq!(store.range(&everything()), model.range(&everything()));
    }
}

fn everything() -> RangeRequest {
    RangeRequest {
        key: Bytes::from_static(&[0]),
        range_end: Bytes::from_static(&[0]),
        ..RangeRequest::default()
    }
}

#[test]
fn replayed_entries_are_not_applied_twice() {
    let store = Store::open(MemBackend::default()).unwrap();
    let put = Command::Put(PutRequest {
        key: Bytes::from_static(b"k"),
        value: Bytes::from_static(b"v"),
        ..PutRequest::default()
    });
    store.apply(&[(1, Some(&put)), (2, None), (3, Some(&put))]).unwrap();
    assert_eq!(store.current_revision(), Revision(3));
    let again = store.apply(&[(2, None), (3, Some(&put)), (4, Some(&put))]).unwrap();
    assert_eq!(again[1], None, "index 3 was applied before");
    assert!(matches!(again[2], Some(Ok(_))));
    assert_eq!(store.current_revision(), Revision(4));
    assert_eq!(store.applied_index(), 4);
}
