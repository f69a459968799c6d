//! Reconciliation: after an unclean stop, which of the messages the last
//! dispatcher may have produced without recording it did reach Kafka.
//!
//! A dispatcher that stops uncleanly (kill -9, a crash, a fatal producer
//! error, power loss) may leave records Kafka has taken whose deliveries
//! the store never recorded. Sending those again is a duplicate. So before
//! the next dispatcher produces anything, it reads the target partitions
//! back and settles as delivered, with their real partition and offset,
//! the in-doubt messages it finds there (by the `hourglass-id` and
//! `hourglass-due-ms` headers every delivery carries). What it does not
//! find was not written, and is produced as usual.
//!
//! The read is bounded by the store's *marks*: per target partition, an
//! offset before which no unrecorded record of this store can lie. A
//! partition gets its first mark from where it ended before this store
//! first produced to its topic, and each recorded delivery raises it past
//! its own offset (records reach a partition in the order sent, and the
//! dispatcher hands their deliveries to the store in that order). So the
//! read covers what was produced since the last recorded delivery on each
//! partition, plus what other producers wrote meanwhile; a partition with
//! no mark (added to the topic later) is read from its start. The end of
//! each partition is taken when the search begins, at least
//! [`LATE_APPENDS`] after the store opened (a request the stopped process
//! had sent may still be in the broker's hands); nothing of this store is
//! produced while it runs.

use std::{collections::HashMap, sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

use crate::{
    kafka::{Producer, landed},
    message::{MessageId, UnixMillis},
    metrics,
    store::{InDoubt, Store},
};

/// How long after a stop a request the stopped process had already sent
/// may still be appended: the broker works through what a connection sent
/// before it closed. The search reads the partitions' ends no sooner than
/// this after the store opened (a restart usually takes longer anyway).
const LATE_APPENDS: Duration = Duration::from_secs(1);
/// How long one topic's search may take before it is tried again.
const SEARCH_WITHIN: Duration = Duration::from_secs(300);
/// Wait before trying again after a failure.
const BACKOFF: Duration = Duration::from_secs(2);

/// The in-doubt messages found on their topics, by id: their partition and
/// offset. `None` if stopped first.
pub(super) async fn landed(
    store: &Store,
    producer: &Arc<Producer>,
    window: Option<InDoubt>,
    stop: &CancellationToken,
) -> Option<HashMap<MessageId, (i32, i64)>> {
    let Some(window) = window else { return Some(HashMap::new()) };
    let started = std::time::Instant::now();
    let in_doubt = retry(stop, "reading the messages in doubt", || store.in_doubt_messages(window)).await?;
    if in_doubt.is_empty() {
        return Some(HashMap::new());
    }
    let count = in_doubt.len();
    tokio::select! {
        _ = stop.cancelled() => return None,
        _ = tokio::time::sleep_until((store.opened_at() + LATE_APPENDS).into()) => {}
    }
    let mut by_topic: HashMap<String, HashMap<MessageId, UnixMillis>> = HashMap::new();
    for message in in_doubt {
        tracing::trace!(id = %message.id.qualified(), due = message.due.0, topic = %message.topic, "in doubt");
        by_topic.entry(message.topic).or_default().insert(message.id, message.due);
    }
    tracing::info!(
        messages = count,
        topics = by_topic.len(),
        "reading the target topics back for messages the last dispatcher of this shard may have \
         produced without recording it"
    );
    let (mut found, mut read, mut partitions) = (HashMap::new(), 0, 0);
    for (topic, wanted) in by_topic {
        let marks = retry(stop, "reading the marks of a target topic", || store.marks_of(&topic)).await?;
        let (wanted, marks) = (Arc::new(wanted), Arc::new(marks));
        let landed = retry(stop, "reading a target topic back", || {
            let (producer, topic, wanted, marks) =
                (Arc::clone(producer), topic.clone(), Arc::clone(&wanted), Arc::clone(&marks));
            async move {
                tokio::task::spawn_blocking(move || {
                    landed::search(producer.config(), &topic, &marks, &wanted, SEARCH_WITHIN)
                        .map_err(|e| format!("{topic}: {e}"))
                })
                .await
                .map_err(|e| e.to_string())?
            }
        })
        .await?;
        read += landed.read;
        partitions += landed.partitions;
        found.extend(landed.found);
    }
    metrics::RECONCILE_MILLISECONDS.set(i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX));
    metrics::RECONCILE_FOUND.inc_by(found.len() as u64);
    metrics::RECONCILE_READ.inc_by(read);
    tracing::info!(
        in_doubt = count,
        found = found.len(),
        records_read = read,
        partitions,
        elapsed = ?started.elapsed(),
        "reconciled: the messages found are recorded as delivered, the rest are produced"
    );
    Some(found)
}

/// Runs `attempt` until it succeeds or `stop`.
async fn retry<T, E: std::fmt::Display, F: std::future::Future<Output = Result<T, E>>>(
    stop: &CancellationToken,
    what: &str,
    mut attempt: impl FnMut() -> F,
) -> Option<T> {
    loop {
        match attempt().await {
            Ok(done) => return Some(done),
            Err(e) => {
                tracing::warn!(error = %e, "{what} failed; trying again (nothing is produced until then)")
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return None,
            _ = tokio::time::sleep(BACKOFF) => {}
        }
    }
}
