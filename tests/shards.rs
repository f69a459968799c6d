//! A node of several shards, end to end against a real broker and real
//! RocksDB stores: messages scheduled one by one and in batches land in the
//! shard their id hashes to, are delivered once, cancel and reschedule
//! reach them, `List` pages through every shard in dispatch order and
//! `Stats` counts them all; after a restart everything is where it was, and
//! a restart with another shard count is refused.

// Apart from `tests/it/`: it reads the Prometheus registry of the servers
// it starts in this process, which every server in the process shares.
#[path = "it/common/mod.rs"]
mod common;

use std::{collections::BTreeMap, time::Duration};

use common::*;
use hourglass::{
    message::{MessageId, shard_of},
    proto::{self, CancelOutcome, State, scheduler_client::SchedulerClient},
};
use tonic::transport::Channel;

const SHARDS: u32 = 3;

fn at(topic: &str, id: &str, at_ms: i64) -> proto::ScheduleRequest {
    let mut r = request(topic, id, Duration::ZERO);
    r.id = Some(id.to_owned());
    r.due = Some(proto::schedule_request::Due::DeliverAt(prost_types::Timestamp {
        seconds: at_ms / 1000,
        nanos: ((at_ms % 1000) * 1_000_000) as i32,
    }));
    r
}

async fn state(client: &mut SchedulerClient<Channel>, id: &str) -> State {
    let got =
        client.get(proto::GetRequest { id: id.into(), ..Default::default() }).await.unwrap().into_inner();
    got.state()
}

/// Every pending id, `page_size` at a time, in the order the pages give.
async fn listed(client: &mut SchedulerClient<Channel>, page_size: u32) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    let mut request = proto::ListRequest { page_size, ..Default::default() };
    for _ in 0..1000 {
        let page = client.list(request.clone()).await.unwrap().into_inner();
        out.extend(page.messages.iter().map(|m| (m.id.clone(), millis(m.dispatch_at.as_ref().unwrap()))));
        if page.next_page_token.is_empty() {
            return out;
        }
        request.page_token = page.next_page_token;
    }
    panic!("the listing did not end");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_of_several_shards_schedules_delivers_cancels_lists_and_restarts() {
    let broker = Broker::start();
    let topic = random_name("shards");
    broker.create_topic(&topic, 3).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = || hourglass::config::Config { shards: SHARDS, ..config(&broker, dir.path()) };
    let server = Hourglass::start(settings()).await;
    let mut client = server.client().await;
    let now = chrono::Utc::now().timestamp_millis();

    // Soon: 30 one by one, 30 in one batch. Later: 40, some of them at the
    // same millisecond, to be listed, cancelled and rescheduled.
    for i in 0..30 {
        client.schedule(at(&topic, &format!("soon-{i}"), now + 1_000)).await.unwrap();
    }
    let batch = proto::ScheduleBatchRequest {
        requests: (30..60).map(|i| at(&topic, &format!("soon-{i}"), now + 1_500)).collect(),
    };
    let answers = client.schedule_batch(batch).await.unwrap().into_inner().results;
    assert_eq!(answers.len(), 30);
    for (i, answer) in (30..).zip(&answers) {
        match &answer.result {
            Some(proto::schedule_result::Result::Scheduled(s)) => assert_eq!(s.id, format!("soon-{i}")),
            other => panic!("item {i}: {other:?}"),
        }
    }
    let later = |i: i64| now + 3_600_000 + (i / 4) * 1_000;
    for i in 0..40 {
        client.schedule(at(&topic, &format!("later-{i:02}"), later(i))).await.unwrap();
    }
    let mut per_shard = BTreeMap::new();
    for i in 0..40 {
        let id = MessageId::parse(&format!("later-{i:02}")).unwrap();
        *per_shard.entry(shard_of(&id, SHARDS)).or_insert(0) += 1;
    }
    assert_eq!(per_shard.len(), SHARDS as usize, "the ids reach every shard: {per_shard:?}");

    // Delivered once each, from every shard.
    let got = consume_async(&broker, &topic, 60, Duration::from_secs(60), Duration::from_secs(2)).await;
    let mut values: Vec<_> = got.iter().map(|r| String::from_utf8(r.value.clone()).unwrap()).collect();
    values.sort();
    let mut want: Vec<_> = (0..60).map(|i| format!("soon-{i}")).collect();
    want.sort();
    assert_eq!(values, want, "each soon message exactly once");
    for i in [0, 29, 30, 59] {
        assert!(matches!(state(&mut client, &format!("soon-{i}")).await, State::Delivered), "soon-{i}");
    }

    // Cancel and reschedule reach the shard of their id.
    for i in [0, 1, 2, 3] {
        let outcome = client
            .cancel(proto::CancelRequest { id: format!("later-{i:02}"), ..Default::default() })
            .await
            .unwrap();
        assert_eq!(outcome.into_inner().outcome(), CancelOutcome::Cancelled);
    }
    let moved = now + 7_200_000;
    let rescheduled = client
        .reschedule(proto::RescheduleRequest {
            id: "later-04".into(),
            due: Some(proto::reschedule_request::Due::DeliverAt(prost_types::Timestamp {
                seconds: moved / 1000,
                nanos: 0,
            })),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(rescheduled.into_inner().deliver_at.is_some());

    // List pages through every shard in dispatch order, whatever the page
    // size, each message once; the cancelled ones are gone.
    let expected: Vec<String> =
        (5..40).map(|i| format!("later-{i:02}")).chain(["later-04".to_owned()]).collect();
    for page_size in [1, 7, 1000] {
        let pages = listed(&mut client, page_size).await;
        let times: Vec<i64> = pages.iter().map(|(_, t)| *t).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "in dispatch order: {times:?}");
        let ids: Vec<String> = pages.into_iter().map(|(id, _)| id).collect();
        let mut sorted_ids = ids.clone();
        sorted_ids.sort();
        sorted_ids.dedup();
        assert_eq!(sorted_ids.len(), ids.len(), "page size {page_size}: no message twice");
        let mut want = expected.clone();
        want.sort();
        assert_eq!(sorted_ids, want, "page size {page_size}");
        assert_eq!(ids.last().map(String::as_str), Some("later-04"), "the rescheduled one last");
    }

    // Stats counts every shard.
    let stats = client.stats(proto::StatsRequest {}).await.unwrap().into_inner();
    assert_eq!((stats.pending, stats.delivered, stats.cancelled), (36, 60, 4));

    // Per-shard series, one per shard.
    let body = http_get(server.metrics_addr, "/metrics").await;
    for shard in 0..SHARDS {
        assert!(body.contains(&format!("hourglass_messages_pending{{shard=\"{shard}\"}}")), "{body}");
    }
    assert_eq!(metric(&server, "hourglass_messages_pending").await, 36.0, "summed over the shards");
    server.stop().await;
    for shard in 0..SHARDS {
        assert!(dir.path().join(format!("shard-{shard}/CURRENT")).exists(), "shard-{shard} is a store");
    }
    assert!(!dir.path().join("CURRENT").exists(), "the data dir itself holds no store");

    // After a restart: the same answers.
    let server = Hourglass::start(settings()).await;
    let mut client = server.client().await;
    assert!(matches!(state(&mut client, "soon-7").await, State::Delivered));
    assert!(matches!(state(&mut client, "later-01").await, State::Cancelled));
    assert!(matches!(state(&mut client, "later-20").await, State::Pending));
    let ids: Vec<String> = listed(&mut client, 10).await.into_iter().map(|(id, _)| id).collect();
    assert_eq!(ids.len(), expected.len());
    let stats = client.stats(proto::StatsRequest {}).await.unwrap().into_inner();
    assert_eq!((stats.pending, stats.delivered, stats.cancelled), (36, 60, 4));
    // The same id again is the same message, in its shard.
    let again = client.schedule(at(&topic, "later-20", later(20))).await.unwrap().into_inner();
    assert!(again.duplicate);
    server.stop().await;

    // Another shard count would send ids to other shards: refused.
    for shards in [1, 2, 4] {
        let config = hourglass::config::Config { shards, ..settings() };
        let listeners = hourglass::Listeners::bind(&config).await.unwrap();
        let refused = hourglass::run(config, listeners, tokio_util::sync::CancellationToken::new())
            .await
            .expect_err("a start with another shard count");
        let message = format!("{refused:#}");
        assert!(
            message.contains(&format!("holds {SHARDS} shard(s)"))
                && message.contains(&format!("--shards {shards}")),
            "{message}"
        );
    }
    let server = Hourglass::start(settings()).await;
    let mut client = server.client().await;
    assert!(
        matches!(state(&mut client, "later-20").await, State::Pending),
        "nothing was changed by the refusals"
    );
    server.stop().await;
}
