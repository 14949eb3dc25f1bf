//! cairn's etcd data model: MVCC revisions and the KV API's semantics (Range, Put, DeleteRange,
//! Txn, Compact), over a [`backend::Backend`] that stores the history.
//!
//! Deterministic given the applied commands: every replica that applies the same commands holds
//! the same keys, revisions and history. [`model::Model`] is a small executable specification of
//! the same semantics, the oracle the store is tested against.

#![deny(clippy::unwrap_used)]
#![warn(missing_docs)]

// The store's machinery, public for the engine, the storage crate and the simulator; an
// embedder needs none of it (their docs are hidden).
pub mod auth;
#[doc(hidden)]
pub mod backend;
mod error;
mod exec;
pub mod hash;
mod image_stream;
#[doc(hidden)]
pub mod index;
#[doc(hidden)]
pub mod lease;
#[doc(hidden)]
pub mod model;
pub mod range;
#[doc(hidden)]
pub mod snapshot;
mod store;
mod types;
pub mod validate;
pub mod watch;

pub use backend::BackendError;
pub use error::KvError;
pub use hash::KvHash;
pub use image_stream::ImageStream;
pub use snapshot::{ImageMeta, InstallError};
#[doc(hidden)]
pub use store::{Applied, History, Outcome, Prepared, RangeRead, Store, KV_OVERHEAD_BYTES};
pub use types::*;
