//! Kafka-native schedules (`--ingress`), standalone and in cluster mode
//! alike: a record produced to an ingress topic is the call a client would
//! make, with its checks and its grant, read on after a restart from where
//! the node noted it was.

use crate::common;

use std::{path::Path, time::Duration};

use common::*;
use hourglass::{
    config::Config,
    proto::{self, State},
};
use tonic::Code;

/// How many records of `ingress` came to `outcome`.
pub(crate) fn ingress_count(ingress: &str, outcome: &str) -> u64 {
    hourglass::metrics::INGRESS_RECORDS.with_label_values(&[ingress, outcome]).get()
}

async fn state_of(
    client: &mut proto::scheduler_client::SchedulerClient<tonic::transport::Channel>,
    id: &str,
) -> State {
    let got = client.get(proto::GetRequest { id: id.into(), ..Default::default() }).await.unwrap();
    got.into_inner().state()
}

/// Standalone: no cluster, no log; the ingress topic is created with a
/// partition per shard, and where each was read to is kept in its store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_kafka_native_records_get_the_checks_of_a_call() {
    let broker = Broker::start();
    let ingress = random_name("ingress");
    let in_config = ingress.clone();
    let config = move |broker: &Broker, dir: &Path| Config {
        shards: 2,
        ingress: Some(in_config.clone()),
        ..config(broker, dir)
    };
    native_records_get_the_checks_of_a_call(&broker, &ingress, config).await;
    assert_eq!(broker.partitions(&ingress).await, 2, "a partition per shard");
}

/// Cluster mode: the same, each partition read by its shard's owner, and
/// where it got to kept in the schedule log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_native_records_on_the_ingress_topic_get_the_checks_of_a_call() {
    let broker = Broker::start();
    let log_topic = random_name("hourglass-log");
    let ingress = format!("{log_topic}-ingress");
    let config = move |broker: &Broker, dir: &Path| crate::cluster::cluster_config(broker, dir, &log_topic);
    native_records_get_the_checks_of_a_call(&broker, &ingress, config).await;
}

/// A record that breaks the format, or names a topic that does not
/// exist, is refused and parks nothing; a tombstone cancels; the node
/// reads on after a restart from where it noted, taking nothing twice.
async fn native_records_get_the_checks_of_a_call(
    broker: &Broker,
    ingress: &str,
    config: impl Fn(&Broker, &Path) -> Config,
) {
    let topic = random_name("native");
    broker.create_topic(&topic, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let server = Hourglass::start(config(broker, dir.path())).await;
    let mut client = server.client().await;
    let producer = native_producer(broker);
    let t = topic.as_str();
    send_native(
        &producer,
        ingress,
        "native-1",
        Some("hello"),
        &[("hourglass-topic", t), ("hourglass-delay", "500ms"), ("hourglass-key", "k1"), ("trace", "t-9")],
    )
    .await;
    send_native(&producer, ingress, "native-bad", Some("x"), &[("hourglass-topic", t)]).await;
    send_native(
        &producer,
        ingress,
        "native-2",
        Some("later"),
        &[("hourglass-topic", t), ("hourglass-delay", "1h")],
    )
    .await;
    // Cancelling by tombstone, after its schedule: in order per id.
    send_native(&producer, ingress, "native-2", None, &[]).await;
    // A topic that does not exist: refused, as `Schedule` refuses it.
    let missing = random_name("missing");
    send_native(
        &producer,
        ingress,
        "native-lost",
        Some("v"),
        &[("hourglass-topic", &missing), ("hourglass-delay", "0")],
    )
    .await;
    // The ingress topic itself: no message may loop back into it.
    send_native(
        &producer,
        ingress,
        "native-loop",
        Some("v"),
        &[("hourglass-topic", ingress), ("hourglass-delay", "0")],
    )
    .await;

    let got = consume_async(broker, &topic, 1, Duration::from_secs(20), Duration::from_millis(1500)).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].id(), "native-1");
    assert_eq!(got[0].key.as_deref(), Some(&b"k1"[..]));
    assert_eq!(got[0].header("trace"), Some("t-9"));
    assert_eq!(state_of(&mut client, "native-2").await, State::Cancelled);
    let started = std::time::Instant::now();
    while ingress_count(ingress, "refused") < 3 {
        assert!(started.elapsed() < Duration::from_secs(20), "the bad records were not refused");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for id in ["native-bad", "native-lost", "native-loop"] {
        let status = client.get(proto::GetRequest { id: id.into(), ..Default::default() }).await.unwrap_err();
        assert_eq!(status.code(), Code::NotFound, "{id} parked nothing: {status:?}");
    }
    assert_eq!(ingress_count(ingress, "scheduled"), 2);
    assert_eq!(ingress_count(ingress, "cancelled"), 1);
    server.stop().await;

    // A restart reads on from the offset it noted: nothing is taken
    // again, and what came meanwhile is.
    send_native(
        &producer,
        ingress,
        "native-3",
        Some("after"),
        &[("hourglass-topic", t), ("hourglass-delay", "0")],
    )
    .await;
    let server = Hourglass::start(config(broker, dir.path())).await;
    let got = consume_async(broker, &topic, 2, Duration::from_secs(20), Duration::from_millis(1500)).await;
    assert_eq!(got.iter().map(|r| r.id()).collect::<Vec<_>>(), ["native-1", "native-3"]);
    assert_eq!(ingress_count(ingress, "scheduled"), 3, "only native-3 again");
    assert_eq!(ingress_count(ingress, "duplicate"), 0, "nothing read twice");
    server.stop().await;
}
