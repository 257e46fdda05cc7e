//! Compiles `proto/` with protox (pure Rust, no system `protoc`) and generates prost messages and
//! tonic clients/servers. The encoded file descriptor set is written next to the generated code so
//! the servers can offer gRPC reflection.

use std::{env, path::PathBuf};

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_root = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let files = [
        proto_root.join("chainify/v1/types.proto"),
        proto_root.join("chainify/v1/services.proto"),
    ];
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    let fds = protox::compile(&files, [&proto_root])?;
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    std::fs::write(out_dir.join("chainify_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
