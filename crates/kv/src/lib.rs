//! cairn's etcd data model: MVCC revisions and the KV API's semantics (Range, Put, DeleteRange,
//! Txn, Compact), over a [`backend::Backend`] that stores the history.
//!
//! Deterministic given the applied commands: every replica that applies the same commands holds
//! the same keys, revisions and history. [`model::Model`] is a small executable specification of
//! the same semantics, the oracle the store is tested against.

#![deny(clippy::unwrap_used)]

pub mod backend;
mod error;
mod exec;
pub mod hash;
pub mod index;
pub mod lease;
pub mod model;
pub mod range;
pub mod snapshot;
mod store;
mod types;
pub mod validate;
pub mod watch;

pub use error::KvError;
pub use hash::KvHash;
pub use snapshot::{ImageMeta, InstallError};
pub use store::{Applied, History, Outcome, Prepared, Store};
pub use types::*;
