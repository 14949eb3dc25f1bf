//! What a learner serves, as etcd's gRPC interceptors decide it (`isRPCSupportedForLearner` in
//! etcd 3.5's `v3rpc`): Status, serializable Range and the Snapshot stream. Every other call is
//! refused before it reaches a service, with etcd 3.5's `ErrGPRCNotSupportedForLearner`
//! (`Unavailable`, "etcdserver: rpc not supported for learner"); clients such as etcd's Go
//! client then move to another endpoint. A learner's store lags its leader and it takes no part
//! in the quorum, so it must not answer anything that claims the cluster's current state:
//! watches, leases, the membership, hashes, auth.
//!
//! Range is let through by path: a linearizable one is refused by the engine
//! (`Engine::refuse_learner`), a serializable one served. RangeStream (etcd 3.7) is Range's
//! streaming form and is treated as Range.

use axum::body::Body;
use axum::response::Response;

/// etcd's words for the refusal.
pub(crate) const NOT_SUPPORTED: &str = "etcdserver: rpc not supported for learner";

/// Whether a learner serves the gRPC method at `path`.
pub(crate) fn serves(path: &str) -> bool {
    matches!(
        path,
        "/etcdserverpb.Maintenance/Status"
            | "/etcdserverpb.Maintenance/Snapshot"
            | "/etcdserverpb.KV/Range"
            | "/etcdserverpb.KV/RangeStream"
    )
}

/// The answer to a call a learner does not serve: a trailers-only gRPC response.
pub(crate) fn refusal() -> Response {
    tonic::Status::unavailable(NOT_SUPPORTED).into_http::<Body>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_learner_serves_status_ranges_and_snapshots_only() {
        for path in [
            "/etcdserverpb.Maintenance/Status",
            "/etcdserverpb.Maintenance/Snapshot",
            "/etcdserverpb.KV/Range",
            "/etcdserverpb.KV/RangeStream",
        ] {
            assert!(serves(path), "{path}");
        }
        for path in [
            "/etcdserverpb.KV/Put",
            "/etcdserverpb.KV/Txn",
            "/etcdserverpb.Watch/Watch",
            "/etcdserverpb.Lease/LeaseKeepAlive",
            "/etcdserverpb.Lease/LeaseGrant",
            "/etcdserverpb.Cluster/MemberList",
            "/etcdserverpb.Maintenance/HashKV",
            "/etcdserverpb.Maintenance/Alarm",
            "/etcdserverpb.Auth/Authenticate",
            "/grpc.health.v1.Health/Check",
        ] {
            assert!(!serves(path), "{path}");
        }
        let r = refusal();
        assert_eq!(r.headers()["grpc-status"], "14");
        // Percent-encoded, as gRPC sends messages; clients decode it.
        let message = r.headers()["grpc-message"].to_str().expect("ASCII");
        assert_eq!(message.replace("%20", " "), NOT_SUPPORTED);
    }
}
