//! Compiles the etcd API .proto files with protox (pure Rust: no system protoc needed).
//!
//! Twice: once as written, for every service and client; and once more for the server side of
//! Watch only, with `WatchResponse.events` declared as `repeated bytes`. That is the same wire
//! format (a length-delimited field holding an encoded `mvccpb.Event` is exactly a `bytes` field
//! holding those bytes), and it lets the server encode each event once and send the same bytes
//! to every watcher that receives it.

use prost_types::field_descriptor_proto::Type;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/rpc.proto", "proto/kv.proto", "proto/auth.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .codec_path("crate::codec::Codec")
        .compile_fds(descriptors.clone())?;

    let mut wire = descriptors;
    for file in &mut wire.file {
        if file.package() != "etcdserverpb" {
            continue;
        }
        file.service.retain(|s| s.name() == "Watch");
        let response = file.message_type.iter_mut().find(|m| m.name() == "WatchResponse");
        let events = response
            .and_then(|m| m.field.iter_mut().find(|f| f.name() == "events"))
            .ok_or("rpc.proto: WatchResponse.events not found")?;
        events.set_type(Type::Bytes);
        events.type_name = None;
    }
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("wire");
    std::fs::create_dir_all(&out)?;
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(true)
        .out_dir(&out)
        .bytes(".etcdserverpb.WatchResponse.events")
        .codec_path("crate::codec::StreamCodec")
        .compile_fds(wire)?;
    Ok(())
}
