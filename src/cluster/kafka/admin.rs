//! The topics hourglass keeps for itself in cluster mode (the schedule log
//! and its routing topic): created when absent (compacted, with the asked
//! partition count and replication, and `min.insync.replicas` 2 where there
//! are three replicas or more), and checked for what the store's
//! assumptions need: the partition count, compaction, how long tombstones
//! are kept, and copies enough that an acknowledged append survives a
//! broker. Admin calls only; no records are read or written.

use std::{sync::Arc, time::Duration};

use rdkafka::{
    ClientConfig,
    admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication},
    client::DefaultClientContext,
    error::RDKafkaErrorCode,
};

use crate::kafka::KafkaConfig;

/// How long Kafka must keep a tombstone once compaction reached it: a copy
/// of a shard behind by more than half of this is rebuilt, not brought up
/// to date (see `cluster::applier::STALE_AFTER`). A day, Kafka's default;
/// set explicitly on creation so that a broker default cannot shorten it.
const TOMBSTONES_KEPT_MS: i64 = 86_400_000;

/// How long a broker may take to describe a topic's configuration.
const DESCRIBE_WITHIN: Duration = Duration::from_secs(5);

/// The schedule log topic as a node is configured for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogTopic {
    pub name: String,
    /// Fixed once the topic exists: every message id belongs to one
    /// partition by its hash.
    pub partitions: i32,
    /// Replicas of each partition; none: the broker's default.
    pub replication: Option<i32>,
}

/// What [`ensure_log_topic`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ensured {
    Created,
    Existed,
}

#[derive(Debug, thiserror::Error)]
pub enum TopicError {
    #[error(
        "the log topic {topic} has {found} partitions but --log-partitions is {asked}: each message id \
         belongs to one partition by its hash, so the count is fixed once the topic exists. Start with \
         --log-partitions {found}, or name a new topic with --log-topic"
    )]
    PartitionCount { topic: String, found: i32, asked: i32 },
    #[error("creating the topic {topic}: {reason}")]
    Create { topic: String, reason: String },
    #[error("creating the consumer of the topic {topic}: {reason}")]
    Consumer { topic: String, reason: String },
    #[error("reading the metadata of the topic {topic} from {brokers}: {reason}")]
    Metadata { topic: String, brokers: String, reason: String },
    #[error(
        "the topic {topic} {problem}: hourglass keeps the schedule (and its routes) in such topics for \
         good, and one that deletes records by age or drops tombstones early loses messages. Fix it with \
         `kafka-configs.sh --bootstrap-server {brokers} --alter --entity-type topics --entity-name {topic} \
         --add-config {fix}`, or name a new topic (hourglass creates it as it needs it)"
    )]
    Config { topic: String, problem: String, brokers: String, fix: String },
    #[error(
        "the topic {topic} has min.insync.replicas={min_insync} but {replicas} replica(s): no append can be \
         acknowledged. Fix it with `kafka-configs.sh --bootstrap-server {brokers} --alter --entity-type \
         topics --entity-name {topic} --add-config min.insync.replicas={fix}`"
    )]
    Unwritable { topic: String, min_insync: i32, replicas: i32, brokers: String, fix: i32 },
}

/// A topic's partitions and copies, as the brokers' metadata says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shape {
    partitions: i32,
    /// The fewest replicas any partition has.
    replicas: i32,
    /// Brokers in the cluster.
    brokers: i32,
}

/// Makes sure the log topic exists with `topic.partitions` partitions:
/// creates it (compacted) when absent, checks its partition count when
/// present. Another node creating it at the same time is fine.
pub async fn ensure_log_topic(
    config: &KafkaConfig,
    topic: &LogTopic,
    timeout: Duration,
) -> Result<Ensured, TopicError> {
    let admin = Arc::new(admin(config).map_err(|e| metadata_error(config, topic, e.to_string()))?);
    if let Some(found) = shape_of(&admin, config, topic, timeout).await? {
        check(topic, found.partitions)?;
        return check_config(&admin, config, topic, found, timeout).await.map(|()| Ensured::Existed);
    }
    let replication = TopicReplication::Fixed(topic.replication.unwrap_or(-1));
    // Tombstones are kept a day (Kafka's default, set so that a broker
    // default cannot shorten it): a copy of a shard behind by more than
    // half of that is rebuilt, not brought up to date (see
    // `cluster::applier::STALE_AFTER`).
    let tombstones_kept = TOMBSTONES_KEPT_MS.to_string();
    let mut new = NewTopic::new(&topic.name, topic.partitions, replication)
        .set("cleanup.policy", "compact")
        .set("delete.retention.ms", &tombstones_kept);
    let min_insync = new_min_insync(topic);
    if let Some(min_insync) = min_insync {
        new = new.set("min.insync.replicas", min_insync);
    }
    if create(&admin, topic, new, timeout).await? {
        // Configured here; its copies are the broker's default unless
        // --log-replication said.
        if let Some(found) = shape_of(&admin, config, topic, timeout).await? {
            if let Durability::Weak(why) = durability(found, min_insync) {
                tracing::warn!(topic = %topic.name, replicas = found.replicas, brokers = found.brokers, "{why}");
            }
        }
        return Ok(Ensured::Created);
    }
    // Another node won the race: check what it made.
    let found = shape_of(&admin, config, topic, timeout).await?;
    let found = found.unwrap_or(Shape { partitions: 0, replicas: 0, brokers: 0 });
    check(topic, found.partitions)?;
    check_config(&admin, config, topic, found, timeout).await.map(|()| Ensured::Existed)
}

/// The `min.insync.replicas` a log topic is made with: 2 with three copies
/// or more, so that an acknowledged append survives a broker; none
/// (the broker's default) otherwise.
fn new_min_insync(topic: &LogTopic) -> Option<&'static str> {
    topic.replication.is_some_and(|r| r >= 3).then_some("2")
}

/// Makes sure an ingress topic (Kafka-native schedules) exists: created
/// when absent with the log's partition count and replication, and
/// Kafka's default cleanup (its records are turned into the log's and
/// need not be kept). Returns its partition count, whatever it is: each
/// of its partitions is read by the owner of the shard of the same number
/// modulo the shard count.
pub(super) async fn ensure_ingress_topic(
    config: &KafkaConfig,
    topic: &LogTopic,
    timeout: Duration,
) -> Result<i32, TopicError> {
    let admin = Arc::new(admin(config).map_err(|e| metadata_error(config, topic, e.to_string()))?);
    if let Some(found) = shape_of(&admin, config, topic, timeout).await? {
        return Ok(found.partitions);
    }
    let replication = TopicReplication::Fixed(topic.replication.unwrap_or(-1));
    create(&admin, topic, NewTopic::new(&topic.name, topic.partitions, replication), timeout).await?;
    // Made here or by another node meanwhile: as the broker says now.
    Ok(shape_of(&admin, config, topic, timeout).await?.map_or(topic.partitions, |found| found.partitions))
}

/// Creates `new`; false when it exists already (another node won the
/// race).
async fn create(
    admin: &AdminClient<DefaultClientContext>,
    topic: &LogTopic,
    new: NewTopic<'_>,
    timeout: Duration,
) -> Result<bool, TopicError> {
    let options = AdminOptions::new().operation_timeout(Some(timeout));
    let created = admin
        .create_topics([&new], &options)
        .await
        .map_err(|e| TopicError::Create { topic: topic.name.clone(), reason: e.to_string() })?;
    for result in created {
        match result {
            Ok(_) => {}
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => return Ok(false),
            Err((_, code)) => {
                return Err(TopicError::Create { topic: topic.name.clone(), reason: code.to_string() });
            }
        }
    }
    Ok(true)
}

fn check(topic: &LogTopic, found: i32) -> Result<(), TopicError> {
    if found == topic.partitions {
        Ok(())
    } else {
        Err(TopicError::PartitionCount { topic: topic.name.clone(), found, asked: topic.partitions })
    }
}

/// Refuses an existing topic whose configuration would lose messages:
/// deleted by age or size (a message due in ten days on a topic kept
/// seven), or tombstones dropped before a copy of a shard is rebuilt.
/// A setting the broker does not report has Kafka's default (a broker that
/// reports only what a topic was created with, as Tansu does); a
/// configuration the broker does not describe at all is warned of, not
/// refused.
async fn check_config(
    admin: &AdminClient<DefaultClientContext>,
    config: &KafkaConfig,
    topic: &LogTopic,
    shape: Shape,
    timeout: Duration,
) -> Result<(), TopicError> {
    // A broker answers at once; one that does not describe configurations
    // (librdkafka's mock cluster) is not waited on for long.
    let options = AdminOptions::new().request_timeout(Some(timeout.min(DESCRIBE_WITHIN)));
    let described = admin.describe_configs([&ResourceSpecifier::Topic(&topic.name)], &options).await;
    let resource = match described.map(|mut all| all.pop()) {
        Ok(Some(Ok(resource))) => resource,
        unknown => {
            // Unknown is not wrong: say so, and go on.
            let why = match unknown {
                Err(e) => e.to_string(),
                Ok(Some(Err(code))) => code.to_string(),
                _ => "the broker described no configuration".to_owned(),
            };
            tracing::warn!(
                topic = %topic.name,
                error = %why,
                "could not read the topic's configuration: make sure it is compacted and keeps tombstones a \
                 day or more (delete.retention.ms), or it can lose messages"
            );
            return Ok(());
        }
    };
    let value = |name: &str| resource.get(name).and_then(|e| e.value.clone());
    let problem = config_problem(
        value("cleanup.policy").as_deref(),
        value("retention.ms").as_deref(),
        value("retention.bytes").as_deref(),
        value("delete.retention.ms").as_deref(),
    );
    if let Some((problem, fix)) = problem {
        return Err(TopicError::Config {
            topic: topic.name.clone(),
            problem,
            brokers: config.brokers.clone(),
            fix,
        });
    }
    match durability(shape, value("min.insync.replicas").as_deref()) {
        Durability::Enough => Ok(()),
        Durability::Unwritable { min_insync, fix } => Err(TopicError::Unwritable {
            topic: topic.name.clone(),
            min_insync,
            replicas: shape.replicas,
            brokers: config.brokers.clone(),
            fix,
        }),
        Durability::Weak(why) => {
            tracing::warn!(topic = %topic.name, replicas = shape.replicas, brokers = shape.brokers, "{why}");
            Ok(())
        }
    }
}

/// Whether appends to a topic so copied survive a broker.
#[derive(Debug, PartialEq, Eq)]
enum Durability {
    Enough,
    /// Every append would be refused (NOT_ENOUGH_REPLICAS): `fix` is a
    /// `min.insync.replicas` that lets them in.
    Unwritable {
        min_insync: i32,
        fix: i32,
    },
    /// Writable, but a broker lost can lose acknowledged appends.
    Weak(String),
}

/// How durable the topic is: `min_insync` as described (Kafka's default,
/// 1, when not); a single broker's one copy is all it can have.
fn durability(shape: Shape, min_insync: Option<&str>) -> Durability {
    let min_insync = min_insync.and_then(|v| v.trim().parse::<i32>().ok()).unwrap_or(1);
    let Shape { replicas, brokers, .. } = shape;
    if replicas > 0 && min_insync > replicas {
        return Durability::Unwritable { min_insync, fix: (replicas - 1).max(1) };
    }
    if replicas > 0 && replicas < 3 && brokers >= 3 {
        return Durability::Weak(format!(
            "the topic has {replicas} replica(s) on a cluster of {brokers} brokers: losing {replicas} \
             broker(s) loses the schedule; give it 3 (kafka-reassign-partitions.sh) and \
             min.insync.replicas=2, or name a new topic with --log-replication 3"
        ));
    }
    if replicas >= 3 && min_insync < 2 {
        return Durability::Weak(format!(
            "the topic has min.insync.replicas={min_insync}: an append its leader alone acknowledged is \
             lost if the leader fails before a follower copies it; set min.insync.replicas=2 \
             (kafka-configs.sh --alter --add-config min.insync.replicas=2)"
        ));
    }
    Durability::Enough
}

/// What is wrong with a topic so configured (Kafka's default for a setting
/// not given), and the settings that fix it.
fn config_problem(
    cleanup: Option<&str>,
    retention_ms: Option<&str>,
    retention_bytes: Option<&str>,
    tombstones_ms: Option<&str>,
) -> Option<(String, String)> {
    let cleanup = cleanup.unwrap_or("delete");
    let policies: Vec<&str> = cleanup.split(',').map(str::trim).collect();
    let unbounded = |v: Option<&str>| v.is_some_and(|v| v.trim() == "-1");
    let kept = TOMBSTONES_KEPT_MS;
    if !policies.contains(&"compact") {
        return Some((
            format!("has cleanup.policy={cleanup}, not compact"),
            format!("cleanup.policy=compact,delete.retention.ms={kept}"),
        ));
    }
    if policies.contains(&"delete") && !(unbounded(retention_ms) && unbounded(retention_bytes)) {
        return Some((
            format!(
                "has cleanup.policy={cleanup} with retention.ms={} and retention.bytes={}: records are \
                 deleted by age or size",
                retention_ms.unwrap_or("604800000 (the default)"),
                retention_bytes.unwrap_or("-1 (the default)")
            ),
            "cleanup.policy=compact".to_owned(),
        ));
    }
    let tombstones = tombstones_ms.map_or(Ok(kept), |v| v.trim().parse::<i64>());
    match tombstones {
        Ok(ms) if ms >= kept => None,
        _ => Some((
            format!(
                "keeps tombstones for delete.retention.ms={}, less than a day",
                tombstones_ms.unwrap_or_default()
            ),
            format!("delete.retention.ms={kept}"),
        )),
    }
}

fn admin(config: &KafkaConfig) -> rdkafka::error::KafkaResult<AdminClient<DefaultClientContext>> {
    let mut client = ClientConfig::new();
    client.set("bootstrap.servers", &config.brokers);
    for (k, v) in &config.properties {
        client.set(k, v);
    }
    client.create()
}

/// The topic's partitions and copies; none if the broker does not know it.
async fn shape_of(
    admin: &Arc<AdminClient<DefaultClientContext>>,
    config: &KafkaConfig,
    topic: &LogTopic,
    timeout: Duration,
) -> Result<Option<Shape>, TopicError> {
    let name = topic.name.clone();
    let admin = Arc::clone(admin);
    let read = tokio::task::spawn_blocking(move || {
        let metadata = admin.inner().fetch_metadata(Some(&name), timeout)?;
        let brokers = metadata.brokers().len() as i32;
        Ok::<_, rdkafka::error::KafkaError>(
            metadata
                .topics()
                .iter()
                .find(|t| t.name() == name && t.error().is_none())
                .filter(|t| !t.partitions().is_empty())
                .map(|t| Shape {
                    partitions: t.partitions().len() as i32,
                    replicas: t.partitions().iter().map(|p| p.replicas().len() as i32).min().unwrap_or(0),
                    brokers,
                }),
        )
    })
    .await
    .map_err(|e| metadata_error(config, topic, e.to_string()))?;
    read.map_err(|e| metadata_error(config, topic, e.to_string()))
}

fn metadata_error(config: &KafkaConfig, topic: &LogTopic, reason: String) -> TopicError {
    TopicError::Metadata { topic: topic.name.clone(), brokers: config.brokers.clone(), reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compacted_topic_that_keeps_tombstones_a_day_or_more_is_taken() {
        assert_eq!(config_problem(Some("compact"), None, None, Some("86400000")), None);
        assert_eq!(config_problem(Some("compact"), Some("604800000"), None, None), None, "retention is moot");
        assert_eq!(config_problem(Some("compact"), None, None, Some("604800000")), None);
        assert_eq!(
            config_problem(Some("compact,delete"), Some("-1"), Some("-1"), None),
            None,
            "deletes nothing"
        );
    }

    #[test]
    fn a_topic_that_would_lose_messages_is_refused_with_the_fix() {
        let (problem, fix) = config_problem(None, None, None, None).unwrap();
        assert!(problem.contains("cleanup.policy=delete"), "Kafka's default: {problem}");
        assert_eq!(fix, "cleanup.policy=compact,delete.retention.ms=86400000");
        let (problem, fix) = config_problem(Some("delete"), Some("604800000"), None, None).unwrap();
        assert!(problem.contains("not compact"), "{problem}");
        assert!(fix.starts_with("cleanup.policy=compact"), "{fix}");
        let (problem, fix) = config_problem(Some("compact,delete"), Some("604800000"), None, None).unwrap();
        assert!(problem.contains("deleted by age or size"), "{problem}");
        assert_eq!(fix, "cleanup.policy=compact");
        let (problem, fix) = config_problem(Some("compact"), None, None, Some("60000")).unwrap();
        assert!(problem.contains("delete.retention.ms=60000"), "{problem}");
        assert_eq!(fix, "delete.retention.ms=86400000");
        assert!(config_problem(Some("compact"), None, None, Some("a day")).is_some(), "unreadable");
    }

    #[test]
    fn copies_are_checked_against_the_brokers_and_min_insync_replicas() {
        let shape = |replicas, brokers| Shape { partitions: 12, replicas, brokers };
        // A single broker (Tansu, a laptop) has one copy to give.
        assert_eq!(durability(shape(1, 1), None), Durability::Enough);
        assert_eq!(durability(shape(3, 3), Some("2")), Durability::Enough);
        assert_eq!(durability(shape(3, 5), Some("3")), Durability::Enough, "strict, but writable");
        assert_eq!(
            durability(shape(3, 3), Some("4")),
            Durability::Unwritable { min_insync: 4, fix: 2 },
            "no append could be acknowledged"
        );
        assert_eq!(durability(shape(1, 1), Some("2")), Durability::Unwritable { min_insync: 2, fix: 1 });
        let Durability::Weak(why) = durability(shape(1, 3), None) else {
            panic!("one copy of three brokers")
        };
        assert!(why.contains("1 replica(s) on a cluster of 3 brokers"), "{why}");
        let Durability::Weak(why) = durability(shape(3, 3), None) else { panic!("the default min.insync") };
        assert!(why.contains("min.insync.replicas=1"), "{why}");
        // Metadata without replicas (a mock broker) says nothing.
        assert_eq!(durability(shape(0, 0), Some("2")), Durability::Enough);
    }
}
