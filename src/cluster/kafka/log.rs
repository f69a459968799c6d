//! The schedule log's clients: the producer that appends hourglass's own
//! records to it, sealed with the cluster key, and the reader that follows
//! one partition and tells which records carry a valid seal.
//!
//! Appends are `acks=all` and idempotent, like deliveries, but bounded in
//! time: a caller waiting for its change is told the log is unreachable
//! (and retries with the same id) rather than waiting forever.

use std::{
    collections::{BTreeMap, HashMap, hash_map},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use rdkafka::{
    ClientConfig, Message as _, Offset, Timestamp, TopicPartitionList,
    consumer::{
        Consumer as _, DefaultConsumerContext, StreamConsumer, stream_consumer::StreamPartitionQueue,
    },
    error::KafkaError,
    message::{Header, Headers as _, OwnedHeaders},
    producer::{FutureProducer, FutureRecord},
};

use tokio_util::sync::CancellationToken;

use crate::kafka::{KafkaConfig, is_producer_only, producer_config};
use crate::{
    cluster::log::{
        RECORD_HEADER,
        record::{self, Entry, LogRecord},
        seal::{ClusterKey, PartitionSeal, SEAL_HEADER},
    },
    message::UnixMillis,
};

/// Appends records to the schedule log.
pub struct LogProducer {
    inner: FutureProducer,
    topic: String,
    key: ClusterKey,
    /// What seals each partition's records, made at its first.
    seals: Mutex<HashMap<i32, PartitionSeal>>,
}

impl LogProducer {
    pub fn new(config: &KafkaConfig, topic: &str, key: &ClusterKey) -> Result<LogProducer, KafkaError> {
        Ok(LogProducer {
            inner: log_producer_config(config).create()?,
            topic: topic.to_owned(),
            key: key.clone(),
            seals: Mutex::default(),
        })
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }
}

/// The log producer's librdkafka configuration: the delivery producer's,
/// with the log's own defaults, and `acks=all` and idempotence whatever
/// the user's properties say. Public for the bench's limits, which write
/// and read as the nodes do.
pub fn log_producer_config(config: &KafkaConfig) -> ClientConfig {
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
    // Not the user's to change for the log: an owner applies its own
    // records from their acks, so an ack must mean the record is in
    // the log for good, where the ack says.
    for (k, must) in [("acks", "all"), ("request.required.acks", "all"), ("enable.idempotence", "true")] {
        if let Some(set) = config.properties.get(k).filter(|v| !matches!(v.as_str(), "all" | "-1" | "true")) {
            tracing::warn!(
                property = k,
                value = %set,
                "ignored for the schedule log, whose appends are always {must} (it still applies to deliveries)"
            );
        }
        client.remove(k);
    }
    client.set("acks", "all").set("enable.idempotence", "true");
    client
}

impl LogProducer {
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
        let appended = self.enqueue_appended(partition, key, value);
        async move { appended.await.map(|a| a.offset) }
    }

    /// [`enqueue`](Self::enqueue), the wait giving where the record is, as
    /// its ack says.
    pub fn enqueue_appended(
        &self,
        partition: i32,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> impl std::future::Future<Output = Result<Appended, KafkaError>> + Send + use<> {
        let sealer = {
            let mut seals = self.seals.lock().unwrap_or_else(|e| e.into_inner());
            seals.entry(partition).or_insert_with(|| self.key.partition(&self.topic, partition)).clone()
        };
        let seal = sealer.seal(Some(key), value);
        let headers = OwnedHeaders::new()
            .insert(Header { key: RECORD_HEADER, value: Some(record::FORMAT.as_bytes()) })
            .insert(Header { key: SEAL_HEADER, value: Some(&seal) });
        let mut out = FutureRecord::to(&self.topic).partition(partition).key(key).headers(headers);
        if let Some(value) = value {
            out = out.payload(value);
        }
        let queued = self.inner.send_result(out).map_err(|(e, _)| e);
        async move {
            match queued?.await {
                Ok(Ok(delivery)) => {
                    Ok(Appended { offset: delivery.offset, at: timestamp(delivery.timestamp) })
                }
                Ok(Err((e, _))) => Err(e),
                Err(_) => Err(KafkaError::Canceled),
            }
        }
    }
}

/// Where a record was appended, as its ack says.
#[derive(Clone, Copy, Debug)]
pub struct Appended {
    pub offset: i64,
    /// Its timestamp in the log (the producer's, or the broker's on a topic
    /// of `LogAppendTime`), if the ack tells it.
    pub at: Option<UnixMillis>,
}

/// The schedule log's consumer of one node: one client fetching every
/// partition the node follows (its shards and its standby copies) in one
/// request per broker, each partition delivered to a queue of its own,
/// read by that shard's [`LogReader`]. It belongs to no consumer group and
/// commits nothing: where each shard is lives in its store.
pub struct LogConsumer {
    consumer: Arc<StreamConsumer>,
    /// Reads the partitions' ends ([`LogReader::end`]) on a connection of
    /// its own, made at the first: a broker answers one connection's
    /// requests in order, and holds a fetch of a quiet partition for up to
    /// `fetch.wait.max.ms`, so an end asked on the consumer's connection
    /// waits that long (90 ms, measured on Tansu) where it takes one round
    /// trip on an idle one (under 1 ms).
    ends: Mutex<Option<Arc<StreamConsumer>>>,
    /// What both clients are made from.
    config: ClientConfig,
    runtime: tokio::runtime::Handle,
    topic: String,
    /// What tells the cluster's records from others.
    key: ClusterKey,
    partitions: Mutex<HashMap<i32, Partition>>,
    /// Ends the task that serves the client's own queue.
    stop: CancellationToken,
}

/// A partition of the log, once read: its queue lives as long as the
/// consumer (librdkafka keeps delivering the partition there, assigned or
/// not), and the reader it is assigned for now, if any.
struct Partition {
    queue: Arc<StreamPartitionQueue<DefaultConsumerContext>>,
    reader: Option<u64>,
    /// In the client's assignment: set once assigning succeeded, cleared
    /// once unassigning did.
    assigned: bool,
}

impl LogConsumer {
    /// A consumer of `topic`, a topic only the nodes write (the schedule
    /// log, the routing topic), whose records are sealed with `key`. It
    /// reads uncommitted records: the nodes write no transactions, and a
    /// transaction someone else left open there must not hold back what
    /// follows it (what it wrote is refused as forged). Must be called
    /// within the runtime: a task of its own serves the client's events.
    pub fn new(config: &KafkaConfig, topic: &str, key: &ClusterKey) -> Result<Arc<LogConsumer>, KafkaError> {
        Self::create(consumer_config(config, Isolation::Uncommitted), topic, key)
    }

    /// A consumer of a topic applications write (an ingress topic): it
    /// reads only committed records, so a transaction still open holds
    /// back its own partition, and an aborted one is never read. Their
    /// records are nobody's to seal: none verifies.
    pub fn committed(config: &KafkaConfig, topic: &str) -> Result<Arc<LogConsumer>, KafkaError> {
        Self::create(consumer_config(config, Isolation::Committed), topic, &ClusterKey::nobodys())
    }

    fn create(config: ClientConfig, topic: &str, key: &ClusterKey) -> Result<Arc<LogConsumer>, KafkaError> {
        let consumer: Arc<StreamConsumer> = Arc::new(config.create()?);
        let (stop, runtime) = (CancellationToken::new(), tokio::runtime::Handle::current());
        runtime.spawn(serve(Arc::clone(&consumer), topic.to_owned(), stop.clone()));
        Ok(Arc::new(LogConsumer {
            consumer,
            ends: Mutex::default(),
            config,
            runtime,
            topic: topic.to_owned(),
            key: key.clone(),
            partitions: Mutex::default(),
            stop,
        }))
    }

    /// The client that reads the partitions' ends, made at the first call.
    fn ends(&self) -> Result<Arc<StreamConsumer>, KafkaError> {
        let mut ends = self.ends.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(client) = &*ends {
            return Ok(Arc::clone(client));
        }
        // Made on any thread: the client's making spawns on the runtime.
        let _runtime = self.runtime.enter();
        let client: Arc<StreamConsumer> = Arc::new(self.config.create()?);
        self.runtime.spawn(serve(Arc::clone(&client), self.topic.clone(), self.stop.clone()));
        *ends = Some(Arc::clone(&client));
        Ok(client)
    }

    fn partitions(&self) -> std::sync::MutexGuard<'_, HashMap<i32, Partition>> {
        self.partitions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A reader of `partition` from `offset`. A reader of the partition
    /// still open (its shard closing while it opens again) stops reading.
    pub fn reader(self: &Arc<Self>, partition: i32, offset: i64) -> Result<LogReader, KafkaError> {
        static READERS: AtomicU64 = AtomicU64::new(1);
        let id = READERS.fetch_add(1, Ordering::Relaxed);
        let mut partitions = self.partitions();
        if partitions.get(&partition).is_some_and(|e| !e.assigned && Arc::strong_count(&e.queue) == 1) {
            // Split again while nothing else holds the queue: had the
            // client dropped the partition meanwhile (a topic gone from
            // its metadata), the queue held would be one it no longer
            // fills. The old handle goes first: dropping it turns off the
            // wake-ups of the queue it wraps.
            partitions.remove(&partition);
        }
        let entry = match partitions.entry(partition) {
            hash_map::Entry::Occupied(entry) => entry.into_mut(),
            hash_map::Entry::Vacant(entry) => {
                entry.insert(Partition { queue: self.split(partition)?, reader: None, assigned: false })
            }
        };
        if entry.assigned {
            // Held by a reader closing, or left assigned by a release that
            // failed: moved, not assigned again.
            self.seek(partition, offset)?;
        } else {
            let mut list = TopicPartitionList::new();
            list.add_partition_offset(&self.topic, partition, Offset::Offset(offset))?;
            self.consumer.incremental_assign(&list)?;
            entry.assigned = true;
        }
        entry.reader = Some(id);
        let seal = self.key.partition(&self.topic, partition);
        Ok(LogReader { from: Arc::clone(self), queue: Arc::clone(&entry.queue), partition, seal, id })
    }

    /// `partition`'s own queue. Split before the partition is assigned: a
    /// queue the application took is never forwarded to the client's own
    /// queue, so none of its records reach it.
    fn split(
        self: &Arc<Self>,
        partition: i32,
    ) -> Result<Arc<StreamPartitionQueue<DefaultConsumerContext>>, KafkaError> {
        let queue = self.consumer.split_partition_queue(&self.topic, partition).ok_or_else(|| {
            KafkaError::Subscription(format!("no queue for partition {partition} of {}", self.topic))
        })?;
        Ok(Arc::new(queue))
    }

    /// Reads `partition`, assigned, from `offset` on. Blocks until the
    /// client has moved (5 s at most); what it had fetched from before is
    /// dropped when read.
    fn seek(&self, partition: i32, offset: i64) -> Result<(), KafkaError> {
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(&self.topic, partition, Offset::Offset(offset))?;
        let moved = self.consumer.seek_partitions(list, Duration::from_secs(5))?;
        match moved.elements().first().map(|e| e.error()) {
            Some(Err(e)) => Err(e),
            _ => Ok(()),
        }
    }

    /// Reader `id` of `partition` is gone: the partition is no longer
    /// fetched, unless another reader has it now.
    fn release(&self, partition: i32, id: u64) {
        let mut partitions = self.partitions();
        let Some(entry) = partitions.get_mut(&partition).filter(|e| e.reader == Some(id)) else { return };
        entry.reader = None;
        let mut list = TopicPartitionList::new();
        list.add_partition(&self.topic, partition);
        match self.consumer.incremental_unassign(&list) {
            Ok(()) => {
                entry.assigned = false;
                // What the client had fetched ahead for it stays in its
                // queue (up to queued.max.messages.kbytes) until read:
                // read now, it is dropped as outdated.
                let _ = futures_util::FutureExt::now_or_never(entry.queue.recv());
            }
            Err(e) => {
                tracing::warn!(topic = %self.topic, partition, error = %e, "no longer reading a partition of the schedule log")
            }
        }
    }
}

impl Drop for LogConsumer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Serves `client`'s own queue until `stop`: every partition it reads has a
/// queue of its own, so what reaches this one is its events (errors,
/// mostly).
async fn serve(client: Arc<StreamConsumer>, topic: String, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            got = client.recv() => match got {
                Ok(m) => tracing::error!(
                    %topic,
                    partition = m.partition(),
                    offset = m.offset(),
                    "a record of the schedule log reached the consumer's own queue, not its shard's, and was not \
                     applied (a fault of the client): the shard's store lacks it until rebuilt from the log"
                ),
                Err(e) => tracing::warn!(%topic, error = %e, "reading the schedule log"),
            },
        }
    }
}

/// How a node reads the schedule log: [`consumer_config`] for it.
pub fn log_consumer_config(config: &KafkaConfig) -> ClientConfig {
    consumer_config(config, Isolation::Uncommitted)
}

/// Which records a [`LogConsumer`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Isolation {
    Committed,
    Uncommitted,
}

/// A log consumer's librdkafka configuration: hourglass's own defaults,
/// the user's properties (but the producer's) over them, and the isolation
/// asked for over those: it is not the user's to change.
fn consumer_config(config: &KafkaConfig, isolation: Isolation) -> ClientConfig {
    let mut client = ClientConfig::new();
    let ours = BTreeMap::from([
        ("bootstrap.servers", config.brokers.as_str()),
        ("group.id", "hourglass-log-reader"),
        ("enable.auto.commit", "false"),
        ("enable.auto.offset.store", "false"),
        ("auto.offset.reset", "earliest"),
        // Kafka answers a fetch as soon as a record is there (one byte
        // is enough): the wait only paces the polls of a quiet partition.
        // A broker that holds every fetch for its whole wait (Tansu 0.6)
        // shows it as how far behind standby copies and ingress readers
        // follow, and each of its fetches costs it more as the partition
        // grows: 100 ms keeps both small.
        ("fetch.wait.max.ms", "100"),
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
    client.set(
        "isolation.level",
        match isolation {
            Isolation::Committed => "read_committed",
            Isolation::Uncommitted => "read_uncommitted",
        },
    );
    client
}

/// Follows one partition of the schedule log, from its node's
/// [`LogConsumer`].
pub struct LogReader {
    from: Arc<LogConsumer>,
    queue: Arc<StreamPartitionQueue<DefaultConsumerContext>>,
    partition: i32,
    /// What seals its records.
    seal: PartitionSeal,
    id: u64,
}

/// A record read, as the store applies it.
pub struct Read {
    pub offset: i64,
    /// The record's timestamp.
    pub at: UnixMillis,
    pub entry: Entry,
}

/// A record read by [`LogReader::next_from`].
#[expect(
    clippy::large_enum_variant,
    reason = "read in batches into one Vec, as `Read`s were: boxing would allocate per record"
)]
pub enum Fetched {
    Read(Read),
    /// Before the offset asked from: already applied.
    Before {
        offset: i64,
        key: u64,
    },
}

impl Fetched {
    pub fn offset(&self) -> i64 {
        match self {
            Fetched::Read(read) => read.offset,
            Fetched::Before { offset, .. } => *offset,
        }
    }
}

impl LogReader {
    /// A reader of `partition` of `topic` from `offset`, with a consumer
    /// of its own.
    pub fn new(
        config: &KafkaConfig,
        topic: &str,
        key: &ClusterKey,
        partition: i32,
        offset: i64,
    ) -> Result<LogReader, KafkaError> {
        LogConsumer::new(config, topic, key)?.reader(partition, offset)
    }

    /// Reads from `offset` on.
    pub fn seek_to(&self, offset: i64) -> Result<(), KafkaError> {
        let mut partitions = self.from.partitions();
        let current = partitions.get_mut(&self.partition).is_some_and(|e| e.reader == Some(self.id));
        if !current {
            return Err(KafkaError::Seek(format!(
                "partition {} of {} is read by another reader now",
                self.partition, self.from.topic
            )));
        }
        self.from.seek(self.partition, offset)
    }

    /// The offset after the last record this reader took or the client
    /// stepped past (transaction markers are never handed out, and take
    /// offsets): how far the partition is read. None before a record came.
    ///
    /// Read from the partition's own state in the client, under its lock:
    /// rdkafka's `position()` first asks the client's main thread for the
    /// whole assignment and blocks the caller until it answers, which on
    /// every applied batch was a thread switch and a blocked worker each.
    pub fn position(&self) -> Option<i64> {
        let mut list = TopicPartitionList::new();
        list.add_partition(&self.from.topic, self.partition);
        // SAFETY: the client handle is valid while `self.from` holds the
        // consumer, and `list` is a valid list librdkafka only writes the
        // partition's position and error into.
        let err = unsafe {
            rdkafka::bindings::rd_kafka_position(self.from.consumer.client().native_ptr(), list.ptr())
        };
        if err != rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
            return None;
        }
        let element = list.find_partition(&self.from.topic, self.partition)?;
        match (element.error(), element.offset()) {
            (Ok(()), Offset::Offset(offset)) => Some(offset),
            _ => None,
        }
    }

    /// The partition's end: the offset the next record appended gets.
    /// Blocks for up to `timeout`.
    pub fn end(&self, timeout: Duration) -> Result<i64, KafkaError> {
        self.from.ends()?.fetch_watermarks(&self.from.topic, self.partition, timeout).map(|(_, high)| high)
    }

    /// Waits for the next records, and takes up to `max` of those already
    /// fetched, leaving records before `from` undecoded: of those, only
    /// where they are and their key's digest.
    pub async fn next_from(&self, max: usize, from: i64) -> Result<Vec<Fetched>, KafkaError> {
        self.next_with(max, |m, sealed| match m.offset() {
            offset if offset < from => Fetched::Before { offset, key: key_digest(m.key()) },
            _ => Fetched::Read(read(m, sealed)),
        })
        .await
    }

    /// Waits for the next records, and takes up to `max` of those already
    /// fetched, each read with `read`, which is told whether the record
    /// carries a valid seal of the cluster.
    pub async fn next_with<T>(
        &self,
        max: usize,
        read: impl Fn(&rdkafka::message::BorrowedMessage<'_>, bool) -> T,
    ) -> Result<Vec<T>, KafkaError> {
        let read = |m: &rdkafka::message::BorrowedMessage<'_>| read(m, self.sealed(m));
        let mut out = Vec::new();
        let first = self.queue.recv().await?;
        out.push(read(&first));
        drop(first);
        while out.len() < max {
            match futures_util::FutureExt::now_or_never(self.queue.recv()) {
                Some(Ok(m)) => out.push(read(&m)),
                Some(Err(e)) => {
                    tracing::warn!(error = %e, topic = %self.from.topic, "reading a log topic");
                    break;
                }
                None => break,
            }
        }
        Ok(out)
    }
}

impl LogReader {
    /// Whether `m` carries the seal of the cluster (in its first
    /// [`SEAL_HEADER`]).
    fn sealed(&self, m: &rdkafka::message::BorrowedMessage<'_>) -> bool {
        let seal = m.headers().and_then(|h| h.iter().find(|h| h.key == SEAL_HEADER)).and_then(|h| h.value);
        match m.partition() {
            partition if partition == self.partition => self.seal.verifies(m.key(), m.payload(), seal),
            partition => self.from.key.verifies(&self.from.topic, partition, m.key(), m.payload(), seal),
        }
    }
}

impl Drop for LogReader {
    fn drop(&mut self) {
        self.from.release(self.partition, self.id);
    }
}

fn read(m: &rdkafka::message::BorrowedMessage<'_>, sealed: bool) -> Read {
    let headers = m.headers();
    let pairs: Vec<(&str, Option<&[u8]>)> =
        headers.map(|h| h.iter().map(|h| (h.key, h.value)).collect()).unwrap_or_default();
    let at = timestamp(m.timestamp()).unwrap_or_default();
    let entry = record::read(m.key(), m.payload(), pairs.iter().copied(), sealed);
    Read { offset: m.offset(), at, entry }
}

pub(crate) fn timestamp(t: Timestamp) -> Option<UnixMillis> {
    t.to_millis().and_then(|t| u64::try_from(t).ok()).map(UnixMillis)
}

/// A digest of a record's key: enough to tell, at the same offset, one
/// record from another.
pub fn key_digest(key: Option<&[u8]>) -> u64 {
    let Some(key) = key else { return 0 };
    key.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_is_always_appended_with_acks_all_by_an_idempotent_producer() {
        let config = KafkaConfig {
            brokers: "b1:9092".into(),
            properties: BTreeMap::from(
                [
                    ("acks", "1"),
                    ("request.required.acks", "0"),
                    ("enable.idempotence", "false"),
                    ("linger.ms", "7"),
                ]
                .map(|(k, v)| (k.to_owned(), v.to_owned())),
            ),
        };
        let client = log_producer_config(&config);
        assert_eq!(client.get("acks"), Some("all"));
        assert_eq!(client.get("request.required.acks"), None, "no alias left to contradict it");
        assert_eq!(client.get("enable.idempotence"), Some("true"));
        assert_eq!(client.get("linger.ms"), Some("7"), "the user's other settings still hold");
        assert_eq!(client.get("compression.type"), Some("lz4"));
    }

    #[test]
    fn the_log_is_read_uncommitted_and_an_ingress_topic_committed_whatever_the_user_says() {
        let config = KafkaConfig {
            brokers: "b1:9092".into(),
            properties: BTreeMap::from(
                [("isolation.level", "read_committed"), ("fetch.wait.max.ms", "50"), ("linger.ms", "5")]
                    .map(|(k, v)| (k.to_owned(), v.to_owned())),
            ),
        };
        let log = consumer_config(&config, Isolation::Uncommitted);
        assert_eq!(log.get("isolation.level"), Some("read_uncommitted"));
        assert_eq!(log.get("fetch.wait.max.ms"), Some("50"), "the user's other settings still hold");
        assert_eq!(log.get("linger.ms"), None, "a producer's setting is left out");
        let ingress = consumer_config(&config, Isolation::Committed);
        assert_eq!(ingress.get("isolation.level"), Some("read_committed"));
    }

    #[test]
    fn a_key_digest_tells_keys_apart() {
        assert_eq!(key_digest(Some(b"order-1")), key_digest(Some(b"order-1")));
        assert_ne!(key_digest(Some(b"order-1")), key_digest(Some(b"order-2")));
        assert_ne!(key_digest(Some(b"")), key_digest(None), "an empty key is not no key");
    }
}
