//! Every integration test of this crate in one binary: one link instead of one per file,
//! which was most of a cold `cargo test`'s time. `cargo test --test it <module>::` runs one file's tests.

mod auth_tokens;
mod backup;
mod cluster;
mod command;
mod datadir;
mod defrag;
mod embedding;
mod engine;
mod install_crash;
mod lease;
mod lease_expiry;
mod log_retention;
mod peer_tls;
mod quota;
mod replica;
mod snapshot_transfer;
mod store_batches;
mod watch;
