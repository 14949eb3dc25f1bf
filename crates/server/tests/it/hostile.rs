//! Requests built to hurt the server, against a server in this process: transactions nested
//! past what cairn accepts are refused as the client's mistake (InvalidArgument, with a
//! message), however deep, never answered `Internal` or allowed to exhaust the stack.

use cairn_proto::etcdserverpb as pb;
use pb::kv_client::KvClient;
use tonic::transport::Channel;

use crate::common;

async fn server(tag: &str) -> (KvClient<Channel>, tokio::sync::oneshot::Sender<()>) {
    let s = common::server(&format!("hostile-{tag}")).await;
    (s.kv, s.stop)
}

/// A transaction `depth` deep (1: no nested transaction), putting one key at the bottom.
fn nest(depth: usize) -> pb::TxnRequest {
    let put = pb::PutRequest { key: b"deep".to_vec(), value: b"v".to_vec(), ..Default::default() };
    let mut txn = pb::TxnRequest {
        success: vec![pb::RequestOp { request: Some(pb::request_op::Request::RequestPut(put)) }],
        ..Default::default()
    };
    for _ in 1..depth {
        let op = pb::RequestOp { request: Some(pb::request_op::Request::RequestTxn(txn)) };
        txn = pb::TxnRequest { success: vec![op], ..Default::default() };
    }
    txn
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_nested_too_deeply_are_invalid_arguments_at_any_depth() {
    let (mut c, stop) = server("deep-txn").await;
    let max = cairn::kv::validate::MAX_TXN_DEPTH;
    let reply = c.txn(nest(max)).await.expect("the deepest transaction allowed");
    assert!(reply.into_inner().succeeded);
    let want = cairn::kv::KvError::TxnTooDeep.etcd_message();
    assert_eq!(want, cairn_proto::codec::NESTED_TOO_DEEPLY);
    // Just past the limit; past what prost decodes (about 50); far past it.
    for depth in [max + 1, 49, 50, 60, 200, 2000] {
        let e = c.txn(nest(depth)).await.expect_err("nested too deeply");
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "depth {depth}: {e:?}");
        assert_eq!(e.message(), want, "depth {depth}");
    }
    // The server is unharmed.
    c.txn(nest(1)).await.expect("a plain transaction still works");
    let _ = stop.send(());
}
