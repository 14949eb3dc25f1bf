//! The etcd v3 gRPC API, generated at build time from cairn's own `.proto` files.
//!
//! Only the server and the bench tool depend on this crate: everything below them speaks plain
//! Rust types.

#![allow(missing_debug_implementations, clippy::all, clippy::pedantic)]

pub mod codec;

pub mod mvccpb {
    tonic::include_proto!("mvccpb");
}

pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
}
