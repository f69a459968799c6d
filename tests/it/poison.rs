//! Poison messages: records the cluster will never take. A topic deleted
//! after scheduling, a record larger than the producer may send, and a
//! broker that answers MESSAGE_TOO_LARGE (injected with librdkafka's mock
//! cluster). Each must end `failed` with its reason after a bounded number
//! of tries (its own, or its topic's), counted in the metrics, while
//! messages to healthy topics keep flowing. (That a refusal shorter than
//! `--fail-after` fails nothing is shown in `outages.rs`.)
//!
//! One test function: the metrics are process-wide, so it owns them.

use crate::common;

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use common::{
    mock::{Mock, RDKafkaRespErr as RespErr},
    *,
};
use hourglass::proto::{self, State, get_response::Settlement, scheduler_client::SchedulerClient};
use tonic::transport::Channel;

/// Refusals before a message is failed, in these tests; they fail as soon
/// as the tries are spent (`fail_after` is zero), so that a poison message
/// fails within the test's time.
const ATTEMPTS: u32 = 3;

/// The tests' settings for giving up.
fn give_up_soon(c: &mut hourglass::config::Config) {
    c.max_delivery_attempts = ATTEMPTS;
    c.fail_after = Duration::ZERO.into();
}

/// How many tries a failed message shows: a refused record its own, all
/// of them; a message of a refused topic, at most the one it was probed
/// with (its topic's tries failed it).
#[derive(Clone, Copy, Debug)]
enum Tries {
    Own,
    WithItsTopic,
}

/// Counter values from `/metrics`, by series (name plus labels).
async fn counters(server: &Hourglass) -> HashMap<String, f64> {
    http_get(server.metrics_addr, "/metrics")
        .await
        .lines()
        .filter(|l| l.starts_with("hourglass_"))
        .filter_map(|l| l.rsplit_once(' '))
        .filter_map(|(k, v)| Some((k.to_owned(), v.parse().ok()?)))
        .collect()
}

const FAILED: &str = "hourglass_messages_failed_total";
const REJECTED: &str = "hourglass_kafka_produce_errors_total{kind=\"rejected\"}";

/// Growth of each named counter between two readings.
fn delta(before: &HashMap<String, f64>, after: &HashMap<String, f64>, name: &str) -> f64 {
    after.get(name).copied().unwrap_or(0.0) - before.get(name).copied().unwrap_or(0.0)
}

/// Waits (bounded) until every message in `ids` is settled, and returns
/// each one's final answer from Get.
async fn settled(client: &mut SchedulerClient<Channel>, ids: &[String]) -> Vec<proto::GetResponse> {
    let started = Instant::now();
    loop {
        let mut out = Vec::new();
        for id in ids {
            out.push(
                client
                    .get(proto::GetRequest { id: id.clone(), ..Default::default() })
                    .await
                    .unwrap()
                    .into_inner(),
            );
        }
        if out.iter().all(|g| g.state() != State::Pending) {
            return out;
        }
        let waiting: Vec<_> = out.iter().filter(|g| g.state() == State::Pending).collect();
        assert!(started.elapsed() < Duration::from_secs(90), "still pending after 90 s: {waiting:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Asserts that `got` ended failed after its `tries`, with a reason
/// containing `reason`.
fn assert_failed(got: &proto::GetResponse, reason: &str, tries: Tries) {
    assert_eq!(got.state(), State::Failed, "{got:?}");
    match tries {
        Tries::Own => assert_eq!(got.attempts, ATTEMPTS, "bounded tries: {got:?}"),
        Tries::WithItsTopic => {
            assert!(got.attempts <= ATTEMPTS, "{got:?}");
            let tries = got
                .last_error
                .strip_suffix(" tries)")
                .and_then(|e| e.rsplit(' ').next())
                .and_then(|n| n.parse::<u32>().ok());
            assert!(tries.is_some_and(|n| n >= ATTEMPTS), "the topic's tries are named: {got:?}");
        }
    }
    let Some(Settlement::Failed(f)) = &got.settlement else { panic!("failed without a failure: {got:?}") };
    assert!(f.reason.contains(reason), "reason {:?} should name {reason:?}", f.reason);
    assert!(f.failed_at.is_some());
}

/// Lateness of each received record against its `hourglass-due-ms`, in ms.
fn lateness(got: &[Received]) -> Vec<i64> {
    let mut late: Vec<i64> = got
        .iter()
        .map(|r| r.timestamp_ms - r.header("hourglass-due-ms").unwrap().parse::<i64>().unwrap())
        .collect();
    late.sort_unstable();
    late
}

/// Count, min, median and max of sorted lateness figures.
fn summary(late: &[i64]) -> String {
    format!("n={} min={} p50={} max={}", late.len(), late[0], late[late.len() / 2], late[late.len() - 1])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_messages_fail_with_their_reason_and_healthy_ones_keep_flowing() {
    deleted_topic_and_oversized_record_on_a_real_broker().await;
    broker_rejection_injected_with_the_mock_cluster().await;
    topic_deleted_while_running_on_the_mock_cluster().await;
}

/// Tansu: a topic deleted after its messages were scheduled, and a record
/// over the producer's `message.max.bytes` (set to 1 000 000 here, as a
/// cluster with a lower limit would) but under hourglass's own limit
/// (1 MiB), so it is accepted and can never be produced.
///
/// Few in-flight slots and more poison messages than slots, due first: if
/// the producer held poison records (librdkafka waits for an unknown topic
/// to appear), the healthy ones behind them would wait too.
async fn deleted_topic_and_oversized_record_on_a_real_broker() {
    let (poison_n, healthy_n, spacing) = if reliability_full() { (200, 400u64, 25) } else { (6, 12u64, 250) };
    let tweak = |c: &mut hourglass::config::Config| {
        give_up_soon(c);
        c.max_in_flight = 4;
        c.kafka_properties.insert("message.max.bytes".into(), "1000000".into());
    };
    let TestBed { broker, topic: healthy, dir, server } = TestBed::start_with("healthy", 2, tweak).await;
    let gone = random_name("gone");
    broker.create_topic(&gone, 1).await;
    let mut client = server.client().await;

    let mut poison = Vec::new();
    for i in 0..poison_n {
        let r = client.schedule(request(&gone, &format!("p{i}"), Duration::from_secs(4))).await.unwrap();
        poison.push(r.into_inner().id);
    }
    let big = request(&healthy, &"x".repeat(1_000_100), Duration::from_secs(4));
    let big = client.schedule(big).await.unwrap().into_inner().id;
    for i in 0..healthy_n {
        let due = Duration::from_millis(4500 + spacing * i);
        client.schedule(request(&healthy, &format!("h{i}"), due)).await.unwrap();
    }
    // Deleted while hourglass is down, so its producer has never seen the
    // topic and cannot have cached where it lived.
    server.stop().await;
    broker.delete_topic(&gone).await;
    let mut config = config(&broker, dir.path());
    tweak(&mut config);
    let server = Hourglass::start(config).await;
    let mut client = server.client().await;
    let before = counters(&server).await;
    let started = Instant::now();

    let got =
        consume_async(&broker, &healthy, healthy_n as usize, Duration::from_secs(90), Duration::from_secs(1))
            .await;
    assert_eq!(got.len(), healthy_n as usize, "every healthy message arrives, once: {got:?}");
    let late = lateness(&got);
    eprintln!(
        "poison/tansu: {healthy_n} healthy, lateness ms {}, all in {:?}",
        summary(&late),
        started.elapsed()
    );
    // librdkafka holds a record for a topic it does not know for
    // topic.metadata.propagation.max.ms (30 s by default); healthy messages
    // stuck behind such records would be that late. A loose bound: this is
    // about being held, not about precision.
    assert!(late[late.len() - 1] < 15_000, "healthy messages waited behind poison ones: {late:?}");

    let results = settled(&mut client, &poison).await;
    for r in &results {
        assert_failed(r, "Unknown topic", Tries::WithItsTopic);
    }
    let big = &settled(&mut client, std::slice::from_ref(&big)).await[0];
    assert_failed(big, "too large", Tries::Own);
    eprintln!(
        "poison/tansu: {poison_n} to a deleted topic and 1 oversized failed after {ATTEMPTS} tries each, \
         in {:?}; reasons {:?} / {:?}",
        started.elapsed(),
        results[0].last_error,
        big.last_error
    );

    let after = counters(&server).await;
    let poisoned = (poison_n + 1) as f64;
    assert_eq!(delta(&before, &after, FAILED), poisoned, "each poison message counted once as failed");
    // The oversized record's own refusals, and its topic's for the others.
    assert!(delta(&before, &after, REJECTED) >= f64::from(2 * ATTEMPTS), "every refusal counted");
    server.stop().await;
}

/// A broker that refuses a record as too large: the producer's Produce
/// requests to the poison topic's leader get MESSAGE_TOO_LARGE, every time,
/// while the other broker takes the healthy topic's records.
async fn broker_rejection_injected_with_the_mock_cluster() {
    let (poison_n, healthy_n) = if reliability_full() { (20, 200u64) } else { (1, 10u64) };
    let mock = Mock::start(2);
    let (healthy, poison_topic) = (random_name("healthy"), random_name("refused"));
    mock.topic(&healthy, 2);
    mock.topic(&poison_topic, 1);
    // More errors than tries: every try is refused by the broker.
    mock.fail_produce(1, RespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE, poison_n * ATTEMPTS as usize + 10);

    let dir = tempfile::tempdir().unwrap();
    let mut config = config_at(&mock.bootstrap(), dir.path());
    give_up_soon(&mut config);
    let server = Hourglass::start(config).await;
    let mut client = server.client().await;
    let before = counters(&server).await;

    let mut poison = Vec::new();
    for i in 0..poison_n {
        let r = request(&poison_topic, &format!("refused-{i}"), Duration::from_secs(1));
        poison.push(client.schedule(r).await.unwrap().into_inner().id);
    }
    let mut healthy_ids = Vec::new();
    for i in 0..healthy_n {
        let due = Duration::from_millis(1000 + 10_000 * i / healthy_n);
        healthy_ids
            .push(client.schedule(request(&healthy, &format!("h{i}"), due)).await.unwrap().into_inner().id);
    }
    let started = Instant::now();
    let late = delivered_lateness(&mut client, &healthy_ids).await;
    eprintln!("poison/mock: {healthy_n} healthy, lateness ms at acknowledgement {}", summary(&late));

    let results = assert_poison_failed(&mut client, &server, &poison, "too large", Tries::Own, &before).await;
    eprintln!(
        "poison/mock: {poison_n} refused, failed after {ATTEMPTS} tries each, in {:?}: {:?}",
        started.elapsed(),
        results[0].last_error
    );
    server.stop().await;
    drop(mock.owner);
}

/// Waits until `ids` have settled; each must be delivered, none early.
/// Their lateness at acknowledgement, in ms, sorted.
async fn delivered_lateness(client: &mut SchedulerClient<Channel>, ids: &[String]) -> Vec<i64> {
    let mut late = Vec::new();
    for r in &settled(client, ids).await {
        assert_eq!(r.state(), State::Delivered, "{r:?}");
        let Some(Settlement::Delivered(d)) = &r.settlement else { panic!("{r:?}") };
        late.push(millis(d.delivered_at.as_ref().unwrap()) - millis(r.deliver_at.as_ref().unwrap()));
    }
    late.sort_unstable();
    assert!(late.iter().all(|&l| l >= 0), "nothing early: {late:?}");
    late
}

/// Waits until the poison messages `ids` have settled; each must have
/// failed for `reason` after its `tries`, and the metrics must have counted
/// each once as failed, and the refusals since `before`.
async fn assert_poison_failed(
    client: &mut SchedulerClient<Channel>,
    server: &Hourglass,
    ids: &[String],
    reason: &str,
    tries: Tries,
    before: &HashMap<String, f64>,
) -> Vec<proto::GetResponse> {
    let results = settled(client, ids).await;
    for r in &results {
        assert_failed(r, reason, tries);
    }
    let after = counters(server).await;
    assert_eq!(delta(before, &after, FAILED), ids.len() as f64);
    let refused = delta(before, &after, REJECTED);
    match tries {
        Tries::Own => assert_eq!(refused, (ids.len() as u32 * ATTEMPTS) as f64),
        Tries::WithItsTopic => assert!(refused >= f64::from(ATTEMPTS), "{refused}"),
    }
    results
}

/// A topic deleted while hourglass runs and its producer already knows the
/// topic (it delivered there): what happens on a real cluster, which Tansu
/// cannot show (it accepts records for a deleted topic from a producer that
/// knew it). The mock cluster plays the deletion: metadata says the topic
/// is unknown and its leader answers Produce with UNKNOWN_TOPIC_OR_PART.
async fn topic_deleted_while_running_on_the_mock_cluster() {
    let (poison_n, healthy_n) = if reliability_full() { (20, 200u64) } else { (3, 10u64) };
    let mock = Mock::start(2);
    let (healthy, vanished) = (random_name("healthy"), random_name("vanished"));
    mock.topic(&healthy, 2);
    mock.topic(&vanished, 1);
    let dir = tempfile::tempdir().unwrap();
    let mut config = config_at(&mock.bootstrap(), dir.path());
    give_up_soon(&mut config);
    let server = Hourglass::start(config).await;
    let mut client = server.client().await;

    let first = client.schedule(request(&vanished, "first", Duration::ZERO)).await.unwrap().into_inner().id;
    let first = &settled(&mut client, &[first]).await[0];
    assert_eq!(first.state(), State::Delivered, "the topic works before it is deleted: {first:?}");
    let mut poison = Vec::new();
    for i in 0..poison_n {
        let r = request(&vanished, &format!("after-{i}"), Duration::from_secs(3));
        poison.push(client.schedule(r).await.unwrap().into_inner().id);
    }
    let mut healthy_ids = Vec::new();
    for i in 0..healthy_n {
        let due = Duration::from_millis(3000 + 5_000 * i / healthy_n);
        healthy_ids
            .push(client.schedule(request(&healthy, &format!("h{i}"), due)).await.unwrap().into_inner().id);
    }
    let before = counters(&server).await;
    mock.topic_error(&vanished, RespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART);
    mock.fail_produce(1, RespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART, 1000);
    let started = Instant::now();

    let late = delivered_lateness(&mut client, &healthy_ids).await;
    eprintln!("poison/mock-deleted: {healthy_n} healthy, lateness ms at acknowledgement {}", summary(&late));

    let results =
        assert_poison_failed(&mut client, &server, &poison, "Unknown topic", Tries::WithItsTopic, &before)
            .await;
    eprintln!(
        "poison/mock-deleted: {poison_n} to the deleted topic failed after {ATTEMPTS} tries each, in {:?}: {:?}",
        started.elapsed(),
        results[0].last_error
    );
    server.stop().await;
    drop(mock.owner);
}
