//! etcd rules checked directly, with etcd's own messages.

use bytes::Bytes;
use cairn_kv::backend::MemBackend;
use cairn_kv::validate::{check_put, check_txn, DEFAULT_MAX_TXN_OPS};
use cairn_kv::watch::EventKind;
use cairn_kv::*;

fn b(s: &str) -> Bytes {
    Bytes::from(s.to_string())
}

fn put(k: &str, v: &str) -> RequestOp {
    RequestOp::Put(PutRequest { key: b(k), value: b(v), ..PutRequest::default() })
}

fn del(k: &str, end: &str) -> RequestOp {
    RequestOp::DeleteRange(DeleteRangeRequest { key: b(k), range_end: b(end), prev_kv: false })
}

fn txn(success: Vec<RequestOp>, failure: Vec<RequestOp>) -> TxnRequest {
    TxnRequest { compare: vec![], success, failure }
}

#[test]
fn duplicate_keys_follow_etcd_check_intervals() {
    let ok = |t: TxnRequest| check_txn(&t, DEFAULT_MAX_TXN_OPS);
    assert_eq!(ok(txn(vec![put("a", "1"), put("a", "2")], vec![])), Err(KvError::DuplicateKey));
    assert_eq!(ok(txn(vec![del("a", "c"), put("b", "1")], vec![])), Err(KvError::DuplicateKey));
    assert_eq!(
        ok(txn(vec![put("a", "1")], vec![put("a", "2")])),
        Ok(()),
        "branches exclude each other"
    );
    let nested = RequestOp::Txn(txn(vec![put("k", "1")], vec![put("k", "2")]));
    assert_eq!(
        ok(txn(vec![nested.clone()], vec![])),
        Ok(()),
        "nested then/else exclude each other"
    );
    assert_eq!(ok(txn(vec![nested, put("k", "3")], vec![])), Err(KvError::DuplicateKey));
    assert_eq!(
        ok(txn(vec![del("a", ""), del("a", "z")], vec![])),
        Ok(()),
        "overlapping deletes are fine"
    );
}

#[test]
fn nesting_is_bounded_so_every_accepted_txn_can_be_applied() {
    let nest = |depth: usize| {
        let mut t = txn(vec![put("k", "v")], vec![]);
        for _ in 1..depth {
            t = txn(vec![RequestOp::Txn(t)], vec![]);
        }
        t
    };
    assert_eq!(check_txn(&nest(cairn_kv::validate::MAX_TXN_DEPTH), 128), Ok(()));
    assert_eq!(
        check_txn(&nest(cairn_kv::validate::MAX_TXN_DEPTH + 1), 128),
        Err(KvError::TxnTooDeep)
    );
}

#[test]
fn limits_and_empty_keys() {
    let many = (0..129).map(|i| put(&format!("k{i}"), "v")).collect();
    assert_eq!(check_txn(&txn(many, vec![]), DEFAULT_MAX_TXN_OPS), Err(KvError::TooManyOps));
    let exactly = (0..128).map(|i| put(&format!("k{i}"), "v")).collect();
    assert_eq!(check_txn(&txn(exactly, vec![]), DEFAULT_MAX_TXN_OPS), Ok(()));
    assert_eq!(check_txn(&txn(vec![put("", "v")], vec![]), 128), Err(KvError::EmptyKey));
    assert_eq!(KvError::TooManyOps.to_string(), "etcdserver: too many operations in txn request");
    assert_eq!(KvError::DuplicateKey.to_string(), "etcdserver: duplicate key given in txn request");
    assert_eq!(
        KvError::Compacted.to_string(),
        "etcdserver: mvcc: required revision has been compacted"
    );
    assert_eq!(
        KvError::FutureRev.to_string(),
        "etcdserver: mvcc: required revision is a future revision"
    );
}

#[test]
fn puts_that_contradict_themselves_are_refused_as_etcd_does() {
    let with = |f: fn(&mut PutRequest)| {
        let mut p = PutRequest { key: b("k"), ..PutRequest::default() };
        f(&mut p);
        p
    };
    assert_eq!(check_put(&with(|_| {})), Ok(()));
    assert_eq!(check_put(&with(|p| p.key = Bytes::new())), Err(KvError::EmptyKey));
    let value_and_ignore = with(|p| {
        p.value = b("v");
        p.ignore_value = true;
    });
    assert_eq!(check_put(&value_and_ignore), Err(KvError::ValueProvided));
    let lease_and_ignore = with(|p| {
        p.lease = LeaseId(5);
        p.ignore_lease = true;
    });
    assert_eq!(check_put(&lease_and_ignore), Err(KvError::LeaseProvided));
    assert_eq!(check_put(&with(|p| p.ignore_value = true)), Ok(()), "the key is checked later");
    // The same checks apply to a put inside a transaction, at any depth.
    let nested =
        txn(vec![RequestOp::Txn(txn(vec![RequestOp::Put(value_and_ignore)], vec![]))], vec![]);
    assert_eq!(check_txn(&nested, 128), Err(KvError::ValueProvided));
    assert_eq!(KvError::ValueProvided.to_string(), "etcdserver: value is provided");
    assert_eq!(KvError::LeaseProvided.to_string(), "etcdserver: lease is provided");
}

/// etcd's `checkTxnRequest`: the budget is the longest of compares, success and failure, and a
/// nested transaction gets what its parent leaves; compares need keys too.
#[test]
fn nested_transactions_share_the_op_budget() {
    let ops = |n: usize, p: &str| (0..n).map(|i| put(&format!("{p}{i}"), "v")).collect();
    let outer = |n: usize, inner: usize| {
        let mut list: Vec<RequestOp> = ops(n - 1, "o");
        list.push(RequestOp::Txn(txn(ops(inner, "n"), vec![])));
        txn(list, vec![])
    };
    assert_eq!(check_txn(&outer(100, 28), 128), Ok(()));
    assert_eq!(check_txn(&outer(100, 29), 128), Err(KvError::TooManyOps));
    assert_eq!(check_txn(&outer(1, 127), 128), Ok(()));
    assert_eq!(check_txn(&outer(1, 128), 128), Err(KvError::TooManyOps));
    let cmp = |key: &str| Compare {
        key: b(key),
        range_end: Bytes::new(),
        target: CompareTarget::Version(1),
        result: CompareResult::Equal,
    };
    let mut t = txn(vec![RequestOp::Txn(txn(ops(29, "n"), vec![]))], vec![]);
    t.compare = (0..100).map(|_| cmp("k")).collect();
    assert_eq!(check_txn(&t, 128), Err(KvError::TooManyOps), "compares count against the budget");
    let mut inner = txn(vec![], vec![]);
    inner.compare = vec![cmp("")];
    assert_eq!(check_txn(&txn(vec![RequestOp::Txn(inner)], vec![]), 128), Err(KvError::EmptyKey));
}

#[test]
fn a_store_never_compacted_accepts_compaction_at_zero_once() {
    let store = Store::open(MemBackend::default()).unwrap();
    let compact = |i: u64, r: i64| {
        let cmd = Command::Compact(CompactRequest { revision: Revision(r), physical: false });
        store.apply(&[(i, Some(&cmd))]).unwrap().pop().flatten().unwrap()
    };
    assert_eq!(compact(1, -1).unwrap_err(), KvError::Compacted);
    assert!(compact(2, 0).is_ok(), "etcd's compaction point starts below zero");
    assert_eq!(compact(3, 0).unwrap_err(), KvError::Compacted);
    assert!(compact(4, 1).is_ok());
    assert_eq!(compact(5, 2).unwrap_err(), KvError::FutureRev);
}

#[test]
fn revisions_versions_and_compaction_boundaries() {
    let store = Store::open(MemBackend::default()).unwrap();
    assert_eq!(store.current_revision(), Revision(1), "an empty store is at revision 1");
    let mut i = 0;
    let mut apply = |cmd: Command| {
        i += 1;
        store.apply(&[(i, Some(&cmd))]).unwrap().pop().flatten().unwrap()
    };
    let p = |k: &str, v: &str| {
        Command::Put(PutRequest { key: b(k), value: b(v), ..PutRequest::default() })
    };
    apply(p("a", "1")).unwrap(); // rev 2
    apply(p("a", "2")).unwrap(); // rev 3
    apply(Command::DeleteRange(DeleteRangeRequest { key: b("a"), ..Default::default() })).unwrap(); // rev 4
    apply(p("a", "3")).unwrap(); // rev 5: a new generation
    let get = |rev: i64| {
        store.range(&RangeRequest { key: b("a"), revision: Revision(rev), ..Default::default() })
    };
    let kv = get(0).unwrap().kvs.pop().unwrap();
    assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (Revision(5), Revision(5), 1));
    assert_eq!(get(3).unwrap().kvs[0].version, 2);
    assert!(get(4).unwrap().kvs.is_empty());
    assert_eq!(get(6), Err(KvError::FutureRev));
    // Deleting nothing does not move the revision.
    apply(Command::DeleteRange(DeleteRangeRequest { key: b("zz"), ..Default::default() })).unwrap();
    assert_eq!(store.current_revision(), Revision(5));
    let compact =
        |r: i64| Command::Compact(CompactRequest { revision: Revision(r), physical: false });
    assert!(matches!(apply(compact(4)), Ok(CommandResponse::Compact(_))));
    assert_eq!(get(3), Err(KvError::Compacted));
    assert!(get(4).unwrap().kvs.is_empty(), "reading at the compact revision is allowed");
    // The deletion at the compact revision stays in history for a watch from there, also once
    // the history below it is physically gone (read from the history, not the ring).
    while store.compact_step(1).unwrap() {}
    store.set_event_ring_bytes(0);
    let History::Events(Some(run)) = store.events(Revision(4), 10).unwrap() else {
        panic!("revision 4 has events")
    };
    let seen: Vec<_> = run
        .revisions
        .iter()
        .flat_map(|r| r.events.iter().map(|e| (e.revision(), e.kind)))
        .collect();
    assert_eq!(seen, vec![(Revision(4), EventKind::Delete), (Revision(5), EventKind::Put)]);
    assert!(matches!(store.events(Revision(3), 10), Ok(History::Compacted(Revision(4)))));
    assert!(store.physically_compacted());
}

/// The request constructors select what etcd's client options select: one key, a prefix
/// (`WithPrefix`, where the empty prefix is every key), every key from one on (`WithFromKey`).
#[test]
fn constructors_select_a_key_a_prefix_or_everything_from_a_key() {
    let store = Store::open(MemBackend::default()).expect("an in-memory store opens");
    let keys = ["a", "app", "app/", "app/1", "app/2", "app0", "b", "\u{7f}\u{7f}"];
    for (i, k) in keys.iter().enumerate() {
        let cmd = Command::Put(PutRequest::new(*k, "v"));
        store.apply(&[(i as u64 + 1, Some(&cmd))]).expect("the put applies");
    }
    let read = |req: RangeRequest| -> Vec<String> {
        let resp = store.range(&req).expect("the range reads");
        resp.kvs.iter().map(|kv| String::from_utf8_lossy(&kv.key).into_owned()).collect()
    };
    assert_eq!(read(RangeRequest::key("app")), ["app"]);
    assert_eq!(read(RangeRequest::prefix("app/")), ["app/", "app/1", "app/2"]);
    assert_eq!(read(RangeRequest::prefix("app")), ["app", "app/", "app/1", "app/2", "app0"]);
    assert_eq!(read(RangeRequest::prefix("")), keys, "the empty prefix is every key");
    // ... and as a request etcd accepts: its key is not empty.
    let all = vec![
        RequestOp::Range(RangeRequest::prefix("")),
        RequestOp::DeleteRange(DeleteRangeRequest::prefix("")),
    ];
    assert_eq!(check_txn(&txn(all, vec![]), DEFAULT_MAX_TXN_OPS), Ok(()));
    assert_eq!(read(RangeRequest::from_key("app0")), ["app0", "b", "\u{7f}\u{7f}"]);
    let del = DeleteRangeRequest::prefix("app/");
    let prefix = RangeRequest::prefix("app/");
    assert_eq!((&del.key, &del.range_end), (&prefix.key, &prefix.range_end));
    let watch = watch::WatchSpec::prefix("");
    assert!(["a", "\u{7f}\u{7f}"].iter().all(|k| watch.range().contains(k.as_bytes())));
    assert!(watch::WatchSpec::prefix("app/").range().contains(b"app/1"));
    assert!(!watch::WatchSpec::prefix("app/").range().contains(b"app0"));
    assert!(watch::WatchSpec::key("a").range().contains(b"a"));
    let put = PutRequest::new("k", "v");
    assert_eq!((put.key, put.value, put.lease), (b("k"), b("v"), LeaseId(0)));
}
