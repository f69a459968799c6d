//! Cluster mode's schedule log topic against a real broker: created when
//! absent with the asked partition count, found when present, a different
//! count refused with what to do about it, and two nodes creating it at
//! once both go on.

mod common;

use std::time::Duration;

use common::*;
use hourglass::kafka::{Ensured, KafkaConfig, LogTopic, TopicError, ensure_log_topic};

const TIMEOUT: Duration = Duration::from_secs(10);

fn kafka(broker: &Broker) -> KafkaConfig {
    KafkaConfig { brokers: broker.addr().to_owned(), properties: Default::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_topic_is_created_once_and_its_partition_count_is_kept() {
    let broker = Broker::start();
    let config = kafka(&broker);
    let topic = LogTopic { name: random_name("log"), partitions: 6, replication: None };
    assert_eq!(ensure_log_topic(&config, &topic, TIMEOUT).await.unwrap(), Ensured::Created);
    assert_eq!(ensure_log_topic(&config, &topic, TIMEOUT).await.unwrap(), Ensured::Existed);

    let other = LogTopic { partitions: 12, ..topic.clone() };
    let err = ensure_log_topic(&config, &other, TIMEOUT).await.unwrap_err();
    assert!(matches!(err, TopicError::PartitionCount { found: 6, asked: 12, .. }), "{err}");
    let said = err.to_string();
    assert!(said.contains("--log-partitions 6") && said.contains(&topic.name), "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_creating_the_log_topic_at_once_both_go_on() {
    let broker = Broker::start();
    let config = kafka(&broker);
    let topic = LogTopic { name: random_name("log"), partitions: 3, replication: None };
    let (a, b) =
        tokio::join!(ensure_log_topic(&config, &topic, TIMEOUT), ensure_log_topic(&config, &topic, TIMEOUT));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert!(a == Ensured::Created || b == Ensured::Created, "one of them made it: {a:?} {b:?}");
    assert_eq!(ensure_log_topic(&config, &topic, TIMEOUT).await.unwrap(), Ensured::Existed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_broker_is_named() {
    let config =
        KafkaConfig { brokers: format!("127.0.0.1:{}", free_port()), properties: Default::default() };
    let topic = LogTopic { name: random_name("log"), partitions: 3, replication: None };
    let err = ensure_log_topic(&config, &topic, Duration::from_secs(2)).await.unwrap_err();
    assert!(matches!(err, TopicError::Metadata { .. }), "{err}");
    assert!(err.to_string().contains(&config.brokers), "{err}");
}
