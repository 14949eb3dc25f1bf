//! go-grpc-prometheus' server metrics, which etcd exports: `grpc_server_started_total`,
//! `grpc_server_handled_total`, `grpc_server_msg_received_total` and `_sent_total`, labelled
//! by `grpc_type`, `grpc_service`, `grpc_method` (and `grpc_code`).
//!
//! Every method etcd serves has its slot in a static table, as go-grpc-prometheus registers
//! every method with every code up front: a call costs a scan of the table's names and atomic
//! increments, with no lock and no allocation. The code of a call is read from its trailers as
//! the body passes them on ([`Counted`]), or from the headers of a trailers-only answer.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::HeaderMap;
use bytes::Bytes;
use http_body::Frame;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::MetricType;

const UNARY: &str = "unary";
const SERVER_STREAM: &str = "server_stream";
const BIDI_STREAM: &str = "bidi_stream";

/// (service, method, type) of every method etcd 3.5 serves, and the health service.
const METHODS: [(&str, &str, &str); 51] = [
    ("etcdserverpb.KV", "Range", UNARY),
    ("etcdserverpb.KV", "Put", UNARY),
    ("etcdserverpb.KV", "DeleteRange", UNARY),
    ("etcdserverpb.KV", "Txn", UNARY),
    ("etcdserverpb.KV", "Compact", UNARY),
    ("etcdserverpb.KV", "RangeStream", SERVER_STREAM),
    ("etcdserverpb.Watch", "Watch", BIDI_STREAM),
    ("etcdserverpb.Lease", "LeaseGrant", UNARY),
    ("etcdserverpb.Lease", "LeaseRevoke", UNARY),
    ("etcdserverpb.Lease", "LeaseKeepAlive", BIDI_STREAM),
    ("etcdserverpb.Lease", "LeaseTimeToLive", UNARY),
    ("etcdserverpb.Lease", "LeaseLeases", UNARY),
    ("etcdserverpb.Cluster", "MemberAdd", UNARY),
    ("etcdserverpb.Cluster", "MemberRemove", UNARY),
    ("etcdserverpb.Cluster", "MemberUpdate", UNARY),
    ("etcdserverpb.Cluster", "MemberList", UNARY),
    ("etcdserverpb.Cluster", "MemberPromote", UNARY),
    ("etcdserverpb.Maintenance", "Alarm", UNARY),
    ("etcdserverpb.Maintenance", "Status", UNARY),
    ("etcdserverpb.Maintenance", "Defragment", UNARY),
    ("etcdserverpb.Maintenance", "Hash", UNARY),
    ("etcdserverpb.Maintenance", "HashKV", UNARY),
    ("etcdserverpb.Maintenance", "Snapshot", SERVER_STREAM),
    ("etcdserverpb.Maintenance", "MoveLeader", UNARY),
    ("etcdserverpb.Maintenance", "Downgrade", UNARY),
    ("etcdserverpb.Auth", "AuthEnable", UNARY),
    ("etcdserverpb.Auth", "AuthDisable", UNARY),
    ("etcdserverpb.Auth", "AuthStatus", UNARY),
    ("etcdserverpb.Auth", "Authenticate", UNARY),
    ("etcdserverpb.Auth", "UserAdd", UNARY),
    ("etcdserverpb.Auth", "UserGet", UNARY),
    ("etcdserverpb.Auth", "UserList", UNARY),
    ("etcdserverpb.Auth", "UserDelete", UNARY),
    ("etcdserverpb.Auth", "UserChangePassword", UNARY),
    ("etcdserverpb.Auth", "UserGrantRole", UNARY),
    ("etcdserverpb.Auth", "UserRevokeRole", UNARY),
    ("etcdserverpb.Auth", "RoleAdd", UNARY),
    ("etcdserverpb.Auth", "RoleGet", UNARY),
    ("etcdserverpb.Auth", "RoleList", UNARY),
    ("etcdserverpb.Auth", "RoleDelete", UNARY),
    ("etcdserverpb.Auth", "RoleGrantPermission", UNARY),
    ("etcdserverpb.Auth", "RoleRevokePermission", UNARY),
    ("v3lockpb.Lock", "Lock", UNARY),
    ("v3lockpb.Lock", "Unlock", UNARY),
    ("v3electionpb.Election", "Campaign", UNARY),
    ("v3electionpb.Election", "Proclaim", UNARY),
    ("v3electionpb.Election", "Leader", UNARY),
    ("v3electionpb.Election", "Observe", SERVER_STREAM),
    ("v3electionpb.Election", "Resign", UNARY),
    ("grpc.health.v1.Health", "Check", UNARY),
    ("grpc.health.v1.Health", "Watch", SERVER_STREAM),
];

/// gRPC's status codes by number, named as grpc-go names them.
const CODES: [&str; 17] = [
    "OK",
    "Canceled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
];

/// One method's counts.
#[derive(Debug)]
pub(crate) struct MethodStats {
    started: AtomicU64,
    received: AtomicU64,
    sent: AtomicU64,
    handled: [AtomicU64; 17],
    unary: bool,
}

impl MethodStats {
    /// A message received on a stream.
    pub(crate) fn received(&self) {
        self.received.fetch_add(1, Ordering::Relaxed);
    }

    /// A message sent on a stream.
    pub(crate) fn sent(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    fn handled(&self, code: usize) {
        // A code past gRPC's is counted as Unknown.
        let code = if code < CODES.len() { code } else { 2 };
        self.handled[code].fetch_add(1, Ordering::Relaxed);
        if self.unary && code == 0 {
            self.sent();
        }
    }
}

/// Every method's counts.
#[derive(Debug)]
pub(crate) struct GrpcStats {
    methods: [MethodStats; METHODS.len()],
}

impl GrpcStats {
    /// The counts of the method at `path` (`/etcdserverpb.KV/Put`), if etcd serves it.
    pub(crate) fn method(&'static self, path: &str) -> Option<&'static MethodStats> {
        let (service, method) = path.strip_prefix('/')?.split_once('/')?;
        let i = METHODS.iter().position(|(s, m, _)| *m == method && *s == service)?;
        Some(&self.methods[i])
    }

    /// The counts of `service`'s `method`, for stream handlers that count their messages.
    pub(crate) fn of(&'static self, service: &str, method: &str) -> &'static MethodStats {
        let i = METHODS.iter().position(|(s, m, _)| *m == method && *s == service);
        // Only called with names from the table.
        &self.methods[i.unwrap_or(0)]
    }
}

const fn stats(unary: bool) -> MethodStats {
    MethodStats {
        started: AtomicU64::new(0),
        received: AtomicU64::new(0),
        sent: AtomicU64::new(0),
        handled: [const { AtomicU64::new(0) }; 17],
        unary,
    }
}

const fn table() -> GrpcStats {
    let mut methods = [const { stats(true) }; METHODS.len()];
    let mut i = 0;
    while i < METHODS.len() {
        // `str` equality is not const: the types differ in their first byte.
        methods[i].unary = METHODS[i].2.as_bytes()[0] == b'u';
        i += 1;
    }
    GrpcStats { methods }
}

/// The process's gRPC counts.
pub(crate) static GRPC: GrpcStats = table();

/// A gRPC call on its way: counted as started, and as handled once its code is known.
#[derive(Debug)]
pub(crate) struct GrpcCall(&'static MethodStats);

impl GrpcCall {
    /// A call to `path` starts; `None` for a method etcd does not serve.
    pub(crate) fn start(path: &str) -> Option<GrpcCall> {
        let m = GRPC.method(path)?;
        m.started.fetch_add(1, Ordering::Relaxed);
        if m.unary {
            m.received();
        }
        Some(GrpcCall(m))
    }

    /// The answer's headers arrived: a trailers-only answer (an error before any message)
    /// carries its code here and is counted now; otherwise the body counts it.
    pub(crate) fn answered(self, headers: &HeaderMap, body: Body) -> Counted {
        match code(headers) {
            Some(c) => {
                self.0.handled(c);
                Counted { body, call: None }
            }
            None => Counted { body, call: Some(self.0) },
        }
    }
}

fn code(h: &HeaderMap) -> Option<usize> {
    let v = h.get("grpc-status")?.to_str().ok()?;
    v.parse().ok()
}

/// A response body that counts its call as handled when the trailers pass, or as `Canceled`
/// if it is dropped before them (the client went away).
#[derive(Debug)]
pub(crate) struct Counted {
    body: Body,
    call: Option<&'static MethodStats>,
}

impl Counted {
    /// A body that is not a counted gRPC call's.
    pub(crate) fn plain(body: Body) -> Counted {
        Counted { body, call: None }
    }
}

impl http_body::Body for Counted {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let frame = std::task::ready!(Pin::new(&mut self.body).poll_frame(cx));
        if let Some(Ok(f)) = &frame {
            if let Some(trailers) = f.trailers_ref() {
                if let Some(call) = self.call.take() {
                    call.handled(code(trailers).unwrap_or(2));
                }
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        if let Some(call) = self.call.take() {
            call.handled(1);
        }
    }
}

/// Writes the four families.
pub(super) fn encode(enc: &mut DescriptorEncoder) -> std::fmt::Result {
    type Pick = fn(&MethodStats) -> &AtomicU64;
    let families: [(&str, &str, Pick); 3] = [
        ("grpc_server_started", "Total number of RPCs started on the server.", |m| &m.started),
        (
            "grpc_server_msg_received",
            "Total number of RPC stream messages received on the server.",
            |m| &m.received,
        ),
        ("grpc_server_msg_sent", "Total number of gRPC stream messages sent by the server.", |m| {
            &m.sent
        }),
    ];
    for (name, help, pick) in families {
        let mut family = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
        for ((service, method, kind), m) in METHODS.iter().zip(&GRPC.methods) {
            let labels =
                [("grpc_type", *kind), ("grpc_service", *service), ("grpc_method", *method)];
            let n = pick(m).load(Ordering::Relaxed);
            ConstCounter::new(n).encode(family.encode_family(&labels)?)?;
        }
    }
    let help = "Total number of RPCs completed on the server, regardless of success or failure.";
    let mut family =
        enc.encode_descriptor("grpc_server_handled", help, None, MetricType::Counter)?;
    for ((service, method, kind), m) in METHODS.iter().zip(&GRPC.methods) {
        for (code, n) in CODES.iter().zip(&m.handled) {
            let labels = [
                ("grpc_type", *kind),
                ("grpc_service", *service),
                ("grpc_method", *method),
                ("grpc_code", *code),
            ];
            ConstCounter::new(n.load(Ordering::Relaxed)).encode(family.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_are_found_by_path_with_their_type() {
        let put = GRPC.method("/etcdserverpb.KV/Put").expect("Put is etcd's");
        assert!(put.unary);
        let watch = GRPC.method("/etcdserverpb.Watch/Watch").expect("Watch is etcd's");
        assert!(!watch.unary);
        // Two methods named Watch: the service tells them apart.
        assert!(!std::ptr::eq(watch, GRPC.method("/grpc.health.v1.Health/Watch").expect("health")));
        assert!(GRPC.method("/etcdserverpb.KV/Nope").is_none());
        assert!(GRPC.method("garbage").is_none());
    }
}
