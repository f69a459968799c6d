//! The requests the writer thread takes ([`Op`]), what they carry (a
//! message to park, what became of a produce) and how one is refused.

use std::sync::Arc;

use tokio::sync::oneshot;

use super::{Decided, Decision, LogEntry};
use crate::{
    command::{Answer, InDoubt, Intent, NewMessage, Row, Settle},
    message::{CancelOutcome, Matching, MessageId, Scheduled, Scope, UnixMillis},
    store::{StoreError, claims::Floor, read, schema::DispatchKey},
};

pub(crate) type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// One message of a batch: answered, or handed back to be scheduled alone.
#[derive(Debug)]
pub(crate) enum Batched {
    Now(Result<Scheduled, StoreError>),
    Alone(Box<NewMessage>),
}

pub(crate) enum Op {
    Schedule {
        msg: NewMessage,
        reply: Reply<Scheduled>,
    },
    /// Many messages in one commit, answered one by one; a replace of a
    /// message the dispatcher holds comes back to be scheduled alone (it
    /// waits for the produce's outcome).
    ScheduleBatch {
        msgs: Vec<NewMessage>,
        reply: Reply<Vec<Batched>>,
    },
    Cancel {
        scope: Scope,
        id: MessageId,
        now: UnixMillis,
        only: Option<Box<Matching>>,
        reply: Reply<CancelOutcome>,
    },
    Reschedule {
        scope: Scope,
        id: MessageId,
        due: UnixMillis,
        reply: Reply<UnixMillis>,
    },
    Settle {
        settles: Vec<Settle>,
        floor: Option<Floor>,
    },
    /// The dispatcher gave these claims back without a change: requests
    /// waiting on them run again.
    Unpark(Vec<MessageId>),
    /// The dispatcher will produce what lies below `until` (with `lower`,
    /// only that, though more was recorded): recorded before it does.
    /// Answered once committed.
    Horizon {
        until: DispatchKey,
        lower: bool,
        reply: Reply<()>,
    },
    /// The dispatcher will produce from `from` on, below what it said:
    /// recorded before it does. Answered once committed.
    ProducingFrom {
        from: DispatchKey,
        reply: Reply<()>,
    },
    /// Marks of a target topic's partitions that have none yet: where
    /// each ended before the first produce of this store to the topic.
    /// Answered once committed.
    Mark {
        topic: Arc<str>,
        ends: Vec<(i32, i64)>,
        reply: Reply<()>,
    },
    /// Which pending messages a produce of an earlier dispatcher may have
    /// reached Kafka unrecorded (none: no longer any): until the search for
    /// them is over, a change to one of them is refused as dispatching.
    /// `marks_wait`: the dispatcher produces while the search runs, so
    /// the marks it gives wait in memory until the doubt ends (see
    /// [`HeldMarks`](super::state::HeldMarks)).
    Doubt {
        window: Option<InDoubt>,
        marks_wait: bool,
    },
    /// Produces whose outcome the dispatcher will not learn: it stopped
    /// before Kafka answered. Requests waiting on them are told so; their
    /// claims stay until the store closes, and the store does not count as
    /// closed cleanly.
    InDoubt(Vec<MessageId>),
    /// Forgets these settled messages if they are still settled as the
    /// retention index said: (retention key, settled at, id); and the
    /// chunks of these delivery logs: (log key, (id, seq) of each line).
    /// Answered with the ids forgotten; `hold`: each stays held until its
    /// tombstone is applied (cluster mode).
    Purge {
        candidates: Vec<(Vec<u8>, UnixMillis, MessageId)>,
        logs: Vec<read::ExpiredLog>,
        hold: bool,
        reply: Reply<Vec<MessageId>>,
    },
    /// Changes of rows of tables, committed together. Answered once
    /// committed (and a cached table's watchers told).
    Rows {
        rows: Vec<Row>,
        reply: Reply<()>,
    },
    /// Cluster mode: decide a caller's change before it is logged.
    Decide {
        intent: Intent,
        reply: Reply<Decision>,
    },
    /// Cluster mode: decide many changes; none waits.
    DecideAll {
        intents: Vec<Intent>,
        reply: Reply<Vec<Decided>>,
    },
    Unhold(MessageId),
    /// Cluster mode: apply records of the log partition.
    Apply {
        entries: Vec<LogEntry>,
        reply: Reply<Vec<Answer>>,
    },
    /// A write of the metadata alone: does the store take writes again?
    Probe {
        reply: Reply<()>,
    },
    /// Time passes: requests parked too long are answered.
    Tick,
    /// Finish what is queued, then stop.
    Close,
}

impl Op {
    /// How much of a round this op takes: a batch counts per message.
    pub(super) fn weight(&self) -> usize {
        match self {
            Op::ScheduleBatch { msgs, .. } => msgs.len().max(1),
            Op::Unpark(ids) | Op::InDoubt(ids) => ids.len().max(1),
            Op::Settle { settles, .. } => settles.len().max(1),
            Op::Apply { entries, .. } => entries.len().max(1),
            Op::DecideAll { intents, .. } => intents.len().max(1),
            Op::Rows { rows, .. } => rows.len().max(1),
            Op::Purge { candidates, logs, .. } => {
                (candidates.len() + logs.iter().map(|l| l.lines.len()).sum::<usize>()).max(1)
            }
            _ => 1,
        }
    }

    /// The caller went away: nobody waits for the answer.
    pub(super) fn abandoned(&self) -> bool {
        match self {
            Op::Schedule { reply, .. } => reply.is_closed(),
            Op::Cancel { reply, .. } => reply.is_closed(),
            Op::Reschedule { reply, .. } => reply.is_closed(),
            Op::Decide { reply, .. } => reply.is_closed(),
            _ => false,
        }
    }
}

pub(super) fn refuse(op: Op, error: StoreError) {
    match op {
        Op::Schedule { reply, .. } => drop(reply.send(Err(error))),
        Op::ScheduleBatch { reply, .. } => drop(reply.send(Err(error))),
        Op::Cancel { reply, .. } => drop(reply.send(Err(error))),
        Op::Reschedule { reply, .. } => drop(reply.send(Err(error))),
        Op::Purge { reply, .. } => drop(reply.send(Err(error))),
        Op::Probe { reply } => drop(reply.send(Err(error))),
        Op::Decide { reply, .. } => drop(reply.send(Err(error))),
        Op::DecideAll { reply, .. } => drop(reply.send(Err(error))),
        Op::Apply { reply, .. } => drop(reply.send(Err(error))),
        Op::Mark { reply, .. } => drop(reply.send(Err(error))),
        Op::Rows { reply, .. } => drop(reply.send(Err(error))),
        Op::Horizon { reply, .. } | Op::ProducingFrom { reply, .. } => drop(reply.send(Err(error))),
        Op::Settle { .. }
        | Op::Unpark(_)
        | Op::InDoubt(_)
        | Op::Doubt { .. }
        | Op::Unhold(_)
        | Op::Tick
        | Op::Close => {}
    }
}
