//! Typed errors of the core's inputs. The core does no IO, so there is no IO variant here.

use std::fmt;

use crate::types::NodeId;

/// Why a proposal was not accepted. A dropped proposal was not appended anywhere: the caller may
/// retry it, ideally at the leader.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProposeError {
    /// This node knows no leader to forward to.
    NoLeader,
    /// A leadership transfer is in progress; the leader accepts no proposals until it ends.
    LeaderTransferring,
    /// Another membership change is not yet applied; changes go one at a time.
    ConfChangePending,
    /// The change is not valid against the current configuration.
    InvalidConfChange(ConfChangeError),
}

/// Why a membership change is invalid.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfChangeError {
    /// A joint configuration must be left (with an empty change) before the next change.
    AlreadyJoint,
    /// An empty change leaves a joint configuration, but the configuration is not joint.
    NotJoint,
    /// The change would leave no voter.
    NoVoters,
    /// One change names the same node twice.
    DuplicateNode(NodeId),
    /// Removing a node that is not a member.
    NotMember(NodeId),
}

/// Why a read request was not accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReadIndexError {
    /// This node knows no leader to ask.
    NoLeader,
}

/// Why a leadership transfer was not started.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TransferError {
    /// This node knows no leader to ask.
    NoLeader,
    /// Only voters can lead.
    NotVoter(NodeId),
}

impl fmt::Display for ProposeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProposeError::NoLeader => write!(f, "proposal dropped: no leader"),
            ProposeError::LeaderTransferring => {
                write!(f, "proposal dropped: leadership transfer in progress")
            }
            ProposeError::ConfChangePending => {
                write!(f, "membership change rejected: another change is pending")
            }
            ProposeError::InvalidConfChange(e) => write!(f, "invalid membership change: {e}"),
        }
    }
}

impl fmt::Display for ConfChangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfChangeError::AlreadyJoint => write!(f, "configuration is joint; leave it first"),
            ConfChangeError::NotJoint => write!(f, "configuration is not joint"),
            ConfChangeError::NoVoters => write!(f, "change would remove every voter"),
            ConfChangeError::DuplicateNode(id) => write!(f, "node {id} named twice"),
            ConfChangeError::NotMember(id) => write!(f, "node {id} is not a member"),
        }
    }
}

impl fmt::Display for ReadIndexError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadIndexError::NoLeader => write!(f, "read dropped: no leader"),
        }
    }
}

impl fmt::Display for TransferError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransferError::NoLeader => write!(f, "transfer dropped: no leader"),
            TransferError::NotVoter(id) => write!(f, "node {id} is not a voter"),
        }
    }
}

impl std::error::Error for ProposeError {}
impl std::error::Error for ConfChangeError {}
impl std::error::Error for ReadIndexError {}
impl std::error::Error for TransferError {}
