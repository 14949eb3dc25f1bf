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

fn nospace(member: u64) -> AlarmMember {
    AlarmMember { member, alarm: AlarmType::NoSpace }
}

#[tokio::test(flavor = "multi_thread")]
async fn past_the_quota_a_nospace_alarm_is_raised_through_the_log_and_disarm_clears_it() {
    let dir = temp_dir("alarm");
    let e = Engine::open(config(&dir)).expect("a small quota opens");
    let me = e.identity().1;
    let written = fill(&e).await;
    let raised: Vec<_> = e.alarms().await.expect("lists alarms").into_iter().collect();
    assert_eq!(raised, [nospace(me)], "the write past the quota raised NOSPACE for this member");
    assert_eq!(e.raised_alarms().len(), 1);
    // Deleting everything frees space, but the alarm stays until an operator disarms it.
    let all = DeleteRangeRequest {
        key: Bytes::from("k"),
        range_end: Bytes::from("l"),
        ..Default::default()
    };
    assert_eq!(e.delete_range(all).await.expect("deletes work").deleted, written.len() as i64);
    let rev = e.revision();
    e.compact(CompactRequest { revision: rev, physical: true }).await.expect("compaction works");
    assert_eq!(e.put(put_req("small", "v")).await.map(|_| ()), Err(EngineError::NoSpace));
    // LMDB keeps the freed pages in its file: only a defragmentation gives them back.
    let before = e.status().db_size_bytes;
    e.defragment().await.expect("defragments");
    let after = e.status().db_size_bytes;
    assert!(after < before / 2, "the file shrank: {before} -> {after}");
    assert_eq!(e.alarm_deactivate(nospace(me)).await.expect("disarms"), Some(nospace(me)));
    assert_eq!(e.alarm_deactivate(nospace(me)).await.expect("disarms"), None, "nothing left");
    assert!(e.alarms().await.expect("lists").is_empty());
    e.put(put_req("small", "v")).await.expect("writes work after disarming");
    assert!(e.alarms().await.expect("lists").is_empty(), "and raise nothing");
    e.stop();
    std::fs::remove_dir_all(&dir).expect("cleans up");
}

#[tokio::test(flavor = "multi_thread")]
async fn alarms_survive_a_restart_and_refuse_writes_until_cleared() {
    let dir = temp_dir("restart");
    let open = || Engine::open(EngineConfig::new("alarms", &dir)).expect("opens");
    let e = open();
    let other = nospace(42);
    let corrupt = AlarmMember { member: 7, alarm: AlarmType::Corrupt };
    assert_eq!(e.alarm_activate(other).await.expect("raises"), Some(other));
    assert_eq!(e.alarm_activate(other).await.expect("raises again"), Some(other));
    let none = AlarmMember { member: 7, alarm: AlarmType::None };
    assert_eq!(e.alarm_activate(none).await.expect("NONE raises nothing"), None);
    assert_eq!(e.put(put_req("a", "v")).await.map(|_| ()), Err(EngineError::NoSpace));
    e.stop();
    drop(e);
    let e = open();
    let raised: Vec<_> = e.alarms().await.expect("lists").into_iter().collect();
    assert_eq!(raised, [other], "the alarm came back from the store");
    assert_eq!(e.put(put_req("a", "v")).await.map(|_| ()), Err(EngineError::NoSpace));
    let del = DeleteRangeRequest { key: Bytes::from("a"), ..Default::default() };
    e.delete_range(del.clone()).await.expect("deletes pass NOSPACE");
    assert_eq!(e.revision(), Revision(1), "alarms take no revision");
    e.alarm_deactivate(other).await.expect("clears");
    e.put(put_req("a", "v")).await.expect("writes work again");
    // CORRUPT refuses every write, deletes included, and reads still work.
    e.alarm_activate(corrupt).await.expect("raises");
    assert_eq!(e.delete_range(del).await.map(|_| ()), Err(EngineError::Corrupt));
    assert_eq!(e.get("a").await.expect("reads").map(|kv| kv.value), Some(Bytes::from("v")));
    e.alarm_deactivate(corrupt).await.expect("clears");
    e.put(put_req("b", "v")).await.expect("writes work again");
    e.stop();
    std::fs::remove_dir_all(&dir).expect("cleans up");
}
