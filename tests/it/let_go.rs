//! A node that lets a shard go while it keeps running (the group gave the
//! shard to a node that joined) leaves nothing behind that Kafka could
//! still write after the shard's next owner searched the topics for it.
//!
//! On librdkafka's mock cluster, whose brokers can be made to refuse
//! Produce one by one: the target topic's broker refuses every produce
//! with an error librdkafka retries, for as long as the test wants, while
//! the other broker, which leads the schedule log, answers. Tansu cannot
//! refuse one topic's produces and not another's.

use crate::common;

use std::{
    collections::HashMap,
    path::Path,
    time::{Duration, Instant},
};

use common::{
    mock::{Mock, RDKafkaRespErr as RespErr},
    *,
};
use hourglass::{proto, store::Durability};
use hourglass_testkit::ServerProcess;
use rdkafka::{
    ClientConfig,
    producer::{FutureProducer, FutureRecord},
};

const BIN: &str = env!("CARGO_BIN_EXE_hourglass");

/// Leads the schedule log, its routing and ingress topics.
const LOG_BROKER: i32 = 1;
/// Leads the target topic, and refuses its produces while the test says.
const TARGET_BROKER: i32 = 2;

/// A node of a cluster on `mock` whose log has `partitions`.
pub(crate) fn node(mock: &Mock, dir: &Path, log_topic: &str, group: &str, partitions: u32) -> ServerProcess {
    let mut node = ServerProcess::new(Path::new(BIN), dir, &mock.bootstrap(), Durability::Buffered)
        .unwrap()
        .clustered()
        .unwrap()
        .arg("--log-topic", log_topic)
        .arg("--log-partitions", partitions)
        .arg("--group-id", group)
        .arg("--shutdown-grace", "1s");
    node.env("HOURGLASS_LOG", "info,librdkafka=warn");
    node
}

/// Two shards, one node owning both. Its produces to the target topic are
/// refused (and retried by librdkafka) when a second node joins and takes
/// one shard: the first node's grace runs out with the shard's records
/// unanswered. The second node searches the topic (nothing is there),
/// produces the shard's messages itself, and the broker answers again.
/// Before, the records the first node let go of stayed in its node-wide
/// producer and were written once the broker answered: every message of
/// the moved shard twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shard_let_go_leaves_no_produce_behind_to_land_after_its_next_owner_searched() {
    let mock = Mock::start(2);
    let (topic, log_topic, group) =
        (random_name("let-go"), random_name("hourglass-log"), random_name("hourglass"));
    mock.topic_led(&topic, 1, TARGET_BROKER);
    let spare = random_name("spare");
    mock.topic_led(&spare, 1, TARGET_BROKER);
    mock.topic_led(&log_topic, 2, LOG_BROKER);
    mock.topic_led(&format!("{log_topic}-owners"), 1, LOG_BROKER);
    mock.topic_led(&format!("{log_topic}-ingress"), 2, LOG_BROKER);
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut first = node(&mock, dirs[0].path(), &log_topic, &group, 2);
    first.spawn().unwrap();
    first.wait_serving(Duration::from_secs(60)).await.unwrap();
    let mut client = reconnecting_client(&first.grpc, Duration::from_secs(10));
    // Marks where the topic ends before the broker refuses anything.
    client.schedule(request(&topic, "warm-up", Duration::ZERO)).await.unwrap();
    let warm = consume_async(&mock, &topic, 1, Duration::ZERO).await;
    assert_eq!(warm.len(), 1, "the first node delivers");

    // Far more refusals than the retries of the test's length take.
    mock.fail_produce(TARGET_BROKER, RespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS, 600);
    let run = random_name("m");
    let ids: Vec<String> = (0..20).map(|i| format!("{run}-{i}")).collect();
    for id in &ids {
        let scheduled = client
            .schedule(proto::ScheduleRequest { id: Some(id.clone()), ..request(&topic, id, Duration::ZERO) })
            .await;
        scheduled.unwrap_or_else(|e| panic!("{id}: {e:?}"));
    }
    wait_metric(&first, "hourglass_dispatch_in_flight", ids.len() as f64, Duration::from_secs(30)).await;

    let mut second = node(&mock, dirs[1].path(), &log_topic, &group, 2);
    second.spawn().unwrap();
    second.wait_serving(Duration::from_secs(60)).await.unwrap();
    wait_metric(&second, "hourglass_cluster_shards_owned", 1.0, Duration::from_secs(60)).await;
    // Its search over, the second node produces the moved shard's
    // messages, into the same refusals.
    wait_metric(&second, "hourglass_dispatch_in_flight", 1.0, Duration::from_secs(60)).await;
    let moved = second.metric("hourglass_dispatch_in_flight").await.unwrap();

    // The broker answers again: the refusals left are taken by produces of
    // the test's own, to a topic of no interest.
    let spill: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", mock.bootstrap())
        .set("enable.idempotence", "false")
        .set("retries", "0")
        .create()
        .unwrap();
    let started = Instant::now();
    while mock.produce_errors_left(TARGET_BROKER) > 0 {
        assert!(started.elapsed() < Duration::from_secs(60), "the refusals were not used up");
        let _ =
            spill.send(FutureRecord::<str, str>::to(&spare).payload("spill"), Duration::from_secs(5)).await;
    }

    // Up to two minutes: a produce librdkafka was retrying when the
    // refusals ran out goes out within its backoff, on a busy machine
    // later than that; a message lost would still be missing.
    let got =
        consume_within(&mock, &topic, ids.len() + 1, Duration::from_secs(120), Duration::from_secs(5)).await;
    let mut copies: HashMap<&str, usize> = HashMap::new();
    for r in &got {
        *copies.entry(r.id()).or_default() += 1;
    }
    eprintln!("{moved} messages moved with their shard; {} records on the topic", got.len());
    let missing: Vec<&String> = ids.iter().filter(|id| !copies.contains_key(id.as_str())).collect();
    assert!(missing.is_empty(), "never delivered: {missing:?}");
    let twice: Vec<(&str, usize)> = copies.into_iter().filter(|(_, n)| *n > 1).collect();
    assert!(twice.is_empty(), "delivered twice: {twice:?}");
    second.stop().unwrap();
    first.stop().unwrap();
}

pub(crate) async fn consume_async(mock: &Mock, topic: &str, count: usize, settle: Duration) -> Vec<Received> {
    consume_within(mock, topic, count, Duration::from_secs(60), settle).await
}

/// Reads `count` records of `topic` within `within`, then `settle` more.
async fn consume_within(
    mock: &Mock,
    topic: &str,
    count: usize,
    within: Duration,
    settle: Duration,
) -> Vec<Received> {
    let (bootstrap, topic) = (mock.bootstrap(), topic.to_owned());
    tokio::task::spawn_blocking(move || consume(&bootstrap, &topic, count, within, settle)).await.unwrap()
}

/// Waits until `node`'s metric `name` reaches `at_least`.
pub(crate) async fn wait_metric(node: &ServerProcess, name: &str, at_least: f64, within: Duration) {
    let started = Instant::now();
    loop {
        let value = node.metric(name).await.unwrap_or(0.0);
        if value >= at_least {
            return;
        }
        assert!(started.elapsed() < within, "{name} stayed at {value}, below {at_least}, for {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
