//! cairn: a Raft-replicated, strongly consistent key-value store that speaks the etcd v3 API.
//!
//! Run it as a server (`cairn serve`), or embed the engine: [`Engine`] is the same store in
//! process, with plain Rust types. An embedder depends on this crate without its default
//! `server` feature, which leaves out the gRPC and HTTP stack, the CLI and the bench:
//!
//! ```toml
//! cairn = { path = "<cairn checkout>/crates/server", default-features = false }
//! ```
//!
//! [`Engine::open`] blocks while it replays the log; the engine then runs on threads of its
//! own, and its futures need no particular async runtime (tokio, smol, async-std, or
//! `futures::executor::block_on` all do). A complete program (`examples/embed.rs`):
//!
//! ```
#![doc = include_str!("../examples/embed.rs")]
//! ```

#![warn(missing_docs)]

#[cfg(feature = "server")]
mod authority;
#[cfg(feature = "server")]
mod cluster_api;
#[cfg(feature = "server")]
mod coalesce;
#[cfg(feature = "server")]
mod convert;
#[cfg(feature = "server")]
mod errors;
#[cfg(feature = "server")]
mod fdlimit;
#[cfg(feature = "server")]
mod grpc_limit;
#[cfg(feature = "server")]
mod http;
#[cfg(feature = "server")]
mod lease;
#[cfg(feature = "server")]
mod listen;
#[cfg(feature = "server")]
mod pipe;
#[cfg(feature = "server")]
mod range_stream;
#[cfg(all(test, feature = "server"))]
mod request_fuzz;
#[cfg(feature = "server")]
mod services;
#[cfg(feature = "server")]
mod streams;
#[cfg(feature = "server")]
mod watch;

#[cfg(feature = "server")]
pub use services::ETCD_COMPATIBLE_VERSION;
#[cfg(feature = "server")]
pub use watch::parse_duration;

#[cfg(feature = "server")]
use std::net::SocketAddr;
#[cfg(feature = "server")]
use std::sync::Arc;

pub use bytes::Bytes;
pub use cairn_kv as kv;
pub use cairn_node::cluster;
pub use cairn_node::{
    Engine, EngineConfig, EngineError, KeepAlive, Leadership, LeadershipWatch, LeaseConfirmed,
    LeaseRound, LeaseTimeToLive, NodeId, OpenError, ReadMode, Status, StopCause, StorageError,
    Term, Watch, WatchStream,
};
#[cfg(feature = "server")]
use cairn_proto::etcdserverpb as pb;

/// What `cairn serve` needs beyond the engine's own configuration (which holds the advertised
/// client URLs, since a member of a cluster publishes them).
#[cfg(feature = "server")]
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The engine under the server.
    pub engine: EngineConfig,
    /// `http://host:port` URLs to serve the etcd API and HTTP health on (`--listen-client-urls`).
    pub listen_client_urls: Vec<String>,
    /// This member's peer URLs, as `MemberList` shows them (`--initial-advertise-peer-urls`).
    pub advertise_peer_urls: Vec<String>,
    /// etcd's `--watch-progress-notify-interval` (default 10 minutes).
    pub watch_progress_interval: std::time::Duration,
    /// etcd's `--max-concurrent-streams`: HTTP/2 streams per client connection.
    pub max_concurrent_streams: u32,
    /// Most client connections open at once (0: as many as the open-file limit allows, less
    /// the descriptors kept for the WAL, database and peers, which bounds any value).
    pub max_client_conns: usize,
}

/// Parses `http://host:port` into a socket address. TLS (`https://`) is not served yet.
#[cfg(feature = "server")]
pub fn parse_url(url: &str) -> Result<SocketAddr, String> {
    let rest = url.strip_prefix("http://").ok_or_else(|| {
        format!("{url}: only http:// URLs are supported (TLS is not implemented yet)")
    })?;
    let hostport = rest.trim_end_matches('/');
    let hostport = hostport.replace("localhost", "127.0.0.1");
    hostport.parse().map_err(|e| format!("{url}: {e}"))
}

/// Opens the engine and serves the etcd API (and HTTP health) until `shutdown` resolves.
#[cfg(feature = "server")]
pub async fn serve(
    cfg: ServeConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let addrs: Vec<SocketAddr> = cfg
        .listen_client_urls
        .iter()
        .map(|u| parse_url(u))
        .collect::<Result<_, _>>()
        .map_err(anyhow::Error::msg)?;
    let max_request = cfg.engine.max_request_bytes;
    let fd_limit = fdlimit::raise_nofile();
    let engine = Arc::new(tokio::task::block_in_place(|| Engine::open(cfg.engine.clone()))?);
    // Set when the server stops: graceful shutdown waits for every stream to end, so the
    // streams that would never end by themselves (watches) end on it.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let ctx = services::Ctx {
        engine: engine.clone(),
        peer_urls: cfg.advertise_peer_urls.clone(),
        watch_progress_interval: cfg.watch_progress_interval,
        stopping: stop_rx.clone(),
        leader_channels: lease::LeaderChannels::default(),
    };
    // etcd accepts messages up to the request limit plus gRPC overhead, on every service, then
    // checks the limit itself so the client gets "request is too large".
    let max_decode = max_request + 512 * 1024;
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter.set_serving::<pb::kv_server::KvServer<services::Ctx>>().await;
    // Every etcd service: the receive limit, and gzip-compressed requests (grpc-go clients may
    // compress with grpc.UseCompressor; etcd accepts them).
    macro_rules! etcd_service {
        ($server:expr) => {
            $server
                .max_decoding_message_size(max_decode)
                .accept_compressed(tonic::codec::CompressionEncoding::Gzip)
        };
    }
    let routes = tonic::service::Routes::new(health_service)
        .add_service(etcd_service!(pb::kv_server::KvServer::new(ctx.clone())))
        .add_service(etcd_service!(pb::maintenance_server::MaintenanceServer::new(ctx.clone())))
        .add_service(etcd_service!(pb::cluster_server::ClusterServer::new(ctx.clone())))
        .add_service(etcd_service!(
            cairn_proto::wire::etcdserverpb::watch_server::WatchServer::new(ctx.clone())
        ))
        .add_service(etcd_service!(pb::lease_server::LeaseServer::new(ctx.clone())));
    let grpc_routes = routes.into_axum_router().layer(tower::util::MapRequestLayer::new(
        move |req: axum::http::Request<axum::body::Body>| {
            req.map(|body| grpc_limit::limit(body, max_decode))
        },
    ));
    let router = http::Dispatch { grpc: grpc_routes, http: http::routes(engine.clone()) };
    let mut listeners = Vec::new();
    for addr in addrs {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("listen on {addr}: {e}"))?;
        listeners.push((addr, listener));
    }
    // Once everything but the clients is open: the engine, the peer transport, the listeners.
    let conns = fdlimit::ConnLimit::for_clients(cfg.max_client_conns, fd_limit)
        .map_err(anyhow::Error::msg)?;
    let mut servers = Vec::new();
    for (addr, listener) in listeners {
        eprintln!("cairn: serving the etcd v3 API on http://{addr}");
        let max_streams = cfg.max_concurrent_streams;
        servers.push(tokio::spawn(listen::serve(
            listener,
            router.clone(),
            stop_rx.clone(),
            max_streams,
            conns.clone(),
        )));
    }
    // Fail-stop: if storage fails, the engine refuses everything; the process then exits with
    // the reason, so a supervisor restarts it and the WAL replays.
    let failure = {
        let engine = engine.clone();
        async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                if let Some(why) = engine.status().failure {
                    return format!("stopped after a storage failure: {why}");
                }
                if engine.is_removed() {
                    return cairn_node::StopCause::Removed.to_string();
                }
            }
        }
    };
    let fatal = tokio::select! {
        () = shutdown => None,
        why = failure => Some(why),
    };
    if fatal.is_none() {
        // Still serving while it hands over, as etcd does.
        if let Err(e) = engine.hand_over_leadership().await {
            tracing::warn!("leadership transfer before stopping failed: {e}");
        }
    }
    let _ = stop_tx.send(true);
    for s in servers {
        let _ = s.await;
    }
    tokio::task::block_in_place(|| engine.stop());
    match fatal {
        Some(why) => Err(anyhow::anyhow!("{why}")),
        None => Ok(()),
    }
}
