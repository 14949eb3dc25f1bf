//! Every integration test of this crate in one binary: one link instead of one per file,
//! which was most of a cold `cargo test`'s time. `cargo test --test it <module>::` runs one file's tests.

mod async_writes;
mod compaction;
mod interaction;
mod paper;
mod properties;
mod smoke;
