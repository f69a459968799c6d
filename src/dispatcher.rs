//! The dispatcher: wakes when the earliest message is due, produces it to its
//! topic, and settles the outcome in the store.
//!
//! It has no polling interval. It sleeps until the earliest due time it knows
//! of (read from the head of the due CF), and the writer wakes it when a
//! commit adds anything earlier. Sleeping is on tokio's monotonic timer,
//! capped at `max_sleep`; on waking it reads the wall clock again and takes
//! only what is due by then, so it never delivers early, and a wall-clock
//! step is noticed within `max_sleep`.
//!
//! At most `max_in_flight` messages are between "claimed" and "settled".
//! Messages go to the producer in due order, so each partition receives them
//! in due order (the producer is idempotent). A delivery report becomes one
//! [`Settle`] the writer commits atomically: delete from the due CF, record
//! partition and offset in the checkpoint CF, advance the counters.
//!
//! Failures: an outage (broker unreachable, timed out) is retried with
//! backoff for as long as it lasts, without counting toward the attempt
//! limit; a rejection (topic deleted, too large, not authorised) is retried
//! up to `max_attempts` times, then the message is settled as failed with the
//! reason. Either way the message waits in the store, not in memory, so other
//! messages keep flowing.

use std::{collections::HashMap, sync::Arc, time::Duration};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{
    clock::Clock,
    kafka::{DeliveryReport, Fault, Outgoing, ProduceError, Producer},
    message::{DUE_HEADER, ID_HEADER, MessageId, UnixMillis},
    metrics,
    store::{
        DueBatch, Outcome, Ready, Settle, Store, StoreError,
        schema::{DueKey, Settlement},
    },
};

#[derive(Clone, Debug)]
pub struct DispatcherConfig {
    /// Messages produced and not yet acknowledged, at most.
    pub max_in_flight: usize,
    /// Tries the broker may refuse a message before it is settled as failed.
    pub max_attempts: u32,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// Longest sleep before reading the wall clock again.
    pub max_sleep: Duration,
    /// How long shutdown waits for in-flight produces to be acknowledged.
    pub shutdown_grace: Duration,
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        DispatcherConfig {
            max_in_flight: 10_000,
            max_attempts: 5,
            backoff_initial: Duration::from_millis(200),
            backoff_max: Duration::from_secs(30),
            max_sleep: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

impl DispatcherConfig {
    /// Wait before try number `attempts + 1`: exponential, capped.
    pub fn backoff(&self, attempts: u32) -> Duration {
        let factor = 1u32.checked_shl(attempts.min(20)).unwrap_or(u32::MAX);
        self.backoff_initial.saturating_mul(factor).min(self.backoff_max)
    }

    /// What a produce error means for a message that had `rejections`
    /// refusals before this one.
    fn outcome_of_error(
        &self,
        error: ProduceError,
        attempts: u32,
        rejections: u32,
        now: UnixMillis,
    ) -> Outcome {
        let rejected = error.fault == Fault::Rejected;
        if rejected && rejections + 1 >= self.max_attempts {
            return Outcome::Failed { at: now, error: error.reason };
        }
        Outcome::Retry { retry_at: now.saturating_add(self.backoff(attempts)), error: error.reason, rejected }
    }
}

/// Messages read from the store in one go; the next chunk is read while
/// this one is produced.
const READ_CHUNK: usize = 2048;

/// A message handed to the producer, waiting for its report.
struct InFlight {
    id: MessageId,
    key: DueKey,
    due: UnixMillis,
    prev: Settlement,
}

pub struct Dispatcher {
    store: Store,
    producer: Arc<Producer>,
    clock: Arc<dyn Clock>,
    config: DispatcherConfig,
    in_flight: HashMap<u64, InFlight>,
    next_token: u64,
    reports_tx: mpsc::UnboundedSender<DeliveryReport>,
    reports: mpsc::UnboundedReceiver<DeliveryReport>,
    /// Outcomes not yet handed to the store; sent together.
    settling: Vec<Settle>,
    /// Everything in the due CF below this is settled or in flight.
    scan_from: DueKey,
}

/// What to do after a look at the store.
enum Next {
    /// More is due right now.
    Now,
    /// Sleep until this due time (or a wake-up, or a report).
    At(UnixMillis),
    /// Nothing parked: wait for a wake-up or a report.
    Idle,
    /// In-flight limit reached: wait for reports.
    Full,
}

impl Dispatcher {
    pub fn new(
        store: Store,
        producer: Arc<Producer>,
        clock: Arc<dyn Clock>,
        config: DispatcherConfig,
    ) -> Self {
        let (reports_tx, reports) = mpsc::unbounded_channel();
        Dispatcher {
            store,
            producer,
            clock,
            config,
            in_flight: HashMap::new(),
            next_token: 0,
            reports_tx,
            reports,
            settling: Vec::new(),
            scan_from: DueKey::MIN,
        }
    }

    pub async fn run(mut self, stop: CancellationToken) {
        loop {
            metrics::DISPATCH_WAKEUPS.inc();
            // One commit for every outcome gathered since the last look.
            self.flush_settles().await;
            let next = self.dispatch_due().await;
            let sleep = match next {
                Next::At(due) => self.clock.until(due).min(self.config.max_sleep),
                Next::Idle | Next::Full => self.config.max_sleep,
                Next::Now => Duration::ZERO,
            };
            tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                Some(report) = self.reports.recv() => {
                    self.on_report(report);
                    while let Ok(report) = self.reports.try_recv() {
                        self.on_report(report);
                    }
                }
                _ = self.store.wake().notified(), if !matches!(next, Next::Full) => {}
                _ = tokio::time::sleep(sleep), if !matches!(next, Next::Full) => {}
            }
        }
        self.drain().await;
    }

    /// Claims and produces whatever is due now, as far as in-flight room
    /// allows.
    async fn dispatch_due(&mut self) -> Next {
        if let Some(lowest) = self.store.wake().take() {
            self.scan_from = self.scan_from.min(lowest);
        }
        let mut room = self.config.max_in_flight.saturating_sub(self.in_flight.len());
        if room == 0 {
            return Next::Full;
        }
        let now = self.clock.now();
        // Read in chunks, the next one while this one is being produced.
        let mut reading = Some(self.read_due(self.scan_from, now, room.min(READ_CHUNK)));
        let mut next = Next::Idle;
        while let Some(read) = reading.take() {
            let batch = match read.await {
                Ok(Ok(batch)) => batch,
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "reading due messages failed; retrying shortly");
                    if let StoreError::Corrupt(detail) = &e {
                        self.store.report_damage(detail);
                    }
                    return Next::At(now.saturating_add(self.config.max_sleep));
                }
                Err(e) => {
                    tracing::error!(error = %e, "the due-message reader panicked; retrying shortly");
                    return Next::At(now.saturating_add(self.config.max_sleep));
                }
            };
            self.scan_from = batch.next_from;
            room = room.saturating_sub(batch.ready.len());
            if batch.more && room > 0 {
                reading = Some(self.read_due(batch.next_from, now, room.min(READ_CHUNK)));
            }
            if let Err(e) = self.store.release(batch.stale).await {
                tracing::warn!(error = %e, "returning stale claims failed");
            }
            for ready in batch.ready {
                self.produce(ready).await;
            }
            next = match (batch.more, batch.next_due) {
                (true, _) => Next::Now,
                (false, Some(due)) => Next::At(due),
                (false, None) => Next::Idle,
            };
        }
        metrics::IN_FLIGHT.set(self.in_flight.len() as i64);
        next
    }

    /// Starts reading (and claiming) up to `limit` messages due at `now`.
    fn read_due(
        &self,
        from: DueKey,
        now: UnixMillis,
        limit: usize,
    ) -> tokio::task::JoinHandle<Result<DueBatch, StoreError>> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.take_due(from, now, limit))
    }

    async fn produce(&mut self, ready: Ready) {
        let token = self.next_token;
        self.next_token += 1;
        let record = &ready.record;
        let due = record.due_ms.to_string();
        let mut headers: Vec<(&str, &[u8])> =
            record.headers.iter().map(|h| (h.key.as_str(), h.value.as_slice())).collect();
        headers.push((ID_HEADER, ready.id.as_bytes()));
        headers.push((DUE_HEADER, due.as_bytes()));
        let outgoing = Outgoing {
            topic: &record.topic,
            key: record.key.as_deref(),
            value: &record.value,
            headers,
            partition: record.partition,
        };
        let queued = self.producer.send(outgoing, token, &self.reports_tx);
        let due = ready.record.due();
        self.in_flight.insert(token, InFlight { id: ready.id, key: ready.key, due, prev: ready.prev });
        if let Err(error) = queued {
            // Refused before it was queued: the same as a failed report.
            self.on_report(DeliveryReport { token, result: Err(error) });
        }
    }

    /// Hands the gathered outcomes to the store as one commit.
    async fn flush_settles(&mut self) {
        let settles = std::mem::take(&mut self.settling);
        if let Err(e) = self.store.settle(settles).await {
            tracing::error!(error = %e, "settling deliveries failed; they will be produced again after restart");
        }
    }

    fn on_report(&mut self, report: DeliveryReport) {
        let Some(sent) = self.in_flight.remove(&report.token) else {
            return;
        };
        metrics::IN_FLIGHT.set(self.in_flight.len() as i64);
        let now = self.clock.now();
        let outcome = match report.result {
            Ok((partition, offset)) => {
                crate::failpoint::hit("dispatch-before-settle");
                Outcome::Delivered { partition, offset, at: now }
            }
            Err(error) => {
                let kind = match error.fault {
                    Fault::Outage => "outage",
                    Fault::Rejected => "rejected",
                };
                metrics::PRODUCE_ERRORS.with_label_values(&[kind]).inc();
                let (attempts, rejections) = (sent.prev.attempts, sent.prev.rejections);
                tracing::warn!(id = %sent.id, attempts = attempts + 1, kind, error = %error.reason, "produce failed");
                self.config.outcome_of_error(error, attempts, rejections, now)
            }
        };
        self.settling.push(Settle { id: sent.id, key: sent.key, due: sent.due, prev: sent.prev, outcome });
    }

    /// Shutdown: produce nothing new, wait (up to the grace period) for what
    /// is in flight, settle it, and give back the claims of anything still
    /// unacknowledged (it stays pending and is produced after restart).
    async fn drain(mut self) {
        let deadline = tokio::time::Instant::now() + self.config.shutdown_grace;
        while !self.in_flight.is_empty() {
            match tokio::time::timeout_at(deadline, self.reports.recv()).await {
                Ok(Some(report)) => self.on_report(report),
                Ok(None) | Err(_) => break,
            }
        }
        self.flush_settles().await;
        if !self.in_flight.is_empty() {
            tracing::warn!(
                unacknowledged = self.in_flight.len(),
                "shutdown grace ran out; these stay pending and may be produced twice"
            );
        }
        let ids = self.in_flight.drain().map(|(_, f)| f.id).collect();
        if let Err(e) = self.store.release(ids).await {
            tracing::error!(error = %e, "returning claims at shutdown failed");
        }
        metrics::IN_FLIGHT.set(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let c = DispatcherConfig {
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(1),
            ..DispatcherConfig::default()
        };
        assert_eq!(c.backoff(0), Duration::from_millis(100));
        assert_eq!(c.backoff(1), Duration::from_millis(200));
        assert_eq!(c.backoff(3), Duration::from_millis(800));
        assert_eq!(c.backoff(4), Duration::from_secs(1));
        assert_eq!(c.backoff(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn outages_retry_forever_and_rejections_are_bounded() {
        let c = DispatcherConfig { max_attempts: 3, ..DispatcherConfig::default() };
        let now = UnixMillis(1000);
        let outage = ProduceError { fault: Fault::Outage, reason: "timed out".into() };
        let rejected = ProduceError { fault: Fault::Rejected, reason: "too large".into() };
        assert!(matches!(c.outcome_of_error(outage, 500, 2, now), Outcome::Retry { rejected: false, .. }));
        assert!(matches!(
            c.outcome_of_error(rejected.clone(), 1, 1, now),
            Outcome::Retry { rejected: true, .. }
        ));
        match c.outcome_of_error(rejected, 2, 2, now) {
            Outcome::Failed { at, error } => {
                assert_eq!(at, now);
                assert_eq!(error, "too large");
            }
            other => panic!("third refusal must fail the message, got {other:?}"),
        }
    }
}
