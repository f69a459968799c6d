//! The writer thread's loop: opening the store, taking ops in rounds,
//! dispatching each op, committing a round and answering it, and closing.

use std::{
    collections::{HashSet, VecDeque},
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use rocksdb::{DB, ReadOptions, WriteBatch};
use tokio::sync::mpsc;

use super::{
    apply::{self, Decided},
    change::{Flow, Placing},
    ops::{Batched, Op, Reply, refuse},
    park::Parking,
    replica::LogEntry,
    round::Round,
    state::{Commits, HeldMarks, Marks, ReplicaHolds, Shared, Writer, WriterConfig},
};
use crate::{
    command::{Answer, InDoubt},
    message::{MessageId, UnixMillis},
    metrics,
    store::{
        StoreError,
        health::StoreHealth,
        options::{self, Durability, ShardOf, cf},
        read,
        schema::{self, COUNTS_VERSION, DispatchKey},
    },
};

/// How long a closing writer keeps trying to record deliveries a failing
/// disk refuses, before it gives up on them (they are produced again after
/// a restart).
const CLOSE_RETRIES_FOR: Duration = Duration::from_secs(5);
/// How long a store with no WAL holds commits only in memory at most: how
/// much of its log a crash makes it apply again, besides what its write
/// buffers hold. (A copy rolled back far enough would look stale, and be
/// rebuilt whole.)
const WRITE_OUT_AFTER: Duration = Duration::from_secs(30);

impl Writer {
    /// Reads the store's state and records that it is open (not closed
    /// cleanly), in a synced write, before anything can be produced. A
    /// store `restored` from a backup forgets how far its dispatcher
    /// produced: whatever was due by now may have been, since the copy.
    pub(crate) fn open(
        shared: Shared,
        config: WriterConfig,
        rx: mpsc::Receiver<Op>,
        now: UnixMillis,
        restored: bool,
    ) -> Result<Writer, StoreError> {
        let db = &shared.db;
        let mut meta = read::meta(db, &ReadOptions::default())?;
        if restored {
            meta.closed_cleanly = false;
            meta.dispatch_horizon.clear();
            meta.dispatch_horizon_ms = None;
            meta.produced_from.clear();
        }
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
        let due_by = DispatchKey::after(now);
        let in_doubt = (!meta.closed_cleanly && meta.next_seq > 0).then_some(InDoubt {
            below: meta.horizon().map_or(due_by, |horizon| horizon.min(due_by)),
            before_seq: meta.next_seq,
            from: meta.produced_from(),
        });
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
        config.durability.write_durably(db, batch)?;
        shared.pending.store(meta.pending, Ordering::Relaxed);
        shared.log_next.store(meta.log_next, Ordering::Release);
        shared.log_owner.store(meta.log_owner, Ordering::Release);
        shared.log_time.store(meta.log_time_ms, Ordering::Release);
        shared.wake.record_floor(meta.floor());
        shared.wake.record_produced_from(meta.produced_from());
        let chunk_high = read::last_logged_key(db)?;
        let marks = read::marks(db)?;
        let writer = Writer {
            shared,
            config,
            meta,
            counts: counts.into_iter().collect(),
            rx,
            in_doubt,
            parking: Parking::default(),
            again: VecDeque::new(),
            commits: Commits::default(),
            chunk_high,
            handed: VecDeque::new(),
            unresolved: 0,
            marks: Marks { set: marks.into_iter().collect(), held: None },
            replica: ReplicaHolds::default(),
            closing_since: None,
        };
        writer.report_capacity();
        Ok(writer)
    }

    /// Cluster mode: the log's time of the last record applied.
    pub(crate) fn log_time(&self) -> UnixMillis {
        UnixMillis(self.meta.log_time_ms)
    }

    /// What may have been produced and not recorded before the store was
    /// last closed, if it was not closed cleanly.
    pub(crate) fn in_doubt_window(&self) -> Option<InDoubt> {
        self.in_doubt
    }

    /// What the dispatcher may produce without recording more.
    pub(crate) fn horizon(&self) -> DispatchKey {
        self.meta.horizon().unwrap_or(DispatchKey::MIN)
    }

    /// Which shard of how many the store says it is.
    pub(crate) fn recorded_shard(&self) -> ShardOf {
        ShardOf { shard: self.meta.shard, shards: self.meta.shards }
    }

    pub(crate) fn run(mut self) {
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
            if ops.iter().any(|op| !matches!(op, Op::Tick)) && crate::failpoint::fires("store-writer-panics")
            {
                panic!("fail point store-writer-panics");
            }
            self.round(ops);
            self.shared.metrics.parked.set(self.parking.parked_total as i64);
            if self.commits.failed > 0 {
                if self.closing_since.is_some_and(|since| since.elapsed() > CLOSE_RETRIES_FOR) {
                    self.give_up_on_retries();
                    continue;
                }
                // The store refused a write (disk full, I/O error). Pace the
                // retries of the settles we are keeping instead of spinning.
                // At most ~1 s apart, so a store that has room again is
                // noticed soon.
                let backoff = 50u64 << self.commits.failed.min(4);
                std::thread::sleep(Duration::from_millis(backoff));
            }
        }
        for (id, parked) in std::mem::take(&mut self.parking.parked) {
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
        self.commits.failed = 0;
    }

    /// Records a clean close when nothing was left in doubt, then syncs. A
    /// search for what an earlier unclean stop (or the backup it was
    /// restored from) left in doubt that has not ended, or not begun,
    /// leaves it in doubt still: the next open searches again. (A cluster's
    /// copy of a shard keeps no doubt of its own across a close: whoever
    /// takes the shard searches for what its last owner left, whatever the
    /// copy says.)
    fn close_cleanly(&mut self) {
        let db = Arc::clone(&self.shared.db);
        let copy_of_log = self.config.durability == Durability::Replayed;
        if self.in_doubt.is_some() && (self.marks.held.is_some() || !copy_of_log) {
            tracing::warn!(
                "closed before the search for what the last unclean stop left in doubt ended: it runs \
                 again after the restart"
            );
        } else if self.unresolved == 0 {
            let mut meta = self.meta.clone();
            meta.closed_cleanly = true;
            let mut batch = WriteBatch::default();
            batch.put_cf(cf(&db, schema::CF_CHECKPOINT), schema::meta_key(), schema::encode(&meta));
            if let Err(e) = self.config.durability.write_durably(&db, batch) {
                tracing::error!(error = %e, "recording the clean close failed");
            }
        } else {
            tracing::warn!(
                in_doubt = self.unresolved,
                "closed with produces in doubt: after the restart, messages due by then answer cancel \
                 and reschedule with UNAVAILABLE until they are produced again"
            );
        }
        if let Err(e) = self.config.durability.persist(&db) {
            tracing::error!(
                error = %e,
                "writing the store out at close failed (a cluster store applies its log again, from where it \
                 was last written out, at its next open)"
            );
        }
    }

    /// A store with no WAL: writes its memtables out once the oldest commit
    /// only they hold is [`WRITE_OUT_AFTER`] old, in the background.
    fn write_out_if_old(&mut self) {
        let Some(since) = self.commits.unwritten_since else { return };
        if since.elapsed() >= WRITE_OUT_AFTER || crate::failpoint::fires("store-writes-out-at-once") {
            self.commits.unwritten_since = None;
            if let Err(e) = options::start_flush_all(&self.shared.db) {
                tracing::warn!(error = %e, "writing the store's memtables out failed; trying again later");
                self.commits.unwritten_since = Some(Instant::now());
            }
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
            let touches_settled = !r.replica.settled.is_empty()
                && apply::ids_of(&entry).iter().any(|id| r.replica.settled.contains(id));
            if touches_settled {
                let full = std::mem::replace(&mut r, Round::new(db, self.meta.clone()));
                self.commit(full);
                r = Round::new(db, self.meta.clone());
                if self.commits.failed > 0 {
                    r.reply(
                        reply,
                        Err(StoreError::Io("applying records of the log: a commit failed".into())),
                    );
                    return r;
                }
            }
            r.replica.from_log = true;
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
            Op::Schedule { msg, reply } => match self.schedule(r, msg) {
                Placing::Done(result) => r.reply(reply, result),
                Placing::Wait(held, msg) => self.parking.park(held, Op::Schedule { msg: *msg, reply }),
            },
            Op::ScheduleBatch { msgs, reply } => {
                let half = msgs.len() / 2;
                let results = (0..)
                    .zip(msgs)
                    .map(|(i, msg)| {
                        if i == half && i > 0 {
                            crate::failpoint::hit("store-mid-batch");
                        }
                        match self.schedule(r, msg) {
                            Placing::Done(result) => Batched::Now(result),
                            Placing::Wait(_, msg) => Batched::Alone(msg),
                        }
                    })
                    .collect();
                r.reply(reply, Ok(results));
            }
            Op::Cancel { scope, id, now, only, reply } => {
                match self.cancel(r, &scope, &id, now, only.as_deref()) {
                    Flow::Done(result) => r.reply(reply, result),
                    Flow::Park(held) => self.parking.park(held, Op::Cancel { scope, id, now, only, reply }),
                }
            }
            Op::Reschedule { scope, id, due, reply } => match self.reschedule(r, &scope, &id, due) {
                Flow::Done(result) => r.reply(reply, result),
                Flow::Park(held) => self.parking.park(held, Op::Reschedule { scope, id, due, reply }),
            },
            Op::Settle { settles, floor } => {
                r.chunk.reserve(settles.len());
                for settle in settles {
                    self.settle(r, settle);
                }
                if let Some(floor) = floor {
                    self.raise_floor(r, floor);
                }
            }
            Op::Unpark(ids) => {
                for id in ids {
                    let parked = self.parking.unpark(&id);
                    self.again.extend(parked.into_iter().map(|p| p.op));
                }
            }
            Op::Horizon { until, lower, reply } => {
                r.probe |= if lower { r.meta.lower_horizon(until) } else { r.meta.extend_horizon(until) };
                r.reply(reply, Ok(()));
            }
            Op::ProducingFrom { from, reply } => {
                let was = r.meta.produced_from();
                r.meta.produced_from = was.min(from).encode().to_vec();
                // Written only if it moved (never below the floor).
                r.probe |= r.meta.produced_from() != was;
                r.reply(reply, Ok(()));
            }
            Op::Mark { topic, ends, reply } => {
                self.set_marks(r, &topic, ends);
                r.reply(reply, Ok(()));
            }
            Op::Rows { rows, reply } => {
                for row in rows {
                    r.put_row(row);
                }
                r.reply(reply, Ok(()));
            }
            Op::InDoubt(ids) => {
                self.unresolved += ids.len();
                for id in ids {
                    for p in self.parking.unpark(&id) {
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
                Flow::Park(held) => self.parking.park(held, Op::Decide { intent, reply }),
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
            Op::Doubt { window, marks_wait } => {
                self.in_doubt = window;
                if window.is_none() {
                    self.release_marks(r);
                } else if marks_wait {
                    self.marks.held.get_or_insert_with(HeldMarks::default);
                }
            }
            Op::Apply { entries, reply } => {
                let db = r.db;
                let round = std::mem::replace(r, Round::new(db, self.meta.clone()));
                *r = self.apply_log(db, round, entries, reply);
            }
            Op::Tick => {
                self.parking.expire_parked();
                self.write_out_if_old();
            }
            Op::Close => {
                self.closing_since = Some(Instant::now());
                self.rx.close();
            }
        }
    }

    fn commit(&mut self, mut r: Round) {
        let chunk_last = r.log_chunk();
        r.write_marks();
        // An entry this round left where it was (a retry whose record
        // could not be read) or put in is pending: the floor waits for it,
        // and never goes below where it was.
        if let Some(left) = r.added.entries.iter().map(|(key, _)| *key).min()
            && left < r.meta.floor()
        {
            let floor = left.max(self.meta.floor());
            r.meta.floor = floor.encode().to_vec();
            // It may be produced again: the search after a crash covers it.
            if r.meta.produced_from() > floor {
                r.meta.produced_from = floor.encode().to_vec();
            }
        }
        let writes = !r.batch.is_empty() || r.probe;
        let result = if !writes {
            Ok(())
        } else {
            let checkpoint = cf(&self.shared.db, schema::CF_CHECKPOINT);
            for (key, counts) in &r.counts {
                r.batch.put_cf(checkpoint, key.encode(), schema::encode(counts));
            }
            r.batch.put_cf(checkpoint, schema::meta_key(), schema::encode(&r.meta));
            let opts = self.config.durability.write_options();
            let batch = std::mem::take(&mut r.batch);
            let started = std::time::Instant::now();
            let written = self.shared.db.write_opt(batch, &opts);
            metrics::STORE_COMMIT_SECONDS.observe(started.elapsed().as_secs_f64());
            written.map_err(StoreError::from)
        };
        let claims = Arc::clone(&self.shared.claims);
        for id in &r.claims.reserved {
            claims.release(id);
        }
        let error = result.err();
        match &error {
            None => {
                self.commits.failed = 0;
                if writes && self.config.durability == Durability::Replayed {
                    self.commits.unwritten_since.get_or_insert_with(Instant::now);
                }
                if chunk_last.is_some() {
                    self.chunk_high = chunk_last;
                }
                // A walk that started at or below an entry this round
                // settled or removed may have read it as pending.
                let highest = r.produced.settles.iter().map(|s| s.key).max().max(r.claims.highest_removed);
                if !r.replica.from_log {
                    self.shared.wake.recorded(r.produced.settles.len());
                }
                claims.release_settled(&r.claims.released, &r.claims.unheld, highest);
                self.shared.wake.record_floor(r.meta.floor());
                self.shared.wake.record_produced_from(r.meta.produced_from());
                let released = std::mem::take(&mut r.claims.released);
                let had_unheld = !r.claims.unheld.is_empty();
                for id in released.into_iter().chain(std::mem::take(&mut r.claims.unheld)) {
                    let parked = self.parking.unpark(&id);
                    self.again.extend(parked.into_iter().map(|p| p.op));
                }
                r.effects.record();
                let cached: Vec<_> = r.watched.drain(..).filter(|row| row.table.cached()).collect();
                if !cached.is_empty() {
                    crate::store::policy::publish(&self.shared.policies, cached);
                }
                self.shared.pending.store(r.meta.pending, Ordering::Relaxed);
                self.shared.log_next.store(r.meta.log_next, Ordering::Release);
                self.shared.log_owner.store(r.meta.log_owner, Ordering::Release);
                self.shared.log_time.store(r.meta.log_time_ms, Ordering::Release);
                self.shared.metrics.pending.set(r.meta.pending as i64);
                self.meta = r.meta;
                self.counts.extend(r.counts.drain());
                self.shared.wake.runs().committed(std::mem::take(&mut r.added.runs));
                self.handed.extend(self.shared.wake.added(&r.added.entries));
                // What the dispatcher found held may go now.
                if !r.claims.reserved.is_empty() || had_unheld {
                    self.shared.wake.poke();
                }
                // Only a commit that wrote says whether writes work.
                if writes {
                    self.report_capacity();
                }
            }
            Some(e) => {
                self.commits.failed = self.commits.failed.saturating_add(1);
                tracing::error!(error = %e, "store commit failed; nothing in it was acknowledged");
                self.shared.health.set_writes(StoreHealth::Failing(e.to_string()));
                // Produces that happened must still be recorded: keep their
                // claims and settle them again. Everything else stays as it
                // was; the dispatcher looks again at what the writer held.
                for id in std::mem::take(&mut r.replica.holding) {
                    self.unhold(&id);
                }
                // The marks it set or raised were not written: forgotten,
                // so that the settles tried again (or the dispatcher's next
                // mark) write them. Until then a search reads from the
                // mark on disk, lower or none: more, never less.
                for partition in r.produced.marks.keys() {
                    self.marks.set.remove(partition);
                }
                let retried: HashSet<MessageId> = r.produced.settles.iter().map(|s| s.id.clone()).collect();
                for id in
                    std::mem::take(&mut r.claims.released).into_iter().filter(|id| !retried.contains(id))
                {
                    claims.release(&id);
                    let parked = self.parking.unpark(&id);
                    self.again.extend(parked.into_iter().map(|p| p.op));
                }
                for id in std::mem::take(&mut r.claims.unheld) {
                    claims.unhold(&id);
                    let parked = self.parking.unpark(&id);
                    self.again.extend(parked.into_iter().map(|p| p.op));
                }
                if !r.replica.from_log && (!r.produced.settles.is_empty() || r.produced.floor.is_some()) {
                    self.again.push_back(Op::Settle {
                        settles: std::mem::take(&mut r.produced.settles),
                        floor: r.produced.floor,
                    });
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
