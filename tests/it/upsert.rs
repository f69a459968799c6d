//! Upsert (`on_conflict` REPLACE) against a real broker and a real store:
//! a replace sent at the instant its message falls due, standalone and in
//! a cluster, and the Kafka-native "latest record for an id wins".
//!
//! Pass: a replace answered REPLACED is delivered with the new content
//! only; one answered FAILED_PRECONDITION (already delivered) left the old
//! content delivered once; every message is on its topic exactly once.
//!
//! `cargo test --test it upsert:: -- --nocapture` shows the counts;
//! `HOURGLASS_RELIABILITY_FULL=1` runs the race at full scale.

use crate::common;

use std::{
    collections::{BTreeMap, HashMap},
    time::{Duration, SystemTime},
};

use crate::ingress::ingress_count;
use common::*;
use hourglass::proto::{self, ScheduleOutcome, State};
use tonic::Code;

fn replacing(topic: &str, id: &str, value: &str, due: SystemTime) -> proto::ScheduleRequest {
    let mut r = request(topic, value, Duration::ZERO);
    r.id = Some(id.to_owned());
    r.due = Some(proto::schedule_request::Due::DeliverAt(due.into()));
    r.on_conflict = proto::OnConflict::Replace as i32;
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replace_at_the_due_instant_is_either_replaced_or_already_delivered() {
    // Get shows what was delivered: bodies kept.
    let bed = TestBed::start_with("upsert-race", 3, |c| c.keep_delivered_bodies = true).await;
    race(bed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_a_replace_at_the_due_instant_is_either_replaced_or_already_delivered() {
    let log_topic = random_name("hourglass-log");
    let bed = TestBed::start_with("upsert-race-cluster", 3, |c| {
        one_node_cluster(&log_topic)(c);
        c.keep_delivered_bodies = true;
    })
    .await;
    race(bed).await;
}

/// Messages due one after another; each is replaced (new content, due 2 s
/// later) at its due instant, give or take up to 4 ms.
async fn race(bed: TestBed) {
    let (n, window) = if reliability_full() {
        (20_000usize, Duration::from_secs(40))
    } else {
        (1_500, Duration::from_secs(4))
    };
    let TestBed { broker, topic, dir: _dir, server } = bed;
    let mut client = server.client().await;
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(connect(server.addr).await);
    }
    let run = random_name("u");
    let id = |i: usize| format!("{run}-{i}");
    let start = SystemTime::now() + Duration::from_secs(6);
    let due = |i: usize| start + window.mul_f64(i as f64 / n as f64);
    let firsts: Vec<_> = (0..n).map(|i| replacing(&topic, &id(i), &format!("old-{i}"), due(i))).collect();
    for chunk in firsts.chunks(500) {
        let results = client
            .schedule_batch(proto::ScheduleBatchRequest { requests: chunk.to_vec() })
            .await
            .unwrap()
            .into_inner()
            .results;
        for r in results {
            let Some(proto::schedule_result::Result::Scheduled(s)) = r.result else { panic!("{r:?}") };
            assert_eq!(s.outcome(), ScheduleOutcome::Created, "nothing under a new id: created");
        }
    }
    if SystemTime::now() > start {
        eprintln!("upsert race: scheduling overran the lead time; early replaces come late");
    }

    let replaces: Vec<_> = (0..n)
        .map(|i| {
            let (offset_ms, when) = around_due(i, due(i));
            let mut c = clients[i % clients.len()].clone();
            let r = replacing(&topic, &id(i), &format!("new-{i}"), due(i) + Duration::from_secs(2));
            tokio::spawn(async move {
                tokio::time::sleep_until(when).await;
                (offset_ms, c.schedule(r).await)
            })
        })
        .collect();
    let mut expected = HashMap::new();
    let mut by_offset = BTreeMap::<i64, (usize, usize)>::new();
    for (i, replace) in replaces.into_iter().enumerate() {
        let (offset_ms, answer) = replace.await.unwrap();
        let counts = by_offset.entry(offset_ms).or_default();
        match answer {
            Ok(r) => {
                assert_eq!(r.get_ref().outcome(), ScheduleOutcome::Replaced, "{}: {r:?}", id(i));
                expected.insert(id(i), format!("new-{i}"));
                counts.0 += 1;
            }
            Err(status) if status.code() == Code::FailedPrecondition => {
                assert!(status.message().contains("already delivered"), "{}: {status:?}", id(i));
                expected.insert(id(i), format!("old-{i}"));
                counts.1 += 1;
            }
            Err(status) => panic!("{}: a replace of a pending message said {status:?}", id(i)),
        }
    }

    let got = consume_async(&broker, &topic, n, Duration::from_secs(120), Duration::from_secs(3)).await;
    let mut seen = HashMap::new();
    for r in &got {
        let value = String::from_utf8_lossy(&r.value).into_owned();
        assert_eq!(
            Some(&value),
            expected.get(r.id()),
            "{} delivered with content its answer ruled out",
            r.id()
        );
        assert!(seen.insert(r.id().to_owned(), value).is_none(), "{} delivered twice", r.id());
    }
    assert_eq!(seen.len(), n, "every message delivered once");
    for i in (0..n).step_by(97) {
        let got =
            client.get(proto::GetRequest { id: id(i), ..Default::default() }).await.unwrap().into_inner();
        assert_eq!(got.state(), State::Delivered, "{}", id(i));
        assert_eq!(
            got.message.unwrap().value,
            expected[&id(i)].as_bytes(),
            "{}: Get shows what was delivered",
            id(i)
        );
    }
    let replaced = by_offset.values().map(|c| c.0).sum::<usize>();
    eprintln!(
        "upsert race: {n} messages over {window:?}: {replaced} replaced, {} already delivered; by replace \
         offset from due in ms (replaced, delivered): {by_offset:?}",
        n - replaced
    );
    assert!(replaced > 0 && replaced < n, "the replaces must meet the deliveries");
    server.stop().await;
}

/// A team used to "the latest record for a key wins" sets
/// `hourglass-on-conflict: replace`: the latest record for an id replaces a
/// pending message; a delivered one is final, and a record without the
/// header keeps the default (refused as a conflict).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_latest_kafka_native_record_for_an_id_wins_while_it_is_pending() {
    let log_topic = random_name("hourglass-log");
    let bed = TestBed::start_with("upsert-native", 1, |c| {
        one_node_cluster(&log_topic)(c);
        c.keep_delivered_bodies = true;
    })
    .await;
    let TestBed { broker, topic, dir: _dir, server } = bed;
    let ingress = format!("{log_topic}-ingress");
    let mut client = server.client().await;
    let producer = native_producer(&broker);
    let t = topic.as_str();
    let replace = [("hourglass-topic", t), ("hourglass-on-conflict", "replace")];
    let with = |extra: (&'static str, &'static str)| {
        let mut h = replace.to_vec();
        h.push(extra);
        h
    };
    send_native(&producer, &ingress, "reminder-1", Some("first"), &with(("hourglass-delay", "1h"))).await;
    send_native(&producer, &ingress, "reminder-1", Some("second"), &with(("hourglass-delay", "1h"))).await;
    let mut third = with(("hourglass-delay", "300ms"));
    third.push(("hourglass-labels", "order=7,kind=reminder"));
    send_native(&producer, &ingress, "reminder-1", Some("third"), &third).await;
    send_native(
        &producer,
        &ingress,
        "kept",
        Some("one"),
        &[("hourglass-topic", t), ("hourglass-delay", "300ms")],
    )
    .await;
    send_native(
        &producer,
        &ingress,
        "kept",
        Some("two"),
        &[("hourglass-topic", t), ("hourglass-delay", "300ms")],
    )
    .await;

    let got = consume_async(&broker, &topic, 2, Duration::from_secs(20), Duration::from_millis(1500)).await;
    let mut values: Vec<(&str, &[u8])> = got.iter().map(|r| (r.id(), r.value.as_slice())).collect();
    values.sort();
    assert_eq!(values, [("kept", &b"one"[..]), ("reminder-1", &b"third"[..])], "{got:?}");
    assert_eq!(ingress_count(&ingress, "replaced"), 2);
    assert_eq!(ingress_count(&ingress, "refused"), 1, "kept's second record: a conflict, by default");

    // Delivered: final. The record is refused, nothing is sent again.
    send_native(&producer, &ingress, "reminder-1", Some("fourth"), &with(("hourglass-delay", "0"))).await;
    let started = std::time::Instant::now();
    while ingress_count(&ingress, "refused") < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the replace of a delivered message was not refused"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let got = consume_async(&broker, &topic, 3, Duration::from_secs(3), Duration::ZERO).await;
    assert_eq!(got.len(), 2, "nothing more delivered: {got:?}");
    let get = client
        .get(proto::GetRequest { id: "reminder-1".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(get.message.unwrap().value, b"third");
    assert_eq!(get.labels.get("order").map(String::as_str), Some("7"), "labels from hourglass-labels");
    server.stop().await;
}
