//! Every integration test of this crate in one binary: one link instead of one per file,
//! which was most of a cold `cargo test`'s time. `cargo test --test it <module>::` runs one file's tests.

mod auth_store;
mod common;
mod concurrency;
mod hash;
mod image_stream;
mod lease;
mod model;
mod semantics;
mod snapshot;
mod stepped_reads;
mod watch;
