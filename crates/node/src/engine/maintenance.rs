//! The engine's maintenance API: alarms (raised and cleared through Raft, as etcd's), the
//! space quota that raises NOSPACE, and the checks that refuse writes while an alarm is raised.

use std::collections::BTreeSet;

use cairn_kv::{AlarmMember, AlarmType, Command, CommandResponse, RequestOp, TxnRequest};

use super::Engine;
use crate::error::EngineError;
use crate::request::{prepare, Limits};

/// Whether a transaction may put (in either branch, at any depth): etcd charges those to the
/// quota and lets read-only and delete-only ones through.
fn txn_puts(t: &TxnRequest) -> bool {
    t.success.iter().chain(&t.failure).any(|op| match op {
        RequestOp::Put(_) => true,
        RequestOp::Txn(inner) => txn_puts(inner),
        _ => false,
    })
}

/// Whether `cmd` adds data: what etcd's quota and its NOSPACE alarm refuse.
fn adds_data(cmd: &Command) -> bool {
    match cmd {
        Command::Put(_) | Command::LeaseGrant { .. } => true,
        Command::Txn(t) => txn_puts(t),
        _ => false,
    }
}

/// Whether `cmd` is one a CORRUPT alarm refuses (etcd's `applierV3Corrupt`: every KV write,
/// compaction and lease change).
fn refused_when_corrupt(cmd: &Command) -> bool {
    matches!(
        cmd,
        Command::Put(_)
            | Command::DeleteRange(_)
            | Command::Txn(_)
            | Command::Compact(_)
            | Command::LeaseGrant { .. }
            | Command::LeaseRevoke { .. }
    )
}

impl Engine {
    /// Every raised alarm, after a read barrier (so an alarm raised before the call is
    /// listed), in member then type order.
    pub async fn alarms(&self) -> Result<BTreeSet<AlarmMember>, EngineError> {
        self.read_barrier().await?;
        Ok(self.shared.store.alarms())
    }

    /// Every raised alarm as this member has applied them, without a read barrier (for
    /// Status, which etcd answers locally).
    pub fn raised_alarms(&self) -> BTreeSet<AlarmMember> {
        self.shared.store.alarms()
    }

    /// etcd's `Alarm` ACTIVATE, through Raft: answers the alarm (raised already or now), or
    /// `None` for [`AlarmType::None`], which raises nothing.
    pub async fn alarm_activate(
        &self,
        alarm: AlarmMember,
    ) -> Result<Option<AlarmMember>, EngineError> {
        self.propose_alarm(Command::AlarmActivate(alarm)).await
    }

    /// etcd's `Alarm` DEACTIVATE, through Raft: answers the alarm if it was raised, `None` if
    /// there was nothing to clear. Clearing NOSPACE while the database is still past the quota
    /// lets the next write raise it again.
    pub async fn alarm_deactivate(
        &self,
        alarm: AlarmMember,
    ) -> Result<Option<AlarmMember>, EngineError> {
        self.propose_alarm(Command::AlarmDeactivate(alarm)).await
    }

    async fn propose_alarm(&self, cmd: Command) -> Result<Option<AlarmMember>, EngineError> {
        let limits = Limits {
            max_request_bytes: self.cfg.max_request_bytes,
            max_txn_ops: self.cfg.max_txn_ops,
        };
        let id = self.ids.next_id();
        // Alarm commands add nothing and are never refused for space: no `check_space`.
        let data = prepare(id, &cmd, limits)?;
        match self.propose_prepared(id, data).await? {
            CommandResponse::Alarm(a) => Ok(a),
            _ => Err(EngineError::Internal("an alarm answered with another response")),
        }
    }

    /// etcd's checks before a write: a raised CORRUPT alarm refuses writes; a raised NOSPACE
    /// alarm refuses those that add data; and one that would take the database past
    /// `--quota-backend-bytes` raises NOSPACE for this member (through Raft, as etcd's
    /// `quotaKVServer` does) and is refused. Deletes, compaction and reads always pass, so
    /// space can be reclaimed.
    pub(super) async fn check_space(&self, cmd: &Command, bytes: usize) -> Result<(), EngineError> {
        // A client's command under auth is wrapped with its caller: judge what it does.
        let cmd = cmd.without_caller();
        let alarms = self.shared.store.alarms();
        if alarms.iter().any(|a| a.alarm == AlarmType::Corrupt) && refused_when_corrupt(cmd) {
            return Err(EngineError::Corrupt);
        }
        if !adds_data(cmd) {
            return Ok(());
        }
        if alarms.iter().any(|a| a.alarm == AlarmType::NoSpace) {
            return Err(EngineError::NoSpace);
        }
        let Some(quota) = self.cfg.quota_backend_bytes else { return Ok(()) };
        if self.shared.store.size_bytes().saturating_add(bytes as u64) < quota {
            return Ok(());
        }
        let me = AlarmMember { member: self.shared.member_id, alarm: AlarmType::NoSpace };
        // The write is refused whatever becomes of the alarm; a failure to raise it (no
        // leader, say) is retried by the next write past the quota.
        if let Err(e) = self.alarm_activate(me).await {
            tracing::warn!("raising the NOSPACE alarm failed: {e}");
        }
        Err(EngineError::NoSpace)
    }

    /// etcd's `Defragment`: returns the database's free space to the file system. Reads and
    /// writes go on meanwhile (see `cairn_storage::lmdb`'s defragmentation); returns once the
    /// smaller file is in place, or with [`EngineError::Defragment`], leaving the old one.
    pub async fn defragment(&self) -> Result<(), EngineError> {
        if self.shared.failed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(super::stopped(&self.shared));
        }
        let store = self.shared.store.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name(format!("cairn-defrag-{}", self.cfg.name))
            .spawn(move || {
                let before = store.size_bytes();
                let started = std::time::Instant::now();
                let r = store.defragment();
                if r.is_ok() {
                    tracing::info!(
                        "defragmented in {} ms: {before} bytes before, {} after",
                        started.elapsed().as_millis(),
                        store.size_bytes()
                    );
                }
                let _ = tx.send(r);
            })
            .map_err(|_| EngineError::Internal("could not start the defragmentation thread"))?;
        let r = rx.await.map_err(|_| EngineError::Internal("the defragmentation thread died"))?;
        r.map_err(EngineError::Defragment)
    }

    /// cairn's `Maintenance.Hash`: a hash of every record this member's database holds, and
    /// the revision it holds (see `Store::hash` for the definition). Local, as in etcd.
    pub fn hash(&self) -> Result<(u32, cairn_kv::Revision), EngineError> {
        if self.shared.failed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(super::stopped(&self.shared));
        }
        Ok(self.shared.store.hash().map_err(cairn_kv::KvError::from)?)
    }
}
