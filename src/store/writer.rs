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
//! taken" or "is this message still pending" cannot race with each other. The
//! only other party that acts on messages is the dispatcher, and [`Claims`]
//! keeps the two apart.
//!
//! It must not block on anything but RocksDB and its own queue: no network,
//! no async runtime.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use rocksdb::{DB, Direction, IteratorMode, ReadOptions, WriteBatch, WriteOptions};
use tokio::sync::{mpsc, oneshot};

use super::{
    StoreError, StoreHealth,
    claims::{Claims, Wake},
    schema::{self, DueKey, MessageRecord, Meta, Settlement, SettlementKind},
};
use crate::{
    message::{CancelOutcome, DueSpec, Envelope, MessageId, RescheduleRefusal, Scheduled, UnixMillis},
    metrics,
};

pub(crate) type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// A message to park.
#[derive(Debug)]
pub struct NewMessage {
    pub id: Option<MessageId>,
    pub envelope: Envelope,
    pub requested: DueSpec,
    pub due: UnixMillis,
    pub now: UnixMillis,
}

/// What became of one produce, reported by the dispatcher, which holds the
/// message's claim until this is committed.
#[derive(Debug)]
pub(crate) struct Settle {
    pub id: MessageId,
    /// The due key the dispatcher took the message from.
    pub key: DueKey,
    /// The message's due time, for its lateness.
    pub due: UnixMillis,
    /// Its settlement as the dispatcher read it (tries so far), which its
    /// claim has kept unchanged since.
    pub prev: Settlement,
    pub outcome: Outcome,
}

#[derive(Debug)]
pub(crate) enum Outcome {
    Delivered {
        partition: i32,
        offset: i64,
        at: UnixMillis,
    },
    /// Try again at `retry_at`. `rejected`: the broker refused the message
    /// itself, which counts toward the attempt limit; outages do not.
    Retry {
        retry_at: UnixMillis,
        error: String,
        rejected: bool,
    },
    Failed {
        at: UnixMillis,
        error: String,
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
        id: MessageId,
        now: UnixMillis,
        reply: Reply<CancelOutcome>,
    },
    Reschedule {
        id: MessageId,
        due: UnixMillis,
        reply: Reply<UnixMillis>,
    },
    Settle(Vec<Settle>),
    /// The dispatcher gives claims back without a change.
    Release(Vec<MessageId>),
    Purge {
        before: UnixMillis,
        limit: usize,
        reply: Reply<usize>,
    },
    /// A write of the metadata alone: does the store take writes again?
    Probe {
        reply: Reply<()>,
    },
    /// Finish what is queued, then stop.
    Close,
}

/// A message as read for a change: its record and what happened to it.
#[derive(Clone)]
struct Stored {
    record: MessageRecord,
    settlement: Option<Settlement>,
}

pub(crate) struct Writer {
    pub db: Arc<DB>,
    pub claims: Arc<Claims>,
    pub wake: Arc<Wake>,
    pub pending: Arc<AtomicU64>,
    pub meta: Meta,
    pub sync: bool,
    pub rx: mpsc::Receiver<Op>,
    pub max_round: usize,
    pub max_pending: Option<u64>,
    pub health: tokio::sync::watch::Sender<StoreHealth>,
    ids: ulid::Generator,
    /// Requests waiting for the dispatcher to settle a message they touch.
    parked: HashMap<MessageId, Vec<Op>>,
    /// Requests to run first in the next round.
    again: VecDeque<Op>,
    failed_commits: u32,
}

/// Everything one round changes, committed together or not at all.
struct Round<'a> {
    db: &'a DB,
    batch: WriteBatch,
    meta: Meta,
    /// Messages changed earlier in this round, as they will be after commit.
    overlay: HashMap<MessageId, Option<Stored>>,
    reserved: HashSet<MessageId>,
    released: Vec<MessageId>,
    /// Settles to try again if the commit fails: their produce happened.
    settles: Vec<Settle>,
    lowest_added: Option<DueKey>,
    lowest_kept: Option<DueKey>,
    replies: Vec<DeferredReply>,
    effects: Effects,
    /// Commit even when nothing changed: a probe.
    probe: bool,
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
    Park,
}

impl Writer {
    pub fn new(
        db: Arc<DB>,
        claims: Arc<Claims>,
        wake: Arc<Wake>,
        pending: Arc<AtomicU64>,
        meta: Meta,
        sync: bool,
        rx: mpsc::Receiver<Op>,
    ) -> Self {
        Writer {
            db,
            claims,
            wake,
            pending,
            meta,
            sync,
            rx,
            max_round: 4096,
            max_pending: None,
            health: tokio::sync::watch::channel(StoreHealth::Ok).0,
            ids: ulid::Generator::new(),
            parked: HashMap::new(),
            again: VecDeque::new(),
            failed_commits: 0,
        }
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
            while weight < self.max_round {
                match self.rx.try_recv() {
                    Ok(op) => {
                        weight += op.weight();
                        ops.push(op);
                    }
                    Err(_) => break,
                }
            }
            self.round(ops);
            if self.failed_commits > 0 {
                // The store refused a write (disk full, I/O error). Pace the
                // retries of the settles we are keeping instead of spinning.
                // At most ~1 s apart, so a store that has room again is
                // noticed soon.
                let backoff = 50u64 << self.failed_commits.min(4);
                std::thread::sleep(Duration::from_millis(backoff));
            }
        }
        for (_, ops) in self.parked.drain() {
            for op in ops {
                refuse(op, StoreError::Closed);
            }
        }
        if let Err(e) = self.db.flush_wal(true) {
            tracing::error!(error = %e, "flushing the WAL at close failed");
        }
    }

    fn round(&mut self, ops: Vec<Op>) {
        let db = Arc::clone(&self.db);
        let mut r = Round::new(&db, self.meta.clone());
        for op in ops {
            self.apply(&mut r, op);
        }
        self.commit(r);
    }

    fn apply(&mut self, r: &mut Round, op: Op) {
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
            Op::Cancel { id, now, reply } => match self.cancel(r, &id, now) {
                Flow::Done(result) => r.reply(reply, result),
                Flow::Park => self.park(id.clone(), Op::Cancel { id, now, reply }),
            },
            Op::Reschedule { id, due, reply } => match self.reschedule(r, &id, due) {
                Flow::Done(result) => r.reply(reply, result),
                Flow::Park => self.park(id.clone(), Op::Reschedule { id, due, reply }),
            },
            Op::Settle(settles) => {
                for settle in settles {
                    self.settle(r, settle);
                }
            }
            Op::Release(ids) => r.released.extend(ids),
            Op::Purge { before, limit, reply } => {
                let result = self.purge(r, before, limit);
                r.reply(reply, result);
            }
            Op::Probe { reply } => {
                r.probe = true;
                r.reply(reply, Ok(()));
            }
            Op::Close => self.rx.close(),
        }
    }

    fn park(&mut self, id: MessageId, op: Op) {
        self.parked.entry(id).or_default().push(op);
    }

    fn load(&self, r: &Round, id: &MessageId) -> Result<Option<Stored>, StoreError> {
        if let Some(stored) = r.overlay.get(id) {
            return Ok(stored.clone());
        }
        let read = super::read_record(&self.db, id, &ReadOptions::default())?;
        Ok(read.map(|(record, settlement)| Stored { record, settlement }))
    }

    fn schedule(&mut self, r: &mut Round, msg: NewMessage) -> Result<Scheduled, StoreError> {
        let client_id = msg.id.is_some();
        let id = match msg.id {
            Some(id) => {
                if let Some(existing) = self.load(r, &id)? {
                    return if existing.record.is_same_request(&msg.envelope, msg.requested) {
                        Ok(Scheduled { id, due: existing.record.due(), duplicate: true })
                    } else {
                        Err(StoreError::IdConflict(id))
                    };
                }
                id
            }
            None => MessageId::generate(&mut self.ids),
        };
        if self.at_capacity(r.meta.pending) {
            return Err(StoreError::AtCapacity { pending: r.meta.pending });
        }
        let seq = r.meta.next_seq;
        r.meta.next_seq += 1;
        let record = MessageRecord::new(msg.envelope, msg.requested, msg.due, seq, msg.now);
        let key = DueKey { due: msg.due, seq };
        r.put_message(&id, &record);
        r.put_due(key, &id);
        r.meta.pending += 1;
        r.effects.scheduled += 1;
        if client_id {
            // Only a client-chosen id can come again in this round.
            r.overlay.insert(id.clone(), Some(Stored { record, settlement: None }));
        }
        Ok(Scheduled { id, due: msg.due, duplicate: false })
    }

    fn cancel(&mut self, r: &mut Round, id: &MessageId, now: UnixMillis) -> Flow<CancelOutcome> {
        if !r.reserve(&self.claims, id) {
            return Flow::Park;
        }
        let stored = match self.load(r, id) {
            Ok(Some(s)) => s,
            Ok(None) => return Flow::Done(Ok(CancelOutcome::NotFound)),
            Err(e) => return Flow::Done(Err(e)),
        };
        if let Err(outcome) = schema::state_of(stored.settlement.as_ref()).cancel() {
            return Flow::Done(Ok(outcome));
        }
        let key = schema::dispatch_key(&stored.record, stored.settlement.as_ref());
        r.delete_due(key);
        let settlement = Settlement {
            kind: SettlementKind::Cancelled as i32,
            at_ms: now.0,
            ..stored.settlement.unwrap_or_default()
        };
        r.settle(id, &settlement, now);
        r.overlay.insert(id.clone(), Some(Stored { record: stored.record, settlement: Some(settlement) }));
        r.effects.cancelled += 1;
        r.meta.cancelled_total += 1;
        Flow::Done(Ok(CancelOutcome::Cancelled))
    }

    fn reschedule(&mut self, r: &mut Round, id: &MessageId, due: UnixMillis) -> Flow<UnixMillis> {
        if !r.reserve(&self.claims, id) {
            return Flow::Park;
        }
        let mut stored = match self.load(r, id) {
            Ok(Some(s)) => s,
            Ok(None) => return Flow::Done(Err(StoreError::NotFound(id.clone()))),
            Err(e) => return Flow::Done(Err(e)),
        };
        let state = schema::state_of(stored.settlement.as_ref());
        match state.reschedule() {
            Ok(()) => {}
            Err(RescheduleRefusal::AlreadyDelivered) => {
                return Flow::Done(Err(StoreError::AlreadyDelivered(id.clone())));
            }
            Err(RescheduleRefusal::AlreadyCancelled) => {
                return Flow::Done(Err(StoreError::AlreadyCancelled(id.clone())));
            }
        }
        if state.is_pending() {
            r.delete_due(schema::dispatch_key(&stored.record, stored.settlement.as_ref()));
            if let Some(s) = stored.settlement.as_mut() {
                // Keep the history of tries, drop the pending retry time.
                s.retry_at_ms = 0;
                r.put_settlement(id, s);
            }
        } else {
            // Failed: re-armed with a clean slate, if there is room.
            if self.at_capacity(r.meta.pending) {
                return Flow::Done(Err(StoreError::AtCapacity { pending: r.meta.pending }));
            }
            if let Some(at) = stored.settlement.as_ref().and_then(Settlement::settled_at) {
                r.delete_retention(at, id);
            }
            r.delete_settlement(id);
            stored.settlement = None;
            r.meta.pending += 1;
            r.meta.failed_total = r.meta.failed_total.saturating_sub(1);
        }
        stored.record.due_ms = due.0;
        let key = DueKey { due, seq: stored.record.seq };
        r.put_message(id, &stored.record);
        r.put_due(key, id);
        r.overlay.insert(id.clone(), Some(stored));
        Flow::Done(Ok(due))
    }

    /// Records what became of a produce. The dispatcher's claim has kept
    /// the message as it read it, so nothing needs reading here.
    fn settle(&mut self, r: &mut Round, settle: Settle) {
        let id = settle.id.clone();
        r.released.push(id.clone());
        r.delete_due(settle.key);
        let prev = settle.prev.clone();
        let attempts = prev.attempts.saturating_add(1);
        match &settle.outcome {
            Outcome::Delivered { partition, offset, at } => {
                let settlement = Settlement {
                    kind: SettlementKind::Delivered as i32,
                    attempts,
                    at_ms: at.0,
                    partition: *partition,
                    offset: *offset,
                    retry_at_ms: 0,
                    ..prev
                };
                r.effects.delivered.push(at.since(settle.due));
                r.meta.last_delivered_key = settle.key.encode().to_vec();
                r.meta.delivered_total += 1;
                r.settle(&id, &settlement, *at);
            }
            Outcome::Retry { retry_at, error, rejected } => {
                let settlement = Settlement {
                    kind: SettlementKind::Retrying as i32,
                    attempts,
                    rejections: prev.rejections + u32::from(*rejected),
                    last_error: error.clone(),
                    retry_at_ms: retry_at.0,
                    ..prev
                };
                r.put_due(DueKey { due: *retry_at, seq: settle.key.seq }, &id);
                r.put_settlement(&id, &settlement);
            }
            Outcome::Failed { at, error } => {
                let settlement = Settlement {
                    kind: SettlementKind::Failed as i32,
                    attempts,
                    rejections: prev.rejections + 1,
                    last_error: error.clone(),
                    at_ms: at.0,
                    retry_at_ms: 0,
                    ..prev
                };
                r.effects.failed += 1;
                r.meta.failed_total += 1;
                r.settle(&id, &settlement, *at);
            }
        }
        r.settles.push(settle);
    }

    /// Forgets settled messages whose retention ran out before `before`.
    fn purge(&mut self, r: &mut Round, before: UnixMillis, limit: usize) -> Result<usize, StoreError> {
        let (lower, upper) = schema::retention_range_before(before);
        let mut opts = ReadOptions::default();
        opts.set_iterate_upper_bound(upper);
        let checkpoint = cf(&self.db, schema::CF_CHECKPOINT);
        let iter = self.db.iterator_cf_opt(checkpoint, opts, IteratorMode::From(&lower, Direction::Forward));
        let mut purged = 0;
        for item in iter.take(limit) {
            let (key, _) = item?;
            let Some((at, id)) = schema::decode_retention_key(&key) else {
                return Err(StoreError::corrupt(format!("retention index key {key:?}")));
            };
            r.batch.delete_cf(checkpoint, &key);
            let still_settled_then =
                self.load(r, &id)?.and_then(|s| s.settlement.and_then(|s| s.settled_at())) == Some(at);
            if still_settled_then {
                r.batch.delete_cf(cf(&self.db, schema::CF_MESSAGES), id.as_bytes());
                r.delete_settlement(&id);
                r.overlay.insert(id, None);
                purged += 1;
            }
        }
        r.effects.purged += purged as u64;
        Ok(purged)
    }

    fn commit(&mut self, mut r: Round) {
        let writes = !r.batch.is_empty() || r.probe;
        let result = if !writes {
            Ok(())
        } else {
            r.batch.put_cf(cf(&self.db, schema::CF_CHECKPOINT), schema::meta_key(), schema::encode(&r.meta));
            let mut opts = WriteOptions::default();
            opts.set_sync(self.sync);
            let batch = std::mem::take(&mut r.batch);
            let started = std::time::Instant::now();
            let written = self.db.write_opt(batch, &opts);
            metrics::STORE_COMMIT_SECONDS.observe(started.elapsed().as_secs_f64());
            written.map_err(StoreError::from)
        };
        for id in &r.reserved {
            self.claims.release(id);
        }
        let error = result.err();
        match &error {
            None => {
                self.failed_commits = 0;
                self.claims.release_all(&r.released);
                for id in r.released.drain(..) {
                    if let Some(ops) = self.parked.remove(&id) {
                        self.again.extend(ops);
                    }
                }
                if let Some(key) = r.lowest_added {
                    self.wake.lower(key);
                }
                r.effects.record();
                self.pending.store(r.meta.pending, Ordering::Relaxed);
                metrics::PENDING.set(r.meta.pending as i64);
                self.meta = r.meta;
                self.report_capacity();
            }
            Some(e) => {
                self.failed_commits = self.failed_commits.saturating_add(1);
                tracing::error!(error = %e, "store commit failed; nothing in it was acknowledged");
                self.set_health(StoreHealth::Failing(e.to_string()));
                // Produces that happened must still be recorded: keep their
                // claims and settle them again. Everything else stays as it
                // was, so the dispatcher must look at what it skipped.
                let retried: HashSet<MessageId> = r.settles.iter().map(|s| s.id.clone()).collect();
                for id in r.released.drain(..).filter(|id| !retried.contains(id)) {
                    self.claims.release(&id);
                    if let Some(ops) = self.parked.remove(&id) {
                        self.again.extend(ops);
                    }
                }
                self.again.push_back(Op::Settle(std::mem::take(&mut r.settles)));
                if let Some(key) = r.lowest_kept {
                    self.wake.lower(key);
                }
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
        self.max_pending.is_some_and(|cap| pending >= cap)
    }

    /// Reports whether the backlog cap is reached, after a commit succeeded.
    pub fn report_capacity(&self) {
        let pending = self.meta.pending;
        self.set_health(if self.at_capacity(pending) { StoreHealth::AtCapacity } else { StoreHealth::Ok });
    }

    /// Tells the health watchers, only when it changes.
    fn set_health(&self, now: StoreHealth) {
        self.health.send_if_modified(|h| std::mem::replace(h, now.clone()) != now);
    }
}

impl Op {
    /// How much of a round this op takes: a batch counts per message.
    fn weight(&self) -> usize {
        match self {
            Op::ScheduleBatch { msgs, .. } => msgs.len().max(1),
            Op::Release(ids) => ids.len().max(1),
            Op::Settle(settles) => settles.len().max(1),
            _ => 1,
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
        Op::Settle(_) | Op::Release(_) | Op::Close => {}
    }
}

pub(crate) fn cf<'a>(db: &'a DB, name: &str) -> &'a rocksdb::ColumnFamily {
    // Every column family is created when the store opens; a missing one is a
    // bug in this crate, not a condition to handle.
    db.cf_handle(name).unwrap_or_else(|| panic!("column family {name} is not open"))
}

impl<'a> Round<'a> {
    fn new(db: &'a DB, meta: Meta) -> Self {
        Round {
            db,
            batch: WriteBatch::default(),
            meta,
            overlay: HashMap::new(),
            reserved: HashSet::new(),
            released: Vec::new(),
            settles: Vec::new(),
            lowest_added: None,
            lowest_kept: None,
            replies: Vec::new(),
            effects: Effects::default(),
            probe: false,
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

    fn put_due(&mut self, key: DueKey, id: &MessageId) {
        self.batch.put_cf(cf(self.db, schema::CF_DUE), key.encode(), id.as_bytes());
        self.lowest_added = Some(self.lowest_added.map_or(key, |l| l.min(key)));
    }

    fn delete_due(&mut self, key: DueKey) {
        self.batch.delete_cf(cf(self.db, schema::CF_DUE), key.encode());
        self.lowest_kept = Some(self.lowest_kept.map_or(key, |l| l.min(key)));
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
        self.batch.put_cf(cf(self.db, schema::CF_CHECKPOINT), schema::retention_key(at, id), []);
        self.meta.pending = self.meta.pending.saturating_sub(1);
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
