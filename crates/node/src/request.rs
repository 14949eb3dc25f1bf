//! Turning a client's command into a proposal: etcd's checks before proposing, then the binary
//! encoding a log entry carries. Shared by the engine and the simulator, so both propose exactly
//! what production proposes.

use bytes::Bytes;
use cairn_kv::validate::{check_put, check_txn};
use cairn_kv::{Command, KvError};

use crate::error::EngineError;
use crate::ids::RequestId;

/// The limits a request must fit.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest encoded request (etcd's `--max-request-bytes`).
    pub max_request_bytes: usize,
    /// Most operations in a transaction branch (etcd's `--max-txn-ops`).
    pub max_txn_ops: usize,
}

/// Checks `cmd` as etcd does before proposing it and encodes it under `id`. A refusal here is
/// certain: nothing was proposed.
pub fn prepare(id: RequestId, cmd: &Command, limits: Limits) -> Result<Bytes, EngineError> {
    check(cmd, limits)?;
    let data = crate::command::encode(id.0, cmd);
    if data.len() > limits.max_request_bytes {
        return Err(EngineError::RequestTooLarge);
    }
    Ok(data)
}

/// etcd's checks of a command before it is proposed.
fn check(cmd: &Command, limits: Limits) -> Result<(), EngineError> {
    match cmd {
        Command::Put(p) => check_put(p)?,
        Command::DeleteRange(d) if d.key.is_empty() => return Err(KvError::EmptyKey.into()),
        Command::Txn(t) => check_txn(t, limits.max_txn_ops)?,
        Command::LeaseGrant { ttl, .. } if *ttl > cairn_kv::MAX_LEASE_TTL => {
            return Err(KvError::LeaseTtlTooLarge.into())
        }
        Command::DeleteRange(_)
        | Command::Compact(_)
        | Command::PublishMember { .. }
        | Command::Membership { .. }
        | Command::LeaseGrant { .. }
        | Command::LeaseRevoke { .. }
        | Command::LeaseExpire { .. }
        | Command::LeaseCheckpoint { .. }
        | Command::LeaseGrantCheckpoint { .. }
        | Command::AlarmActivate(_)
        | Command::AlarmDeactivate(_)
        | Command::Auth(_) => {}
        Command::Authorized { command, .. } => return check(command, limits),
    }
    Ok(())
}
