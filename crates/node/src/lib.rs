//! cairn's engine: the Raft core, the write-ahead log and the MVCC store, driven together.
//!
//! Every mutation goes through Raft, is made durable in the WAL with one fsync per batch of
//! proposals (group commit), executed in the store, and committed to LMDB together with the
//! applied index in the background. Linearizable reads confirm the read index first;
//! serializable reads go straight to the store.
//!
//! The parts: the replica is one member as a state machine without threads or clock, driven by
//! inputs (the simulator runs it directly); the driver thread feeds it in production and the
//! committer thread makes the store durable; [`Engine`] is the embedding API over both.
//!
//! Embedders depend on the `cairn` crate without its default `server` feature, which
//! re-exports this crate's embedding API and `cairn_kv` as `cairn::kv`; its docs hold a
//! complete program.
//!
//! ```
//! use cairn_node::{Engine, EngineConfig};
//! use cairn_kv::{PutRequest, RangeRequest};
//!
//! # let dir = std::env::temp_dir().join(format!("cairn-doc-{}", std::process::id()));
//! let rt = tokio::runtime::Runtime::new().unwrap();
//! rt.block_on(async {
//!     let engine = Engine::open(EngineConfig::new("doc", &dir)).unwrap();
//!     let written = engine.put(PutRequest::new("greeting", "hello")).await.unwrap();
//!     let read = engine.range(RangeRequest::key("greeting")).await.unwrap();
//!     assert_eq!(read.kvs[0].value, "hello");
//!     assert_eq!(read.kvs[0].mod_revision, written.revision);
//!     let kv = engine.get("greeting").await.unwrap().expect("present");
//!     assert_eq!(kv.version, 1);
//!     assert!(engine.delete("greeting").await.unwrap());
//!     assert!(engine.get("greeting").await.unwrap().is_none());
//!     engine.stop();
//! });
//! # std::fs::remove_dir_all(&dir).unwrap();
//! ```

#![deny(clippy::unwrap_used)]
#![warn(missing_docs)]

pub mod backup;
pub mod cluster;
// The replica's machinery, public for the simulator and the tests; an embedder needs none of
// it (its docs are hidden).
#[doc(hidden)]
pub mod command;
mod command_auth;
#[doc(hidden)]
pub mod committer;
mod config;
mod datadir;
mod driver;
mod engine;
mod error;
mod identity;
mod ids;
mod join;
mod lease_clock;
mod log_syncer;
pub mod metrics;
mod peer_inbox;
mod peers;
mod replica;
mod request;
pub mod restore;
mod shared;
mod snapshot_images;
mod spin;
mod waiters;
mod watch;

pub use cairn_raft::{NodeId, Term};
#[cfg(feature = "planted-bugs")]
#[doc(hidden)]
pub use config::ReplicaBug;
#[doc(hidden)]
pub use config::ReplicaConfig;
pub use config::{
    min_lease_ttl, AutoPromote, EngineConfig, LogSync, ReadMode, DEFAULT_SNAPSHOT_CATCHUP_ENTRIES,
    DEFAULT_SNAPSHOT_CATCHUP_MAX, DEFAULT_SNAPSHOT_CATCHUP_MAX_BYTES,
};
pub use engine::{
    added_member_id, Engine, KeepAlive, LeaseConfirmed, LeaseRound, LeaseTimeToLive, Member,
    RangePlan,
};
pub use error::{EngineError, MembershipError, OpenError, StopCause, StorageError};
#[doc(hidden)]
pub use ids::{RequestId, RequestIds};
pub use replica::Leadership;
#[doc(hidden)]
pub use replica::{AppliedEntry, Bootstrap, MemberChange, Observed, Replica, Reply, Work};
#[doc(hidden)]
pub use request::{prepare, Limits};
pub use shared::Status;
pub use snapshot_images::ImageMaker;
pub use watch::{LeadershipWatch, Watch, WatchStream};
