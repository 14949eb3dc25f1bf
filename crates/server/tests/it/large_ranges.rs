//! Large ranges against a server in this process: read in steps while writes go on, and bounded
//! by `--max-range-bytes-in-flight` (a range larger than the budget fails with
//! ResourceExhausted, naming the flag; smaller ones are served whole).

use cairn_proto::etcdserverpb as pb;
use pb::kv_client::KvClient;
use tonic::transport::Channel;

use crate::common;

const KEYS: usize = 1_500;
const VALUE: usize = 1024;

/// Writes KEYS keys of VALUE bytes, 100 to a transaction.
async fn fill(kv: &mut KvClient<Channel>) {
    for first in (0..KEYS).step_by(100) {
        let success = (first..first + 100)
            .map(|i| pb::RequestOp {
                request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
                    key: format!("k{i:05}").into_bytes(),
                    value: vec![b'v'; VALUE],
                    ..Default::default()
                })),
            })
            .collect();
        kv.txn(pb::TxnRequest { success, ..Default::default() }).await.expect("txn");
    }
}

fn all(limit: i64, keys_only: bool) -> pb::RangeRequest {
    pb::RangeRequest {
        key: b"k".to_vec(),
        range_end: b"l".to_vec(),
        limit,
        keys_only,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_larger_than_the_budget_is_refused_and_smaller_ones_are_served() {
    let s =
        common::server_with("large-ranges", |cfg| cfg.max_range_bytes_in_flight = 1 << 20).await;
    let mut kv = s.kv.clone().max_decoding_message_size(64 << 20);
    fill(&mut kv).await;

    let e = kv.range(all(0, false)).await.expect_err("1.5 MB of values, 1 MiB budget");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    assert!(e.message().contains("--max-range-bytes-in-flight"), "{e:?}");
    // A limit makes it fit; the count is still the whole range's.
    let r = kv.range(all(900, false)).await.expect("900 keys fit").into_inner();
    assert_eq!((r.kvs.len(), r.more, r.count), (900, true, KEYS as i64));
    // More than a step's keys, without values: planned, charged, read in steps, served.
    let r = kv.range(all(0, true)).await.expect("keys only fit").into_inner();
    assert_eq!((r.kvs.len(), r.more, r.count), (KEYS, false, KEYS as i64));
    assert!(r.kvs.iter().all(|kv| kv.value.is_empty()));
    let keys: Vec<Vec<u8>> = r.kvs.into_iter().map(|kv| kv.key).collect();
    let want: Vec<Vec<u8>> = (0..KEYS).map(|i| format!("k{i:05}").into_bytes()).collect();
    assert_eq!(keys, want);
    // The budget was returned: the same read again, many times, still fits.
    for _ in 0..20 {
        kv.range(all(0, true)).await.expect("returned after each response");
    }
}

/// A large range read while a writer changes every key answers as of one revision: every key's
/// mod revision is at most the header's, and the values are the ones of that revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_range_is_one_revision_while_writes_go_on() {
    let s = common::server("large-ranges-consistent").await;
    let mut kv = s.kv.clone().max_decoding_message_size(64 << 20);
    fill(&mut kv).await;
    let mut writer = kv.clone();
    let writes = tokio::spawn(async move {
        for round in 0..3 {
            for i in (0..KEYS).step_by(7) {
                let put = pb::PutRequest {
                    key: format!("k{i:05}").into_bytes(),
                    value: format!("round {round}").into_bytes(),
                    ..Default::default()
                };
                writer.put(put).await.expect("put");
            }
        }
    });
    for _ in 0..5 {
        let r = kv.range(all(0, false)).await.expect("range").into_inner();
        let rev = r.header.expect("header").revision;
        assert_eq!(r.kvs.len(), KEYS);
        assert!(r.kvs.iter().all(|kv| kv.mod_revision <= rev), "a key from after the read");
        // Re-read at that revision: the same answer.
        let again = kv
            .range(pb::RangeRequest { revision: rev, ..all(0, false) })
            .await
            .expect("at rev")
            .into_inner();
        assert_eq!(again.kvs, r.kvs);
    }
    writes.await.expect("writer");
}
