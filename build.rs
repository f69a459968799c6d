//! Compiles `proto/hourglass/v1/hourglass.proto` into the gRPC service and
//! messages, and writes the descriptor set that server reflection serves.

use std::{env, path::PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        // prost's codec, with undecodable requests as INVALID_ARGUMENT.
        .codec_path("crate::api::codec::Codec")
        .file_descriptor_set_path(out_dir.join("hourglass_descriptor.bin"))
        .compile_protos(&["proto/hourglass/v1/hourglass.proto"], &["proto"])?;
    Ok(())
}
