//! Dead letters: a message that fails or expires goes to its dead-letter
//! topic instead of staying FAILED or EXPIRED, when it has one (its own,
//! its topic's policy's, or the server's `--dead-letter-topic`).
//!
//! A dead letter is a produce like a delivery, under the same guarantees:
//! the record keeps the message's key, value and headers, with
//! `hourglass-id` and `hourglass-due-ms` as every delivery has and headers
//! that say why; the dead-letter topic is marked before its first
//! produce; and its report settles the message DEAD_LETTERED with the
//! partition and offset it landed at. After an unclean stop the search for
//! what went out unrecorded reads the dead-letter topics too (see
//! [`reconcile`](super::reconcile)): a message in doubt may be on either.
//!
//! What gives up on a message (its deadline, a refusal of its own or of
//! its topic) hands it here while the dispatcher still holds its claim;
//! the letters go out from the dispatcher's loop, after their topics are
//! marked.

use std::sync::Arc;

use super::{
    Dispatcher, Stamp,
    sent::{Dead, InFlight},
};
use crate::{
    command::DispatchKey,
    command::{DeadLettered, Outcome, Ready},
    kafka::{Fault, ProduceError},
    message::{DeadReason, ReservedTopics, UnixMillis},
};

/// A message on its way to its dead-letter topic `to`. It holds the floor
/// (see [`Dispatcher::lowest_held`]) until it is settled or given back.
pub(super) struct Letter {
    ready: Ready,
    topic: Arc<str>,
    to: Arc<str>,
    reason: DeadReason,
    /// It failed on a produce of its own.
    tried: bool,
}

impl Letter {
    pub(super) fn key(&self) -> DispatchKey {
        self.ready.key
    }
}

impl Dispatcher {
    /// Where a message of `topic` goes if it fails or expires: its own
    /// choice, else its tenant's or its topic's policy's, else the
    /// server's; never its own topic.
    pub(super) fn dead_letter_topic(&self, ready: &Ready, topic: &Arc<str>) -> Option<Arc<str>> {
        route(
            ready.envelope.dead_letter_topic.as_deref(),
            self.policies.dead_letter_topic(ready.id.tenant(), topic),
            self.config.dead_letter_topic.as_ref(),
            topic,
            &self.config.reserved,
        )
    }

    /// Settles `ready` as `outcome` (failed or expired), or hands it to its
    /// dead-letter topic if it has one: true then (it is to be produced).
    pub(super) fn give_up(
        &mut self,
        ready: Ready,
        topic: Arc<str>,
        now: UnixMillis,
        outcome: Outcome,
    ) -> bool {
        let (reason, tried) = match &outcome {
            Outcome::Expired { deadline } => (DeadReason::Expired { deadline: *deadline }, false),
            Outcome::Failed { error, tried } => (DeadReason::Failed { error: error.clone() }, *tried),
            _ => {
                self.settling.untried(ready, topic, now, outcome);
                return false;
            }
        };
        match self.dead_letter_topic(&ready, &topic) {
            Some(to) => {
                self.settling.letters.push(Letter { ready, topic, to, reason, tried });
                true
            }
            None => {
                self.settling.untried(ready, topic, now, outcome);
                false
            }
        }
    }

    /// A produce of `sent` to its own topic that ended in `outcome`: the
    /// outcome to settle, or none if it failed and goes to the dead-letter
    /// topic it kept (`dead`).
    pub(super) fn after_produce(
        &mut self,
        sent: &InFlight,
        dead: Option<Dead>,
        outcome: Outcome,
    ) -> Option<Outcome> {
        match (outcome, dead) {
            (Outcome::Failed { error, tried }, Some(Dead::Fallback { envelope })) => {
                let ready =
                    Ready { id: sent.id.clone(), key: sent.key, due: sent.due, envelope, tries: sent.tries };
                let Some(to) = self.dead_letter_topic(&ready, &sent.topic) else {
                    // Its policy's, removed meanwhile.
                    return Some(Outcome::Failed { error, tried });
                };
                let reason = DeadReason::Failed { error };
                self.settling.letters.push(Letter {
                    ready,
                    topic: Arc::clone(&sent.topic),
                    to,
                    reason,
                    tried,
                });
                None
            }
            (outcome, _) => Some(outcome),
        }
    }

    /// Produces the letters waiting, each topic marked first (see
    /// [`Dispatcher::mark`]). While the store cannot record what is
    /// produced they wait. Those whose dead-letter topic is held (a
    /// produce to it unanswered) are put off with it. While the gate is
    /// shut (cluster mode: another node may own the shard) they go back to
    /// the store, to be looked at again once it opens.
    pub(super) async fn send_dead_letters(&mut self) {
        if self.settling.letters.is_empty() {
            return;
        }
        if !self.gate.open() {
            return self.return_letters();
        }
        if self.store.writes_failing() {
            return;
        }
        let unmarked: Vec<Arc<str>> = self
            .settling
            .letters
            .iter()
            .filter(|l| !self.doubt.marked.contains(&l.to))
            .map(|l| Arc::clone(&l.to))
            .collect();
        for to in unmarked {
            if !self.doubt.marked.contains(&to) {
                self.mark(to).await;
            }
        }
        let now = self.clock.now();
        self.doubt.pulse.beat(now);
        let (held, going): (Vec<Letter>, Vec<Letter>) = std::mem::take(&mut self.settling.letters)
            .into_iter()
            .partition(|l| self.topics.states.get(&l.to).is_some_and(|t| t.held(now)));
        // Put off with their dead-letter topic, as a held topic's messages
        // are: given back, and looked at again once it is not held.
        let mut put_off = Vec::with_capacity(held.len());
        for letter in held {
            self.defer(Arc::clone(&letter.to), letter.key(), letter.ready.id.clone());
            put_off.push(letter.ready.id);
        }
        if !put_off.is_empty()
            && let Err(e) = self.store.release(put_off).await
        {
            tracing::warn!(error = %e, "returning claims failed");
        }
        for Letter { ready, topic, to, reason, tried } in going {
            tracing::debug!(id = %ready.id.qualified(), %topic, dead_letter_topic = %to, reason = reason.name(), "to the dead-letter topic");
            let attempts = ready.tries.attempts.saturating_add(u32::from(tried));
            let envelope = ready.envelope.dead_letter(&to, &reason, attempts);
            let ready = Ready { envelope, ..ready };
            let stamp = Stamp::now(&*self.clock);
            self.send(ready, to, false, Some(Dead::Letter { topic, reason, tried }), stamp);
        }
    }

    /// What became of a dead letter to `sent.topic`, a message of `topic`:
    /// dead-lettered where it landed; tried again later after an outage;
    /// failed for good if the dead-letter topic refuses it.
    pub(super) fn dead_letter_outcome(
        &self,
        sent: &InFlight,
        (topic, reason, tried): (&Arc<str>, DeadReason, bool),
        result: Result<(i32, i64), ProduceError>,
        now: UnixMillis,
    ) -> Outcome {
        match result {
            Ok((partition, offset)) => Outcome::DeadLettered(Box::new(DeadLettered {
                topic: Arc::clone(&sent.topic),
                partition,
                offset,
                reason,
                tried,
            })),
            // Tried again later, as a delivery would be: a refusal of the
            // dead-letter topic (or of the record by it) counts toward
            // giving up, after --max-delivery-attempts and --fail-after,
            // with both errors; an outage does not.
            Err(error) => {
                let why = match reason {
                    DeadReason::Expired { deadline } => format!("it expired at {}", deadline.to_rfc3339()),
                    DeadReason::Failed { error } => format!("{topic}: {error}"),
                };
                let fault = if error.fault == Fault::Outage { Fault::Outage } else { Fault::MessageRefused };
                let reason = format!(
                    "its dead-letter topic {} did not take it ({}); before that, {why}",
                    sent.topic, error.reason
                );
                self.config.outcome_of_error(ProduceError { fault, reason }, &sent.tries, now)
            }
        }
    }

    /// The letters not sent go back to the store as they are (at
    /// shutdown, when fenced, while the gate is shut), to be looked at
    /// again: from the lowest of them on.
    pub(super) fn return_letters(&mut self) {
        let letters = std::mem::take(&mut self.settling.letters);
        self.scan.rescan(letters.iter().map(Letter::key).min());
        self.settling.releasing.extend(letters.into_iter().map(|l| l.ready.id));
    }
}

/// A message's dead-letter topic: its own, else its policy's, else the
/// server's; none if that is its own topic or one hourglass keeps for
/// itself (a message or policy from before those were refused).
pub(super) fn route(
    own: Option<&str>,
    policy: Option<&str>,
    server: Option<&Arc<str>>,
    topic: &str,
    reserved: &ReservedTopics,
) -> Option<Arc<str>> {
    let to = match (own.or(policy), server) {
        (Some(to), _) => Arc::from(to),
        (None, Some(server)) => Arc::clone(server),
        (None, None) => return None,
    };
    (*to != *topic && !reserved.contains(&to)).then_some(to)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_messages_own_dead_letter_topic_wins_then_its_policys_then_the_servers() {
        let server: Arc<str> = "all.dead".into();
        let none = ReservedTopics::default();
        let route = |own, policy, server, topic| route(own, policy, server, topic, &none);
        assert_eq!(route(Some("own"), Some("policy"), Some(&server), "t").as_deref(), Some("own"));
        assert_eq!(route(None, Some("policy"), Some(&server), "t").as_deref(), Some("policy"));
        assert_eq!(route(None, None, Some(&server), "t").as_deref(), Some("all.dead"));
        assert_eq!(route(None, None, None, "t"), None);
        assert_eq!(route(None, None, Some(&server), "all.dead"), None, "never its own topic");
    }

    #[test]
    fn a_topic_hourglass_keeps_for_itself_is_never_a_dead_letter_topic() {
        let log = ReservedTopics::new(["hourglass-log".to_owned(), "hourglass-log-owners".to_owned()]);
        let server: Arc<str> = "hourglass-log".into();
        assert_eq!(route(Some("hourglass-log-owners"), None, None, "t", &log), None);
        assert_eq!(route(None, Some("hourglass-log"), None, "t", &log), None);
        assert_eq!(route(None, None, Some(&server), "t", &log), None);
        assert_eq!(route(Some("t.dead"), None, None, "t", &log).as_deref(), Some("t.dead"));
    }
}
