//! Static configuration of one node's core.

use crate::types::NodeId;

/// How linearizable reads are confirmed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReadMode {
    /// ReadIndex: one heartbeat round per batch of reads confirms leadership (thesis §6.4).
    #[default]
    Safe,
    /// The leader answers from its lease without a round trip (thesis §6.4.1). Safe only while
    /// clocks drift apart by less than [`Config::lease_margin_ticks`] over an election timeout;
    /// requires `check_quorum`.
    Lease,
}

/// A deliberate protocol bug, compiled in only with the `planted-bugs` feature, so the simulator
/// can prove that its checkers catch real violations.
#[cfg(feature = "planted-bugs")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlantedBug {
    /// Commit an entry of an earlier term by counting replicas (the Figure 8 bug, §5.4.2).
    CommitPreviousTerm,
    /// Grant votes without checking that the candidate's log is up to date (§5.4.1).
    VoteIgnoresLog,
    /// Answer ReadIndex at once, without confirming leadership with a heartbeat round (§6.4).
    ReadSkipsQuorum,
    /// Under asynchronous storage writes, count the leader's own copy toward commit once
    /// written, before it is durable.
    CountUnsyncedOwnCopy,
}

/// Configuration of one node. Build it with [`Config::new`] and adjust fields.
#[derive(Clone, Debug)]
pub struct Config {
    pub id: NodeId,
    /// Ticks without hearing from a leader before a follower campaigns. The actual timeout is
    /// drawn from `[election_timeout_ticks, 2 * election_timeout_ticks)` with the seeded RNG.
    pub election_timeout_ticks: u32,
    /// Ticks between a leader's heartbeats. Must be less than the election timeout.
    pub heartbeat_interval_ticks: u32,
    /// Probe with a pre-vote round before campaigning, so a partitioned node rejoining does not
    /// disrupt a healthy leader with a higher term (thesis §9.6).
    pub pre_vote: bool,
    /// A leader steps down after an election timeout without hearing from a quorum, and followers
    /// ignore vote requests while they hear from a leader (thesis §6.2, §9.6).
    pub check_quorum: bool,
    pub read_mode: ReadMode,
    /// How much shorter than an election timeout a leader lease is, to absorb clock drift between
    /// nodes. With a margin of `m` ticks, leases stay safe while no node's clock runs more than
    /// `m / election_timeout_ticks` faster or slower than another's.
    pub lease_margin_ticks: u32,
    /// Soft byte limit on the entries of one Append message; at least one entry is always sent.
    pub max_msg_bytes: u64,
    /// Append messages in flight to one follower in the replicate state (pipelining window).
    pub max_inflight_msgs: usize,
    /// Bytes of entries in flight to one follower; 0 means no byte limit.
    pub max_inflight_bytes: u64,
    /// Seeds the election-timeout jitter; the node id is mixed in, so one cluster seed works.
    pub seed: u64,
    /// The driver may write a `Ready`'s entries and make them durable later
    /// ([`crate::Raft::advance_written`], then [`crate::Raft::log_synced`]), as etcd raft's
    /// `AsyncStorageWrites`. The core then applies only entries durable on this node. Off, every
    /// `Ready` is durable once advanced, and its committed entries may include the entries it
    /// hands out to write (they are persisted before they are applied).
    pub async_storage_writes: bool,
    #[cfg(feature = "planted-bugs")]
    pub planted_bug: Option<PlantedBug>,
}

impl Config {
    pub fn new(id: NodeId) -> Config {
        Config {
            id,
            election_timeout_ticks: 10,
            heartbeat_interval_ticks: 1,
            pre_vote: true,
            check_quorum: true,
            read_mode: ReadMode::Safe,
            lease_margin_ticks: 2,
            max_msg_bytes: 1 << 20,
            max_inflight_msgs: 256,
            max_inflight_bytes: 0,
            seed: 0,
            async_storage_writes: false,
            #[cfg(feature = "planted-bugs")]
            planted_bug: None,
        }
    }

    /// Checks the configuration's preconditions.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.id.0 == 0 {
            return Err(ConfigError("node id 0 is reserved for \"no node\""));
        }
        if self.heartbeat_interval_ticks == 0 {
            return Err(ConfigError("heartbeat interval must be at least one tick"));
        }
        if self.election_timeout_ticks <= self.heartbeat_interval_ticks {
            return Err(ConfigError("election timeout must exceed the heartbeat interval"));
        }
        if self.max_inflight_msgs == 0 {
            return Err(ConfigError("max in-flight messages must be at least 1"));
        }
        if self.read_mode == ReadMode::Lease && !self.check_quorum {
            return Err(ConfigError("lease reads require check_quorum"));
        }
        if self.read_mode == ReadMode::Lease
            && self.lease_margin_ticks >= self.election_timeout_ticks
        {
            return Err(ConfigError("lease margin must be shorter than the election timeout"));
        }
        Ok(())
    }

    #[cfg(feature = "planted-bugs")]
    pub(crate) fn has_bug(&self, bug: PlantedBug) -> bool {
        self.planted_bug == Some(bug)
    }

    #[cfg(not(feature = "planted-bugs"))]
    pub(crate) fn has_bug(&self, _bug: PlantedBugNever) -> bool {
        false
    }
}

/// Stands in for `PlantedBug` when the feature is off, so call sites compile unchanged and the
/// optimizer removes them.
#[cfg(not(feature = "planted-bugs"))]
#[derive(Clone, Copy, Debug)]
pub(crate) enum PlantedBugNever {
    CommitPreviousTerm,
    VoteIgnoresLog,
    ReadSkipsQuorum,
    CountUnsyncedOwnCopy,
}

#[cfg(feature = "planted-bugs")]
pub(crate) use PlantedBug as PlantedBugSwitch;
#[cfg(not(feature = "planted-bugs"))]
pub(crate) use PlantedBugNever as PlantedBugSwitch;

/// An invalid [`Config`], with the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError(pub &'static str);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid raft config: {}", self.0)
    }
}

impl std::error::Error for ConfigError {}
