//! Embedding: `cairn::serve_engine` serves the etcd API for an engine its program opened.

use std::time::Duration;

use cairn_proto::etcdserverpb as pb;
use pb::kv_client::KvClient;

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
