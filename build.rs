//! Compiles `proto/hourglass/v1/hourglass.proto` into the gRPC service and
//! messages, writes the descriptor set that server reflection serves, and
//! names the build: `HOURGLASS_COMMIT` (the commit and its date, from git,
//! or as the environment gives it to a build outside a checkout) for
//! `hourglass --version` and the `hourglass_build_info` metric.

use std::{env, path::PathBuf, process::Command};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        // prost's codec, with undecodable requests as INVALID_ARGUMENT.
        .codec_path("crate::api::codec::Codec")
        .file_descriptor_set_path(out_dir.join("hourglass_descriptor.bin"))
        .compile_protos(&["proto/hourglass/v1/hourglass.proto"], &["proto"])?;
    println!("cargo:rustc-env=HOURGLASS_COMMIT={}", commit());
    Ok(())
}

/// `<12 hex digits> <commit date>`; `unknown` outside a git checkout unless
/// `HOURGLASS_COMMIT` says. Built again when the checkout's HEAD moves.
fn commit() -> String {
    println!("cargo:rerun-if-env-changed=HOURGLASS_COMMIT");
    if let Ok(given) = env::var("HOURGLASS_COMMIT") {
        return given;
    }
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|out| out.status.success())
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .map(|text| text.trim().to_owned())
    };
    if git(&["rev-parse", "--git-dir"]).is_none() {
        return "unknown".into();
    }
    // HEAD's log moves at every commit, checkout and reset; HEAD itself and
    // the branch's ref besides, where a repository keeps no logs. Each as
    // git names it (a worktree's are apart from the main checkout's), and
    // only if it exists: a path that does not would run this every build.
    let branch = git(&["symbolic-ref", "-q", "HEAD"]);
    for name in ["HEAD", "logs/HEAD", "packed-refs"].into_iter().chain(branch.as_deref()) {
        if let Some(path) = git(&["rev-parse", "--git-path", name]).map(PathBuf::from).filter(|p| p.exists())
        {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    match git(&["log", "-1", "--format=%h %cs", "--abbrev=12"]) {
        Some(commit) if !commit.is_empty() => commit,
        _ => "unknown".into(),
    }
}
