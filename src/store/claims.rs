//! Who may change a message right now: the dispatcher (producing it) or the
//! writer (cancelling or rescheduling it). Never both.
//!
//! This is what makes cancel race-free with delivery. The dispatcher claims a
//! message before it reads and produces it; the writer reserves one before it
//! cancels or moves it. Whoever comes second backs off: the dispatcher skips
//! the message (the writer's commit decides its fate), the writer parks the
//! request until the dispatcher's outcome is committed and then answers it
//! from that outcome. The dispatcher acquires claims; only the writer
//! releases them, so a parked request is always re-run.
//!
//! The table also carries the wake-up from the writer to the dispatcher: the
//! lowest due key a commit added, so a message due earlier than the
//! dispatcher's next wake-up interrupts its sleep.

use std::{
    collections::{HashMap, hash_map::Entry},
    sync::Mutex,
};

use tokio::sync::Notify;

use super::schema::DueKey;
use crate::message::MessageId;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Holder {
    Dispatcher,
    Writer,
}

#[derive(Default)]
pub(crate) struct Claims {
    held: Mutex<HashMap<MessageId, Holder>>,
}

impl Claims {
    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<MessageId, Holder>> {
        // A panic elsewhere while holding this lock leaves the map consistent
        // (every operation is a single insert or remove), so keep going.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The dispatcher takes each of `ids` for producing, under one lock;
    /// false for those the writer has.
    pub fn claim_for_dispatch_all<'a>(&self, ids: impl Iterator<Item = &'a MessageId>) -> Vec<bool> {
        let mut held = self.held();
        ids.map(|id| match held.entry(id.clone()) {
            Entry::Occupied(_) => false,
            Entry::Vacant(v) => {
                v.insert(Holder::Dispatcher);
                true
            }
        })
        .collect()
    }

    /// The writer takes `id` for a change; false if the dispatcher has it.
    pub fn reserve_for_writer(&self, id: &MessageId) -> bool {
        match self.held().entry(id.clone()) {
            Entry::Occupied(o) => *o.get() == Holder::Writer,
            Entry::Vacant(v) => {
                v.insert(Holder::Writer);
                true
            }
        }
    }

    pub fn release(&self, id: &MessageId) {
        self.held().remove(id);
    }

    /// Releases many under one lock.
    pub fn release_all(&self, ids: &[MessageId]) {
        let mut held = self.held();
        for id in ids {
            held.remove(id);
        }
    }

    pub fn dispatching(&self) -> usize {
        self.held().values().filter(|h| **h == Holder::Dispatcher).count()
    }
}

/// Wakes the dispatcher when a commit adds a due key below where it looks.
#[derive(Default)]
pub(crate) struct Wake {
    lowest: Mutex<Option<DueKey>>,
    notify: Notify,
}

impl Wake {
    /// Called after a commit that added `key` (or after a failed commit that
    /// left `key` in place).
    pub fn lower(&self, key: DueKey) {
        let mut lowest = self.lowest.lock().unwrap_or_else(|e| e.into_inner());
        *lowest = Some(lowest.map_or(key, |l| l.min(key)));
        drop(lowest);
        self.notify.notify_one();
    }

    /// The lowest key added since the last call.
    pub fn take(&self) -> Option<DueKey> {
        self.lowest.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    pub async fn notified(&self) {
        self.notify.notified().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::UnixMillis;

    fn id(s: &str) -> MessageId {
        MessageId::parse(s).unwrap()
    }

    #[test]
    fn dispatcher_and_writer_exclude_each_other() {
        let c = Claims::default();
        assert_eq!(c.claim_for_dispatch_all([id("a"), id("b")].iter()), [true, true]);
        assert!(!c.reserve_for_writer(&id("a")), "writer must wait for the produce");
        assert_eq!(c.dispatching(), 2);
        c.release_all(&[id("a"), id("b")]);
        assert!(c.reserve_for_writer(&id("a")));
        assert!(c.reserve_for_writer(&id("a")), "the writer may reserve twice in one round");
        assert_eq!(
            c.claim_for_dispatch_all([id("a"), id("b")].iter()),
            [false, true],
            "dispatcher skips what the writer is changing"
        );
        c.release(&id("a"));
        assert_eq!(c.claim_for_dispatch_all([id("a")].iter()), [true]);
        assert_eq!(c.dispatching(), 2);
    }

    #[test]
    fn wake_keeps_the_lowest_key() {
        let w = Wake::default();
        assert_eq!(w.take(), None);
        let k = |d| DueKey { due: UnixMillis(d), seq: 0 };
        w.lower(k(5));
        w.lower(k(3));
        w.lower(k(9));
        assert_eq!(w.take(), Some(k(3)));
        assert_eq!(w.take(), None);
    }
}
