//! Identifiers, log entries and snapshots: the vocabulary the core shares with its driver.

use std::collections::BTreeSet;
use std::fmt;

use bytes::Bytes;

/// A member of the Raft group. Zero is never a valid id: it means "nobody" in etcd's wire format,
/// so the core rejects it in [`crate::Config::validate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(pub u64);

/// A Raft term. Terms only grow on a node; messages from older terms are stale.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Term(pub u64);

/// The position of an entry in the replicated log. Index 0 is the empty log before any entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LogIndex(pub u64);

impl Term {
    pub(crate) fn next(self) -> Term {
        Term(self.0 + 1)
    }
}

impl LogIndex {
    pub const ZERO: LogIndex = LogIndex(0);

    pub fn next(self) -> LogIndex {
        LogIndex(self.0 + 1)
    }

    pub fn prev(self) -> LogIndex {
        LogIndex(self.0.saturating_sub(1))
    }

    pub(crate) fn plus(self, n: u64) -> LogIndex {
        LogIndex(self.0 + n)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
impl fmt::Display for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
impl fmt::Display for LogIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// One entry of the replicated log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub term: Term,
    pub index: LogIndex,
    pub payload: EntryPayload,
}

/// What an entry carries. The core never looks inside `Normal` data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryPayload {
    /// Application data; empty data is the no-op a new leader appends to commit its term.
    Normal(Bytes),
    /// A membership change; it takes effect on every node when the entry is applied.
    ConfChange(ConfChange),
}

/// Fixed per-entry overhead counted toward message byte limits, so that empty entries still cost.
const ENTRY_OVERHEAD_BYTES: u64 = 24;

impl Entry {
    /// The size this entry counts for in byte limits (batching and in-flight windows).
    pub fn size_bytes(&self) -> u64 {
        let payload = match &self.payload {
            EntryPayload::Normal(data) => data.len() as u64,
            EntryPayload::ConfChange(cc) => 16 * cc.changes.len() as u64 + cc.context.len() as u64,
        };
        ENTRY_OVERHEAD_BYTES + payload
    }
}

/// A request to change membership, proposed with [`crate::Raft::propose_conf_change`].
///
/// An empty `changes` list leaves a joint configuration. One change that adds or removes at most
/// one voter is applied directly ("single-member change", thesis §4.1); anything else enters a
/// joint configuration (thesis §4.3) that the leader leaves automatically once it is applied,
/// unless `leave_joint` is [`LeaveJoint::Explicit`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConfChange {
    pub changes: Vec<ConfChangeSingle>,
    pub leave_joint: LeaveJoint,
    /// The application's own data about the change (etcd's `ConfChange.Context`: who the
    /// member is, where its peers reach it). The core carries it and never looks inside.
    pub context: Bytes,
}

/// How a joint configuration is left.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LeaveJoint {
    /// The leader proposes the leaving change as soon as it applies the entering one.
    #[default]
    Auto,
    /// The application proposes an empty [`ConfChange`] when it wants to leave.
    Explicit,
}

/// One membership step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfChangeSingle {
    AddVoter(NodeId),
    AddLearner(NodeId),
    Remove(NodeId),
}

/// The membership a snapshot or the applied log describes.
///
/// Invariant: `voters`, `learners` and `learners_next` are pairwise disjoint, and so are
/// `voters_outgoing` and `learners`. `learners_next` holds voters of the outgoing configuration
/// that become learners when the joint configuration is left; it is empty outside a joint
/// configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConfState {
    pub voters: BTreeSet<NodeId>,
    /// Non-empty exactly while in a joint configuration.
    pub voters_outgoing: BTreeSet<NodeId>,
    pub learners: BTreeSet<NodeId>,
    pub learners_next: BTreeSet<NodeId>,
    /// Whether leaving the current joint configuration is automatic.
    pub auto_leave: bool,
}

impl ConfState {
    /// A plain configuration of voters, as used to bootstrap a new cluster.
    pub fn with_voters(voters: impl IntoIterator<Item = NodeId>) -> ConfState {
        ConfState { voters: voters.into_iter().collect(), ..ConfState::default() }
    }

    pub fn is_joint(&self) -> bool {
        !self.voters_outgoing.is_empty()
    }

    /// Every node the configuration names, voters and learners alike.
    pub fn members(&self) -> BTreeSet<NodeId> {
        let mut all = self.voters.clone();
        all.extend(&self.voters_outgoing);
        all.extend(&self.learners);
        all.extend(&self.learners_next);
        all
    }
}

/// Identifies what a snapshot holds: the state after applying every entry up to `index`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SnapshotMeta {
    pub index: LogIndex,
    pub term: Term,
    pub conf_state: ConfState,
}

/// A snapshot of the application state. `data` is opaque to the core: a driver may put the state
/// itself there, or a handle its transport resolves into a stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub meta: SnapshotMeta,
    pub data: Bytes,
}

/// The state every node must persist before it acts on it (Raft paper, Figure 2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HardState {
    pub term: Term,
    pub vote: Option<NodeId>,
    pub commit: LogIndex,
}

/// A node's role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Follower,
    PreCandidate,
    Candidate,
    Leader,
}

/// An opaque token that identifies one read request; the driver chooses it and gets it back in
/// the matching [`crate::ReadState`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReadCtx(pub Bytes);
