//! Runs: stretches of the due index known to hold one topic's entries
//! only, so that a walk can seek past a stretch it would step over entry
//! by entry.
//!
//! A walk of the due index steps over the entries of the lanes a dispatch
//! policy holds back (see [`crate::dispatcher`]). When a rate-limited or
//! paused topic has a wall of messages due in the same millisecond, that
//! is hundreds of thousands of entries read in a row, about 150 ns each,
//! while every other topic's messages due right behind the wall wait for
//! the walk to get past it. The writer knows better: it put the wall there.
//!
//! A new message gets the next sequence number, so its entry is the last
//! of its millisecond among the entries new messages have made. The writer
//! follows, for each of the last few milliseconds it parked into, the run
//! of new entries of one topic at the end of it: a new entry of the same
//! topic there extends the run, one of another topic ends it. Every entry
//! between a run's first and last key is then one of its own, unless an
//! existing message was moved in between (a reschedule, a retry, both of
//! which keep the message's sequence number): such an entry, and anything
//! the writer cannot account for, drops the runs it lands in. A walk takes
//! its copy of the runs after it told the writer how far it reads, so an
//! entry committed later into a run it skips is handed over to the
//! dispatcher as any entry committed behind its position is.
//!
//! In memory only, and only what this process parked: after a restart the
//! walks step over a wall again.

use std::{collections::BTreeMap, sync::Arc};

use super::schema::DispatchKey;
use crate::{message::MessageId, policy::PolicyKey};

/// Runs shorter than this are not worth a seek.
const LONG: u64 = 1024;
/// The most runs remembered; past it the lowest go.
const MOST_RUNS: usize = 1024;
/// The milliseconds whose last run is followed.
const OPEN: usize = 16;
/// How far back in a round's segments a new entry looks for its
/// millisecond's last one (only compression: one not found starts another).
const LOOK_BACK: usize = 4;

/// Whose messages a run holds.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Whose {
    /// One tenant's (`None`: messages without a tenant).
    One(Option<Arc<str>>),
    /// Several tenants'.
    Mixed,
}

impl Whose {
    fn of(id: &MessageId) -> Whose {
        Whose::One(id.tenant().map(Arc::from))
    }

    fn is(&self, id: &MessageId) -> bool {
        matches!(self, Whose::One(t) if t.as_deref() == id.tenant())
    }

    fn with(self, other: &Whose) -> Whose {
        if self == *other { self } else { Whose::Mixed }
    }
}

/// A stretch of one millisecond of the due index, `first` to `last`, that
/// holds entries of `topic` only.
#[derive(Clone, Debug)]
pub(super) struct Run {
    first: DispatchKey,
    last: DispatchKey,
    count: u64,
    topic: Arc<str>,
    whose: Whose,
}

impl Run {
    fn holds(&self, key: DispatchKey) -> bool {
        self.first <= key && key <= self.last
    }

    /// Every entry of the run is `lane`'s.
    fn all_of(&self, lane: &PolicyKey) -> bool {
        *self.topic == *lane.topic
            && lane.tenant.as_ref().is_none_or(|t| self.whose == Whose::One(Some(Arc::from(t.as_str()))))
    }

    /// No entry of the run is `lane`'s.
    fn none_of(&self, lane: &PolicyKey) -> bool {
        *self.topic != *lane.topic
            || lane
                .tenant
                .as_ref()
                .is_some_and(|t| matches!(&self.whose, Whose::One(w) if w.as_deref() != Some(t.as_str())))
    }
}

/// What one writer round parked, for the runs: the new entries as
/// segments, and the keys of the others.
#[derive(Default)]
pub(super) struct RoundRuns {
    /// Sequence numbers from here on are new messages'.
    fresh_from: u64,
    /// The highest sequence number of a new entry so far.
    highest: Option<u64>,
    segments: Vec<Run>,
    /// Entries put that are not new messages' first.
    others: Vec<DispatchKey>,
    /// A new message's entry was put twice: the segments cannot be
    /// trusted.
    tainted: bool,
}

impl RoundRuns {
    /// For a round whose new messages are numbered from `fresh_from` on.
    pub(super) fn new(fresh_from: u64) -> RoundRuns {
        RoundRuns { fresh_from, ..RoundRuns::default() }
    }

    /// A due entry was put at `key`, of `id` to `topic`.
    pub(super) fn put(&mut self, key: DispatchKey, id: &MessageId, topic: &str) {
        if key.seq < self.fresh_from {
            self.others.push(key);
            return;
        }
        // A new message's first entry comes in the order of its number.
        if self.highest.is_some_and(|h| key.seq <= h) {
            self.tainted = true;
            return;
        }
        self.highest = Some(key.seq);
        let last = self.segments.iter_mut().rev().take(LOOK_BACK).find(|s| s.first.at == key.at);
        match last {
            Some(run) if *run.topic == *topic => {
                run.last = key;
                run.count += 1;
                if !run.whose.is(id) {
                    run.whose = Whose::Mixed;
                }
            }
            _ => self.segments.push(Run {
                first: key,
                last: key,
                count: 1,
                topic: Arc::from(topic),
                whose: Whose::of(id),
            }),
        }
    }
}

/// The runs the writer knows of.
#[derive(Default)]
pub(crate) struct Runs {
    state: std::sync::Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Runs long enough to seek past, by first key.
    long: BTreeMap<DispatchKey, Run>,
    /// The last run of new entries of each of the latest milliseconds
    /// parked into, still growing; the newest last.
    open: Vec<Run>,
}

impl State {
    /// An entry put at `key` that is not a new message's: the runs it
    /// lands in go, and its millisecond's open run ends (a new entry after
    /// it would make the run reach over it).
    fn drop_holding(&mut self, key: DispatchKey) {
        self.open.retain(|run| run.first.at != key.at);
        if let Some((&first, run)) = self.long.range(..=key).next_back()
            && run.holds(key)
        {
            self.long.remove(&first);
        }
    }

    fn add(&mut self, segment: Run) {
        let at = segment.first.at;
        let open = self.open.iter().rposition(|run| run.first.at == at);
        let run = match open {
            Some(i) if self.open[i].topic == segment.topic => {
                // The latest grown last: the first to go is the one left
                // alone longest.
                let mut run = self.open.remove(i);
                run.last = segment.last;
                run.count += segment.count;
                run.whose = std::mem::replace(&mut run.whose, Whose::Mixed).with(&segment.whose);
                self.open.push(run.clone());
                run
            }
            found => {
                if let Some(i) = found {
                    self.open.remove(i);
                } else if self.open.len() >= OPEN {
                    self.open.remove(0);
                }
                self.open.push(segment.clone());
                segment
            }
        };
        if run.count >= LONG {
            self.long.insert(run.first, run);
            if self.long.len() > MOST_RUNS {
                self.long.pop_first();
            }
        }
    }
}

impl Runs {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A round committed what `round` says it put.
    pub(super) fn committed(&self, round: RoundRuns) {
        if round.others.is_empty() && round.segments.is_empty() && !round.tainted {
            return;
        }
        let mut state = self.state();
        for key in round.others {
            state.drop_holding(key);
        }
        if round.tainted {
            // What the new entries were is unknown: none of the latest
            // milliseconds' runs may grow.
            state.open.clear();
            return;
        }
        for segment in round.segments {
            state.add(segment);
        }
    }

    /// The long runs that reach into `from..upper`, in order, for a walk
    /// that has told the writer it reads up to `upper`. Those wholly below
    /// `settled` (nothing below it is pending) are forgotten.
    pub(super) fn within(&self, from: DispatchKey, upper: DispatchKey, settled: DispatchKey) -> Vec<Run> {
        let mut state = self.state();
        while let Some(entry) = state.long.first_entry()
            && entry.get().last < settled
        {
            entry.remove();
        }
        state.long.range(..upper).filter(|(_, run)| run.last >= from).map(|(_, run)| run.clone()).collect()
    }
}

/// A walk's copy of the runs, asked in ascending key order.
pub(super) struct Seek {
    runs: Vec<Run>,
    next: usize,
}

impl Seek {
    pub(super) fn new(runs: Vec<Run>) -> Seek {
        Seek { runs, next: 0 }
    }

    /// The run holding `key`, if any. Keys asked ascend.
    fn at(&mut self, key: DispatchKey) -> Option<&Run> {
        while self.runs.get(self.next).is_some_and(|run| run.last < key) {
            self.next += 1;
        }
        self.runs.get(self.next).filter(|run| run.holds(key))
    }

    /// Where to go on from `key`, an entry of `lane`, if a run from it on
    /// holds `lane`'s entries only: past the run's last.
    pub(super) fn past_lane(&mut self, key: DispatchKey, lane: &PolicyKey) -> Option<DispatchKey> {
        self.at(key).filter(|run| run.all_of(lane)).map(|run| run.last.successor())
    }

    /// Where to go on from `key`, an entry that is not `lane`'s, if a run
    /// from it on holds none of `lane`'s entries: past the run's last.
    pub(super) fn past_others(&mut self, key: DispatchKey, lane: &PolicyKey) -> Option<DispatchKey> {
        self.at(key).filter(|run| run.none_of(lane)).map(|run| run.last.successor())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Tenant, UnixMillis};

    fn k(at: u64, seq: u64) -> DispatchKey {
        DispatchKey { at: UnixMillis(at), seq }
    }

    fn id(tenant: Option<&str>) -> MessageId {
        let tenant = tenant.map(|t| Tenant::parse(t).unwrap());
        MessageId::parse_in(tenant.as_ref(), "x").unwrap()
    }

    fn lane(topic: &str, tenant: Option<&str>) -> PolicyKey {
        PolicyKey { topic: topic.into(), tenant: tenant.map(|t| Tenant::parse(t).unwrap()) }
    }

    /// A round from `seq` on putting `n` new entries at `at` of `topic`.
    fn wall(round: &mut RoundRuns, at: u64, seqs: std::ops::Range<u64>, topic: &str) {
        for seq in seqs {
            round.put(k(at, seq), &id(None), topic);
        }
    }

    fn seek(runs: &Runs) -> Seek {
        Seek::new(runs.within(
            DispatchKey::MIN,
            DispatchKey::after(UnixMillis(u64::MAX - 1)),
            DispatchKey::MIN,
        ))
    }

    #[test]
    fn new_entries_of_one_topic_in_one_millisecond_make_a_run_over_rounds() {
        let runs = Runs::default();
        let mut round = RoundRuns::new(10);
        wall(&mut round, 5, 10..700, "a");
        // Another millisecond's entries between do not end it.
        round.put(k(6, 700), &id(None), "b");
        wall(&mut round, 5, 701..800, "a");
        runs.committed(round);
        assert!(seek(&runs).runs.is_empty(), "short runs are not worth a seek");
        let mut round = RoundRuns::new(800);
        wall(&mut round, 5, 800..1200, "a");
        runs.committed(round);
        let mut s = seek(&runs);
        assert_eq!(s.past_lane(k(5, 10), &lane("a", None)), Some(k(5, 1200)));
        assert_eq!(s.past_lane(k(5, 1199), &lane("a", None)), Some(k(5, 1200)));
        assert_eq!(s.past_lane(k(6, 700), &lane("a", None)), None, "another millisecond");
        let mut s = seek(&runs);
        assert_eq!(s.past_lane(k(5, 500), &lane("b", None)), None, "another topic's lane");
        assert_eq!(s.past_others(k(5, 500), &lane("b", None)), Some(k(5, 1200)));
        assert_eq!(s.past_others(k(5, 600), &lane("a", None)), None);
    }

    #[test]
    fn another_topic_in_the_millisecond_ends_a_run() {
        let runs = Runs::default();
        let mut round = RoundRuns::new(0);
        wall(&mut round, 5, 0..1100, "a");
        round.put(k(5, 1100), &id(None), "b");
        wall(&mut round, 5, 1101..3000, "a");
        runs.committed(round);
        let mut s = seek(&runs);
        assert_eq!(s.past_lane(k(5, 3), &lane("a", None)), Some(k(5, 1100)));
        assert_eq!(s.past_lane(k(5, 1100), &lane("a", None)), None);
        assert_eq!(s.past_lane(k(5, 1101), &lane("a", None)), Some(k(5, 3000)));
    }

    #[test]
    fn an_entry_moved_into_a_run_drops_it() {
        let runs = Runs::default();
        let mut round = RoundRuns::new(0);
        wall(&mut round, 5, 0..2000, "a");
        round.put(k(9, 2000), &id(None), "b");
        wall(&mut round, 5, 2001..4000, "a");
        runs.committed(round);
        assert!(!seek(&runs).runs.is_empty());
        // `b`'s message, number 2000, moved to millisecond 5: inside the run.
        let mut round = RoundRuns::new(4000);
        round.put(k(5, 2000), &id(None), "b");
        runs.committed(round);
        assert!(seek(&runs).runs.is_empty());
        // Nor does the millisecond's open run grow again.
        let mut round = RoundRuns::new(4000);
        wall(&mut round, 5, 4000..4100, "a");
        runs.committed(round);
        assert!(seek(&runs).runs.is_empty());
    }

    #[test]
    fn an_entry_moved_in_after_a_run_ends_it() {
        let runs = Runs::default();
        let mut round = RoundRuns::new(0);
        wall(&mut round, 5, 0..2000, "a");
        round.put(k(9, 2000), &id(None), "b");
        runs.committed(round);
        // `b`'s message moved to millisecond 5, after the run: then more of
        // `a` there must not make the run reach over it.
        let mut round = RoundRuns::new(2001);
        round.put(k(5, 2000), &id(None), "b");
        wall(&mut round, 5, 2001..4000, "a");
        runs.committed(round);
        let mut s = seek(&runs);
        assert_eq!(s.past_lane(k(5, 0), &lane("a", None)), Some(k(5, 2000)));
        assert_eq!(s.past_lane(k(5, 2000), &lane("a", None)), None);
        assert_eq!(s.past_lane(k(5, 2001), &lane("a", None)), Some(k(5, 4000)));
    }

    #[test]
    fn a_new_entry_put_twice_in_a_round_leaves_its_segments_out() {
        let runs = Runs::default();
        let mut round = RoundRuns::new(0);
        wall(&mut round, 5, 0..2000, "a");
        round.put(k(5, 1500), &id(None), "b");
        runs.committed(round);
        assert!(seek(&runs).runs.is_empty());
    }

    #[test]
    fn a_tenant_lane_seeks_past_its_own_tenant_only() {
        let runs = Runs::default();
        let mut round = RoundRuns::new(0);
        for seq in 0..2000 {
            round.put(k(5, seq), &id(Some("acme")), "a");
        }
        for seq in 2000..4000 {
            round.put(k(7, seq), &id(if seq % 2 == 0 { Some("acme") } else { None }), "a");
        }
        runs.committed(round);
        let mut s = seek(&runs);
        assert!(s.past_lane(k(5, 0), &lane("a", Some("acme"))).is_some());
        assert!(s.past_lane(k(7, 2000), &lane("a", Some("acme"))).is_none(), "mixed tenants");
        let mut s = seek(&runs);
        assert!(s.past_lane(k(7, 2000), &lane("a", None)).is_some());
        let mut s = seek(&runs);
        assert!(s.past_others(k(5, 0), &lane("a", Some("other"))).is_some(), "acme's only");
        assert!(s.past_others(k(7, 2000), &lane("a", Some("other"))).is_none());
    }

    #[test]
    fn runs_are_bounded_and_those_settled_are_forgotten() {
        let runs = Runs::default();
        for n in 0..(MOST_RUNS as u64 + 10) {
            let mut round = RoundRuns::new(n * LONG);
            wall(&mut round, n, n * LONG..(n + 1) * LONG, "a");
            runs.committed(round);
        }
        assert_eq!(seek(&runs).runs.len(), MOST_RUNS);
        let upper = DispatchKey::after(UnixMillis(u64::MAX - 1));
        let (from, settled) = (k(MOST_RUNS as u64 + 5, 0), k(MOST_RUNS as u64, 0));
        assert_eq!(runs.within(from, upper, settled).len(), 5, "those reaching into the walk's range");
        assert_eq!(seek(&runs).runs.len(), 10, "those below what is settled are forgotten");
    }
}
