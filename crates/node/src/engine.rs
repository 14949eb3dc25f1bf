//! The engine's public face: opening a data directory and the KV operations.

mod auth;
mod lease;
mod maintenance;
mod members;
mod range;

pub use lease::{KeepAlive, LeaseConfirmed, LeaseRound, LeaseTimeToLive};
pub(crate) use members::list as member_list;
pub use members::{added_member_id, Member};
pub use range::RangePlan;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use cairn_kv::{
    Command, CommandResponse, CompactRequest, CompactResponse, DeleteRangeRequest,
    DeleteRangeResponse, MemberAttributes, PutRequest, PutResponse, RangeRequest, Store,
    TxnRequest, TxnResponse,
};
use cairn_raft::{ConfState, NodeId};
use cairn_storage::fs::OsDir;
use cairn_storage::lmdb::{LmdbBackend, LmdbView};
use cairn_storage::WalOptions;
use tokio::sync::oneshot;

use crate::backup::BackupStream;
use crate::cluster::ClusterState;
use crate::config::{EngineConfig, ReplicaConfig};
use crate::driver::{Driver, EngineReplica, Input, InputTx};
use crate::error::{EngineError, OpenError, StopCause};
use crate::identity::{self, io_err};
use crate::ids::RequestIds;
use crate::metrics::EngineMetrics;
use crate::replica::{Bootstrap, Replica, Reply};
use crate::request::{prepare, Limits};
use crate::shared::{Shared, Status};
use crate::watch::{LeadershipWatch, Watch, WatchStream};

/// An embedded cairn: open it on a data directory and call it from async code.
///
/// The engine runs on threads of its own (the Raft driver, the store's committer, and for a
/// cluster the peer transport's), so its futures need no particular async runtime: they wait
/// on channels that those threads answer. Share it between tasks behind an `Arc`. Dropping it
/// stops it ([`Engine::stop`]).
#[derive(Debug)]
pub struct Engine {
    tx: InputTx,
    shared: Arc<Shared>,
    /// Where keepalives are taken without the driver.
    lease_clock: Arc<crate::lease_clock::LeaseClock>,
    driver: Mutex<Option<JoinHandle<()>>>,
    ids: RequestIds,
    /// The simple auth tokens this member issued.
    tokens: auth::Tokens,
    /// How a lone request waits for its answer (`spin.rs`).
    spin: crate::spin::AnswerSpin,
    cfg: EngineConfig,
    _lock: crate::datadir::DirLock,
}

fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_micros() as u64)
}

/// How the replica starts on a data directory that has no log yet.
fn bootstrap(cfg: &EngineConfig, id: u64) -> Bootstrap {
    match &cfg.cluster {
        None => Bootstrap::Founding(ConfState::with_voters([NodeId(id)])),
        Some(c) if c.state == ClusterState::New => {
            Bootstrap::Founding(ConfState::with_voters(c.members.iter().map(|m| NodeId(m.id))))
        }
        // A member joining a running cluster learns the membership from its leader.
        Some(_) => Bootstrap::Joining,
    }
}

/// What an operator checks first after a start: which directory and member this is.
fn log_identity(cfg: &EngineConfig, id: u64, cluster_id: u64) {
    tracing::info!("data directory {}", cfg.data_dir.display());
    tracing::info!("member {id:016x} named {:?} in cluster {cluster_id:016x}", cfg.name);
}

/// And what the restart recovered: the committed log entries applied again on top of the
/// database, and where the store stands after them.
fn log_recovery(shared: &Shared, replayed: u64, started: Instant) {
    tracing::info!(
        "recovered in {} ms: {replayed} committed log entries replayed onto the database, \
         revision {}, compact revision {}",
        started.elapsed().as_millis(),
        shared.store.current_revision(),
        shared.store.compacted_revision(),
    );
}

/// A store ahead of the log: a crash between installing a snapshot's image and logging it, or
/// a repair that cut entries. A member of a cluster gets the missing entries from its leader and
/// skips what the store holds; a single member has no one to get them from, and would reuse
/// indexes the store already applied.
fn log_covers_store(
    cfg: &EngineConfig,
    applied: u64,
    log_end: cairn_raft::LogIndex,
) -> Result<(), EngineError> {
    if cfg.cluster.is_none() && applied > log_end.0 {
        return Err(EngineError::Open(OpenError::LogBehindStore { applied, log_end }));
    }
    Ok(())
}

/// Names the log's files in `e` by their paths under `wal`, so an operator can find the damage.
fn wal_paths(e: OpenError, wal: &Path) -> OpenError {
    match e {
        OpenError::Wal(w) => match Arc::try_unwrap(w) {
            Ok(w) => OpenError::Wal(Arc::new(w.in_dir(wal))),
            Err(w) => OpenError::Wal(w),
        },
        e => e,
    }
}

/// The peer transport of a member of a cluster, receiving snapshots into `member/snap`.
fn start_peers(
    cfg: &EngineConfig,
    member: &Path,
    tx: InputTx,
    shared: &Arc<Shared>,
    images: Arc<cairn_transport::OutgoingImages>,
) -> Result<Option<cairn_transport::Transport>, EngineError> {
    let Some(c) = &cfg.cluster else { return Ok(None) };
    let send_rate = cfg.snapshot_send_rate;
    let snap = crate::peers::Snapshots { dir: member.join("snap"), images, send_rate };
    Ok(Some(crate::peers::start(c, &cfg.name, tx, shared.clone(), snap)?))
}

/// The log's sync thread, unless the log syncs inline.
fn spawn_syncer(
    cfg: &EngineConfig,
    tx: &crate::driver::InputTx,
) -> Result<Option<crate::log_syncer::LogSyncer>, EngineError> {
    match cfg.log_sync {
        crate::LogSync::Inline => Ok(None),
        mode => crate::log_syncer::LogSyncer::spawn(&cfg.name, mode, tx.clone())
            .map(Some)
            .map_err(|e| EngineError::Open(OpenError::Spawn(Arc::new(e)))),
    }
}

type Images<'a> = (&'a Arc<Store<LmdbBackend>>, &'a Arc<cairn_transport::OutgoingImages>);

fn replica_config(
    cfg: &EngineConfig,
    id: u64,
    metrics: Arc<EngineMetrics>,
    (store, images): Images<'_>,
) -> ReplicaConfig {
    let mut raft = cairn_raft::Config::new(NodeId(id));
    raft.election_timeout_ticks = cfg.election_ticks;
    raft.heartbeat_interval_ticks = cfg.heartbeat_ticks;
    raft.seed = id;
    raft.read_mode = cfg.read_mode;
    raft.async_storage_writes = cfg.log_sync != crate::LogSync::Inline;
    let mut rc = ReplicaConfig::new(raft);
    rc.request_timeout_ticks = cfg.request_timeout_ticks();
    rc.snapshot_entries = cfg.snapshot_entries;
    rc.snapshot_catchup_entries = cfg.snapshot_catchup_entries;
    rc.snapshot_catchup_max = cfg.snapshot_catchup_max;
    rc.snapshot_catchup_max_bytes = cfg.snapshot_catchup_max_bytes;
    // A single member has no one to tell: its log stays as it always was.
    if cfg.cluster.is_some() {
        rc.publish = Some(MemberAttributes {
            name: cfg.name.clone(),
            client_urls: cfg.advertise_client_urls.clone(),
            ..Default::default()
        });
    }
    rc.tick_micros = u64::try_from(cfg.tick_interval.as_micros()).unwrap_or(u64::MAX).max(1);
    rc.lease_revoke_rate = cfg.lease_revoke_rate;
    rc.metrics = Some(metrics);
    rc.max_learners = cfg.max_learners;
    rc.auto_promote =
        cfg.auto_promote_learners.then(|| crate::AutoPromote::new(rc.raft.election_timeout_ticks));
    if cfg.cluster.is_some() {
        rc.images = Some(crate::ImageMaker::new(store.clone(), images.clone()));
    }
    if let Some(c) = &cfg.cluster {
        rc.founding_peers = c.members.iter().map(|m| (m.id, m.peer_urls.clone())).collect();
    }
    #[cfg(feature = "planted-bugs")]
    {
        rc.planted_bug = cfg.planted_bug;
    }
    rc
}

impl Engine {
    /// Opens (or creates) the engine's data directory, replays the log, and starts the driver
    /// thread. A new directory founds a single-member cluster, which elects itself before this
    /// returns.
    ///
    /// This blocks the calling thread until every entry committed before a restart is applied
    /// again, which takes longer the more entries the log holds since its last compaction (up
    /// to about [`EngineConfig::snapshot_entries`]). In async code,
    /// call it before the runtime starts or through the runtime's way to block (tokio's
    /// `spawn_blocking` or `block_in_place`). It fails with [`EngineError::Open`] when the
    /// directory is unusable or another engine holds it.
    pub fn open(mut cfg: EngineConfig) -> Result<Engine, EngineError> {
        let started = Instant::now();
        let member = cfg.data_dir.join("member");
        // The data directory first: tightening it also hides whatever an older version left
        // readable inside.
        crate::datadir::create_private(&cfg.data_dir)?;
        crate::datadir::create_private(&member)?;
        let lock = crate::datadir::lock(&cfg.data_dir, &member)?;
        crate::join::resolve_config(&mut cfg, &member)?;
        let identity = identity::open(&member, &cfg.name, cfg.cluster.as_ref(), now_micros())?;
        let (id, cluster_id) = (identity.member_id, identity.cluster_id);
        log_identity(&cfg, id, cluster_id);
        let store = open_store(&member, &cfg)?;
        let wal_path = member.join("wal");
        let wal_dir = OsDir::create(&wal_path).map_err(io_err("create", &wal_path))?;
        let wal_opts = WalOptions { segment_bytes: cfg.wal_segment_bytes };
        let stored_index = store.applied_index();
        let metrics = Arc::new(EngineMetrics::default());
        let images = Arc::new(cairn_transport::OutgoingImages::default());
        let replica: EngineReplica = Replica::open_with(
            replica_config(&cfg, id, metrics.clone(), (&store, &images)),
            crate::metrics::TimedDir::new(wal_dir, metrics.clone()),
            wal_opts,
            store.clone(),
            bootstrap(&cfg, id),
            now_micros(),
        )
        .map_err(|e| EngineError::Open(wal_paths(e, &wal_path)))?;
        log_covers_store(&cfg, store.applied_index(), replica.raft().last_index())?;
        // Committed entries the database does not have yet: `driver.start` applies them.
        let replay = replica.raft().commit_index().0.saturating_sub(stored_index);
        let lease_clock = replica.lease_clock();
        let (shared, notify) = Shared::new(store.clone(), id, cluster_id, metrics.clone());
        let shared = Arc::new(shared);
        let (tx, rx, poll) = crate::driver::channel()
            .map_err(|e| EngineError::Open(OpenError::Spawn(Arc::new(e))))?;
        let reports = tx.clone();
        let committer = crate::committer::spawn(&cfg.name, store, metrics.clone(), move |r| {
            reports.send(Input::Committer(r)).is_ok()
        })
        .map_err(|e| EngineError::Open(OpenError::Spawn(Arc::new(e))))?;
        let transport = start_peers(&cfg, &member, tx.clone(), &shared, images)?;
        let syncer = spawn_syncer(&cfg, &tx)?;
        let mut driver = Driver::new(
            replica,
            (committer, syncer),
            shared.clone(),
            (rx, poll),
            (cfg.tick_interval, cfg.spin_wait),
            transport,
            notify,
        );
        driver.start().map_err(|e| EngineError::Open(OpenError::Replay(e)))?;
        log_recovery(&shared, replay, started);
        let handle = std::thread::Builder::new()
            .name(format!("cairn-raft-{}", cfg.name))
            .spawn(move || driver.run())
            .map_err(|e| EngineError::Open(OpenError::Spawn(Arc::new(e))))?;
        Ok(Engine {
            tx,
            shared,
            lease_clock,
            driver: Mutex::new(Some(handle)),
            ids: RequestIds::new(id, now_micros()),
            tokens: auth::Tokens::default(),
            spin: crate::spin::AnswerSpin::new(cfg.spin_wait),
            cfg,
            _lock: lock,
        })
    }

    /// The member's state, as `Maintenance.Status` reports it.
    pub fn status(&self) -> Status {
        let mut s = self.shared.status.lock().unwrap_or_else(|e| e.into_inner()).clone();
        s.revision = self.shared.store.current_revision();
        s.compact_revision = self.shared.store.compacted_revision();
        s.db_size_bytes = self.shared.store.size_bytes();
        s.db_size_in_use_bytes = self.shared.store.size_in_use_bytes();
        s.key_count = self.shared.store.key_count() as u64;
        s
    }

    /// What the engine counts (leader changes, proposals, fsync and commit latencies), for a
    /// server to export; reading it takes no lock.
    pub fn metrics(&self) -> &EngineMetrics {
        &self.shared.metrics
    }

    /// Leases granted and not yet revoked or expired.
    pub fn lease_count(&self) -> usize {
        self.shared.store.lease_count()
    }

    /// The store's revision, as reads see it: cheaper than [`Engine::status`] (which also asks
    /// the database for its size), for response headers.
    pub fn revision(&self) -> cairn_kv::Revision {
        self.shared.store.current_revision()
    }

    /// (cluster id, member id), for response headers.
    pub fn identity(&self) -> (u64, u64) {
        (self.shared.cluster_id, self.shared.member_id)
    }

    /// The Raft term this member is in.
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

    /// The configuration the engine was opened with.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Every member's attributes as published through the log and applied here, by member id;
    /// a member that has not published yet is missing. A single member publishes nothing.
    pub fn members(&self) -> BTreeMap<u64, MemberAttributes> {
        self.shared.store.members()
    }

    /// etcd's MoveLeader: asks this member, which must lead, to hand leadership to `target`;
    /// returns once `target` leads.
    pub async fn move_leader(&self, target: u64) -> Result<(), EngineError> {
        match self.ask(|reply| Input::MoveLeader { target, reply }).await? {
            Reply::LeaderMoved => Ok(()),
            _ => Err(EngineError::Internal("a leader move answered as something else")),
        }
    }

    /// Before a graceful stop: a leader hands leadership to the most up-to-date voter (as etcd
    /// does on SIGTERM), so the cluster need not wait out an election timeout without one.
    /// Returns once another member leads, at once if this one does not lead, or with
    /// `LeaderTransferTimeout` after the request timeout.
    pub async fn hand_over_leadership(&self) -> Result<(), EngineError> {
        self.ask(|reply| Input::Handover { reply }).await.map(|_| ())
    }

    /// Stops the engine: waits for the driver thread to end. Pending and later requests fail
    /// with [`EngineError::Stopped`] ([`StopCause::Shutdown`]); what was acknowledged is in the
    /// log, which the next [`Engine::open`] replays. Idempotent; dropping the engine stops it.
    pub fn stop(&self) {
        let _ = self.tx.send(Input::Stop);
        if let Some(h) = self.driver.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = h.join();
        }
    }

    fn stopped(&self) -> EngineError {
        stopped(&self.shared)
    }

    /// A stream for many watchers, as one etcd Watch call carries (the server opens one per
    /// gRPC stream).
    pub fn watch_stream(&self) -> Result<WatchStream, EngineError> {
        if self.shared.failed.load(Ordering::SeqCst) {
            return Err(self.stopped());
        }
        Ok(WatchStream::new(self.shared.clone()))
    }

    /// Watches the keys `spec` names, from its start revision (0: from the next write), with
    /// etcd's semantics: every event once, in revision order, whole revisions at a time. A
    /// watcher whose history was compacted before it read it gets a reply with `canceled` and
    /// `compact_revision` set.
    pub fn watch(&self, spec: cairn_kv::watch::WatchSpec) -> Result<Watch, EngineError> {
        Watch::new(self.watch_stream()?, spec)
    }

    /// Who leads, at which term, as this member sees it: the current state first, then every
    /// change.
    pub fn leadership(&self) -> LeadershipWatch {
        LeadershipWatch::new(self.shared.clone())
    }

    /// Sends an input to the driver and waits for its answer.
    async fn ask(
        &self,
        input: impl FnOnce(crate::driver::Token) -> Input,
    ) -> Result<Reply, EngineError> {
        if self.shared.failed.load(Ordering::SeqCst) {
            return Err(self.stopped());
        }
        let asking = self.spin.begin();
        let (reply, mut rx) = oneshot::channel();
        self.tx.send(input(reply)).map_err(|_| self.stopped())?;
        asking.wait(&mut rx).await.ok_or_else(|| self.stopped())?
    }

    async fn propose(&self, cmd: Command) -> Result<CommandResponse, EngineError> {
        self.refuse_learner()?;
        let limits = Limits {
            max_request_bytes: self.cfg.max_request_bytes,
            max_txn_ops: self.cfg.max_txn_ops,
        };
        let id = self.ids.next_id();
        let data = prepare(id, &cmd, limits)?;
        self.check_space(&cmd, data.len()).await?;
        self.propose_prepared(id, data).await
    }

    /// Proposes a command already checked and encoded under `id`.
    async fn propose_prepared(
        &self,
        id: crate::ids::RequestId,
        data: bytes::Bytes,
    ) -> Result<CommandResponse, EngineError> {
        match self.ask(|reply| Input::Propose { id, data, reply }).await? {
            Reply::Command(resp) => Ok(resp),
            _ => Err(EngineError::Internal("a proposal answered as something else")),
        }
    }

    /// etcd's `Put`: sets a key's value, in a new revision.
    pub async fn put(&self, req: PutRequest) -> Result<PutResponse, EngineError> {
        self.put_as(None, req).await
    }

    /// etcd's `DeleteRange`: deletes a key or a range of keys, in one revision.
    pub async fn delete_range(
        &self,
        req: DeleteRangeRequest,
    ) -> Result<DeleteRangeResponse, EngineError> {
        self.delete_range_as(None, req).await
    }

    /// etcd's `Txn`: compares, then runs one branch, atomically and in one revision.
    pub async fn txn(&self, req: TxnRequest) -> Result<TxnResponse, EngineError> {
        self.txn_as(None, req).await
    }

    /// etcd's `Compact`: discards the history before a revision (reads and watches from
    /// before it fail as compacted).
    pub async fn compact(&self, req: CompactRequest) -> Result<CompactResponse, EngineError> {
        match self.propose(Command::Compact(req)).await? {
            CommandResponse::Compact(r) => Ok(r),
            _ => Err(EngineError::Internal("a compaction answered with another response")),
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

    /// etcd's `HashKV`: a hash of this member's key history up to `rev` (0: the current
    /// revision), equal on members that executed the same history. Local, as in etcd.
    pub fn hash_kv(&self, rev: cairn_kv::Revision) -> Result<cairn_kv::hash::KvHash, EngineError> {
        if self.shared.failed.load(Ordering::SeqCst) {
            return Err(self.stopped());
        }
        Ok(self.shared.store.hash_kv(rev)?)
    }

    /// The snapshot file of this member's store as it is now, made as it is read: a read view
    /// taken now, encoded piece by piece, so writes go on and memory stays small (see
    /// [`crate::backup`]). Read it on a thread that may block: each piece reads the database.
    pub fn backup(&self) -> Result<BackupStream<LmdbView>, EngineError> {
        if self.shared.failed.load(Ordering::SeqCst) {
            return Err(self.stopped());
        }
        let image = self.shared.store.image_stream().map_err(cairn_kv::KvError::from)?;
        Ok(BackupStream::new(image))
    }

    /// Waits until reads here reflect every write committed before the call. A sole voter that
    /// leads decides commitment alone and answers a write only after executing it, so its reads
    /// already reflect every answered write; any other member asks the leader for a read index
    /// (ReadIndex) and is answered once it has executed that far.
    pub async fn read_barrier(&self) -> Result<(), EngineError> {
        if self.shared.failed.load(Ordering::SeqCst) {
            return Err(self.stopped());
        }
        if self.shared.sole_voter.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.refuse_learner()?;
        match self.ask(|reply| Input::Read { reply }).await? {
            Reply::Read => Ok(()),
            _ => Err(EngineError::Internal("a read answered as something else")),
        }
    }
}

/// The error for a request to an engine that stopped, with its cause.
pub(crate) fn stopped(shared: &Shared) -> EngineError {
    match shared.failure() {
        Some(e) => EngineError::Stopped(StopCause::Storage(e)),
        None => EngineError::Stopped(StopCause::Shutdown),
    }
}

/// The store in `member/db`, its index rebuilt.
fn open_store(member: &Path, cfg: &EngineConfig) -> Result<Arc<Store<LmdbBackend>>, EngineError> {
    let open = |e| EngineError::Open(OpenError::Backend(e));
    let backend = LmdbBackend::open(&member.join("db"), cfg.map_bytes()).map_err(open)?;
    Ok(Arc::new(Store::open(backend).map_err(open)?))
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop();
    }
}
