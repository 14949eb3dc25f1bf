//! Compiles the etcd API .proto files with protox (pure Rust: no system protoc needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/rpc.proto", "proto/kv.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .codec_path("crate::codec::Codec")
        .compile_fds(descriptors)?;
    Ok(())
}
