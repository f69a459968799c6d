//! The topics the dispatcher holds back: what becomes of a due message of
//! each, the entries put off while a topic is stalled or refused, the
//! probes that try a refused topic again, and what readers are told of it.

use std::{sync::Arc, time::Duration};

use super::{Dispatcher, Refusal, TopicState, config::DispatcherConfig, policy::Why, sent::InFlight};
use crate::{
    command::DispatchKey,
    command::Outcome,
    kafka::ProduceError,
    message::{MessageId, UnixMillis},
    policy::PolicyKey,
    store::HeldTopics,
};

/// Entries put off (for held topics) that are remembered one by one, at
/// most; past it the dispatcher rescans the due index from the lowest.
const DEFER_CAP: usize = 100_000;

/// What becomes of one due message.
pub(super) enum Decision {
    Produce {
        probe: bool,
    },
    Defer,
    Fail(String),
    /// A dispatch policy holds it back, in this lane.
    Hold(PolicyKey, Why),
}

impl Dispatcher {
    /// What to do with a due message of `topic`, now: a policy's pause or
    /// limit first (which its topic's state cannot make fail), then the
    /// topic's state; a message that goes takes its policies' tokens.
    pub(super) fn decide(
        &mut self,
        topic: &Arc<str>,
        id: &MessageId,
        key: DispatchKey,
        now: UnixMillis,
    ) -> Decision {
        if let Some((lane, why)) = self.policies.holds(id.tenant(), topic, key) {
            return Decision::Hold(lane, why);
        }
        let config = &self.config;
        let state = self.topics.states.entry(Arc::clone(topic)).or_default();
        if state.held(now) {
            return match &state.refusal {
                Some(r) if config.gives_up(r.since, r.tries, now) => {
                    Decision::Fail(refusal_reason(&r.error, r, now))
                }
                _ => Decision::Defer,
            };
        }
        let probe = state.refusal.as_mut().map(|r| r.probing = true).is_some();
        self.policies.take(id.tenant(), topic);
        Decision::Produce { probe }
    }

    /// Remembers a due entry of a held topic, to look at again when the
    /// topic is no longer held.
    pub(super) fn defer(&mut self, topic: Arc<str>, key: DispatchKey, id: MessageId) {
        if self.topics.deferred_total >= DEFER_CAP {
            self.scan.rescan(Some(key));
            return;
        }
        self.topics.deferred_total += 1;
        self.topics.states.entry(topic).or_default().deferred.push((key, id));
    }

    /// Hands the put-off entries of topics no longer held (or due for a
    /// probe, or failing) back for a look, and forgets idle topics.
    pub(super) fn release_unheld(&mut self, now: UnixMillis) {
        let mut released = 0;
        for state in self.topics.states.values_mut() {
            let giving_up =
                state.refusal.as_ref().is_some_and(|r| self.config.gives_up(r.since, r.tries, now));
            if !state.deferred.is_empty() && (!state.held(now) || giving_up) {
                released += state.deferred.len();
                self.scan.recheck.append(&mut state.deferred);
            }
        }
        self.topics.deferred_total -= released;
        // A refused topic that gave up and has nothing left waits for
        // nothing: a message that comes later gets a fresh try.
        for (topic, state) in &mut self.topics.states {
            let gave_up = state.refusal.as_ref().is_some_and(|r| self.config.gives_up(r.since, r.tries, now));
            if gave_up && state.deferred.is_empty() && state.in_flight == 0 {
                state.refusal = None;
                note_held(self.store.held(), topic, state, self.config.stall_after);
            }
        }
        self.topics.states.retain(|_, t| !t.is_idle());
    }

    /// Marks records Kafka has not answered for `stall_after` as stalled:
    /// their topics are held and their slots freed. (Answered records are
    /// dropped from the front of the send order as they are met, so it
    /// stays about as long as what is in flight.)
    pub(super) fn find_stalls(&mut self) {
        for sent in self.sent.find_stalls(self.config.stall_after) {
            let state = self.topics.states.entry(Arc::clone(&sent.topic)).or_default();
            state.stalled += 1;
            if state.stalled == 1 {
                note_held(self.store.held(), &sent.topic, state, self.config.stall_after);
                tracing::warn!(
                    topic = %sent.topic,
                    waited = ?self.config.stall_after,
                    "Kafka has not answered a produce to this topic; its messages wait, the others go on"
                );
            }
        }
        let metrics = self.store.metrics();
        metrics.held_stalled.set(self.topics.states.values().filter(|t| t.stalled > 0).count() as i64);
        metrics.held_refused.set(self.topics.states.values().filter(|t| t.refusal.is_some()).count() as i64);
    }
}

/// Records a refusal of `sent`'s topic in its `state`; returns the
/// message's outcome if the topic has refused long enough to give up, else
/// none (it waits with its topic).
pub(super) fn topic_refused(
    config: &DispatcherConfig,
    state: &mut TopicState,
    sent: &InFlight,
    error: ProduceError,
    now: UnixMillis,
) -> Option<Outcome> {
    let refusal = state.refusal.get_or_insert_with(|| {
        tracing::warn!(topic = %sent.topic, error = %error.reason, "the broker refuses this topic; holding its messages");
        Refusal { since: now, tries: 0, error: String::new(), probe_at: now, probing: false }
    });
    // Many records may be refused at once; one try counts per probe.
    if sent.probe || refusal.tries == 0 {
        refusal.tries = refusal.tries.saturating_add(1);
        refusal.probe_at = now.saturating_add(config.backoff(refusal.tries.saturating_sub(1)));
        refusal.probing = false;
    }
    refusal.error = error.reason;
    config
        .gives_up(refusal.since, refusal.tries, now)
        .then(|| Outcome::Failed { error: refusal_reason(&refusal.error, refusal, now), tried: true })
}

/// Tells the store why `topic`'s messages wait, as `state` has it now (a
/// refusal, else a stall), or that they do not: what `Get`, `List` and
/// `Stats` show on its pending messages.
pub(super) fn note_held(held: &HeldTopics, topic: &Arc<str>, state: &TopicState, stall_after: Duration) {
    match (&state.refusal, state.stalled) {
        (Some(r), _) => held.hold(
            topic,
            format!(
                "waiting: the broker refuses topic {topic:?} (since {}, {} tries; it is tried again with \
                 backoff, and its messages fail once it has refused for --fail-after and \
                 --max-delivery-attempts tries): {}",
                r.since.to_rfc3339(),
                r.tries,
                r.error
            ),
        ),
        (None, 0) => held.release(topic),
        (None, _) => held.hold(
            topic,
            format!(
                "waiting: Kafka has not answered a produce to topic {topic:?} for {}",
                crate::message::duration_text(stall_after)
            ),
        ),
    }
}

/// Why the messages of a refused topic failed.
fn refusal_reason(error: &str, refusal: &Refusal, now: UnixMillis) -> String {
    format!(
        "{error} (the topic refused every try for {}, {} tries)",
        humantime::format_duration(now.since(refusal.since)),
        refusal.tries
    )
}
