//! The engine's typed errors.

use std::fmt;

use cairn_kv::KvError;

/// Why an engine operation failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EngineError {
    /// The request itself was refused by etcd's rules (with etcd's message).
    Kv(KvError),
    /// The encoded request exceeds the configured maximum.
    RequestTooLarge,
    /// No leader is known, so the request cannot be ordered.
    NoLeader,
    /// The engine stopped: shut down, or a storage failure stopped it (fail-stop).
    Stopped(String),
    /// Opening failed: the data directory is unusable or in use by another process.
    Open(String),
}

impl EngineError {
    /// etcd's error description, which clients match on.
    pub fn etcd_message(&self) -> String {
        match self {
            EngineError::Kv(e) => e.etcd_message().to_string(),
            EngineError::RequestTooLarge => "etcdserver: request is too large".into(),
            EngineError::NoLeader => "etcdserver: no leader".into(),
            EngineError::Stopped(_) => "etcdserver: server stopped".into(),
            EngineError::Open(m) => m.clone(),
        }
    }
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineError::Stopped(why) => write!(f, "engine stopped: {why}"),
            EngineError::Open(why) => write!(f, "cannot open engine: {why}"),
            other => f.write_str(&other.etcd_message()),
        }
    }
}

impl std::error::Error for EngineError {}

impl From<KvError> for EngineError {
    fn from(e: KvError) -> EngineError {
        EngineError::Kv(e)
    }
}
