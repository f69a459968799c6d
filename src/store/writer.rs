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
//! party that acts on messages is the dispatcher, and [`Claims`] keeps the
//! two apart: a request for a message being produced waits (parked) for the
//! produce's outcome, a bounded time, and is then answered from it, or told
//! that the outcome is not known yet. A message whose produce may have
//! reached Kafka is never answered `CANCELLED`.
//!
//! It must not block on anything but RocksDB and its own queue: no network,
//! no async runtime, no scans (purge candidates are found by the caller).

use std::{
    cell::RefCell,
    collections::{HashMap, HashSet, VecDeque},
    sync::{
        Arc,
        atomic::{AtomicI64, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use rocksdb::{DB, ReadOptions, WriteBatch, WriteOptions};

mod apply;
pub(crate) use apply::settled_line;
pub use apply::{Answer, Decided, Decision, Hold, Intent};
pub(crate) use apply::{Local, LogEntry};
use tokio::sync::{mpsc, oneshot};

use super::{
    Store, StoreError,
    claims::{Claims, Floor, Wake},
    health::{HealthBoard, StoreHealth},
    options::{ShardOf, cf},
    read,
    scan::Tries,
    schema::{
        self, COUNTS_VERSION, Counts, CountsKey, DeliveryLine, DeliveryLog, DispatchKey, MessageRecord, Meta,
        Settlement, SettlementKind, TriesRecord,
    },
    view,
};
use crate::{
    message::{
        CancelOutcome, DueSpec, Envelope, MessageId, PendingMessage, RescheduleRefusal, Scheduled, Scope,
        UnixMillis, Visibility,
    },
    metrics::{self, ShardMetrics},
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
    /// was stored.
    pub async fn schedule_batch(
        &self,
        msgs: Vec<NewMessage>,
    ) -> Result<Vec<Result<Scheduled, StoreError>>, StoreError> {
        if msgs.is_empty() {
            return Ok(Vec::new());
        }
        self.call(|reply| Op::ScheduleBatch { msgs, reply }).await
    }

    /// Cancels the message `id` names for `scope`; the check and the change
    /// are one step of the writer.
    pub async fn cancel(
        &self,
        scope: Scope,
        id: MessageId,
        now: UnixMillis,
    ) -> Result<CancelOutcome, StoreError> {
        self.call(|reply| Op::Cancel { scope, id, now, reply }).await
    }

    /// Moves the message `id` names for `scope` to a new due time.
    pub async fn reschedule(
        &self,
        scope: Scope,
        id: MessageId,
        due: UnixMillis,
    ) -> Result<UnixMillis, StoreError> {
        self.call(|reply| Op::Reschedule { scope, id, due, reply }).await
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
    /// records whose retention ended before `before` (their messages were
    /// forgotten before them), oldest first.
    pub(crate) async fn expired_chunks(
        &self,
        before: UnixMillis,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let from = self.inner.purge_chunks_from.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let (chunks, next) =
            self.blocking(move |s| read::expired_log_chunks(&s.inner.db, &from, before, limit)).await?;
        *self.inner.purge_chunks_from.lock().unwrap_or_else(|e| e.into_inner()) = next;
        Ok(chunks)
    }

    async fn purge_with(
        &self,
        before: UnixMillis,
        limit: usize,
        hold: bool,
    ) -> Result<(usize, Vec<MessageId>), StoreError> {
        let from = self.inner.purge_from.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let logs_from = self.inner.purge_logs_from.lock().unwrap_or_else(|e| e.into_inner()).clone();
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
            *self.inner.purge_from.lock().unwrap_or_else(|e| e.into_inner()) = next;
        }
        *self.inner.purge_logs_from.lock().unwrap_or_else(|e| e.into_inner()) = logs_next;
        Ok((looked_at, forgotten))
    }

    /// Records what became of produces, in one commit, and, with a
    /// `floor`, that no due entry below it is pending once they are.
    pub(crate) async fn settle(&self, settles: Vec<Settle>, floor: Option<Floor>) -> Result<(), StoreError> {
        if settles.is_empty() && floor.is_none_or(|f| f.key <= self.inner.wake.floor_recorded()) {
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
        self.inner.in_doubt
    }

    /// The pending messages in `window` (see [`InDoubt`]), in dispatch
    /// order.
    pub(crate) async fn in_doubt_messages(
        &self,
        window: InDoubt,
    ) -> Result<Vec<(DispatchKey, PendingMessage)>, StoreError> {
        let from = self.inner.wake.floor_recorded();
        self.blocking(move |s| read::in_doubt(&s.inner.db, from, window.below, window.before_seq)).await
    }

    /// Where this store's records on each partition of `topic` start, as
    /// far as it recorded (see [`schema::mark_key`]).
    pub(crate) async fn marks_of(&self, topic: &str) -> Result<HashMap<i32, i64>, StoreError> {
        let topic = topic.to_owned();
        self.blocking(move |s| read::marks_of(&s.inner.db, &topic)).await
    }

    /// Records that the dispatcher may produce what is due up to `until`;
    /// returns once that is durable.
    pub(crate) async fn extend_horizon(&self, until: UnixMillis) -> Result<(), StoreError> {
        self.call(|reply| Op::Horizon { until, reply }).await
    }

    /// What the dispatcher may produce without recording more: what is due
    /// up to this, as recorded at the open (0: nothing yet).
    pub(crate) fn horizon_at_open(&self) -> UnixMillis {
        self.inner.horizon_at_open
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

pub(crate) type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// A message to park.
#[derive(Debug)]
pub struct NewMessage {
    /// Its id, in the caller's space.
    pub id: NewId,
    /// Who asks: a retry is recognised in what the caller sees.
    pub scope: Scope,
    pub envelope: Envelope,
    pub requested: DueSpec,
    pub due: UnixMillis,
    pub now: UnixMillis,
}

/// The id of a message to park, and who chose it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NewId {
    /// The client's: a retry of the same request finds the message it
    /// parked.
    Client(MessageId),
    /// Made for this request: new by construction, nothing to look up.
    Generated(MessageId),
}

impl NewId {
    pub fn id(&self) -> &MessageId {
        match self {
            NewId::Client(id) | NewId::Generated(id) => id,
        }
    }
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
    /// A delivery handed over after every record sent before it was
    /// answered and handed over: each earlier record on its partition is
    /// recorded with it or before it, so it may raise the partition's mark
    /// (see [`schema::mark_key`]).
    pub in_order: bool,
}

#[derive(Debug)]
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
}

pub(crate) enum Op {
    Schedule {
        msg: NewMessage,
        reply: Reply<Scheduled>,
    },
    /// Many messages in one commit, answered one by one.
    ScheduleBatch {
        msgs: Vec<NewMessage>,
        reply: Reply<Vec<Result<Scheduled, StoreError>>>,
    },
    Cancel {
        scope: Scope,
        id: MessageId,
        now: UnixMillis,
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
    /// The dispatcher will produce what is due up to `until`: recorded
    /// before it does. Answered once committed.
    Horizon {
        until: UnixMillis,
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

/// A message as read for a change: its record and what happened to it.
#[derive(Clone)]
struct Stored {
    record: MessageRecord,
    settlement: Option<Settlement>,
}

/// How long a request waits for the produce of the message it touches
/// before it is told the outcome is not known yet.
const MAX_PARK: Duration = Duration::from_secs(5);
/// Requests waiting so, at most; more are told at once.
const MAX_PARKED: usize = 4096;
/// How long a closing writer keeps trying to record deliveries a failing
/// disk refuses, before it gives up on them (they are produced again after
/// a restart).
const CLOSE_RETRIES_FOR: Duration = Duration::from_secs(5);

/// What the writer shares with the store's handle and the dispatcher.
pub(crate) struct Shared {
    pub db: Arc<DB>,
    pub claims: Arc<Claims>,
    pub wake: Arc<Wake>,
    pub pending: Arc<AtomicU64>,
    pub log_next: Arc<AtomicI64>,
    pub log_owner: Arc<AtomicU64>,
    pub health: Arc<HealthBoard>,
    pub metrics: ShardMetrics,
    /// Cluster mode: holds whose caller went away before logging.
    pub dropped_holds: Arc<std::sync::Mutex<Vec<MessageId>>>,
}

/// How the writer commits.
pub(crate) struct WriterConfig {
    /// Sync the WAL before answering.
    pub sync: bool,
    /// Most messages pending at once.
    pub max_pending: Option<u64>,
    /// Most ops (a batch counts per message) in one commit.
    pub max_round: usize,
    /// Recorded in a store that has no shard recorded yet.
    pub shard: ShardOf,
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
}

struct Parked {
    op: Op,
    since: Instant,
}

pub(crate) struct Writer {
    shared: Shared,
    config: WriterConfig,
    meta: Meta,
    /// Every counts entry, as committed.
    counts: HashMap<CountsKey, Counts>,
    rx: mpsc::Receiver<Op>,
    in_doubt: Option<InDoubt>,
    /// Requests waiting for the dispatcher to settle a message they touch.
    parked: HashMap<MessageId, Vec<Parked>>,
    parked_total: usize,
    /// Requests to run first in the next round.
    again: VecDeque<Op>,
    failed_commits: u32,
    /// The last dispatch key of the newest chunk logged: a first-try
    /// delivery above it joins a chunk, one at or below it (it came back
    /// out of order) is settled on its own, so chunks never overlap.
    chunk_high: Option<DispatchKey>,
    /// Entries handed to the dispatcher as added behind where it reads,
    /// by hand-over number, until a floor it sent counts them.
    handed: VecDeque<(u64, DispatchKey)>,
    /// Produces reported in doubt at shutdown.
    unresolved: usize,
    /// Where no record of this store lies before, per target partition:
    /// see [`schema::mark_key`]. Raised by each delivery, in the commit
    /// that records it.
    marks: HashMap<(Arc<str>, i32), i64>,
    /// Cluster mode: messages held by a decided change until its record
    /// is applied.
    holds: HashSet<MessageId>,
    /// Cluster mode: messages a record changed while the dispatcher held
    /// them; their settles are checked against the store.
    touched_while_claimed: HashSet<MessageId>,
    closing_since: Option<Instant>,
}

/// Everything one round changes, committed together or not at all.
struct Round<'a> {
    db: &'a DB,
    batch: WriteBatch,
    meta: Meta,
    /// Counts entries this round changes, with their new values.
    counts: HashMap<CountsKey, Counts>,
    /// Messages changed earlier in this round, as they will be after commit.
    overlay: HashMap<MessageId, Option<Stored>>,
    reserved: HashSet<MessageId>,
    released: Vec<MessageId>,
    /// Settles to try again if the commit fails: their produce happened.
    settles: Vec<Settle>,
    /// The dispatcher's floor this round records, to send again with them.
    floor: Option<Floor>,
    /// Due entries this round adds.
    added: Vec<(DispatchKey, MessageId)>,
    /// First-try deliveries this round logs as one chunk.
    chunk: Vec<DeliveryLine>,
    replies: Vec<DeferredReply>,
    effects: Effects,
    /// Commit even when nothing changed: a probe.
    probe: bool,
    /// Cluster mode: messages settled by records this round applies.
    settled: HashSet<MessageId>,
    /// Records of the log are applied: a failed commit is applied again
    /// from the log, not retried here.
    from_log: bool,
    /// Cluster mode: ids this round forgets and holds until their
    /// tombstones are applied; let go if the commit fails.
    holding: Vec<MessageId>,
    /// Delivery logs this round read, decoded: none changes before the
    /// round commits.
    delivery_logs: RefCell<read::DeliveryLogs>,
}

#[derive(Default)]
struct Effects {
    scheduled: u64,
    cancelled: u64,
    failed: u64,
    purged: u64,
    /// Lateness (delivered-at minus due) of each delivery.
    delivered: Vec<Duration>,
}

/// An answer held back until its round commits; it receives the commit's error.
type DeferredReply = Box<dyn FnOnce(Option<&StoreError>) + Send>;

enum Flow<T> {
    Done(Result<T, StoreError>),
    /// The dispatcher holds the message; run the op again once it settles.
    Park(MessageId),
}

impl Writer {
    /// Reads the store's state and records that it is open (not closed
    /// cleanly), in a synced write, before anything can be produced.
    pub fn open(
        shared: Shared,
        config: WriterConfig,
        rx: mpsc::Receiver<Op>,
        now: UnixMillis,
    ) -> Result<Writer, StoreError> {
        let db = &shared.db;
        let mut meta = read::meta(db, &ReadOptions::default())?;
        let counts = if meta.counts_version == COUNTS_VERSION {
            read::counts(db, None)?
        } else {
            let started = Instant::now();
            let counts = read::count_every_message(db)?;
            tracing::info!(
                entries = counts.len(),
                elapsed = ?started.elapsed(),
                "counted the store's messages by tenant and topic (first start of this release)"
            );
            counts
        };
        // A store that never took a message (a new one) has nothing in
        // doubt, however it was left.
        let due_by = meta.dispatch_horizon_ms.map_or(now, |horizon| now.min(UnixMillis(horizon)));
        let in_doubt = (!meta.closed_cleanly && meta.next_seq > 0)
            .then_some(InDoubt { below: DispatchKey::after(due_by), before_seq: meta.next_seq });
        if in_doubt.is_some() {
            tracing::info!(
                "the store was not closed cleanly: messages due before now may have been produced \
                 already; until each is produced again, cancel and reschedule answer UNAVAILABLE for it"
            );
        }
        let mut batch = WriteBatch::default();
        let checkpoint = cf(db, schema::CF_CHECKPOINT);
        if meta.counts_version != COUNTS_VERSION {
            for (key, value) in &counts {
                batch.put_cf(checkpoint, key.encode(), schema::encode(value));
            }
            meta.counts_version = COUNTS_VERSION;
        }
        meta.closed_cleanly = false;
        if meta.shards == 0 {
            (meta.shard, meta.shards) = (config.shard.shard, config.shard.shards);
        }
        batch.put_cf(checkpoint, schema::meta_key(), schema::encode(&meta));
        let mut opts = WriteOptions::default();
        opts.set_sync(true);
        db.write_opt(batch, &opts)?;
        shared.pending.store(meta.pending, Ordering::Relaxed);
        shared.log_next.store(meta.log_next, Ordering::Release);
        shared.log_owner.store(meta.log_owner, Ordering::Release);
        shared.wake.record_floor(meta.floor());
        let chunk_high = read::last_logged_key(db)?;
        let marks = read::marks(db)?;
        let writer = Writer {
            shared,
            config,
            meta,
            counts,
            rx,
            in_doubt,
            parked: HashMap::new(),
            parked_total: 0,
            again: VecDeque::new(),
            failed_commits: 0,
            chunk_high,
            handed: VecDeque::new(),
            unresolved: 0,
            marks,
            holds: HashSet::new(),
            touched_while_claimed: HashSet::new(),
            closing_since: None,
        };
        writer.report_capacity();
        Ok(writer)
    }

    /// Cluster mode: the log's time of the last record applied.
    pub fn log_time(&self) -> UnixMillis {
        UnixMillis(self.meta.log_time_ms)
    }

    /// What may have been produced and not recorded before the store was
    /// last closed, if it was not closed cleanly.
    pub fn in_doubt_window(&self) -> Option<InDoubt> {
        self.in_doubt
    }

    /// What the dispatcher may produce without recording more.
    pub fn horizon(&self) -> UnixMillis {
        UnixMillis(self.meta.dispatch_horizon_ms.unwrap_or(0))
    }

    /// Which shard of how many the store says it is.
    pub fn recorded_shard(&self) -> ShardOf {
        ShardOf { shard: self.meta.shard, shards: self.meta.shards }
    }

    pub fn run(mut self) {
        loop {
            let mut ops: Vec<Op> = self.again.drain(..).collect();
            if ops.is_empty() {
                match self.rx.blocking_recv() {
                    Some(op) => ops.push(op),
                    None => break,
                }
            }
            let mut weight: usize = ops.iter().map(Op::weight).sum();
            while weight < self.config.max_round {
                match self.rx.try_recv() {
                    Ok(op) => {
                        weight += op.weight();
                        ops.push(op);
                    }
                    Err(_) => break,
                }
            }
            let dropped =
                std::mem::take(&mut *self.shared.dropped_holds.lock().unwrap_or_else(|e| e.into_inner()));
            for id in dropped {
                self.unhold(&id);
            }
            self.round(ops);
            self.shared.metrics.parked.set(self.parked_total as i64);
            if self.failed_commits > 0 {
                if self.closing_since.is_some_and(|since| since.elapsed() > CLOSE_RETRIES_FOR) {
                    self.give_up_on_retries();
                    continue;
                }
                // The store refused a write (disk full, I/O error). Pace the
                // retries of the settles we are keeping instead of spinning.
                // At most ~1 s apart, so a store that has room again is
                // noticed soon.
                let backoff = 50u64 << self.failed_commits.min(4);
                std::thread::sleep(Duration::from_millis(backoff));
            }
        }
        for (id, parked) in std::mem::take(&mut self.parked) {
            for p in parked {
                refuse(p.op, StoreError::Dispatching(id.clone()));
            }
        }
        self.close_cleanly();
    }

    /// Shutting down with writes that keep failing: what is kept for
    /// retrying is dropped, and those deliveries are produced again after a
    /// restart.
    fn give_up_on_retries(&mut self) {
        let mut dropped = 0;
        for op in self.again.drain(..) {
            match op {
                Op::Settle { settles, .. } => dropped += settles.len(),
                other => refuse(other, StoreError::Closed),
            }
        }
        tracing::error!(
            dropped,
            "the store still refuses writes at shutdown; these deliveries are not recorded and will \
             be produced again after a restart"
        );
        self.unresolved += dropped;
        self.failed_commits = 0;
    }

    /// Records a clean close when nothing was left in doubt, then syncs.
    fn close_cleanly(&mut self) {
        let db = Arc::clone(&self.shared.db);
        if self.unresolved == 0 {
            let mut meta = self.meta.clone();
            meta.closed_cleanly = true;
            let mut opts = WriteOptions::default();
            opts.set_sync(true);
            let mut batch = WriteBatch::default();
            batch.put_cf(cf(&db, schema::CF_CHECKPOINT), schema::meta_key(), schema::encode(&meta));
            if let Err(e) = db.write_opt(batch, &opts) {
                tracing::error!(error = %e, "recording the clean close failed");
            }
        } else {
            tracing::warn!(
                in_doubt = self.unresolved,
                "closed with produces in doubt: after the restart, messages due by then answer cancel \
                 and reschedule with UNAVAILABLE until they are produced again"
            );
        }
        if let Err(e) = db.flush_wal(true) {
            tracing::error!(error = %e, "flushing the WAL at close failed");
        }
    }

    fn round(&mut self, ops: Vec<Op>) {
        let db = Arc::clone(&self.shared.db);
        let mut r = Round::new(&db, self.meta.clone());
        for op in ops {
            self.apply(&mut r, op);
        }
        self.commit(r);
    }

    /// Applies records of the log into `r`. A record that touches a message
    /// a settle in this round changed starts a new round: settles do not
    /// leave the message in the round's overlay.
    fn apply_log<'a>(
        &mut self,
        db: &'a DB,
        mut r: Round<'a>,
        entries: Vec<LogEntry>,
        reply: Reply<Vec<Answer>>,
    ) -> Round<'a> {
        let mut answers = Vec::with_capacity(entries.len());
        // Most records park a message the round keeps in view: room for
        // them at once rather than a copy of the map at each doubling.
        r.overlay.reserve(entries.len());
        for entry in entries {
            let touches_settled =
                !r.settled.is_empty() && apply::ids_of(&entry).iter().any(|id| r.settled.contains(id));
            if touches_settled {
                let full = std::mem::replace(&mut r, Round::new(db, self.meta.clone()));
                self.commit(full);
                r = Round::new(db, self.meta.clone());
                if self.failed_commits > 0 {
                    r.reply(
                        reply,
                        Err(StoreError::Io("applying records of the log: a commit failed".into())),
                    );
                    return r;
                }
            }
            r.from_log = true;
            match self.apply_entry(&mut r, entry) {
                Ok(answer) => answers.push(answer),
                Err(e) => {
                    r.reply(reply, Err(e));
                    return r;
                }
            }
        }
        r.reply(reply, Ok(answers));
        r
    }

    fn apply<'a>(&mut self, r: &mut Round<'a>, op: Op) {
        match op {
            Op::Schedule { msg, reply } => {
                let result = self.schedule(r, msg);
                r.reply(reply, result);
            }
            Op::ScheduleBatch { msgs, reply } => {
                let half = msgs.len() / 2;
                let results = (0..)
                    .zip(msgs)
                    .map(|(i, msg)| {
                        if i == half && i > 0 {
                            crate::failpoint::hit("store-mid-batch");
                        }
                        self.schedule(r, msg)
                    })
                    .collect();
                r.reply(reply, Ok(results));
            }
            Op::Cancel { scope, id, now, reply } => match self.cancel(r, &scope, &id, now) {
                Flow::Done(result) => r.reply(reply, result),
                Flow::Park(held) => self.park(held, Op::Cancel { scope, id, now, reply }),
            },
            Op::Reschedule { scope, id, due, reply } => match self.reschedule(r, &scope, &id, due) {
                Flow::Done(result) => r.reply(reply, result),
                Flow::Park(held) => self.park(held, Op::Reschedule { scope, id, due, reply }),
            },
            Op::Settle { settles, floor } => {
                for settle in settles {
                    self.settle(r, settle);
                }
                if let Some(floor) = floor {
                    self.raise_floor(r, floor);
                }
            }
            Op::Unpark(ids) => {
                for id in ids {
                    let parked = self.unpark(&id);
                    self.again.extend(parked.into_iter().map(|p| p.op));
                }
            }
            Op::Horizon { until, reply } => {
                r.meta.dispatch_horizon_ms = Some(r.meta.dispatch_horizon_ms.unwrap_or(0).max(until.0));
                r.probe = true;
                r.reply(reply, Ok(()));
            }
            Op::Mark { topic, ends, reply } => {
                self.set_marks(r, &topic, ends);
                r.reply(reply, Ok(()));
            }
            Op::InDoubt(ids) => {
                self.unresolved += ids.len();
                for id in ids {
                    for p in self.unpark(&id) {
                        refuse(p.op, StoreError::Dispatching(id.clone()));
                    }
                }
            }
            Op::Purge { candidates, logs, hold, reply } => {
                let result = if hold {
                    self.hold_expired(r, candidates, logs)
                } else {
                    self.purge(r, candidates, logs)
                };
                r.reply(reply, result);
            }
            Op::Probe { reply } => {
                r.probe = true;
                r.reply(reply, Ok(()));
            }
            Op::Decide { intent, reply } => match self.decide(r, &intent) {
                Flow::Done(result) => r.reply(reply, result),
                Flow::Park(held) => self.park(held, Op::Decide { intent, reply }),
            },
            Op::DecideAll { intents, reply } => {
                let decided = intents
                    .into_iter()
                    .map(|intent| match self.decide(r, &intent) {
                        Flow::Done(result) => Decided::Now(result),
                        Flow::Park(_) => Decided::Wait(intent),
                    })
                    .collect();
                r.reply(reply, Ok(decided));
            }
            Op::Unhold(id) => self.unhold(&id),
            Op::Apply { entries, reply } => {
                let db = r.db;
                let round = std::mem::replace(r, Round::new(db, self.meta.clone()));
                *r = self.apply_log(db, round, entries, reply);
            }
            Op::Tick => self.expire_parked(),
            Op::Close => {
                self.closing_since = Some(Instant::now());
                self.rx.close();
            }
        }
    }

    fn park(&mut self, id: MessageId, op: Op) {
        if self.parked_total >= MAX_PARKED {
            refuse(op, StoreError::Dispatching(id));
            return;
        }
        self.parked_total += 1;
        self.parked.entry(id).or_default().push(Parked { op, since: Instant::now() });
    }

    fn unpark(&mut self, id: &MessageId) -> Vec<Parked> {
        let parked = self.parked.remove(id).unwrap_or_default();
        self.parked_total -= parked.len();
        parked
    }

    /// Answers requests that waited too long for a produce's outcome, and
    /// forgets those whose caller is gone.
    fn expire_parked(&mut self) {
        let mut expired = Vec::new();
        self.parked.retain(|id, parked| {
            parked.retain_mut(|p| {
                if p.op.abandoned() {
                    return false;
                }
                if p.since.elapsed() < MAX_PARK {
                    return true;
                }
                expired.push((id.clone(), std::mem::replace(&mut p.op, Op::Tick)));
                false
            });
            !parked.is_empty()
        });
        self.parked_total = self.parked.values().map(Vec::len).sum();
        for (id, op) in expired {
            refuse(op, StoreError::Dispatching(id));
        }
    }

    fn load(&self, r: &Round, id: &MessageId) -> Result<Option<Stored>, StoreError> {
        if let Some(stored) = r.overlay.get(id) {
            return Ok(stored.clone());
        }
        let read = read::record_with(&self.shared.db, id, None, &mut r.delivery_logs.borrow_mut())?;
        Ok(read.map(|(record, settlement)| Stored { record, settlement }))
    }

    /// The acceptance sequence of the message stored under `id`, reading
    /// its record alone.
    fn seq_of(&self, r: &Round, id: &MessageId) -> Result<Option<u64>, StoreError> {
        if let Some(stored) = r.overlay.get(id) {
            return Ok(stored.as_ref().map(|s| s.record.seq));
        }
        let db = &self.shared.db;
        let Some(bytes) = db.get_pinned_cf(cf(db, schema::CF_MESSAGES), id.as_bytes())? else {
            return Ok(None);
        };
        Ok(Some(read::decode_stored(id, &bytes, None)?.0.seq))
    }

    /// The message `id` names for `scope`: in the caller's space, else in
    /// the shared one if the caller sees it there. A message the caller
    /// sees on a topic it does not cover is refused.
    fn find(
        &self,
        r: &Round,
        scope: &Scope,
        id: &MessageId,
    ) -> Result<Option<(MessageId, Stored)>, StoreError> {
        for candidate in std::iter::once(id.clone()).chain(scope.fallback(id)) {
            let Some(stored) = self.load(r, &candidate)? else { continue };
            match scope.sees(&candidate, &stored.record.topic) {
                Visibility::Visible => return Ok(Some((candidate, stored))),
                Visibility::Forbidden => {
                    return Err(StoreError::Forbidden {
                        token: scope.name.to_string(),
                        topic: stored.record.topic,
                    });
                }
                Visibility::Hidden => {}
            }
        }
        Ok(None)
    }

    fn schedule(&mut self, r: &mut Round, msg: NewMessage) -> Result<Scheduled, StoreError> {
        let (id, client_id) = match msg.id {
            NewId::Client(id) => {
                if let Some((found, existing)) = self.find(r, &msg.scope, &id)? {
                    return if existing.record.is_same_request(&msg.envelope, msg.requested) {
                        Ok(Scheduled { id: found, due: existing.record.due(), duplicate: true })
                    } else {
                        Err(StoreError::IdConflict(found))
                    };
                }
                (id, true)
            }
            NewId::Generated(id) => (id, false),
        };
        if self.at_capacity(r.meta.pending) {
            return Err(StoreError::AtCapacity { pending: r.meta.pending });
        }
        let record = MessageRecord::new(msg.envelope, msg.requested, msg.due, 0, msg.now);
        self.park_new(r, &id, record, client_id);
        Ok(Scheduled { id, due: msg.due, duplicate: false })
    }

    /// Parks a message not in the store yet; `seen`: its id may come again
    /// in this round (a client's, or one read from the log).
    fn park_new(&mut self, r: &mut Round, id: &MessageId, mut record: MessageRecord, seen: bool) {
        let seq = r.meta.next_seq;
        r.meta.next_seq += 1;
        record.seq = seq;
        let key = self.placed(r, DispatchKey { at: record.due(), seq });
        record.entry_at_ms = Some(key.at.0);
        r.put_message(id, &record.locator());
        r.put_due(key, id, &record, None);
        r.meta.pending += 1;
        self.count(r, id, &record.topic, |c| c.pending += 1);
        r.effects.scheduled += 1;
        if seen {
            r.overlay.insert(id.clone(), Some(Stored { record, settlement: None }));
        }
    }

    /// Whether a produce of this pending message may have reached Kafka
    /// before an unclean close, with its outcome never recorded.
    fn in_doubt(&self, stored: &Stored) -> bool {
        self.in_doubt.is_some_and(|d| {
            stored.record.seq < d.before_seq
                && view::dispatch_key(&stored.record, stored.settlement.as_ref()) < d.below
        })
    }

    fn cancel(
        &mut self,
        r: &mut Round,
        scope: &Scope,
        id: &MessageId,
        now: UnixMillis,
    ) -> Flow<CancelOutcome> {
        let (id, stored) = match self.find(r, scope, id) {
            Ok(Some(found)) => found,
            Ok(None) => return Flow::Done(Ok(CancelOutcome::NotFound)),
            Err(e) => return Flow::Done(Err(e)),
        };
        if !r.reserve(&self.shared.claims, &id) {
            return Flow::Park(id);
        }
        if let Err(outcome) = view::state_of(stored.settlement.as_ref()).cancel() {
            return Flow::Done(Ok(outcome));
        }
        if self.in_doubt(&stored) {
            return Flow::Done(Err(StoreError::Dispatching(id)));
        }
        self.cancel_pending(r, &id, stored, now);
        Flow::Done(Ok(CancelOutcome::Cancelled))
    }

    /// Cancels a pending message: its due entry goes, its record is kept
    /// whole and settled as cancelled.
    fn cancel_pending(&mut self, r: &mut Round, id: &MessageId, stored: Stored, now: UnixMillis) {
        let key = view::dispatch_key(&stored.record, stored.settlement.as_ref());
        let record = r.take_out(id, key, stored.record);
        let settlement = Settlement {
            kind: SettlementKind::Cancelled as i32,
            at_ms: now.0,
            ..stored.settlement.unwrap_or_default()
        };
        r.settle(id, &settlement, now);
        self.count(r, id, &record.topic, |c| {
            c.pending = c.pending.saturating_sub(1);
            c.cancelled = c.cancelled.saturating_add(1);
        });
        r.overlay.insert(id.clone(), Some(Stored { record, settlement: Some(settlement) }));
        r.effects.cancelled += 1;
        r.meta.cancelled_total += 1;
    }

    fn reschedule(
        &mut self,
        r: &mut Round,
        scope: &Scope,
        id: &MessageId,
        due: UnixMillis,
    ) -> Flow<UnixMillis> {
        let (id, stored) = match self.find(r, scope, id) {
            Ok(Some(found)) => found,
            Ok(None) => return Flow::Done(Err(StoreError::NotFound(id.clone()))),
            Err(e) => return Flow::Done(Err(e)),
        };
        if !r.reserve(&self.shared.claims, &id) {
            return Flow::Park(id);
        }
        let state = view::state_of(stored.settlement.as_ref());
        match state.reschedule() {
            Ok(()) => {}
            Err(RescheduleRefusal::AlreadyDelivered) => {
                return Flow::Done(Err(StoreError::AlreadyDelivered(id)));
            }
            Err(RescheduleRefusal::AlreadyCancelled) => {
                return Flow::Done(Err(StoreError::AlreadyCancelled(id)));
            }
        }
        if state.is_pending() && self.in_doubt(&stored) {
            return Flow::Done(Err(StoreError::Dispatching(id)));
        }
        if !state.is_pending() && self.at_capacity(r.meta.pending) {
            return Flow::Done(Err(StoreError::AtCapacity { pending: r.meta.pending }));
        }
        self.move_to(r, id, stored, due);
        Flow::Done(Ok(due))
    }

    /// Moves a pending message to `due`, or re-arms a failed one there.
    fn move_to(&mut self, r: &mut Round, id: MessageId, mut stored: Stored, due: UnixMillis) {
        if view::state_of(stored.settlement.as_ref()).is_pending() {
            r.delete_due(view::dispatch_key(&stored.record, stored.settlement.as_ref()));
            if let Some(s) = stored.settlement.as_mut() {
                // Keep the history of tries, drop the pending retry time.
                s.retry_at_ms = 0;
                r.put_settlement(&id, s);
            }
        } else {
            // Failed: re-armed with a clean slate.
            if let Some(at) = stored.settlement.as_ref().and_then(Settlement::settled_at) {
                r.delete_retention(at, &id);
            }
            r.delete_settlement(&id);
            stored.settlement = None;
            r.meta.pending += 1;
            r.meta.failed_total = r.meta.failed_total.saturating_sub(1);
            self.count(r, &id, &stored.record.topic, |c| {
                c.pending = c.pending.saturating_add(1);
                c.failed = c.failed.saturating_sub(1);
            });
        }
        stored.record.due_ms = due.0;
        let key = self.placed(r, DispatchKey { at: due, seq: stored.record.seq });
        stored.record.entry_at_ms = Some(key.at.0);
        r.put_message(&id, &stored.record.locator());
        let tries = stored.settlement.as_ref().map(TriesRecord::of);
        r.put_due(key, &id, &stored.record, tries.as_ref());
        r.overlay.insert(id, Some(stored));
    }

    /// Marks the partitions of `topic` that have none at `ends`.
    fn set_marks(&mut self, r: &mut Round, topic: &Arc<str>, ends: impl IntoIterator<Item = (i32, i64)>) {
        for (partition, end) in ends {
            if let std::collections::hash_map::Entry::Vacant(mark) =
                self.marks.entry((Arc::clone(topic), partition))
            {
                mark.insert(end);
                r.put_mark(topic, partition, end);
            }
        }
    }

    /// A record of this store is at `offset`, and its delivery was handed
    /// over in order: nothing of this store that is not recorded lies at
    /// or before it. Records reach a partition in the order they were sent
    /// (the producer is idempotent), so each earlier one there was
    /// answered before it, and is recorded in this commit or before it.
    fn raise_mark(&mut self, r: &mut Round, topic: &Arc<str>, partition: i32, offset: i64) {
        let next = offset.saturating_add(1);
        match self.marks.get_mut(&(Arc::clone(topic), partition)) {
            Some(mark) if *mark >= next => return,
            Some(mark) => *mark = next,
            None => {
                self.marks.insert((Arc::clone(topic), partition), next);
            }
        }
        r.put_mark(topic, partition, next);
    }

    /// Records what became of a produce. The dispatcher's claim has kept
    /// the message as it read it, so nothing needs reading here.
    fn settle(&mut self, r: &mut Round, settle: Settle) {
        let id = settle.id.clone();
        r.released.push(id.clone());
        let prev = settle.tries;
        let at = settle.at;
        let tried = !matches!(settle.outcome, Outcome::Failed { tried: false, .. });
        let attempts = if tried { prev.attempts.saturating_add(1) } else { prev.attempts };
        let first_refused_at_ms = prev.first_refused_at.map_or(0, |t| t.0);
        if let (Outcome::Delivered { partition, offset }, true) = (&settle.outcome, settle.in_order) {
            self.raise_mark(r, &settle.topic, *partition, *offset);
        }
        match &settle.outcome {
            // Its due entry stays, as the record of the message.
            Outcome::Delivered { partition, offset }
                if !prev.recorded && self.chunk_high < Some(settle.key) =>
            {
                r.effects.delivered.push(at.since(settle.due));
                r.meta.last_delivered_key = settle.key.encode().to_vec();
                r.meta.delivered_total = r.meta.delivered_total.saturating_add(1);
                r.meta.pending = r.meta.pending.saturating_sub(1);
                r.chunk.push(DeliveryLine {
                    id: id.as_bytes().to_vec(),
                    at_ms: settle.key.at.0,
                    seq: settle.key.seq,
                    partition: *partition,
                    offset: *offset,
                    delivered_at_ms: at.0,
                });
                self.count(r, &id, &settle.topic, |c| {
                    c.pending = c.pending.saturating_sub(1);
                    c.delivered = c.delivered.saturating_add(1);
                });
            }
            Outcome::Delivered { partition, offset } => {
                self.take_out_settled(r, &id, settle.key);
                let settlement = Settlement {
                    kind: SettlementKind::Delivered as i32,
                    attempts,
                    rejections: prev.rejections,
                    at_ms: at.0,
                    partition: *partition,
                    offset: *offset,
                    first_refused_at_ms,
                    ..Settlement::default()
                };
                r.effects.delivered.push(at.since(settle.due));
                r.meta.last_delivered_key = settle.key.encode().to_vec();
                r.meta.delivered_total = r.meta.delivered_total.saturating_add(1);
                r.settle(&id, &settlement, at);
                self.count(r, &id, &settle.topic, |c| {
                    c.pending = c.pending.saturating_sub(1);
                    c.delivered = c.delivered.saturating_add(1);
                });
            }
            Outcome::Retry { retry_at, error, refused } => {
                let first_refused_at_ms = match (*refused, first_refused_at_ms) {
                    (true, 0) => at.0,
                    (_, first) => first,
                };
                let key = self.placed(r, DispatchKey { at: *retry_at, seq: settle.key.seq });
                let settlement = Settlement {
                    kind: SettlementKind::Retrying as i32,
                    attempts,
                    rejections: prev.rejections.saturating_add(u32::from(*refused)),
                    last_error: error.clone(),
                    retry_at_ms: key.at.0,
                    first_refused_at_ms,
                    ..Settlement::default()
                };
                match self.whole(r, &id) {
                    Ok(Some(mut record)) => {
                        r.delete_due(settle.key);
                        record.entry_at_ms = Some(key.at.0);
                        r.put_message(&id, &record.locator());
                        r.put_due(key, &id, &record, Some(&TriesRecord::of(&settlement)));
                        r.put_settlement(&id, &settlement);
                    }
                    // Not readable now: it stays where it is, and the
                    // dispatcher is told to look at it again.
                    other => {
                        if let Err(e) = other {
                            tracing::error!(error = %e, id = %id.qualified(), "reading a message to retry failed");
                        }
                        r.added.push((settle.key, id.clone()));
                    }
                }
            }
            Outcome::Failed { error, tried } => {
                self.take_out_settled(r, &id, settle.key);
                let settlement = Settlement {
                    kind: SettlementKind::Failed as i32,
                    attempts,
                    rejections: prev.rejections.saturating_add(u32::from(*tried)),
                    last_error: error.clone(),
                    at_ms: at.0,
                    first_refused_at_ms,
                    ..Settlement::default()
                };
                r.effects.failed += 1;
                r.meta.failed_total = r.meta.failed_total.saturating_add(1);
                r.settle(&id, &settlement, at);
                self.count(r, &id, &settle.topic, |c| {
                    c.pending = c.pending.saturating_sub(1);
                    c.failed = c.failed.saturating_add(1);
                });
            }
        }
        r.settles.push(settle);
    }

    /// Forgets settled messages whose retention ran out, as found by the
    /// caller in the retention index.
    fn purge(
        &mut self,
        r: &mut Round,
        candidates: Vec<(Vec<u8>, UnixMillis, MessageId)>,
        logs: Vec<read::ExpiredLog>,
    ) -> Result<Vec<MessageId>, StoreError> {
        let checkpoint = cf(&self.shared.db, schema::CF_CHECKPOINT);
        let mut purged = Vec::new();
        let due = cf(&self.shared.db, schema::CF_DUE);
        for log in logs {
            r.batch.delete_cf(checkpoint, &log.key);
            // Below the floor nothing is pending: the chunk's range holds
            // its delivered entries and nothing else.
            let whole_range = log.last < r.meta.floor();
            if whole_range {
                r.batch.delete_range_cf(due, log.first.encode(), log.last.successor().encode());
            }
            for (id, key) in log.lines {
                if !whole_range {
                    r.delete_due(key);
                }
                // Delivered is final, but the id may have been purged and
                // taken again by a newer message since: that one stays.
                if self.seq_of(r, &id)? == Some(key.seq) {
                    r.batch.delete_cf(cf(&self.shared.db, schema::CF_MESSAGES), id.as_bytes());
                    r.overlay.insert(id.clone(), None);
                    purged.push(id);
                }
            }
        }
        for (key, at, id) in candidates {
            r.batch.delete_cf(checkpoint, &key);
            if self.settled_at(r, &id)? == Some(at) {
                r.batch.delete_cf(cf(&self.shared.db, schema::CF_MESSAGES), id.as_bytes());
                r.delete_settlement(&id);
                r.overlay.insert(id.clone(), None);
                purged.push(id);
            }
        }
        r.effects.purged += purged.len() as u64;
        Ok(purged)
    }

    /// When `id` was settled, if it is: a retention index entry of another
    /// time is stale (the message was re-armed, or the id taken again).
    fn settled_at(&self, r: &Round, id: &MessageId) -> Result<Option<UnixMillis>, StoreError> {
        Ok(self.load(r, id)?.and_then(|s| s.settlement.and_then(|s| s.settled_at())))
    }

    /// Cluster mode: a purge forgets nothing itself. What it would forget
    /// is forgotten by applying the tombstones the shard's owner appends
    /// to the log, on every node that follows the shard, so that a store
    /// rebuilt from the log never holds less than the log says. Here the
    /// ids are chosen and held until then (a change to one waits); index
    /// entries nothing is left of go now.
    fn hold_expired(
        &mut self,
        r: &mut Round,
        candidates: Vec<(Vec<u8>, UnixMillis, MessageId)>,
        logs: Vec<read::ExpiredLog>,
    ) -> Result<Vec<MessageId>, StoreError> {
        let checkpoint = cf(&self.shared.db, schema::CF_CHECKPOINT);
        let mut chosen = Vec::new();
        for log in logs {
            let mut live = false;
            for (id, key) in log.lines {
                if self.seq_of(r, &id)? == Some(key.seq) {
                    live = true;
                    if self.holds.insert(id.clone()) {
                        chosen.push(id);
                    }
                }
            }
            if !live {
                r.batch.delete_cf(checkpoint, &log.key);
            }
        }
        for (key, at, id) in candidates {
            if self.settled_at(r, &id)? != Some(at) {
                r.batch.delete_cf(checkpoint, &key);
            } else if self.holds.insert(id.clone()) {
                chosen.push(id);
            }
        }
        r.holding.extend(chosen.iter().cloned());
        Ok(chosen)
    }

    /// Where a new due entry asked for at `key` goes: there, unless that
    /// lies below where the dispatcher reads or below the recorded floor;
    /// then just above, so that it is never behind a walk, never below the
    /// floor, and never early.
    fn placed(&self, r: &Round, key: DispatchKey) -> DispatchKey {
        let lowest = self.shared.wake.position().max(r.meta.floor());
        if key >= lowest {
            return key;
        }
        let at = DispatchKey { at: lowest.at, seq: key.seq };
        if at >= lowest {
            at
        } else {
            DispatchKey { at: UnixMillis(lowest.at.0.saturating_add(1)), seq: key.seq }
        }
    }

    /// Records the dispatcher's floor, lowered to any entry handed to it
    /// after it was taken, and never below the floor recorded before (which
    /// held then, and nothing has been put below it since).
    fn raise_floor(&mut self, r: &mut Round, floor: Floor) {
        while self.handed.front().is_some_and(|(n, _)| *n < floor.handed) {
            self.handed.pop_front();
        }
        let key = self.handed.iter().map(|(_, key)| *key).fold(floor.key, DispatchKey::min);
        if key > r.meta.floor() {
            r.meta.floor = key.encode().to_vec();
        }
        r.floor = Some(floor);
    }

    /// The record of `id`, whole, as this round leaves it; without what
    /// became of it (which would read its chunk's delivery log).
    fn whole(&self, r: &Round, id: &MessageId) -> Result<Option<MessageRecord>, StoreError> {
        match r.overlay.get(id) {
            Some(stored) => Ok(stored.as_ref().map(|s| s.record.clone())),
            None => read::whole(&self.shared.db, id),
        }
    }

    /// A settled message leaves the due index other than by a first-try
    /// delivery: its due entry goes, and its record is kept whole.
    fn take_out_settled(&self, r: &mut Round, id: &MessageId, key: DispatchKey) {
        match self.whole(r, id) {
            Ok(Some(record)) => {
                r.take_out(id, key, record);
            }
            Ok(None) => r.delete_due(key),
            Err(e) => {
                tracing::error!(error = %e, id = %id.qualified(), "reading a settled message's record failed");
                r.delete_due(key);
            }
        }
    }

    /// Changes the counts entry of `id`'s space and `topic` in this round.
    fn count(&self, r: &mut Round, id: &MessageId, topic: &str, change: impl FnOnce(&mut Counts)) {
        let key = CountsKey::of(id, topic);
        let counts =
            r.counts.entry(key).or_insert_with_key(|k| self.counts.get(k).copied().unwrap_or_default());
        change(counts);
    }

    fn commit(&mut self, mut r: Round) {
        let chunk_last = r.log_chunk();
        let writes = !r.batch.is_empty() || r.probe;
        let result = if !writes {
            Ok(())
        } else {
            let checkpoint = cf(&self.shared.db, schema::CF_CHECKPOINT);
            for (key, counts) in &r.counts {
                r.batch.put_cf(checkpoint, key.encode(), schema::encode(counts));
            }
            r.batch.put_cf(checkpoint, schema::meta_key(), schema::encode(&r.meta));
            let mut opts = WriteOptions::default();
            opts.set_sync(self.config.sync);
            let batch = std::mem::take(&mut r.batch);
            let started = std::time::Instant::now();
            let written = self.shared.db.write_opt(batch, &opts);
            metrics::STORE_COMMIT_SECONDS.observe(started.elapsed().as_secs_f64());
            written.map_err(StoreError::from)
        };
        let claims = Arc::clone(&self.shared.claims);
        for id in &r.reserved {
            claims.release(id);
        }
        let error = result.err();
        match &error {
            None => {
                self.failed_commits = 0;
                if chunk_last.is_some() {
                    self.chunk_high = chunk_last;
                }
                let highest = r.settles.iter().map(|s| s.key).max();
                if !r.from_log {
                    self.shared.wake.recorded(r.settles.len());
                }
                claims.release_settled(&r.released, highest);
                self.shared.wake.record_floor(r.meta.floor());
                for id in std::mem::take(&mut r.released) {
                    let parked = self.unpark(&id);
                    self.again.extend(parked.into_iter().map(|p| p.op));
                }
                r.effects.record();
                self.shared.pending.store(r.meta.pending, Ordering::Relaxed);
                self.shared.log_next.store(r.meta.log_next, Ordering::Release);
                self.shared.log_owner.store(r.meta.log_owner, Ordering::Release);
                self.shared.metrics.pending.set(r.meta.pending as i64);
                self.meta = r.meta;
                self.counts.extend(r.counts.drain());
                self.handed.extend(self.shared.wake.added(&r.added));
                if !r.reserved.is_empty() {
                    self.shared.wake.poke();
                }
                // Only a commit that wrote says whether writes work.
                if writes {
                    self.report_capacity();
                }
            }
            Some(e) => {
                self.failed_commits = self.failed_commits.saturating_add(1);
                tracing::error!(error = %e, "store commit failed; nothing in it was acknowledged");
                self.shared.health.set_writes(StoreHealth::Failing(e.to_string()));
                // Produces that happened must still be recorded: keep their
                // claims and settle them again. Everything else stays as it
                // was; the dispatcher looks again at what the writer held.
                for id in std::mem::take(&mut r.holding) {
                    self.unhold(&id);
                }
                let retried: HashSet<MessageId> = r.settles.iter().map(|s| s.id.clone()).collect();
                for id in std::mem::take(&mut r.released).into_iter().filter(|id| !retried.contains(id)) {
                    claims.release(&id);
                    let parked = self.unpark(&id);
                    self.again.extend(parked.into_iter().map(|p| p.op));
                }
                if !r.from_log && (!r.settles.is_empty() || r.floor.is_some()) {
                    self.again
                        .push_back(Op::Settle { settles: std::mem::take(&mut r.settles), floor: r.floor });
                }
                self.shared.wake.poke();
            }
        }
        // Answer last: whoever is answered sees everything the commit did,
        // claims given back and counters included.
        if writes && error.is_none() && !r.replies.is_empty() {
            crate::failpoint::hit("store-before-ack");
        }
        for reply in r.replies.drain(..) {
            reply(error.as_ref());
        }
    }
}

impl Writer {
    fn at_capacity(&self, pending: u64) -> bool {
        self.config.max_pending.is_some_and(|cap| pending >= cap)
    }

    /// Reports whether the backlog cap is reached, after a commit succeeded.
    fn report_capacity(&self) {
        let pending = self.meta.pending;
        self.shared.health.set_writes(if self.at_capacity(pending) {
            StoreHealth::AtCapacity
        } else {
            StoreHealth::Ok
        });
    }
}

impl Op {
    /// How much of a round this op takes: a batch counts per message.
    fn weight(&self) -> usize {
        match self {
            Op::ScheduleBatch { msgs, .. } => msgs.len().max(1),
            Op::Unpark(ids) | Op::InDoubt(ids) => ids.len().max(1),
            Op::Settle { settles, .. } => settles.len().max(1),
            Op::Apply { entries, .. } => entries.len().max(1),
            Op::DecideAll { intents, .. } => intents.len().max(1),
            Op::Purge { candidates, logs, .. } => {
                (candidates.len() + logs.iter().map(|l| l.lines.len()).sum::<usize>()).max(1)
            }
            _ => 1,
        }
    }

    /// The caller went away: nobody waits for the answer.
    fn abandoned(&self) -> bool {
        match self {
            Op::Cancel { reply, .. } => reply.is_closed(),
            Op::Reschedule { reply, .. } => reply.is_closed(),
            Op::Decide { reply, .. } => reply.is_closed(),
            _ => false,
        }
    }
}

fn refuse(op: Op, error: StoreError) {
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
        Op::Horizon { reply, .. } => drop(reply.send(Err(error))),
        Op::Settle { .. } | Op::Unpark(_) | Op::InDoubt(_) | Op::Unhold(_) | Op::Tick | Op::Close => {}
    }
}

impl<'a> Round<'a> {
    fn new(db: &'a DB, meta: Meta) -> Self {
        Round {
            db,
            batch: WriteBatch::default(),
            meta,
            counts: HashMap::new(),
            overlay: HashMap::new(),
            reserved: HashSet::new(),
            released: Vec::new(),
            settles: Vec::new(),
            floor: None,
            added: Vec::new(),
            chunk: Vec::new(),
            replies: Vec::new(),
            effects: Effects::default(),
            probe: false,
            settled: HashSet::new(),
            holding: Vec::new(),
            from_log: false,
            delivery_logs: RefCell::default(),
        }
    }

    fn reply<T: Send + 'static>(&mut self, tx: Reply<T>, result: Result<T, StoreError>) {
        self.replies.push(Box::new(move |commit_error: Option<&StoreError>| {
            let _ = tx.send(match commit_error {
                Some(e) => Err(e.clone()),
                None => result,
            });
        }));
    }

    fn reserve(&mut self, claims: &Claims, id: &MessageId) -> bool {
        if claims.reserve_for_writer(id) {
            self.reserved.insert(id.clone());
            true
        } else {
            false
        }
    }

    fn put_message(&mut self, id: &MessageId, record: &MessageRecord) {
        self.batch.put_cf(cf(self.db, schema::CF_MESSAGES), id.as_bytes(), schema::encode(record));
    }

    /// Puts a due entry holding the message whole.
    fn put_due(
        &mut self,
        key: DispatchKey,
        id: &MessageId,
        record: &MessageRecord,
        tries: Option<&TriesRecord>,
    ) {
        let entry = schema::encode_due_parts(id.as_bytes(), record, tries);
        self.batch.put_cf(cf(self.db, schema::CF_DUE), key.encode(), entry);
        self.added.push((key, id.clone()));
    }

    /// Writes this round's first-try deliveries as one chunk's delivery
    /// log; returns its last dispatch key.
    fn log_chunk(&mut self) -> Option<DispatchKey> {
        if self.chunk.is_empty() {
            return None;
        }
        let mut lines = std::mem::take(&mut self.chunk);
        lines.sort_unstable_by_key(|l| (l.at_ms, l.seq));
        let key = |l: &DeliveryLine| DispatchKey { at: UnixMillis(l.at_ms), seq: l.seq };
        let (first, last) = (key(&lines[0]), key(&lines[lines.len() - 1]));
        let log = DeliveryLog { last: last.encode().to_vec(), lines };
        self.batch.put_cf(
            cf(self.db, schema::CF_CHECKPOINT),
            schema::delivery_log_key(first),
            schema::encode(&log),
        );
        Some(last)
    }

    /// Deletes the due entry at `key` of the message `record` is (read
    /// whole); a locator in the messages CF becomes the whole record, which
    /// is returned.
    fn take_out(&mut self, id: &MessageId, key: DispatchKey, mut record: MessageRecord) -> MessageRecord {
        self.delete_due(key);
        if record.is_locator() {
            record.entry_at_ms = None;
            self.put_message(id, &record);
        }
        record
    }

    fn delete_due(&mut self, key: DispatchKey) {
        self.batch.delete_cf(cf(self.db, schema::CF_DUE), key.encode());
    }

    fn put_mark(&mut self, topic: &str, partition: i32, offset: i64) {
        self.batch.put_cf(
            cf(self.db, schema::CF_CHECKPOINT),
            schema::mark_key(topic, partition),
            offset.to_be_bytes(),
        );
    }

    fn put_settlement(&mut self, id: &MessageId, s: &Settlement) {
        self.batch.put_cf(cf(self.db, schema::CF_CHECKPOINT), schema::settlement_key(id), schema::encode(s));
    }

    fn delete_settlement(&mut self, id: &MessageId) {
        self.batch.delete_cf(cf(self.db, schema::CF_CHECKPOINT), schema::settlement_key(id));
    }

    fn delete_retention(&mut self, at: UnixMillis, id: &MessageId) {
        self.batch.delete_cf(cf(self.db, schema::CF_CHECKPOINT), schema::retention_key(at, id));
    }

    /// Records a final state (delivered, cancelled, failed) and starts its
    /// retention clock.
    fn settle(&mut self, id: &MessageId, settlement: &Settlement, at: UnixMillis) {
        self.put_settlement(id, settlement);
        self.start_retention(at, id);
        self.meta.pending = self.meta.pending.saturating_sub(1);
    }

    /// Starts the retention clock of a message settled at `at`.
    fn start_retention(&mut self, at: UnixMillis, id: &MessageId) {
        self.batch.put_cf(cf(self.db, schema::CF_CHECKPOINT), schema::retention_key(at, id), []);
    }
}

impl Effects {
    fn record(&self) {
        metrics::SCHEDULED.inc_by(self.scheduled);
        metrics::CANCELLED.inc_by(self.cancelled);
        metrics::FAILED.inc_by(self.failed);
        metrics::PURGED.inc_by(self.purged);
        metrics::DELIVERED.inc_by(self.delivered.len() as u64);
        for lateness in &self.delivered {
            metrics::LATENESS.observe(lateness.as_secs_f64());
        }
    }
}
