//! What an embedder relies on beyond the operations themselves: the engine's futures run on any
//! executor (no tokio runtime), and an engine that was stopped says so, once.

use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use cairn_kv::watch::WatchSpec;
use cairn_kv::{LeaseId, PutRequest, RangeRequest};
use cairn_node::{Engine, EngineConfig, EngineError, StopCause};

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("cairn-embedding-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// The smallest executor: polls on this thread and parks until woken. Nothing of tokio's
/// runtime (reactor, timers, task context) is present, so a future that needs it panics.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(out) = f.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}

#[test]
fn the_engine_needs_no_async_runtime() {
    assert!(tokio::runtime::Handle::try_current().is_err(), "no runtime on this thread");
    let dir = temp_dir("no-runtime");
    let engine = Arc::new(Engine::open(EngineConfig::new("plain", &dir)).expect("open"));
    let mut watch = engine.watch(WatchSpec::prefix("app/")).expect("watch");
    let mut leadership = engine.leadership();
    block_on(async {
        let put = engine.put(PutRequest::new("app/a", "1")).await.expect("put");
        let read = engine.range(RangeRequest::prefix("app/")).await.expect("range");
        assert_eq!(read.kvs[0].mod_revision, put.revision);
        let reply = watch.next().await.expect("the watch sees the put");
        assert_eq!(reply.events[0].kv.key, "app/a");
        let (lease, _) = engine.lease_grant(LeaseId(0), 60).await.expect("grant");
        assert_eq!(engine.lease_keep_alive(lease.id).await.expect("keepalive"), lease.ttl);
        let ttl = engine.lease_time_to_live(lease.id, false).await.expect("time to live");
        assert_eq!(ttl.granted_ttl, lease.ttl);
        engine.lease_revoke(lease.id).await.expect("revoke");
        let now = leadership.changed().await.expect("leadership").expect("a leader");
        assert_eq!(now.leader.map(|l| l.0), engine.leader());
        assert!(engine.delete("app/a").await.expect("delete"));
    });
    engine.stop();
    std::fs::remove_dir_all(&dir).expect("remove the data directory");
}

/// Every way to reach a stopped engine fails with the cause, and the text names it once (it
/// once read "engine stopped: engine stopped").
#[test]
fn a_stopped_engine_says_so_once() {
    let dir = temp_dir("stopped");
    let engine = Engine::open(EngineConfig::new("stopped", &dir)).expect("open");
    let mut watch = engine.watch(WatchSpec::key("k")).expect("watch");
    let mut leadership = engine.leadership();
    block_on(leadership.changed()).expect("the current leadership");
    engine.stop();
    engine.stop(); // twice is fine
    let errors = block_on(async {
        vec![
            engine.put(PutRequest::new("k", "v")).await.map(|_| ()),
            engine.get("k").await.map(|_| ()),
            engine
                .range(RangeRequest { serializable: true, ..RangeRequest::key("k") })
                .await
                .map(|_| ()),
            engine.lease_grant(LeaseId(0), 10).await.map(|_| ()),
            watch.next().await.map(|_| ()),
            leadership.changed().await.map(|_| ()),
            engine.watch(WatchSpec::key("k")).map(|_| ()),
        ]
    });
    for e in errors {
        let e = e.expect_err("a stopped engine serves nothing");
        assert_eq!(e, EngineError::Stopped(StopCause::Shutdown));
        assert_eq!(e.to_string(), "engine stopped: shut down");
        assert_eq!(e.etcd_message(), "etcdserver: server stopped");
    }
    drop(engine);
    std::fs::remove_dir_all(&dir).expect("remove the data directory");
}
