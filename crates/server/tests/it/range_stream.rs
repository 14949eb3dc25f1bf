//! KV.RangeStream against a server in this process: chunks that together equal Range's answer,
//! at one pinned revision however the store moves meanwhile, with header, `more` and `count` on
//! the last chunk only; limits, revision filters, count-only, the refused sort orders and a
//! compacted revision.

use cairn_proto::etcdserverpb as pb;
use pb::kv_client::KvClient;
use tonic::transport::Channel;

fn prefix_end(p: &[u8]) -> Vec<u8> {
    cairn::kv::range::prefix_end(p).to_vec()
}

use crate::common;

async fn server(tag: &str) -> (KvClient<Channel>, tokio::sync::oneshot::Sender<()>) {
    let s = common::server(&format!("rs-{tag}")).await;
    (s.kv.max_decoding_message_size(64 << 20), s.stop)
}

async fn put(c: &mut KvClient<Channel>, k: String, v: Vec<u8>) -> i64 {
    let r = c.put(pb::PutRequest { key: k.into_bytes(), value: v, ..Default::default() }).await;
    r.unwrap().into_inner().header.unwrap().revision
}

/// Every chunk of a stream; checks that only the last carries header, more and count.
async fn chunks(c: &mut KvClient<Channel>, req: pb::RangeRequest) -> Vec<pb::RangeResponse> {
    let mut s = c.range_stream(req).await.unwrap().into_inner();
    let mut out = Vec::new();
    while let Some(m) = s.message().await.unwrap() {
        out.push(m.range_response.unwrap());
    }
    let (last, rest) = out.split_last().expect("at least one chunk");
    assert!(last.header.is_some());
    assert!(rest.iter().all(|r| r.header.is_none() && !r.more && r.count == 0));
    out
}

fn keys(rs: &[pb::RangeResponse]) -> Vec<Vec<u8>> {
    rs.iter().flat_map(|r| r.kvs.iter().map(|kv| kv.key.clone())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunks_equal_range_at_one_revision() {
    let (mut c, _stop) = server("chunks").await;
    for i in 0..3000 {
        put(&mut c, format!("k/{i:05}"), vec![b'v'; 1024]).await;
    }
    let all = pb::RangeRequest {
        key: b"k/".to_vec(),
        range_end: prefix_end(b"k/"),
        ..Default::default()
    };
    let range = c.range(all.clone()).await.unwrap().into_inner();
    // Read the first chunk, then write into the range: the rest stays at the pinned revision.
    let mut s = c.range_stream(all.clone()).await.unwrap().into_inner();
    let mut got = vec![s.message().await.unwrap().unwrap().range_response.unwrap()];
    put(&mut c, "k/00000".into(), b"changed".to_vec()).await;
    put(&mut c, "k/99999".into(), b"new".to_vec()).await;
    while let Some(m) = s.message().await.unwrap() {
        got.push(m.range_response.unwrap());
    }
    assert!(got.len() > 3, "{} chunks", got.len());
    let last = got.last().unwrap();
    assert_eq!(last.header.as_ref().unwrap().revision, range.header.unwrap().revision);
    assert_eq!((last.more, last.count), (false, 3000));
    let kvs: Vec<_> = got.iter().flat_map(|r| r.kvs.clone()).collect();
    assert_eq!(kvs, range.kvs, "the chunks together are Range's answer at the pinned revision");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_filters_count_only_and_refusals() {
    let (mut c, _stop) = server("opts").await;
    let mut revs = Vec::new();
    for i in 0..500 {
        revs.push(put(&mut c, format!("k/{i:03}"), vec![b'x'; 10]).await);
    }
    let base = pb::RangeRequest {
        key: b"k/".to_vec(),
        range_end: prefix_end(b"k/"),
        ..Default::default()
    };
    let limited = chunks(&mut c, pb::RangeRequest { limit: 120, ..base.clone() }).await;
    let last = limited.last().unwrap();
    assert_eq!((keys(&limited).len(), last.more, last.count), (120, true, 500));
    // Revision filters, which etcd refuses on the stream, give what Range gives.
    let filtered = pb::RangeRequest { min_mod_revision: revs[400], ..base.clone() };
    let want = c.range(filtered.clone()).await.unwrap().into_inner();
    let got = chunks(&mut c, filtered.clone()).await;
    assert_eq!(keys(&got), want.kvs.iter().map(|kv| kv.key.clone()).collect::<Vec<_>>());
    assert_eq!(got.last().unwrap().count, want.count);
    let some = chunks(&mut c, pb::RangeRequest { limit: 10, ..filtered }).await;
    assert_eq!((keys(&some).len(), some.last().unwrap().more), (10, true));
    let counted = chunks(&mut c, pb::RangeRequest { count_only: true, ..base.clone() }).await;
    assert_eq!((counted.len(), counted[0].count, counted[0].kvs.len()), (1, 500, 0));
    let sorted = pb::RangeRequest { sort_order: 2, sort_target: 4, ..base.clone() };
    let Err(refused) = c.range_stream(sorted).await else { panic!("sorted by value is refused") };
    assert_eq!(refused.code(), tonic::Code::Unimplemented);
    c.compact(pb::CompactionRequest { revision: revs[10], physical: false }).await.unwrap();
    let old = c.range_stream(pb::RangeRequest { revision: revs[5], ..base }).await;
    let Err(old) = old else { panic!("a compacted revision is refused") };
    assert_eq!(old.code(), tonic::Code::OutOfRange);
}
