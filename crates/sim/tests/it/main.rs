//! Every integration test of this crate in one binary: one link instead of one per file,
//! which was most of a cold `cargo test`'s time. `cargo test --test it <module>::` runs one file's tests.

mod history;
mod install_crash;
mod lease_history;
mod planted_bugs;
mod seeds;
