//! The etcd v3 gRPC API, generated at build time from cairn's own `.proto` files.
//!
//! Only the server and the bench tool depend on this crate: everything below them speaks plain
//! Rust types.

#![allow(missing_debug_implementations, clippy::all, clippy::pedantic)]

pub mod codec;

pub mod mvccpb {
    tonic::include_proto!("mvccpb");
}

pub mod authpb {
    tonic::include_proto!("authpb");
}

pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
}

/// The server side of Watch with each event carried as its encoded bytes (see `build.rs`): the
/// same wire format as [`etcdserverpb::WatchResponse`], so a server can encode an event once
/// and share it among every watcher that receives it.
pub mod wire {
    pub mod mvccpb {
        include!(concat!(env!("OUT_DIR"), "/wire/mvccpb.rs"));
    }

    pub mod authpb {
        include!(concat!(env!("OUT_DIR"), "/wire/authpb.rs"));
    }

    pub mod etcdserverpb {
        include!(concat!(env!("OUT_DIR"), "/wire/etcdserverpb.rs"));
    }
}
