//! Topics whose messages wait, and why: the dispatcher says so here when
//! the broker refuses a topic or stops answering for it, or a dispatch
//! policy holds it back, and the reads (`Get`, `List`, `Stats`) show the
//! reason on each of the topic's pending messages that has no error of its
//! own; `Stats` lists what policies hold back. In memory only: it says
//! what happens now, and a restart finds out again.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use crate::message::{HeldBack, MessageId, PendingMessage, ScheduledMessage, State};

#[derive(Default)]
pub struct HeldTopics {
    why: Mutex<HashMap<Arc<str>, String>>,
    /// What dispatch policies hold back.
    lanes: Mutex<Vec<HeldBack>>,
}

impl HeldTopics {
    /// `topic`'s messages wait, for `why`.
    pub fn hold(&self, topic: &Arc<str>, why: String) {
        self.lock().insert(Arc::clone(topic), why);
    }

    /// `topic`'s messages go again.
    pub fn release(&self, topic: &str) {
        self.lock().remove(topic);
    }

    /// Every topic goes again (the dispatcher stopped).
    pub fn clear(&self) {
        self.lock().clear();
        self.set_held_back(Vec::new());
    }

    /// What dispatch policies hold back now, as the dispatcher says.
    pub fn set_held_back(&self, held: Vec<HeldBack>) {
        *self.lanes.lock().unwrap_or_else(|e| e.into_inner()) = held;
    }

    pub fn held_back(&self) -> Vec<HeldBack> {
        self.lanes.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn why(&self, topic: &str) -> Option<String> {
        self.lock().get(topic).cloned()
    }

    /// Why a message of `id` to `topic` waits: its topic's state, or a
    /// policy that holds its lane back.
    fn why_of(&self, id: &MessageId, topic: &str) -> Option<String> {
        self.why(topic).or_else(|| {
            let lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
            let held = lanes.iter().find(|h| {
                h.topic == topic && h.tenant.as_ref().is_none_or(|t| id.tenant() == Some(t.as_str()))
            })?;
            let whose =
                held.tenant.as_ref().map_or(String::new(), |t| format!(" for tenant {:?}", t.as_str()));
            Some(if held.paused {
                format!("waiting: topic {topic:?} is paused{whose} (see `hourglass topic get`)")
            } else {
                format!(
                    "waiting: topic {topic:?} is at its rate limit{whose}; its messages go out in due order \
                     (see `hourglass topic get`)"
                )
            })
        })
    }

    /// A pending message without an error of its own shows why its topic
    /// waits.
    pub(super) fn explain_listed(&self, message: &mut PendingMessage) {
        if message.last_error.is_none() {
            message.last_error = self.why_of(&message.id, &message.topic);
        }
    }

    pub(super) fn explain(&self, message: &mut ScheduledMessage) {
        if let State::Pending { last_error: last_error @ None, .. } = &mut message.state {
            *last_error = self.why_of(&message.id, &message.envelope.topic);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, String>> {
        self.why.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::UnixMillis;

    fn listed(topic: &str, last_error: Option<&str>) -> PendingMessage {
        PendingMessage {
            id: crate::message::MessageId::parse("a").unwrap(),
            topic: topic.into(),
            key: None,
            partition: None,
            value_bytes: 1,
            due: UnixMillis(1),
            dispatch_at: UnixMillis(1),
            scheduled_at: UnixMillis(0),
            attempts: 0,
            last_error: last_error.map(str::to_owned),
            labels: Default::default(),
            deadline: None,
            dead_letter_topic: None,
        }
    }

    #[test]
    fn a_held_topic_explains_its_messages_until_released() {
        let held = HeldTopics::default();
        held.hold(&Arc::from("nope"), "the broker refuses the topic".into());
        let mut waiting = listed("nope", None);
        held.explain_listed(&mut waiting);
        assert_eq!(waiting.last_error.as_deref(), Some("the broker refuses the topic"));
        let mut own = listed("nope", Some("too large"));
        held.explain_listed(&mut own);
        assert_eq!(own.last_error.as_deref(), Some("too large"), "a message's own error stays");
        let mut other = listed("orders", None);
        held.explain_listed(&mut other);
        assert_eq!(other.last_error, None);
        held.release("nope");
        let mut again = listed("nope", None);
        held.explain_listed(&mut again);
        assert_eq!(again.last_error, None);
    }
}
