//! The one place where cairn's errors become gRPC statuses: etcd's code and exact message, which
//! etcd clients match on (etcd's `api/v3rpc/rpctypes/error.go`).

use cairn_kv::auth::AuthError;
use cairn_kv::KvError;
use cairn_node::{EngineError, MembershipError};
use tonic::{Code, Status};

pub fn status(e: EngineError) -> Status {
    let code = match &e {
        EngineError::Kv(k) => match k {
            KvError::Compacted | KvError::FutureRev => Code::OutOfRange,
            KvError::KeyNotFound
            | KvError::EmptyKey
            | KvError::ValueProvided
            | KvError::LeaseProvided
            | KvError::InvalidSortOption
            | KvError::DuplicateKey
            | KvError::TooManyOps
            | KvError::TxnTooDeep => Code::InvalidArgument,
            KvError::LeaseNotFound => Code::NotFound,
            KvError::LeaseExist => Code::FailedPrecondition,
            KvError::LeaseTtlTooLarge => Code::OutOfRange,
            KvError::Auth(a) => auth_code(*a),
            KvError::Backend(_) => Code::DataLoss,
            KvError::Interrupted => Code::Unavailable,
            _ => Code::Internal,
        },
        EngineError::RequestTooLarge => Code::InvalidArgument,
        EngineError::NoLeader
        | EngineError::LeaderChanged
        | EngineError::Timeout
        | EngineError::TimeoutDueToLeaderFail
        | EngineError::Stopped(_) => Code::Unavailable,
        EngineError::NotLeader | EngineError::BadLeaderTransferee => Code::FailedPrecondition,
        // etcd passes errors without a gRPC mapping (its Raft library's "proposal dropped",
        // the leader transfer timeout) through as unknown errors.
        EngineError::LeaderTransfer | EngineError::LeaderTransferTimeout => Code::Unknown,
        EngineError::NoSpace => Code::ResourceExhausted,
        EngineError::Corrupt => Code::DataLoss,
        // etcd passes a failed defragmentation's error through as it is.
        EngineError::Defragment(_) => Code::Unknown,
        EngineError::Open(_) | EngineError::Internal(_) => Code::Internal,
        EngineError::Membership(m) => membership_code(*m),
        _ => Code::Internal,
    };
    Status::new(code, e.etcd_message())
}

/// etcd's gRPC code for each auth error (`api/v3rpc/rpctypes/error.go`).
fn auth_code(e: AuthError) -> Code {
    match e {
        AuthError::RootUserNotExist
        | AuthError::RootRoleNotExist
        | AuthError::UserAlreadyExist
        | AuthError::UserNotFound
        | AuthError::RoleAlreadyExist
        | AuthError::RoleNotFound
        | AuthError::RoleNotGranted
        | AuthError::PermissionNotGranted
        | AuthError::AuthNotEnabled => Code::FailedPrecondition,
        AuthError::UserEmpty
        | AuthError::RoleEmpty
        | AuthError::AuthFailed
        | AuthError::PermissionNotGiven
        | AuthError::InvalidAuthMgmt
        | AuthError::AuthOldRevision => Code::InvalidArgument,
        AuthError::PermissionDenied => Code::PermissionDenied,
        AuthError::InvalidAuthToken => Code::Unauthenticated,
    }
}

/// The codes of etcd's `ErrGRPCMember*`, `ErrGRPCLearnerNotReady`, `ErrGRPCTooManyLearners`,
/// `ErrGRPCUnhealthy` and `ErrGPRCNotSupportedForLearner`.
fn membership_code(e: MembershipError) -> Code {
    match e {
        MembershipError::IdNotFound | MembershipError::IdRemoved => Code::NotFound,
        MembershipError::BadUrls => Code::InvalidArgument,
        MembershipError::Unhealthy | MembershipError::NotSupportedForLearner => Code::Unavailable,
        MembershipError::ChangeInProgress => Code::ResourceExhausted,
        _ => Code::FailedPrecondition,
    }
}

/// etcd's answer to a stream or call made with `hasleader=true` when there is no leader.
pub fn no_leader() -> Status {
    Status::new(Code::Unavailable, "etcdserver: no leader")
}

/// etcd's `ErrGRPCStopped`, which ends long-lived streams when the server stops: clients take
/// it as a cue to resume elsewhere or later.
pub fn server_stopped() -> Status {
    status(EngineError::Stopped(cairn_node::StopCause::Shutdown))
}

/// A call cairn does not serve yet, named so an operator knows which.
pub fn not_yet(what: &str) -> Status {
    Status::unimplemented(format!("cairn does not implement {what} yet"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_corrupt_alarm_is_etcds_corrupt() {
        let s = status(EngineError::Corrupt);
        assert_eq!(s.code(), Code::DataLoss);
        assert_eq!(s.message(), "etcdserver: corrupt cluster");
    }

    #[test]
    fn a_full_quota_is_etcds_no_space() {
        let s = status(EngineError::NoSpace);
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert_eq!(s.message(), "etcdserver: mvcc: database space exceeded");
    }
}
