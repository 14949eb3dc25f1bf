//! Every integration test of this crate in one binary: one link instead of one per file,
//! which was most of a cold `cargo test`'s time. `cargo test --test it <module>::` runs one file's tests.

mod common;
mod lmdb;
mod lmdb_damage;
mod lmdb_defrag;
mod lmdb_install;
mod wal;
mod wal_damage;
mod wal_fuzz;
