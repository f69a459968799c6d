//! Producing: a message handed to the producer (with whether it keeps its
//! record for a dead-letter topic), and what is recorded before a produce,
//! so that an unclean stop leaves little in doubt (the topic's mark, the
//! dispatch horizon).

use std::{sync::Arc, time::Duration};

use super::{
    Dispatcher,
    sent::{Dead, InFlight},
};
use crate::{
    command::{DispatchKey, Ready},
    kafka::DeliveryReport,
    message::{Outgoing, UnixMillis},
    store::StoreError,
};

/// How far past what it is about to produce the dispatcher records its
/// horizon once it has caught up: a commit per this much of due time at
/// most, and what is in doubt after an unclean stop is what was due up to
/// this much later.
pub(super) const HORIZON_AHEAD: Duration = Duration::from_secs(5);

/// The horizon to record before producing up to `last`: [`HORIZON_AHEAD`]
/// past its time once nothing more is due (`caught_up`); in a backlog,
/// just past it, so that an unclean stop in the middle of a backlog leaves
/// in doubt only what was read of it (a chunk ahead of what went out), not
/// all that was due by then. One commit per chunk of a backlog.
pub(super) fn horizon_past(last: DispatchKey, caught_up: bool) -> DispatchKey {
    let next = last.successor();
    if caught_up { next.max(DispatchKey::after(last.at.saturating_add(HORIZON_AHEAD))) } else { next }
}

/// A horizon being recorded, for a chunk read ahead.
pub(super) struct Recording {
    pub(super) until: DispatchKey,
    pub(super) task: tokio::task::JoinHandle<Result<(), StoreError>>,
}

impl Dispatcher {
    /// Waits for the horizon being recorded, if any.
    async fn recorded(&mut self) {
        let Some(Recording { until, task }) = self.doubt.recording.take() else { return };
        match task.await {
            Ok(Ok(())) => self.doubt.horizon = self.doubt.horizon.max(until),
            // Recorded again before anything past the horizon is produced.
            Ok(Err(e)) => tracing::warn!(error = %e, "recording the dispatch horizon failed"),
            Err(e) => tracing::warn!(error = %e, "recording the dispatch horizon failed"),
        }
    }

    /// While it sleeps until `due`: records a horizon [`HORIZON_AHEAD`]
    /// past it, so that what is due then goes out on waking without a
    /// commit. (A backlog found there brings it down again: see
    /// [`Self::horizon_down_to`].)
    pub(super) async fn extend_horizon_asleep(&mut self, due: UnixMillis) {
        let due = DispatchKey { at: due, seq: u64::MAX };
        self.extend_horizon(due.successor(), horizon_past(due, true)).await;
    }

    /// A backlog was found: brings the horizon down to `until` (past the
    /// chunk just read), if it was recorded further ahead while nothing
    /// was due, so that a crash in the backlog leaves in doubt what was
    /// read of it, not all of it. Never below what was handed to the
    /// producer, or to be sent to a dead-letter topic; nor, while what an
    /// earlier unclean stop left in doubt is unresolved, below the horizon
    /// it left.
    pub(super) async fn horizon_down_to(&mut self, until: DispatchKey) {
        let until = self
            .settling
            .letters
            .iter()
            .map(|l| l.key().successor())
            .fold(until.max(self.doubt.produced_below).max(self.doubt.keep_above), DispatchKey::max);
        if until >= self.doubt.horizon {
            return;
        }
        // What is being recorded lands first, not after it.
        self.recorded().await;
        match self.recorder.lower_horizon(until).await {
            Ok(()) => self.doubt.horizon = until,
            Err(e) => tracing::warn!(error = %e, "bringing the dispatch horizon down failed"),
        }
    }

    /// Records a horizon at `until` (in the store, standalone; the log
    /// needs none) before anything at or past the recorded one, below
    /// `needed`, is produced.
    pub(super) async fn extend_horizon(&mut self, needed: DispatchKey, until: DispatchKey) {
        if needed <= self.doubt.horizon {
            return;
        }
        self.recorded().await;
        if needed <= self.doubt.horizon {
            return;
        }
        match self.recorder.extend_horizon(until).await {
            Ok(()) => self.doubt.horizon = self.doubt.horizon.max(until),
            // Produced anyway: after a crash, what went out past the
            // recorded horizon is produced again, never lost.
            Err(e) => tracing::warn!(error = %e, "recording the dispatch horizon failed"),
        }
    }

    /// Before the first produce of this store to `topic`: marks where its
    /// partitions end, unless they have marks, so that a search for what
    /// an unclean stop left unrecorded starts there (see
    /// [`reconcile`](super::reconcile)). A topic the broker does not
    /// describe now is not marked; its partitions are then searched from
    /// their start.
    pub(super) async fn mark(&mut self, topic: Arc<str>) {
        self.doubt.marked.insert(Arc::clone(&topic));
        match self.store.marks_of(&topic).await {
            Ok(marks) if !marks.is_empty() => return,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(topic = %topic, error = %e, "reading a topic's marks failed");
                return;
            }
        }
        let producer = Arc::clone(&self.producer);
        let asking = Arc::clone(&topic);
        let ends = tokio::task::spawn_blocking(move || producer.ends(&asking, Duration::from_secs(5))).await;
        let failed = match ends {
            Ok(Ok(ends)) if !ends.is_empty() => match self.recorder.mark(Arc::clone(&topic), ends).await {
                Ok(()) => return,
                Err(e) => e.to_string(),
            },
            Ok(Ok(_)) => "the broker does not know the topic".to_owned(),
            Ok(Err(e)) => e.to_string(),
            Err(e) => e.to_string(),
        };
        tracing::debug!(
            topic = %topic,
            error = %failed,
            "marking where a topic's partitions end failed: after an unclean stop, they are read back from their start"
        );
    }

    /// Whether a message of `topic` has a dead-letter topic: as
    /// [`Dispatcher::dead_letter_topic`] says, without making its name.
    pub(super) fn has_dead_letter_topic(&self, ready: &Ready, topic: &str) -> bool {
        ready.envelope.dead_letter_topic.is_some()
            || self.config.dead_letter_topic.as_deref().is_some_and(|to| to != topic)
            || self.policies.dead_letter_topic(ready.id.tenant(), topic).is_some()
    }

    /// Hands `ready` to the producer for `topic`: a dead letter if
    /// `letter` says so, else a delivery, which keeps the message for its
    /// dead-letter topic if it has one.
    pub(super) fn send(&mut self, ready: Ready, topic: Arc<str>, probe: bool, letter: Option<Dead>) {
        let keep = letter.is_none() && self.has_dead_letter_topic(&ready, &topic);
        let token = self.sent.next_token();
        let (sent_at, sent_wall) = (tokio::time::Instant::now(), self.clock.now());
        let outgoing = Outgoing { id: &ready.id, due: ready.due, envelope: &ready.envelope };
        self.doubt.produced_below = self.doubt.produced_below.max(ready.key.successor());
        let queued = self.producer.send(outgoing, token, &self.reports.tx);
        let dead = match letter {
            None if keep => Some(Dead::Fallback { envelope: ready.envelope }),
            letter => letter,
        };
        self.sent.push(InFlight {
            id: ready.id,
            key: ready.key,
            due: ready.due,
            topic: Arc::clone(&topic),
            tries: ready.tries,
            probe,
            sent_at,
            sent_wall,
            dead,
        });
        self.topics.states.entry(topic).or_default().in_flight += 1;
        if let Err(error) = queued {
            // Refused before it was queued: the same as a failed report.
            self.on_report(DeliveryReport::now(token, Err(error)));
        }
    }
}
