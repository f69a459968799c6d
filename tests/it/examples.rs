//! What users outside Rust run: the Python and Node.js clients in
//! examples/, each against a real server and broker. (The docs' grpcurl
//! and CLI commands are run as written by tests/it/docs.rs.)

use crate::common;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

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
    // As the proto names it (CANCEL_OUTCOME_CANCELLED), or as a package's
    // wrapper does (cancelled).
    let outcome = step("cancelled")["outcome"].as_str().unwrap().to_lowercase();
    assert_eq!(outcome.trim_start_matches("cancel_outcome_"), "cancelled");
    assert_eq!(step("settled")["state"], "STATE_DELIVERED");
    let records =
        consume_async(&bed.broker, &bed.topic, 1, Duration::from_secs(30), Duration::from_secs(1)).await;
    assert_eq!(records.len(), 1, "one record: the retry parked nothing, the cancelled one never went out");
    assert_eq!(records[0].id(), id);
    assert_eq!(records[0].header("source"), Some(source));
    assert_eq!(records[0].offset, step("settled")["offset"].as_i64().unwrap());
}

/// Runs `program script` against a fresh server and broker, and checks it.
async fn example_against_a_real_server(program: PathBuf, script: PathBuf, source: &str) {
    let bed = TestBed::start(source, 2).await;
    let id = random_name(source);
    let (server, topic) = (bed.server.addr.to_string(), bed.topic.clone());
    let args = vec![script.to_str().unwrap().to_owned(), "--server".into(), server, "--topic".into(), topic];
    let args: Vec<String> =
        args.into_iter().chain(["--id".into(), id.clone(), "--delay-ms".into(), "500".into()]).collect();
    let steps = tokio::task::spawn_blocking(move || {
        run_example(program.to_str().unwrap(), &args.iter().map(String::as_str).collect::<Vec<_>>())
    })
    .await
    .unwrap();
    check_example(&bed, &steps, &id, source).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_example_schedules_retries_cancels_and_sees_its_delivery() {
    let venv = tempfile::tempdir().unwrap();
    let python = crate::clients::python_with_package(venv.path());
    example_against_a_real_server(python, repo("examples/python/hourglass_client.py"), "python").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_example_schedules_retries_cancels_and_sees_its_delivery() {
    // Every time: it installs a copy of clients/typescript as it is now.
    let dir = repo("examples/node");
    let status = Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund", "--prefix"])
        .arg(&dir)
        .status()
        .expect("npm (install Node.js with bash deploy/local/install-deps.sh)");
    assert!(status.success(), "npm ci in examples/node failed");
    example_against_a_real_server("node".into(), dir.join("client.js"), "node").await;
}

/// The retry pattern of examples/python/retry_with_backoff.py against a
/// standalone server reading an ingress topic: a record that fails comes
/// back after its backoff (never before), one that keeps failing goes to
/// the dead-letter topic after its last attempt, and the work topic sees
/// each retry once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_example_backs_off_through_the_ingress_topic_and_dead_letters_the_last_attempt() {
    let ingress = random_name("orders-retry");
    let mapped = ingress.clone();
    let bed = TestBed::start_with("orders", 1, move |c| c.ingress = Some(mapped)).await;
    let dead = random_name("orders-dead");
    bed.broker.create_topic(&dead, 1).await;
    let producer = native_producer(&bed.broker);
    for (key, value) in [("order-1", "ok"), ("order-2", "fail:2"), ("order-3", "poison")] {
        let record = rdkafka::producer::FutureRecord::<str, str>::to(&bed.topic).key(key).payload(value);
        producer.send(record, Duration::from_secs(30)).await.map_err(|(e, _)| e).unwrap();
    }
    let args: Vec<String> = [
        repo("examples/python/retry_with_backoff.py").to_str().unwrap(),
        "--brokers",
        bed.broker.addr(),
        "--topic",
        &bed.topic,
        "--ingress-topic",
        &ingress,
        "--dead-letter-topic",
        &dead,
        "--max-attempts",
        "3",
        "--base-delay-ms",
        "300",
        "--exit-when-idle",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let events = tokio::task::spawn_blocking(move || {
        run_example("python3", &args.iter().map(String::as_str).collect::<Vec<_>>())
    })
    .await
    .unwrap();
    let of = |key: &str, step: &str| -> Vec<&Value> {
        events.iter().filter(|e| e["key"] == key && e["step"] == step).collect()
    };
    assert_eq!(of("order-1", "processed").len(), 1, "{events:#?}");
    assert!(of("order-1", "retry").is_empty(), "{events:#?}");
    let retries = of("order-2", "retry");
    assert_eq!(retries.len(), 2, "fail:2 fails twice: {events:#?}");
    assert_eq!(retries[1]["attempt"], 1);
    assert!(retries[1]["delay_ms"].as_i64().unwrap() >= 600, "the backoff doubles: {events:#?}");
    let done = of("order-2", "processed");
    assert_eq!((done.len(), &done[0]["attempt"]), (1, &Value::from(2)), "{events:#?}");
    let dead_lettered = of("order-3", "dead-letter");
    assert_eq!((dead_lettered.len(), &dead_lettered[0]["attempt"]), (1, &Value::from(2)), "{events:#?}");
    // Every retry came back at or after its due time, never before, under
    // the id its origin and attempt make.
    let back: Vec<&Value> = events.iter().filter(|e| e.get("late_ms").is_some()).collect();
    assert_eq!(back.len(), 4, "two retries of order-2, two of order-3: {events:#?}");
    for e in back {
        assert!(e["late_ms"].as_i64().unwrap() >= 0, "early: {e}");
    }
    let origin = of("order-3", "retry")[0]["origin"].as_str().unwrap().to_owned();
    assert_eq!(origin, format!("{}/0/2", bed.topic), "where the record first came from");
    assert_eq!(of("order-3", "retry")[1]["id"], format!("{origin}.attempt-2"));
    let letters = consume_async(&bed.broker, &dead, 1, Duration::from_secs(10), Duration::ZERO).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].key.as_deref(), Some(&b"order-3"[..]));
    assert_eq!(letters[0].header("retry-attempts"), Some("3"));
    assert_eq!(letters[0].header("retry-origin"), Some(origin.as_str()));
    assert!(letters[0].header("retry-last-error").is_some_and(|e| e.contains("poison")), "{letters:?}");
    let work =
        consume_async(&bed.broker, &bed.topic, 7, Duration::from_secs(10), Duration::from_secs(1)).await;
    assert_eq!(work.len(), 7, "three records and four retries, each once: {work:?}");
    assert_eq!(hourglass::metrics::INGRESS_RECORDS.with_label_values(&[&ingress, "scheduled"]).get(), 4);
    bed.server.stop().await;
}
