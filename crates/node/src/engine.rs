//! The engine's public face: opening a data directory and the KV operations.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use cairn_kv::validate::{check_put, check_txn, DEFAULT_MAX_TXN_OPS};
use cairn_kv::{
    Command, CommandResponse, CompactRequest, CompactResponse, DeleteRangeRequest,
    DeleteRangeResponse, KvError, PutRequest, PutResponse, RangeRequest, RangeResponse, Revision,
    Store, TxnRequest, TxnResponse,
};
use cairn_storage::lmdb::LmdbBackend;
use tokio::sync::oneshot;

use crate::driver::{Driver, Input};
use crate::error::EngineError;

/// How to open an engine.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Human-readable member name.
    pub name: String,
    pub data_dir: PathBuf,
    /// Length of one Raft tick.
    pub tick_interval: Duration,
    pub election_ticks: u32,
    pub heartbeat_ticks: u32,
    /// Largest encoded request accepted (etcd's `--max-request-bytes`, 1.5 MiB by default).
    pub max_request_bytes: usize,
    /// Most operations in one transaction branch (etcd's `--max-txn-ops`).
    pub max_txn_ops: usize,
    /// Address space reserved for the LMDB map; the file grows as needed up to this.
    pub lmdb_map_bytes: usize,
    /// Compact the Raft log after this many applied entries.
    pub snapshot_entries: u64,
    pub wal_segment_bytes: u64,
}

impl EngineConfig {
    pub fn new(name: &str, data_dir: impl AsRef<Path>) -> EngineConfig {
        EngineConfig {
            name: name.to_string(),
            data_dir: data_dir.as_ref().to_path_buf(),
            tick_interval: Duration::from_millis(100),
            election_ticks: 10,
            heartbeat_ticks: 1,
            max_request_bytes: 1536 * 1024,
            max_txn_ops: DEFAULT_MAX_TXN_OPS,
            lmdb_map_bytes: 8 << 30,
            snapshot_entries: 10_000,
            wal_segment_bytes: 64 << 20,
        }
    }
}

/// What `Maintenance.Status` and the health checks report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Status {
    pub member_id: u64,
    pub cluster_id: u64,
    pub leader: Option<u64>,
    pub raft_term: u64,
    pub raft_index: u64,
    pub raft_applied_index: u64,
    pub revision: Revision,
    /// Reads below this fail as compacted; [`Revision::NEVER_COMPACTED`] (-1) until the first
    /// compaction, as in etcd.
    pub compact_revision: Revision,
    pub db_size_bytes: u64,
    pub key_count: u64,
    /// Why the engine stopped, if it did.
    pub failure: Option<String>,
}

pub(crate) struct Shared {
    pub(crate) store: Store<LmdbBackend>,
    pub(crate) status: Mutex<Status>,
    /// The highest Raft index executed by the store, so visible to reads.
    pub(crate) executed: tokio::sync::watch::Sender<u64>,
    /// This member is the only voter and leads: it alone decides what is committed.
    pub(crate) sole_voter: std::sync::atomic::AtomicBool,
    /// Set once storage failed: the engine serves nothing more (fail-stop).
    pub(crate) failed: std::sync::atomic::AtomicBool,
    /// Read on every response header, so kept out of the status mutex.
    pub(crate) raft_term: AtomicU64,
    /// The leader's id, 0 for none.
    pub(crate) leader: AtomicU64,
    pub(crate) member_id: u64,
    pub(crate) cluster_id: u64,
}

impl Shared {
    /// Records why the engine stopped; every later request fails. The first failure is the
    /// cause; later ones (other threads noticing) do not replace it.
    pub(crate) fn fail(&self, why: String) {
        self.failed.store(true, Ordering::SeqCst);
        self.status.lock().unwrap_or_else(|e| e.into_inner()).failure.get_or_insert(why);
        self.executed.send_modify(|_| {});
    }
}

/// An embedded cairn: open it on a data directory and call it from async code.
#[derive(Debug)]
pub struct Engine {
    tx: mpsc::Sender<Input>,
    shared: Arc<Shared>,
    driver: Mutex<Option<JoinHandle<()>>>,
    next_request: AtomicU64,
    cfg: EngineConfig,
    _lock: File,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Shared")
    }
}

fn open_err(what: &str, path: &Path, e: impl std::fmt::Display) -> EngineError {
    EngineError::Open(format!("{what} {}: {e}", path.display()))
}

/// Reads this member's id, creating it on first start. Derived from the name and the time of
/// creation, so members of different clusters do not collide.
fn member_id(dir: &Path, name: &str) -> Result<u64, EngineError> {
    let path = dir.join("member_id");
    if let Ok(mut f) = File::open(&path) {
        let mut s = String::new();
        f.read_to_string(&mut s).map_err(|e| open_err("read", &path, e))?;
        return u64::from_str_radix(s.trim(), 16).map_err(|e| open_err("parse", &path, e));
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut id = now
        ^ name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
    id = id.max(1) & 0x7fff_ffff_ffff_ffff;
    let mut f = File::create(&path).map_err(|e| open_err("create", &path, e))?;
    writeln!(f, "{id:016x}").map_err(|e| open_err("write", &path, e))?;
    f.sync_all().map_err(|e| open_err("sync", &path, e))?;
    Ok(id)
}

/// A single-member cluster's id, derived from its member's.
fn status_cluster_id(member: u64) -> u64 {
    member.rotate_left(17) ^ 0x5bd1_e995
}

impl Engine {
    /// Opens (or creates) the engine's data directory and starts its driver thread. Returns once
    /// every entry committed before a restart is applied again.
    pub fn open(cfg: EngineConfig) -> Result<Engine, EngineError> {
        let member = cfg.data_dir.join("member");
        std::fs::create_dir_all(&member).map_err(|e| open_err("create", &member, e))?;
        let lock_path = member.join("LOCK");
        let lock = File::create(&lock_path).map_err(|e| open_err("create", &lock_path, e))?;
        lock.try_lock().map_err(|_| {
            EngineError::Open(format!(
                "data directory {} is in use by another process",
                cfg.data_dir.display()
            ))
        })?;
        let id = member_id(&member, &cfg.name)?;
        let backend = LmdbBackend::open(&member.join("db"), cfg.lmdb_map_bytes)
            .map_err(|e| EngineError::Open(e.to_string()))?;
        let store = Store::open(backend).map_err(|e| EngineError::Open(e.to_string()))?;
        let status = Status {
            member_id: id,
            cluster_id: id.rotate_left(17) ^ 0x5bd1_e995,
            ..Status::default()
        };
        let applied = store.applied_index();
        let shared = Arc::new(Shared {
            store,
            status: Mutex::new(status),
            executed: tokio::sync::watch::Sender::new(applied),
            sole_voter: std::sync::atomic::AtomicBool::new(false),
            failed: std::sync::atomic::AtomicBool::new(false),
            raft_term: AtomicU64::new(0),
            leader: AtomicU64::new(0),
            member_id: id,
            cluster_id: status_cluster_id(id),
        });
        let (tx, rx) = mpsc::channel();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let driver = Driver::open(&cfg, id, &member, shared.clone(), rx)?;
        let handle = std::thread::Builder::new()
            .name(format!("cairn-raft-{}", cfg.name))
            .spawn(move || driver.run(ready_tx))
            .map_err(|e| EngineError::Open(format!("spawn driver: {e}")))?;
        // Wait until the log is replayed and this member leads (alone, it elects itself).
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(EngineError::Open("driver exited during start".into())),
        }
        let base = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_micros() as u64)
            << 16;
        Ok(Engine {
            tx,
            shared,
            driver: Mutex::new(Some(handle)),
            next_request: AtomicU64::new(base),
            cfg,
            _lock: lock,
        })
    }

    pub fn status(&self) -> Status {
        let mut s = self.shared.status.lock().unwrap_or_else(|e| e.into_inner()).clone();
        s.revision = self.shared.store.current_revision();
        s.compact_revision = self.shared.store.compacted_revision();
        s.db_size_bytes = self.shared.store.size_bytes();
        s.key_count = self.shared.store.key_count() as u64;
        s
    }

    /// (cluster id, member id), for response headers.
    pub fn identity(&self) -> (u64, u64) {
        (self.shared.cluster_id, self.shared.member_id)
    }

    pub fn raft_term(&self) -> u64 {
        self.shared.raft_term.load(Ordering::Relaxed)
    }

    /// The leader's member id, if there is one and the engine has not stopped.
    pub fn leader(&self) -> Option<u64> {
        if self.shared.failed.load(Ordering::SeqCst) {
            return None;
        }
        Some(self.shared.leader.load(Ordering::Relaxed)).filter(|l| *l != 0)
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Stops the driver thread; pending requests fail with [`EngineError::Stopped`].
    pub fn stop(&self) {
        let _ = self.tx.send(Input::Stop);
        if let Some(h) = self.driver.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = h.join();
        }
    }

    async fn propose(&self, cmd: Command) -> Result<CommandResponse, EngineError> {
        let id = self.next_request.fetch_add(1, Ordering::Relaxed);
        let data = crate::command::encode(id, &cmd);
        if data.len() > self.cfg.max_request_bytes {
            return Err(EngineError::RequestTooLarge);
        }
        let (reply, rx) = oneshot::channel();
        self.tx.send(Input::Propose { id, data, reply }).map_err(|_| self.stopped())?;
        rx.await.map_err(|_| self.stopped())?
    }

    fn stopped(&self) -> EngineError {
        let why = self.shared.status.lock().unwrap_or_else(|e| e.into_inner()).failure.clone();
        EngineError::Stopped(why.unwrap_or_else(|| "engine stopped".into()))
    }

    pub async fn put(&self, req: PutRequest) -> Result<PutResponse, EngineError> {
        check_put(&req)?;
        match self.propose(Command::Put(req)).await? {
            CommandResponse::Put(r) => Ok(r),
            other => Err(EngineError::Stopped(format!("unexpected response {other:?}"))),
        }
    }

    pub async fn delete_range(
        &self,
        req: DeleteRangeRequest,
    ) -> Result<DeleteRangeResponse, EngineError> {
        if req.key.is_empty() {
            return Err(KvError::EmptyKey.into());
        }
        match self.propose(Command::DeleteRange(req)).await? {
            CommandResponse::DeleteRange(r) => Ok(r),
            other => Err(EngineError::Stopped(format!("unexpected response {other:?}"))),
        }
    }

    pub async fn txn(&self, req: TxnRequest) -> Result<TxnResponse, EngineError> {
        check_txn(&req, self.cfg.max_txn_ops)?;
        match self.propose(Command::Txn(req)).await? {
            CommandResponse::Txn(r) => Ok(r),
            other => Err(EngineError::Stopped(format!("unexpected response {other:?}"))),
        }
    }

    pub async fn compact(&self, req: CompactRequest) -> Result<CompactResponse, EngineError> {
        match self.propose(Command::Compact(req)).await? {
            CommandResponse::Compact(r) => Ok(r),
            other => Err(EngineError::Stopped(format!("unexpected response {other:?}"))),
        }
    }

    /// The current value of one key (a linearizable read), or `None` if it does not exist.
    pub async fn get(
        &self,
        key: impl Into<bytes::Bytes>,
    ) -> Result<Option<cairn_kv::KeyValue>, EngineError> {
        let resp = self.range(RangeRequest { key: key.into(), ..RangeRequest::default() }).await?;
        Ok(resp.kvs.into_iter().next())
    }

    /// Deletes one key; returns whether it existed.
    pub async fn delete(&self, key: impl Into<bytes::Bytes>) -> Result<bool, EngineError> {
        let resp = self
            .delete_range(DeleteRangeRequest { key: key.into(), ..DeleteRangeRequest::default() })
            .await?;
        Ok(resp.deleted > 0)
    }

    /// A read: linearizable unless `serializable` is set, in which case it reads this member's
    /// applied state without a round of Raft.
    pub async fn range(&self, req: RangeRequest) -> Result<RangeResponse, EngineError> {
        if req.key.is_empty() {
            return Err(KvError::EmptyKey.into());
        }
        if self.shared.failed.load(Ordering::SeqCst) {
            return Err(self.stopped());
        }
        if !req.serializable {
            self.read_barrier().await?;
        }
        Ok(self.shared.store.range(&req)?)
    }

    /// Waits until reads here reflect every write committed before the call. A sole voter that
    /// leads decides commitment alone and answers a write only after executing it, so its reads
    /// already reflect every answered write; any other member asks the leader for a read index
    /// (ReadIndex) and waits until it has executed that far.
    pub async fn read_barrier(&self) -> Result<(), EngineError> {
        if self.shared.sole_voter.load(Ordering::SeqCst) {
            return Ok(());
        }
        let (reply, rx) = oneshot::channel();
        self.tx.send(Input::ReadIndex { reply }).map_err(|_| self.stopped())?;
        let target = rx.await.map_err(|_| self.stopped())??;
        let mut executed = self.shared.executed.subscribe();
        executed
            .wait_for(|p| *p >= target || self.shared.failed.load(Ordering::SeqCst))
            .await
            .map_err(|_| self.stopped())?;
        if self.shared.failed.load(Ordering::SeqCst) {
            return Err(self.stopped());
        }
        Ok(())
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop();
    }
}
