//! Producing: a message handed to the producer (with whether it keeps its
//! record for a dead-letter topic), and the topic's mark recorded before
//! its first produce, so that an unclean stop leaves little in doubt (see
//! [`doubt`](super::doubt)).

use std::{sync::Arc, time::Duration};

use super::{
    Dispatcher, Stamp,
    sent::{Dead, InFlight},
};
use crate::{
    command::Ready,
    kafka::DeliveryReport,
    message::{Outgoing, UnixMillis},
};

/// How long before a message is due its topic may be marked.
const MARK_AHEAD: Duration = Duration::from_secs(2);

impl Dispatcher {
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

    /// Before sleeping until `due`: marks the topic of the message due
    /// then, if it is due within [`MARK_AHEAD`] and its topic has no mark
    /// yet, so that its first produce does not wait for the broker's
    /// answer (a few round trips, more on a broker slow to find a
    /// partition's end). Not sooner: a mark is where a search after an
    /// unclean stop starts, and what others write to the topic between
    /// the mark and the first produce is read back by it.
    pub(super) async fn mark_ahead(&mut self, due: UnixMillis) {
        if due > self.clock.now().saturating_add(MARK_AHEAD) {
            return;
        }
        if let Some(topic) = self.ahead.next_topic.take()
            && !self.doubt.marked.contains(&*topic)
        {
            self.mark(topic.into()).await;
        }
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
    pub(super) fn send(
        &mut self,
        ready: Ready,
        topic: Arc<str>,
        probe: bool,
        letter: Option<Dead>,
        stamp: Stamp,
    ) {
        let keep = letter.is_none() && self.has_dead_letter_topic(&ready, &topic);
        let token = self.sent.next_token();
        let Stamp { at: sent_at, wall: sent_wall } = stamp;
        let outgoing = Outgoing { id: &ready.id, due: ready.due, envelope: &ready.envelope };
        self.doubt.horizon.produced(ready.key);
        let queued = self.producer.send(outgoing, token, &self.reports.tx);
        let dead = match letter {
            None if keep => Some(Box::new(Dead::Fallback { envelope: ready.envelope })),
            letter => letter.map(Box::new),
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
            self.on_report(DeliveryReport::now(token, Err(error)), stamp);
        }
    }
}
