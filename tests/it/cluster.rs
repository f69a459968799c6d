//! Cluster mode against a real broker: every change goes through the
//! schedule log, the store is a view of it, and a node that restarts or
//! loses its data dir neither loses nor re-sends what the log recorded.

use crate::common;

use std::{collections::HashMap, time::Duration};

use common::*;
use hourglass::{
    config::Config,
    proto::{self, CancelOutcome, State},
};
use rdkafka::{
    message::{Header, OwnedHeaders},
    producer::FutureRecord,
};
use tonic::Code;

const LOG_PARTITIONS: u32 = 3;

pub(crate) fn cluster_config(broker: &Broker, dir: &std::path::Path, log_topic: &str) -> Config {
    Config {
        cluster: true,
        cluster_key_file: Some(hourglass_testkit::cluster_key_file().unwrap()),
        log_topic: log_topic.to_owned(),
        log_partitions: LOG_PARTITIONS,
        ..config(broker, dir)
    }
}

fn with_id(topic: &str, id: &str, value: &str, delay: Duration) -> proto::ScheduleRequest {
    proto::ScheduleRequest { id: Some(id.to_owned()), ..request(topic, value, delay) }
}

async fn state_of(
    client: &mut proto::scheduler_client::SchedulerClient<tonic::transport::Channel>,
    id: &str,
) -> State {
    client
        .get(proto::GetRequest { id: id.to_owned(), ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .state()
}

/// Records of the log topic hourglass wrote itself, counted.
async fn logged_records(broker: &Broker, log_topic: &str) -> usize {
    let got = consume_async(broker, log_topic, usize::MAX, Duration::from_secs(3), Duration::ZERO).await;
    got.iter().filter(|r| r.headers.contains_key("hourglass-record")).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_node_cluster_answers_as_standalone_and_restores_from_the_log_alone() {
    let broker = Broker::start();
    let topic = random_name("orders");
    let log_topic = random_name("hourglass-log");
    broker.create_topic(&topic, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let server = Hourglass::start(cluster_config(&broker, dir.path(), &log_topic)).await;
    let mut client = server.client().await;

    let mut due = HashMap::new();
    for i in 0..30 {
        let id = format!("m-{i}");
        let reply = client.schedule(with_id(&topic, &id, &id, Duration::from_millis(1500))).await.unwrap();
        let reply = reply.into_inner();
        assert!(!reply.duplicate);
        due.insert(id, millis(&reply.deliver_at.unwrap()));
    }
    // A retry is recognised; the same id for another message is refused.
    let again = client.schedule(with_id(&topic, "m-0", "m-0", Duration::from_millis(1500))).await.unwrap();
    assert!(again.into_inner().duplicate);
    let other =
        client.schedule(with_id(&topic, "m-0", "other", Duration::from_millis(1500))).await.unwrap_err();
    assert_eq!(other.code(), Code::AlreadyExists, "{other:?}");
    // Cancel and reschedule, with their exact outcomes.
    let cancel = |id: &str| proto::CancelRequest { id: id.to_owned(), ..Default::default() };
    assert_eq!(client.cancel(cancel("m-1")).await.unwrap().into_inner().outcome(), CancelOutcome::Cancelled);
    assert_eq!(
        client.cancel(cancel("m-1")).await.unwrap().into_inner().outcome(),
        CancelOutcome::AlreadyCancelled
    );
    assert_eq!(client.cancel(cancel("nope")).await.unwrap().into_inner().outcome(), CancelOutcome::NotFound);
    let later = prost_types::Timestamp::from(std::time::SystemTime::now() + Duration::from_millis(2500));
    let moved = client
        .reschedule(proto::RescheduleRequest {
            id: "m-2".into(),
            due: Some(proto::reschedule_request::Due::DeliverAt(later)),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    due.insert("m-2".into(), millis(&moved.deliver_at.unwrap()));

    let got = consume_async(&broker, &topic, 29, Duration::from_secs(20), Duration::from_millis(1500)).await;
    assert_eq!(
        got.len(),
        29,
        "all but the cancelled one, once each: {:?}",
        got.iter().map(|r| r.id()).collect::<Vec<_>>()
    );
    for r in &got {
        assert_ne!(r.id(), "m-1", "a cancelled message is never delivered");
        assert!(r.timestamp_ms >= due[r.id()], "{} produced before it was due", r.id());
    }
    assert_eq!(state_of(&mut client, "m-0").await, State::Delivered);
    assert_eq!(state_of(&mut client, "m-1").await, State::Cancelled);
    assert_eq!(
        client.cancel(cancel("m-3")).await.unwrap().into_inner().outcome(),
        CancelOutcome::AlreadyDelivered
    );
    assert!(
        logged_records(&broker, &log_topic).await >= 33,
        "schedules, cancel, reschedule and settles are in the log"
    );
    // The node applied its own records from their acks, and each read
    // back since lay where its ack said, with the timestamp it said.
    assert!(hourglass::metrics::LOG_APPLIED_ON_ACK.get() > 0);
    assert_eq!(hourglass::metrics::LOG_ACK_MISMATCHES.get(), 0);
    server.stop().await;

    // A restart resumes from where its store applied to: nothing again.
    let server = Hourglass::start(cluster_config(&broker, dir.path(), &log_topic)).await;
    let mut client = server.client().await;
    assert_eq!(state_of(&mut client, "m-5").await, State::Delivered);
    client
        .schedule(with_id(&topic, "after-restart", "after-restart", Duration::from_millis(200)))
        .await
        .unwrap();
    let got = consume_async(&broker, &topic, 30, Duration::from_secs(20), Duration::from_millis(1500)).await;
    assert_eq!(got.len(), 30, "only the new one is added");
    server.stop().await;

    // The data dir lost: every shard is rebuilt from the log, and what the
    // log recorded as delivered or cancelled does not go out again.
    drop(dir);
    let dir = tempfile::tempdir().unwrap();
    let server = Hourglass::start(cluster_config(&broker, dir.path(), &log_topic)).await;
    let mut client = server.client().await;
    assert_eq!(state_of(&mut client, "m-7").await, State::Delivered);
    assert_eq!(state_of(&mut client, "m-1").await, State::Cancelled);
    assert_eq!(state_of(&mut client, "after-restart").await, State::Delivered);
    let again = client.schedule(with_id(&topic, "m-0", "m-0", Duration::from_millis(1500))).await.unwrap();
    assert!(again.into_inner().duplicate, "ids are remembered across the rebuild");
    let got = consume_async(&broker, &topic, 31, Duration::from_secs(5), Duration::from_millis(1500)).await;
    assert_eq!(got.len(), 30, "nothing is delivered twice after the rebuild");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_native_example_schedules_cancels_and_is_refused_as_documented() {
    let broker = Broker::start();
    let topic = random_name("reminders");
    let log_topic = random_name("hourglass-log");
    broker.create_topic(&topic, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let server = Hourglass::start(cluster_config(&broker, dir.path(), &log_topic)).await;
    let mut client = server.client().await;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/python/native_schedule.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .args([
            "--brokers",
            broker.addr(),
            "--ingress-topic",
            &format!("{log_topic}-ingress"),
            "--topic",
            &topic,
            "--id",
            "reminder-42",
        ])
        .args(["--delay-ms", "300"])
        .output()
        .expect("python3 with confluent-kafka (bash deploy/local/install-deps.sh)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.lines().count(), 4, "{stdout}");
    assert!(!stdout.contains("\"error\": \""), "every record was taken: {stdout}");

    let got = consume_async(&broker, &topic, 1, Duration::from_secs(20), Duration::from_millis(1500)).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].id(), "reminder-42");
    assert_eq!(got[0].key.as_deref(), Some(&b"teacher-7"[..]));
    assert_eq!(got[0].header("trace-id"), Some("abc123"));
    assert_eq!(state_of(&mut client, "reminder-42").await, State::Delivered);
    assert_eq!(state_of(&mut client, "reminder-42-later").await, State::Cancelled);
    let bad = client
        .get(proto::GetRequest { id: "reminder-42-bad".into(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::NotFound, "refused, it parked nothing: {bad:?}");
    server.stop().await;
}

/// Retention in cluster mode goes through the log: once it ends, the
/// owner appends a tombstone for each message and then for each chunk of
/// deliveries, so that every copy of the shard forgets them and Kafka's
/// compaction drops them from the log; a store rebuilt from the log does
/// not bring them back, and what is still pending stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_tombstones_messages_and_their_chunks_in_the_log() {
    let broker = Broker::start();
    let topic = random_name("orders");
    let log_topic = random_name("hourglass-log");
    broker.create_topic(&topic, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let short = |dir: &std::path::Path| Config {
        retention: Duration::from_secs(1).into(),
        ..cluster_config(&broker, dir, &log_topic)
    };
    let server = Hourglass::start(short(dir.path())).await;
    let mut client = server.client().await;
    let ids: Vec<String> = (0..20).map(|i| format!("r-{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        // The first is cancelled before it is due.
        let delay = if i == 0 { Duration::from_secs(3600) } else { Duration::from_millis(200) };
        client.schedule(with_id(&topic, id, id, delay)).await.unwrap();
    }
    client.schedule(with_id(&topic, "pending", "pending", Duration::from_secs(3600))).await.unwrap();
    client.cancel(proto::CancelRequest { id: "r-0".into(), ..Default::default() }).await.unwrap();
    let got = consume_async(&broker, &topic, 19, Duration::from_secs(20), Duration::ZERO).await;
    assert_eq!(got.len(), 19);

    // Upkeep runs every 10 s: forgotten within two rounds.
    let started = std::time::Instant::now();
    for id in &ids {
        loop {
            match client.get(proto::GetRequest { id: id.clone(), ..Default::default() }).await {
                Err(status) if status.code() == Code::NotFound => break,
                Ok(_) => {
                    assert!(started.elapsed() < Duration::from_secs(40), "{id} not forgotten");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(status) => panic!("{id}: {status:?}"),
            }
        }
    }
    assert_eq!(state_of(&mut client, "pending").await, State::Pending);
    let log = consume_async(&broker, &log_topic, usize::MAX, Duration::from_secs(3), Duration::ZERO).await;
    let tombstones: Vec<&Received> =
        log.iter().filter(|r| r.headers.contains_key("hourglass-record") && r.value.is_empty()).collect();
    for id in &ids {
        assert!(
            tombstones.iter().any(|r| r.key.as_deref() == Some(id.as_bytes())),
            "no tombstone for {id} in the log"
        );
    }
    let chunk = |r: &&&Received| r.key.as_ref().is_some_and(|k| k.first() == Some(&1));
    let chunks = log
        .iter()
        .filter(|r| {
            r.headers.contains_key("hourglass-record")
                && r.key.as_ref().is_some_and(|k| k.first() == Some(&1))
                && !r.value.is_empty()
        })
        .count();
    let chunk_tombstones = tombstones.iter().filter(chunk).count();
    assert!(chunks > 0, "deliveries are recorded by chunk");
    // A chunk goes once its messages are forgotten; the latest may still
    // wait for the next round.
    let wait_chunks = std::time::Instant::now();
    let mut gone = chunk_tombstones;
    while gone < chunks && wait_chunks.elapsed() < Duration::from_secs(25) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let log =
            consume_async(&broker, &log_topic, usize::MAX, Duration::from_secs(3), Duration::ZERO).await;
        gone = log
            .iter()
            .filter(|r| r.headers.contains_key("hourglass-record") && r.value.is_empty())
            .filter(|r| r.key.as_ref().is_some_and(|k| k.first() == Some(&1)))
            .count();
    }
    assert_eq!(gone, chunks, "every chunk of deliveries is tombstoned once its messages are forgotten");
    server.stop().await;

    // Rebuilt from the log: the forgotten stay forgotten, the pending stays.
    drop(dir);
    let dir = tempfile::tempdir().unwrap();
    let server = Hourglass::start(short(dir.path())).await;
    let mut client = server.client().await;
    for id in &ids {
        let status =
            client.get(proto::GetRequest { id: id.clone(), ..Default::default() }).await.unwrap_err();
        assert_eq!(status.code(), Code::NotFound, "{id} came back in the rebuild");
    }
    assert_eq!(state_of(&mut client, "pending").await, State::Pending);
    server.stop().await;
}

/// A node applies its own changes from their acks only behind every record
/// before them: here Kafka-native records, taken from the ingress topic,
/// are appended between them in the same partitions, and each must still
/// be applied, once, in its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_interleaved_with_native_records_are_all_applied_in_their_place() {
    const EACH: usize = 300;
    let broker = Broker::start();
    let topic = random_name("interleaved");
    let log_topic = random_name("hourglass-log");
    broker.create_topic(&topic, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let server = Hourglass::start(cluster_config(&broker, dir.path(), &log_topic)).await;
    let applied_on_ack = hourglass::metrics::LOG_APPLIED_ON_ACK.get();
    let producer = native_producer(&broker);
    let native = {
        let (topic, ingress) = (topic.clone(), format!("{log_topic}-ingress"));
        tokio::spawn(async move {
            for i in 0..EACH {
                let headers = OwnedHeaders::new()
                    .insert(Header { key: "hourglass-topic", value: Some(topic.as_bytes()) })
                    .insert(Header { key: "hourglass-delay", value: Some(&b"1h"[..]) });
                let key = format!("n-{i}");
                let record =
                    FutureRecord::<str, str>::to(&ingress).key(&key).payload("native").headers(headers);
                producer.send(record, Duration::from_secs(10)).await.unwrap();
            }
        })
    };
    let mut callers = Vec::new();
    for c in 0..4 {
        let (mut client, topic) = (server.client().await, topic.clone());
        callers.push(tokio::spawn(async move {
            for i in (c..EACH).step_by(4) {
                let id = format!("g-{i}");
                let reply =
                    client.schedule(with_id(&topic, &id, "grpc", Duration::from_secs(3600))).await.unwrap();
                assert!(!reply.into_inner().duplicate, "{id} was new");
            }
        }));
    }
    native.await.unwrap();
    for caller in callers {
        caller.await.unwrap();
    }

    let mut client = server.client().await;
    let ids = (0..EACH).flat_map(|i| [format!("n-{i}"), format!("g-{i}")]);
    for id in ids.clone() {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            match client.get(proto::GetRequest { id: id.clone(), ..Default::default() }).await {
                Ok(got) => {
                    assert_eq!(got.into_inner().state(), State::Pending, "{id}");
                    break;
                }
                Err(e) if e.code() == Code::NotFound && tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Err(e) => panic!("{id}: {e:?}"),
            }
        }
    }
    // Changes to both kinds, each with its exact outcome.
    for (i, id) in ids.enumerate().filter(|(i, _)| i % 3 == 0) {
        let outcome = client
            .cancel(proto::CancelRequest { id: id.clone(), ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(outcome.outcome(), CancelOutcome::Cancelled, "{id} ({i})");
        assert_eq!(state_of(&mut client, &id).await, State::Cancelled, "{id}");
    }
    assert!(
        hourglass::metrics::LOG_APPLIED_ON_ACK.get() > applied_on_ack,
        "its changes were applied from acks"
    );
    assert_eq!(hourglass::metrics::LOG_ACK_MISMATCHES.get(), 0);
    server.stop().await;
}
