//! cairn's engine: the Raft core, the write-ahead log and the MVCC store, driven together.
//!
//! Every mutation goes through Raft (a one-member group for now), is made durable in the WAL
//! with one fsync per batch of proposals (group commit), and is applied to the store in LMDB
//! together with the applied index. Linearizable reads confirm the read index first; serializable
//! reads go straight to the store.
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

pub mod command;
mod driver;
mod engine;
mod error;

pub use engine::{Engine, EngineConfig, Status};
pub use error::EngineError;
