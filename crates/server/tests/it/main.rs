//! Every integration test of this crate in one binary: one link instead of one per file,
//! which was most of a cold `cargo test`'s time. `cargo test --test it <module>::` runs one file's tests.

mod backup;
mod bench_cli;
mod cli;
mod common;
mod corrupt_check;
mod damaged_files;
mod embedded_cluster;
mod fd_limit;
mod grpc_frames;
mod hostile;
mod http_layer;
mod large_ranges;
mod metrics;
/// The transport's test CA, shared with its TLS tests.
#[path = "../../../transport/tests/pki/mod.rs"]
mod pki;
mod range_stream;
mod tls;
