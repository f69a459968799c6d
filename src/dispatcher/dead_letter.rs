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
    Dispatcher,
    sent::{Dead, InFlight},
};
use crate::{
    kafka::{Fault, ProduceError},
    message::{DeadReason, UnixMillis},
    store::{DeadLettered, Outcome, Ready},
};

/// A message on its way to its dead-letter topic `to`.
pub(super) struct Letter {
    ready: Ready,
    topic: Arc<str>,
    to: Arc<str>,
    reason: DeadReason,
    /// It failed on a produce of its own.
    tried: bool,
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
        )
    }

    /// Settles `ready` as `outcome` (failed or expired), or hands it to its
    /// dead-letter topic if it has one.
    pub(super) fn give_up(&mut self, ready: Ready, topic: Arc<str>, now: UnixMillis, outcome: Outcome) {
        let (reason, tried) = match &outcome {
            Outcome::Expired { deadline } => (DeadReason::Expired { deadline: *deadline }, false),
            Outcome::Failed { error, tried } => (DeadReason::Failed { error: error.clone() }, *tried),
            _ => return self.settle_untried(ready, topic, now, outcome),
        };
        match self.dead_letter_topic(&ready, &topic) {
            Some(to) => self.letters.push(Letter { ready, topic, to, reason, tried }),
            None => self.settle_untried(ready, topic, now, outcome),
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
            (Outcome::Failed { error, tried }, Some(Dead::Fallback { to, envelope })) => {
                let ready =
                    Ready { id: sent.id.clone(), key: sent.key, due: sent.due, envelope, tries: sent.tries };
                let reason = DeadReason::Failed { error };
                self.letters.push(Letter { ready, topic: Arc::clone(&sent.topic), to, reason, tried });
                None
            }
            (outcome, _) => Some(outcome),
        }
    }

    /// Produces the letters waiting, each topic marked first (see
    /// [`Dispatcher::mark`]). Not while the gate is shut: they keep their
    /// claims and wait.
    pub(super) async fn send_dead_letters(&mut self) {
        if self.letters.is_empty() || !self.gate.open() {
            return;
        }
        let unmarked: Vec<Arc<str>> = self
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
        self.doubt.pulse.beat(self.clock.now());
        for Letter { ready, topic, to, reason, tried } in std::mem::take(&mut self.letters) {
            tracing::debug!(id = %ready.id.qualified(), %topic, dead_letter_topic = %to, reason = reason.name(), "to the dead-letter topic");
            let attempts = ready.tries.attempts.saturating_add(u32::from(tried));
            let envelope = ready.envelope.dead_letter(&to, &reason, attempts);
            let ready = Ready { envelope, ..ready };
            self.send(ready, to, false, Some(Box::new(Dead::Letter { topic, reason, tried })));
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
            Err(error) if error.fault == Fault::Outage => {
                let error = ProduceError {
                    reason: format!("its dead-letter topic {}: {}", sent.topic, error.reason),
                    ..error
                };
                self.config.outcome_of_error(error, &sent.tries, now)
            }
            Err(error) => {
                let why = match reason {
                    DeadReason::Expired { deadline } => format!("it expired at {}", deadline.to_rfc3339()),
                    DeadReason::Failed { error } => format!("{topic}: {error}"),
                };
                Outcome::Failed {
                    error: format!(
                        "its dead-letter topic {} refused it ({}); before that, {why}",
                        sent.topic, error.reason
                    ),
                    tried,
                }
            }
        }
    }

    /// At shutdown: the letters not sent go back to the store as they
    /// are, to be given up on again after the restart.
    pub(super) fn return_letters(&mut self) {
        let ids = std::mem::take(&mut self.letters).into_iter().map(|l| l.ready.id);
        self.settling.releasing.extend(ids);
    }
}

/// A message's dead-letter topic: its own, else its policy's, else the
/// server's; none if that is its own topic.
pub(super) fn route(
    own: Option<&str>,
    policy: Option<&str>,
    server: Option<&Arc<str>>,
    topic: &str,
) -> Option<Arc<str>> {
    let to = match (own.or(policy), server) {
        (Some(to), _) => Arc::from(to),
        (None, Some(server)) => Arc::clone(server),
        (None, None) => return None,
    };
    (*to != *topic).then_some(to)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_messages_own_dead_letter_topic_wins_then_its_policys_then_the_servers() {
        let server: Arc<str> = "all.dead".into();
        assert_eq!(route(Some("own"), Some("policy"), Some(&server), "t").as_deref(), Some("own"));
        assert_eq!(route(None, Some("policy"), Some(&server), "t").as_deref(), Some("policy"));
        assert_eq!(route(None, None, Some(&server), "t").as_deref(), Some("all.dead"));
        assert_eq!(route(None, None, None, "t"), None);
        assert_eq!(route(None, None, Some(&server), "all.dead"), None, "never its own topic");
    }
}
