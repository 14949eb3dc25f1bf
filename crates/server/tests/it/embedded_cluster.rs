//! `examples/embedded_cluster.rs`, run as its `main` runs it: three embedded engines form a
//! cluster, serve writes and linearizable reads on every member, one member serves the etcd
//! API for an engine the program opened (`cairn::serve_engine`), and the cluster survives its
//! leader. The etcd requests stand in for the user who would try etcdctl there.

use std::time::Duration;

use cairn_proto::etcdserverpb as pb;
use pb::kv_client::KvClient;

// The example's `main` and argument parsing are not used here.
#[allow(dead_code)]
#[path = "../../examples/embedded_cluster.rs"]
mod example;

/// A KV client of the etcd API at `url`, retried for 5 s while the server starts.
async fn connect(url: &str) -> KvClient<tonic::transport::Channel> {
    for _ in 0..100 {
        if let Ok(kv) = KvClient::connect(url.to_string()).await {
            return kv;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the etcd API at {url} accepted no connection");
}

/// An etcd client's put and prefix read through m0's served API.
async fn use_the_served_api(url: String) {
    let mut kv = connect(&url).await;
    let put = pb::PutRequest {
        key: b"app/first/from-etcd".to_vec(),
        value: b"v".to_vec(),
        ..Default::default()
    };
    kv.put(put).await.expect("a put through the etcd API");
    let range = pb::RangeRequest {
        key: b"app/first/".to_vec(),
        range_end: b"app/first0".to_vec(),
        ..Default::default()
    };
    let read = kv.range(range).await.expect("a linearizable range").into_inner();
    // The three members' writes, and this one.
    assert_eq!(read.count, 4, "{read:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_cluster_example_runs() {
    let dir =
        std::env::temp_dir().join(format!("cairn-test-embedded-cluster-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let until = Box::pin(use_the_served_api(format!("http://{addr}")));
    let serve = example::ServeEtcd { addr, until };
    let seen = tokio::time::timeout(Duration::from_secs(120), example::tour(&dir, Some(serve)))
        .await
        .expect("the tour ends in time");
    let _ = std::fs::remove_dir_all(&dir);
    let seen = seen.expect("the tour succeeds");
    assert_ne!(seen.first_leader, seen.next_leader, "{seen:?}");
    // Every member announced the first leader; the two survivors the next one too.
    assert!(seen.notifications >= 5, "{seen:?}");
}

/// `cairn::serve_engine` leaves the engine to its owner: stopping the server leaves the
/// engine serving its program, and stopping the engine ends the server by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serving_an_open_engine_leaves_it_to_its_owner() {
    let dir = std::env::temp_dir().join(format!("cairn-test-serve-engine-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let engine = cairn::EngineConfig::new("owned", &dir);
    let engine = std::sync::Arc::new(cairn::Engine::open(engine).expect("open"));
    let serve = |port: u16| {
        let url = format!("http://127.0.0.1:{port}");
        let cfg = cairn::ServeConfig::new(engine.config().clone(), vec![url]);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(cairn::serve_engine(engine.clone(), cfg, async {
            let _ = stopped.await;
        }));
        (stop, server)
    };
    let free_port = || {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        l.local_addr().expect("an address").port()
    };
    let port = free_port();
    let (stop, server) = serve(port);
    use_the_served_api_once(port).await;
    drop(stop);
    let served = tokio::time::timeout(Duration::from_secs(20), server).await.expect("in time");
    served.expect("the server task").expect("a requested stop is no error");
    let kv = engine.get("k").await.expect("the engine still serves its owner");
    assert_eq!(kv.expect("written through the API").value, "v");
    // Serving again, then the owner stops the engine: the server ends by itself, without error.
    let (_stop, server) = serve(free_port());
    tokio::task::block_in_place(|| engine.stop());
    let served = tokio::time::timeout(Duration::from_secs(20), server).await.expect("in time");
    served.expect("the server task").expect("an engine its owner stopped is no error");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A put of `k` through the etcd API on `port`.
async fn use_the_served_api_once(port: u16) {
    let mut kv = connect(&format!("http://127.0.0.1:{port}")).await;
    let put = pb::PutRequest { key: b"k".to_vec(), value: b"v".to_vec(), ..Default::default() };
    kv.put(put).await.expect("a put through the etcd API");
}
