//! Sequential put latency through the embedded engine (no gRPC): what one client waits for.
use bytes::Bytes;
use cairn_kv::PutRequest;
use cairn_node::{Engine, EngineConfig};

fn main() {
    let dir = std::env::temp_dir().join(format!("cairn-latency-{}", std::process::id()));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let e = Engine::open(EngineConfig::new("latency", &dir)).expect("open");
        let n = 5000u32;
        let t = std::time::Instant::now();
        for i in 0..n {
            let put = PutRequest {
                key: Bytes::from(format!("k{i:08}")),
                value: Bytes::from(vec![b'v'; 256]),
                ..Default::default()
            };
            e.put(put).await.expect("put");
        }
        let el = t.elapsed();
        println!(
            "embedded sequential put: {:.0} ops/s, {:.0} us/op",
            f64::from(n) / el.as_secs_f64(),
            el.as_micros() as f64 / f64::from(n)
        );
        e.stop();
    });
    let _ = std::fs::remove_dir_all(&dir);
}
