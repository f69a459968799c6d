//! The code the crate ships (src/gen) is what tonic-prost-build makes from
//! the proto now: the crate never drifts from the server.
//! `HOURGLASS_BLESS=1 cargo test -p hourglass-kafka --test generated`
//! writes it again.

use std::path::Path;

#[test]
fn the_shipped_code_is_the_protos() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let proto = crate_dir.join("../../proto");
    let fresh = tempfile::tempdir().unwrap();
    tonic_prost_build::configure()
        .build_server(false)
        .out_dir(fresh.path())
        .compile_protos(&[proto.join("hourglass/v1/hourglass.proto")], &[proto])
        .expect("protoc (bash deploy/local/install-deps.sh)");
    let made = std::fs::read_to_string(fresh.path().join("hourglass.v1.rs")).unwrap();
    let shipped = crate_dir.join("src/gen/hourglass.v1.rs");
    if std::env::var_os("HOURGLASS_BLESS").is_some() {
        std::fs::write(&shipped, &made).unwrap();
    }
    assert!(
        std::fs::read_to_string(&shipped).unwrap() == made,
        "src/gen/hourglass.v1.rs is not what the proto makes: HOURGLASS_BLESS=1 cargo test -p hourglass-kafka --test generated"
    );
}
