//! What a look at the due index found: produced, put off with its topic
//! or a policy's lane, or settled without a produce (found on its topic
//! after an unclean stop, past its deadline, for a topic hourglass keeps,
//! or failed with its topic). Coordinates the files that do each.

use std::sync::Arc;

use super::{Dispatcher, Stamps, topics::Decision};
use crate::{
    command::{DueBatch, Outcome},
    message::UnixMillis,
};

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
        // The walk's reads record the horizon as they claim (see
        // `start_read`); anything else past it is recorded here.
        if let Some(last) = batch.ready.iter().map(|r| r.key).max() {
            self.doubt.horizon.before_producing(last).await;
        }
        if !batch.ready.is_empty() {
            // Written before anything is handed to the producer, so that
            // after a kill the time in it is at most the pulse's interval
            // older than every produce (none awaited between here and
            // them): what was due after it and its slack was not sent.
            self.doubt.pulse.beat(self.clock.now());
        }
        let mut stamps = Stamps::new(&*self.clock);
        for ready in batch.ready {
            // Counted per entry looked at, not per produce: a run of held
            // entries between two produces does not age the stamp.
            let stamp = stamps.next(&*self.clock);
            // One allocation per topic, not per message.
            let topic = match self.topics.states.get_key_value(ready.envelope.topic.as_str()) {
                Some((known, _)) => Arc::clone(known),
                None => ready.envelope.topic.as_str().into(),
            };
            if !self.doubt.landed.is_empty()
                && let Some((key, outcome)) = self.doubt.landed.remove(&ready.id)
                && key == ready.key
            {
                // It reached Kafka (its topic or its dead-letter topic)
                // before the unclean stop.
                self.settling.untried(ready, topic, now, outcome);
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
                    self.send(ready, topic, probe, None, stamp);
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
}
