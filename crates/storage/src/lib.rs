//! cairn's storage: the only crate that touches files.
//!
//! - [`wal`]: the segmented write-ahead log for Raft entries, hard state and snapshot markers,
//!   with checksummed records, group commit, torn-tail repair and segment removal; [`repair`]
//!   truncates a damaged log on an operator's command, keeping a copy of what it cuts.
//! - [`lmdb`]: the state machine's history in LMDB (through heed), behind cairn-kv's `Backend`.
//! - [`lmdb_check`]: the check of LMDB's data file at open, before LMDB maps it.
//! - [`fs`]: the narrow file-system seam ([`fs::Dir`], [`fs::File`]) all IO goes through.
//! - [`faulty`]: an in-memory implementation of that seam that loses unsynced writes on a crash
//!   and fails operations on demand, for crash tests.

#![deny(clippy::unwrap_used)]

pub mod codec;
mod error;
pub mod faulty;
pub mod fs;
pub mod lmdb;
pub mod lmdb_check;
mod record;
mod repair;
mod replay;
pub mod wal;

pub use repair::{repair, Cut, Promise, Repaired};
pub use wal::{Recovered, SyncHandle, Wal, WalError, WalOptions};
