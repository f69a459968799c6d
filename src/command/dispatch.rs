//! What the dispatcher takes from a shard (what is due, claimed: [`Ready`]
//! in a [`DueBatch`]), what it hands back (what became of each produce: a
//! [`Settle`]), and what it must search for after an unclean stop
//! ([`InDoubt`]).

use std::sync::Arc;

use super::{DispatchKey, StoreError};
use crate::{
    message::{DeadReason, Envelope, MessageId, UnixMillis},
    policy::PolicyKey,
};

/// A message the dispatcher claimed and may produce now.
#[derive(Debug)]
pub(crate) struct Ready {
    pub id: MessageId,
    pub key: DispatchKey,
    /// When it was due (its dispatch time, in `key`, is later after a
    /// failed try).
    pub due: UnixMillis,
    /// What to produce.
    pub envelope: Envelope,
    /// Its tries so far.
    pub tries: Tries,
}

/// What the retry policy needs of a message's past: its tries so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tries {
    pub attempts: u32,
    /// Tries the broker refused for this message itself (not outages).
    pub rejections: u32,
    /// When the broker first refused it; none if it never did.
    pub first_refused_at: Option<UnixMillis>,
    /// The message has a settlement entry: its outcome is recorded there,
    /// never in a chunk's delivery log.
    pub recorded: bool,
}

/// What one look at the due index found.
#[derive(Debug, Default)]
pub(crate) struct DueBatch {
    pub ready: Vec<Ready>,
    /// Where the next look starts.
    pub next_from: DispatchKey,
    /// More is due now than `limit` allowed.
    pub more: bool,
    /// When nothing more is due now: when the next message is.
    pub next_dispatch_at: Option<UnixMillis>,
    /// And its topic, so that the topic is marked before it is due
    /// rather than when it is produced.
    pub next_topic: Option<Box<str>>,
    /// Claimed, then found stale (settled or moved meanwhile): give back.
    pub stale: Vec<MessageId>,
    /// Held by the writer: look again once its commit is in.
    pub contended: Vec<(DispatchKey, MessageId)>,
    /// Claimed and not readable: give back, and look again later.
    pub unreadable: Vec<(DispatchKey, MessageId, StoreError)>,
    /// Entries of held lanes the walk stepped over, unclaimed: the lowest
    /// of each lane.
    pub held_back: Vec<(PolicyKey, DispatchKey)>,
    /// How many entries of held lanes the walk stepped over.
    pub stepped_over: usize,
}

/// What became of one produce, reported by the dispatcher, which holds the
/// message's claim until this is committed.
#[derive(Debug)]
pub(crate) struct Settle {
    pub id: MessageId,
    /// The due key the dispatcher took the message from.
    pub key: DispatchKey,
    /// The message's due time, for its lateness.
    pub due: UnixMillis,
    pub topic: Arc<str>,
    /// Its tries as the dispatcher read them, which its claim has kept
    /// unchanged since.
    pub tries: Tries,
    /// When the outcome was known.
    pub at: UnixMillis,
    pub outcome: Outcome,
    /// How the dispatcher handed it over (for a delivery: whether it may
    /// raise its partition's mark, and join the round's delivery chunk).
    pub handed: Handed,
}

/// How a delivery was handed over to be recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Handed {
    /// On its own (an outcome other than a delivery, a record answered
    /// after it stalled, or one its recorder could not keep in order):
    /// nothing is said of what else its partition holds.
    Alone,
    /// After every record sent before it was answered and handed over:
    /// each earlier record on its partition is recorded with it or before
    /// it, so it may raise the partition's mark (the store keeps a mark per
    /// partition), and it joins the round's delivery chunk.
    InTurn,
    /// Handed over while a record sent before it (to another partition)
    /// was still unanswered (it waited long enough, too many waited, or
    /// the dispatcher stops): it raises its partition's
    /// mark (a partition answers in the order sent), but it is recorded
    /// apart from the delivery chunks, which keep to dispatch order: a
    /// chunk of keys above the unanswered one would send every delivery
    /// below it, recorded later, the slow way.
    Ahead,
}

impl Handed {
    /// Every earlier record on its partition is recorded with it or
    /// before it.
    pub(crate) fn in_order(self) -> bool {
        self != Handed::Alone
    }
}

#[derive(Clone, Debug)]
pub(crate) enum Outcome {
    Delivered {
        partition: i32,
        offset: i64,
    },
    /// Try again at `retry_at`. `refused`: the broker refused the message
    /// itself (too large, say), which counts toward giving up; a refused
    /// topic or an unreachable broker does not.
    Retry {
        retry_at: UnixMillis,
        error: String,
        refused: bool,
    },
    /// Given up. `tried`: this message was produced and refused this time
    /// (else it was failed with its topic, without a try of its own).
    Failed {
        error: String,
        tried: bool,
    },
    /// Its deadline passed before it was produced: not tried.
    Expired {
        deadline: UnixMillis,
    },
    /// It failed or expired, and was produced to its dead-letter topic.
    DeadLettered(Box<DeadLettered>),
}

/// Where a message that failed or expired went instead of its topic.
#[derive(Clone, Debug)]
pub(crate) struct DeadLettered {
    /// The dead-letter topic, and where the record landed on it.
    pub topic: Arc<str>,
    pub partition: i32,
    pub offset: i64,
    pub reason: DeadReason,
    /// It failed on a produce of its own (not with its topic, and not by
    /// expiring): a try that counts.
    pub tried: bool,
}

/// Messages that may have been produced before the store was last closed
/// without a clean close (a crash): those pending from before this open
/// and due by then. Until the dispatcher has produced (or retried) each of
/// them, a cancel or reschedule cannot know whether a copy is on its topic.
#[derive(Clone, Copy, Debug)]
pub(crate) struct InDoubt {
    /// Dispatch keys below this were due when the store opened.
    pub below: DispatchKey,
    /// Accepted before the open.
    pub before_seq: u64,
    /// Dispatch keys below this cannot have been produced (nor below the
    /// floor).
    pub from: DispatchKey,
}
