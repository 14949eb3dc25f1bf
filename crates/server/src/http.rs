//! The client port's HTTP side, as etcd serves it: `/health` (JSON, with a linearizable check),
//! `/livez`, `/readyz` and `/version`; and the split between gRPC and plain HTTP.
//!
//! gRPC is served only to HTTP/2 requests with an `application/grpc` content type. Browsers
//! speak HTTP/2 only over TLS, which cairn does not serve, so a web page can never reach a gRPC
//! method (a cross-site `DeleteRange` by a plain form POST used to run); such requests get a 4xx
//! that says why, and nothing runs.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{header, HeaderValue, Method, Request, StatusCode, Version};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use cairn_node::Engine;

use crate::metrics::{Counted, GrpcCall};
use health::health;

pub(crate) mod health;
use crate::services::ETCD_COMPATIBLE_VERSION;

/// etcd's `/version` body, with cairn's own version beside the etcd version it reports. etcd
/// clients parse `etcdcluster` (the cluster's major.minor, patch 0) to gate features.
pub(crate) fn version_json() -> String {
    let mut parts = ETCD_COMPATIBLE_VERSION.split('.');
    let cluster = match (parts.next(), parts.next()) {
        (Some(major), Some(minor)) => format!("{major}.{minor}.0"),
        _ => ETCD_COMPATIBLE_VERSION.to_string(),
    };
    format!(
        r#"{{"etcdserver":"{ETCD_COMPATIBLE_VERSION}","etcdcluster":"{cluster}","cairn":"{}"}}"#,
        env!("CARGO_PKG_VERSION")
    )
}

/// `/metrics`, as both the client port and `--listen-metrics-urls` serve it.
fn metrics_route(engine: Arc<Engine>) -> axum::routing::MethodRouter {
    let registry = crate::metrics::registry(engine);
    get(move || {
        let registry = registry.clone();
        async move {
            (
                [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
                crate::metrics::encode(&registry),
            )
        }
    })
}

/// What `--listen-metrics-urls` serves, as etcd does there: `/metrics` and `/health`.
pub(crate) fn metrics_routes(engine: Arc<Engine>) -> Router {
    Router::new().route("/metrics", metrics_route(engine.clone())).route("/health", health(engine))
}

pub fn routes(engine: Arc<Engine>) -> Router {
    Router::new()
        .route("/metrics", metrics_route(engine.clone()))
        .route("/health", health(engine.clone()))
        .merge(health::probe_routes(engine))
        .route(
            "/version",
            get(|| async { ([(header::CONTENT_TYPE, "application/json")], version_json()) }),
        )
        .fallback(not_found)
}

/// Whether `req` may reach the gRPC services: HTTP/2 with `application/grpc`, `application/grpc+proto`
/// or the like (not gRPC-Web, which is meant for browsers).
pub(crate) fn is_grpc<B>(req: &Request<B>) -> bool {
    req.version() == Version::HTTP_2
        && req.headers().get(header::CONTENT_TYPE).is_some_and(|ct| {
            let ct = ct.as_bytes();
            ct.strip_prefix(b"application/grpc")
                .is_some_and(|rest| rest.is_empty() || rest[0] == b'+' || rest[0] == b';')
        })
}

/// A gRPC method's path: `/package.Service/Method`.
fn looks_like_grpc(path: &str) -> bool {
    let mut parts = path.trim_start_matches('/').split('/');
    matches!((parts.next(), parts.next(), parts.next()),
        (Some(service), Some(method), None) if service.contains('.') && !method.is_empty())
}

/// Every HTTP request no route takes: a text answer that says what went wrong.
async fn not_found(req: Request<Body>) -> Response {
    let path = req.uri().path();
    let text = |code: StatusCode, body: String| (code, body + "\n").into_response();
    if path.starts_with("/v3/") {
        return text(
            StatusCode::NOT_FOUND,
            format!(
                "{path}: cairn serves the etcd v3 API over gRPC only (no JSON gateway); \
                 use etcdctl or an etcd client"
            ),
        );
    }
    if req.method() == Method::POST && looks_like_grpc(path) {
        let ct = req.headers().get(header::CONTENT_TYPE).map(HeaderValue::as_bytes);
        let ct = String::from_utf8_lossy(ct.unwrap_or(b"none")).into_owned();
        let (code, what) = if req.version() == Version::HTTP_2 {
            (StatusCode::UNSUPPORTED_MEDIA_TYPE, format!("content-type {ct}"))
        } else {
            (StatusCode::BAD_REQUEST, format!("{:?}", req.version()))
        };
        return text(
            code,
            format!(
                "{path}: gRPC is served only over HTTP/2 with content-type application/grpc, \
                 not {what}"
            ),
        );
    }
    text(
        StatusCode::NOT_FOUND,
        format!(
            "404 page not found: {path} (cairn serves /health, /livez, /readyz, /version and \
             /metrics over HTTP, and the etcd v3 API over gRPC)"
        ),
    )
}

/// The message of an `Unimplemented` answer for the gRPC method at `path`, naming the call.
pub(crate) fn unimplemented_message(path: &str) -> String {
    let Some((service, method)) = path.strip_prefix('/').and_then(|p| p.split_once('/')) else {
        return format!("malformed method name: {path:?}");
    };
    match service {
        "v3lockpb.Lock" | "v3electionpb.Election" => format!(
            "cairn does not implement {service}/{method} yet (etcdctl lock and elect work: they \
             use the KV, Lease and Watch services)"
        ),
        "etcdserverpb.KV"
        | "etcdserverpb.Watch"
        | "etcdserverpb.Lease"
        | "etcdserverpb.Cluster"
        | "etcdserverpb.Maintenance"
        | "etcdserverpb.Auth"
        | "grpc.health.v1.Health" => {
            format!("unknown method {method} for service {service} (cairn)")
        }
        _ => format!("unknown service {service} (cairn serves the etcd v3 API)"),
    }
}

/// Names the call in an `Unimplemented` answer that has no message of its own: tonic's answer to
/// an unknown service or method is an empty one, which leaves an operator guessing.
fn name_unimplemented(path: &str, resp: &mut Response) {
    let h = resp.headers();
    let unimplemented = h.get(tonic::Status::GRPC_STATUS).is_some_and(|s| s == "12");
    let silent = h.get(tonic::Status::GRPC_MESSAGE).is_none_or(|m| m.is_empty());
    if unimplemented && silent {
        let status = tonic::Status::unimplemented(unimplemented_message(path));
        // Only fails for a message that cannot be a header, and the message here always can.
        let _ = status.add_header(resp.headers_mut());
    }
}

/// Sends gRPC requests (see [`is_grpc`]) to `grpc` and everything else to `http`. While the
/// engine is a learner, a gRPC call a learner does not serve is refused here
/// ([`crate::learner`]).
///
/// The KV service, every request of the hot paths, is called directly (`kv`): through the
/// router each call also paid axum's path match, a boxed service and three response wrappers,
/// about 4% of a leader's CPU under 100 writing clients (perf, 2026-11-29).
#[derive(Clone, Debug)]
pub(crate) struct Dispatch {
    pub grpc: Router,
    pub http: Router,
    pub engine: Option<Arc<Engine>>,
    /// The KV service, and the receive limit the router's layer applies to every service.
    pub kv: Option<(KvService, usize)>,
}

/// The etcd KV service as the router holds it.
pub(crate) type KvService = cairn_proto::etcdserverpb::kv_server::KvServer<crate::services::Ctx>;

/// The path prefix of the KV service's methods.
const KV_PREFIX: &str = "/etcdserverpb.KV/";

type RouteFuture = <Router as tower::Service<Request<Body>>>::Future;
type KvFuture = <KvService as tower::Service<Request<Body>>>::Future;

impl tower::Service<Request<Body>> for Dispatch {
    type Response = Response<Counted>;
    type Error = Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Both routers are always ready.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Answer {
        if is_grpc(&req) {
            let path = req.uri().path();
            let call = GrpcCall::start(path);
            if !crate::learner::serves(path) && self.engine.as_ref().is_some_and(|e| e.is_learner())
            {
                let refused = Some(Box::new(crate::learner::refusal()));
                return Answer { route: None, refused, grpc_path: None, call };
            }
            // A reference-counted clone: this runs on every call, unlike the naming.
            let grpc_path = req.uri().path_and_query().cloned();
            let route = match &mut self.kv {
                Some((kv, limit)) if path.starts_with(KV_PREFIX) => {
                    let limit = *limit;
                    Route::Kv(kv.call(req.map(|body| crate::grpc_limit::limit(body, limit))))
                }
                _ => Route::Routed(Box::pin(self.grpc.call(req))),
            };
            Answer { route: Some(route), refused: None, grpc_path, call }
        } else {
            let route = Some(Route::Routed(Box::pin(self.http.call(req))));
            Answer { route, refused: None, grpc_path: None, call: None }
        }
    }
}

/// A routed request's answer; for a gRPC call, with [`name_unimplemented`] applied and the
/// call counted (`metrics::grpc`).
///
/// hyper keeps each HTTP/2 stream's task as large as the larger of this future and the body it
/// sends after, for the stream's whole life. The routed call (hundreds of bytes of tower and
/// axum state) and a refusal are therefore boxed: a long-lived stream (a watch) then holds only
/// its body, and the call's state is freed once it answers.
pub(crate) struct Answer {
    /// The routed call, or none for a call refused before routing (`refused`).
    route: Option<Route>,
    refused: Option<Box<Response>>,
    grpc_path: Option<axum::http::uri::PathAndQuery>,
    call: Option<GrpcCall>,
}

/// A call through a router, or to the KV service directly (its future is boxed already).
enum Route {
    Routed(std::pin::Pin<Box<RouteFuture>>),
    Kv(KvFuture),
}

impl Route {
    /// The call's response, as the router's gRPC layers leave it.
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<Response, Infallible>> {
        match self {
            Route::Routed(route) => route.as_mut().poll(cx),
            Route::Kv(call) => call
                .as_mut()
                .poll(cx)
                .map_ok(|resp| crate::large_response::send_encoded(resp.map(Body::new))),
        }
    }
}

impl Future for Answer {
    type Output = Result<Response<Counted>, Infallible>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut resp = match (self.refused.take(), self.route.as_mut()) {
            (Some(refused), _) => *refused,
            (None, Some(route)) => std::task::ready!(route.poll(cx))?,
            (None, None) => unreachable!("an answer is either routed or refused"),
        };
        if let Some(path) = self.grpc_path.take() {
            name_unimplemented(path.path(), &mut resp);
        }
        let (parts, body) = resp.into_parts();
        let body = match self.call.take() {
            Some(call) => call.answered(&parts.headers, body),
            None => Counted::plain(body),
        };
        Poll::Ready(Ok(Response::from_parts(parts, body)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_reports_a_cluster_version_etcd_clients_parse() {
        let v: Vec<&str> = ETCD_COMPATIBLE_VERSION.split('.').collect();
        let want = format!(
            r#"{{"etcdserver":"{ETCD_COMPATIBLE_VERSION}","etcdcluster":"{}.{}.0","cairn":"{}"}}"#,
            v[0],
            v[1],
            env!("CARGO_PKG_VERSION")
        );
        assert_eq!(version_json(), want);
    }

    #[test]
    fn grpc_needs_http2_and_a_grpc_content_type() {
        let req = |v: Version, ct: Option<&str>| {
            let mut b = Request::builder().method("POST").uri("/etcdserverpb.KV/Range").version(v);
            if let Some(ct) = ct {
                b = b.header(header::CONTENT_TYPE, ct);
            }
            b.body(()).expect("a valid request")
        };
        assert!(is_grpc(&req(Version::HTTP_2, Some("application/grpc"))));
        assert!(is_grpc(&req(Version::HTTP_2, Some("application/grpc+proto"))));
        assert!(!is_grpc(&req(Version::HTTP_2, Some("application/grpc-web"))));
        assert!(!is_grpc(&req(Version::HTTP_2, Some("text/plain"))));
        assert!(!is_grpc(&req(Version::HTTP_2, None)));
        assert!(!is_grpc(&req(Version::HTTP_11, Some("application/grpc"))));
    }
}
