//! A trace across the delay, end to end: Schedule calls with a W3C
//! `traceparent` (over gRPC, and over HTTP/JSON), the records a Kafka
//! consumer reads, and the spans a real OTLP receiver (opentelemetry-proto
//! and grpcio, tests/otlp/receiver.py) is sent by the real binary.

use crate::common;

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use common::{serve::Serve, *};
use serde_json::Value;

/// The receiver, and the spans it prints, one JSON object a line.
struct Receiver {
    child: std::process::Child,
    spans: mpsc::Receiver<Value>,
    port: u16,
}

impl Receiver {
    fn start() -> Receiver {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/otlp/receiver.py");
        let mut child = Command::new("python3")
            .arg(script)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 with grpcio and opentelemetry-proto (bash deploy/local/install-deps.sh)");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().expect("the receiver says where it listens").unwrap();
        let port = first.strip_prefix("listening ").and_then(|p| p.parse().ok()).expect(&first);
        let (tx, spans) = mpsc::channel();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let _ = tx.send(serde_json::from_str(&line).unwrap());
            }
        });
        Receiver { child, spans, port }
    }

    /// The spans received until `enough` says they are, or `within`.
    fn until(&self, seen: &mut Vec<Value>, within: Duration, enough: impl Fn(&[Value]) -> bool) {
        let deadline = Instant::now() + within;
        while !enough(seen) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.spans.recv_timeout(left) {
                Ok(span) => seen.push(span),
                Err(_) => panic!("not enough spans within {within:?}: {seen:#?}"),
            }
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn traceparent(trace: &str, span: &str, flags: &str) -> String {
    format!("00-{trace}-{span}-{flags}")
}

/// (trace id, parent span id, flags) of a `traceparent`.
fn parts(header: &str) -> (String, String, String) {
    let fields: Vec<_> = header.split('-').collect();
    assert_eq!(fields.len(), 4, "{header}");
    (fields[1].to_owned(), fields[2].to_owned(), fields[3].to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedules_trace_reaches_the_delivered_record_and_the_otlp_receiver_gets_both_spans_linked() {
    let broker = Broker::start();
    let topic = random_name("traced");
    broker.create_topic(&topic, 1).await;
    let receiver = Receiver::start();
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("http://127.0.0.1:{}", receiver.port);
    let server = Serve::start_with(&broker, dir.path(), &["--otlp-endpoint", &endpoint]);
    let mut client = server.client().await;

    let caller_span = "b7ad6b7169203331";
    let (grpc_trace, json_trace, unsampled_trace) = (
        "0af7651916cd43dd8448eb211c80319c",
        "4bf92f3577b34da6a3ce929d0e0e4736",
        "5bf92f3577b34da6a3ce929d0e0e4737",
    );
    let due = now_ms() + 300;
    let traced = |id: &str, trace: &str, flags: &str| {
        let mut request = tonic::Request::new(request_at(&topic, id, due));
        let metadata = request.metadata_mut();
        metadata.insert("traceparent", traceparent(trace, caller_span, flags).parse().unwrap());
        metadata.insert("tracestate", "vendor=opaque".parse().unwrap());
        request
    };
    client.schedule(traced("over-grpc", grpc_trace, "01")).await.unwrap();
    // A retry under another trace is the same request: a duplicate, not a
    // conflict.
    let again = client
        .schedule(traced("over-grpc", "7bf92f3577b34da6a3ce929d0e0e4739", "01"))
        .await
        .unwrap()
        .into_inner();
    assert!(again.duplicate, "{again:?}");
    client.schedule(traced("not-sampled", unsampled_trace, "00")).await.unwrap();
    client.schedule(request_at(&topic, "untraced", now_ms() + 300)).await.unwrap();
    // A stream's context is kept on each of its records.
    let stream_trace = "6bf92f3577b34da6a3ce929d0e0e4738";
    let mut streamed =
        tonic::Request::new(tokio_stream::iter([request_at(&topic, "over-a-stream", now_ms() + 300)]));
    streamed
        .metadata_mut()
        .insert("traceparent", traceparent(stream_trace, caller_span, "01").parse().unwrap());
    let mut answers = client.schedule_stream(streamed).await.unwrap().into_inner();
    let answer = answers.message().await.unwrap().unwrap();
    assert!(
        matches!(answer.result, Some(hourglass::proto::schedule_result::Result::Scheduled(_))),
        "{answer:?}"
    );
    // The HTTP door carries the header as gRPC metadata.
    let body = serde_json::json!({
        "message": {"topic": topic, "value": "aGVsbG8="},
        "delay": "0.3s",
        "id": "over-json",
    });
    let out = tokio::task::block_in_place(|| {
        Command::new("curl")
            .args(["-sS", "--fail-with-body", "-H", "Content-Type: application/json"])
            .args(["-H", &format!("traceparent: {}", traceparent(json_trace, caller_span, "01"))])
            .args(["--data-binary", &body.to_string()])
            .arg(format!("{}/hourglass.v1.Scheduler/Schedule", server.url()))
            .output()
            .unwrap()
    });
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));

    let received = tokio::task::block_in_place(|| {
        consume(broker.addr(), &topic, 5, Duration::from_secs(30), Duration::from_millis(500))
    });
    assert_eq!(received.len(), 5);
    let record = |id: &str| received.iter().find(|r| r.id() == id).unwrap_or_else(|| panic!("{id}"));
    assert_eq!(record("untraced").header("traceparent"), None, "nothing is added to an untraced record");
    assert_eq!(record("over-grpc").header("tracestate"), Some("vendor=opaque"));
    let (trace, not_sent, flags) = parts(record("not-sampled").header("traceparent").unwrap());
    assert_eq!((trace.as_str(), flags.as_str()), (unsampled_trace, "00"));
    assert_ne!(not_sent, caller_span);

    let mut spans = Vec::new();
    for (id, trace) in [("over-grpc", grpc_trace), ("over-json", json_trace), ("over-a-stream", stream_trace)]
    {
        // The record carries the scheduling request's trace, under the
        // dispatch's span.
        let (record_trace, dispatch_span, flags) = parts(record(id).header("traceparent").unwrap());
        assert_eq!((record_trace.as_str(), flags.as_str()), (trace, "01"), "{id}");
        let in_trace = |spans: &[Value]| spans.iter().filter(|s| s["trace_id"] == trace).count() >= 2;
        tokio::task::block_in_place(|| receiver.until(&mut spans, Duration::from_secs(30), in_trace));
        let find = |kind: i64| {
            spans
                .iter()
                .find(|s| s["trace_id"] == trace && s["kind"] == kind)
                .unwrap_or_else(|| panic!("{spans:#?}"))
        };
        let (schedule, dispatch) = (find(2), find(4));
        assert_eq!(schedule["service"], "hourglass");
        let call = if id == "over-a-stream" { "ScheduleStream" } else { "Schedule" };
        assert_eq!(schedule["name"], format!("hourglass.v1.Scheduler/{call}"));
        assert_eq!(schedule["parent_span_id"], caller_span, "the call's span is the caller's child");
        assert_eq!(dispatch["name"], format!("send {topic}"));
        assert_eq!(dispatch["span_id"], dispatch_span.as_str(), "the record names the dispatch span");
        assert_eq!(dispatch["parent_span_id"], schedule["span_id"]);
        assert_eq!(
            dispatch["links"][0]["span_id"], schedule["span_id"],
            "the dispatch links to the scheduling"
        );
        assert_eq!(dispatch["attributes"]["messaging.message.id"], id);
        assert!(dispatch["attributes"]["hourglass.late_ms"].as_i64().is_some(), "{dispatch}");
    }
    // Stopped, the server sends what it holds: nothing of the unsampled
    // trace is among it.
    assert!(server.terminate().success());
    tokio::time::sleep(Duration::from_millis(500)).await;
    spans.extend(receiver.spans.try_iter());
    assert!(!spans.iter().any(|s| s["trace_id"] == unsampled_trace), "{spans:#?}");
}
