// cairn embedded in a program: Cargo.toml has
//   cairn = { path = "<cairn checkout>/crates/server", default-features = false }
//   tokio = { version = "1", features = ["rt-multi-thread", "macros"] }
// (any executor would do: the engine's futures need no runtime of their own).
use std::sync::Arc;

use cairn::kv::{watch::WatchSpec, LeaseId, PutRequest, RangeRequest};
use cairn::{Engine, EngineConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("cairn-embed-{}", std::process::id()));
    // Blocks until the log is replayed (quick for a new directory); elsewhere in async code,
    // open it inside `tokio::task::spawn_blocking`.
    let engine = Arc::new(Engine::open(EngineConfig::new("embedded", &dir))?);

    let mut watch = engine.watch(WatchSpec::prefix("app/"))?;
    engine.put(PutRequest::new("app/greeting", "hello")).await?;
    let kv = engine.get("app/greeting").await?.expect("just written");
    assert_eq!(kv.value, "hello");
    let listed = engine.range(RangeRequest::prefix("app/")).await?;
    println!("{} key(s) under app/ at revision {}", listed.count, listed.revision);

    // Whole revisions, in order; `canceled` and `compact_revision` are set if compacted.
    let reply = watch.next().await?;
    println!("watched {:?} of {:?}", reply.events[0].kind, reply.events[0].kv.key);

    // A lease (the engine picks the id) that a background thread keeps alive until dropped.
    let (lease, _) = engine.lease_grant(LeaseId(0), 10).await?;
    let session = PutRequest { lease: lease.id, ..PutRequest::new("app/session", "alive") };
    engine.put(session).await?;
    let keeper = engine.keep_lease_alive(lease.id, lease.ttl);
    // ... the session's work: its key lives as long as `keeper` does ...
    drop(keeper);
    engine.lease_revoke(lease.id).await?; // its keys go with it

    engine.stop();
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
