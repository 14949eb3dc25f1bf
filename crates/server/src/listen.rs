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

use crate::coalesce::Coalesced;
use crate::fdlimit::ConnLimit;

/// The connection window: see the module's comment.
const CONNECTION_WINDOW: u32 = 16 << 20;

/// Serves `router` on `listener` until `stop` turns true, then lets open connections finish.
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
) {
    let stopping = crate::streams::stopped(stop);
    tokio::pin!(stopping);
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http2()
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_concurrent_streams(max_streams);
    let graceful = GracefulShutdown::new();
    loop {
        let (tcp, _) = tokio::select! {
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
        // Frames written together (see `Coalesced`); etcdctl 3.4 sends a URL as :authority,
        // which h2 refuses (see `authority`).
        let io = TokioIo::new(Coalesced::new(crate::authority::FixAuthority::new(tcp)));
        let service =
            router.clone().map_request(|req: hyper::Request<Incoming>| req.map(Body::new));
        let conn = builder.serve_connection_with_upgrades(io, TowerToHyperService::new(service));
        let conn = graceful.watch(conn.into_owned());
        tokio::spawn(async move {
            let _ = conn.await;
            drop(admitted);
        });
    }
    graceful.shutdown().await;
}
