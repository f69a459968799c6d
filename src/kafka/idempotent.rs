//! The idempotent producer: the node's, shared by its shards, or a
//! movable shard's own (cluster mode), which a shard let go empties; and
//! the client context every producer client of the node shares, which
//! routes delivery reports, quiets outage noise and raises the node's
//! fatal error when librdkafka says a producer cannot go on.

use std::{sync::Arc, time::Duration};

use rdkafka::{
    ClientContext, Message as _,
    config::RDKafkaLogLevel,
    error::{KafkaError, RDKafkaErrorCode},
    message::{DeliveryResult, OwnedHeaders},
    producer::{BaseRecord, Producer as _, ProducerContext, PurgeConfig, ThreadedProducer},
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{
    outlet::{Outlet, ProducerStopped},
    report::{DeliveryReport, ProduceError, produce_error},
};
use crate::{message::Envelope, metrics};

pub(super) struct Ticket {
    token: u64,
    reports: mpsc::UnboundedSender<DeliveryReport>,
}

/// The clients' context: routes delivery reports, quiets outage noise, and
/// raises `fatal` when librdkafka says the producer cannot go on.
#[derive(Clone)]
pub(super) struct Reports {
    pub(super) fatal: CancellationToken,
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
    pub(super) fn failed_fatally(&self) {
        if !self.fatal.is_cancelled() {
            tracing::error!("the Kafka producer failed fatally; stopping so that a restart brings a new one");
            self.fatal.cancel();
        }
    }
}

/// Kafka answered: note it if it had been unreachable.
pub(super) fn reachable() {
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
        let _ = ticket.reports.send(DeliveryReport::now(ticket.token, result));
    }
}

/// An idempotent producer's client; `own`: a movable shard's own, whose
/// records go with the shard when it is let go.
pub(super) struct Idempotent {
    pub(super) inner: ThreadedProducer<Reports>,
    pub(super) own: bool,
}

impl Idempotent {
    /// What the `kafka-fatal` fail point does: librdkafka's own way of
    /// raising the fatal error an idempotent producer raises for real.
    #[cfg(feature = "failpoints")]
    fn raise_fatal_for_test(inner: &ThreadedProducer<Reports>) {
        let reason = c"fail point kafka-fatal";
        // SAFETY: the client handle is valid for as long as `inner`
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
    fn raise_fatal_for_test(_: &ThreadedProducer<Reports>) {}
}

#[tonic::async_trait]
impl Outlet for Idempotent {
    fn send(
        &self,
        record: &Envelope,
        headers: OwnedHeaders,
        token: u64,
        reports: &mpsc::UnboundedSender<DeliveryReport>,
    ) -> Result<(), ProduceError> {
        if crate::failpoint::fires("kafka-fatal") {
            Idempotent::raise_fatal_for_test(&self.inner);
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
        self.inner.send(base).map_err(|(e, _)| {
            if e.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal) {
                self.inner.context().failed_fatally();
            }
            produce_error(&e)
        })
    }

    async fn ready(&self) -> Result<(), ProducerStopped> {
        Ok(())
    }

    fn failure(&self) -> Option<String> {
        self.inner.client().fatal_error().map(|(code, reason)| format!("{code}: {reason}"))
    }

    fn flush(&self, timeout: Duration) -> Result<(), KafkaError> {
        self.inner.flush(timeout)
    }

    /// A movable shard's own producer drops every record it still holds,
    /// queued or awaiting the broker's answer. The node's producer is left
    /// alone: its other shards' records are in it.
    fn let_go(&self) {
        if self.own {
            self.inner.purge(PurgeConfig::default().queue().inflight());
        }
    }

    /// Gets the producer its producer id now rather than in a second.
    /// librdkafka asks for the id from a timer that fires every 500 ms until
    /// a broker connection is up, so the first produce after a start waits
    /// 0.5 to 1 s; it also asks after each metadata answer. A few metadata
    /// requests in the first moments (on a thread of their own; one is
    /// enough once a connection is up) bring the first delivery after a
    /// restart within milliseconds.
    fn warm_up(self: Arc<Self>) {
        let spawned = std::thread::Builder::new().name("producer warm-up".into()).spawn(move || {
            for wait_ms in [0, 20, 50, 100, 200] {
                std::thread::sleep(Duration::from_millis(wait_ms));
                if self.inner.client().fetch_metadata(None, Duration::from_secs(2)).is_err() {
                    // Kafka is not there yet: librdkafka's own timer goes on.
                    return;
                }
            }
        });
        if let Err(e) = spawned {
            tracing::debug!(error = %e, "no warm-up thread for the producer; its own timer gets its id");
        }
    }
}
