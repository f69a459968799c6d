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
//! A walk of the due index reads entries before it claims them. An entry it
//! read may be gone by the time it is claimed (cancelled, or settled and
//! its claim given back in between), so the walk is [watched](Claims::watch):
//! anything that could remove an entry at or above the walk's start while
//! it runs marks it disturbed, and only a disturbed walk checks again that
//! what it claimed is still there. In a drain nothing is: settled entries
//! lie behind the walk.
//!
//! [`Wake`] carries what the writer tells the dispatcher: a commit added a
//! due entry (wake up, it may be due before your next look), and which added
//! entries lie below where the dispatcher already read, so that it reads
//! those few entries again instead of rescanning the due index over the
//! tombstones of everything settled since.

use std::{
    collections::{HashMap, hash_map::Entry},
    sync::{
        Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
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
    state: Mutex<ClaimsState>,
}

#[derive(Default)]
struct ClaimsState {
    /// Hashed fast: every message a drain produces is claimed and released.
    held: HashMap<MessageId, Holder, foldhash::fast::RandomState>,
    watch: Option<Watch>,
}

/// Walks of the due index under way (one, as a rule), and whether an entry
/// they may have read could have been removed since they started.
struct Watch {
    walks: u32,
    /// The lowest key they start at.
    from: DispatchKey,
    disturbed: bool,
}

impl ClaimsState {
    /// An entry at `key` (anywhere, if none) may be removed: a walk that
    /// could have read it must check what it claims.
    fn disturb(&mut self, key: Option<DispatchKey>) {
        if let Some(watch) = &mut self.watch
            && key.is_none_or(|k| k >= watch.from)
        {
            watch.disturbed = true;
        }
    }
}

/// A walk of the due index from its start until its claims are taken: see
/// [`Claims::watch`]. Ending it (dropping it) without claiming is fine.
pub(crate) struct Watched<'a> {
    claims: &'a Claims,
    ended: bool,
}

impl Watched<'_> {
    /// Takes the dispatcher's claims on `ids` and ends the walk; the second
    /// value is true if nothing the walk read can have been removed.
    pub(super) fn claim_all<'b>(mut self, ids: impl Iterator<Item = &'b MessageId>) -> (Vec<Claim>, bool) {
        let mut state = self.claims.state();
        let claims = claim_all(&mut state.held, ids);
        let undisturbed = end_watch(&mut state);
        self.ended = true;
        (claims, undisturbed)
    }
}

impl Drop for Watched<'_> {
    fn drop(&mut self) {
        if !self.ended {
            end_watch(&mut self.claims.state());
        }
    }
}

/// Ends one walk; whether it was undisturbed.
fn end_watch(state: &mut ClaimsState) -> bool {
    let Some(watch) = &mut state.watch else { return false };
    let undisturbed = !watch.disturbed;
    watch.walks -= 1;
    if watch.walks == 0 {
        state.watch = None;
    }
    undisturbed
}

fn claim_all<'a>(
    held: &mut HashMap<MessageId, Holder, foldhash::fast::RandomState>,
    ids: impl Iterator<Item = &'a MessageId>,
) -> Vec<Claim> {
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

impl Claims {
    fn state(&self) -> std::sync::MutexGuard<'_, ClaimsState> {
        // A panic elsewhere while holding this lock leaves the state
        // consistent (every operation is a single insert or remove), so keep
        // going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts watching a walk of the due index from `from`; call it before
    /// the walk's iterator is made. Until its claims are taken, whatever
    /// could remove an entry at or above `from` disturbs it: a writer's
    /// reservation or its release, and the release of a settled message's
    /// claim at or above `from`.
    pub(super) fn watch(&self, from: DispatchKey) -> Watched<'_> {
        let mut state = self.state();
        match &mut state.watch {
            Some(watch) => {
                // Walks that overlap share one watch: a disturbance of
                // either counts for both.
                watch.walks += 1;
                watch.from = watch.from.min(from);
            }
            None => state.watch = Some(Watch { walks: 1, from, disturbed: false }),
        }
        Watched { claims: self, ended: false }
    }

    /// The dispatcher takes each of `ids` for producing, under one lock.
    pub(super) fn claim_for_dispatch_all<'a>(&self, ids: impl Iterator<Item = &'a MessageId>) -> Vec<Claim> {
        claim_all(&mut self.state().held, ids)
    }

    /// The writer takes `id` for a change; false if the dispatcher has it.
    pub(super) fn reserve_for_writer(&self, id: &MessageId) -> bool {
        let mut state = self.state();
        let reserved = match state.held.entry(id.clone()) {
            Entry::Occupied(o) => *o.get() == Holder::Writer,
            Entry::Vacant(v) => {
                v.insert(Holder::Writer);
                true
            }
        };
        if reserved {
            state.disturb(None);
        }
        reserved
    }

    /// Gives back a claim, whoever holds it; its entry may be gone.
    pub(super) fn release(&self, id: &MessageId) {
        let mut state = self.state();
        state.held.remove(id);
        state.disturb(None);
    }

    /// Gives back the dispatcher's claims on `ids`, and only those: one the
    /// writer took meanwhile stays. Their entries stay where they are.
    pub(super) fn release_dispatched(&self, ids: &[MessageId]) {
        let mut state = self.state();
        for id in ids {
            if state.held.get(id) == Some(&Holder::Dispatcher) {
                state.held.remove(id);
            }
        }
    }

    /// Gives back, under one lock, the claims of settled messages (`ids`,
    /// whoever holds them) and the writer's holds on `unheld`, whose
    /// changes the same commit applied: a dispatcher's claim on one of
    /// those stays, for its commit made the entry visible and a walk may
    /// have taken it since. The highest of the due keys settled from, or
    /// that the commit removed, is `highest` (none with claims: anywhere).
    /// A walk that started at or below it may have read one of them as
    /// pending.
    pub(super) fn release_settled(
        &self,
        ids: &[MessageId],
        unheld: &[MessageId],
        highest: Option<DispatchKey>,
    ) {
        if ids.is_empty() && unheld.is_empty() && highest.is_none() {
            return;
        }
        let mut state = self.state();
        for id in ids {
            state.held.remove(id);
        }
        for id in unheld {
            if state.held.get(id) == Some(&Holder::Writer) {
                state.held.remove(id);
            }
        }
        state.disturb(highest);
    }

    /// Lets go of the writer's hold on `id`, and of no one else's claim.
    pub(super) fn unhold(&self, id: &MessageId) {
        let mut state = self.state();
        if state.held.get(id) == Some(&Holder::Writer) {
            state.held.remove(id);
        }
        state.disturb(None);
    }

    /// Whether the dispatcher holds `id`: it is being produced.
    pub(super) fn held_by_dispatcher(&self, id: &MessageId) -> bool {
        self.state().held.get(id) == Some(&Holder::Dispatcher)
    }

    pub(super) fn dispatching(&self) -> usize {
        self.state().held.values().filter(|h| **h == Holder::Dispatcher).count()
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
    /// Settles handed to the writer and not committed yet: produced, and
    /// not recorded.
    unrecorded: AtomicUsize,
    /// The dispatcher waits for commits to lower `unrecorded`.
    awaiting_commits: AtomicBool,
    /// Stretches of the due index that hold one topic's entries only.
    runs: super::runs::Runs,
}

#[derive(Default)]
struct WakeState {
    /// The dispatcher has read (or is reading) everything below this.
    position: DispatchKey,
    /// Entries committed below `position` since the dispatcher last asked.
    late: Vec<(DispatchKey, MessageId)>,
    /// The lowest of those that did not fit in `late`.
    overflow: Option<DispatchKey>,
    /// The lowest entry committed at or above `position` since the
    /// dispatcher's last read started: one that read may not have seen.
    unseen: Option<DispatchKey>,
    /// Some while the dispatcher sleeps until that key's time, knowing of
    /// nothing due before it: only an entry below it wakes the dispatcher
    /// (a message scheduled for tomorrow does not). None: every entry
    /// committed wakes it.
    asleep_until: Option<DispatchKey>,
    /// Below this every due entry is settled: what reads of the due index
    /// start from, to stay clear of what was settled.
    low_water: DispatchKey,
    /// Entries handed over so far (those in `late`, and those only
    /// `overflow` stands for, included).
    handed: u64,
    /// The floor the store has recorded.
    recorded: DispatchKey,
    /// Where the store has recorded the dispatcher may produce from.
    produced_from: DispatchKey,
}

impl WakeState {
    /// `key`, or lower for an entry handed over and not taken yet.
    fn lowered_to_late(&self, key: DispatchKey) -> DispatchKey {
        self.late.iter().map(|(key, _)| *key).chain(self.overflow).fold(key, DispatchKey::min)
    }
}

/// What the dispatcher knows to be settled: no due entry below `key` is
/// pending, save those handed to it from hand-over number `handed` on,
/// which it had not taken when it looked. And what it may produce: nothing
/// below `produced_from` (the floor but for what paused topics hold),
/// save those handed over, until it records a lower bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Floor {
    pub key: DispatchKey,
    pub handed: u64,
    pub produced_from: DispatchKey,
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

    /// What the writer knows of where one topic's entries lie in a row.
    pub(super) fn runs(&self) -> &super::runs::Runs {
        &self.runs
    }

    /// The dispatcher hands `n` settles to the writer.
    pub(crate) fn settling(&self, n: usize) {
        self.unrecorded.fetch_add(n, Ordering::Relaxed);
    }

    /// The writer committed `n` of the settles handed to it; wakes the
    /// dispatcher if it waits for that.
    pub(crate) fn recorded(&self, n: usize) {
        self.unrecorded.fetch_sub(n, Ordering::AcqRel);
        if n > 0 && self.awaiting_commits.swap(false, Ordering::AcqRel) {
            self.notify.notify_one();
        }
    }

    /// Settles handed to the writer and not committed yet (those of a
    /// failed commit stay until it is retried and succeeds).
    pub(crate) fn unrecorded(&self) -> usize {
        self.unrecorded.load(Ordering::Acquire)
    }

    /// The dispatcher has no room until commits record what it produced:
    /// the next commit of settles wakes it. Returns what is unrecorded now
    /// (a commit may have come in between).
    pub(crate) fn await_commits(&self) -> usize {
        self.awaiting_commits.store(true, Ordering::Release);
        self.unrecorded()
    }

    /// The writer, after a commit that added `added`: those below the
    /// dispatcher's position are handed to it, and it is woken. Returns
    /// what was handed over, by hand-over number.
    pub(crate) fn added(&self, added: &[(DispatchKey, MessageId)]) -> Vec<(u64, DispatchKey)> {
        if added.is_empty() {
            return Vec::new();
        }
        let mut state = self.state();
        let position = state.position;
        let mut handed = Vec::new();
        for (key, id) in added {
            if *key >= position {
                state.unseen = Some(state.unseen.map_or(*key, |u| u.min(*key)));
                continue;
            }
            if state.late.len() < LATE_CAP {
                state.late.push((*key, id.clone()));
            } else {
                state.overflow = Some(state.overflow.map_or(*key, |o| o.min(*key)));
            }
            handed.push((state.handed, *key));
            state.handed += 1;
        }
        let wakes =
            !handed.is_empty() || state.unseen.is_some_and(|u| state.asleep_until.is_none_or(|a| u < a));
        drop(state);
        if wakes {
            self.notify.notify_one();
        }
        handed
    }

    /// The dispatcher is about to sleep until `until`, its next due time,
    /// knowing of nothing due before it: from now on only an entry below
    /// `until` wakes it. Returns false, and leaves it to be woken by every
    /// entry, if one below `until` was committed since its last read
    /// started (that read may have missed it): it must look again first.
    pub(crate) fn sleep_until(&self, until: DispatchKey) -> bool {
        let mut state = self.state();
        if state.unseen.is_some_and(|u| u < until) {
            state.asleep_until = None;
            return false;
        }
        state.asleep_until = Some(until);
        true
    }

    /// The dispatcher waits for anything: every entry committed wakes it.
    pub(crate) fn wake_for_all(&self) {
        self.state().asleep_until = None;
    }

    /// Where the dispatcher reads up to: a new entry below it is handed over.
    pub(crate) fn position(&self) -> DispatchKey {
        self.state().position
    }

    /// The dispatcher's floor: `own` (the lowest entry it holds or has yet
    /// to read) and `producible` (the lowest it may produce), each lowered
    /// to what was handed to it and not taken yet.
    pub(crate) fn floor(&self, own: DispatchKey, producible: DispatchKey) -> Floor {
        let state = self.state();
        Floor {
            key: state.lowered_to_late(own),
            handed: state.handed,
            produced_from: state.lowered_to_late(producible),
        }
    }

    /// The store recorded `floor`.
    pub(crate) fn record_floor(&self, floor: DispatchKey) {
        let mut state = self.state();
        state.recorded = state.recorded.max(floor);
        state.low_water = state.low_water.max(floor);
    }

    /// The store recorded that the dispatcher may produce from `key` on.
    pub(crate) fn record_produced_from(&self, key: DispatchKey) {
        self.state().produced_from = key;
    }

    /// Whether `floor` says nothing the store has not recorded: sent
    /// alone, it would change nothing.
    pub(crate) fn floor_known(&self, floor: &Floor) -> bool {
        let state = self.state();
        floor.key <= state.recorded && floor.produced_from.max(state.recorded) == state.produced_from
    }

    /// The floor the store has recorded.
    pub(crate) fn floor_recorded(&self) -> DispatchKey {
        self.state().recorded
    }

    /// The dispatcher, before it reads the due index up to `upper`: entries
    /// committed from now on below `upper` come to it through [`Wake::take`].
    /// Set before the read starts, so that an entry committed while the
    /// read runs is either seen by the read or handed over, never neither.
    pub(crate) fn reading_up_to(&self, upper: DispatchKey) {
        let mut state = self.state();
        state.position = state.position.max(upper);
        // The read sees what is committed before it starts.
        state.unseen = None;
    }

    /// What the writer handed over since the last call.
    pub(crate) fn take(&self) -> Late {
        let mut state = self.state();
        Late { entries: std::mem::take(&mut state.late), rescan_from: state.overflow.take() }
    }

    /// The dispatcher: nothing below `key` is pending any more.
    pub(crate) fn set_low_water(&self, key: DispatchKey) {
        self.state().low_water = key;
    }

    /// Where live entries start: the dispatcher's mark, or lower for an
    /// entry handed over that it has not taken yet.
    pub(crate) fn low_water(&self) -> DispatchKey {
        let state = self.state();
        state.lowered_to_late(state.low_water)
    }

    /// Wakes the dispatcher: entries it found held by the writer are free.
    pub(crate) fn poke(&self) {
        self.notify.notify_one();
    }

    pub(crate) async fn notified(&self) {
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
        c.release_settled(&[id("a"), id("b")], &[], None);
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
        // The writer letting go of its holds leaves the dispatcher's claims.
        c.unhold(&id("a"));
        c.release_settled(&[], &[id("b")], None);
        assert_eq!(c.claim_for_dispatch_all([id("a"), id("b")].iter()), [Claim::Ours, Claim::Ours]);
        assert!(c.reserve_for_writer(&id("w")));
        c.release_settled(&[], &[id("w")], None);
        assert_eq!(c.claim_for_dispatch_all([id("w")].iter()), [Claim::Taken], "the writer's hold went");
    }

    #[test]
    fn a_walk_is_disturbed_only_by_what_could_remove_an_entry_it_read() {
        let c = Claims::default();
        let k = |d| DispatchKey { at: UnixMillis(d), seq: 0 };
        c.claim_for_dispatch_all([id("behind"), id("ahead"), id("held")].iter());

        let walk = c.watch(k(100));
        c.release_settled(&[id("behind")], &[], Some(k(50)));
        c.release_dispatched(&[id("held")]);
        let (claims, undisturbed) = walk.claim_all([id("x")].iter());
        assert_eq!(claims, [Claim::Taken]);
        assert!(undisturbed, "settled behind the walk, or given back still parked: nothing it read is gone");

        let walk = c.watch(k(100));
        c.release_settled(&[id("ahead")], &[], Some(k(100)));
        assert!(!walk.claim_all([id("y")].iter()).1, "a settled entry the walk may have read");

        let walk = c.watch(k(100));
        assert!(c.reserve_for_writer(&id("z")));
        assert!(!walk.claim_all(std::iter::empty()).1, "the writer may be removing it");

        // Reserved before the walk, released during it.
        let walk = c.watch(k(100));
        c.release(&id("z"));
        assert!(!walk.claim_all(std::iter::empty()).1);

        // Walks that overlap share the disturbance; a walk dropped early
        // ends cleanly.
        let first = c.watch(k(10));
        let second = c.watch(k(500));
        c.release_settled(&[id("w")], &[], Some(k(20)));
        assert!(!second.claim_all(std::iter::empty()).1, "below the second's start, above the first's");
        drop(first);
        let walk = c.watch(k(100));
        assert!(walk.claim_all(std::iter::empty()).1, "a new walk starts undisturbed");
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

    #[test]
    fn a_sleeping_dispatcher_is_woken_only_for_what_is_due_before_it_wakes() {
        use futures_util::FutureExt as _;
        let w = Wake::default();
        let k = |d| DispatchKey { at: UnixMillis(d), seq: 0 };
        let woken = |w: &Wake| w.notified().now_or_never().is_some();
        w.reading_up_to(k(100));
        assert!(w.sleep_until(k(1_000)), "nothing came since the read started");
        w.added(&[(k(5_000), id("tomorrow"))]);
        assert!(!woken(&w), "due after it wakes anyway");
        w.added(&[(k(500), id("sooner"))]);
        assert!(woken(&w), "due before it would wake");
        w.added(&[(k(50), id("behind"))]);
        assert!(woken(&w), "handed over");

        // Committed after the read started, before the dispatcher sleeps:
        // the read may have missed it, so it does not sleep past it.
        w.reading_up_to(k(100));
        w.added(&[(k(700), id("unseen"))]);
        assert!(!w.sleep_until(k(1_000)));
        assert!(woken(&w), "asleep_until is dropped: every entry wakes it");
        w.reading_up_to(k(100));
        w.added(&[(k(2_000), id("later"))]);
        assert!(w.sleep_until(k(1_000)), "what came is due after it wakes");
        w.wake_for_all();
        w.added(&[(k(9_000), id("any"))]);
        assert!(woken(&w), "waiting for anything, every entry wakes it");
    }

    #[test]
    fn a_floor_counts_what_was_handed_over_and_not_taken() {
        let w = Wake::default();
        let k = |d| DispatchKey { at: UnixMillis(d), seq: 0 };
        w.reading_up_to(k(100));
        assert_eq!(w.added(&[(k(40), id("a"))]), [(0, k(40))]);
        let floor = w.floor(k(90), k(95));
        assert_eq!(
            floor,
            Floor { key: k(40), handed: 1, produced_from: k(40) },
            "handed over, not taken yet: below the floor, and producible"
        );
        w.take();
        assert_eq!(
            w.floor(k(90), k(95)),
            Floor { key: k(90), handed: 1, produced_from: k(95) },
            "taken: the dispatcher's own"
        );
        assert_eq!(w.added(&[(k(60), id("b"))]), [(1, k(60))], "numbered on: a floor taken before it sees 1");
        w.record_floor(k(30));
        w.record_floor(k(20));
        assert_eq!(w.floor_recorded(), k(30), "the recorded floor only rises");
    }
}
