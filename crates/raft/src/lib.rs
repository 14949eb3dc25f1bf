//! cairn's consensus core: a pure, deterministic Raft state machine with etcd raft's semantics.
//!
//! The core does no IO. It has no clock (time arrives as [`Raft::tick`]), no thread RNG (election
//! jitter comes from [`Config::seed`]), no threads and no async. A driver feeds it inputs and
//! carries out what each [`Ready`] asks, in the order its documentation gives, then calls
//! [`Raft::advance`]. The same seed and inputs always give the same outputs, which is what lets
//! `cairn-sim` replay any run from its seed.
//!
//! Features: leader election with randomized timeouts, pre-vote, check-quorum, log replication
//! with per-follower progress (probe, replicate and snapshot states), a pipelining window and
//! byte-limited batches, commitment by counting replicas of current-term entries only, proposal
//! forwarding, log compaction and snapshot sending, ReadIndex batched per heartbeat round, lease
//! reads, learners, joint consensus and single-member changes, and leadership transfer.
//!
//! ```
//! use bytes::Bytes;
//! use cairn_raft::{Config, ConfState, NodeId, Persisted, Raft, Role};
//!
//! // A one-member cluster elects itself and commits a proposal once its own write is durable.
//! let conf = ConfState::with_voters([NodeId(1)]);
//! let mut node = Raft::new(Config::new(NodeId(1)), Persisted::bootstrap(conf)).unwrap();
//! let mut applied = Vec::new();
//! let mut drive = |node: &mut Raft, applied: &mut Vec<_>| {
//!     while node.has_ready() {
//!         let rd = node.ready();
//!         // A real driver persists rd.entries and rd.hard_state here, then sends messages.
//!         applied.extend(rd.committed_entries);
//!         node.advance();
//!     }
//! };
//! drive(&mut node, &mut applied); // applies the founding configuration
//! while node.role() != Role::Leader {
//!     node.tick();
//!     drive(&mut node, &mut applied);
//! }
//! node.propose(Bytes::from_static(b"hello")).unwrap();
//! drive(&mut node, &mut applied);
//! assert!(applied.iter().any(|e| e.payload == cairn_raft::EntryPayload::Normal(Bytes::from_static(b"hello"))));
//! ```

#![deny(clippy::unwrap_used)]

mod config;
mod election;
mod error;
mod follower;
mod leader;
mod log;
mod message;
mod progress;
mod quorum;
mod raft;
mod reads;
mod ready;
mod rng;
mod tracker;
mod types;

pub mod testkit;

#[cfg(feature = "planted-bugs")]
pub use config::PlantedBug;
pub use config::{Config, ConfigError, ReadMode};
pub use error::{ConfChangeError, ProposeError, ReadIndexError, TransferError};
pub use message::{HeartbeatSeq, Message, MessageBody, RejectHint};
pub use progress::{Progress, ProgressState};
pub use quorum::{JointConfig, MajorityConfig, VoteResult};
pub use raft::{Persisted, Raft, SnapshotStatus};
pub use ready::{ReadState, Ready, SoftState};
pub use tracker::apply_conf_change;
pub use types::{
    ConfChange, ConfChangeSingle, ConfState, Entry, EntryPayload, HardState, LeaveJoint, LogIndex,
    NodeId, ReadCtx, Role, Snapshot, SnapshotMeta, Term,
};
