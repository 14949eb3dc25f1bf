//! cairn's engine: the Raft core, the write-ahead log and the MVCC store, driven together.
//!
//! Every mutation goes through Raft, is made durable in the WAL with one fsync per batch of
//! proposals (group commit), executed in the store, and committed to LMDB together with the
//! applied index in the background. Linearizable reads confirm the read index first;
//! serializable reads go straight to the store.
//!
//! The parts: [`Replica`] is one member as a state machine without threads or clock, driven by
//! inputs (the simulator runs it directly); the driver thread feeds it in production and the
//! [`committer`] thread makes the store durable; [`Engine`] is the embedding API over both.
//!
//! ```
//! use bytes::Bytes;
//! use cairn_node::{Engine, EngineConfig};
//! use cairn_kv::{PutRequest, RangeRequest};
//!
//! # let dir = std::env::temp_dir().join(format!("cairn-doc-{}", std::process::id()));
//! let rt = tokio::runtime::Runtime::new().unwrap();
//! rt.block_on(async {
//!     let engine = Engine::open(EngineConfig::new("doc", &dir)).unwrap();
//!     let put = PutRequest { key: Bytes::from("greeting"), value: Bytes::from("hello"), ..Default::default() };
//!     let written = engine.put(put).await.unwrap();
//!     let read = engine.range(RangeRequest { key: Bytes::from("greeting"), ..Default::default() }).await.unwrap();
//!     assert_eq!(read.kvs[0].value, Bytes::from("hello"));
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

pub mod cluster;
pub mod command;
pub mod committer;
mod config;
mod datadir;
mod driver;
mod engine;
mod error;
mod identity;
mod ids;
mod lease_clock;
mod peers;
mod replica;
mod request;
mod shared;
mod waiters;
mod watch;

#[cfg(feature = "planted-bugs")]
pub use config::ReplicaBug;
pub use config::{min_lease_ttl, EngineConfig, ReadMode, ReplicaConfig};
pub use engine::{Engine, KeepAlive, LeaseConfirmed, LeaseRound, LeaseTimeToLive};
pub use error::{EngineError, OpenError, StopCause, StorageError};
pub use ids::{RequestId, RequestIds};
pub use replica::{AppliedEntry, Bootstrap, Leadership, Observed, Replica, Reply, Work};
pub use request::{prepare, Limits};
pub use shared::Status;
pub use watch::{LeadershipWatch, Watch, WatchStream};
