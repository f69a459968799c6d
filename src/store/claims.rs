//! Who may change a message right now: the dispatcher (producing it) or the
//! writer (cancelling or rescheduling it). Never both.
//!
//! This is what makes cancel race-free with delivery. The dispatcher claims a
//! message before it reads and produces it; the writer reserves one before it
//! cancels or moves it. Whoever comes second backs off: the dispatcher skips
//! the message (the writer's commit decides its fate), the writer parks the
//! request until the dispatcher's outcome is committed and then answers it
//! from that outcome. The writer releases a claim once the produce's
//! outcome is committed; the dispatcher releases one it took and did not
//! produce, and tells the writer, so a parked request is always re-run.
//!
//! [`Wake`] carries what the writer tells the dispatcher: a commit added a
//! due entry (wake up, it may be due before your next look), and which added
//! entries lie below where the dispatcher already read, so that it reads
//! those few entries again instead of rescanning the due index over the
//! tombstones of everything settled since.

use std::{
    collections::{HashMap, hash_map::Entry},
    sync::Mutex,
};

use tokio::sync::Notify;

use super::schema::DispatchKey;
use crate::message::MessageId;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Holder {
    Dispatcher,
    Writer,
}

/// What a claim attempt by the dispatcher found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// Claimed now.
    Taken,
    /// The dispatcher already holds it: it is being produced.
    Ours,
    /// The writer is changing it; its commit decides what comes of it.
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

    /// The dispatcher takes each of `ids` for producing, under one lock.
    pub fn claim_for_dispatch_all<'a>(&self, ids: impl Iterator<Item = &'a MessageId>) -> Vec<Claim> {
        let mut held = self.held();
        ids.map(|id| match held.entry(id.clone()) {
            Entry::Occupied(o) if *o.get() == Holder::Dispatcher => Claim::Ours,
            Entry::Occupied(_) => Claim::Writer,
            Entry::Vacant(v) => {
                v.insert(Holder::Dispatcher);
                Claim::Taken
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

    /// Gives back the dispatcher's claims on `ids`, and only those: one the
    /// writer took meanwhile stays.
    pub fn release_dispatched(&self, ids: &[MessageId]) {
        let mut held = self.held();
        for id in ids {
            if held.get(id) == Some(&Holder::Dispatcher) {
                held.remove(id);
            }
        }
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

/// Most entries [`Wake`] keeps for the dispatcher to read again; past it,
/// it keeps only the lowest key and the dispatcher rescans from there.
const LATE_CAP: usize = 65_536;

/// What the writer tells the dispatcher, and what the dispatcher tells
/// readers of the due index.
#[derive(Default)]
pub(crate) struct Wake {
    state: Mutex<WakeState>,
    notify: Notify,
}

#[derive(Default)]
struct WakeState {
    /// The dispatcher has read (or is reading) everything below this.
    position: DispatchKey,
    /// Entries committed below `position` since the dispatcher last asked.
    late: Vec<(DispatchKey, MessageId)>,
    /// The lowest of those that did not fit in `late`.
    overflow: Option<DispatchKey>,
    /// Below this every due entry is settled: what reads of the due index
    /// start from, to stay clear of the tombstones of settled messages.
    low_water: DispatchKey,
}

/// What the writer handed over since the dispatcher last asked.
#[derive(Debug, Default)]
pub(crate) struct Late {
    pub entries: Vec<(DispatchKey, MessageId)>,
    /// Rescan from here: more came than fit.
    pub rescan_from: Option<DispatchKey>,
}

impl Wake {
    fn state(&self) -> std::sync::MutexGuard<'_, WakeState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The writer, after a commit that added `added`: those below the
    /// dispatcher's position are handed to it, and it is woken.
    pub fn added(&self, added: &[(DispatchKey, MessageId)]) {
        if added.is_empty() {
            return;
        }
        let mut state = self.state();
        let position = state.position;
        for (key, id) in added.iter().filter(|(key, _)| *key < position) {
            if state.late.len() < LATE_CAP {
                state.late.push((*key, id.clone()));
            } else {
                state.overflow = Some(state.overflow.map_or(*key, |o| o.min(*key)));
            }
        }
        drop(state);
        self.notify.notify_one();
    }

    /// The dispatcher, before it reads the due index up to `upper`: entries
    /// committed from now on below `upper` come to it through [`Wake::take`].
    /// Set before the read starts, so that an entry committed while the
    /// read runs is either seen by the read or handed over, never neither.
    pub fn reading_up_to(&self, upper: DispatchKey) {
        let mut state = self.state();
        state.position = state.position.max(upper);
    }

    /// What the writer handed over since the last call.
    pub fn take(&self) -> Late {
        let mut state = self.state();
        Late { entries: std::mem::take(&mut state.late), rescan_from: state.overflow.take() }
    }

    /// The dispatcher: nothing below `key` is pending any more.
    pub fn set_low_water(&self, key: DispatchKey) {
        self.state().low_water = key;
    }

    /// Where live entries start: the dispatcher's mark, or lower for an
    /// entry handed over that it has not taken yet.
    pub fn low_water(&self) -> DispatchKey {
        let state = self.state();
        state.late.iter().map(|(key, _)| *key).chain(state.overflow).fold(state.low_water, DispatchKey::min)
    }

    /// Wakes the dispatcher: entries it found held by the writer are free.
    pub fn poke(&self) {
        self.notify.notify_one();
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
        assert_eq!(c.claim_for_dispatch_all([id("a"), id("b")].iter()), [Claim::Taken, Claim::Taken]);
        assert!(!c.reserve_for_writer(&id("a")), "writer must wait for the produce");
        assert_eq!(c.dispatching(), 2);
        assert_eq!(c.claim_for_dispatch_all([id("a")].iter()), [Claim::Ours], "held already");
        c.release_all(&[id("a"), id("b")]);
        assert!(c.reserve_for_writer(&id("a")));
        assert!(c.reserve_for_writer(&id("a")), "the writer may reserve twice in one round");
        assert_eq!(
            c.claim_for_dispatch_all([id("a"), id("b")].iter()),
            [Claim::Writer, Claim::Taken],
            "dispatcher skips what the writer is changing"
        );
        c.release(&id("a"));
        assert_eq!(c.claim_for_dispatch_all([id("a")].iter()), [Claim::Taken]);
        assert_eq!(c.dispatching(), 2);
    }

    #[test]
    fn entries_added_below_the_dispatchers_position_are_handed_over() {
        let w = Wake::default();
        let k = |d| DispatchKey { at: UnixMillis(d), seq: 0 };
        w.reading_up_to(k(100));
        w.reading_up_to(k(50));
        w.added(&[(k(5), id("a")), (k(150), id("later")), (k(99), id("b"))]);
        let late = w.take();
        assert_eq!(late.entries, [(k(5), id("a")), (k(99), id("b"))], "only those below the position");
        assert_eq!(late.rescan_from, None);
        assert!(w.take().entries.is_empty(), "each once");

        let many: Vec<_> = (0..LATE_CAP as u64 + 2).map(|i| (k(i % 90), id("x"))).collect();
        w.added(&many);
        let late = w.take();
        assert_eq!(late.entries.len(), LATE_CAP);
        assert_eq!(late.rescan_from, Some(k((LATE_CAP as u64) % 90)), "the lowest that did not fit");
    }
}
