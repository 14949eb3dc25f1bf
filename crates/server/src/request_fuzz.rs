//! Fuzzing the request path: arbitrary bytes, and valid encodings of KV, Lease and Watch
//! requests then mutated (bytes overwritten, inserted, cut), go through what a gRPC message
//! meets on its way in: the codec's decoding, conversion to cairn's types, etcd's checks and the
//! log entry's encoding. Never a panic; a malformed message is refused as `Internal` (grpc-go's
//! code) or, when nested too deeply, `InvalidArgument`; and every command that passes the checks
//! encodes to a log entry that decodes back to the same command, so nothing is cut on the way.
//!
//! A longer run is one command: `PROPTEST_CASES=200000 cargo test -p cairn --lib request_fuzz`.

use bytes::Bytes;
use cairn_kv::validate::{check_put, check_txn, DEFAULT_MAX_TXN_OPS};
use cairn_kv::{Command, LeaseId};
use cairn_node::{prepare, Limits, RequestId};
use cairn_proto::etcdserverpb as pb;
use cairn_proto::wire::etcdserverpb as wpb;
use proptest::prelude::*;
use prost::Message;
use tonic::Code;

use crate::convert;

const LIMITS: Limits = Limits { max_request_bytes: 1536 * 1024, max_txn_ops: DEFAULT_MAX_TXN_OPS };

/// Decodes `raw` as the codec does; a failure must carry one of the codes clients expect.
fn decode<M: Message + Default>(raw: &[u8]) -> Option<M> {
    match M::decode(raw) {
        Ok(m) => Some(m),
        Err(e) => {
            let status = cairn_proto::codec::decode_status(&e);
            assert!(matches!(status.code(), Code::Internal | Code::InvalidArgument), "{status:?}");
            None
        }
    }
}

/// etcd's checks, then the log entry: what passes must come back whole from the log.
fn propose(cmd: Command) {
    if let Ok(entry) = prepare(RequestId(7), &cmd, LIMITS) {
        let (id, back) = cairn_node::command::decode(&entry).expect("an entry we encoded decodes");
        assert_eq!((id, back), (7, cmd));
    }
}

/// Feeds `raw` to every request type, as if it had arrived on each RPC.
fn feed(raw: &[u8]) {
    if let Some(r) = decode::<pb::RangeRequest>(raw) {
        let _ = convert::range_req(r);
    }
    if let Some(r) = decode::<pb::PutRequest>(raw) {
        let put = convert::put_req(r);
        if check_put(&put).is_ok() {
            propose(Command::Put(put));
        }
    }
    if let Some(r) = decode::<pb::DeleteRangeRequest>(raw) {
        propose(Command::DeleteRange(convert::delete_req(r)));
    }
    if let Some(r) = decode::<pb::TxnRequest>(raw) {
        if let Ok(txn) = convert::txn_req(r) {
            if check_txn(&txn, DEFAULT_MAX_TXN_OPS).is_ok() {
                propose(Command::Txn(txn));
            }
        }
    }
    if let Some(r) = decode::<pb::CompactionRequest>(raw) {
        let c = cairn_kv::CompactRequest {
            revision: cairn_kv::Revision(r.revision),
            physical: r.physical,
        };
        propose(Command::Compact(c));
    }
    if let Some(r) = decode::<pb::LeaseGrantRequest>(raw) {
        propose(Command::LeaseGrant { id: LeaseId(r.id), ttl: r.ttl });
    }
    if let Some(r) = decode::<pb::LeaseRevokeRequest>(raw) {
        propose(Command::LeaseRevoke { id: LeaseId(r.id) });
    }
    let _ = decode::<pb::LeaseKeepAliveRequest>(raw);
    let _ = decode::<pb::LeaseTimeToLiveRequest>(raw);
    let _ = decode::<pb::LeaseLeasesRequest>(raw);
    if let Some(w) = decode::<wpb::WatchRequest>(raw) {
        if let Some(wpb::watch_request::RequestUnion::CreateRequest(c)) = w.request_union {
            let _ = crate::watch::spec(c);
        }
    }
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![Just(Vec::new()), proptest::collection::vec(any::<u8>(), 1..6)]
}

fn put() -> impl Strategy<Value = pb::PutRequest> {
    (key(), key(), any::<i64>(), any::<[bool; 3]>()).prop_map(|(key, value, lease, f)| {
        pb::PutRequest { key, value, lease, prev_kv: f[0], ignore_value: f[1], ignore_lease: f[2] }
    })
}

fn range() -> impl Strategy<Value = pb::RangeRequest> {
    (key(), key(), any::<i64>(), -1..7i32, -1..7i32).prop_map(|(key, range_end, n, o, t)| {
        pb::RangeRequest {
            key,
            range_end,
            limit: n,
            revision: n,
            sort_order: o,
            sort_target: t,
            ..Default::default()
        }
    })
}

fn compare() -> impl Strategy<Value = pb::Compare> {
    (key(), -1..5i32, -1..5i32, any::<i64>()).prop_map(|(key, result, target, n)| {
        use pb::compare::TargetUnion as U;
        let target_union = Some(match target {
            0 => U::Version(n),
            1 => U::CreateRevision(n),
            2 => U::ModRevision(n),
            3 => U::Value(key.clone()),
            _ => U::Lease(n),
        });
        pb::Compare { key, result, target, target_union, ..Default::default() }
    })
}

/// Transactions up to a few levels deep, of every op.
fn txn() -> impl Strategy<Value = pb::TxnRequest> {
    use pb::request_op::Request as R;
    let leaf = Just(pb::TxnRequest::default());
    leaf.prop_recursive(4, 32, 4, |inner| {
        let op = prop_oneof![
            range().prop_map(R::RequestRange),
            put().prop_map(R::RequestPut),
            (key(), key()).prop_map(|(key, range_end)| {
                R::RequestDeleteRange(pb::DeleteRangeRequest { key, range_end, prev_kv: false })
            }),
            inner.prop_map(R::RequestTxn),
        ]
        .prop_map(|r| pb::RequestOp { request: Some(r) });
        let ops = proptest::collection::vec(op, 0..4);
        (proptest::collection::vec(compare(), 0..3), ops.clone(), ops)
            .prop_map(|(compare, success, failure)| pb::TxnRequest { compare, success, failure })
    })
}

fn watch() -> impl Strategy<Value = wpb::WatchRequest> {
    (key(), key(), any::<i64>(), any::<bool>(), proptest::collection::vec(-1..3i32, 0..3)).prop_map(
        |(key, range_end, n, prev_kv, filters)| {
            let c = wpb::WatchCreateRequest {
                key,
                range_end,
                start_revision: n,
                prev_kv,
                filters,
                watch_id: n,
                ..Default::default()
            };
            wpb::WatchRequest {
                request_union: Some(wpb::watch_request::RequestUnion::CreateRequest(c)),
            }
        },
    )
}

/// A valid encoding of some request.
fn encoded() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        put().prop_map(|m| m.encode_to_vec()),
        range().prop_map(|m| m.encode_to_vec()),
        txn().prop_map(|m| m.encode_to_vec()),
        watch().prop_map(|m| m.encode_to_vec()),
        (any::<i64>(), any::<i64>())
            .prop_map(|(ttl, id)| pb::LeaseGrantRequest { ttl, id }.encode_to_vec()),
    ]
}

/// Overwrites, inserts and cuts, at positions taken modulo the message's length.
#[derive(Clone, Debug)]
enum Mutation {
    Set(usize, u8),
    Insert(usize, u8),
    Cut(usize),
}

fn mutate(mut raw: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        let n = raw.len().max(1);
        match *m {
            Mutation::Set(i, b) if !raw.is_empty() => raw[i % n] = b,
            Mutation::Insert(i, b) => raw.insert(i % (raw.len() + 1), b),
            Mutation::Cut(i) => raw.truncate(i % n),
            Mutation::Set(..) => {}
        }
    }
    raw
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<usize>().prop_map(Mutation::Cut),
    ]
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic_the_request_path(raw in proptest::collection::vec(any::<u8>(), 0..256)) {
        feed(&raw);
    }

    #[test]
    fn mutated_requests_never_panic_the_request_path(
        raw in encoded(),
        mutations in proptest::collection::vec(mutation(), 0..4),
    ) {
        feed(&raw);
        feed(&mutate(raw, &mutations));
    }
}

#[test]
fn a_request_nested_past_the_decoding_limit_is_an_invalid_argument() {
    let mut txn = pb::TxnRequest::default();
    for _ in 0..200 {
        let op = pb::RequestOp { request: Some(pb::request_op::Request::RequestTxn(txn)) };
        txn = pb::TxnRequest { success: vec![op], ..Default::default() };
    }
    let raw = txn.encode_to_vec();
    let e = pb::TxnRequest::decode(raw.as_slice()).expect_err("too deep to decode");
    assert_eq!(cairn_proto::codec::decode_status(&e).code(), Code::InvalidArgument);
    feed(&raw);
}

#[test]
fn the_log_keeps_every_byte_of_a_large_value() {
    let value = Bytes::from(vec![7u8; 1 << 20]);
    let put = cairn_kv::PutRequest { key: Bytes::from_static(b"k"), value, ..Default::default() };
    propose(Command::Put(put));
}
