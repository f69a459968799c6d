//! Operator inspection against a real broker and store: `List` pages through
//! what is pending, filtered by topic and dispatch-time range, and refuses
//! bad arguments by name; `Stats` counts messages by state as they are
//! delivered, cancelled, failed and re-driven, and names the oldest overdue
//! one.

#![allow(deprecated)] // It checks that the deprecated due_from/due_to still work.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use hourglass::proto::{self, State, scheduler_client::SchedulerClient};
use tonic::{Code, transport::Channel};
use tonic_types::StatusExt;

/// A schedule request due at `at` (Unix ms), with the id `id`.
fn at(topic: &str, id: &str, at_ms: u64) -> proto::ScheduleRequest {
    let mut r = request(topic, id, Duration::ZERO);
    r.id = Some(id.to_owned());
    r.message.as_mut().unwrap().key = Some(format!("key-{id}").into_bytes());
    r.due = Some(proto::schedule_request::Due::DeliverAt(timestamp(at_ms)));
    r
}

/// Every page of `request`, followed to the end (bounded).
async fn all_pages(
    client: &mut SchedulerClient<Channel>,
    mut request: proto::ListRequest,
) -> Vec<proto::ListResponse> {
    let mut pages = Vec::new();
    for _ in 0..1000 {
        let page = client.list(request.clone()).await.unwrap().into_inner();
        let next = page.next_page_token.clone();
        pages.push(page);
        if next.is_empty() {
            return pages;
        }
        request.page_token = next;
    }
    panic!("the listing did not end within 1000 pages");
}

fn ids(pages: &[proto::ListResponse]) -> Vec<String> {
    pages.iter().flat_map(|p| p.messages.iter().map(|m| m.id.clone())).collect()
}

/// The field a refusal names in its `BadRequest` detail.
fn refused_field(status: tonic::Status) -> String {
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let details = status.get_error_details();
    let violations = details.bad_request().map(|b| b.field_violations.clone()).unwrap_or_default();
    assert_eq!(violations.len(), 1, "{status:?}");
    violations[0].field.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pages_through_pending_messages_by_topic_and_range() {
    let TestBed { broker, topic, dir: _dir, server } = TestBed::start("list", 1).await;
    let other = random_name("list-other");
    broker.create_topic(&other, 1).await;
    let mut client = server.client().await;

    // Due an hour from now, a second apart, alternating between the topics
    // two to one; none is delivered during the test.
    let base = now_ms() + 3_600_000;
    let mut expected = Vec::new();
    for i in 0..12u64 {
        let t = if i % 3 == 2 { &other } else { &topic };
        let id = format!("m{i:02}");
        client.schedule(at(t, &id, base + i * 1000)).await.unwrap();
        expected.push((id, t.clone(), base + i * 1000));
    }
    let cancelled = "m04";
    client.cancel(proto::CancelRequest { id: cancelled.into(), ..Default::default() }).await.unwrap();
    expected.retain(|(id, _, _)| id != cancelled);

    // Everything, three to a page, in due order; only pending messages.
    let pages = all_pages(&mut client, proto::ListRequest { page_size: 3, ..Default::default() }).await;
    assert_eq!(ids(&pages), expected.iter().map(|e| e.0.clone()).collect::<Vec<_>>());
    assert!(pages.iter().all(|p| p.messages.len() <= 3));
    assert_eq!(pages.len(), 4, "11 messages, 3 a page");
    let first = &pages[0].messages[0];
    assert_eq!((first.topic.as_str(), first.key.as_deref()), (topic.as_str(), Some(&b"key-m00"[..])));
    assert_eq!(first.deliver_at, Some(timestamp(base)));
    assert_eq!(first.dispatch_at, first.deliver_at, "never tried: dispatched at its due time");
    assert_eq!((first.attempts, first.last_error.as_str(), first.value_bytes), (0, "", 3));

    // One topic.
    let pages = all_pages(
        &mut client,
        proto::ListRequest { topic: other.clone(), page_size: 2, ..Default::default() },
    )
    .await;
    let want: Vec<String> = expected.iter().filter(|e| e.1 == other).map(|e| e.0.clone()).collect();
    assert_eq!(ids(&pages), want);
    assert!(pages.iter().flat_map(|p| &p.messages).all(|m| m.topic == other));

    // A range: due_from inclusive, due_to exclusive.
    let (from, to) = (base + 3000, base + 8000);
    let range = proto::ListRequest {
        due_from: Some(timestamp(from)),
        due_to: Some(timestamp(to)),
        ..Default::default()
    };
    let want: Vec<String> =
        expected.iter().filter(|e| (from..to).contains(&e.2)).map(|e| e.0.clone()).collect();
    assert_eq!(ids(&all_pages(&mut client, range.clone()).await), want);
    assert_eq!(want, ["m03", "m05", "m06", "m07"]);

    // A range and a topic together.
    let both = proto::ListRequest { topic: topic.clone(), ..range };
    assert_eq!(ids(&all_pages(&mut client, both).await), ["m03", "m06", "m07"]);

    // A topic nothing is pending for: one empty, final page.
    let none = proto::ListRequest { topic: random_name("none"), ..Default::default() };
    let pages = all_pages(&mut client, none).await;
    assert_eq!((pages.len(), pages[0].messages.len()), (1, 0));

    // A token keeps its place while messages ahead of it are delivered
    // or cancelled.
    let page =
        client.list(proto::ListRequest { page_size: 2, ..Default::default() }).await.unwrap().into_inner();
    client.cancel(proto::CancelRequest { id: "m00".into(), ..Default::default() }).await.unwrap();
    let rest =
        all_pages(&mut client, proto::ListRequest { page_token: page.next_page_token, ..Default::default() })
            .await;
    assert_eq!(ids(&rest).first().map(String::as_str), Some("m02"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_refuses_bad_arguments_by_name() {
    let TestBed { broker: _broker, topic: _, dir: _dir, server } = TestBed::start("list-bad", 1).await;
    let mut client = server.client().await;
    let t = |s| Some(prost_types::Timestamp { seconds: s, nanos: 0 });
    let cases = [
        (proto::ListRequest { page_size: 1001, ..Default::default() }, "page_size"),
        (proto::ListRequest { page_token: "not-a-token".into(), ..Default::default() }, "page_token"),
        (proto::ListRequest { page_token: "02".repeat(17), ..Default::default() }, "page_token"),
        (
            proto::ListRequest { due_from: t(2_000_000_000), due_to: t(1_000_000_000), ..Default::default() },
            "due_to",
        ),
        (
            proto::ListRequest { due_from: t(1_000_000_000), due_to: t(1_000_000_000), ..Default::default() },
            "due_to",
        ),
        (
            proto::ListRequest {
                due_from: Some(prost_types::Timestamp { seconds: 1, nanos: 2_000_000_000 }),
                ..Default::default()
            },
            "due_from",
        ),
        (proto::ListRequest { topic: "not a topic".into(), ..Default::default() }, "topic"),
    ];
    for (request, field) in cases {
        let status = client.list(request.clone()).await.unwrap_err();
        assert_eq!(refused_field(status), field, "{request:?}");
    }
    let max = client.list(proto::ListRequest { page_size: 1000, ..Default::default() }).await;
    assert!(max.is_ok(), "1000 is allowed: {max:?}");
    server.stop().await;
}

/// Polls `Get` (bounded) until `id` has left `Pending`.
async fn settled(client: &mut SchedulerClient<Channel>, id: &str) -> proto::GetResponse {
    let started = Instant::now();
    loop {
        let got =
            client.get(proto::GetRequest { id: id.into(), ..Default::default() }).await.unwrap().into_inner();
        if got.state() != State::Pending {
            return got;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "{id} still pending after 60 s: {got:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_count_each_state_and_follow_a_redriven_failure() {
    // A record over the producer's message.max.bytes (but under hourglass's
    // own limit) is accepted and can never be produced: it fails.
    let tweak = |c: &mut hourglass::config::Config| {
        c.max_delivery_attempts = 2;
        c.fail_after = Duration::ZERO.into();
        c.max_pending = 1000;
        c.kafka_properties.insert("message.max.bytes".into(), "1000000".into());
    };
    let TestBed { broker: _broker, topic, dir: _dir, server } = TestBed::start_with("stats", 1, tweak).await;
    let mut client = server.client().await;
    let later = now_ms() + 3_600_000;

    let empty = client.stats(proto::StatsRequest {}).await.unwrap().into_inner();
    assert_eq!((empty.pending, empty.delivered, empty.cancelled, empty.failed), (0, 0, 0, 0));
    assert_eq!(empty.max_pending, Some(1000));
    assert!(empty.oldest_overdue.is_none());

    client.schedule(at(&topic, "waits", later)).await.unwrap();
    client.schedule(at(&topic, "cancelled", later)).await.unwrap();
    client.schedule(at(&topic, "delivered", 0)).await.unwrap();
    let mut big = at(&topic, "failed", 0);
    big.message.as_mut().unwrap().value = vec![b'x'; 1_000_100];
    client.schedule(big).await.unwrap();
    client.cancel(proto::CancelRequest { id: "cancelled".into(), ..Default::default() }).await.unwrap();
    assert_eq!(settled(&mut client, "delivered").await.state(), State::Delivered);
    assert_eq!(settled(&mut client, "failed").await.state(), State::Failed);

    let stats = client.stats(proto::StatsRequest {}).await.unwrap().into_inner();
    assert_eq!((stats.pending, stats.delivered, stats.cancelled, stats.failed), (1, 1, 1, 1), "{stats:?}");
    assert!(stats.oldest_overdue.is_none(), "what waits is due in an hour: {stats:?}");
    assert!(stats.store_bytes > 0);
    assert!(stats.as_of.is_some());

    // Re-driving the failure makes it pending again.
    let redrive = proto::RescheduleRequest {
        id: "failed".into(),
        due: Some(proto::reschedule_request::Due::DeliverAt(timestamp(later + 1000))),
        ..Default::default()
    };
    client.reschedule(redrive).await.unwrap();
    let stats = client.stats(proto::StatsRequest {}).await.unwrap().into_inner();
    assert_eq!((stats.pending, stats.delivered, stats.cancelled, stats.failed), (2, 1, 1, 0), "{stats:?}");
    let pending = all_pages(&mut client, proto::ListRequest::default()).await;
    assert_eq!(ids(&pending), ["waits", "failed"]);
    let failed = &pending[0].messages[1];
    assert_eq!(failed.attempts, 0, "a re-driven message starts with a clean slate");
    assert_eq!(failed.value_bytes, 1_000_100);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_name_the_oldest_overdue_message_while_kafka_is_down() {
    // One produce in flight at a time: with the broker gone, the first due
    // message waits in the producer and the rest wait, overdue, in the store.
    let tweak = |c: &mut hourglass::config::Config| c.max_in_flight = 1;
    let TestBed { mut broker, topic, dir: _dir, server } = TestBed::start_with("overdue", 1, tweak).await;
    let mut client = server.client().await;
    let due = now_ms() + 5_000;
    for (i, id) in ["first", "second", "third"].into_iter().enumerate() {
        client.schedule(at(&topic, id, due + i as u64)).await.unwrap();
    }
    broker.stop();

    let started = Instant::now();
    let stats = loop {
        let stats = client.stats(proto::StatsRequest {}).await.unwrap().into_inner();
        if stats.oldest_overdue.is_some() {
            break stats;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "nothing overdue after 30 s: {stats:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let oldest = stats.oldest_overdue.as_ref().unwrap();
    assert_eq!(oldest.id, "first", "{stats:?}");
    assert_eq!(oldest.dispatch_at, Some(timestamp(due)));
    assert!(millis(stats.as_of.as_ref().unwrap()) as u64 > due, "overdue means due before as_of");
    assert_eq!(stats.pending, 3, "nothing was delivered: {stats:?}");
    // Overdue messages are still listed, in order.
    let pending = all_pages(&mut client, proto::ListRequest::default()).await;
    assert_eq!(ids(&pending), ["first", "second", "third"]);
    // The server is left running: a graceful stop would wait out the
    // produce that cannot finish.
}
