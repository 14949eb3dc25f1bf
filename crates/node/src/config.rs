//! How to open an engine, and how a replica behaves. Shared by the engine, the driver thread and
//! the simulator, so none of them imports another for it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use cairn_kv::validate::DEFAULT_MAX_TXN_OPS;
use cairn_kv::MemberAttributes;

pub use cairn_raft::ReadMode;

use crate::cluster::ClusterConfig;

/// etcd's `DefaultSnapshotCatchUpEntries`: entries kept behind every compaction of the log.
pub const DEFAULT_SNAPSHOT_CATCHUP_ENTRIES: u64 = 5_000;

/// Entries a leader keeps at most for followers catching up, beyond the margin: a guard on the
/// count, while [`DEFAULT_SNAPSHOT_CATCHUP_MAX_BYTES`] bounds what they cost. With 100,000 (the
/// first choice), a learner joining at 50 MB/s (`--snapshot-send-rate`) under 19,000 writes a
/// second needed a second snapshot (its 410 MB image took 5 s to send); with 500,000, one
/// joining a 1 GB store so (25 s to send, 8 s to install, some 510,000 entries) did.
pub const DEFAULT_SNAPSHOT_CATCHUP_MAX: u64 = 2_000_000;

/// The most the leader's log may hold in memory (its entries' bytes, as the core counts them)
/// while it keeps entries for followers catching up: past it, compaction goes on as if no
/// follower needed them, and a follower that did gets another snapshot. The log's bytes with
/// no follower behind are bounded by counts alone (`--snapshot-count` plus the margin); this
/// bounds what a slow follower adds, whatever the entries' sizes.
pub const DEFAULT_SNAPSHOT_CATCHUP_MAX_BYTES: u64 = 256 << 20;

/// How to open an [`crate::Engine`].
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Human-readable member name.
    pub name: String,
    /// Where the member keeps its write-ahead log and database (`member/` under it), created
    /// if missing. One engine at a time may use it: [`crate::Engine::open`] locks it.
    pub data_dir: PathBuf,
    /// Length of one Raft tick (etcd's `--heartbeat-interval`). Default 100 ms.
    pub tick_interval: Duration,
    /// Ticks without a leader before an election (etcd's `--election-timeout` divided by the
    /// tick). Default 10.
    pub election_ticks: u32,
    /// Ticks between a leader's heartbeats. Default 1.
    pub heartbeat_ticks: u32,
    /// How long a request may wait for its answer before it fails with a timeout. Default 7 s:
    /// etcd's 5 s plus two election timeouts.
    pub request_timeout: Duration,
    /// Largest encoded request accepted (etcd's `--max-request-bytes`, 1.5 MiB by default).
    pub max_request_bytes: usize,
    /// Most operations in one transaction branch (etcd's `--max-txn-ops`, 128 by default).
    pub max_txn_ops: usize,
    /// Address space reserved for the LMDB map; the file grows as needed up to this. Default
    /// 8 GiB.
    pub lmdb_map_bytes: usize,
    /// etcd's `--quota-backend-bytes`: once the database file reaches it, writes that add data
    /// (puts, transactions with puts, lease grants) fail with "database space exceeded" while
    /// reads, deletes and compaction keep working. The LMDB map is sized above it with room to
    /// spare, so the map never fills first. `None` (the default): no quota.
    pub quota_backend_bytes: Option<u64>,
    /// Compact the Raft log after this many applied entries (etcd's `--snapshot-count`). Default
    /// 10,000.
    pub snapshot_entries: u64,
    /// Entries the log keeps behind every compaction point (etcd's `--snapshot-catchup-entries`,
    /// 5,000 by default, as etcd), so that a follower a little behind, or one that has just
    /// installed a snapshot, catches up from the log instead of needing a snapshot. The log then
    /// holds between this many and this many plus [`EngineConfig::snapshot_entries`] entries.
    pub snapshot_catchup_entries: u64,
    /// Entries a leader keeps at most, beyond [`EngineConfig::snapshot_catchup_entries`], for
    /// followers that are catching up: one receiving or installing a snapshot, or behind and
    /// answering (cairn's own; etcd instead skips compaction while a snapshot is in flight and
    /// for 30 s after). The bound is what one slow follower may cost the leader's memory and
    /// disk; a follower that needs more gets another snapshot. 0 keeps nothing for them.
    /// Default 2,000,000 ([`DEFAULT_SNAPSHOT_CATCHUP_MAX`]).
    pub snapshot_catchup_max: u64,
    /// The most the leader's log may hold in memory while it keeps entries for followers
    /// catching up; default 256 MiB ([`DEFAULT_SNAPSHOT_CATCHUP_MAX_BYTES`]).
    pub snapshot_catchup_max_bytes: u64,
    /// Size of one write-ahead log segment file. Default 64 MiB.
    pub wal_segment_bytes: u64,
    /// How the log is made durable ([`LogSync`]). Default [`LogSync::Auto`].
    pub log_sync: LogSync,
    /// The longest the driver, after a turn that had work, and a lone request's caller wait
    /// awake for their next event before they sleep (`spin.rs`): a sleeping thread must be
    /// woken, which costs 40-110 µs on a machine whose idle cores halt. A wait yields the core
    /// to any thread that wants it, and is skipped while most recent waits did not catch their
    /// event within this bound. The time shows as the member's CPU use: under a CPU quota (a
    /// container's CPU limit) it counts against the quota, and zero is the better choice
    /// there (`cairn serve` picks it by itself). Zero: threads always sleep. Default 500 µs
    /// (cairn's own).
    pub spin_wait: Duration,
    /// The cluster this member belongs to, from etcd's cluster flags. `None` (the default)
    /// runs a single member that needs no flags.
    pub cluster: Option<ClusterConfig>,
    /// The URLs clients reach this member at (etcd's `--advertise-client-urls`). A member of a
    /// cluster publishes them, with its name, through the log (etcd's publish), so that every
    /// member's `MemberList` shows them; a single member publishes nothing. Default: none.
    pub advertise_client_urls: Vec<String>,
    /// How linearizable reads are confirmed: ReadIndex (the default, etcd's only mode) costs a
    /// heartbeat round per batch; a lease answers from the leader at once, and is safe only
    /// while clocks drift, and processes stall, by less than the lease margin.
    pub read_mode: ReadMode,
    /// Expired leases revoked per second at most, so a storm of expiries never starves
    /// writes. Default 1,000 (etcd's fixed rate).
    pub lease_revoke_rate: u64,
    /// bcrypt's cost for the passwords this member hashes (etcd's `--bcrypt-cost`, 4 to 31).
    /// Default 10, etcd's.
    pub bcrypt_cost: u32,
    /// How long a simple auth token lives unused (etcd's `--auth-token-ttl`). Default 300 s.
    pub auth_token_ttl: Duration,
    /// Learners the cluster may hold at once (etcd's `--max-learners`). Default 1.
    pub max_learners: usize,
    /// A leader promotes a learner by itself once it has caught up ([`AutoPromote::new`]'s
    /// policy), as etcd users have asked for (etcd issues 15107, 21611). Default false: etcd
    /// leaves promotion to the operator's MemberPromote.
    pub auto_promote_learners: bool,
    /// Bytes a second one snapshot transfer to a follower sends at most
    /// (`--snapshot-send-rate`). Default 0: unlimited, as etcd, which has no such limit. A
    /// transfer runs on its own connection and task, so it never holds up the leader's
    /// appends and heartbeats; a limit is for a link shared with other traffic, and one too
    /// low makes a large store's transfer outlast the log it must catch up from.
    pub snapshot_send_rate: u64,
    /// A deliberate bug, for fault tests that must prove they catch it.
    #[cfg(feature = "planted-bugs")]
    pub planted_bug: Option<ReplicaBug>,
}

/// How the driver makes the write-ahead log durable. Every mode is equally durable: nothing
/// is acknowledged, counted toward commit or applied before its fsync.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogSync {
    /// Each batch is written and fsynced on the driver's thread before it goes on.
    Inline,
    /// Batches are written on the driver's thread and fsynced on a thread of their own, while
    /// the driver goes on taking, sending, applying and writing (etcd raft's asynchronous
    /// storage writes). Acknowledgements wait for the sync; a leader counts its own copy, and
    /// every member applies entries, only once durable.
    Async,
    /// [`LogSync::Inline`] while the log's fsyncs are fast, [`LogSync::Async`] once they
    /// average 500 µs or more (back under 300 µs) while writes or requests share them: the
    /// thread's hand-offs cost more than a short fsync's stall, and much less than a long one's
    /// for those waiting behind it. A lone writer stays inline (`log_syncer::AutoPolicy`).
    Auto,
}

impl EngineConfig {
    /// The LMDB map size: [`EngineConfig::lmdb_map_bytes`], raised to twice the quota (and the
    /// quota plus 1 GiB) when one is set. The map is address space, not memory; its headroom
    /// above the quota lets writes already admitted, deletes and compaction (which copy pages
    /// before freeing them) finish past the quota.
    pub fn map_bytes(&self) -> usize {
        let Some(quota) = self.quota_backend_bytes else { return self.lmdb_map_bytes };
        let room = quota.saturating_mul(2).max(quota.saturating_add(1 << 30));
        self.lmdb_map_bytes.max(usize::try_from(room).unwrap_or(usize::MAX))
    }

    /// A single member named `name` with its data in `data_dir`, and every other field at its
    /// default (etcd's, where etcd has the setting).
    pub fn new(name: &str, data_dir: impl AsRef<Path>) -> EngineConfig {
        EngineConfig {
            name: name.to_string(),
            data_dir: data_dir.as_ref().to_path_buf(),
            tick_interval: Duration::from_millis(100),
            election_ticks: 10,
            heartbeat_ticks: 1,
            request_timeout: Duration::from_secs(7),
            max_request_bytes: 1536 * 1024,
            max_txn_ops: DEFAULT_MAX_TXN_OPS,
            lmdb_map_bytes: 8 << 30,
            quota_backend_bytes: None,
            snapshot_entries: 10_000,
            snapshot_catchup_entries: DEFAULT_SNAPSHOT_CATCHUP_ENTRIES,
            snapshot_catchup_max: DEFAULT_SNAPSHOT_CATCHUP_MAX,
            snapshot_catchup_max_bytes: DEFAULT_SNAPSHOT_CATCHUP_MAX_BYTES,
            wal_segment_bytes: 64 << 20,
            log_sync: LogSync::Auto,
            spin_wait: Duration::from_micros(500),
            read_mode: ReadMode::Safe,
            cluster: None,
            advertise_client_urls: Vec::new(),
            lease_revoke_rate: 1000,
            bcrypt_cost: 10,
            auth_token_ttl: Duration::from_secs(300),
            max_learners: 1,
            auto_promote_learners: false,
            snapshot_send_rate: 0,
            #[cfg(feature = "planted-bugs")]
            planted_bug: None,
        }
    }

    /// The request timeout in ticks (at least one).
    pub(crate) fn request_timeout_ticks(&self) -> u64 {
        let tick = self.tick_interval.as_micros().max(1);
        (self.request_timeout.as_micros().div_ceil(tick) as u64).max(1)
    }
}

/// The shortest TTL a lease gets, in seconds, with ticks of `tick_micros` and an election
/// timeout of `election_ticks`: one and a half election timeouts, rounded up (etcd's `minTTL`),
/// so a lease outlives a leader change.
pub fn min_lease_ttl(tick_micros: u64, election_ticks: u32) -> i64 {
    let micros = u128::from(tick_micros) * u128::from(election_ticks) * 3 / 2;
    i64::try_from(micros.div_ceil(1_000_000)).unwrap_or(i64::MAX).max(1)
}

/// A deliberate bug in the replica, compiled in only with the `planted-bugs` feature, so the
/// whole-stack simulator can prove that its checkers catch what it claims to catch.
#[cfg(feature = "planted-bugs")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplicaBug {
    /// Skip the WAL's fsync: writes are acknowledged before they are durable.
    AckBeforeFsync,
    /// Serve a linearizable read from local state at once, without ReadIndex.
    ReadWithoutIndex,
    /// Send the core's snapshot without the store's state, and install what arrives as an empty
    /// store (the behaviour before snapshots carried the store).
    EmptySnapshot,
    /// The leader's lease clock expires leases at half their TTL.
    LeaseExpiresEarly,
    /// The leader's lease clock never revokes an expired lease.
    LeaseNeverExpires,
}

/// When a leader promotes a learner by itself (`--auto-promote-learners`): once the learner's
/// log has stayed close to the leader's for a while. Close means within `max_lag` entries of the
/// leader's last index and at 90% of it or more (etcd's readiness for MemberPromote, which a
/// short log could pass far behind); the while makes a learner that touches the line on one
/// tick and falls back on the next wait, and the leader must have heard from it within an
/// election timeout, so a learner that is down is never made a voter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AutoPromote {
    /// Entries the learner's log may lack at most.
    pub max_lag: u64,
    /// Ticks it must stay that close, without a break.
    pub stable_ticks: u64,
}

impl AutoPromote {
    /// cairn's policy: within 1,000 entries (a few tens of milliseconds of a busy leader's
    /// writes) for five election timeouts (5 s with etcd's default timers).
    pub fn new(election_timeout_ticks: u32) -> AutoPromote {
        AutoPromote { max_lag: 1000, stable_ticks: 5 * u64::from(election_timeout_ticks) }
    }
}

/// How a [`crate::Replica`] behaves.
#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    /// The consensus core's configuration (the member id, timers, read mode).
    pub raft: cairn_raft::Config,
    /// Ticks a waiting request has before it is answered with a timeout.
    pub request_timeout_ticks: u64,
    /// Compact the log once this many entries were applied since the last compaction.
    pub snapshot_entries: u64,
    /// Entries kept behind every compaction point ([`EngineConfig::snapshot_catchup_entries`]).
    pub snapshot_catchup_entries: u64,
    /// Entries a leader keeps at most beyond that margin for followers that are catching up
    /// ([`EngineConfig::snapshot_catchup_max`]); 0 keeps none.
    pub snapshot_catchup_max: u64,
    /// The most the log may hold in memory while entries are kept for followers catching up
    /// ([`EngineConfig::snapshot_catchup_max_bytes`]).
    pub snapshot_catchup_max_bytes: u64,
    /// Report every entry persisted and applied, and every snapshot taken or installed, in
    /// [`crate::Observed`]. For simulators and tests; it costs a copy of each entry.
    pub observe: bool,
    /// This member's attributes, published through the log whenever the applied ones differ
    /// (see `replica/publish.rs`). `None` publishes nothing.
    pub publish: Option<MemberAttributes>,
    /// The length of a tick in microseconds, for lease TTLs (which are in seconds). Default
    /// 100 ms.
    pub tick_micros: u64,
    /// Expired leases revoked per second at most (etcd's fixed 1,000).
    pub lease_revoke_rate: u64,
    /// Leases longer than this many seconds get their remaining TTL recorded through Raft this
    /// often (etcd's `LeaseCheckpointInterval`, 5 minutes). The simulator shortens it so that
    /// checkpoints happen within a run.
    pub lease_checkpoint_seconds: u64,
    /// Where the replica counts failed proposals, compactions and snapshots installed; `None`
    /// (the simulator) counts nothing.
    pub metrics: Option<std::sync::Arc<crate::metrics::EngineMetrics>>,
    /// The founding members' peer URLs, recorded in the founding entry so the membership
    /// replicates with them; also what the membership shows for a founding member of a log
    /// that predates them.
    pub founding_peers: Vec<(u64, Vec<String>)>,
    /// Learners the cluster may hold at once (etcd's `--max-learners`).
    pub max_learners: usize,
    /// Promote learners once they have caught up, without a MemberPromote; `None` (etcd's
    /// way, the default) leaves promotion to the operator.
    pub auto_promote: Option<AutoPromote>,
    /// Makes the images of snapshots sent to followers streamable, off the replica's thread;
    /// `None` (the simulator) puts the image itself in the message.
    pub images: Option<crate::snapshot_images::ImageMaker>,
    /// A deliberate bug, for fault tests that must prove they catch it.
    #[cfg(feature = "planted-bugs")]
    pub planted_bug: Option<ReplicaBug>,
}

impl ReplicaConfig {
    /// The defaults around a consensus configuration.
    pub fn new(raft: cairn_raft::Config) -> ReplicaConfig {
        ReplicaConfig {
            raft,
            request_timeout_ticks: 70,
            snapshot_entries: 10_000,
            snapshot_catchup_entries: DEFAULT_SNAPSHOT_CATCHUP_ENTRIES,
            snapshot_catchup_max: DEFAULT_SNAPSHOT_CATCHUP_MAX,
            snapshot_catchup_max_bytes: DEFAULT_SNAPSHOT_CATCHUP_MAX_BYTES,
            observe: false,
            publish: None,
            tick_micros: 100_000,
            lease_revoke_rate: 1000,
            lease_checkpoint_seconds: 300,
            metrics: None,
            founding_peers: Vec::new(),
            max_learners: 1,
            auto_promote: None,
            images: None,
            #[cfg(feature = "planted-bugs")]
            planted_bug: None,
        }
    }

    /// The shortest lease TTL the engine grants ([`min_lease_ttl`]).
    pub fn min_lease_ttl(&self) -> i64 {
        min_lease_ttl(self.tick_micros, self.raft.election_timeout_ticks)
    }

    #[cfg(feature = "planted-bugs")]
    pub(crate) fn has_bug(&self, bug: ReplicaBug) -> bool {
        self.planted_bug == Some(bug)
    }

    #[cfg(not(feature = "planted-bugs"))]
    pub(crate) fn has_bug(&self, _bug: NoBug) -> bool {
        false
    }
}

/// Stands in for `ReplicaBug` without the feature, so call sites compile unchanged and vanish.
#[cfg(not(feature = "planted-bugs"))]
#[derive(Clone, Copy, Debug)]
pub(crate) enum NoBug {
    AckBeforeFsync,
    ReadWithoutIndex,
    EmptySnapshot,
    LeaseExpiresEarly,
    LeaseNeverExpires,
}

#[cfg(not(feature = "planted-bugs"))]
pub(crate) use NoBug as Bug;
#[cfg(feature = "planted-bugs")]
pub(crate) use ReplicaBug as Bug;
