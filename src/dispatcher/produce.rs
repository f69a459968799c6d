//! What a look at the due index found: produced, put off with its topic,
//! or settled without a produce (found on its topic after an unclean
//! stop, past its deadline, or failed with its topic); and what is
//! recorded before a produce, so that an unclean stop leaves little in
//! doubt (the topic's mark, the dispatch horizon).

use std::{sync::Arc, time::Duration};

use super::{
    Dispatcher,
    sent::{Dead, InFlight},
    topics::Decision,
};
use crate::{
    command::{DueBatch, Outcome, Ready},
    kafka::DeliveryReport,
    message::{Outgoing, UnixMillis},
};

/// How far past what it is about to produce the dispatcher records its
/// horizon: a commit per this much of due time at most, and what is in
/// doubt after an unclean stop is what was due up to this much later.
const HORIZON_AHEAD: Duration = Duration::from_secs(5);

impl Dispatcher {
    /// Produces what a look found ready, puts off what its topic's state
    /// or a policy holds back, and keeps track of the rest. Returns how
    /// many it produced.
    pub(super) async fn handle(&mut self, batch: DueBatch, now: UnixMillis) -> usize {
        let mut produced = 0;
        let mut release = batch.stale;
        self.scan.recheck.extend(batch.contended);
        if batch.unreadable.is_empty() {
            if self.scan.unreadable.is_empty() {
                self.store.report_reads(None);
            }
        } else {
            for (key, id, e) in batch.unreadable {
                tracing::error!(id = %id.qualified(), error = %e, "reading a due message failed; trying it again shortly");
                self.store.report_reads(Some(format!("reading message {} failed: {e}", id.qualified())));
                release.push(id.clone());
                self.scan.unreadable.push((key, id));
            }
            self.scan.unreadable_retry = now.saturating_add(self.config.max_sleep);
        }
        for ready in &batch.ready {
            if !self.doubt.marked.contains(ready.envelope.topic.as_str()) {
                self.mark(ready.envelope.topic.as_str().into()).await;
            }
        }
        if let Some(latest) = batch.ready.iter().map(|r| r.key.at).max() {
            self.extend_horizon(latest).await;
        }
        if !batch.ready.is_empty() {
            // Written before anything is handed to the producer, so that
            // after a kill the time in it is at most the pulse's interval
            // older than every produce (none awaited between here and
            // them): what was due after it and its slack was not sent.
            self.doubt.pulse.beat(self.clock.now());
        }
        for ready in batch.ready {
            // One allocation per topic, not per message.
            let topic = match self.topics.states.get_key_value(ready.envelope.topic.as_str()) {
                Some((known, _)) => Arc::clone(known),
                None => ready.envelope.topic.as_str().into(),
            };
            if let Some((key, outcome)) = self.doubt.landed.remove(&ready.id)
                && key == ready.key
            {
                // It reached Kafka (its topic or its dead-letter topic)
                // before the unclean stop.
                self.settle_untried(ready, topic, now, outcome);
                continue;
            }
            if self.config.reserved.contains(&topic) {
                // Parked before such topics were refused at the door: a
                // record there could replace one the cluster keeps.
                tracing::warn!(id = %ready.id.qualified(), topic = %topic, "a message for a topic hourglass keeps for itself: failed, not produced");
                let error =
                    format!("{topic:?} is a topic hourglass keeps for itself; it is never a destination");
                produced +=
                    usize::from(self.give_up(ready, topic, now, Outcome::Failed { error, tried: false }));
                continue;
            }
            let max_lateness = (ready.envelope.max_lateness)
                .or_else(|| self.policies.max_lateness(ready.id.tenant(), &topic));
            if let Some(deadline) = max_lateness.map(|late| ready.due.saturating_add(late))
                && now > deadline
            {
                // Too late to be of use (a paused topic, an outage, a
                // backlog): not produced, but settled or dead-lettered.
                // What reached Kafka before an unclean stop was found above.
                tracing::debug!(id = %ready.id.qualified(), topic = %topic, "deadline passed: expired");
                // A dead letter takes room as a produce does.
                produced += usize::from(self.give_up(ready, topic, now, Outcome::Expired { deadline }));
                continue;
            }
            match self.decide(&topic, &ready.id, ready.key, now) {
                Decision::Produce { probe } => {
                    self.policies.observe_produced(ready.id.tenant(), &topic, ready.due, now);
                    self.send(ready, topic, probe, None);
                    produced += 1;
                }
                Decision::Hold(lane, why) => {
                    self.policies.hold(lane, why, ready.key, now);
                    release.push(ready.id);
                }
                Decision::Defer => {
                    self.defer(topic, ready.key, ready.id.clone());
                    release.push(ready.id);
                }
                Decision::Fail(error) => {
                    // The topic has refused long enough: its messages fail
                    // with its reason, without a try of their own.
                    let failed = Outcome::Failed { error, tried: false };
                    produced += usize::from(self.give_up(ready, topic, now, failed));
                }
            }
        }
        if let Err(e) = self.store.release(release).await {
            tracing::warn!(error = %e, "returning claims failed");
        }
        self.send_dead_letters().await;
        produced
    }

    /// Records, before anything due after the horizon is produced, a
    /// horizon [`HORIZON_AHEAD`] past `due` (in the store, standalone; the
    /// log needs none). One commit per step, not per message.
    pub(super) async fn extend_horizon(&mut self, due: UnixMillis) {
        if due <= self.doubt.horizon {
            return;
        }
        let until = due.saturating_add(HORIZON_AHEAD);
        match self.recorder.extend_horizon(until).await {
            Ok(()) => self.doubt.horizon = until,
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

    /// Hands `ready` to the producer for `topic`: a dead letter if
    /// `letter` says so, else a delivery, which keeps the message for its
    /// dead-letter topic if it has one.
    pub(super) fn send(&mut self, ready: Ready, topic: Arc<str>, probe: bool, letter: Option<Dead>) {
        let keep = letter.is_none() && self.has_dead_letter_topic(&ready, &topic);
        let token = self.sent.next_token();
        let outgoing = Outgoing { id: &ready.id, due: ready.due, envelope: &ready.envelope };
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
            sent_at: tokio::time::Instant::now(),
            dead,
        });
        self.topics.states.entry(topic).or_default().in_flight += 1;
        if let Err(error) = queued {
            // Refused before it was queued: the same as a failed report.
            self.on_report(DeliveryReport { token, result: Err(error) });
        }
    }
}
