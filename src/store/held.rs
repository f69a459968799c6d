//! Topics whose messages wait, and why: the dispatcher says so here when
//! the broker refuses a topic or stops answering for it, and the reads
//! (`Get`, `List`, `Stats`) show the reason on each of the topic's pending
//! messages that has no error of its own. In memory only: it says what
//! happens now, and a restart finds out again.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use crate::message::{PendingMessage, ScheduledMessage, State};

#[derive(Default)]
pub struct HeldTopics {
    why: Mutex<HashMap<Arc<str>, String>>,
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
    }

    pub fn why(&self, topic: &str) -> Option<String> {
        self.lock().get(topic).cloned()
    }

    /// A pending message without an error of its own shows why its topic
    /// waits.
    pub(super) fn explain_listed(&self, message: &mut PendingMessage) {
        if message.last_error.is_none() {
            message.last_error = self.why(&message.topic);
        }
    }

    pub(super) fn explain(&self, message: &mut ScheduledMessage) {
        if let State::Pending { last_error: last_error @ None, .. } = &mut message.state {
            *last_error = self.why(&message.envelope.topic);
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
