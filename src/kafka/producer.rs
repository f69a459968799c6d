//! The producer: what every way of producing shares (the headers hourglass
//! adds, a metadata client, the node's fatal error, which producer a shard
//! gets) in front of an [`Outlet`]: one librdkafka producer with
//! idempotence on ([`super::idempotent`]), whose delivery reports come back
//! to the dispatcher over a channel; in cluster mode, one per shard, so
//! that a shard let go takes what it still holds away with it
//! ([`Producer::let_go`]); or, with transactional delivery, one
//! transactional producer per shard ([`super::transactions`]), whose
//! reports come once their transaction is committed. A new way to deliver
//! is a new `Outlet`.
//!
//! It owns no retry policy and no state about messages: the dispatcher tags
//! each record with a token and decides what a report means.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use rdkafka::{
    ClientConfig,
    error::KafkaError,
    message::{Header, OwnedHeaders},
    producer::{BaseProducer, Producer as _},
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{
    KafkaConfig,
    catalog::{MetadataError, MetadataSource},
    idempotent::{Idempotent, Reports, reachable},
    outlet::{Outlet, ProducerStopped},
    report::{DeliveryReport, ProduceError},
    transactions::{OnFence, Txn},
};
use crate::message::Outgoing;

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
    /// How its records reach Kafka.
    send: Arc<dyn Outlet>,
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
        // Under load, fewer and larger requests: records queue behind the
        // requests out and go in the next. librdkafka's 5 sent a drain in
        // small requests, which cost its broker thread and the broker a
        // fifth more per record; at the broker's round trip, 3 keep the
        // lateness of a steady stream as it was.
        ("max.in.flight.requests.per.connection", "3"),
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
            send: Arc::new(Idempotent { inner, own: false }),
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
            let own = Arc::new(Idempotent { inner, own: true });
            let producer = self.beside(own, self.fatal.clone(), Arc::clone(&self.stopped));
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
        Ok(self.beside(Arc::new(txn), fatal, stopped))
    }

    /// A movable shard's own idempotent producer, made ahead of the
    /// shard's take: librdkafka asks for an idempotent producer's id only
    /// on a timer, half a second after it starts with no broker connected,
    /// and holds every record until it has one; made as the take begins,
    /// the wait passes while the take applies and claims. `None` with
    /// transactional delivery, whose producer fences the last one of its
    /// id as it starts: it is made once the shard is claimed.
    pub fn ahead_for_shard(self: &Arc<Self>, shard: u32) -> Option<std::io::Result<Arc<Producer>>> {
        matches!(self.delivery, Delivery::Idempotent).then(|| self.for_shard(shard, "", true))
    }

    /// The same shard's producer anew: with transactional delivery, a new
    /// transactional producer of the same id, which fences whatever
    /// producer of it came last (see [`Producer::ready`]); else this one.
    pub fn renew(self: &Arc<Self>) -> std::io::Result<Arc<Producer>> {
        let (Some(id), Delivery::Transactional { on_fence, .. }) =
            (self.send.transactional_id(), &self.delivery)
        else {
            return Ok(Arc::clone(self));
        };
        let txn = Txn::start(
            producer_config(&self.config),
            id.to_owned(),
            *on_fence,
            (self.fatal.clone(), Arc::clone(&self.stopped)),
        )?;
        Ok(self.beside(Arc::new(txn), self.fatal.clone(), Arc::clone(&self.stopped)))
    }

    /// A producer sending through `send`, sharing this one's metadata
    /// client, settings and delivery, stopping the node through `fatal`
    /// and `stopped`.
    fn beside(
        &self,
        send: Arc<dyn Outlet>,
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
        self.send.ready().await
    }

    /// Gets ready to produce without waiting for the first record (the
    /// idempotent producer's id; see [`Idempotent`]).
    pub fn warm_up(&self) {
        Arc::clone(&self.send).warm_up();
    }

    /// How it reaches Kafka.
    pub fn config(&self) -> &KafkaConfig {
        &self.config
    }

    /// Where each partition of `topic` ends now (the offset its next record
    /// gets). Blocking; the partitions are asked a few at a time.
    pub fn ends(&self, topic: &str, timeout: Duration) -> Result<Vec<(i32, i64)>, KafkaError> {
        const AT_ONCE: usize = 8;
        let client = self.metadata.client();
        let metadata = client.fetch_metadata(Some(topic), timeout)?;
        let Some(described) = metadata.topics().iter().find(|t| t.name() == topic) else {
            return Ok(Vec::new());
        };
        if let Some(e) = described.error() {
            return Err(KafkaError::MetadataFetch(e.into()));
        }
        let partitions: Vec<i32> = described.partitions().iter().map(|p| p.id()).collect();
        let end = |p: i32| client.fetch_watermarks(topic, p, timeout).map(|(_, high)| (p, high));
        let mut ends = Vec::with_capacity(partitions.len());
        for some in partitions.chunks(AT_ONCE) {
            let asked = std::thread::scope(|scope| {
                let asking: Vec<_> = some.iter().map(|&p| scope.spawn(move || end(p))).collect();
                asking
                    .into_iter()
                    .map(|a| a.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                    .collect::<Vec<_>>()
            });
            for answer in asked {
                ends.push(answer?);
            }
        }
        Ok(ends)
    }

    /// Cancelled when the producer has failed fatally and cannot produce
    /// again; the process must restart it.
    pub fn failed(&self) -> CancellationToken {
        self.fatal.clone()
    }

    /// Why the producer failed fatally, if it did.
    pub fn fatal_error(&self) -> Option<String> {
        let stopped = || self.stopped.lock().unwrap_or_else(|e| e.into_inner()).clone();
        self.send.failure().or_else(stopped)
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
        // With spans exported, a traced record goes out with its dispatch
        // span's context.
        let traced =
            crate::otel::dispatch(&record.topic, message.id.as_str(), message.due.0, &record.headers);
        let mut headers = OwnedHeaders::new_with_capacity(record.headers.len() + 3);
        for (key, value) in message.headers(&due) {
            let value = match &traced {
                Some(own) if key.eq_ignore_ascii_case(crate::otel::TRACEPARENT) => own.as_bytes(),
                _ => value,
            };
            headers = headers.insert(Header { key, value: Some(value) });
        }
        self.send.send(record, headers, token, reports)
    }

    /// Waits up to `timeout` for every queued record to be acknowledged.
    /// (A shard's transactional producer commits what it holds when its
    /// dispatcher lets go of it.)
    pub fn flush(&self, timeout: Duration) -> Result<(), KafkaError> {
        self.send.flush(timeout)
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
        self.send.let_go();
    }
}

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
