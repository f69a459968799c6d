//! The producer: one librdkafka producer with idempotence on, whose delivery
//! reports come back to the dispatcher over a channel; in cluster mode, one
//! per shard, so that a shard let go takes what it still holds away with it
//! ([`Producer::let_go`]); or, with transactional delivery, one
//! transactional producer per shard ([`super::transactions`]), whose
//! reports come once their transaction is committed.
//!
//! It owns no retry policy and no state about messages: the dispatcher tags
//! each record with a token and decides what a report means.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use rdkafka::{
    ClientConfig, ClientContext, Message as _,
    config::RDKafkaLogLevel,
    error::{KafkaError, RDKafkaErrorCode},
    message::{DeliveryResult, Header, OwnedHeaders},
    producer::{BaseProducer, BaseRecord, Producer as _, ProducerContext, PurgeConfig, ThreadedProducer},
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{
    KafkaConfig,
    catalog::{MetadataError, MetadataSource},
    report::{DeliveryReport, ProduceError, produce_error},
    transactions::{OnFence, Queued, Txn},
};
use crate::{message::Outgoing, metrics};

struct Ticket {
    token: u64,
    reports: mpsc::UnboundedSender<DeliveryReport>,
}

/// The clients' context: routes delivery reports, quiets outage noise, and
/// raises `fatal` when librdkafka says the producer cannot go on.
#[derive(Clone)]
struct Reports {
    fatal: CancellationToken,
}

impl ClientContext for Reports {
    /// librdkafka reports every failed connection and, each second of an
    /// outage, "all brokers down", per client. Say once that Kafka is
    /// unreachable, and once more when it is back (see [`reachable`]).
    fn error(&self, error: KafkaError, reason: &str) {
        match error.rdkafka_error_code() {
            Some(RDKafkaErrorCode::AllBrokersDown) => {
                if metrics::KAFKA_REACHABLE.get() != 0 {
                    metrics::KAFKA_REACHABLE.set(0);
                    tracing::warn!(%reason, "Kafka is unreachable: scheduling goes on, deliveries wait for it");
                }
            }
            Some(RDKafkaErrorCode::BrokerTransportFailure) => {
                tracing::debug!(%error, %reason, "librdkafka");
            }
            _ => tracing::error!(%error, %reason, "librdkafka"),
        }
    }

    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        use RDKafkaLogLevel::*;
        match level {
            // A failed connection is an outage, reported through `error`.
            _ if facility == "FAIL" => tracing::debug!(target: "librdkafka", "{facility}: {message}"),
            Emerg | Alert | Critical | Error => {
                tracing::error!(target: "librdkafka", "{facility}: {message}")
            }
            Warning => tracing::warn!(target: "librdkafka", "{facility}: {message}"),
            Notice | Info => tracing::info!(target: "librdkafka", "{facility}: {message}"),
            Debug => tracing::debug!(target: "librdkafka", "{facility}: {message}"),
        }
    }
}

impl Reports {
    /// An idempotent producer that can no longer rule out duplicates or
    /// reordering (the broker lost its sequence state, say) stops for good,
    /// and fails every record with a fatal error from then on. What it has
    /// not delivered is still in the store; the server shuts down so that a
    /// restart brings a new producer.
    fn failed_fatally(&self) {
        if !self.fatal.is_cancelled() {
            tracing::error!("the Kafka producer failed fatally; stopping so that a restart brings a new one");
            self.fatal.cancel();
        }
    }
}

/// Kafka answered: note it if it had been unreachable.
fn reachable() {
    if metrics::KAFKA_REACHABLE.get() != 1 {
        metrics::KAFKA_REACHABLE.set(1);
        tracing::info!("Kafka is reachable");
    }
}

impl ProducerContext for Reports {
    type DeliveryOpaque = Box<Ticket>;

    fn delivery(&self, result: &DeliveryResult<'_>, ticket: Box<Ticket>) {
        let result = match result {
            Ok(m) => {
                reachable();
                Ok((m.partition(), m.offset()))
            }
            Err((e, _)) => {
                if e.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal) {
                    self.failed_fatally();
                }
                Err(produce_error(e))
            }
        };
        // The dispatcher gone means we are shutting down past the grace
        // period; the message stays pending and is produced after restart.
        let _ = ticket.reports.send(DeliveryReport { token: ticket.token, result });
    }
}

/// How the dispatcher's records reach their topics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Delivery {
    /// The node's one idempotent producer: exactly one copy per produce;
    /// after an unclean stop, what reached Kafka unrecorded is found by
    /// reading the topics back. Any broker.
    #[default]
    Idempotent,
    /// Kafka transactions, one transactional id per shard:
    /// `read_committed` consumers see only committed deliveries, and a
    /// producer that took a shard's id over fences the earlier one at the
    /// broker. Needs a broker with transactions. The id is
    /// `<prefix>-<shard>`, or without a prefix `hourglass-<the store's
    /// identity>` (standalone: an id of the store's own, kept as long as
    /// the store).
    Transactional { prefix: Option<String>, on_fence: OnFence },
}

pub struct Producer {
    send: Send,
    /// A client for metadata, shared by the node's producers, so that
    /// refreshes never queue behind produce traffic.
    metadata: Arc<BaseProducer<Reports>>,
    fatal: CancellationToken,
    /// Why a shard's transactional producer stopped the node.
    stopped: Arc<std::sync::Mutex<Option<String>>>,
    /// How it reaches Kafka: a search of what landed reads with the same.
    config: KafkaConfig,
    delivery: Delivery,
}

/// Where records go.
enum Send {
    /// The node's producer, shared by its shards.
    Idempotent(ThreadedProducer<Reports>),
    /// A movable shard's idempotent producer of its own: what it holds
    /// when the shard is let go is purged with it.
    Shard(ThreadedProducer<Reports>),
    /// One shard's transaction thread.
    Transactional(Txn),
}

/// hourglass's producer defaults; the user's properties override them.
fn defaults() -> BTreeMap<&'static str, &'static str> {
    BTreeMap::from([
        // Exactly one copy per produce, in order per partition, even when
        // librdkafka retries internally.
        ("enable.idempotence", "true"),
        ("acks", "all"),
        // Precision first: a due record goes at once. Under load records
        // still travel in batches: whatever queues while a request is out.
        ("linger.ms", "0"),
        // No local timeout: a record handed to librdkafka is retried by it,
        // under its idempotent sequence, until the broker answers. A record
        // timed out locally may still have been written; sending it again
        // would be a duplicate. (The dispatcher holds a topic that stops
        // answering, so one stuck topic does not hold the others.)
        ("message.timeout.ms", "0"),
        // Keyed records land where the Java client would put them.
        ("partitioner", "murmur2_random"),
        ("queue.buffering.max.messages", "1000000"),
        // After a broker outage, reconnect within a second of its return
        // rather than librdkafka's 10 s backoff ceiling.
        ("reconnect.backoff.max.ms", "1000"),
        // A topic the cluster does not know is deleted (the catalog saw it
        // when the message was scheduled), not still being created: fail
        // its records soon instead of holding them, and their in-flight
        // slots, for librdkafka's default 30 s.
        ("topic.metadata.propagation.max.ms", "5000"),
        // Never bring a deleted topic back by producing to it: its messages
        // fail instead (librdkafka's producer default is to ask the broker
        // to create unknown topics).
        ("allow.auto.create.topics", "false"),
    ])
}

/// The producer's librdkafka configuration: defaults, brokers, then the
/// user's properties.
pub fn producer_config(config: &KafkaConfig) -> ClientConfig {
    let mut client = ClientConfig::new();
    for (k, v) in defaults() {
        client.set(k, v);
    }
    client.set("bootstrap.servers", &config.brokers);
    for (k, v) in &config.properties {
        client.set(k, v);
    }
    client
}

impl Producer {
    /// The node's producer. With transactional delivery it produces
    /// nothing itself (it reads metadata); each shard gets its own from
    /// [`Producer::for_shard`].
    pub fn new(config: &KafkaConfig, delivery: Delivery) -> Result<Producer, KafkaError> {
        let client = producer_config(config);
        if client.get("enable.idempotence") != Some("true") {
            tracing::warn!("enable.idempotence is off: Kafka retries may duplicate or reorder records");
        }
        let context = Reports { fatal: CancellationToken::new() };
        let inner = client.create_with_context(context.clone())?;
        let metadata = Arc::new(client.create_with_context(context.clone())?);
        Ok(Producer {
            send: Send::Idempotent(inner),
            metadata,
            fatal: context.fatal,
            stopped: Arc::default(),
            config: config.clone(),
            delivery,
        })
    }

    /// What shard `shard`'s dispatcher produces with. With transactional
    /// delivery, one of the shard's own (its thread starts now; see
    /// [`Producer::ready`]) under the transactional id `<prefix>-<shard>`,
    /// or `hourglass-<store>` without a prefix. Else, for a shard that
    /// `moves` to other nodes (cluster mode), an idempotent producer of its
    /// own, which [`Producer::let_go`] empties; for one that does not, this
    /// producer.
    pub fn for_shard(
        self: &Arc<Self>,
        shard: u32,
        store: &str,
        moves: bool,
    ) -> std::io::Result<Arc<Producer>> {
        let Delivery::Transactional { prefix, on_fence } = &self.delivery else {
            if !moves {
                return Ok(Arc::clone(self));
            }
            let context = Reports { fatal: self.fatal.clone() };
            let inner = producer_config(&self.config)
                .create_with_context(context)
                .map_err(|e| std::io::Error::other(format!("starting shard {shard}'s producer: {e}")))?;
            let producer = self.beside(Send::Shard(inner), self.fatal.clone(), Arc::clone(&self.stopped));
            producer.warm_up();
            return Ok(producer);
        };
        let id = match prefix {
            Some(prefix) => format!("{prefix}-{shard}"),
            None => format!("hourglass-{store}"),
        };
        // Standalone, a fenced shard stops the node; in a cluster it only
        // gives its records back.
        let (fatal, stopped) = match on_fence {
            OnFence::Stop => (self.fatal.clone(), Arc::clone(&self.stopped)),
            OnFence::Yield => (CancellationToken::new(), Arc::default()),
        };
        let txn =
            Txn::start(producer_config(&self.config), id, *on_fence, (fatal.clone(), Arc::clone(&stopped)))?;
        Ok(self.beside(Send::Transactional(txn), fatal, stopped))
    }

    /// The same shard's producer anew: with transactional delivery, a new
    /// transactional producer of the same id, which fences whatever
    /// producer of it came last (see [`Producer::ready`]); else this one.
    pub fn renew(self: &Arc<Self>) -> std::io::Result<Arc<Producer>> {
        let (Send::Transactional(txn), Delivery::Transactional { on_fence, .. }) =
            (&self.send, &self.delivery)
        else {
            return Ok(Arc::clone(self));
        };
        let txn = Txn::start(
            producer_config(&self.config),
            txn.id().to_owned(),
            *on_fence,
            (self.fatal.clone(), Arc::clone(&self.stopped)),
        )?;
        Ok(self.beside(Send::Transactional(txn), self.fatal.clone(), Arc::clone(&self.stopped)))
    }

    /// A producer sending through `send`, sharing this one's metadata
    /// client, settings and delivery, stopping the node through `fatal`
    /// and `stopped`.
    fn beside(
        &self,
        send: Send,
        fatal: CancellationToken,
        stopped: Arc<std::sync::Mutex<Option<String>>>,
    ) -> Arc<Producer> {
        Arc::new(Producer {
            send,
            metadata: Arc::clone(&self.metadata),
            fatal,
            stopped,
            config: self.config.clone(),
            delivery: self.delivery.clone(),
        })
    }

    /// How records reach their topics.
    pub fn delivery(&self) -> &Delivery {
        &self.delivery
    }

    /// Waits until this producer may produce: with transactional delivery,
    /// until every earlier producer of its transactional id is fenced and
    /// its open transaction resolved, so that what it committed can be read
    /// back and nothing it left open is seen later. Returns at once for
    /// the idempotent producer; why, if the producer stopped.
    pub async fn ready(&self) -> Result<(), ProducerStopped> {
        match &self.send {
            Send::Idempotent(_) | Send::Shard(_) => Ok(()),
            Send::Transactional(txn) if txn.ready().await => Ok(()),
            Send::Transactional(txn) => Err(ProducerStopped(
                txn.stopped()
                    .unwrap_or_else(|| format!("the transactional producer {} has stopped", txn.id())),
            )),
        }
    }

    /// Gets the idempotent producer its producer id now rather than in a
    /// second. librdkafka asks for the id from a timer that fires every
    /// 500 ms until a broker connection is up, so the first produce after a
    /// start waits 0.5 to 1 s; it also asks after each metadata answer. A
    /// few metadata requests in the first moments (on a thread of their
    /// own; one is enough once a connection is up) bring the first delivery
    /// after a restart within milliseconds.
    pub fn warm_up(self: &std::sync::Arc<Self>) {
        let producer = std::sync::Arc::clone(self);
        let spawned = std::thread::Builder::new().name("producer warm-up".into()).spawn(move || {
            for wait_ms in [0, 20, 50, 100, 200] {
                std::thread::sleep(Duration::from_millis(wait_ms));
                let (Send::Idempotent(inner) | Send::Shard(inner)) = &producer.send else { return };
                if inner.client().fetch_metadata(None, Duration::from_secs(2)).is_err() {
                    // Kafka is not there yet: librdkafka's own timer goes on.
                    return;
                }
            }
        });
        if let Err(e) = spawned {
            tracing::debug!(error = %e, "no warm-up thread for the producer; its own timer gets its id");
        }
    }

    /// How it reaches Kafka.
    pub fn config(&self) -> &KafkaConfig {
        &self.config
    }

    /// Where each partition of `topic` ends now (the offset its next record
    /// gets). Blocking.
    pub fn ends(&self, topic: &str, timeout: Duration) -> Result<Vec<(i32, i64)>, KafkaError> {
        let client = self.metadata.client();
        let metadata = client.fetch_metadata(Some(topic), timeout)?;
        let Some(described) = metadata.topics().iter().find(|t| t.name() == topic) else {
            return Ok(Vec::new());
        };
        if let Some(e) = described.error() {
            return Err(KafkaError::MetadataFetch(e.into()));
        }
        described
            .partitions()
            .iter()
            .map(|p| client.fetch_watermarks(topic, p.id(), timeout).map(|(_, high)| (p.id(), high)))
            .collect()
    }

    /// Cancelled when the producer has failed fatally and cannot produce
    /// again; the process must restart it.
    pub fn failed(&self) -> CancellationToken {
        self.fatal.clone()
    }

    /// Why the producer failed fatally, if it did.
    pub fn fatal_error(&self) -> Option<String> {
        let stopped = || self.stopped.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match &self.send {
            Send::Idempotent(inner) | Send::Shard(inner) => inner
                .client()
                .fatal_error()
                .map(|(code, reason)| format!("{code}: {reason}"))
                .or_else(stopped),
            Send::Transactional(txn) => txn.stopped().or_else(stopped),
        }
    }

    /// Hands a due message to librdkafka, with the headers hourglass adds;
    /// its report arrives on `reports` with `token`. An error here means it
    /// was not queued at all.
    pub fn send(
        &self,
        message: Outgoing<'_>,
        token: u64,
        reports: &mpsc::UnboundedSender<DeliveryReport>,
    ) -> Result<(), ProduceError> {
        let record = message.envelope;
        let due = message.due.0.to_string();
        let mut headers = OwnedHeaders::new_with_capacity(record.headers.len() + 3);
        for (key, value) in message.headers(&due) {
            headers = headers.insert(Header { key, value: Some(value) });
        }
        let inner = match &self.send {
            Send::Idempotent(inner) | Send::Shard(inner) => inner,
            Send::Transactional(txn) => {
                return txn.send(Queued {
                    topic: record.topic.clone(),
                    key: record.key.clone(),
                    value: record.value.clone(),
                    headers,
                    partition: record.partition,
                    token,
                    reports: reports.clone(),
                });
            }
        };
        if crate::failpoint::fires("kafka-fatal") {
            self.raise_fatal_for_test(inner);
        }
        let ticket = Box::new(Ticket { token, reports: reports.clone() });
        let mut base =
            BaseRecord::with_opaque_to(&record.topic, ticket).payload(&record.value).headers(headers);
        if let Some(key) = &record.key {
            base = base.key(key);
        }
        if let Some(partition) = record.partition {
            base = base.partition(partition);
        }
        inner.send(base).map_err(|(e, _)| {
            if e.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal) {
                inner.context().failed_fatally();
            }
            produce_error(&e)
        })
    }

    /// What the `kafka-fatal` fail point does: librdkafka's own way of
    /// raising the fatal error an idempotent producer raises for real.
    #[cfg(feature = "failpoints")]
    fn raise_fatal_for_test(&self, inner: &ThreadedProducer<Reports>) {
        let reason = c"fail point kafka-fatal";
        // SAFETY: the client handle is valid for as long as `self.inner`
        // lives, and the reason is a NUL-terminated string librdkafka copies.
        unsafe {
            rdkafka::bindings::rd_kafka_test_fatal_error(
                inner.client().native_ptr(),
                rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
                reason.as_ptr(),
            );
        }
    }

    #[cfg(not(feature = "failpoints"))]
    fn raise_fatal_for_test(&self, _: &ThreadedProducer<Reports>) {}

    /// Waits up to `timeout` for every queued record to be acknowledged.
    /// (A shard's transactional producer commits what it holds when its
    /// dispatcher lets go of it.)
    pub fn flush(&self, timeout: Duration) -> Result<(), KafkaError> {
        match &self.send {
            Send::Idempotent(inner) | Send::Shard(inner) => inner.flush(timeout),
            Send::Transactional(_) => Ok(()),
        }
    }

    /// A shard let go: a shard's own idempotent producer drops every record
    /// it still holds, queued or awaiting the broker's answer, so that none
    /// is sent after the shard's next owner has read its topics back. A
    /// record whose request already reached the broker may still be
    /// written, within the broker's time to append it; the next owner's
    /// search, which starts after the release this is before, finds it.
    /// The node's producer is left alone (its other shards' records are in
    /// it); a transactional producer ends its transaction itself.
    pub fn let_go(&self) {
        if let Send::Shard(inner) = &self.send {
            inner.purge(PurgeConfig::default().queue().inflight());
        }
    }
}

/// Why a producer stopped before it was ready: what its client said.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ProducerStopped(pub String);

impl MetadataSource for Producer {
    fn topics(&self, timeout: Duration) -> Result<BTreeMap<String, i32>, MetadataError> {
        let md =
            self.metadata.client().fetch_metadata(None, timeout).map_err(|e| MetadataError(e.to_string()))?;
        reachable();
        Ok(md
            .topics()
            .iter()
            .filter(|t| t.error().is_none() && !t.partitions().is_empty())
            .map(|t| (t.name().to_owned(), t.partitions().len() as i32))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_properties_override_defaults() {
        let config = KafkaConfig {
            brokers: "b1:9092,b2:9092".into(),
            properties: BTreeMap::from([
                ("linger.ms".to_owned(), "20".to_owned()),
                ("security.protocol".to_owned(), "SASL_SSL".to_owned()),
            ]),
        };
        let client = producer_config(&config);
        assert_eq!(client.get("bootstrap.servers"), Some("b1:9092,b2:9092"));
        assert_eq!(client.get("linger.ms"), Some("20"));
        assert_eq!(client.get("security.protocol"), Some("SASL_SSL"));
        assert_eq!(client.get("partitioner"), Some("murmur2_random"));
        assert_eq!(client.get("enable.idempotence"), Some("true"));
        assert_eq!(client.get("allow.auto.create.topics"), Some("false"), "never re-create a deleted topic");
        assert_eq!(client.get("message.timeout.ms"), Some("0"), "a record is never timed out and sent again");
    }
}
