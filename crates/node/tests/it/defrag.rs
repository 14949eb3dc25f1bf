//! Defragment on a running engine: writes and reads go on during it and are never held up
//! for long, nothing is lost, and the file shrinks. `CAIRN_DEFRAG_MB` sizes the database
//! (default 8 MiB; the measurement in ARCHITECTURE.md used 100).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use cairn_kv::*;
use cairn_node::{Engine, EngineConfig};

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cairn-defrag-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn put(k: String, v: Bytes) -> PutRequest {
    PutRequest { key: Bytes::from(k), value: v, ..PutRequest::default() }
}

/// Writes `mb` MiB in 64 KiB values, then deletes and compacts away all but every tenth.
async fn fill_and_thin(e: &Engine, mb: usize) {
    let value = Bytes::from(vec![b'x'; 64 << 10]);
    for i in 0..mb * 16 {
        e.put(put(format!("big/{i:06}"), value.clone())).await.expect("puts");
        if i % 10 != 0 {
            e.delete(format!("big/{i:06}")).await.expect("deletes");
        }
    }
    let rev = e.revision();
    e.compact(CompactRequest { revision: rev, physical: true }).await.expect("compacts");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defragment_keeps_every_write_and_never_holds_writes_long() {
    let mb: usize = std::env::var("CAIRN_DEFRAG_MB").ok().and_then(|v| v.parse().ok()).unwrap_or(8);
    let dir = temp_dir("engine");
    let e = Arc::new(Engine::open(EngineConfig::new("defrag", &dir)).expect("opens"));
    fill_and_thin(&e, mb).await;
    let before = e.status().db_size_bytes;
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (e, done) = (e.clone(), done.clone());
        tokio::spawn(async move {
            let (mut n, mut longest) = (0usize, Duration::ZERO);
            while !done.load(Ordering::SeqCst) || n < 50 {
                let started = Instant::now();
                e.put(put(format!("during/{n:06}"), Bytes::from("v"))).await.expect("writes go on");
                e.get(format!("during/{n:06}")).await.expect("reads go on").expect("read back");
                longest = longest.max(started.elapsed());
                n += 1;
            }
            (n, longest)
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = Instant::now();
    e.defragment().await.expect("defragments");
    let took = started.elapsed();
    done.store(true, Ordering::SeqCst);
    let (n, longest) = writer.await.expect("the writer finishes");
    let after = e.status().db_size_bytes;
    eprintln!(
        "defragmented {mb} MiB written ({before} -> {after} bytes) in {took:?}; \
         {n} put+get pairs meanwhile, the longest {longest:?}"
    );
    assert!(after < before / 2, "the file shrank: {before} -> {after}");
    let all = RangeRequest {
        key: Bytes::from("during/"),
        range_end: Bytes::from("during0"),
        count_only: true,
        ..RangeRequest::default()
    };
    assert_eq!(e.range(all).await.expect("reads").count, n as i64, "no write lost");
    e.stop();
    drop(e);
    // The restart reads the new file, with every write in it.
    let e = Engine::open(EngineConfig::new("defrag", &dir)).expect("reopens");
    let last = e.get(format!("during/{:06}", n - 1)).await.expect("reads");
    assert!(last.is_some(), "the last write survived the restart");
    e.stop();
    std::fs::remove_dir_all(&dir).expect("cleans up");
}
