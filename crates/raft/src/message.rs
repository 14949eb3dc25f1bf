//! The messages Raft nodes exchange. The driver's transport carries them; their encoding is the
//! driver's business (the core types are not serializable on purpose).

use crate::types::{Entry, EntryPayload, LogIndex, NodeId, ReadCtx, Snapshot, Term};

/// A message between two members of the group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub from: NodeId,
    pub to: NodeId,
    /// The sender's term. Zero for messages that are not bound to a term (forwarded proposals,
    /// reads and transfer requests): receivers never update their term from those.
    pub term: Term,
    pub body: MessageBody,
}

/// Identifies one heartbeat broadcast of a leader. Responses echo it, so the leader knows which
/// broadcast a quorum has acknowledged; that confirms ReadIndex batches and extends its lease.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HeartbeatSeq(pub u64);

/// What a message says. Names follow the Raft paper where it has one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MessageBody {
    /// AppendEntries: `entries` follow the entry at `prev_index` with term `prev_term`.
    Append {
        prev_index: LogIndex,
        prev_term: Term,
        entries: Vec<Entry>,
        commit: LogIndex,
    },
    /// The answer to `Append`. On success `index` is the last index the follower now holds that
    /// matches the leader. On rejection `index` is the rejected `prev_index`, and `hint` says where
    /// the follower's log may match (etcd's fast log backtracking).
    AppendResp {
        index: LogIndex,
        reject: Option<RejectHint>,
    },
    /// RequestVote, or its pre-vote probe. `term` is the term the candidate would take.
    /// `transfer` marks a campaign started by a leadership transfer: it may disrupt a leader lease.
    Vote {
        pre_vote: bool,
        last_index: LogIndex,
        last_term: Term,
        transfer: bool,
    },
    VoteResp {
        pre_vote: bool,
        granted: bool,
    },
    /// Leader liveness and commit propagation. `commit` is at most what the follower is known to
    /// hold, so a follower never learns a commit index beyond its log.
    Heartbeat {
        commit: LogIndex,
        seq: HeartbeatSeq,
    },
    HeartbeatResp {
        seq: HeartbeatSeq,
    },
    /// InstallSnapshot, for a follower whose next entry the leader has compacted away.
    Snapshot {
        snapshot: Snapshot,
    },
    /// Proposals a follower forwards to its leader.
    Propose {
        payloads: Vec<EntryPayload>,
    },
    /// Read requests a follower forwards to its leader.
    ReadIndex {
        ctxs: Vec<ReadCtx>,
    },
    /// The leader's answer: reads for `ctxs` are safe once the follower has applied `index`.
    ReadIndexResp {
        ctxs: Vec<ReadCtx>,
        index: LogIndex,
    },
    /// A follower asks its leader to hand leadership to `target`.
    TransferLeader {
        target: NodeId,
    },
    /// The leader tells the transfer target to campaign now, ignoring its election timer.
    TimeoutNow,
}

/// Where a rejecting follower's log may still match the leader's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RejectHint {
    /// The largest index at which the follower may match: its last index, or the start of a
    /// conflicting term.
    pub index: LogIndex,
    /// The follower's term at `index`.
    pub term: Term,
}

impl Message {
    /// Whether this message is a response to a request the receiver made.
    pub fn is_response(&self) -> bool {
        matches!(
            self.body,
            MessageBody::AppendResp { .. }
                | MessageBody::VoteResp { .. }
                | MessageBody::HeartbeatResp { .. }
                | MessageBody::ReadIndexResp { .. }
        )
    }

    /// A short name for logs and golden test output.
    pub fn kind_name(&self) -> &'static str {
        match self.body {
            MessageBody::Append { .. } => "App",
            MessageBody::AppendResp { .. } => "AppResp",
            MessageBody::Vote { pre_vote: true, .. } => "PreVote",
            MessageBody::Vote { pre_vote: false, .. } => "Vote",
            MessageBody::VoteResp { pre_vote: true, .. } => "PreVoteResp",
            MessageBody::VoteResp { pre_vote: false, .. } => "VoteResp",
            MessageBody::Heartbeat { .. } => "Heartbeat",
            MessageBody::HeartbeatResp { .. } => "HeartbeatResp",
            MessageBody::Snapshot { .. } => "Snapshot",
            MessageBody::Propose { .. } => "Propose",
            MessageBody::ReadIndex { .. } => "ReadIndex",
            MessageBody::ReadIndexResp { .. } => "ReadIndexResp",
            MessageBody::TransferLeader { .. } => "TransferLeader",
            MessageBody::TimeoutNow => "TimeoutNow",
        }
    }
}
