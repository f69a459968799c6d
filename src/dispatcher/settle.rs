//! What became of each produce: the delivery reports read, the outcomes
//! gathered and handed to the recorder in dispatch order, with a floor,
//! and readers told where live entries start.

use std::sync::Arc;

use super::{
    Dispatcher, GATHER, HOLD_FOR, PUBLISH_EVERY, Stamp,
    sent::{Dead, InFlight},
    topics::{note_held, topic_refused},
};
use crate::{
    command::{DispatchKey, Handed, Outcome, Settle},
    kafka::{DeliveryReport, Fault},
    message::UnixMillis,
    metrics,
};

impl Dispatcher {
    /// Tells readers of the due index where live entries start; at most
    /// every [`PUBLISH_EVERY`], as it looks at everything in flight.
    pub(super) fn publish(&mut self) {
        if self.settling.published.elapsed() < PUBLISH_EVERY {
            return;
        }
        self.settling.published = tokio::time::Instant::now();
        let lowest = self.settling.settles.iter().map(|s| s.key).fold(self.lowest_held().0, DispatchKey::min);
        self.store.wake().set_low_water(lowest);
        if let Some(held) = self.policies.held_back() {
            self.store.held().set_held_back(held);
        }
    }

    /// The lowest due entry that may be pending: one not yet handed to the
    /// store settled, one put off or to look at again, or where the scan
    /// goes on. (Outcomes gathered in `settling` are not counted.) And the
    /// lowest that may be produced without telling the store first: the
    /// same but for what paused topics hold.
    fn lowest_held(&self) -> (DispatchKey, DispatchKey) {
        let producible = self
            .sent
            .unsettled_keys()
            .chain(self.scan.recheck.iter().map(|(k, _)| *k))
            .chain(self.scan.unreadable.iter().map(|(k, _)| *k))
            .chain(self.topics.states.values().flat_map(|t| t.deferred.iter().map(|(k, _)| *k)))
            .chain(self.scan.rescan_from)
            .chain(self.policies.lowest_producible())
            .chain(self.ahead.ready.iter().map(|r| r.key))
            .chain(self.settling.letters.iter().map(|l| l.key()))
            .chain(self.doubt.floor_held())
            .fold(self.scan.from, DispatchKey::min);
        (self.policies.lowest().map_or(producible, |lane| lane.min(producible)), producible)
    }

    /// Hands the gathered outcomes to the store as one commit: first-try
    /// deliveries once everything sent before them is answered (all of
    /// them when `all`, or when they have waited long or are many).
    pub(super) async fn flush_settles(&mut self, all: bool) {
        let in_order = self.sent.flush(all, GATHER, HOLD_FOR, self.config.max_in_flight);
        let mut settles = std::mem::take(&mut self.settling.settles);
        settles.extend(in_order);
        // Once these are recorded, nothing below the floor is pending. It
        // needs only be fresh enough for a restart to start near the end,
        // and finding it looks at everything held: at most every
        // PUBLISH_EVERY.
        let floor = (all || self.settling.floor_sent.elapsed() >= PUBLISH_EVERY).then(|| {
            self.settling.floor_sent = tokio::time::Instant::now();
            let (held, producible) = self.lowest_held();
            // What paused lanes hold is left out of `producible`: before
            // one of them is walked, the store records it may be produced.
            self.policies.left_out_paused();
            self.store.wake().floor(held, producible)
        });
        self.recorder.record(settles, floor).await;
        if let Err(e) = self.store.release(std::mem::take(&mut self.settling.releasing)).await {
            tracing::warn!(error = %e, "returning claims failed");
        }
    }

    /// What became of a produce, as the broker's answer says; `stamp` is
    /// the time it is taken in.
    pub(super) fn on_report(&mut self, report: DeliveryReport, stamp: Stamp) {
        let Some((mut sent, stalled)) = self.sent.take(report.token) else {
            return;
        };
        if !stalled {
            self.sent.answered_in(report.known.saturating_duration_since(sent.sent_at.into_std()));
        }
        let dead = sent.dead.take().map(|dead| *dead);
        self.store.metrics().in_flight.set(self.sent.len() as i64);
        // When the broker answered, on the dispatcher's clock: the report
        // may have waited while the dispatcher read or produced; no
        // earlier than the produce it answers.
        let taken_in = stamp.at.into_std();
        let waited = taken_in.saturating_duration_since(report.known);
        let now = stamp.wall;
        // A report answered after the stamp was read (later in its batch)
        // is that much after it.
        let answered = now
            .saturating_sub(waited)
            .saturating_add(report.known.saturating_duration_since(taken_in))
            .max(sent.sent_wall);
        let state = self.topics.states.entry(Arc::clone(&sent.topic)).or_default();
        state.in_flight -= 1;
        if stalled {
            state.stalled -= 1;
            if state.stalled == 0 {
                note_held(self.store.held(), &sent.topic, state, self.config.stall_after);
                tracing::info!(topic = %sent.topic, "Kafka answers produces to this topic again");
            }
        }
        if let Err(error) = &report.result
            && error.fault == Fault::Fenced
        {
            // Another producer took the shard's transactional id: the
            // record was not delivered (its transaction is aborted), and
            // the message is not this dispatcher's to settle. It goes back
            // to the store untouched; see `take_back`.
            tracing::debug!(id = %sent.id.qualified(), error = %error.reason, "produce fenced");
            self.fenced = true;
            self.scan.rescan(Some(sent.key));
            self.settling.releasing.push(sent.id);
            return;
        }
        if let Some(Dead::Letter { topic, reason, tried }) = dead {
            let outcome = self.dead_letter_outcome(&sent, (&topic, reason, tried), report.result, now);
            // Counted with the message's own topic.
            self.settling.settles.push(Settle { topic, ..settled(sent, outcome, now) });
            return;
        }
        let outcome = match report.result {
            Ok((partition, offset)) => {
                crate::failpoint::hit("dispatch-before-settle");
                let broker = report.known.saturating_duration_since(sent.sent_at.into_std());
                let stages = &self.reports.stages;
                stages.wait.observe(sent.sent_wall.since(sent.key.at).as_secs_f64());
                stages.broker.observe(broker.as_secs_f64());
                stages.report.observe(waited.as_secs_f64());
                if let Some(refusal) = state.refusal.take() {
                    note_held(self.store.held(), &sent.topic, state, self.config.stall_after);
                    tracing::info!(
                        topic = %sent.topic,
                        refused_for = ?now.since(refusal.since),
                        "the topic takes records again"
                    );
                }
                Outcome::Delivered { partition, offset }
            }
            Err(error) => {
                let kind = match error.fault {
                    Fault::Outage => "outage",
                    Fault::TopicRefused | Fault::MessageRefused | Fault::Fenced => "rejected",
                };
                metrics::PRODUCE_ERRORS.with_label_values(&[kind]).inc();
                tracing::warn!(
                    id = %sent.id.qualified(),
                    topic = %sent.topic,
                    kind,
                    error = %error.reason,
                    "produce failed"
                );
                if error.fault != Fault::TopicRefused {
                    self.config.outcome_of_error(error, &sent.tries, now)
                } else if let Some(outcome) = {
                    let outcome = topic_refused(&self.config, state, &sent, error, now);
                    note_held(self.store.held(), &sent.topic, state, self.config.stall_after);
                    outcome
                } {
                    outcome
                } else {
                    // Not produced: it waits with its topic.
                    self.defer(Arc::clone(&sent.topic), sent.key, sent.id.clone());
                    self.settling.releasing.push(sent.id);
                    return;
                }
            }
        };
        let Some(outcome) = self.after_produce(&sent, dead, outcome) else { return };
        let at = if matches!(outcome, Outcome::Delivered { .. }) { answered } else { now };
        let settle = settled(sent, outcome, at);
        if matches!(settle.outcome, Outcome::Delivered { .. }) && !settle.tries.recorded {
            if let Some(settle) = self.sent.answer(report.token, settle) {
                self.settling.settles.push(settle);
            }
        } else {
            self.settling.settles.push(settle);
        }
    }
}

/// What became of the produce `sent`, known `at`.
fn settled(sent: InFlight, outcome: Outcome, at: UnixMillis) -> Settle {
    Settle {
        id: sent.id,
        key: sent.key,
        due: sent.due,
        topic: sent.topic,
        tries: sent.tries,
        at,
        outcome,
        handed: Handed::Alone,
    }
}
