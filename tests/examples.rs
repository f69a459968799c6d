//! What users outside Rust run: the Python and Node.js clients in
//! examples/, and the README's grpcurl walkthrough as written, each against
//! a real server and broker.

mod common;

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

/// The `grpcurl` commands of the README's code blocks, in order, each as
/// one shell command (a multi-line `-d '{...}'` joined).
fn readme_grpcurl_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(repo("README.md")).unwrap();
    let mut commands = Vec::new();
    let mut in_block = false;
    let mut current: Option<String> = None;
    for line in readme.lines() {
        if line.starts_with("```") {
            in_block = line == "```sh";
            continue;
        }
        if !in_block {
            continue;
        }
        match current.as_mut() {
            Some(c) => c.push_str(&format!("\n{line}")),
            None if line.starts_with("grpcurl ") => current = Some(line.to_owned()),
            None => continue,
        }
        // A command ends on a line that is not inside an open quote and
        // does not end in a backslash.
        let c = current.as_ref().unwrap();
        if c.matches('\'').count() % 2 == 0 && !c.ends_with('\\') {
            commands.push(current.take().unwrap());
        }
    }
    commands
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_grpcurl_walkthrough_runs_as_written() {
    let bed = TestBed::start("readme", 1).await;
    // The topics the README uses; "nope" is the one that does not exist.
    bed.broker.create_topic("reminders", 1).await;
    bed.broker.create_topic("orders", 3).await;
    // The server looks a missing topic up again at most once a second:
    // let its first look (at start-up) age past that.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let commands = readme_grpcurl_commands();
    assert!(commands.len() >= 8, "the README shows grpcurl for each method: {commands:#?}");
    let addr = bed.server.addr.to_string();
    let mut ran = Vec::new();
    for command in &commands {
        let command = command.replace("127.0.0.1:50051", &addr);
        let out = tokio::task::spawn_blocking({
            let command = command.clone();
            move || Command::new("sh").arg("-c").arg(&command).output().unwrap()
        })
        .await
        .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        // What the README says each answers, in the order it shows them:
        // after the Cancel it shows, Reschedule meets a cancelled message.
        let expected_failure = command.contains("Scheduler/Reschedule")
            && ran.iter().any(|c: &String| c.contains("Scheduler/Cancel"));
        if expected_failure {
            assert!(stderr.contains("FailedPrecondition"), "{command}\n{stdout}{stderr}");
        } else {
            assert!(out.status.success(), "{command}\n{stdout}{stderr}");
        }
        if command.contains("Scheduler/Schedule ") || command.ends_with("Scheduler/Schedule") {
            assert!(stdout.contains("\"id\""), "{command}\n{stdout}");
        }
        if command.contains("Scheduler/ScheduleBatch") {
            assert!(
                stdout.contains("NotFound") || stdout.contains("\"code\": 5"),
                "the bad item's error: {stdout}"
            );
        }
        if command.contains("Scheduler/Cancel") {
            assert!(stdout.contains("CANCEL_OUTCOME_CANCELLED"), "{command}\n{stdout}");
        }
        if command.contains("Scheduler/Get") {
            assert!(stdout.contains("STATE_CANCELLED"), "{command}\n{stdout}");
        }
        ran.push(command);
    }
    // The walkthrough's reminder arrives.
    let records =
        consume_async(&bed.broker, "reminders", 1, Duration::from_secs(30), Duration::from_secs(1)).await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].value, b"hello");
    assert_eq!(records[0].header("source"), Some("grpcurl"));
}
