//! `--quota-backend-bytes`: a small quota never crashes the member (at start, on a restart or
//! when reached); past it, writes that add data get etcd's "database space exceeded" while
//! reads, deletes and compaction keep working.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_kv::*;
use cairn_node::{Engine, EngineConfig, EngineError};

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cairn-quota-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn put_req(k: &str, v: &str) -> PutRequest {
    PutRequest {
        key: Bytes::from(k.to_string()),
        value: Bytes::from(v.to_string()),
        ..PutRequest::default()
    }
}

fn config(dir: &PathBuf) -> EngineConfig {
    let mut cfg = EngineConfig::new("quota", dir);
    let quota = 512 << 10;
    cfg.quota_backend_bytes = Some(quota);
    // The old wiring: the map as large as the quota, which filled up and crash-looped.
    cfg.lmdb_map_bytes = quota as usize;
    cfg
}

/// Puts until the quota refuses one; returns the keys written.
async fn fill(e: &Engine) -> Vec<String> {
    let value = "x".repeat(4000);
    let mut written = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "the quota never refused a write");
        let key = format!("k{:05}", written.len());
        match e.put(put_req(&key, &value)).await {
            Ok(_) => written.push(key),
            Err(err) => {
                assert_eq!(err, EngineError::NoSpace);
                assert_eq!(err.etcd_message(), "etcdserver: mvcc: database space exceeded");
                assert!(!err.outcome_unknown(), "refused before it was proposed");
                return written;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn past_the_quota_writes_are_refused_and_everything_else_works() {
    let dir = temp_dir("small");
    let e = Engine::open(config(&dir)).expect("a small quota opens");
    let written = fill(&e).await;
    assert!(written.len() > 10, "only {} writes fit", written.len());
    assert!(e.status().failure.is_none(), "no storage failure: {:?}", e.status().failure);
    let range = RangeRequest { key: Bytes::from("k00000"), ..RangeRequest::default() };
    assert_eq!(e.range(range).await.expect("reads work").kvs.len(), 1);
    assert_eq!(e.lease_grant(LeaseId(7), 60).await.map(|_| ()), Err(EngineError::NoSpace));
    let txn_put = TxnRequest {
        compare: vec![],
        success: vec![RequestOp::Put(put_req("t", "v"))],
        failure: vec![],
    };
    assert_eq!(e.txn(txn_put).await.map(|_| ()), Err(EngineError::NoSpace));
    let del =
        |k: &str| DeleteRangeRequest { key: Bytes::from(k.to_string()), ..Default::default() };
    assert_eq!(e.delete_range(del(&written[0])).await.expect("deletes work").deleted, 1);
    let txn_del = TxnRequest {
        compare: vec![],
        success: vec![RequestOp::DeleteRange(del(&written[1]))],
        failure: vec![],
    };
    assert!(e.txn(txn_del).await.expect("delete-only transactions work").succeeded);
    let rev = e.revision();
    e.compact(CompactRequest { revision: rev, physical: true }).await.expect("compaction works");
    e.stop();
    drop(e);
    // A restart over a full database starts, and still refuses writes rather than crashing.
    let e = Engine::open(config(&dir)).expect("restarts without a crash loop");
    let got = e.get(written.last().expect("a key").clone()).await.expect("reads");
    assert!(got.is_some());
    assert_eq!(e.put(put_req("after", "v")).await.map(|_| ()), Err(EngineError::NoSpace));
    e.stop();
    std::fs::remove_dir_all(&dir).expect("cleans up");
}
