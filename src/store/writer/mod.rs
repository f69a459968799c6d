//! The writer: the one thread that changes the store.
//!
//! Every state change (schedule, cancel, reschedule, a delivery being
//! settled, purging) arrives here as an [`Op`]. The writer drains whatever is
//! queued, applies it all to one `WriteBatch` spanning the three column
//! families, writes that batch once (synced when durability asks for it) and
//! only then answers each request. Concurrent requests therefore share one
//! WAL write and one fsync (group commit), and every change is atomic across
//! the column families.
//!
//! Because one thread applies changes in order, checks such as "is this id
//! taken", "is this message still pending" or "may this caller touch it"
//! cannot race with each other or with the change they guard. The only other
//! party that acts on messages is the dispatcher, and [`Claims`](super::claims::Claims) keeps the
//! two apart: a request for a message being produced waits (parked) for the
//! produce's outcome, a bounded time, and is then answered from it, or told
//! that the outcome is not known yet. A message whose produce may have
//! reached Kafka is never answered `CANCELLED`.
//!
//! It must not block on anything but RocksDB and its own queue: no network,
//! no async runtime, no scans (purge candidates are found by the caller).
//!
//! Its files, each using only those listed after it: `run.rs` (the
//! thread's loop: a round of ops, the dispatch of each, the commit),
//! `apply/` (cluster mode), `change.rs` (schedule, cancel, reschedule),
//! `settle.rs` (what became of produces: marks, the floor, counts),
//! `purge.rs`, `lookup.rs` (a message as a round leaves it), `round.rs`
//! (what one commit changes), `state.rs` (the writer and what it shares),
//! `park.rs` (requests waiting for a produce) and `ops.rs` (the requests;
//! those of cluster mode carry the types of `apply`).

use std::{collections::HashMap, sync::Arc};

mod apply;
mod change;
mod lookup;
mod ops;
mod park;
mod purge;
mod replica;
mod round;
mod run;
mod settle;
mod state;

pub use apply::{Decided, Decision, Hold};
use ops::Batched;
pub(crate) use ops::{Op, Reply};
pub use replica::Proposed;
pub(crate) use replica::{Local, LogEntry, Replica, SettledLine};
pub(crate) use state::{Shared, Writer, WriterConfig};

use super::{
    Store, StoreError,
    claims::Floor,
    read,
    schema::{self, DispatchKey},
};
use crate::{
    command::{Answer, InDoubt, Intent, NewMessage, Settle},
    message::{MessageId, PendingMessage, Scheduled, UnixMillis},
};

/// The store's changes, as its callers ask for them: each becomes an
/// [`Op`] for the writer thread and is answered once its commit is in.
impl Store {
    /// Parks a message; returns once it is durable.
    pub async fn schedule(&self, msg: NewMessage) -> Result<Scheduled, StoreError> {
        self.call(|reply| Op::Schedule { msg, reply }).await
    }

    /// Parks many messages in one atomic, durable write. Each message gets
    /// its own answer (an id taken by a different message fails alone); the
    /// call fails as a whole only if the write does, and then nothing of it
    /// was stored. A message that replaces one the dispatcher is producing
    /// at that instant is parked alone, once the produce's outcome is known.
    pub async fn schedule_batch(
        &self,
        msgs: Vec<NewMessage>,
    ) -> Result<Vec<Result<Scheduled, StoreError>>, StoreError> {
        if msgs.is_empty() {
            return Ok(Vec::new());
        }
        let batched = self.call(|reply| Op::ScheduleBatch { msgs, reply }).await?;
        // A replace of a message being produced waits for the produce's
        // outcome, alone, so as not to hold the batch.
        let answers = batched.into_iter().map(|item| async move {
            match item {
                Batched::Now(result) => result,
                Batched::Alone(msg) => self.schedule(*msg).await,
            }
        });
        Ok(futures_util::future::join_all(answers).await)
    }

    /// Cancels or moves a message, or parks one: the check and the change
    /// are one step of the writer.
    pub async fn change(&self, intent: Intent) -> Result<Answer, StoreError> {
        Ok(match intent {
            Intent::Schedule(msg) => Answer::Scheduled(self.schedule(*msg).await),
            Intent::Cancel { scope, id, now, only } => {
                Answer::Cancelled(self.call(|reply| Op::Cancel { scope, id, now, only, reply }).await)
            }
            Intent::Reschedule { scope, id, due } => {
                Answer::Rescheduled(self.call(|reply| Op::Reschedule { scope, id, due, reply }).await)
            }
        })
    }

    /// Forgets up to `limit` messages settled before `before`; returns how
    /// many entries of the retention index it looked at. The index is read
    /// here, from where the last purge stopped; the writer only deletes.
    pub async fn purge(&self, before: UnixMillis, limit: usize) -> Result<usize, StoreError> {
        Ok(self.purge_with(before, limit, false).await?.0)
    }

    /// Cluster mode: [`purge`](Self::purge), and the ids it forgot, which
    /// the shard's owner tombstones in the log. Each stays held (a schedule
    /// of it waits) until its tombstone is applied, or
    /// [`unhold`](Self::unhold) says it never will be: a new message under
    /// the id is logged after the tombstone, which compaction would
    /// otherwise let win.
    pub(crate) async fn purge_to_log(
        &self,
        before: UnixMillis,
        limit: usize,
    ) -> Result<(usize, Vec<MessageId>), StoreError> {
        self.purge_with(before, limit, true).await
    }

    /// Cluster mode: the keys, in the schedule log, of up to `limit` chunk
    /// records whose retention ended (their messages were forgotten before
    /// them), oldest first. Chunk keys ([`Replica::Settled`]) sort by their
    /// time: those below `before`, the first key of the time retention
    /// ends at, ended.
    pub(crate) async fn expired_chunks(
        &self,
        before: Vec<u8>,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let from = self.inner.upkeep.purge.chunks.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let (chunks, next) =
            self.blocking(move |s| read::expired_log_chunks(&s.inner.db, &from, before, limit)).await?;
        *self.inner.upkeep.purge.chunks.lock().unwrap_or_else(|e| e.into_inner()) = next;
        Ok(chunks)
    }

    async fn purge_with(
        &self,
        before: UnixMillis,
        limit: usize,
        hold: bool,
    ) -> Result<(usize, Vec<MessageId>), StoreError> {
        let from = self.inner.upkeep.purge.retention.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let logs_from = self.inner.upkeep.purge.logs.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let (candidates, logs, logs_next) = self
            .blocking(move |s| {
                let db = &s.inner.db;
                let candidates = read::purge_candidates(db, &from, before, limit)?;
                let (logs, logs_next) = read::purge_logs(db, &logs_from, before, limit)?;
                Ok((candidates, logs, logs_next))
            })
            .await?;
        let next = candidates.last().map(|(last, _, _)| schema::retention_successor(last));
        let looked_at = candidates.len() + logs.iter().map(|l| l.lines.len()).sum::<usize>();
        if looked_at == 0 {
            return Ok((0, Vec::new()));
        }
        let forgotten = self.call(|reply| Op::Purge { candidates, logs, hold, reply }).await?;
        if hold {
            // Nothing was deleted but stale entries: the next purge reads
            // from the start again, once the tombstones are applied.
            return Ok((looked_at, forgotten));
        }
        if let Some(next) = next {
            *self.inner.upkeep.purge.retention.lock().unwrap_or_else(|e| e.into_inner()) = next;
        }
        *self.inner.upkeep.purge.logs.lock().unwrap_or_else(|e| e.into_inner()) = logs_next;
        Ok((looked_at, forgotten))
    }

    /// Records what became of produces, in one commit, and, with a
    /// `floor`, that no due entry below it is pending once they are.
    pub(crate) async fn settle(&self, settles: Vec<Settle>, floor: Option<Floor>) -> Result<(), StoreError> {
        if settles.is_empty() && floor.is_none_or(|f| self.inner.wake.floor_known(&f)) {
            return Ok(());
        }
        self.inner.wake.settling(settles.len());
        self.send(Op::Settle { settles, floor }).await
    }

    /// The dispatcher gives back claims it took and did not produce (stale
    /// entries, messages of held topics): at once, so that its next look
    /// can claim them again; requests that waited on them then run.
    pub(crate) async fn release(&self, ids: Vec<MessageId>) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        self.inner.claims.release_dispatched(&ids);
        self.send(Op::Unpark(ids)).await
    }

    /// What a dispatcher may have produced without recording it before
    /// the store was last closed, if that was not cleanly.
    pub(crate) fn in_doubt_window(&self) -> Option<InDoubt> {
        self.inner.opened.in_doubt
    }

    /// The pending messages in `window` (see [`InDoubt`]), in dispatch
    /// order.
    pub(crate) async fn in_doubt_messages(
        &self,
        window: InDoubt,
    ) -> Result<Vec<(DispatchKey, PendingMessage)>, StoreError> {
        let from = self.inner.wake.floor_recorded().max(window.from);
        self.blocking(move |s| read::in_doubt(&s.inner.db, from, window.below, window.before_seq)).await
    }

    /// Where this store's records on each partition of `topic` start, as
    /// far as it recorded (see [`schema::mark_key`]).
    pub(crate) async fn marks_of(&self, topic: &str) -> Result<HashMap<i32, i64>, StoreError> {
        let topic = topic.to_owned();
        self.blocking(move |s| read::marks_of(&s.inner.db, &topic)).await
    }

    /// Records that the dispatcher may produce from `from` on (a paused
    /// topic's messages, once it resumes); returns once that is durable.
    pub(crate) async fn producing_from(&self, from: DispatchKey) -> Result<(), StoreError> {
        self.call(|reply| Op::ProducingFrom { from, reply }).await
    }

    /// Records that the dispatcher may produce what lies below `until`;
    /// returns once that is durable.
    pub(crate) async fn extend_horizon(&self, until: DispatchKey) -> Result<(), StoreError> {
        self.call(|reply| Op::Horizon { until, lower: false, reply }).await
    }

    /// Records that the dispatcher produces nothing from `until` on, lower
    /// than the horizon recorded (the dispatcher produced nothing past
    /// it); returns once that is durable.
    pub(crate) async fn lower_horizon(&self, until: DispatchKey) -> Result<(), StoreError> {
        self.call(|reply| Op::Horizon { until, lower: true, reply }).await
    }

    /// What the dispatcher may produce without recording more: what lies
    /// below this, as recorded at the open (the lowest key: nothing yet).
    pub(crate) fn horizon_at_open(&self) -> DispatchKey {
        self.inner.opened.horizon
    }

    /// Marks the partitions of `topic` that have no mark yet at `ends`:
    /// where each ended before the first produce to it.
    pub(crate) async fn mark(&self, topic: Arc<str>, ends: Vec<(i32, i64)>) -> Result<(), StoreError> {
        self.call(|reply| Op::Mark { topic, ends, reply }).await
    }

    /// Produces whose outcome will not be known: see [`Op::InDoubt`].
    pub(crate) async fn in_doubt(&self, ids: Vec<MessageId>) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        self.send(Op::InDoubt(ids)).await
    }

    /// Cluster mode: what the shard's owner does with a caller's change;
    /// see [`Decision`]. Waits (bounded) while the dispatcher produces the
    /// message, as `cancel` does.
    pub async fn decide(&self, intent: Intent) -> Result<Decision, StoreError> {
        self.call(|reply| Op::Decide { intent, reply }).await
    }

    /// Cluster mode: decides many changes in one step of the writer; one
    /// whose message is held (it would wait) comes back undecided.
    pub async fn decide_all(&self, intents: Vec<Intent>) -> Result<Vec<Decided>, StoreError> {
        if intents.is_empty() {
            return Ok(Vec::new());
        }
        self.call(|reply| Op::DecideAll { intents, reply }).await
    }

    /// Cluster mode: lets go of the hold of a decided change that was not
    /// logged.
    pub async fn unhold(&self, id: MessageId) -> Result<(), StoreError> {
        self.send(Op::Unhold(id)).await
    }

    /// Says which pending messages an earlier dispatcher may have produced
    /// unrecorded, until the search for them is over (none: the search is
    /// over). Meanwhile a cancel or reschedule of one of them is answered
    /// [`StoreError::Dispatching`]: the search could still find it
    /// delivered. Takes effect before any change queued after it.
    pub(crate) async fn doubt(&self, window: Option<InDoubt>) -> Result<(), StoreError> {
        self.send(Op::Doubt { window, marks_wait: false }).await
    }

    /// As [`Self::doubt`], for a search that runs while the dispatcher
    /// produces what is not in doubt: until the doubt ends, the marks the
    /// dispatcher gives wait in memory, so that a search after another
    /// unclean stop still reads from where this one's records may lie.
    pub(crate) async fn search_beside(&self, window: InDoubt) -> Result<(), StoreError> {
        self.send(Op::Doubt { window: Some(window), marks_wait: true }).await
    }

    /// Cluster mode: applies records of the shard's log partition, in
    /// offset order, with the offset after the last in the same commits.
    /// Answers each; on an error, the records from the one that failed on
    /// are not applied (the next offset says where to read again).
    pub(crate) async fn apply(&self, entries: Vec<LogEntry>) -> Result<Vec<Answer>, StoreError> {
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        self.call(|reply| Op::Apply { entries, reply }).await
    }

    /// Writes nothing but the store's own metadata, to learn whether writes
    /// succeed again after a failure. Every change queued before it is
    /// committed when it returns.
    pub async fn probe(&self) -> Result<(), StoreError> {
        self.call(|reply| Op::Probe { reply }).await
    }
}
