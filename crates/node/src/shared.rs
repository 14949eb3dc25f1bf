//! State the engine's callers and its driver thread share: the store (reads run on the caller's
//! thread) and what the driver publishes about the member.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cairn_kv::{Revision, Store};
use cairn_storage::lmdb::LmdbBackend;
use tokio::sync::watch;

use crate::error::StorageError;
use crate::metrics::EngineMetrics;
use crate::replica::Leadership;

/// What `Maintenance.Status` and the health checks report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Status {
    /// This member's id.
    pub member_id: u64,
    /// The cluster's id.
    pub cluster_id: u64,
    /// The leader's member id, if this member knows one.
    pub leader: Option<u64>,
    /// The Raft term this member is in.
    pub raft_term: u64,
    /// The last index of this member's Raft log.
    pub raft_index: u64,
    /// The last log index this member applied.
    pub raft_applied_index: u64,
    /// The store's current revision.
    pub revision: Revision,
    /// Reads below this fail as compacted; [`Revision::NEVER_COMPACTED`] (-1) until the first
    /// compaction, as in etcd.
    pub compact_revision: Revision,
    /// The database file's size.
    pub db_size_bytes: u64,
    /// Of `db_size_bytes`, the bytes holding data rather than free pages (etcd's
    /// `dbSizeInUse`): what a defragmentation would leave.
    pub db_size_in_use_bytes: u64,
    /// Keys that exist at the current revision.
    pub key_count: u64,
    /// Why the engine stopped, if storage failed.
    pub failure: Option<StorageError>,
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) store: Arc<Store<LmdbBackend>>,
    pub(crate) status: Mutex<Status>,
    /// This member is the only voter and leads: it alone decides what is committed.
    pub(crate) sole_voter: AtomicBool,
    /// Set once the engine stopped (storage failed, or it was shut down): it serves nothing more.
    pub(crate) failed: AtomicBool,
    /// Read on every response header, so kept out of the status mutex.
    pub(crate) raft_term: AtomicU64,
    /// The leader's id, 0 for none.
    pub(crate) leader: AtomicU64,
    pub(crate) member_id: u64,
    pub(crate) cluster_id: u64,
    /// The store's revision each time the driver executed more: watch streams wait on it. The
    /// driver holds the sender, so streams end when it stops.
    pub(crate) executed: watch::Receiver<Revision>,
    /// Leadership as this member sees it, for embedders.
    pub(crate) leadership: watch::Receiver<Option<Leadership>>,
    /// What the driver, the log and the committer count.
    pub(crate) metrics: Arc<EngineMetrics>,
    /// The member was removed from the cluster and stopped.
    pub(crate) removed: AtomicBool,
    /// The applied membership, as the driver last saw it change.
    pub(crate) conf: Mutex<cairn_raft::ConfState>,
    /// Peer messages waiting for the driver, bounded (`peer_inbox.rs`).
    pub(crate) peer_inbox: crate::peer_inbox::PeerInbox,
}

impl Shared {
    /// The state of a member just opened, and the driver's side of what it publishes.
    pub(crate) fn new(
        store: Arc<Store<LmdbBackend>>,
        member_id: u64,
        cluster_id: u64,
        metrics: Arc<EngineMetrics>,
    ) -> (Shared, crate::driver::Notify) {
        let (executed_tx, executed) = watch::channel(store.current_revision());
        let (leadership_tx, leadership) = watch::channel(None);
        let shared = Shared {
            store,
            status: Mutex::new(Status { member_id, cluster_id, ..Status::default() }),
            sole_voter: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            raft_term: AtomicU64::new(0),
            leader: AtomicU64::new(0),
            member_id,
            cluster_id,
            executed,
            leadership,
            metrics,
            removed: AtomicBool::new(false),
            conf: Mutex::new(cairn_raft::ConfState::default()),
            peer_inbox: crate::peer_inbox::PeerInbox::default(),
        };
        (shared, crate::driver::Notify { executed: executed_tx, leadership: leadership_tx })
    }

    /// Records why the engine stopped; every later request fails. The first failure is the
    /// cause; later ones (other threads noticing) do not replace it.
    pub(crate) fn fail(&self, why: StorageError) {
        self.failed.store(true, Ordering::SeqCst);
        self.status.lock().unwrap_or_else(|e| e.into_inner()).failure.get_or_insert(why);
    }

    pub(crate) fn failure(&self) -> Option<StorageError> {
        self.status.lock().unwrap_or_else(|e| e.into_inner()).failure.clone()
    }
}
