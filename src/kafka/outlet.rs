//! Where a producer's records go out: the seam between what every
//! producer does (the headers hourglass adds, the metadata, the node's
//! fatal error) and how records reach Kafka, idempotently
//! ([`super::idempotent`]) or in a shard's transactions
//! ([`super::transactions`]).

use std::{sync::Arc, time::Duration};

use rdkafka::{error::KafkaError, message::OwnedHeaders};
use tokio::sync::mpsc;

use super::report::{DeliveryReport, ProduceError};
use crate::message::Envelope;

/// Why a producer stopped before it was ready: what its client said.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ProducerStopped(pub String);

/// How records reach Kafka.
#[tonic::async_trait]
pub(super) trait Outlet: Send + Sync {
    /// Hands `record`, with `headers`, over; its report arrives on
    /// `reports` with `token`. An error means it was not queued at all.
    fn send(
        &self,
        record: &Envelope,
        headers: OwnedHeaders,
        token: u64,
        reports: &mpsc::UnboundedSender<DeliveryReport>,
    ) -> Result<(), ProduceError>;

    /// Waits until it may produce; why not, if it stopped first.
    async fn ready(&self) -> Result<(), ProducerStopped>;

    /// Why it failed for good, if it did: its client's own word.
    fn failure(&self) -> Option<String>;

    /// Waits up to `timeout` for every queued record to be acknowledged.
    fn flush(&self, timeout: Duration) -> Result<(), KafkaError>;

    /// Its shard is let go: what it holds of the shard goes with it.
    fn let_go(&self) {}

    /// Its transactional id: a transactional producer is renewed under it.
    fn transactional_id(&self) -> Option<&str> {
        None
    }

    /// Gets ready to produce without waiting for the first record.
    fn warm_up(self: Arc<Self>) {}
}
