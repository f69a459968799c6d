//! Reconciliation: after an unclean stop, or when a node takes a shard
//! over, which of the messages the last dispatcher may have produced
//! without recording it did reach Kafka.
//!
//! A dispatcher that stops uncleanly (kill -9, a crash, a fatal producer
//! error, power loss) may leave records Kafka has taken whose deliveries
//! the store never recorded. Sending those again is a duplicate. So before
//! the next dispatcher produces anything, it reads the target partitions
//! back and records as delivered, with their real partition and offset,
//! the in-doubt messages it finds there (by the `hourglass-id` and
//! `hourglass-due-ms` headers every delivery carries), in one commit. What
//! it does not find was not written, and is produced as usual.
//!
//! The read is bounded by the store's *marks*: per target partition, an
//! offset before which no unrecorded record of this store can lie. A
//! partition gets its first mark from where it ended before this store
//! first produced to its topic, and each recorded delivery raises it past
//! its own offset (records reach a partition in the order sent, and the
//! dispatcher hands their deliveries to the store in that order). So the
//! read covers what was produced since the last recorded delivery on each
//! partition, plus what other producers wrote meanwhile; a partition with
//! no mark (added to the topic later) is read from its start. Where the
//! broker answers offset-for-time lookups, record timestamps bound it too:
//! no record of the stopped dispatcher is older than the earliest dispatch
//! time in doubt, or newer than the stop. The end of each partition is
//! taken when the search begins; a request the stopped process had sent may
//! still be in the broker's hands, so the search reads on past the ends
//! until [`LATE_APPENDS`] after the store opened and as long after the
//! last record in doubt that appeared there. Nothing of this store is
//! produced while it runs.
//!
//! A topic that cannot be read back after [`ATTEMPTS`] tries is given up
//! on: its messages in doubt are produced again (possibly a second time),
//! counted in `hourglass_reconcile_unsearched_total`. Nothing is lost.

use std::{collections::HashMap, sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

use super::pulse;
use crate::{
    clock::{Clock as _, SystemClock},
    command::DispatchKey,
    command::{DeadLettered, InDoubt, Outcome},
    kafka::{Delivery, Producer, landed},
    message::{MessageId, PendingMessage, UnixMillis},
    metrics,
    store::{Store, StoreError},
};

/// How long after a stop a request the stopped process had already sent
/// may still be appended: the broker works through what a connection sent
/// before it closed, and under load that takes a while. The search reads
/// on past the partitions' ends until this long after the stopped process
/// last had produces unanswered (see [`pulse`](super::pulse); not known:
/// after the store opened), and this long after the last record in doubt
/// that appeared there.
pub(super) const LATE_APPENDS: Duration = Duration::from_secs(1);
/// Cluster mode: how long a node that takes a shard over holds its
/// requests after its claim, and reads the topics back at least, before it
/// dispatches. A previous owner still running (paused, cut off from the
/// group) stops when it applies the claim; what it produced before that
/// reaches the topics meanwhile and is found there, not produced again.
pub(crate) const CLAIM_GRACE: Duration = Duration::from_millis(500);
/// How far record timestamps (set by the producing client's clock) may
/// stray from this node's clock and still bound the search.
const CLOCK_SLACK: Duration = Duration::from_secs(60);
/// How long one search of a topic may take.
const SEARCH_WITHIN: Duration = Duration::from_secs(300);
/// Tries of a topic's search before its messages are produced unsearched.
const ATTEMPTS: u32 = 3;
/// Wait before trying again after a failure.
const BACKOFF: Duration = Duration::from_secs(2);

/// An in-doubt message found on its topic, or on its dead-letter topic.
#[derive(Debug)]
pub(super) struct Found {
    pub id: MessageId,
    /// Its due entry, as it was when it was found.
    pub key: DispatchKey,
    /// Delivered, or dead-lettered, where it was found.
    pub outcome: Outcome,
}

/// A message in doubt looked for on one topic: its own (for a delivery),
/// or its dead-letter topic (for a dead letter).
struct Sought {
    key: DispatchKey,
    id: MessageId,
    due: UnixMillis,
    own: bool,
}

/// What is in doubt after an unclean stop, and how long the search reads
/// on: until [`LATE_APPENDS`] after the stopped process last had produces
/// unanswered (`in_flight_at`, with the pulse's slack; none known: after
/// the store opened), when its last requests may still have been in the
/// broker's hands. Nothing due after that time and its slack can have
/// been produced (nothing is produced early): those messages are not in
/// doubt, so a restart after a kill of a node with nothing in flight
/// searches for nothing. `wall` is now by the dispatcher's clock, which
/// also wrote the pulse.
pub(super) fn after_restart(
    store: &Store,
    in_flight_at: Option<UnixMillis>,
    wall: UnixMillis,
) -> (Option<InDoubt>, landed::Late) {
    let last = quiet_since(in_flight_at, wall, std::time::Instant::now(), store.opened_at());
    (bounded(store.in_doubt_window(), in_flight_at), landed::Late { quiet: LATE_APPENDS, last })
}

/// The store's window of doubt, less what was due after the stopped
/// process last had produces unanswered (and the pulse's slack).
fn bounded(window: Option<InDoubt>, in_flight_at: Option<UnixMillis>) -> Option<InDoubt> {
    let (Some(window), Some(at)) = (window, in_flight_at) else { return window };
    let produced_by = DispatchKey::after(at.saturating_add(pulse::SLACK));
    Some(InDoubt { below: window.below.min(produced_by), ..window })
}

/// Since when (at `now`, by the wall clock `wall`) no request of the
/// stopped process can have been sent: the pulse's time `in_flight_at`
/// and its slack ago, counted up to [`LATE_APPENDS`]; not known, or later
/// than the open (a clock set back): the open.
fn quiet_since(
    in_flight_at: Option<UnixMillis>,
    wall: UnixMillis,
    now: std::time::Instant,
    opened_at: std::time::Instant,
) -> std::time::Instant {
    let Some(at) = in_flight_at else { return opened_at };
    let ago = wall.0.saturating_sub(at.0.saturating_add(pulse::SLACK.as_millis() as u64));
    now.checked_sub(Duration::from_millis(ago).min(LATE_APPENDS)).unwrap_or(now).min(opened_at)
}

/// Cluster mode, just after this node's claim of the shard: whatever was
/// due by the end of the [`CLAIM_GRACE`] is in doubt (the previous owner
/// may dispatch until it applies the claim), and the search reads on until
/// the grace is over. A previous owner that stopped did so at least a
/// session timeout ago, when the group took the shard from it.
pub(super) fn after_claim(now: UnixMillis) -> (Option<InDoubt>, landed::Late) {
    let below = DispatchKey::after(now.saturating_add(CLAIM_GRACE));
    let late = landed::Late { quiet: CLAIM_GRACE, last: std::time::Instant::now() };
    (Some(InDoubt { below, before_seq: u64::MAX, from: DispatchKey::MIN }), late)
}

/// Cluster mode, just after this node's claim of a shard its last owner
/// released with nothing in doubt: every produce of that owner was answered
/// and recorded before its release, so nothing is looked for.
pub(super) fn after_clean_release() -> (Option<InDoubt>, landed::Late) {
    (None, landed::Late { quiet: Duration::ZERO, last: std::time::Instant::now() })
}

/// The messages in `window` found on their topics, or on the dead-letter
/// topics `dead_letter_topic` names for them, read on past the ends as
/// `late` says. `None` if stopped first.
pub(super) async fn landed(
    store: &Store,
    producer: &Arc<Producer>,
    (window, mut late): (Option<InDoubt>, landed::Late),
    dead_letter_topic: impl Fn(&PendingMessage) -> Option<Arc<str>>,
    stop: &CancellationToken,
) -> Option<Vec<Found>> {
    let Some(window) = window else { return Some(Vec::new()) };
    let started = std::time::Instant::now();
    if crate::failpoint::fires("reconcile-slow") {
        tokio::select! {
            _ = stop.cancelled() => return None,
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
    }
    let in_doubt = loop {
        match store.in_doubt_messages(window).await {
            Ok(in_doubt) => break in_doubt,
            Err(e) => tracing::warn!(error = %e, "reading the messages in doubt failed; trying again"),
        }
        pause(stop).await?;
    };
    if in_doubt.is_empty() {
        return Some(Vec::new());
    }
    let count = in_doubt.len();
    metrics::RECONCILE_IN_DOUBT.inc_by(count as u64);
    // A message past its deadline, or refused for good, may have gone to
    // its dead-letter topic instead: it is looked for on both.
    let mut by_topic: HashMap<Arc<str>, Vec<Sought>> = HashMap::new();
    for (key, message) in in_doubt {
        tracing::trace!(id = %message.id.qualified(), due = message.due.0, topic = %message.topic, "in doubt");
        let due = message.due;
        if let Some(to) = dead_letter_topic(&message) {
            by_topic.entry(to).or_default().push(Sought { key, id: message.id.clone(), due, own: false });
        }
        by_topic.entry(message.topic.into()).or_default().push(Sought {
            key,
            id: message.id,
            due,
            own: true,
        });
    }
    tracing::info!(
        messages = count,
        topics = by_topic.len(),
        "reading the target topics back for messages the last dispatcher of this shard may have \
         produced without recording it"
    );
    // Reading on is kept with transactional delivery too: the stopped
    // process may have delivered without transactions (the setting changed
    // across the stop).
    // Nothing of the stopped dispatcher is newer than now.
    let newest = SystemClock.now().saturating_add(CLOCK_SLACK);
    let (mut found, mut read, mut partitions) = (HashMap::<MessageId, Found>::new(), 0, 0);
    for (topic, messages) in by_topic {
        let oldest = messages.iter().map(|m| m.key.at).min().unwrap_or_default();
        let oldest = UnixMillis(oldest.0.saturating_sub(CLOCK_SLACK.as_millis() as u64));
        let wanted: Arc<HashMap<MessageId, UnixMillis>> =
            Arc::new(messages.iter().map(|m| (m.id.clone(), m.due)).collect());
        let mut attempt = 0;
        let landed = loop {
            attempt += 1;
            match search(store, producer, &topic, &wanted, (oldest, newest), late).await {
                Ok((landed, later)) => {
                    late = later;
                    break Some(landed);
                }
                Err(e) if attempt < ATTEMPTS => {
                    tracing::warn!(topic = %topic, error = %e, "reading a target topic back failed; trying again (nothing is produced until then)");
                    pause(stop).await?;
                }
                Err(e) => {
                    tracing::error!(
                        topic = %topic,
                        error = %e,
                        messages = wanted.len(),
                        "reading a target topic back failed {ATTEMPTS} times: its messages in doubt are \
                         produced again, and those already on it go out twice"
                    );
                    metrics::RECONCILE_UNSEARCHED.inc_by(wanted.len() as u64);
                    break None;
                }
            }
        };
        let Some(landed) = landed else { continue };
        read += landed.read;
        partitions += landed.partitions;
        let keys: HashMap<&MessageId, (DispatchKey, bool)> =
            messages.iter().map(|m| (&m.id, (m.key, m.own))).collect();
        for (id, spot) in landed.found {
            let Some(&(key, own)) = keys.get(&id) else { continue };
            let outcome = match spot.dead {
                // A delivery only on its own topic, a dead letter only on
                // its dead-letter topic: anything else is not its record.
                _ if own == spot.dead.is_some() => continue,
                None => Outcome::Delivered { partition: spot.partition, offset: spot.offset },
                // Found there, it went there: whether the try before it
                // counted is not known.
                Some(reason) => Outcome::DeadLettered(Box::new(DeadLettered {
                    topic: Arc::clone(&topic),
                    partition: spot.partition,
                    offset: spot.offset,
                    reason,
                    tried: false,
                })),
            };
            // Found on its own topic too: delivered there, whatever else.
            if found.get(&id).is_none_or(|f| matches!(f.outcome, Outcome::DeadLettered(_))) {
                found.insert(id.clone(), Found { id, key, outcome });
            }
        }
    }
    let found: Vec<Found> = found.into_values().collect();
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

/// One search of `topic`, off the runtime.
async fn search(
    store: &Store,
    producer: &Arc<Producer>,
    topic: &str,
    wanted: &Arc<HashMap<MessageId, UnixMillis>>,
    times: (UnixMillis, UnixMillis),
    mut late: landed::Late,
) -> Result<(landed::Landed, landed::Late), SearchFailed> {
    let marks = store
        .marks_of(topic)
        .await
        .map_err(|error| SearchFailed::Marks { topic: topic.to_owned(), error })?;
    let (producer, topic, wanted) = (Arc::clone(producer), topic.to_owned(), Arc::clone(wanted));
    let committed = *producer.delivery() != Delivery::Idempotent;
    tokio::task::spawn_blocking(move || {
        let wanted = landed::Wanted { ids: &wanted, times };
        landed::search(producer.config(), committed, &topic, &marks, wanted, &mut late, SEARCH_WITHIN)
            .map(|landed| (landed, late))
            .map_err(|error| SearchFailed::Read { topic, error })
    })
    .await
    .map_err(|e| SearchFailed::Task(e.to_string()))?
}

/// Why one search of a topic failed.
#[derive(Debug, thiserror::Error)]
enum SearchFailed {
    #[error("reading the marks of {topic}: {error}")]
    Marks { topic: String, error: StoreError },
    #[error("{topic}: {error}")]
    Read { topic: String, error: rdkafka::error::KafkaError },
    #[error("the search's thread: {0}")]
    Task(String),
}

/// Waits [`BACKOFF`]; `None` if stopped first.
async fn pause(stop: &CancellationToken) -> Option<()> {
    tokio::select! {
        _ = stop.cancelled() => None,
        _ = tokio::time::sleep(BACKOFF) => Some(()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[test]
    fn the_search_reads_on_as_long_after_the_last_produce_as_requests_may_land() {
        let (now, wall) = (Instant::now(), UnixMillis(1_000_000));
        let opened = now - Duration::from_millis(20);
        let quiet = |at: Option<u64>| now.duration_since(quiet_since(at.map(UnixMillis), wall, now, opened));
        assert_eq!(quiet(None), Duration::from_millis(20), "not known: from the open");
        assert_eq!(quiet(Some(900_000)), LATE_APPENDS, "long ago: quiet already");
        let slack = pulse::SLACK.as_millis() as u64;
        assert_eq!(
            quiet(Some(1_000_000 - slack - 300)),
            Duration::from_millis(300),
            "a while ago: the rest of it"
        );
        assert_eq!(
            quiet(Some(1_000_000)),
            Duration::from_millis(20),
            "just now: from the open at the latest"
        );
        assert_eq!(quiet(Some(2_000_000)), Duration::from_millis(20), "a clock set back: from the open");
    }

    #[test]
    fn what_was_due_after_the_last_produce_is_not_in_doubt() {
        let window =
            InDoubt { below: DispatchKey::after(UnixMillis(10_000)), before_seq: 7, from: DispatchKey::MIN };
        let below = |at: Option<u64>| bounded(Some(window), at.map(UnixMillis)).unwrap().below;
        assert_eq!(below(None), window.below, "not known: the store's window");
        let slack = pulse::SLACK.as_millis() as u64;
        assert_eq!(
            below(Some(2_000)),
            DispatchKey::after(UnixMillis(2_000 + slack)),
            "due by the last produce"
        );
        assert_eq!(below(Some(20_000)), window.below, "never past the store's window");
        assert_eq!(bounded(Some(window), Some(UnixMillis(2_000))).unwrap().before_seq, 7);
        assert!(bounded(None, Some(UnixMillis(2_000))).is_none(), "a clean stop: nothing in doubt");
    }
}
