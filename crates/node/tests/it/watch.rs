//! Watch through the embedded engine: live events and replay, a stream that is never read does
//! not hold up writes and still gets every event later, compaction cancels a watcher whose
//! history went, leadership changes are reported, and a stopped engine ends its streams.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use cairn_kv::watch::group::WatchReply;
use cairn_kv::watch::{EventKind, WatchSpec};
use cairn_kv::*;
use cairn_node::{Engine, EngineConfig, EngineError, WatchStream};

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cairn-watch-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn b(s: impl Into<String>) -> Bytes {
    Bytes::from(s.into())
}

fn put_req(k: &str, v: &str) -> PutRequest {
    PutRequest { key: b(k), value: b(v), ..PutRequest::default() }
}

fn prefix(p: &str, start: i64) -> WatchSpec {
    WatchSpec {
        key: b(p),
        range_end: range::prefix_end(p.as_bytes()),
        start_revision: Revision(start),
        prev_kv: true,
        ..WatchSpec::default()
    }
}

async fn next(stream: &mut WatchStream) -> WatchReply {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("a reply within 10 s")
        .expect("the engine runs")
}

/// (revision, key, kind) of every event until `count` are in.
async fn events(stream: &mut WatchStream, count: usize) -> Vec<(i64, Bytes, EventKind)> {
    let mut out = Vec::new();
    while out.len() < count {
        let r = next(stream).await;
        assert!(!r.canceled, "canceled: {r:?}");
        for e in &r.events {
            assert!(e.revision() <= r.revision, "header behind its events");
            out.push((e.revision().0, e.kv.key.clone(), e.kind));
        }
    }
    out
}

#[tokio::test]
async fn live_and_replayed_events_with_prev_kv() {
    let dir = temp_dir("live");
    let e = Engine::open(EngineConfig::new("live", &dir)).unwrap();
    e.put(put_req("a/1", "x")).await.unwrap(); // revision 2
    let mut w = e.watch(prefix("a/", 0)).unwrap();
    e.put(put_req("a/1", "y")).await.unwrap(); // 3
    e.put(put_req("b/1", "z")).await.unwrap(); // 4, not watched
    e.delete("a/1").await.unwrap(); // 5
    let r = tokio::time::timeout(Duration::from_secs(10), w.next()).await.unwrap().unwrap();
    let mut got: Vec<_> = r.events.clone();
    if got.len() < 2 {
        let more = tokio::time::timeout(Duration::from_secs(10), w.next()).await.unwrap().unwrap();
        got.extend(more.events);
    }
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!((got[0].kind, got[0].kv.value.clone()), (EventKind::Put, b("y")));
    assert_eq!(got[0].prev_kv.as_ref().map(|p| p.value.clone()), Some(b("x")));
    assert_eq!((got[1].kind, got[1].kv.mod_revision), (EventKind::Delete, Revision(5)));
    assert_eq!(got[1].prev_kv.as_ref().map(|p| p.value.clone()), Some(b("y")));
    // A watcher from the past replays the same history, then goes live.
    let mut s = e.watch_stream().unwrap();
    let id = s.create(prefix("a/", 2)).unwrap();
    assert!(next(&mut s).await.created);
    e.put(put_req("a/2", "w")).await.unwrap(); // 6
    let got = events(&mut s, 4).await;
    let revs: Vec<i64> = got.iter().map(|g| g.0).collect();
    assert_eq!(revs, vec![2, 3, 5, 6]);
    s.cancel(id);
    let r = next(&mut s).await;
    assert!(r.canceled && r.watch_id == id);
    e.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_never_read_holds_up_no_write_and_misses_no_event() {
    let dir = temp_dir("stalled");
    let e = Engine::open(EngineConfig::new("stalled", &dir)).unwrap();
    let mut stalled = e.watch_stream().unwrap();
    for i in 0..100 {
        stalled.create(prefix(&format!("k{}", i % 10), 0)).unwrap();
    }
    let value = "v".repeat(1024);
    for i in 0..3000 {
        e.put(put_req(&format!("k{}/{i}", i % 10), &value)).await.unwrap();
    }
    // Writes went on; now the stream reads everything, in order, each event once per watcher.
    for _ in 0..100 {
        assert!(next(&mut stalled).await.created);
    }
    let got = events(&mut stalled, 3000 * 10).await;
    let mut per_key = std::collections::BTreeMap::new();
    for (rev, key, _) in &got {
        *per_key.entry((*rev, key.clone())).or_insert(0) += 1;
    }
    assert_eq!(per_key.len(), 3000, "every write seen");
    assert!(per_key.values().all(|n| *n == 10), "each event once per matching watcher");
    e.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn compaction_cancels_a_watcher_whose_history_went() {
    let dir = temp_dir("compact");
    let e = Engine::open(EngineConfig::new("compact", &dir)).unwrap();
    let mut s = e.watch_stream().unwrap();
    let behind = s.create(prefix("k", 0)).unwrap();
    for i in 0..10 {
        e.put(put_req("k", &i.to_string())).await.unwrap(); // revisions 2..=11
    }
    e.compact(CompactRequest { revision: Revision(6), physical: false }).await.unwrap();
    // Exactly at the compaction revision is still allowed.
    let at = s.create(prefix("k", 6)).unwrap();
    let refused = s.create(WatchSpec { start_revision: Revision(-1), ..prefix("k", 0) });
    assert!(refused.is_err(), "a negative start revision is refused");
    let mut canceled = false;
    let mut from_six = Vec::new();
    while !canceled || from_six.len() < 6 {
        let r = next(&mut s).await;
        if r.watch_id == behind && r.canceled {
            assert_eq!(r.compact_revision, Revision(6));
            canceled = true;
        } else if r.watch_id == at {
            from_six.extend(r.events.iter().map(|e| e.revision().0));
        }
    }
    assert_eq!(from_six, vec![6, 7, 8, 9, 10, 11]);
    e.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn leadership_is_reported_and_streams_end_with_the_engine() {
    let dir = temp_dir("leader");
    let e = Engine::open(EngineConfig::new("leader", &dir)).unwrap();
    let mut l = e.leadership();
    let now = l.changed().await.unwrap().expect("a sole member leads at once");
    assert_eq!(now.leader.map(|n| n.0), Some(e.identity().1));
    let mut s = e.watch_stream().unwrap();
    s.create(prefix("x", 0)).unwrap();
    assert!(next(&mut s).await.created);
    e.stop();
    let end = tokio::time::timeout(Duration::from_secs(10), s.next()).await.unwrap();
    assert!(matches!(end, Err(EngineError::Stopped(_))), "{end:?}");
    assert!(matches!(l.changed().await, Err(EngineError::Stopped(_))));
    let _ = std::fs::remove_dir_all(&dir);
}
