//! Errors of the data model. Each maps to one etcd error (message and gRPC code) in the server's
//! single mapping module; the messages here are etcd's own.

use std::fmt;

use crate::backend::BackendError;

/// Why a request failed. A failed request changes nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KvError {
    /// The requested revision is below the compaction point (OutOfRange).
    Compacted,
    /// The requested revision is beyond the current one (OutOfRange).
    FutureRev,
    /// `ignore_value` or `ignore_lease` on a key that does not exist (InvalidArgument).
    KeyNotFound,
    /// The request names no key (InvalidArgument).
    EmptyKey,
    /// A put sets `ignore_value` and also carries a value (InvalidArgument).
    ValueProvided,
    /// A put sets `ignore_lease` and also names a lease (InvalidArgument).
    LeaseProvided,
    /// A range names a sort order or target the API does not define (InvalidArgument; etcd 3.6).
    InvalidSortOption,
    /// A transaction writes one key twice (InvalidArgument).
    DuplicateKey,
    /// A transaction has more operations than allowed (InvalidArgument).
    TooManyOps,
    /// A put or a lease call names a lease that does not exist (NotFound).
    LeaseNotFound,
    /// A grant names a lease id already in use (FailedPrecondition).
    LeaseExist,
    /// A grant asks for more than [`crate::MAX_LEASE_TTL`] seconds (OutOfRange).
    LeaseTtlTooLarge,
    /// Transactions nested deeper than [`crate::validate::MAX_TXN_DEPTH`] (InvalidArgument). etcd
    /// has no such limit beyond gRPC's decoding depth; this one keeps every accepted request
    /// decodable when it is applied.
    TxnTooDeep,
    /// A snapshot replaced the store's state while a range was being read in steps
    /// (Unavailable: the client retries).
    Interrupted,
    /// The auth store refused the request or the change (etcd's auth errors).
    Auth(crate::auth::AuthError),
    /// The backend failed; the node must stop.
    Backend(BackendError),
}

impl KvError {
    /// etcd's error description, which clients match on. A backend failure has no etcd
    /// counterpart (etcd panics); clients get a fixed message, and the cause is in `Display`.
    pub fn etcd_message(&self) -> &'static str {
        match self {
            KvError::Compacted => "etcdserver: mvcc: required revision has been compacted",
            KvError::FutureRev => "etcdserver: mvcc: required revision is a future revision",
            KvError::KeyNotFound => "etcdserver: key not found",
            KvError::EmptyKey => "etcdserver: key is not provided",
            KvError::ValueProvided => "etcdserver: value is provided",
            KvError::LeaseProvided => "etcdserver: lease is provided",
            KvError::InvalidSortOption => "etcdserver: invalid sort option",
            KvError::DuplicateKey => "etcdserver: duplicate key given in txn request",
            KvError::TooManyOps => "etcdserver: too many operations in txn request",
            KvError::LeaseNotFound => "etcdserver: requested lease not found",
            KvError::LeaseExist => "etcdserver: lease already exists",
            KvError::LeaseTtlTooLarge => "etcdserver: too large lease TTL",
            KvError::TxnTooDeep => "cairn: transactions nested too deeply",
            KvError::Interrupted => "cairn: a snapshot replaced the member's data during the read",
            KvError::Auth(e) => e.etcd_message(),
            KvError::Backend(_) => "cairn: storage failure",
        }
    }
}

impl fmt::Display for KvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvError::Backend(e) => write!(f, "{}: {e}", self.etcd_message()),
            _ => f.write_str(self.etcd_message()),
        }
    }
}

/// `Display` includes the backend failure's cause, so `source` does not repeat it.
impl std::error::Error for KvError {}

impl From<crate::auth::AuthError> for KvError {
    fn from(e: crate::auth::AuthError) -> KvError {
        KvError::Auth(e)
    }
}

impl From<BackendError> for KvError {
    fn from(e: BackendError) -> KvError {
        KvError::Backend(e)
    }
}
