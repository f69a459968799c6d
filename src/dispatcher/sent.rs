//! What the dispatcher handed to the producer, by token, in the order sent.
//!
//! Tokens are consecutive, so a record's slot is found by subtraction, not
//! by hashing. A first-try delivery waits in its slot until every record
//! sent before it is answered; then the answered front is handed to the
//! store as one chunk, in the order sent (which is dispatch order, the order
//! the due index was read in). What waits is bounded in time and count.
//!
//! A record unanswered for `stall_after` leaves its slot for a side table:
//! it no longer holds back the chunks behind it, and when it is answered at
//! last it is settled on its own.

use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
    time::Duration,
};

use tokio::time::Instant;

use crate::{
    command::DispatchKey,
    command::{Handed, Settle, Tries},
    message::{DeadReason, Envelope, MessageId, UnixMillis},
};

/// Longest a delivery or a read-ahead is held because produces take long
/// lately: their claims hold cancels of those messages meanwhile.
const LONGEST_HOLD: Duration = Duration::from_secs(1);

/// A message handed to the producer, waiting for its report.
pub(super) struct InFlight {
    pub id: MessageId,
    pub key: DispatchKey,
    pub due: UnixMillis,
    pub topic: Arc<str>,
    pub tries: Tries,
    /// It tries a refused topic again.
    pub probe: bool,
    pub sent_at: Instant,
    /// The same, on the dispatcher's clock: its answer came no earlier.
    pub sent_wall: UnixMillis,
    /// What it has to do with dead letters, if anything (boxed: most
    /// have nothing, and a slot is moved whole).
    pub dead: Option<Box<Dead>>,
}

/// What a produce has to do with dead letters.
pub(super) enum Dead {
    /// A produce to its own topic of a message with a dead-letter topic:
    /// the message is kept, to be sent there if it fails.
    Fallback { envelope: Envelope },
    /// A dead letter of a message of `topic`.
    Letter { topic: Arc<str>, reason: DeadReason, tried: bool },
}

enum Slot {
    Waiting(InFlight),
    /// A first-try delivery, waiting for the records sent before it.
    Answered(Settle),
    Done,
}

#[derive(Default)]
pub(super) struct Sent {
    /// The token of `slots[0]`.
    base: u64,
    slots: VecDeque<Slot>,
    /// Records unanswered for `stall_after`, out of their slots.
    stalled: HashMap<u64, InFlight>,
    waiting: usize,
    answered: usize,
    /// The answered deliveries still held, by token, in the order they
    /// were answered: the first has waited longest. (Entries handed on
    /// since are dropped when they reach the front.)
    held: VecDeque<(u64, Instant)>,
    /// When answered deliveries were last handed on.
    handed_at: Option<Instant>,
    /// Tokens below this were looked at for stalls.
    stall_cursor: u64,
    /// How long a produce takes to be answered lately (a moving average of
    /// the reports of those answered in time).
    answer_time: Duration,
}

impl Sent {
    /// The token the next send gets.
    pub(super) fn next_token(&self) -> u64 {
        self.base + self.slots.len() as u64
    }

    /// Records a send; returns its token.
    pub(super) fn push(&mut self, sent: InFlight) -> u64 {
        let token = self.next_token();
        self.slots.push_back(Slot::Waiting(sent));
        self.waiting += 1;
        token
    }

    /// The record `token` names, if it is still unanswered; and whether it
    /// had stalled.
    pub(super) fn take(&mut self, token: u64) -> Option<(InFlight, bool)> {
        if let Some(sent) = self.stalled.remove(&token) {
            return Some((sent, true));
        }
        let slot = self.slots.get_mut(usize::try_from(token.checked_sub(self.base)?).ok()?)?;
        match std::mem::replace(slot, Slot::Done) {
            Slot::Waiting(sent) => {
                self.waiting -= 1;
                Some((sent, false))
            }
            other => {
                *slot = other;
                None
            }
        }
    }

    /// Keeps a first-try delivery of the record `token` named until the
    /// records sent before it are answered; hands it back if it cannot
    /// wait in order (it had stalled, and its place is gone).
    #[must_use = "a delivery handed back must be settled on its own"]
    pub(super) fn answer(&mut self, token: u64, settle: Settle) -> Option<Settle> {
        let slot = token
            .checked_sub(self.base)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| self.slots.get_mut(i));
        match slot {
            Some(slot @ Slot::Done) => {
                *slot = Slot::Answered(settle);
                self.answered += 1;
                self.held.push_back((token, Instant::now()));
                None
            }
            _ => Some(settle),
        }
    }

    /// The deliveries to hand on now: those every record sent before has
    /// been answered for, at most once per `gather` (so that a steady
    /// stream is handed on in a chunk per `gather`, not one per answer);
    /// all of them when `all`, or when one has waited `hold_for` (or as
    /// long as a produce takes lately, if longer: a record answered later
    /// than those sent after it is slow only beside what is usual) or they
    /// number `cap`. Each is marked [`Handed::InTurn`], or
    /// [`Handed::Ahead`] if handed on past an unanswered one: either way
    /// every record sent before it to its partition was answered before
    /// it and is handed on with it or was before.
    pub(super) fn flush(
        &mut self,
        all: bool,
        gather: Duration,
        hold_for: Duration,
        cap: usize,
    ) -> Vec<Settle> {
        let hold_for = hold_for.max(self.answer_time());
        let waited = self.held.front().map(|(_, since)| since.elapsed());
        let all = all || self.answered >= cap || waited.is_some_and(|w| w >= hold_for);
        let gathered = all || self.handed_at.is_none_or(|at| at.elapsed() >= gather);
        let mut out = Vec::new();
        while let Some(front) = self.slots.front() {
            match front {
                Slot::Waiting(_) => break,
                Slot::Answered(_) if !gathered => break,
                _ => {}
            }
            if let Some(Slot::Answered(mut settle)) = self.slots.pop_front() {
                settle.handed = Handed::InTurn;
                out.push(settle);
            }
            self.base += 1;
        }
        if all && self.answered > out.len() {
            for slot in self.slots.iter_mut().filter(|s| matches!(s, Slot::Answered(_))) {
                // Behind a record still unanswered, which went to another
                // partition (one partition answers in the order sent).
                if let Slot::Answered(mut settle) = std::mem::replace(slot, Slot::Done) {
                    settle.handed = Handed::Ahead;
                    out.push(settle);
                }
            }
        }
        if !out.is_empty() {
            self.handed_at = Some(Instant::now());
        }
        self.answered -= out.len();
        if self.answered == 0 {
            self.held.clear();
        }
        while self.held.front().is_some_and(|(token, _)| *token < self.base) {
            self.held.pop_front();
        }
        self.stall_cursor = self.stall_cursor.max(self.base);
        out
    }

    /// Moves records unanswered for `stall_after` out of their slots;
    /// returns them.
    pub(super) fn find_stalls(&mut self, stall_after: Duration) -> Vec<&InFlight> {
        let now = Instant::now();
        let mut found = Vec::new();
        while let Some(slot) =
            usize::try_from(self.stall_cursor - self.base).ok().and_then(|i| self.slots.get_mut(i))
        {
            if let Slot::Waiting(sent) = slot {
                if now.duration_since(sent.sent_at) < stall_after {
                    break;
                }
                if let Slot::Waiting(sent) = std::mem::replace(slot, Slot::Done) {
                    self.waiting -= 1;
                    found.push(self.stall_cursor);
                    self.stalled.insert(self.stall_cursor, sent);
                }
            }
            self.stall_cursor += 1;
        }
        found.iter().filter_map(|token| self.stalled.get(token)).collect()
    }

    /// A produce was answered `took` after it was sent (by the broker's
    /// report, not by when the dispatcher got to it).
    pub(super) fn answered_in(&mut self, took: Duration) {
        // A sixteenth of each new answer: steady, yet it follows a broker
        // that slows down within a few hundred answers.
        self.answer_time = (self.answer_time * 15 + took) / 16;
    }

    /// How long a produce takes to be answered lately, up to
    /// [`LONGEST_HOLD`].
    pub(super) fn answer_time(&self) -> Duration {
        self.answer_time.min(LONGEST_HOLD)
    }

    /// Records in flight and answering in time.
    pub(super) fn waiting(&self) -> usize {
        self.waiting
    }

    /// Records in flight, stalled ones included.
    pub(super) fn len(&self) -> usize {
        self.waiting + self.stalled.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(super) fn has_answered(&self) -> bool {
        self.answered > 0
    }

    /// Records produced and not handed to the store yet: in flight,
    /// stalled, or delivered and waiting for those sent before them.
    pub(super) fn unhanded(&self) -> usize {
        self.len() + self.answered
    }

    /// The due keys of every record not yet handed to the store: in
    /// flight, stalled, or answered and waiting for those sent before it.
    pub(super) fn unsettled_keys(&self) -> impl Iterator<Item = DispatchKey> + '_ {
        self.slots
            .iter()
            .filter_map(|s| match s {
                Slot::Waiting(sent) => Some(sent.key),
                Slot::Answered(settle) => Some(settle.key),
                Slot::Done => None,
            })
            .chain(self.stalled.values().map(|sent| sent.key))
    }

    /// Takes every record still in flight (at shutdown).
    pub(super) fn take_all(&mut self) -> Vec<InFlight> {
        let mut all: Vec<InFlight> = self.stalled.drain().map(|(_, sent)| sent).collect();
        for slot in self.slots.iter_mut() {
            if let Slot::Waiting(sent) = std::mem::replace(slot, Slot::Done) {
                all.push(sent);
            }
        }
        self.waiting = 0;
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::Outcome;

    fn sent(n: u64) -> InFlight {
        InFlight {
            id: MessageId::parse(&format!("m{n}")).unwrap(),
            key: DispatchKey { at: UnixMillis(n), seq: 0 },
            due: UnixMillis(n),
            topic: "t".into(),
            tries: Tries::default(),
            probe: false,
            sent_at: Instant::now(),
            sent_wall: UnixMillis(n),
            dead: None,
        }
    }

    fn delivered(f: InFlight) -> Settle {
        Settle {
            id: f.id,
            key: f.key,
            due: f.due,
            topic: f.topic,
            tries: f.tries,
            at: UnixMillis(0),
            outcome: Outcome::Delivered { partition: 0, offset: 0 },
            handed: Handed::Alone,
        }
    }

    fn keys(settles: &[Settle]) -> Vec<u64> {
        settles.iter().map(|s| s.key.at.0).collect()
    }

    const HOLD: Duration = Duration::from_secs(3600);

    #[test]
    fn deliveries_are_handed_on_once_everything_sent_before_them_is_answered() {
        let mut s = Sent::default();
        let tokens: Vec<u64> = (0..4).map(|n| s.push(sent(n))).collect();
        assert_eq!(s.waiting(), 4);
        for &t in &tokens[1..] {
            let (f, stalled) = s.take(t).unwrap();
            assert!(!stalled);
            assert!(s.answer(t, delivered(f)).is_none());
        }
        assert!(s.flush(false, Duration::ZERO, HOLD, 100).is_empty(), "the first is still unanswered");
        assert!(s.take(tokens[1]).is_none(), "answered once");
        let (f, _) = s.take(tokens[0]).unwrap();
        assert!(s.answer(tokens[0], delivered(f)).is_none());
        assert_eq!(keys(&s.flush(false, Duration::ZERO, HOLD, 100)), [0, 1, 2, 3], "in the order sent");
        assert!(s.is_empty() && !s.has_answered());
        let t = s.push(sent(9));
        assert_eq!(t, 4, "tokens go on");
        assert_eq!(s.take(t).unwrap().0.key.at.0, 9);
    }

    #[test]
    fn what_waits_too_long_or_is_too_many_goes_anyway() {
        let mut s = Sent::default();
        let first = s.push(sent(0));
        let second = s.push(sent(1));
        let (f, _) = s.take(second).unwrap();
        assert!(s.answer(second, delivered(f)).is_none());
        assert!(s.flush(false, Duration::ZERO, HOLD, 100).is_empty());
        assert_eq!(keys(&s.flush(false, Duration::ZERO, HOLD, 1)), [1], "at the cap");
        assert_eq!(s.waiting(), 1);
        let (f, _) = s.take(first).unwrap();
        assert!(s.answer(first, delivered(f)).is_none());
        // Longer than the produces here took to be answered.
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(keys(&s.flush(false, Duration::ZERO, Duration::ZERO, 100)), [0], "held long enough");
        assert!(s.is_empty());
    }

    #[test]
    fn the_hold_is_timed_from_the_oldest_delivery_held_and_lasts_as_long_as_a_produce_takes() {
        let mut s = Sent::default();
        let answer = |s: &mut Sent, token: u64| {
            let (f, _) = s.take(token).unwrap();
            assert!(s.answer(token, delivered(f)).is_none());
        };
        let tokens: Vec<u64> = (0..4).map(|n| s.push(sent(n))).collect();
        answer(&mut s, tokens[1]);
        std::thread::sleep(Duration::from_millis(20));
        answer(&mut s, tokens[0]);
        answer(&mut s, tokens[3]);
        assert_eq!(keys(&s.flush(false, Duration::ZERO, HOLD, 100)), [0, 1], "in order");
        let hold = Duration::from_millis(10);
        assert!(s.flush(false, Duration::ZERO, hold, 100).is_empty(), "the one held now was just answered");
        std::thread::sleep(hold);
        assert_eq!(
            keys(&s.flush(false, Duration::ZERO, hold, 100)),
            [3],
            "held long enough: past the unanswered"
        );
        // Produces answered ten seconds after they were sent: a delivery
        // behind one of them is held as long, up to a second.
        let mut s = Sent::default();
        let tokens: Vec<u64> = (0..3).map(|n| s.push(sent(n))).collect();
        for t in [tokens[0], tokens[2]] {
            s.answered_in(Duration::from_secs(10));
            answer(&mut s, t);
        }
        assert_eq!(s.answer_time(), LONGEST_HOLD, "up to a bound");
        std::thread::sleep(hold);
        assert_eq!(keys(&s.flush(false, Duration::ZERO, hold, 100)), [0]);
        assert!(s.flush(false, Duration::ZERO, hold, 100).is_empty(), "not slow beside the others");
    }

    #[test]
    fn an_answered_front_is_handed_on_at_most_once_per_gather() {
        let mut s = Sent::default();
        let answer = |s: &mut Sent, n: u64| {
            let t = s.push(sent(n));
            let (f, _) = s.take(t).unwrap();
            assert!(s.answer(t, delivered(f)).is_none());
        };
        answer(&mut s, 0);
        assert_eq!(keys(&s.flush(false, HOLD, HOLD, 100)), [0], "nothing handed on lately: at once");
        answer(&mut s, 1);
        answer(&mut s, 2);
        assert!(s.flush(false, HOLD, HOLD, 100).is_empty(), "gathering");
        assert!(s.has_answered());
        assert_eq!(keys(&s.flush(false, HOLD, HOLD, 2)), [1, 2], "at the cap");
        answer(&mut s, 3);
        assert!(s.flush(false, HOLD, HOLD, 100).is_empty());
        assert_eq!(keys(&s.flush(false, Duration::ZERO, HOLD, 100)), [3], "gathered long enough");
        answer(&mut s, 4);
        assert_eq!(keys(&s.flush(true, HOLD, HOLD, 100)), [4], "all, at shutdown");
        assert!(s.is_empty() && !s.has_answered());
    }

    #[test]
    fn a_stalled_record_leaves_the_line_and_is_settled_on_its_own() {
        let mut s = Sent::default();
        let slow = s.push(sent(0));
        let quick = s.push(sent(1));
        let stalled: Vec<u64> = s.find_stalls(Duration::ZERO).iter().map(|f| f.key.at.0).collect();
        assert_eq!(stalled, [0, 1]);
        assert!(s.find_stalls(Duration::ZERO).is_empty(), "each once");
        assert_eq!((s.waiting(), s.len()), (0, 2));
        let (f, was_stalled) = s.take(quick).unwrap();
        assert!(was_stalled);
        let settle = delivered(f);
        s.flush(false, Duration::ZERO, HOLD, 100);
        assert!(s.answer(quick, settle).is_some(), "its place is gone");
        let third = s.push(sent(2));
        assert!(s.find_stalls(Duration::from_secs(3600)).is_empty(), "not yet");
        let all = s.take_all();
        assert_eq!(all.len(), 2, "the stalled one and the third");
        assert!(s.take(slow).is_none() && s.take(third).is_none());
        assert!(s.is_empty());
    }
}
