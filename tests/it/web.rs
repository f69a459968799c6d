//! The HTTP doors on the gRPC port, called by real clients: JSON calls (the
//! Connect protocol's unary form) with curl over HTTP/1.1 and HTTP/2, with
//! mutual TLS and tokens, and their errors; the OpenAPI document served;
//! schemathesis run against it. gRPC-Web is called by the TypeScript
//! package's tests (`clients::`), over its web transport.

use crate::common;

use std::{path::Path, process::Command, time::Duration};

use base64::Engine as _;
use common::*;
use serde_json::{Value, json};

const SCHEDULER: &str = "hourglass.v1.Scheduler";

/// A curl against the server of `env` (the clients' test environment):
/// its TLS files, and the token when given; the HTTP status and the body
/// as JSON.
fn curl(
    env: &[(&str, String)],
    http: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
    extra: &[&str],
) -> (u16, Value) {
    let get = |name: &str| env.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone()).unwrap();
    let mut command = Command::new("curl");
    command
        .args(["-sS", http, "--max-time", "20", "-X", "POST", "-w", "\n%{http_code}"])
        .args(["--cacert", &get("HOURGLASS_TEST_CA"), "--cert", &get("HOURGLASS_TEST_CERT")])
        .args(["--key", &get("HOURGLASS_TEST_KEY"), "--data-binary", body])
        .args(extra);
    if !extra.iter().any(|arg| arg.starts_with("Content-Type")) {
        command.args(["-H", "Content-Type: application/json"]);
    }
    if let Some(token) = token {
        command.args(["-H", &format!("Authorization: Bearer {token}")]);
    }
    command.arg(format!("{}{path}", get("HOURGLASS_TEST_SERVER")));
    // The server runs on this test's runtime: the wait gives its thread up.
    let out =
        tokio::task::block_in_place(|| command.output()).expect("curl (bash deploy/local/install-deps.sh)");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "curl {path}: {}\n{said}", String::from_utf8_lossy(&out.stderr));
    let (body, status) = said.rsplit_once('\n').unwrap();
    let body = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(body).unwrap_or(Value::String(body.into()))
    };
    (status.parse().unwrap(), body)
}

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// Over HTTP/1.1 and HTTP/2, with mutual TLS and a token: a JSON Schedule
/// is parked and delivered to Kafka; Get reads it; Cancel cancels another;
/// the answers are the proto3 JSON of the gRPC answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_calls_schedule_get_and_cancel_over_http1_and_http2_with_tls_and_a_token() {
    let (_dir, (broker, server, _pki), env) = crate::clients::server_with_tokens().await;
    let topic = env.iter().find(|(n, _)| *n == "HOURGLASS_TEST_TOPIC").unwrap().1.clone();
    let token = Some("client-token");
    let ids: Vec<String> =
        ["--http1.1", "--http2"].iter().map(|v| format!("web{}", v.replace('.', "-"))).collect();
    for (http, id) in ["--http1.1", "--http2"].into_iter().zip(&ids) {
        let schedule = json!({
            "message": {"topic": topic, "value": b64(&format!("over {http}")), "key": b64("k")},
            "delay": "0.5s",
            "id": id,
            "labels": {"door": "json"},
        });
        let path = format!("/{SCHEDULER}/Schedule");
        let (status, done) = curl(&env, http, &path, token, &schedule.to_string(), &[]);
        assert_eq!(status, 200, "{http}: {done}");
        assert_eq!(
            (done["id"].as_str(), done["outcome"].as_str()),
            (Some(id.as_str()), Some("SCHEDULE_OUTCOME_CREATED")),
            "{done}"
        );
        assert!(done["deliverAt"].as_str().is_some_and(|at| at.ends_with('Z')), "{done}");
        // The same request again is a duplicate, as over gRPC.
        let (_, again) = curl(&env, http, &path, token, &schedule.to_string(), &[]);
        assert_eq!(again["duplicate"], true, "{again}");

        let later = json!({"message": {"topic": topic, "value": b64("later")}, "delay": "3600s"});
        let (_, later) = curl(&env, http, &path, token, &later.to_string(), &[]);
        let later = later["id"].as_str().unwrap().to_owned();
        let (status, cancelled) =
            curl(&env, http, &format!("/{SCHEDULER}/Cancel"), token, &json!({"id": later}).to_string(), &[]);
        assert_eq!(
            (status, cancelled["outcome"].as_str()),
            (200, Some("CANCEL_OUTCOME_CANCELLED")),
            "{cancelled}"
        );
    }
    let received = tokio::task::block_in_place(|| {
        consume(broker.addr(), &topic, 2, Duration::from_secs(30), Duration::from_millis(500))
    });
    let mut values: Vec<_> =
        received.iter().map(|r| String::from_utf8_lossy(&r.value).into_owned()).collect();
    values.sort();
    assert_eq!(values, ["over --http1.1", "over --http2"]);
    for id in &ids {
        let (status, got) =
            curl(&env, "--http2", &format!("/{SCHEDULER}/Get"), token, &json!({"id": id}).to_string(), &[]);
        assert_eq!((status, got["state"].as_str()), (200, Some("STATE_DELIVERED")), "{got}");
        assert_eq!(got["labels"], json!({"door": "json"}));
        assert!(got["delivered"]["deliveredAt"].is_string(), "{got}");
    }
    server.stop().await;
}

/// Every refusal is a Connect error in JSON under the HTTP status its code
/// maps to, with the field violations as details; the token and the
/// tenant's grant hold as over gRPC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_refusals_carry_the_code_the_status_and_the_fields() {
    let (_dir, (_broker, server, _pki), env) = crate::clients::server_with_tokens().await;
    let get = |name: &str| env.iter().find(|(n, _)| *n == name).unwrap().1.clone();
    let (topic, other) = (get("HOURGLASS_TEST_TOPIC"), get("HOURGLASS_TEST_OTHER_TOPIC"));
    let schedule = format!("/{SCHEDULER}/Schedule");
    let request = |topic: &str, id: &str| {
        json!({"message": {"topic": topic, "value": b64("x")}, "delay": "60s", "id": id}).to_string()
    };
    let token = Some("client-token");
    let refused = |http: &str, path: &str, token: Option<&str>, body: &str, extra: &[&str]| {
        let (status, error) = curl(&env, http, path, token, body, extra);
        (
            status,
            error["code"].as_str().unwrap_or_else(|| panic!("{path} {body}: no code in {error}")).to_owned(),
            error,
        )
    };
    for http in ["--http1.1", "--http2"] {
        let (status, code, _) = refused(http, &schedule, None, &request(&topic, "a"), &[]);
        assert_eq!((status, code.as_str()), (401, "unauthenticated"));
        let (status, code, _) = refused(http, &schedule, Some("not-a-token"), &request(&topic, "a"), &[]);
        assert_eq!((status, code.as_str()), (401, "unauthenticated"));
        // The other tenant's topic, with this tenant's token.
        let (status, code, error) = refused(http, &schedule, token, &request(&other, "a"), &[]);
        assert_eq!((status, code.as_str()), (403, "permission_denied"), "{error}");
        // And the other tenant's token on this one's topic.
        let (status, code, _) = refused(http, &schedule, Some("others-token"), &request(&topic, "a"), &[]);
        assert_eq!((status, code.as_str()), (403, "permission_denied"));

        let (status, code, error) = refused(http, &schedule, token, &request(&topic, "has space"), &[]);
        assert_eq!((status, code.as_str()), (400, "invalid_argument"), "{error}");
        let detail = &error["details"][0];
        assert_eq!(detail["type"], "google.rpc.BadRequest", "{error}");
        assert!(detail["value"].as_str().is_some_and(|v| !v.is_empty()), "{error}");
        assert_eq!(detail["debug"]["fieldViolations"][0]["field"], "id", "{error}");

        for (body, says) in [
            ("{\"message\": ", "EOF"),
            ("[]", "ScheduleRequest"),
            ("{\"mesage\": {}}", "mesage"),
            ("{\"delay\": \"soon\"}", "duration"),
            ("{\"deliverAt\": \"2030-01-01T00:00:00Z\", \"delay\": \"1s\"}", "due"),
        ] {
            let (status, code, error) = refused(http, &schedule, token, body, &[]);
            assert_eq!((status, code.as_str()), (400, "invalid_argument"), "{body}: {error}");
            assert!(error["message"].as_str().unwrap().contains(says), "{body}: {error}");
        }
        let (status, code, _) = refused(http, &format!("/{SCHEDULER}/Get"), token, "{\"id\": \"none\"}", &[]);
        assert_eq!((status, code.as_str()), (404, "not_found"));
        let (status, code, _) = refused(http, &format!("/{SCHEDULER}/Nothing"), token, "{}", &[]);
        assert_eq!((status, code.as_str()), (404, "unimplemented"));
        let (status, code, error) = refused(http, &format!("/{SCHEDULER}/ScheduleStream"), token, "{}", &[]);
        assert_eq!((status, code.as_str()), (501, "unimplemented"), "{error}");
        assert!(error["message"].as_str().unwrap().contains("gRPC-Web"), "{error}");
        let (status, code, _) =
            refused(http, &schedule, token, &request(&topic, "b"), &["-H", "Content-Type: text/plain"]);
        assert_eq!((status, code.as_str()), (415, "unimplemented"));
        let (status, code, _) =
            refused(http, &schedule, token, &request(&topic, "b"), &["-H", "Content-Encoding: br"]);
        assert_eq!((status, code.as_str()), (501, "unimplemented"));
        let (status, code, _) = refused(http, &schedule, token, "", &["-X", "GET"]);
        assert_eq!((status, code.as_str()), (405, "unimplemented"));
    }
    server.stop().await;
}

/// The OpenAPI document is served as it is checked in, to anyone (it
/// holds no tenant's data); the calls it lists need a token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_is_served_as_checked_in() {
    let (_dir, (_broker, server, _pki), env) = crate::clients::server_with_tokens().await;
    let get = |name: &str| env.iter().find(|(n, _)| *n == name).unwrap().1.clone();
    let out = tokio::task::block_in_place(|| {
        Command::new("curl")
            .args([
                "-sS",
                "--fail",
                "--cacert",
                &get("HOURGLASS_TEST_CA"),
                "--cert",
                &get("HOURGLASS_TEST_CERT"),
            ])
            .args(["--key", &get("HOURGLASS_TEST_KEY")])
            .arg(format!("{}/openapi.json", get("HOURGLASS_TEST_SERVER")))
            .output()
    })
    .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let checked_in = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/openapi.json")).unwrap();
    assert!(out.stdout == checked_in, "the served document differs from docs/openapi.json");
    server.stop().await;
}

/// schemathesis generates requests from the OpenAPI document (valid ones
/// and broken ones) and checks every answer: no 5xx, every status one the
/// document lists, every body of the documented shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_no_server_error_and_only_documented_answers() {
    let broker = Broker::start();
    let prefix = random_name("fuzz");
    let topic = format!("{prefix}.events");
    broker.create_topic(&topic, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!("[[token]]\nname = \"fuzz\"\ntoken = \"fuzz-token\"\ntopics = [\"{prefix}.*\"]\nadmin = \"tenant\"\n"),
    )
    .unwrap();
    let server = Hourglass::start(hourglass::config::Config {
        auth_tokens: Some(tokens),
        ..config(&broker, &dir.path().join("data"))
    })
    .await;
    let addr = server.addr;
    let workdir = dir.path().to_owned();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("schemathesis")
            .args(["run", &format!("http://{addr}/openapi.json")])
            .args(["--checks", "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"])
            .args(["--max-examples", "25", "--seed", "1", "--workers", "2", "--request-timeout", "20"])
            .args(["--suppress-health-check", "all", "--phases", "examples,coverage,fuzzing"])
            .args(["-H", "Authorization: Bearer fuzz-token", "--no-color"])
            // Where it writes its own files.
            .current_dir(&workdir)
            .output()
            .expect("schemathesis (bash deploy/local/install-deps.sh)")
    })
    .await
    .unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "schemathesis found failures:\n{said}");
    // Every call was tried, with many requests, and none failed a check.
    let cases = said
        .lines()
        .find_map(|line| line.trim().strip_suffix(" passed").and_then(|l| l.split_once(" generated, ")))
        .and_then(|(made, passed)| Some((made.parse::<u32>().ok()?, passed.parse::<u32>().ok()?)));
    assert!(said.contains("Tested: 25"), "{said}");
    assert!(cases.is_some_and(|(made, passed)| made == passed && made >= 500), "{said}");
    server.stop().await;
}
