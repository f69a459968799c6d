//! What users outside Rust run: the Python and Node.js clients in
//! examples/, each against a real server and broker. (The docs' grpcurl
//! and CLI commands are run as written by tests/it/docs.rs.)

use crate::common;

use std::{path::Path, process::Command, time::Duration};

use common::*;
use serde_json::Value;

fn repo(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// Runs an example client; returns its JSON lines by step.
fn run_example(program: &str, args: &[&str]) -> Vec<Value> {
    let out = Command::new(program).args(args).output().unwrap_or_else(|e| {
        panic!("running {program} ({e}); install it with bash deploy/local/install-deps.sh")
    });
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{program} {}: {}\n{stdout}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

/// The four steps every example takes, and the one record it leaves.
async fn check_example(bed: &TestBed, steps: &[Value], id: &str, source: &str) {
    let step =
        |name: &str| steps.iter().find(|s| s["step"] == name).unwrap_or_else(|| panic!("no {name} step"));
    assert_eq!(step("scheduled")["id"], id);
    assert_eq!(step("scheduled")["duplicate"], false);
    assert_eq!(step("retried")["duplicate"], true, "a retry is answered as a duplicate");
    assert_eq!(step("retried")["deliver_at"], step("scheduled")["deliver_at"], "with the original due time");
    assert_eq!(step("cancelled")["outcome"], "CANCEL_OUTCOME_CANCELLED");
    assert_eq!(step("settled")["state"], "STATE_DELIVERED");
    let records =
        consume_async(&bed.broker, &bed.topic, 1, Duration::from_secs(30), Duration::from_secs(1)).await;
    assert_eq!(records.len(), 1, "one record: the retry parked nothing, the cancelled one never went out");
    assert_eq!(records[0].id(), id);
    assert_eq!(records[0].header("source"), Some(source));
    assert_eq!(records[0].offset, step("settled")["offset"].as_i64().unwrap());
}

/// Runs `program script` against a fresh server and broker, and checks it.
async fn example_against_a_real_server(program: &'static str, script: std::path::PathBuf, source: &str) {
    let bed = TestBed::start(source, 2).await;
    let id = random_name(source);
    let (server, topic) = (bed.server.addr.to_string(), bed.topic.clone());
    let args = vec![script.to_str().unwrap().to_owned(), "--server".into(), server, "--topic".into(), topic];
    let args: Vec<String> =
        args.into_iter().chain(["--id".into(), id.clone(), "--delay-ms".into(), "500".into()]).collect();
    let steps = tokio::task::spawn_blocking(move || {
        run_example(program, &args.iter().map(String::as_str).collect::<Vec<_>>())
    })
    .await
    .unwrap();
    check_example(&bed, &steps, &id, source).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_example_schedules_retries_cancels_and_sees_its_delivery() {
    example_against_a_real_server("python3", repo("examples/python/hourglass_client.py"), "python").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_example_schedules_retries_cancels_and_sees_its_delivery() {
    let dir = repo("examples/node");
    if !dir.join("node_modules").exists() {
        let status = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--prefix"])
            .arg(&dir)
            .status()
            .expect("npm (install Node.js with bash deploy/local/install-deps.sh)");
        assert!(status.success(), "npm ci in examples/node failed");
    }
    example_against_a_real_server("node", dir.join("client.js"), "node").await;
}
