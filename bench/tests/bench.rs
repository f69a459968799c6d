//! `hourglass-bench` on a tiny workload: it runs the `hourglass` binary
//! built beside it against a real broker and a real store, prints its
//! table, and writes JSON whose figures are sane. Timings are the bench's
//! business; this checks only that it measures.

use std::process::Command;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_hourglass-bench");

/// What the nodes log, kept in a file per node: how shards moved between
/// them, and every warning.
const NODE_LOG: &str = "warn,hourglass::cluster::owner=info,hourglass::cluster::kafka::group=info";

/// One bench at a time: two at once on a small machine measure each other,
/// and starve the cluster's nodes of the CPU their group heartbeats need.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs the bench with `args` on a tiny workload; returns its table and
/// the report it wrote as JSON. If it fails, what its servers logged is
/// shown with its own output.
fn run(args: &[&str]) -> (String, Value) {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("figures.json");
    let logs = dir.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let out = Command::new(BIN)
        .env("HOURGLASS_TEST_LOG_DIR", &logs)
        .env("HOURGLASS_BENCH_SERVER_LOG", NODE_LOG)
        .args(args)
        .args(["--scale", "0.002", "--clients", "8", "--json"])
        .arg(&json)
        .arg("--dir")
        .arg(dir.path())
        .output()
        .expect("running hourglass-bench");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed: {}\n{stdout}\n{stderr}\n{}", out.status, server_logs(&logs));
    let report = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    (stdout, report)
}

/// Every line the servers logged, in time order, each with the port of the
/// server that logged it.
fn server_logs(dir: &std::path::Path) -> String {
    let mut lines = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        let port = path.file_stem().unwrap_or_default().to_string_lossy().into_owned();
        for line in std::fs::read_to_string(&path).unwrap_or_default().lines() {
            // Lines start with their RFC 3339 time: sorting orders them.
            lines.push(format!("{line} [{port}]"));
        }
    }
    lines.sort();
    format!("what the servers logged:\n{}", lines.join("\n"))
}

/// The value of the measurement whose name has all of `words` (names
/// carry the scale, "burst of 400: ...").
fn value(report: &Value, table: &str, words: &[&str]) -> f64 {
    let m = report["measurements"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| words.iter().all(|w| m["name"].as_str().unwrap().contains(w)))
        .unwrap_or_else(|| panic!("no measurement named with {words:?}:\n{table}"));
    m["value"].as_f64().unwrap()
}

#[test]
fn bench_runs_on_a_tiny_workload_and_reports_sane_figures() {
    let (stdout, report) = run(&[]);
    for line in ["machine:", "disk:", "settings:", "durability=sync", "measurement"] {
        assert!(stdout.contains(line), "the table lacks {line:?}:\n{stdout}");
    }
    assert!(report["machine"]["cores"].as_u64().unwrap() >= 1);
    let measurements = report["measurements"].as_array().unwrap();
    let value = |words: &[&str]| value(&report, &stdout, words);
    for m in measurements {
        let (name, v) = (m["name"].as_str().unwrap(), m["value"].as_f64().unwrap());
        assert!(v.is_finite() && v >= 0.0, "{name} = {v}");
        assert!(!m["unit"].as_str().unwrap().is_empty(), "{name} has no unit");
        if let Some(limit) = m["limit"].as_f64() {
            let ratio = m["ratio"].as_f64().unwrap();
            assert!((ratio - v / limit).abs() < 1e-6, "{name}: ratio {ratio} is not {v} / {limit}");
        }
    }
    for rate in [
        "store limit: 1 msg/write",
        "producer limit",
        "ingest: Schedule,",
        "ingest: ScheduleBatch",
        "ingest: ScheduleStream",
        "drain",
        "drain, with policies that let it go",
        "drain, no policy",
        "limited to",
    ] {
        assert!(value(&[rate]) > 0.0, "{rate} measured nothing");
    }
    assert_eq!(value(&["precision", "early"]), 0.0, "nothing is delivered early");
    assert_eq!(value(&["burst", "trickle early"]), 0.0);
    assert_eq!(value(&["limited to", "another topic", "early"]), 0.0);
    assert!(value(&["precision", "max lateness"]) < 60_000.0);
    assert!(value(&["footprint", "parked: memory"]) > 1.0, "the server's memory was read");
    assert!(value(&["footprint", "disk"]) > 0.0);
    assert!(value(&["every minute: fired"]) > 0.0, "the series fired nothing");
    assert_eq!(value(&["every minute: early"]), 0.0);
    assert_eq!(value(&["one-off messages at the same rate", "early"]), 0.0);
    let restart = value(&["footprint", "SIGKILL to dispatching"]);
    assert!(restart > 0.0 && restart < 120_000.0, "restart took {restart} ms");
}

/// `--cluster 3` on a tiny workload: three real nodes sharing a schedule
/// log, one killed with SIGKILL under load, one restored from the log; the
/// figures are there and sane.
#[test]
fn the_cluster_bench_runs_on_a_tiny_workload_and_reports_sane_figures() {
    let (stdout, report) = run(&["--cluster", "3"]);
    assert!(stdout.contains("mode=cluster of 3 nodes"), "{stdout}");
    let value = |words: &[&str]| value(&report, &stdout, words);
    for rate in [
        "log limit",
        "cluster ingest: Schedule,",
        "cluster ingest: ScheduleStream",
        "cluster drain",
        "restore rate",
    ] {
        assert!(value(&[rate]) > 0.0, "{rate} measured nothing");
    }
    let failover = value(&["failover", "first delivery of a lost shard"]);
    assert!(failover > 0.0 && failover < 120_000.0, "failover took {failover} ms");
    assert!(value(&["failover", "every lost shard"]) >= failover);
    let group = value(&["failover limit", "every partition given away"]);
    assert!(group > 0.0 && group < 120_000.0, "the bare group's failover took {group} ms");
    let handover = value(&["SIGTERM, longest a lost shard waited"]);
    assert!((0.0..120_000.0).contains(&handover), "a graceful stop's shards waited {handover} ms");
}
