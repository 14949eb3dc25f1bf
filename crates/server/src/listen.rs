//! Serving one client listener: HTTP/1 and HTTP/2 on the same port (gRPC over HTTP/2, and the
//! health and version endpoints), with a graceful stop.
//!
//! axum's own `serve` would do, but it leaves hyper's HTTP/2 settings at their defaults, and one
//! of them matters here: since h2 0.4.16, a connection whose unread small DATA frames exceed a
//! budget of half the connection window is closed (GOAWAY, ENHANCE_YOUR_CALM). grpc-go sends
//! every stream message in a frame of its own, so a client creating ten thousand watches at
//! once, or keeping thousands of leases alive on one stream, sends tens of thousands of tiny
//! frames in a burst, more than the default 1 MiB window's budget (about 2,200) before the
//! server's reader gets to them, and lost its connection; etcd (grpc-go) has no such limit.
//! A 16 MiB connection window gives a budget of about 35,000 frames per connection, while the
//! per-stream window (1 MiB) still bounds what one stream may send ahead.
//!
//! An `https://` listener runs the TLS handshake in the connection's own task (a slow or
//! hostile client never holds up the accept loop), then serves the same stack over rustls:
//! `Coalesced` (gathering h2's small frames) sits above TLS, where it matters more than on a
//! bare socket, since every write TLS is handed becomes at least one record (a header, a tag
//! and an encryption pass) and one syscall. The authority fix-up reads plaintext, so it sits
//! above TLS too. A plain listener's connections take exactly the path they took before TLS.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tower::ServiceExt;

use cairn_transport::tls::common_name;
use cairn_transport::ServerTls;
use hyper_util::server::graceful::Watcher;

use crate::coalesce::Coalesced;
use crate::fdlimit::{Admitted, ConnLimit};
use crate::ClientCertName;

/// The connection window: see the module's comment.
const CONNECTION_WINDOW: u32 = 16 << 20;
/// A client that has not finished its TLS handshake by then is dropped (it holds a socket and a
/// place under the connection cap).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a stop waits for the open connections' streams to end before it closes the
/// connections. A stop lets running calls finish, but a client can hold a stream open for as long
/// as it likes (by not reading a snapshot or a large range, whose response then waits for flow
/// control), and without a bound the member would never stop. etcd does the same: a graceful
/// stop, then after its request timeout the transports are closed (`embed.stopServers`).
const STOP_GRACE: Duration = Duration::from_secs(5);

/// A client listener's TLS, for an `https://` URL.
pub(crate) type Tls = Option<Arc<ServerTls>>;

/// Serves `router` on `listener` until `stop` turns true, then lets open connections finish for
/// up to [`STOP_GRACE`] and closes those left.
/// `max_streams` bounds the concurrent streams of one connection (etcd's
/// `--max-concurrent-streams`): etcd clients put every call and watch on one connection, and
/// hyper's default of 200 made the 201st stream (a watch, or a plain put) wait. A connection
/// past `conns` is closed at once, so clients never take the descriptors the WAL needs.
pub(crate) async fn serve(
    listener: TcpListener,
    router: crate::http::Dispatch,
    stop: watch::Receiver<bool>,
    max_streams: u32,
    conns: Arc<ConnLimit>,
    tls: Tls,
) {
    let stopping = crate::streams::stopped(stop.clone());
    tokio::pin!(stopping);
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http2()
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_concurrent_streams(max_streams);
    let graceful = GracefulShutdown::new();
    // Every connection's task, so that those still open after the grace can be ended.
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        while tasks.try_join_next().is_some() {}
        let (tcp, addr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: wait rather than spin.
                    tracing::warn!("accepting a client connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stopping => break,
        };
        let Some(admitted) = conns.admit() else { continue };
        // Without TCP_NODELAY, small gRPC frames wait for delayed ACKs (about 40 ms each).
        let _ = tcp.set_nodelay(true);
        if let Some(tls) = &tls {
            let stack = Stack {
                builder: builder.clone(),
                router: router.clone(),
                watcher: graceful.watcher(),
                stop: stop.clone(),
            };
            tasks.spawn(serve_tls(tcp, addr, tls.clone(), stack, admitted));
            continue;
        }
        // Frames written together (see `Coalesced`); etcdctl 3.4 sends a URL as :authority,
        // which h2 refuses (see `authority`).
        let io = TokioIo::new(Coalesced::new(crate::authority::FixAuthority::new(tcp)));
        let service =
            router.clone().map_request(|req: hyper::Request<Incoming>| req.map(Body::new));
        let conn = builder.serve_connection_with_upgrades(io, TowerToHyperService::new(service));
        let conn = graceful.watch(conn.into_owned());
        tasks.spawn(async move {
            let _ = conn.await;
            drop(admitted);
        });
    }
    if tokio::time::timeout(STOP_GRACE, graceful.shutdown()).await.is_err() {
        while tasks.try_join_next().is_some() {}
        tracing::warn!(
            "closing {} client connections whose streams did not end within {STOP_GRACE:?} of \
             the stop",
            tasks.len()
        );
        tasks.shutdown().await;
    }
}

/// What a TLS connection's task serves with, once its handshake is done.
struct Stack {
    builder: Builder<TokioExecutor>,
    router: crate::http::Dispatch,
    /// Holds the graceful stop until the connection ends.
    watcher: Watcher,
    /// A handshake still under way when the server stops is dropped at once rather than
    /// holding the stop for up to [`HANDSHAKE_TIMEOUT`].
    stop: watch::Receiver<bool>,
}

/// Serves one connection of an `https://` listener: the handshake, then the client port's stack
/// over rustls, with the client certificate's Common Name on every request (see
/// [`ClientCertName`]).
async fn serve_tls(
    tcp: tokio::net::TcpStream,
    addr: std::net::SocketAddr,
    tls: Arc<ServerTls>,
    stack: Stack,
    admitted: Admitted,
) {
    let Stack { builder, router, watcher, stop } = stack;
    let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.acceptor().accept(tcp));
    let handshake = tokio::select! {
        done = handshake => done,
        () = crate::streams::stopped(stop) => return,
    };
    let stream = match handshake {
        Ok(Ok(s)) => s,
        // etcd logs these too: a plain client on a TLS port, an untrusted certificate.
        Ok(Err(e)) => return tracing::warn!(%addr, "rejected a client connection: TLS: {e}"),
        Err(_) => {
            return tracing::warn!(%addr, "rejected a client connection: TLS handshake timed out")
        }
    };
    let cert = stream.get_ref().1.peer_certificates().and_then(|c| c.first());
    // `--client-cert-allowed-hostname`, as etcd checks it.
    if let Err(why) = tls.check_allowed(cert) {
        return tracing::warn!(%addr, "rejected a client connection: {why}");
    }
    let name = cert.and_then(common_name);
    let name = name.map(ClientCertName);
    let io = TokioIo::new(Coalesced::new(crate::authority::FixAuthority::new(stream)));
    let service = router.map_request(move |req: hyper::Request<Incoming>| {
        let mut req = req.map(Body::new);
        if let Some(name) = &name {
            req.extensions_mut().insert(name.clone());
        }
        req
    });
    let conn = builder.serve_connection_with_upgrades(io, TowerToHyperService::new(service));
    let _ = watcher.watch(conn.into_owned()).await;
    drop(admitted);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_pki as pki;
    use axum::http::Request;
    use axum::routing::get;
    use cairn_transport::{ClientTls, ServerName, TlsFiles};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Asks `/whoami` over HTTP/1 and TLS as the holder of `files`.
    async fn whoami(addr: std::net::SocketAddr, files: TlsFiles) -> std::io::Result<String> {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let client = ClientTls::new(files).expect("client TLS");
        let name = ServerName::try_from("localhost").expect("a name").to_owned();
        let mut tls = client.connector().connect(name, tcp).await?;
        tls.write_all(b"GET /whoami HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
            .await?;
        let mut answer = String::new();
        tls.read_to_string(&mut answer).await?;
        Ok(answer)
    }

    #[tokio::test]
    async fn a_verified_client_certificates_common_name_reaches_the_handlers() {
        let dir = pki::dir("listen-cn");
        let ca = pki::Ca::new(&dir, "clients");
        let server = ServerTls::new(ca.files("server", "server", true), &[b"h2", b"http/1.1"]);
        let http = axum::Router::new().route(
            "/whoami",
            get(|req: Request<Body>| async move {
                let name = req.extensions().get::<ClientCertName>().cloned();
                format!("name={:?}", name.map(|n| n.0))
            }),
        );
        let router =
            crate::http::Dispatch { grpc: axum::Router::new(), http, engine: None, kv: None };
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = watch::channel(false);
        let tls = Some(Arc::new(server.expect("server TLS")));
        let served = tokio::spawn(serve(listener, router, stopped, 100, ConnLimit::new(8), tls));
        let answer = whoami(addr, ca.files("alice", "alice", false)).await.expect("an answer");
        assert!(answer.ends_with(r#"name=Some("alice")"#), "{answer}");
        // A certificate of another CA never gets an answer.
        let other = pki::Ca::new(&dir, "other");
        let refused = whoami(addr, other.files("mallory", "alice", false)).await;
        assert!(refused.is_err() || !refused.expect("read").contains("name="));
        // A client that never starts its handshake does not hold up the stop.
        let _idle = tokio::net::TcpStream::connect(addr).await.expect("connect");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let _ = stop.send(true);
        let stopped = tokio::time::timeout(Duration::from_secs(3), served).await;
        stopped.expect("the listener stops at once").expect("the listener's task");
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A response whose body never ends (as one that waits for a client that stopped reading)
    /// holds a stop for [`STOP_GRACE`], no longer: then its connection is closed.
    #[tokio::test]
    async fn a_stream_that_never_ends_holds_a_stop_for_the_grace_only() {
        let forever = || async {
            let pending = tokio_stream::pending::<Result<axum::body::Bytes, std::io::Error>>();
            let first = tokio_stream::once(Ok(axum::body::Bytes::from_static(b"first")));
            Body::from_stream(tokio_stream::StreamExt::chain(first, pending))
        };
        let http = axum::Router::new().route("/forever", get(forever));
        let router =
            crate::http::Dispatch { grpc: axum::Router::new(), http, engine: None, kv: None };
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = watch::channel(false);
        let served = tokio::spawn(serve(listener, router, stopped, 100, ConnLimit::new(8), None));
        let mut client = tokio::net::TcpStream::connect(addr).await.expect("connect");
        client.write_all(b"GET /forever HTTP/1.1\r\nhost: localhost\r\n\r\n").await.expect("ask");
        let mut answer = Vec::new();
        while !answer.windows(5).any(|w| w == b"first") {
            let mut buf = [0u8; 1024];
            let n = client.read(&mut buf).await.expect("read");
            assert!(n > 0, "the server closed before the body began");
            answer.extend_from_slice(&buf[..n]);
        }
        let asked = std::time::Instant::now();
        let _ = stop.send(true);
        let stopped = tokio::time::timeout(STOP_GRACE + Duration::from_secs(5), served).await;
        stopped.expect("the listener stops after the grace").expect("the listener's task");
        assert!(asked.elapsed() >= STOP_GRACE, "the stop waited for the grace first");
        // The connection is closed: the client reads its end.
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut rest));
        read.await.expect("the connection is closed").expect("read to the end");
    }
}
