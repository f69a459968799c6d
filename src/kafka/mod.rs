//! Kafka: the producer the dispatcher hands due messages to (with
//! transactional delivery, one transactional producer per shard:
//! `transactions`; what a produce came to, for both: `report`), the topic
//! catalog the service checks requests against, and the settings every
//! client shares. Cluster mode's clients (the schedule log, its consumer
//! group) live in [`crate::cluster`]. rdkafka's callbacks reach async code
//! only through channels.

mod catalog;
mod idempotent;
pub mod landed;
mod outlet;
mod producer;
mod report;
pub(crate) mod seek;
mod transactions;

pub use catalog::{CatalogError, MetadataError, MetadataSource, TopicCatalog};
pub use outlet::ProducerStopped;
pub use producer::producer_config;
pub use producer::{Delivery, Producer};
pub use report::{DeliveryReport, Fault, ProduceError, classify};
pub use transactions::OnFence;

use std::collections::BTreeMap;

/// How to reach the Kafka cluster. Its `Debug` hides secret property values.
#[derive(Clone)]
pub struct KafkaConfig {
    /// Bootstrap servers, `host:port[,host:port...]`.
    pub brokers: String,
    /// librdkafka properties passed through as they are (SASL, SSL,
    /// compression, ...). They override hourglass's producer defaults.
    pub properties: BTreeMap<String, String>,
}

impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaConfig")
            .field("brokers", &self.brokers)
            .field("properties", &crate::secret::Redacted(&self.properties))
            .finish()
    }
}

/// Settings that mean nothing to a consumer (librdkafka warns of them).
pub(crate) fn is_producer_only(key: &str) -> bool {
    key.starts_with("linger")
        || key.starts_with("queue.buffering")
        || key.starts_with("batch.")
        || key.starts_with("message.timeout")
        || key.starts_with("compression")
        || matches!(key, "acks" | "enable.idempotence" | "partitioner" | "request.required.acks" | "retries")
}
