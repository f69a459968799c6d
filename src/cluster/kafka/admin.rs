//! The topics hourglass keeps for itself in cluster mode: the schedule log,
//! created when absent (compacted, with the asked partition count) and
//! checked when present. Admin calls only; no records are read or written.

use std::{sync::Arc, time::Duration};

use rdkafka::{
    ClientConfig,
    admin::{AdminClient, AdminOptions, NewTopic, TopicReplication},
    client::DefaultClientContext,
    error::RDKafkaErrorCode,
};

use crate::kafka::KafkaConfig;

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
    #[error("creating the log topic {topic}: {reason}")]
    Create { topic: String, reason: String },
    #[error("reading the metadata of the log topic {topic} from {brokers}: {reason}")]
    Metadata { topic: String, brokers: String, reason: String },
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
    if let Some(found) = partitions_of(&admin, config, topic, timeout).await? {
        return check(topic, found).map(|()| Ensured::Existed);
    }
    let replication = TopicReplication::Fixed(topic.replication.unwrap_or(-1));
    // Tombstones are kept a day (Kafka's default, set so that a broker
    // default cannot shorten it): a copy of a shard behind by more than
    // half of that is rebuilt, not brought up to date (see
    // `cluster::applier::STALE_AFTER`).
    let new = NewTopic::new(&topic.name, topic.partitions, replication)
        .set("cleanup.policy", "compact")
        .set("delete.retention.ms", "86400000");
    let options = AdminOptions::new().operation_timeout(Some(timeout));
    let created = admin
        .create_topics([&new], &options)
        .await
        .map_err(|e| TopicError::Create { topic: topic.name.clone(), reason: e.to_string() })?;
    for result in created {
        match result {
            Ok(_) => {}
            // Another node won the race: check what it made.
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {
                let found = partitions_of(&admin, config, topic, timeout).await?.unwrap_or(0);
                return check(topic, found).map(|()| Ensured::Existed);
            }
            Err((_, code)) => {
                return Err(TopicError::Create { topic: topic.name.clone(), reason: code.to_string() });
            }
        }
    }
    Ok(Ensured::Created)
}

fn check(topic: &LogTopic, found: i32) -> Result<(), TopicError> {
    if found == topic.partitions {
        Ok(())
    } else {
        Err(TopicError::PartitionCount { topic: topic.name.clone(), found, asked: topic.partitions })
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

/// The topic's partition count; none if the broker does not know it.
async fn partitions_of(
    admin: &Arc<AdminClient<DefaultClientContext>>,
    config: &KafkaConfig,
    topic: &LogTopic,
    timeout: Duration,
) -> Result<Option<i32>, TopicError> {
    let name = topic.name.clone();
    let admin = Arc::clone(admin);
    let read = tokio::task::spawn_blocking(move || {
        let metadata = admin.inner().fetch_metadata(Some(&name), timeout)?;
        Ok::<_, rdkafka::error::KafkaError>(
            metadata
                .topics()
                .iter()
                .find(|t| t.name() == name && t.error().is_none())
                .map(|t| t.partitions().len() as i32)
                .filter(|n| *n > 0),
        )
    })
    .await
    .map_err(|e| metadata_error(config, topic, e.to_string()))?;
    read.map_err(|e| metadata_error(config, topic, e.to_string()))
}

fn metadata_error(config: &KafkaConfig, topic: &LogTopic, reason: String) -> TopicError {
    TopicError::Metadata { topic: topic.name.clone(), brokers: config.brokers.clone(), reason }
}
