//! What people at a terminal do: run the real `hourglass` binary, drive it
//! with the real `grpcurl` through server reflection, kill it with SIGKILL
//! and start it again.

use crate::common;

use std::{
    collections::HashSet,
    process::{Command, Output},
    time::Duration,
};

use common::*;

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap();
    eprintln!(
        "{:?} -> {}\n{}{}",
        cmd,
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn grpcurl(server: &Serve, args: &[&str]) -> Output {
    let grpcurl = std::env::var("HOURGLASS_TEST_GRPCURL").unwrap_or_else(|_| "grpcurl".into());
    run(Command::new(&grpcurl).arg("-plaintext").arg(&server.grpc).args(args))
}

fn grpcurl_call(server: &Serve, data: &str, method: &str) -> serde_json::Value {
    let grpcurl = std::env::var("HOURGLASS_TEST_GRPCURL").unwrap_or_else(|_| "grpcurl".into());
    let out = run(Command::new(&grpcurl).args(["-plaintext", "-d", data, &server.grpc, method]));
    assert!(out.status.success(), "grpcurl {method} failed");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcurl_schedules_through_reflection() {
    let broker = Broker::start();
    let topic = random_name("grpcurl");
    broker.create_topic(&topic, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let server = Serve::start(&broker, dir.path());

    let list = grpcurl(&server, &["list"]);
    assert!(list.status.success());
    let services = String::from_utf8(list.stdout).unwrap();
    assert!(services.contains("hourglass.v1.Scheduler"), "{services}");
    assert!(services.contains("grpc.health.v1.Health"), "{services}");
    let describe = grpcurl(&server, &["describe", "hourglass.v1.ScheduleRequest"]);
    assert!(String::from_utf8(describe.stdout).unwrap().contains("google.protobuf.Duration delay"));

    let health = grpcurl_call(&server, "{}", "grpc.health.v1.Health/Check");
    assert_eq!(health["status"], "SERVING");

    // The README's walkthrough: value "hello" is base64 "aGVsbG8=".
    let data = format!(
        r#"{{"message": {{"topic": "{topic}", "key": "b3JkZXItNDI=", "value": "aGVsbG8=",
             "headers": [{{"key": "source", "value": "Z3JwY3VybA=="}}]}}, "delay": "1s", "id": "readme-1"}}"#
    );
    let scheduled = grpcurl_call(&server, &data, "hourglass.v1.Scheduler/Schedule");
    assert_eq!(scheduled["id"], "readme-1");
    let got = consume_async(&broker, &topic, 1, Duration::from_secs(15), Duration::from_millis(500)).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].value, b"hello");
    assert_eq!(got[0].key.as_deref(), Some(&b"order-42"[..]));
    assert_eq!(got[0].header("source"), Some("grpcurl"));

    let get = grpcurl_call(&server, r#"{"id": "readme-1"}"#, "hourglass.v1.Scheduler/Get");
    assert_eq!(get["state"], "STATE_DELIVERED");
    assert!(get["delivered"]["deliveredAt"].is_string(), "{get}");
    let cancel = grpcurl_call(&server, r#"{"id": "readme-1"}"#, "hourglass.v1.Scheduler/Cancel");
    assert_eq!(cancel["outcome"], "CANCEL_OUTCOME_ALREADY_DELIVERED");
    assert!(server.terminate().success(), "SIGTERM exits 0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_subcommands_speak_plainly() {
    let broker = Broker::start();
    let topic = random_name("cli");
    broker.create_topic(&topic, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let server = Serve::start(&broker, dir.path());
    let url = server.url();
    let hourglass = |args: &[&str]| run(Command::new(BIN).args(args).args(["--server", &url]));

    let out = hourglass(&[
        "schedule", "--topic", &topic, "--value", "hi", "--key", "k", "--header", "a=b", "--delay", "1h",
        "--id", "cli-1",
    ]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("scheduled cli-1 for "));
    let out = hourglass(&["get", "cli-1"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("state:        pending") && text.contains("header:       a=\"b\""), "{text}");
    let out = hourglass(&["reschedule", "cli-1", "--delay", "2h"]);
    assert!(out.status.success());
    let out = hourglass(&[
        "schedule",
        "--topic",
        &topic,
        "--value",
        "hello",
        "--key",
        "k",
        "--delay",
        "3h",
        "--id",
        "cli-1",
        "--replace",
    ]);
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("replaced cli-1 for "), "{out:?}");
    let out = hourglass(&["get", "cli-1", "--output", "json"]);
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((got["value"].as_str(), got["headers"].as_array().map(Vec::len)), (Some("aGVsbG8="), Some(0)));
    let out = hourglass(&["cancel", "cli-1"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("cancelled"));
    let out = hourglass(&["cancel", "cli-1"]);
    assert_eq!(out.status.code(), Some(3), "nothing left to cancel");
    let out = hourglass(&["get", "missing"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("NotFound"));
    let out = hourglass(&["schedule", "--topic", "nope-topic", "--value", "v", "--delay", "1s"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));
    server.kill9();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_and_restart_loses_nothing_and_sends_nothing_early() {
    let broker = Broker::start();
    let topic = random_name("kill");
    broker.create_topic(&topic, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let server = Serve::start(&broker, dir.path());
    let client = hourglass::proto::scheduler_client::SchedulerClient::connect(server.url()).await.unwrap();

    // Due from 0.2 s to 3 s from now: some go out before the kill, some are
    // in flight during it, the rest after the restart.
    let mut scheduled = HashSet::new();
    let mut due = std::collections::HashMap::new();
    for i in 0..200u64 {
        let r = request(&topic, &format!("k{i}"), Duration::from_millis(200 + i * 14));
        let reply = client.clone().schedule(r).await.unwrap().into_inner();
        due.insert(reply.id.clone(), millis(&reply.deliver_at.unwrap()));
        scheduled.insert(reply.id);
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;
    server.kill9();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let server = Serve::start(&broker, dir.path());

    let got = consume_async(&broker, &topic, 200, Duration::from_secs(30), Duration::from_secs(2)).await;
    let mut seen = HashSet::new();
    let mut duplicates = 0;
    for r in &got {
        assert!(scheduled.contains(r.id()), "unknown record {}", r.id());
        assert!(r.timestamp_ms >= due[r.id()], "{} early", r.id());
        if !seen.insert(r.id().to_owned()) {
            duplicates += 1;
        }
    }
    let lost: Vec<_> = scheduled.difference(&seen).collect();
    assert!(lost.is_empty(), "lost after SIGKILL: {lost:?}");
    eprintln!("sigkill: {} delivered, {duplicates} duplicates (in flight at the kill)", seen.len());
    assert!(server.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_stats_print_json_for_scripts() {
    let broker = Broker::start();
    let topic = random_name("cli-json");
    broker.create_topic(&topic, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let server = Serve::start(&broker, dir.path());
    let url = server.url();
    let hourglass = |args: &[&str]| run(Command::new(BIN).args(args).args(["--server", &url]));
    let json = |out: &Output| -> Vec<serde_json::Value> {
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };

    for (id, at) in
        [("j2", "2028-01-01T09:00:02Z"), ("j1", "2028-01-01T09:00:01Z"), ("j3", "2028-01-01T09:00:03Z")]
    {
        let out = hourglass(&[
            "schedule", "--topic", &topic, "--value", "v", "--key", "k", "--at", at, "--id", id, "--output",
            "json",
        ]);
        assert!(out.status.success());
        let reply = &json(&out)[0];
        assert_eq!(
            (reply["id"].as_str(), reply["deliver_at"].as_str()),
            (Some(id), Some(&at.replace('Z', ".000Z")[..]))
        );
        assert_eq!(reply["duplicate"], false);
    }

    // Two a page, every page: one JSON object per line, in due order.
    let out = hourglass(&["list", "--page-size", "2", "--all", "--output", "json"]);
    assert!(out.status.success());
    let pages = json(&out);
    assert_eq!(pages.len(), 2, "{pages:?}");
    let listed: Vec<&str> = pages
        .iter()
        .flat_map(|p| p["messages"].as_array().unwrap())
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, ["j1", "j2", "j3"]);
    assert_eq!(pages[1]["next_page_token"], "", "the last page says so");
    let first = &pages[0]["messages"][0];
    assert_eq!(first["topic"], topic.as_str());
    assert_eq!(first["key"], "aw==", "bytes in base64");
    assert_eq!(first["dispatch_at"], "2028-01-01T09:00:01.000Z");
    assert_eq!((first["attempts"].as_u64(), first["value_bytes"].as_u64()), (Some(0), Some(1)));
    assert!(first["last_error"].is_null());

    // One page, then on from its token.
    let out = hourglass(&["list", "--page-size", "2", "--output", "json"]);
    let page = &json(&out)[0];
    let token = page["next_page_token"].as_str().unwrap();
    assert!(!token.is_empty());
    let out =
        hourglass(&["list", "--page-token", token, "--from", "2028-01-01T09:00:00Z", "--output", "json"]);
    assert_eq!(json(&out)[0]["messages"][0]["id"], "j3");
    let out = hourglass(&["list", "--topic", "nothing-here", "--output", "json"]);
    assert_eq!(json(&out)[0], serde_json::json!({"messages": [], "next_page_token": ""}));
    let out = hourglass(&["list"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().count() == 3 && text.starts_with("2028-01-01T09:00:01.000Z  j1"), "{text}");

    let out = hourglass(&["cancel", "j2", "--output", "json"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(json(&out)[0], serde_json::json!({"id": "j2", "outcome": "cancelled"}));
    let out = hourglass(&["cancel", "j2", "--output", "json"]);
    assert_eq!(out.status.code(), Some(3), "exit codes as in text");
    assert_eq!(json(&out)[0]["outcome"], "already_cancelled");
    let out = hourglass(&["reschedule", "j3", "--at", "2028-06-01T00:00:00Z", "--output", "json"]);
    assert_eq!(json(&out)[0], serde_json::json!({"id": "j3", "deliver_at": "2028-06-01T00:00:00.000Z"}));
    let out = hourglass(&["get", "j2", "--output", "json"]);
    let got = &json(&out)[0];
    assert_eq!((got["state"].as_str(), got["value"].as_str()), (Some("cancelled"), Some("dg==")));
    assert!(got["cancelled_at"].is_string() && got["delivery"].is_null(), "{got}");

    let out = hourglass(&["stats", "--output", "json"]);
    assert!(out.status.success());
    let stats = &json(&out)[0];
    assert_eq!((stats["pending"].as_u64(), stats["cancelled"].as_u64()), (Some(2), Some(1)), "{stats}");
    assert_eq!((stats["delivered"].as_u64(), stats["failed"].as_u64()), (Some(0), Some(0)));
    assert!(stats["oldest_overdue"].is_null() && stats["max_pending"].is_null(), "{stats}");
    assert!(stats["store_bytes"].as_u64().is_some() && stats["as_of"].is_string(), "{stats}");
    let out = hourglass(&["stats"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("pending:        2"));

    let out = hourglass(&["list", "--page-size", "5000", "--output", "json"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("page_size"), "the field is named");
    let out = hourglass(&["stats", "--output", "yaml"]);
    assert_eq!(out.status.code(), Some(2), "bad usage");
    assert!(server.terminate().success());
}

/// SIGHUP to a server without a tokens file: logged, nothing else. (Its
/// default action would end the process.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_without_a_tokens_file_is_harmless() {
    let broker = Broker::start();
    let topic = random_name("hup");
    broker.create_topic(&topic, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let mut server = Serve::start(&broker, dir.path());
    let pid = server.child.id().to_string();
    for _ in 0..3 {
        assert!(Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(server.child.try_wait().unwrap().is_none(), "SIGHUP ended the server");
    let mut client = server.client().await;
    client.schedule(request(&topic, "after SIGHUP", Duration::ZERO)).await.expect("still serving");
    assert!(server.terminate().success());
}

/// `--log-format json`: every line hourglass writes to stderr, from start
/// to a clean stop, is one JSON object with the time, level, target and
/// message, and the event's fields beside them; a line written for a call
/// that came with a `traceparent` names its trace and span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_per_line() {
    use std::io::BufRead as _;

    let broker = Broker::start();
    let dir = tempfile::tempdir().unwrap();
    let (mut child, grpc, metrics) = spawn_serve_with(
        &broker,
        dir.path(),
        std::process::Stdio::piped(),
        &["--log-format", "json"],
        &[("HOURGLASS_LOG", "info")],
    );
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let lines = std::thread::spawn(move || stderr.lines().map(Result::unwrap).collect::<Vec<String>>());
    let server = Serve::once_listening(child, grpc.clone(), metrics);
    let mut client = server.client().await;
    let (trace, span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let mut cancel =
        tonic::Request::new(hourglass::proto::CancelRequest { id: "never-was".into(), ..Default::default() });
    cancel.metadata_mut().insert("traceparent", format!("00-{trace}-{span}-01").parse().unwrap());
    client.cancel(cancel).await.expect("a cancel of nothing is answered");
    client
        .cancel(hourglass::proto::CancelRequest { id: "untraced".into(), ..Default::default() })
        .await
        .expect("a cancel of nothing is answered");
    assert!(server.terminate().success());
    let lines = lines.join().unwrap();
    assert!(lines.len() >= 3, "a start and a stop: {lines:#?}");
    let events: Vec<serde_json::Value> = lines
        .iter()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect();
    for event in &events {
        for key in ["timestamp", "level", "target", "message"] {
            assert!(event[key].is_string(), "{key} in {event}");
        }
    }
    let serving = events.iter().find(|e| e["message"] == "hourglass is serving").expect("the serving line");
    assert_eq!(serving["grpc_addr"], grpc.as_str(), "an event's fields sit beside its message");
    assert_eq!(serving["level"], "INFO");
    assert_eq!(serving["target"], "hourglass::server");
    assert!(events.iter().any(|e| e["message"] == "shut down cleanly"), "{lines:#?}");
    let audit = |id: &str| {
        events
            .iter()
            .find(|e| e["message"] == "audit" && e["what"].as_str().is_some_and(|w| w.contains(id)))
            .unwrap_or_else(|| panic!("the audit line of {id}: {lines:#?}"))
    };
    let traced = audit("never-was");
    assert_eq!(traced["span"]["name"], "call", "{traced}");
    assert_eq!(traced["span"]["trace_id"], trace, "{traced}");
    assert_eq!(traced["span"]["span_id"], span, "{traced}");
    let untraced = audit("untraced");
    assert!(untraced.get("span").is_none(), "a call without a trace runs in no span: {untraced}");
}

/// A password with every character that has tripped a parser.
const PASSWORD: &str = "Pw1,Xq9=Zk\"Jj";

/// Where a Kafka secret may come from, and every way start-up can fail on
/// it: no error and no log line shows any piece of it.
#[test]
fn kafka_secrets_never_reach_errors_or_logs() {
    let dir = tempfile::tempdir().unwrap();
    let pieces = ["Pw1", "Xq9", "Zk", "Jj"];
    let check = |what: &str, out: &Output| {
        let text =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        for piece in pieces {
            assert!(!text.contains(piece), "{what}: the password shows: {text}");
        }
    };
    let serve = |extra: &[&str]| {
        let mut cmd = Command::new(BIN);
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(extra)
            .env_remove("HOURGLASS_KAFKA_PROPERTIES")
            .env("HOURGLASS_LOG", "debug,librdkafka=debug");
        cmd
    };

    // The environment's list with the comma unescaped: refused by position.
    let out = run(serve(&[]).env("HOURGLASS_KAFKA_PROPERTIES", format!("sasl.password={PASSWORD}")));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("HOURGLASS_KAFKA_PROPERTIES"));
    check("an unescaped list", &out);

    // A config file that does not parse, on the password's own line.
    let file = dir.path().join("broken.toml");
    std::fs::write(&file, format!("[kafka_properties]\n\"sasl.password\" = \"{PASSWORD}\nx = 1\n")).unwrap();
    let out = run(&mut serve(&["--config", file.to_str().unwrap()]));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 2"), "the line is named");
    check("a broken config file", &out);

    // A value librdkafka refuses, and a flag without a value.
    let out = run(&mut serve(&["--kafka-property", &format!("security.protocol={PASSWORD}")]));
    assert!(!out.status.success());
    check("a refused value", &out);
    let out = run(&mut serve(&["--kafka-property", PASSWORD]));
    assert!(!out.status.success());
    check("a flag that is not KEY=VALUE", &out);

    // Accepted and in use, escaped in the environment: the server runs,
    // fails to reach a broker that is not there, and logs at debug level.
    let listed = format!(
        "security.protocol=SASL_PLAINTEXT,sasl.mechanism=PLAIN,sasl.username=u,sasl.password={}",
        PASSWORD.replace(',', "\\,")
    );
    let mut child = serve(&["--kafka-brokers", &format!("127.0.0.1:{}", free_port())])
        .env("HOURGLASS_KAFKA_PROPERTIES", listed)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    assert!(child.try_wait().unwrap().is_none(), "the server runs");
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("DEBUG"), "debug logging was on");
    check("a running server's log", &out);
}
