//! A cairn server in the test's own process, on a free loopback port, with its data in a
//! directory of its own that is removed when the server stops.

// Each test file uses a part of this (some keep the stop handle only to hold the server up).
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use cairn::{EngineConfig, ServeConfig};
use cairn_proto::etcdserverpb::kv_client::KvClient;
use tonic::transport::Channel;

pub struct Server {
    pub port: u16,
    pub kv: KvClient<Channel>,
    /// Dropping it stops the server.
    pub stop: tokio::sync::oneshot::Sender<()>,
}

/// Starts a server named `tag` and waits until a KV client connects.
pub async fn server(tag: &str) -> Server {
    server_with(tag, |_| {}).await
}

/// [`server`], with its configuration changed by `tweak` first.
pub async fn server_with(tag: &str, tweak: impl FnOnce(&mut ServeConfig)) -> Server {
    let dir = std::env::temp_dir().join(format!("cairn-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    remove_dead_runs();
    let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = probe.local_addr().expect("a bound port").port();
    drop(probe);
    let url = format!("http://127.0.0.1:{port}");
    let mut cfg = ServeConfig::new(EngineConfig::new(tag, &dir), vec![url.clone()]);
    tweak(&mut cfg);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let _ = cairn::serve(cfg, async move {
            let _ = stopped.await;
        })
        .await;
        let _ = std::fs::remove_dir_all(&dir);
    });
    for _ in 0..100 {
        if let Ok(kv) = KvClient::connect(url.clone()).await {
            return Server { port, kv, stop };
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the server did not start");
}

/// Removes what earlier runs of this test binary left: a server's directory is removed when
/// it stops, but a test's runtime ends before its server's task does, so directories stay
/// behind. Each name ends with its process id; those of processes no longer running go.
fn remove_dead_runs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("cairn-test-").and_then(|n| n.rsplit('-').next()) else {
            continue;
        };
        let alive = pid.parse::<u32>().is_ok_and(|p| Path::new(&format!("/proc/{p}")).exists());
        if pid.parse::<u32>().is_ok() && !alive {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}
