//! An ingress topic read by the log's consumer ([`LogConsumer`], which
//! reads a partition from an offset, each into a queue of its own), as the
//! ingress reads it ([`Feed`]). Standalone and in cluster mode alike.

use std::{sync::Arc, time::Duration};

use rdkafka::{Message as _, message::Headers as _};

use super::{
    LogTopic, TopicError,
    admin::ensure_ingress_topic,
    log::{LogConsumer, LogReader, timestamp},
};
use crate::{
    ingress::{Feed, FeedError, PartitionFeed, Raw},
    kafka::KafkaConfig,
};

/// How long asking a partition's end may take.
const END_TIMEOUT: Duration = Duration::from_secs(5);

/// An ingress topic: created if missing (with `topic`'s partitions and
/// replication) when first asked for its partitions, then read committed.
pub struct IngressFeed {
    consumer: Arc<LogConsumer>,
    config: KafkaConfig,
    topic: LogTopic,
    timeout: Duration,
    partitions: tokio::sync::OnceCell<i32>,
}

impl IngressFeed {
    /// `timeout`: how long making or reading the topic may take, each try.
    pub fn new(config: &KafkaConfig, topic: LogTopic, timeout: Duration) -> Result<IngressFeed, TopicError> {
        let consumer = LogConsumer::committed(config, &topic.name)
            .map_err(|e| TopicError::Consumer { topic: topic.name.clone(), reason: e.to_string() })?;
        let partitions = tokio::sync::OnceCell::new();
        Ok(IngressFeed { consumer, config: config.clone(), topic, timeout, partitions })
    }
}

#[tonic::async_trait]
impl Feed for IngressFeed {
    fn topic(&self) -> &str {
        &self.topic.name
    }

    async fn partitions(&self) -> Result<i32, FeedError> {
        let ensured = ensure_ingress_topic(&self.config, &self.topic, self.timeout);
        let found = self.partitions.get_or_try_init(|| ensured).await;
        found.copied().map_err(|e| FeedError(e.to_string()))
    }

    fn open(&self, partition: i32, offset: i64) -> Result<Arc<dyn PartitionFeed>, FeedError> {
        let reader = self.consumer.reader(partition, offset).map_err(|e| FeedError(e.to_string()))?;
        Ok(Arc::new(Reading(Arc::new(reader))))
    }
}

struct Reading(Arc<LogReader>);

#[tonic::async_trait]
impl PartitionFeed for Reading {
    async fn next(&self, max: usize) -> Result<Vec<Raw>, FeedError> {
        self.0.next_with(max, |m, _| raw(m)).await.map_err(|e| FeedError(e.to_string()))
    }

    async fn seek(&self, offset: i64) -> Result<(), FeedError> {
        let reader = Arc::clone(&self.0);
        match tokio::task::spawn_blocking(move || reader.seek_to(offset)).await {
            Ok(result) => result.map_err(|e| FeedError(e.to_string())),
            Err(e) => Err(FeedError(e.to_string())),
        }
    }

    async fn end(&self) -> Result<i64, FeedError> {
        let reader = Arc::clone(&self.0);
        match tokio::task::spawn_blocking(move || reader.end(END_TIMEOUT)).await {
            Ok(result) => result.map_err(|e| FeedError(e.to_string())),
            Err(e) => Err(FeedError(e.to_string())),
        }
    }
}

fn raw(m: &rdkafka::message::BorrowedMessage<'_>) -> Raw {
    let headers = m
        .headers()
        .map(|h| h.iter().map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec))).collect())
        .unwrap_or_default();
    Raw {
        offset: m.offset(),
        at: timestamp(m.timestamp()).unwrap_or_default(),
        key: m.key().map(<[u8]>::to_vec),
        value: m.payload().map(<[u8]>::to_vec),
        headers,
    }
}
