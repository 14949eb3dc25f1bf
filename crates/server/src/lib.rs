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
mod alarm;
#[cfg(feature = "server")]
mod auth;
#[cfg(feature = "server")]
mod authority;
#[cfg(feature = "server")]
mod bulk;
#[cfg(feature = "server")]
mod cluster_api;
#[cfg(feature = "server")]
mod coalesce;
#[cfg(feature = "server")]
mod convert;
#[cfg(feature = "server")]
mod corrupt;
#[cfg(feature = "server")]
mod errors;
#[cfg(feature = "server")]
mod fdlimit;
#[cfg(feature = "server")]
mod grpc_limit;
#[cfg(feature = "server")]
mod http;
#[cfg(feature = "server")]
mod jwt;
#[cfg(feature = "server")]
mod large_response;
#[cfg(feature = "server")]
mod learner;
#[cfg(feature = "server")]
mod lease;
#[cfg(feature = "server")]
mod listen;
#[cfg(feature = "server")]
mod metrics;
#[cfg(feature = "server")]
mod pipe;
#[cfg(feature = "server")]
mod range_budget;
#[cfg(feature = "server")]
mod range_stream;
#[cfg(all(test, feature = "server"))]
mod request_fuzz;
#[cfg(feature = "server")]
mod services;
#[cfg(feature = "server")]
mod snapshot;
#[cfg(feature = "server")]
mod streams;
/// Test CAs and certificates, shared with the transport's tests.
#[cfg(all(test, feature = "server"))]
#[path = "../../transport/tests/pki/mod.rs"]
mod test_pki;
#[cfg(feature = "server")]
mod watch;

#[cfg(feature = "server")]
pub use jwt::{AuthToken, AuthTokenError, Jwt};
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
    /// Bytes that large Range responses being read or sent may take in all
    /// (`--max-range-bytes-in-flight`; 0: an eighth of the memory, between 64 MiB and 4 GiB).
    pub max_range_bytes_in_flight: u64,
    /// `--cert-file`, `--key-file`, `--trusted-ca-file` and `--client-cert-auth`, served on the
    /// `https://` client URLs (and needed by them). Replaced files are served to new
    /// connections without a restart.
    pub client_tls: Option<cairn_transport::TlsFiles>,
    /// `http://host:port` URLs that serve only `/metrics` and `/health`, in plain HTTP
    /// (etcd's `--listen-metrics-urls`); the client URLs serve `/metrics` too.
    pub listen_metrics_urls: Vec<String>,
    /// etcd's `--corrupt-check-time`: how often the leader compares members' HashKV (`None`:
    /// never, etcd's default).
    pub corrupt_check_interval: Option<std::time::Duration>,
    /// etcd's `--auth-token`: simple tokens (the engine's, living `auth_token_ttl` past their
    /// last use), JWT tokens, or none.
    pub auth_token: AuthToken,
}

#[cfg(feature = "server")]
impl ServeConfig {
    /// A member serving `engine` on `listen_client_urls`, every other setting at the default
    /// `cairn serve` gives it (no TLS, simple auth tokens, etcd's limits and intervals).
    pub fn new(engine: EngineConfig, listen_client_urls: Vec<String>) -> ServeConfig {
        ServeConfig {
            engine,
            listen_client_urls,
            advertise_peer_urls: Vec::new(),
            watch_progress_interval: std::time::Duration::from_secs(600),
            max_concurrent_streams: u32::MAX,
            max_client_conns: 0,
            max_range_bytes_in_flight: 0,
            client_tls: None,
            listen_metrics_urls: Vec::new(),
            corrupt_check_interval: None,
            auth_token: AuthToken::Simple,
        }
    }
}

/// The Common Name of the certificate a client presented, once the client listener verified it
/// (`--client-cert-auth` or `--trusted-ca-file` on an `https://` URL): a request extension on
/// every gRPC and HTTP request of that connection, read with
/// `request.extensions().get::<ClientCertName>()`. With `--client-cert-auth`, it is the client's
/// identity when authentication is on and the request carries no token, as in etcd. A connection
/// without a verified certificate has none.
#[cfg(feature = "server")]
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientCertName(pub String);

/// Parses `http://host:port` or `https://host:port` into a socket address.
#[cfg(feature = "server")]
pub fn parse_url(url: &str) -> Result<SocketAddr, String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("{url}: only http:// and https:// URLs are supported"))?;
    let hostport = rest.trim_end_matches('/');
    let hostport = hostport.replace("localhost", "127.0.0.1");
    hostport.parse().map_err(|e| format!("{url}: {e}"))
}

/// The client listeners' TLS, loaded once for all of them: an `https://` URL without
/// certificate files is refused in etcd's words.
#[cfg(feature = "server")]
fn client_tls(cfg: &ServeConfig) -> anyhow::Result<listen::Tls> {
    let Some(url) = cfg.listen_client_urls.iter().find(|u| cairn_transport::url::is_tls(u)) else {
        return Ok(None);
    };
    let Some(files) = &cfg.client_tls else {
        anyhow::bail!(
            "TLS key/cert (--cert-file, --key-file) must be provided for client url {url} with HTTPS scheme"
        );
    };
    // gRPC clients need h2 by ALPN (grpc-go refuses a server without it); HTTP/1 stays for
    // the health and version endpoints.
    let tls = cairn_transport::ServerTls::new(files.clone(), &[b"h2", b"http/1.1"])?;
    Ok(Some(Arc::new(tls)))
}

/// Opens the engine and serves the etcd API (and HTTP health) until `shutdown` resolves; a
/// leader hands its leadership over before the engine stops, as etcd does on SIGTERM.
#[cfg(feature = "server")]
pub async fn serve(
    cfg: ServeConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // The URLs and certificates first: a mistake in them is reported before the data
    // directory is touched.
    let listen = Listen::check(&cfg)?;
    let engine = Arc::new(tokio::task::block_in_place(|| Engine::open(cfg.engine.clone()))?);
    let served = serve_api(engine.clone(), &cfg, listen, shutdown, Owner::Server).await;
    // The streams' tasks (watches, keepalives) end a moment after the server stops, and the
    // last holder of the engine closes its database. Waiting for them (a bounded while) means
    // that when `serve` returns the data directory is free: a program that serves, stops and
    // opens it again (a restore, a test) does not find its LMDB environment still open.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while Arc::strong_count(&engine) > 1 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    tokio::task::block_in_place(|| engine.stop());
    served
}

/// Serves the etcd API (and HTTP health and `/metrics`) on `cfg.listen_client_urls` for an
/// engine the caller opened and keeps, until `shutdown` resolves or the engine stops: a program
/// that embeds [`Engine`] exposes it to etcd clients (etcdctl, client libraries) on the side.
///
/// `cfg.engine` is not read: the engine's own configuration is ([`ServeConfig::new`] with
/// `engine.config().clone()` is the usual way to make `cfg`). The engine stays the caller's:
/// serving stops without stopping it or moving its leadership. It ends with `Ok` once
/// `shutdown` resolves or the caller stops the engine, and with the reason when the engine
/// stops by itself (a storage failure, or its removal from the cluster). As [`serve`] does,
/// it raises the process's soft limit on open files to the hard limit, so client connections
/// never take the descriptors the engine's log needs.
///
/// The calls a follower forwards by the leader's client URL (lease keepalives and TTLs,
/// membership changes) reach the leader only if the leader serves the API too, at the
/// `advertise_client_urls` it was opened with; KV requests and watches need no such thing.
#[cfg(feature = "server")]
pub async fn serve_engine(
    engine: Arc<Engine>,
    cfg: ServeConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let listen = Listen::check(&cfg)?;
    serve_api(engine, &cfg, listen, shutdown, Owner::Caller).await
}

/// Who stops the engine once serving ends: what serving does on its way out.
#[cfg(feature = "server")]
#[derive(Clone, Copy, PartialEq, Eq)]
enum Owner {
    /// [`serve`]: the engine stops with the server, so a leader hands its leadership over.
    Server,
    /// [`serve_engine`]: the engine outlives the server and keeps its role.
    Caller,
}

/// What is checked before anything opens: the client URLs, their TLS, the open-file limit.
#[cfg(feature = "server")]
struct Listen {
    addrs: Vec<SocketAddr>,
    tls: listen::Tls,
    fd_limit: Option<u64>,
}

#[cfg(feature = "server")]
impl Listen {
    fn check(cfg: &ServeConfig) -> anyhow::Result<Listen> {
        let addrs = cfg
            .listen_client_urls
            .iter()
            .map(|u| parse_url(u))
            .collect::<Result<_, _>>()
            .map_err(anyhow::Error::msg)?;
        let tls = client_tls(cfg)?;
        Ok(Listen { addrs, tls, fd_limit: fdlimit::raise_nofile() })
    }
}

/// What the etcd services share, for `engine` as `cfg` serves it.
#[cfg(feature = "server")]
fn services_context(
    engine: Arc<Engine>,
    cfg: &ServeConfig,
    stopping: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<services::Ctx> {
    Ok(services::Ctx {
        engine,
        peer_urls: cfg.advertise_peer_urls.clone(),
        watch_progress_interval: cfg.watch_progress_interval,
        stopping,
        leader_channels: lease::LeaderChannels::default(),
        range_budget: range_budget::RangeBudget::new(match cfg.max_range_bytes_in_flight {
            0 => range_budget::default_bytes(),
            n => n,
        }),
        bulk: bulk::BulkPool::start(
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
        )?,
        authn: auth::Authn {
            cert_auth: cfg.client_tls.as_ref().is_some_and(|t| t.client_cert_auth),
            tokens: cfg.auth_token.clone(),
        },
    })
}

/// Every etcd service and the HTTP endpoints, behind one router.
#[cfg(feature = "server")]
async fn router(ctx: services::Ctx) -> http::Dispatch {
    // etcd accepts messages up to the request limit plus gRPC overhead, on every service, then
    // checks the limit itself so the client gets "request is too large".
    let max_decode = ctx.engine.config().max_request_bytes + 512 * 1024;
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
    let kv = etcd_service!(pb::kv_server::KvServer::new(ctx.clone()));
    let routes = tonic::service::Routes::new(health_service)
        .add_service(kv.clone())
        .add_service(etcd_service!(pb::maintenance_server::MaintenanceServer::new(ctx.clone())))
        .add_service(etcd_service!(pb::cluster_server::ClusterServer::new(ctx.clone())))
        .add_service(etcd_service!(
            cairn_proto::wire::etcdserverpb::watch_server::WatchServer::new(ctx.clone())
        ))
        .add_service(etcd_service!(pb::lease_server::LeaseServer::new(ctx.clone())))
        .add_service(etcd_service!(pb::auth_server::AuthServer::new(ctx.clone())));
    let grpc_routes = routes
        .into_axum_router()
        .layer(tower::util::MapRequestLayer::new(
            move |req: axum::http::Request<axum::body::Body>| {
                req.map(|body| grpc_limit::limit(body, max_decode))
            },
        ))
        .layer(tower::util::MapResponseLayer::new(large_response::send_encoded));
    http::Dispatch {
        grpc: grpc_routes,
        http: http::routes(ctx.engine.clone()),
        engine: Some(ctx.engine.clone()),
        kv: Some((kv, max_decode)),
    }
}

/// The bound client and metrics listeners.
#[cfg(feature = "server")]
struct Listeners {
    clients: Vec<(SocketAddr, tokio::net::TcpListener, listen::Tls)>,
    metrics: Vec<(SocketAddr, tokio::net::TcpListener)>,
}

#[cfg(feature = "server")]
async fn bind(cfg: &ServeConfig, listen: Listen) -> anyhow::Result<Listeners> {
    let mut metrics = Vec::new();
    for url in &cfg.listen_metrics_urls {
        let addr = parse_url(url).map_err(anyhow::Error::msg)?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("--listen-metrics-urls: listen on {addr}: {e}"))?;
        metrics.push((addr, listener));
    }
    let mut clients = Vec::new();
    for (addr, url) in listen.addrs.into_iter().zip(&cfg.listen_client_urls) {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("listen on {addr}: {e}"))?;
        let tls = if cairn_transport::url::is_tls(url) { listen.tls.clone() } else { None };
        clients.push((addr, listener, tls));
    }
    Ok(Listeners { clients, metrics })
}

/// Serves the etcd API for `engine` until `shutdown` resolves or the engine stops.
#[cfg(feature = "server")]
async fn serve_api(
    engine: Arc<Engine>,
    cfg: &ServeConfig,
    listen: Listen,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    owner: Owner,
) -> anyhow::Result<()> {
    // Set when the server stops: graceful shutdown waits for every stream to end, so the
    // streams that would never end by themselves (watches) end on it.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let router = router(services_context(engine.clone(), cfg, stop_rx.clone())?).await;
    let fd_limit = listen.fd_limit;
    let listeners = bind(cfg, listen).await?;
    // Once everything but the clients is open: the engine, the peer transport, the listeners.
    let conns = fdlimit::ConnLimit::for_clients(cfg.max_client_conns, fd_limit)
        .map_err(anyhow::Error::msg)?;
    let mut servers = Vec::new();
    let checker = cfg.corrupt_check_interval.map(|i| tokio::spawn(corrupt::run(engine.clone(), i)));
    for (addr, listener, tls) in listeners.clients {
        let scheme = if tls.is_some() { "https" } else { "http" };
        eprintln!("cairn: serving the etcd v3 API on {scheme}://{addr}");
        let max_streams = cfg.max_concurrent_streams;
        servers.push(tokio::spawn(listen::serve(
            listener,
            router.clone(),
            stop_rx.clone(),
            max_streams,
            conns.clone(),
            tls,
        )));
    }
    for (addr, listener) in listeners.metrics {
        eprintln!("cairn: serving /metrics and /health on http://{addr}");
        let stopped = streams::stopped(stop_rx.clone());
        let app = http::metrics_routes(engine.clone());
        servers.push(tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stopped).await {
                tracing::warn!("the metrics listener on {addr} failed: {e}");
            }
        }));
    }
    let end = tokio::select! {
        () = shutdown => End::Asked,
        end = engine_stopped(engine.clone()) => end,
    };
    if end == End::Asked && owner == Owner::Server {
        // Still serving while it hands over, as etcd does.
        if let Err(e) = engine.hand_over_leadership().await {
            tracing::warn!("leadership transfer before stopping failed: {e}");
        }
    }
    let _ = stop_tx.send(true);
    if let Some(c) = checker {
        c.abort();
    }
    for s in servers {
        let _ = s.await;
    }
    match end {
        End::Fatal(why) => Err(anyhow::anyhow!("{why}")),
        End::Asked | End::EngineStopped => Ok(()),
    }
}

/// Why serving ends.
#[cfg(feature = "server")]
#[derive(Debug, PartialEq, Eq)]
enum End {
    /// The shutdown future resolved.
    Asked,
    /// The engine's owner stopped it ([`serve_engine`]'s caller).
    EngineStopped,
    /// Fail-stop: the engine stopped by itself and refuses everything; `cairn serve` exits with
    /// the reason, so a supervisor restarts it and the WAL replays.
    Fatal(String),
}

/// Resolves once the engine stops: its leadership notifications end then, whatever stopped it.
#[cfg(feature = "server")]
async fn engine_stopped(engine: Arc<Engine>) -> End {
    let mut leadership = engine.leadership();
    while leadership.changed().await.is_ok() {}
    if let Some(why) = engine.status().failure {
        return End::Fatal(format!("stopped after a storage failure: {why}"));
    }
    if engine.is_removed() {
        return End::Fatal(cairn_node::StopCause::Removed.to_string());
    }
    End::EngineStopped
}
