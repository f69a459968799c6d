//! End to end against a real broker and a real store: what is scheduled
//! arrives on its topic, partition and key, with its headers, never before
//! it is due; and the API's answers match what happened.

use crate::common;

use std::time::Duration;

use common::*;
use hourglass::proto::{self, CancelOutcome, State, scheduler_client::SchedulerClient};
use tonic::{Code, transport::Channel};

#[test]
fn murmur2_matches_kafka_test_vectors() {
    // From Kafka's UtilsTest.testMurmur2.
    assert_eq!(murmur2(b"21"), -973932308);
    assert_eq!(murmur2(b"foobar"), -790332482);
    assert_eq!(murmur2(b"a-little-bit-long-string"), -985981536);
    assert_eq!(murmur2(b"a-little-bit-longer-string"), -1486304829);
    assert_eq!(murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8"), -58897971);
    assert_eq!(murmur2(b"abc"), 479470107);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_arrive_on_topic_partition_and_key_with_headers_not_before_due() {
    // Get shows each delivered body: kept.
    let TestBed { broker, topic, dir: _dir, server } =
        TestBed::start_with("orders", 4, |c| c.keep_delivered_bodies = true).await;
    let mut client = server.client().await;

    let mut keyed = request(&topic, "keyed", Duration::from_millis(800));
    keyed.message.as_mut().unwrap().key = Some(b"order-42".to_vec());
    keyed.message.as_mut().unwrap().headers = vec![
        proto::Header { key: "trace".into(), value: b"t-1".to_vec() },
        proto::Header { key: "empty".into(), value: vec![] },
    ];
    let mut pinned = request(&topic, "pinned", Duration::from_millis(1200));
    pinned.message.as_mut().unwrap().partition = Some(3);
    pinned.message.as_mut().unwrap().key = Some(b"order-42".to_vec());
    let now_ms = chrono::Utc::now().timestamp_millis();
    let mut past = request(&topic, "past", Duration::ZERO);
    past.due = Some(proto::schedule_request::Due::DeliverAt(prost_types::Timestamp {
        seconds: now_ms / 1000 - 3600,
        nanos: 0,
    }));

    let mut due = std::collections::HashMap::new();
    for r in [keyed, pinned, past] {
        let value = String::from_utf8(r.message.as_ref().unwrap().value.clone()).unwrap();
        let reply = client.schedule(r).await.unwrap().into_inner();
        assert!(!reply.duplicate);
        due.insert(value, (reply.id, millis(&reply.deliver_at.unwrap())));
    }

    let got = consume_async(&broker, &topic, 3, Duration::from_secs(20), Duration::from_millis(500)).await;
    assert_eq!(got.len(), 3, "exactly the three records arrive: {got:?}");
    for r in &got {
        let value = String::from_utf8(r.value.clone()).unwrap();
        let (id, due_ms) = &due[&value];
        assert_eq!(r.id(), id);
        assert_eq!(r.header("hourglass-due-ms"), Some(due_ms.to_string().as_str()));
        assert!(r.timestamp_ms >= *due_ms, "{value} produced at {} before due {due_ms}", r.timestamp_ms);
        match value.as_str() {
            "keyed" => {
                assert_eq!(r.key.as_deref(), Some(&b"order-42"[..]));
                assert_eq!(r.partition, java_partition(b"order-42", 4), "murmur2 like the Java client");
                assert_eq!(r.header("trace"), Some("t-1"));
                assert_eq!(r.header("empty"), Some(""));
            }
            "pinned" => assert_eq!(r.partition, 3, "explicit partition wins over the key"),
            "past" => assert!(r.timestamp_ms - due_ms >= 3_600_000 - 60_000, "past due is sent at once"),
            other => panic!("unexpected record {other}"),
        }
        // Get reports where it landed.
        let got = client
            .get(proto::GetRequest { id: id.clone(), ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(got.state(), State::Delivered);
        let Some(proto::get_response::Settlement::Delivered(d)) = got.settlement else {
            panic!("delivered without a delivery record: {got:?}");
        };
        assert_eq!((d.partition, d.offset), (r.partition, r.offset));
        assert!(millis(&d.delivered_at.unwrap()) >= *due_ms);
        assert_eq!(got.message.unwrap().value, r.value);
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_statuses_and_store_nothing() {
    let TestBed { broker, topic, dir: _dir, server } = TestBed::start("bad", 2).await;
    let mut client = server.client().await;

    let unknown = client.schedule(request("no-such-topic", "v", Duration::ZERO)).await.unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound, "{unknown:?}");
    assert!(unknown.message().contains("no-such-topic"), "{}", unknown.message());

    let mut cases: Vec<(proto::ScheduleRequest, &str)> = Vec::new();
    let mut r = request(&topic, "", Duration::ZERO);
    r.message.as_mut().unwrap().value.clear();
    cases.push((r, "value"));
    let mut r = request(&topic, "v", Duration::ZERO);
    r.message.as_mut().unwrap().partition = Some(2);
    cases.push((r, "2 partition"));
    cases.push((request(&topic, "v", Duration::from_secs(10 * 366 * 24 * 3600)), "max-delay"));
    let mut r = request(&topic, "v", Duration::ZERO);
    r.due = None;
    cases.push((r, "deliver_at"));
    let mut r = request(&topic, "v", Duration::ZERO);
    r.message.as_mut().unwrap().topic = "bad topic!".into();
    cases.push((r, "topic"));
    let mut r = request(&topic, "v", Duration::ZERO);
    r.message.as_mut().unwrap().headers = vec![proto::Header { key: "hourglass-id".into(), value: vec![] }];
    cases.push((r, "reserved"));
    let mut r = request(&topic, "v", Duration::ZERO);
    r.id = Some("has space".into());
    cases.push((r, "id"));
    for (r, needle) in cases {
        let status = client.schedule(r).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(needle), "{needle:?} not in {:?}", status.message());
    }
    // Oversized requests are refused from their length prefix, unread.
    let big = request(&topic, &"x".repeat(2 << 20), Duration::ZERO);
    let status = client.schedule(big).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("--max-message-bytes"), "the limit is named: {}", status.message());

    let status = client.get(proto::GetRequest { id: "nope".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    let got = consume_async(&broker, &topic, 1, Duration::from_secs(2), Duration::ZERO).await;
    assert!(got.is_empty(), "nothing invalid was delivered: {got:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_request_is_answered_once_and_delivered_once() {
    let TestBed { broker, topic, dir: _dir, server } = TestBed::start("idem", 1).await;
    let mut client = server.client().await;

    let mut r = request(&topic, "once", Duration::from_secs(2));
    r.id = Some("order-7:cancel".into());
    let first = client.schedule(r.clone()).await.unwrap().into_inner();
    assert_eq!(first.id, "order-7:cancel");
    assert!(!first.duplicate);
    // A client retrying later with the same relative delay gets the original due time.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let again = client.schedule(r.clone()).await.unwrap().into_inner();
    assert!(again.duplicate);
    assert_eq!(again.deliver_at, first.deliver_at);
    // Concurrent retries all agree.
    let retries = (0..50).map(|_| {
        let (mut c, r) = (client.clone(), r.clone());
        tokio::spawn(async move { c.schedule(r).await.unwrap().into_inner() })
    });
    for retry in retries {
        assert_eq!(retry.await.unwrap().deliver_at, first.deliver_at);
    }
    // The same id with a different message is a conflict.
    let mut other = r.clone();
    other.message.as_mut().unwrap().value = b"different".to_vec();
    let status = client.schedule(other).await.unwrap_err();
    assert_eq!(status.code(), Code::AlreadyExists);

    let got = consume_async(&broker, &topic, 1, Duration::from_secs(15), Duration::from_secs(2)).await;
    assert_eq!(got.len(), 1, "delivered exactly once: {got:?}");
    assert_eq!(got[0].value, b"once");
    // Still remembered after delivery.
    let after = client.schedule(r).await.unwrap().into_inner();
    assert!(after.duplicate);
    server.stop().await;
}

/// Once delivered and quiet, a message keeps what Get and a retry need and
/// drops its body; with --keep-delivered-bodies it keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivered_message_drops_its_body_and_is_still_known_by_get_and_retries() {
    for keep in [false, true] {
        let TestBed { broker, topic, dir: _dir, server } =
            TestBed::start_with("shed", 1, |c| c.keep_delivered_bodies = keep).await;
        let mut client = server.client().await;
        let mut r = request(&topic, "the body", Duration::from_millis(500));
        r.id = Some("invoice-9:remind".into());
        r.labels = [("customer".to_owned(), "c-9".to_owned())].into();
        let message = r.message.as_mut().unwrap();
        message.key = Some(b"invoice-9".to_vec());
        message.headers = vec![proto::Header { key: "source".into(), value: b"billing".to_vec() }];
        client.schedule(r.clone()).await.unwrap();
        let got = consume_async(&broker, &topic, 1, Duration::from_secs(15), Duration::ZERO).await;
        assert_eq!(got[0].value, b"the body");

        let get = || {
            let mut client = client.clone();
            async move {
                let id = "invoice-9:remind".to_owned();
                client.get(proto::GetRequest { id, ..Default::default() }).await.unwrap().into_inner()
            }
        };
        // The store goes quiet a round (10 s) after the delivery, and then
        // drops what it delivered: kept, the body is still there well after.
        let (started, within) = (std::time::Instant::now(), Duration::from_secs(if keep { 25 } else { 40 }));
        let mut m = get().await;
        while !m.body_dropped && started.elapsed() < within {
            tokio::time::sleep(Duration::from_millis(500)).await;
            m = get().await;
        }
        assert_eq!(m.state(), State::Delivered);
        assert!(matches!(m.settlement, Some(proto::get_response::Settlement::Delivered(_))));
        assert_eq!(m.labels.get("customer").map(String::as_str), Some("c-9"));
        let kept = m.message.unwrap();
        assert_eq!(kept.topic, topic);
        if keep {
            assert!(!m.body_dropped, "kept for {:?}", started.elapsed());
            assert_eq!((kept.key.as_deref(), &kept.value[..]), (Some(&b"invoice-9"[..]), &b"the body"[..]));
            assert_eq!(kept.headers.len(), 1);
        } else {
            assert!(m.body_dropped, "not dropped within {:?}", started.elapsed());
            assert_eq!((kept.key, kept.value, kept.headers.len()), (None, vec![], 0));
        }
        // Retried, it is the same request; changed, it is another.
        assert!(client.schedule(r.clone()).await.unwrap().into_inner().duplicate, "keep {keep}");
        let mut other = r.clone();
        other.message.as_mut().unwrap().headers[0].value = b"sales".to_vec();
        assert_eq!(client.schedule(other).await.unwrap_err().code(), Code::AlreadyExists, "keep {keep}");
        server.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_reports_what_happened() {
    let TestBed { broker, topic, dir: _dir, server } = TestBed::start("cancel", 1).await;
    let mut client = server.client().await;

    let later =
        client.schedule(request(&topic, "later", Duration::from_millis(1500))).await.unwrap().into_inner();
    let now = client.schedule(request(&topic, "now", Duration::ZERO)).await.unwrap().into_inner();
    let got = consume_async(&broker, &topic, 1, Duration::from_secs(10), Duration::ZERO).await;
    assert_eq!(got[0].value, b"now");

    let cancel = |id: &str| proto::CancelRequest { id: id.to_owned(), ..Default::default() };
    let outcome = |r: proto::CancelResponse| r.outcome();
    assert_eq!(
        outcome(client.cancel(cancel(&later.id)).await.unwrap().into_inner()),
        CancelOutcome::Cancelled
    );
    assert_eq!(
        outcome(client.cancel(cancel(&later.id)).await.unwrap().into_inner()),
        CancelOutcome::AlreadyCancelled
    );
    assert_eq!(
        outcome(client.cancel(cancel(&now.id)).await.unwrap().into_inner()),
        CancelOutcome::AlreadyDelivered
    );
    assert_eq!(
        outcome(client.cancel(cancel("never-was")).await.unwrap().into_inner()),
        CancelOutcome::NotFound
    );
    let got = client
        .get(proto::GetRequest { id: later.id.clone(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.state(), State::Cancelled);

    let got = consume_async(&broker, &topic, 2, Duration::from_secs(4), Duration::ZERO).await;
    assert_eq!(got.len(), 1, "the cancelled message never arrives: {got:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_racing_delivery_is_one_or_the_other() {
    let TestBed { broker, topic: _, dir: _dir, server } = TestBed::start("race", 2).await;
    let client = server.client().await;
    // On a loaded machine every cancel may land before the first delivery
    // or after the last; then the round is run again, on a topic of its
    // own, until the two meet.
    for round in 1..=4 {
        let topic = random_name("race");
        broker.create_topic(&topic, 2).await;
        // Longer each round: scheduling must be over before the first is due.
        let lead = Duration::from_secs(3 * round);
        let (cancelled, delivered) = cancel_while_due(&broker, &client, &topic, lead).await;
        eprintln!("race, round {round}: {cancelled} cancelled, {delivered} delivered");
        if cancelled > 0 && delivered > 0 {
            server.stop().await;
            return;
        }
    }
    panic!("in four rounds the cancels never met the deliveries");
}

/// Schedules 300 messages due one every 5 ms over 1.5 s, cancels them all
/// at once early in the window (some are gone, some far off, many fall due
/// as the cancels land), and checks that each is one or the other: every
/// `ALREADY_DELIVERED` once on the topic, no `CANCELLED` there. How many of
/// each; none of either if scheduling took longer than `lead` (a loaded
/// machine), so that the round is run again.
async fn cancel_while_due(
    broker: &Broker,
    client: &SchedulerClient<Channel>,
    topic: &str,
    lead: Duration,
) -> (usize, usize) {
    const N: u64 = 300;
    let start = std::time::SystemTime::now() + lead;
    let scheduling = (0..N).map(|i| {
        let mut r = request(topic, &format!("{topic}-{i}"), Duration::ZERO);
        let due = prost_types::Timestamp::from(start + Duration::from_millis(5 * i));
        r.due = Some(proto::schedule_request::Due::DeliverAt(due));
        let mut c = client.clone();
        tokio::spawn(async move { c.schedule(r).await.unwrap().into_inner().id })
    });
    let mut ids = Vec::new();
    for s in scheduling {
        ids.push(s.await.unwrap());
    }
    let middle = start + Duration::from_millis(200);
    if std::time::SystemTime::now() >= start {
        eprintln!("scheduling took longer than the lead time of {lead:?} on this machine");
        return (0, 0);
    }
    tokio::time::sleep(middle.duration_since(std::time::SystemTime::now()).unwrap()).await;
    let cancels = ids.iter().map(|id| {
        let (mut c, id) = (client.clone(), id.clone());
        tokio::spawn(async move {
            let outcome = c
                .cancel(proto::CancelRequest { id: id.clone(), ..Default::default() })
                .await
                .unwrap()
                .into_inner()
                .outcome();
            (id, outcome)
        })
    });
    let mut cancelled = std::collections::HashSet::new();
    let mut delivered = std::collections::HashSet::new();
    for c in cancels {
        match c.await.unwrap() {
            (id, CancelOutcome::Cancelled) => assert!(cancelled.insert(id)),
            (id, CancelOutcome::AlreadyDelivered) => assert!(delivered.insert(id)),
            (id, other) => panic!("{id}: unexpected {other:?}"),
        }
    }
    let got =
        consume_async(broker, topic, delivered.len(), Duration::from_secs(15), Duration::from_secs(2)).await;
    let mut seen = std::collections::HashSet::new();
    for r in &got {
        assert!(seen.insert(r.id().to_owned()), "{} delivered twice", r.id());
        assert!(!cancelled.contains(r.id()), "{} was reported cancelled but was delivered", r.id());
    }
    assert_eq!(seen, delivered, "every 'already delivered' is on the topic, and nothing else");
    (cancelled.len(), delivered.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reschedule_moves_a_pending_message_and_refuses_settled_ones() {
    let TestBed { broker, topic, dir: _dir, server } = TestBed::start("move", 1).await;
    let mut client = server.client().await;

    let far =
        client.schedule(request(&topic, "moved", Duration::from_secs(3600))).await.unwrap().into_inner();
    let soon = std::time::SystemTime::now() + Duration::from_millis(700);
    let soon_ts = prost_types::Timestamp::from(soon);
    let moved = client
        .reschedule(proto::RescheduleRequest {
            id: far.id.clone(),
            due: Some(proto::reschedule_request::Due::DeliverAt(soon_ts)),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let new_due = millis(&moved.deliver_at.unwrap());
    let got = consume_async(&broker, &topic, 1, Duration::from_secs(10), Duration::ZERO).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id(), far.id);
    assert!(got[0].timestamp_ms >= new_due);
    assert_eq!(got[0].header("hourglass-due-ms"), Some(new_due.to_string().as_str()));

    let again = client
        .reschedule(proto::RescheduleRequest {
            id: far.id.clone(),
            due: Some(proto::reschedule_request::Due::Delay(prost_types::Duration { seconds: 60, nanos: 0 })),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(again.code(), Code::FailedPrecondition);
    assert!(again.message().contains("delivered"), "{}", again.message());
    let missing = client
        .reschedule(proto::RescheduleRequest {
            id: "nope".into(),
            due: Some(proto::reschedule_request::Due::Delay(prost_types::Duration { seconds: 1, nanos: 0 })),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_restart_keeps_pending_messages() {
    let TestBed { broker, topic, dir, server } = TestBed::start("restart", 1).await;
    let mut client = server.client().await;
    let mut ids = std::collections::HashSet::new();
    for i in 0..20 {
        let r = client.schedule(request(&topic, &format!("r{i}"), Duration::from_secs(2))).await.unwrap();
        ids.insert(r.into_inner().id);
    }
    server.stop().await;

    let server = Hourglass::start(config(&broker, dir.path())).await;
    let mut client = server.client().await;
    let any = ids.iter().next().unwrap().clone();
    let pending = client.get(proto::GetRequest { id: any, ..Default::default() }).await.unwrap().into_inner();
    assert_eq!(pending.state(), State::Pending, "still pending after restart");
    let got = consume_async(&broker, &topic, 20, Duration::from_secs(15), Duration::from_secs(1)).await;
    let seen: std::collections::HashSet<_> = got.iter().map(|r| r.id().to_owned()).collect();
    assert_eq!(got.len(), 20, "no duplicates");
    assert_eq!(seen, ids);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_health_are_served() {
    let TestBed { broker, topic, dir: _dir, server } = TestBed::start("obs", 1).await;
    let mut client = server.client().await;
    client.schedule(request(&topic, "m", Duration::ZERO)).await.unwrap();
    consume_async(&broker, &topic, 1, Duration::from_secs(10), Duration::ZERO).await;

    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let status = health
        .check(tonic_health::pb::HealthCheckRequest { service: "hourglass.v1.Scheduler".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.status(), tonic_health::pb::health_check_response::ServingStatus::Serving);

    let body = http_get(server.metrics_addr, "/metrics").await;
    for series in [
        "hourglass_messages_scheduled_total",
        "hourglass_messages_delivered_total",
        "hourglass_messages_pending",
        "hourglass_dispatch_lateness_seconds_bucket",
        "hourglass_dispatch_stage_seconds_bucket{stage=\"broker\"",
        "hourglass_kafka_produce_errors_total",
        "hourglass_store_size_bytes",
        "hourglass_store_memory_bytes{part=\"block_cache\",shard=\"0\"}",
        "hourglass_store_memory_bytes{part=\"memtables\",shard=\"0\"}",
        "hourglass_reconcile_searching 0",
        "hourglass_grpc_requests_total{code=\"Ok\",method=\"Schedule\"}",
    ] {
        assert!(body.contains(series), "{series} missing from /metrics:\n{body}");
    }
    server.stop().await;
}

/// A `Message` whose topic is raw bytes, so a test can send what prost
/// would refuse to encode as a string.
#[derive(Clone, PartialEq, prost::Message)]
struct RawMessage {
    #[prost(bytes = "vec", tag = "1")]
    topic: Vec<u8>,
    #[prost(bytes = "vec", tag = "3")]
    value: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RawScheduleRequest {
    #[prost(message, optional, tag = "1")]
    message: Option<RawMessage>,
    #[prost(message, optional, tag = "3")]
    delay: Option<prost_types::Duration>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_does_not_decode_is_invalid_argument() {
    let TestBed { topic, server, broker: _broker, dir: _dir } = TestBed::start("utf8", 1).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    let send = |topic: Vec<u8>| RawScheduleRequest {
        message: Some(RawMessage { topic, value: b"v".to_vec() }),
        delay: Some(prost_types::Duration { seconds: 60, nanos: 0 }),
    };
    for (topic, expect) in
        [(topic.clone().into_bytes(), Code::Ok), (vec![b'o', 0xff, 0xfe, b'k'], Code::InvalidArgument)]
    {
        grpc.ready().await.unwrap();
        let reply: Result<tonic::Response<proto::ScheduleResponse>, tonic::Status> = grpc
            .unary(
                tonic::Request::new(send(topic)),
                tonic::codegen::http::uri::PathAndQuery::from_static("/hourglass.v1.Scheduler/Schedule"),
                tonic_prost::ProstCodec::default(),
            )
            .await;
        let code = reply.as_ref().map_or_else(tonic::Status::code, |_| Code::Ok);
        assert_eq!(code, expect, "{reply:?}");
        if let Err(status) = reply {
            assert!(status.message().contains("UTF-8"), "the reason is given: {}", status.message());
        }
    }
    server.stop().await;
}
