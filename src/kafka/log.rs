//! The schedule log's clients: the producer that appends hourglass's own
//! records to it, and the reader that follows one partition.
//!
//! Appends are `acks=all` and idempotent, like deliveries, but bounded in
//! time: a caller waiting for its change is told the log is unreachable
//! (and retries with the same id) rather than waiting forever.

use std::{collections::BTreeMap, time::Duration};

use rdkafka::{
    ClientConfig, Message as _, Offset, TopicPartitionList,
    consumer::{Consumer as _, StreamConsumer},
    error::KafkaError,
    message::{Header, Headers as _, OwnedHeaders},
    producer::{FutureProducer, FutureRecord},
};

use super::{KafkaConfig, is_producer_only, producer_config};
use crate::{
    log::{
        RECORD_HEADER,
        record::{self, Entry, LogRecord},
    },
    message::{Limits, UnixMillis},
};

/// Appends records to the schedule log.
pub struct LogProducer {
    inner: FutureProducer,
    topic: String,
}

impl LogProducer {
    pub fn new(config: &KafkaConfig, topic: &str) -> Result<LogProducer, KafkaError> {
        let mut client = producer_config(config);
        let ours = BTreeMap::from([
            // Appends from many callers travel together.
            ("linger.ms", "2"),
            ("message.timeout.ms", "10000"),
            ("compression.type", "lz4"),
        ]);
        for (k, v) in ours {
            if !config.properties.contains_key(k) {
                client.set(k, v);
            }
        }
        Ok(LogProducer { inner: client.create()?, topic: topic.to_owned() })
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Appends `record` under `key` to `partition`; returns its offset once
    /// every in-sync replica has it.
    pub async fn append(&self, partition: i32, key: &[u8], record: &LogRecord) -> Result<i64, KafkaError> {
        self.enqueue(partition, key, Some(&record.encode())).await
    }

    /// Queues a record now (so that records queued one after another reach
    /// the partition in that order) and returns the wait for its offset.
    pub fn enqueue(
        &self,
        partition: i32,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> impl std::future::Future<Output = Result<i64, KafkaError>> + Send + use<> {
        let headers =
            OwnedHeaders::new().insert(Header { key: RECORD_HEADER, value: Some(record::FORMAT.as_bytes()) });
        let mut out = FutureRecord::to(&self.topic).partition(partition).key(key).headers(headers);
        if let Some(value) = value {
            out = out.payload(value);
        }
        let queued = self.inner.send_result(out).map_err(|(e, _)| e);
        async move {
            match queued?.await {
                Ok(Ok(delivery)) => Ok(delivery.offset),
                Ok(Err((e, _))) => Err(e),
                Err(_) => Err(KafkaError::Canceled),
            }
        }
    }
}

/// Follows one partition of the schedule log.
pub struct LogReader {
    consumer: StreamConsumer,
    topic: String,
    partition: i32,
}

/// A record read, as the store applies it.
pub struct Read {
    pub offset: i64,
    /// The record's timestamp.
    pub at: UnixMillis,
    pub entry: Entry,
}

impl LogReader {
    /// A reader of `partition` of `topic`, from `offset`. It belongs to no
    /// consumer group and commits nothing: where it is lives in the store.
    pub fn new(
        config: &KafkaConfig,
        topic: &str,
        partition: i32,
        offset: i64,
    ) -> Result<LogReader, KafkaError> {
        let mut client = ClientConfig::new();
        let ours = BTreeMap::from([
            ("bootstrap.servers", config.brokers.as_str()),
            ("group.id", "hourglass-log-reader"),
            ("enable.auto.commit", "false"),
            ("enable.auto.offset.store", "false"),
            ("auto.offset.reset", "earliest"),
            // Wake as soon as a record is there.
            ("fetch.wait.max.ms", "20"),
            ("fetch.min.bytes", "1"),
            // The log is the truth of every store: a record damaged on the
            // way is fetched again, not applied.
            ("check.crcs", "true"),
            ("reconnect.backoff.max.ms", "1000"),
        ]);
        for (k, v) in ours {
            client.set(k, v);
        }
        for (k, v) in &config.properties {
            // Producer settings mean nothing to a consumer; librdkafka warns.
            if !is_producer_only(k) {
                client.set(k, v);
            }
        }
        let consumer: StreamConsumer = client.create()?;
        let reader = LogReader { consumer, topic: topic.to_owned(), partition };
        reader.seek_to(offset)?;
        Ok(reader)
    }

    /// Reads from `offset` on.
    pub fn seek_to(&self, offset: i64) -> Result<(), KafkaError> {
        let mut assignment = TopicPartitionList::new();
        assignment.add_partition_offset(&self.topic, self.partition, Offset::Offset(offset))?;
        self.consumer.assign(&assignment)
    }

    /// The partition's end: the offset the next record appended gets.
    /// Blocks for up to `timeout`.
    pub fn end(&self, timeout: Duration) -> Result<i64, KafkaError> {
        self.consumer.fetch_watermarks(&self.topic, self.partition, timeout).map(|(_, high)| high)
    }

    /// Waits for the next records, and takes up to `max` of those already
    /// fetched.
    pub async fn next(&self, max: usize, limits: &Limits) -> Result<Vec<Read>, KafkaError> {
        self.next_with(max, |m| read(m, limits)).await
    }

    /// [`next`](Self::next), each record read with `read`.
    pub async fn next_with<T>(
        &self,
        max: usize,
        read: impl Fn(&rdkafka::message::BorrowedMessage<'_>) -> T,
    ) -> Result<Vec<T>, KafkaError> {
        let mut out = Vec::new();
        let first = self.consumer.recv().await?;
        out.push(read(&first));
        drop(first);
        while out.len() < max {
            match futures_util::FutureExt::now_or_never(self.consumer.recv()) {
                Some(Ok(m)) => out.push(read(&m)),
                Some(Err(e)) => {
                    tracing::warn!(error = %e, topic = %self.topic, "reading a log topic");
                    break;
                }
                None => break,
            }
        }
        Ok(out)
    }
}

fn read(m: &rdkafka::message::BorrowedMessage<'_>, limits: &Limits) -> Read {
    let headers = m.headers();
    let pairs: Vec<(&str, Option<&[u8]>)> =
        headers.map(|h| h.iter().map(|h| (h.key, h.value)).collect()).unwrap_or_default();
    let timestamp = m.timestamp().to_millis().and_then(|t| u64::try_from(t).ok()).unwrap_or(0);
    let at = UnixMillis(timestamp);
    let entry = record::read(m.key(), m.payload(), pairs.iter().copied(), at, limits);
    Read { offset: m.offset(), at, entry }
}
