//! The engine's typed errors. None carries a message string: each names what failed and wraps
//! its cause, and [`EngineError::etcd_message`] gives the text etcd clients match on.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use cairn_kv::backend::BackendError;
use cairn_kv::KvError;
use cairn_raft::LogIndex;
use cairn_storage::WalError;

use crate::command::DecodeError;

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
    /// Leadership changed while the request waited: a read must be retried; a write's outcome is
    /// unknown (etcd's `ErrLeaderChanged`).
    LeaderChanged,
    /// A leadership transfer is under way and the leader takes no proposals until it ends.
    /// etcd answers this with its Raft library's error, gRPC `Unknown` "raft proposal dropped".
    LeaderTransfer,
    /// A request only the leader serves (MoveLeader) reached a member that does not lead.
    NotLeader,
    /// MoveLeader named a member that is not a voter of the cluster.
    BadLeaderTransferee,
    /// The member MoveLeader named did not take over within the request timeout.
    LeaderTransferTimeout,
    /// No answer within the request timeout; a write's outcome is unknown (`ErrTimeout`).
    Timeout,
    /// No answer within the request timeout, and leadership changed meanwhile
    /// (`ErrTimeoutDueToLeaderFail`).
    TimeoutDueToLeaderFail,
    /// The engine stopped: shut down, or a storage failure stopped it (fail-stop).
    Stopped(StopCause),
    /// Opening failed: the data directory is unusable or in use by another process.
    Open(OpenError),
    /// A watch was refused (etcd's reason; on the wire, a `created` and `canceled` reply).
    Watch(cairn_kv::watch::group::CreateError),
    /// A reply did not match its request: a bug, reported rather than hidden.
    Internal(&'static str),
    /// The database reached `--quota-backend-bytes`, or a NOSPACE alarm is raised (etcd's
    /// `ErrNoSpace`).
    NoSpace,
    /// A CORRUPT alarm is raised: members disagree on their data, and writes are refused until
    /// an operator clears it (etcd's `ErrCorrupt`).
    Corrupt,
    /// A defragmentation failed; the database is as it was before.
    Defragment(BackendError),
    /// A membership change was refused (etcd's membership errors).
    Membership(MembershipError),
}

/// Why the Cluster API refused a membership change, as etcd refuses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MembershipError {
    /// No such member (etcd's `ErrIDNotFound`).
    IdNotFound,
    /// The member was removed (etcd's `ErrIDRemoved`; clients see "member not found").
    IdRemoved,
    /// A member with this id exists (etcd's `ErrIDExists`).
    IdExists,
    /// Another member has one of these peer URLs (etcd's `ErrPeerURLexists`).
    PeerUrlExists,
    /// Only a learner can be promoted (etcd's `ErrMemberNotLearner`).
    NotLearner,
    /// The learner's log is not within 90% of the leader's (etcd's `ErrLearnerNotReady`).
    LearnerNotReady,
    /// The cluster holds `--max-learners` learners already (etcd's `ErrTooManyLearners`).
    TooManyLearners,
    /// Too few voters are running for the change to keep a quorum (etcd's
    /// `ErrNotEnoughStartedMembers`), removing the last voter included.
    NotEnoughStarted,
    /// The leader is not connected to every voter, or removing a running voter would leave
    /// too few running ones (etcd's `ErrUnhealthy`).
    Unhealthy,
    /// The peer URLs are not URLs (etcd's `ErrGRPCMemberBadURLs`).
    BadUrls,
    /// Another membership change is still being applied; changes go one at a time.
    ChangeInProgress,
    /// A learner serves serializable reads only (etcd's `ErrGPRCNotSupportedForLearner`).
    NotSupportedForLearner,
}

impl MembershipError {
    /// etcd's message for this error, as its clients see it.
    pub fn etcd_message(&self) -> &'static str {
        match self {
            MembershipError::IdNotFound | MembershipError::IdRemoved => {
                "etcdserver: member not found"
            }
            MembershipError::IdExists => "etcdserver: member ID already exist",
            MembershipError::PeerUrlExists => "etcdserver: Peer URLs already exists",
            MembershipError::NotLearner => "etcdserver: can only promote a learner member",
            MembershipError::LearnerNotReady => {
                "etcdserver: can only promote a learner member which is in sync with leader"
            }
            MembershipError::TooManyLearners => "etcdserver: too many learner members in cluster",
            MembershipError::NotEnoughStarted => {
                "etcdserver: re-configuration failed due to not enough started members"
            }
            MembershipError::Unhealthy => "etcdserver: unhealthy cluster",
            MembershipError::BadUrls => "etcdserver: given member URLs are invalid",
            MembershipError::ChangeInProgress => "etcdserver: too many requests",
            MembershipError::NotSupportedForLearner => "etcdserver: rpc not supported for learner",
        }
    }
}

/// Why the engine stopped serving.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopCause {
    /// [`crate::Engine::stop`] was called, or the engine was dropped.
    Shutdown,
    /// The member was removed from the cluster: it may never serve again under its id.
    Removed,
    /// Storage failed; the engine stopped so that nothing acknowledged can be lost.
    Storage(StorageError),
}

/// A failure of the storage under a running engine. Any of them stops it (fail-stop).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum StorageError {
    /// The write-ahead log failed.
    Wal(Arc<WalError>),
    /// The store's backend failed.
    Backend(BackendError),
    /// A committed entry does not decode: written by a bug, or damaged past its checksum.
    Entry {
        /// The entry's log index.
        index: LogIndex,
        /// Why it does not decode.
        error: DecodeError,
    },
    /// A snapshot the core accepted could not be installed.
    Snapshot(Arc<cairn_kv::snapshot::InstallError>),
    /// The core accepted a snapshot whose image did not arrive with it, or does not match it.
    SnapshotMissing {
        /// The snapshot's log index.
        index: LogIndex,
    },
    /// The thread that commits the store is gone.
    CommitterGone,
    /// The thread that syncs the log is gone.
    SyncerGone,
    /// The leader knows this member acknowledged entries up to `commit`, but its log ends at
    /// `last`: its data was rolled back. Serving on would risk applying entries the cluster
    /// never committed.
    LogLost {
        /// The last index of this member's log.
        last: LogIndex,
        /// The index the leader knows it acknowledged.
        commit: LogIndex,
    },
}

/// Why [`crate::Engine::open`] failed.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum OpenError {
    /// A file or directory of the data directory could not be used.
    Io {
        /// What was being done ("create", "open", ...).
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The operating system's error.
        source: Arc<std::io::Error>,
    },
    /// Another engine (in this or another process) holds the data directory.
    Locked {
        /// The data directory.
        dir: PathBuf,
        /// The holder's process id, when its lock file names one.
        pid: Option<u32>,
    },
    /// The member id file does not hold a member id.
    BadMemberId {
        /// The file.
        path: PathBuf,
    },
    /// The write-ahead log could not be opened (damaged, or unreadable).
    Wal(Arc<WalError>),
    /// The store could not be opened.
    Backend(BackendError),
    /// The Raft configuration is invalid.
    Raft(cairn_raft::ConfigError),
    /// Replaying the log failed.
    Replay(StorageError),
    /// The store applied entries the log no longer holds (a repair cut them).
    LogBehindStore {
        /// The store's applied index.
        applied: u64,
        /// The last index the log holds.
        log_end: LogIndex,
    },
    /// The log was compacted past what the store holds (the database was replaced).
    StoreBehindLog {
        /// The store's applied index.
        applied: u64,
        /// The index the log is compacted to.
        compacted: LogIndex,
    },
    /// A thread could not be started.
    Spawn(Arc<std::io::Error>),
    /// The data directory belongs to another member than the flags describe.
    OtherMember {
        /// The data directory.
        dir: PathBuf,
        /// The member id it holds.
        found: u64,
        /// The member id the flags give.
        expected: u64,
    },
    /// The data directory belongs to another cluster than the flags describe.
    OtherCluster {
        /// The data directory.
        dir: PathBuf,
        /// The cluster id it holds.
        found: u64,
        /// The cluster id the flags give.
        expected: u64,
    },
    /// A peer URL cannot be used.
    PeerUrl(cairn_transport::url::UrlError),
    /// The peer certificate files cannot be used.
    PeerTls(cairn_transport::TlsError),
    /// An `https://` peer URL without `--peer-cert-file` and `--peer-key-file`.
    PeerTlsMissing {
        /// The URL.
        url: String,
        /// Whether it is one to listen on (else one to dial).
        listen: bool,
    },
    /// Joining a running cluster failed (`--initial-cluster-state existing`).
    Join(crate::cluster::JoinError),
    /// A `--listen-peer-urls` address could not be bound.
    PeerListen {
        /// The URL.
        url: String,
        /// The operating system's error.
        source: Arc<std::io::Error>,
    },
}

impl EngineError {
    /// etcd's error description, which clients match on.
    pub fn etcd_message(&self) -> String {
        match self {
            EngineError::Kv(e) => e.etcd_message().to_string(),
            EngineError::RequestTooLarge => "etcdserver: request is too large".into(),
            EngineError::NoLeader => "etcdserver: no leader".into(),
            EngineError::LeaderChanged => "etcdserver: leader changed".into(),
            EngineError::LeaderTransfer => "raft proposal dropped".into(),
            EngineError::Timeout => "etcdserver: request timed out".into(),
            EngineError::NotLeader => "etcdserver: not leader".into(),
            EngineError::BadLeaderTransferee => "etcdserver: bad leader transferee".into(),
            EngineError::LeaderTransferTimeout => {
                "etcdserver: request timed out, leader transfer took too long".into()
            }
            EngineError::TimeoutDueToLeaderFail => {
                "etcdserver: request timed out, possibly due to previous leader failure".into()
            }
            EngineError::Stopped(_) => "etcdserver: server stopped".into(),
            EngineError::Open(e) => e.to_string(),
            EngineError::Watch(e) => e.reason().into(),
            EngineError::Internal(what) => format!("cairn: internal error: {what}"),
            EngineError::NoSpace => "etcdserver: mvcc: database space exceeded".into(),
            EngineError::Corrupt => "etcdserver: corrupt cluster".into(),
            EngineError::Defragment(e) => format!("cairn: defragmentation failed: {e}"),
            EngineError::Membership(e) => e.etcd_message().into(),
        }
    }

    /// Whether a write that failed this way may still have been applied. Only errors returned
    /// before the request was proposed are certain failures.
    pub fn outcome_unknown(&self) -> bool {
        !matches!(
            self,
            EngineError::Kv(_)
                | EngineError::RequestTooLarge
                | EngineError::NoLeader
                | EngineError::LeaderTransfer
                | EngineError::Open(_)
                | EngineError::Watch(_)
                | EngineError::NoSpace
                | EngineError::Corrupt
                | EngineError::Defragment(_)
                | EngineError::Membership(_)
        )
    }
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineError::Stopped(cause) => write!(f, "engine stopped: {cause}"),
            EngineError::Open(why) => write!(f, "cannot open engine: {why}"),
            other => f.write_str(&other.etcd_message()),
        }
    }
}

impl fmt::Display for StopCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopCause::Shutdown => f.write_str("shut down"),
            StopCause::Removed => {
                f.write_str("the member has been permanently removed from the cluster")
            }
            StopCause::Storage(e) => write!(f, "storage failure: {e}"),
        }
    }
}

impl fmt::Display for StorageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StorageError::Wal(e) => write!(f, "{e}"),
            StorageError::Backend(e) => write!(f, "{e}"),
            StorageError::Entry { index, error } => write!(f, "log entry {index}: {error}"),
            StorageError::Snapshot(e) => write!(f, "installing a snapshot: {e}"),
            StorageError::SnapshotMissing { index } => {
                write!(f, "the snapshot at index {index} arrived without a matching image")
            }
            StorageError::CommitterGone => f.write_str("the store's committer stopped"),
            StorageError::SyncerGone => f.write_str("the log's sync thread stopped"),
            StorageError::LogLost { last, commit } => write!(
                f,
                "the leader knows this member acknowledged entries up to index {commit}, but its log ends at {last}: its data directory lost entries (restored from an older copy?). Stopping rather than serve it; remove the member and add it back with an empty data directory"
            ),
        }
    }
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::Io { what, path, source } => {
                write!(f, "{what} {}: {source}", path.display())
            }
            OpenError::Locked { dir, pid: Some(pid) } => write!(
                f,
                "data directory {} is in use by another process (pid {pid}); two servers on one directory would corrupt it",
                dir.display()
            ),
            OpenError::Locked { dir, pid: None } => write!(
                f,
                "data directory {} is in use by another process; two servers on one directory would corrupt it",
                dir.display()
            ),
            OpenError::BadMemberId { path } => {
                write!(f, "{} does not hold a member id", path.display())
            }
            OpenError::Wal(e) => write!(f, "{e}"),
            OpenError::Backend(e) => write!(f, "{e}"),
            OpenError::Raft(e) => write!(f, "{e}"),
            OpenError::Replay(e) => write!(f, "replaying the log: {e}"),
            OpenError::LogBehindStore { applied, log_end } => write!(
                f,
                "the database has applied the log up to index {applied}, but the log ends at {log_end}: the log lost entries (cut by `cairn wal repair`?). Remove the member and add it back with an empty data directory"
            ),
            OpenError::StoreBehindLog { applied, compacted } => write!(
                f,
                "the database has applied the log up to index {applied}, but the log holds only entries after index {compacted}: it cannot rebuild the database. Restore the database, or remove the member and add it back with an empty data directory"
            ),
            OpenError::Spawn(e) => write!(f, "starting a thread: {e}"),
            OpenError::OtherMember { dir, found, expected } => write!(
                f,
                "data directory {} belongs to member {found:x}, but the cluster flags make this member {expected:x}; use this member's own data directory, or start it with the flags it was created with",
                dir.display()
            ),
            OpenError::OtherCluster { dir, found, expected } => write!(
                f,
                "data directory {} belongs to cluster {found:x}, but the cluster flags describe cluster {expected:x} (check --initial-cluster and --initial-cluster-token)",
                dir.display()
            ),
            OpenError::PeerUrl(e) => write!(f, "{e}"),
            OpenError::PeerTls(e) => write!(f, "peer TLS: {e}"),
            // etcd's words (transport.newTLSListener, embed.configureClientListeners).
            OpenError::PeerTlsMissing { url, listen: true } => write!(
                f,
                "cannot listen on TLS for {url}: KeyFile and CertFile are not presented (--peer-cert-file, --peer-key-file)"
            ),
            OpenError::PeerTlsMissing { url, listen: false } => write!(
                f,
                "TLS key/cert (--peer-cert-file, --peer-key-file) must be provided for peer url {url} with HTTPS scheme"
            ),
            OpenError::Join(e) => write!(f, "{e}"),
            OpenError::PeerListen { url, source } => {
                write!(f, "cannot listen for peers on {url}: {source}")
            }
        }
    }
}

/// Two storage errors are the same error, not merely alike: errors wrapping an IO failure are
/// equal only if they are the same instance.
impl PartialEq for StorageError {
    fn eq(&self, other: &StorageError) -> bool {
        match (self, other) {
            (StorageError::Wal(a), StorageError::Wal(b)) => Arc::ptr_eq(a, b),
            (StorageError::Backend(a), StorageError::Backend(b)) => a == b,
            (
                StorageError::Entry { index: a, error: x },
                StorageError::Entry { index: b, error: y },
            ) => a == b && x == y,
            (StorageError::Snapshot(a), StorageError::Snapshot(b)) => Arc::ptr_eq(a, b),
            (
                StorageError::SnapshotMissing { index: a },
                StorageError::SnapshotMissing { index: b },
            ) => a == b,
            (StorageError::CommitterGone, StorageError::CommitterGone) => true,
            (StorageError::SyncerGone, StorageError::SyncerGone) => true,
            _ => false,
        }
    }
}

impl Eq for StorageError {}

/// As for [`StorageError`]: IO failures compare by instance.
impl PartialEq for OpenError {
    fn eq(&self, other: &OpenError) -> bool {
        match (self, other) {
            (OpenError::Io { source: a, .. }, OpenError::Io { source: b, .. }) => Arc::ptr_eq(a, b),
            (OpenError::Locked { dir: a, pid: p }, OpenError::Locked { dir: b, pid: q }) => {
                a == b && p == q
            }
            (OpenError::BadMemberId { path: a }, OpenError::BadMemberId { path: b }) => a == b,
            (OpenError::Wal(a), OpenError::Wal(b)) => Arc::ptr_eq(a, b),
            (OpenError::Backend(a), OpenError::Backend(b)) => a == b,
            (OpenError::Raft(a), OpenError::Raft(b)) => a == b,
            (OpenError::Replay(a), OpenError::Replay(b)) => a == b,
            (
                OpenError::LogBehindStore { applied: a, log_end: x },
                OpenError::LogBehindStore { applied: b, log_end: y },
            ) => a == b && x == y,
            (
                OpenError::StoreBehindLog { applied: a, compacted: x },
                OpenError::StoreBehindLog { applied: b, compacted: y },
            ) => a == b && x == y,
            (OpenError::Spawn(a), OpenError::Spawn(b)) => Arc::ptr_eq(a, b),
            (
                OpenError::OtherMember { dir: a, found: x, expected: y },
                OpenError::OtherMember { dir: b, found: z, expected: w },
            )
            | (
                OpenError::OtherCluster { dir: a, found: x, expected: y },
                OpenError::OtherCluster { dir: b, found: z, expected: w },
            ) => a == b && x == z && y == w,
            (OpenError::PeerUrl(a), OpenError::PeerUrl(b)) => a == b,
            (OpenError::PeerTls(a), OpenError::PeerTls(b)) => a.to_string() == b.to_string(),
            (
                OpenError::PeerTlsMissing { url: a, listen: x },
                OpenError::PeerTlsMissing { url: b, listen: y },
            ) => a == b && x == y,
            (OpenError::Join(a), OpenError::Join(b)) => a == b,
            (OpenError::PeerListen { source: a, .. }, OpenError::PeerListen { source: b, .. }) => {
                Arc::ptr_eq(a, b)
            }
            _ => false,
        }
    }
}

impl Eq for OpenError {}

impl std::error::Error for EngineError {}
impl std::error::Error for StorageError {}
impl std::error::Error for OpenError {}

impl From<KvError> for EngineError {
    fn from(e: KvError) -> EngineError {
        EngineError::Kv(e)
    }
}

impl From<WalError> for StorageError {
    fn from(e: WalError) -> StorageError {
        StorageError::Wal(Arc::new(e))
    }
}

impl From<BackendError> for StorageError {
    fn from(e: BackendError) -> StorageError {
        StorageError::Backend(e)
    }
}

impl From<StorageError> for EngineError {
    fn from(e: StorageError) -> EngineError {
        EngineError::Stopped(StopCause::Storage(e))
    }
}
