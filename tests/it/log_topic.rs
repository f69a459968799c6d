//! Cluster mode's schedule log topic against a real broker: created when
//! absent with the asked partition count, found when present, a different
//! count or a configuration that would lose messages refused with what to
//! do about it, and two nodes creating it at once both go on.

use crate::common;

use std::{sync::Arc, time::Duration};

use common::*;
use hourglass::{
    cluster::kafka::{Ensured, LogTopic, TopicError, ensure_log_topic},
    kafka::KafkaConfig,
};

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

/// Creates `name` as an operator would by hand, with `configs`.
async fn made_by_hand(broker: &Broker, name: &str, partitions: i32, configs: &[(&str, &str)]) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<_> =
        rdkafka::ClientConfig::new().set("bootstrap.servers", broker.addr()).create().unwrap();
    let topic = configs
        .iter()
        .fold(NewTopic::new(name, partitions, TopicReplication::Fixed(1)), |topic, (k, v)| topic.set(k, v));
    for created in admin.create_topics([&topic], &AdminOptions::new()).await.unwrap() {
        created.unwrap();
    }
}

/// A log topic made by hand with Kafka's defaults (deleted by age) would
/// lose every message due after its retention: neither the library nor a
/// node takes it, and both say how to fix it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_topic_that_deletes_by_age_is_refused_with_the_fix() {
    let broker = Broker::start();
    let config = kafka(&broker);
    let name = random_name("log");
    made_by_hand(&broker, &name, 3, &[("cleanup.policy", "delete"), ("retention.ms", "3600000")]).await;
    let topic = LogTopic { name: name.clone(), partitions: 3, replication: None };
    let err = ensure_log_topic(&config, &topic, TIMEOUT).await.unwrap_err();
    assert!(matches!(err, TopicError::Config { .. }), "{err}");
    let said = err.to_string();
    assert!(said.contains("cleanup.policy=delete") && said.contains("kafka-configs.sh"), "{said}");
    assert!(said.contains("--add-config cleanup.policy=compact"), "{said}");

    // A node started on it stops at once, saying the same.
    let dir = tempfile::tempdir().unwrap();
    let mut node = std::process::Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .args(["serve", "--cluster", "--log-topic", &name, "--log-partitions", "3"])
        .arg("--cluster-key-file")
        .arg(hourglass_testkit::cluster_key_file().unwrap())
        .args([
            "--kafka-brokers",
            broker.addr(),
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let began = std::time::Instant::now();
    while node.try_wait().unwrap().is_none() {
        if began.elapsed() > Duration::from_secs(60) {
            node.kill().unwrap();
            panic!("the node still runs on a topic that deletes by age");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let out = node.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("cleanup.policy=delete") && stderr.contains("kafka-configs.sh"), "{stderr}");
}

/// Compacted, but tombstones dropped after a minute: a copy of a shard
/// rebuilt later would bring delivered messages back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_topic_that_drops_tombstones_early_is_refused() {
    let broker = Broker::start();
    let name = random_name("log");
    made_by_hand(&broker, &name, 2, &[("cleanup.policy", "compact"), ("delete.retention.ms", "60000")]).await;
    let topic = LogTopic { name, partitions: 2, replication: None };
    let err = ensure_log_topic(&kafka(&broker), &topic, TIMEOUT).await.unwrap_err();
    let said = err.to_string();
    assert!(
        said.contains("delete.retention.ms=60000")
            && said.contains("--add-config delete.retention.ms=86400000"),
        "{said}"
    );
}

/// `min.insync.replicas` above the topic's copies: every append would be
/// refused (NOT_ENOUGH_REPLICAS), so the node does not start on it, and
/// says the setting that lets appends in. (Shown on Tansu, one broker, one
/// copy; Apache Kafka reports the same settings.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_topic_no_append_could_be_acknowledged_on_is_refused() {
    let broker = Broker::start();
    let name = random_name("log");
    made_by_hand(&broker, &name, 2, &[("cleanup.policy", "compact"), ("min.insync.replicas", "2")]).await;
    let topic = LogTopic { name: name.clone(), partitions: 2, replication: None };
    let err = ensure_log_topic(&kafka(&broker), &topic, TIMEOUT).await.unwrap_err();
    assert!(matches!(err, TopicError::Unwritable { min_insync: 2, replicas: 1, fix: 1, .. }), "{err}");
    let said = err.to_string();
    assert!(said.contains(&name) && said.contains("--add-config min.insync.replicas=1"), "{said}");
    // One broker's one copy, with Kafka's default, is all it can have.
    let fine = random_name("log");
    made_by_hand(&broker, &fine, 2, &[("cleanup.policy", "compact")]).await;
    let topic = LogTopic { name: fine, partitions: 2, replication: None };
    assert_eq!(ensure_log_topic(&kafka(&broker), &topic, TIMEOUT).await.unwrap(), Ensured::Existed);
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

/// Offsets `reader` reads next, until `n` of them, within 20 s; each
/// record must carry the cluster's seal.
async fn offsets(reader: &hourglass::cluster::kafka::LogReader, n: usize) -> Vec<i64> {
    let mut out = Vec::new();
    let reading = async {
        while out.len() < n {
            let read = reader.next_with(n - out.len(), |m, sealed| (rdkafka::Message::offset(m), sealed));
            for (offset, sealed) in read.await.unwrap() {
                assert!(sealed, "the record at {offset} carries the seal the producer put on it");
                out.push(offset);
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), reading).await.expect("the records within 20 s");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_consumer_reads_each_partition_on_its_own_and_moves_each_alone() {
    use hourglass::cluster::{
        ClusterKey,
        kafka::{LogConsumer, LogProducer},
    };
    let broker = Broker::start();
    let config = kafka(&broker);
    let topic = random_name("log");
    broker.create_topic(&topic, 2).await;
    let key = ClusterKey::load(&hourglass_testkit::cluster_key_file().unwrap()).unwrap();
    let producer = LogProducer::new(&config, &topic, &key).unwrap();
    // One record per batch: a fetch from inside a batch is not what is
    // tested here.
    for partition in [0, 1] {
        for i in 0..10 {
            producer.enqueue(partition, format!("k{i}").as_bytes(), Some(b"v")).await.unwrap();
        }
    }
    let consumer = LogConsumer::new(&config, &topic, &key).unwrap();
    let first = consumer.reader(0, 0).unwrap();
    let second = consumer.reader(1, 5).unwrap();
    assert_eq!(offsets(&first, 10).await, (0..10).collect::<Vec<_>>());
    assert_eq!(offsets(&second, 5).await, (5..10).collect::<Vec<_>>(), "from where it was put");

    // Back, on one partition only.
    let back = Arc::new(first);
    let seeking = Arc::clone(&back);
    tokio::task::spawn_blocking(move || seeking.seek_to(3)).await.unwrap().unwrap();
    assert_eq!(offsets(&back, 7).await, (3..10).collect::<Vec<_>>());

    // Let go, and read again from elsewhere.
    drop(second);
    let again = consumer.reader(1, 2).unwrap();
    assert_eq!(offsets(&again, 8).await, (2..10).collect::<Vec<_>>());

    // Taken over while still held: the new reader reads, and the old
    // one's going changes nothing.
    let taken = consumer.reader(0, 7).unwrap();
    assert_eq!(offsets(&taken, 3).await, vec![7, 8, 9]);
    drop(back);
    producer.enqueue(0, b"k10", Some(b"v")).await.unwrap();
    producer.enqueue(1, b"k10", Some(b"v")).await.unwrap();
    assert_eq!(offsets(&taken, 1).await, vec![10], "still fetched after the old reader went");
    assert_eq!(offsets(&again, 1).await, vec![10]);
}
