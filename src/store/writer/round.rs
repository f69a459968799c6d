//! A round: everything one commit of the writer changes ([`Round`]), the
//! writes it batches, the answers it holds back until the commit, and what
//! it did, for the metrics ([`Effects`]).

use std::{cell::RefCell, sync::Arc, time::Duration};

use rocksdb::{DB, WriteBatch};

use super::ops::Reply;
use crate::{
    command::{Row, RowValue, Settle, Spread, Table},
    message::{Matching, MessageId, UnixMillis},
    metrics,
    store::{
        StoreError,
        claims::{Claims, Floor},
        options::cf,
        read,
        runs::RoundRuns,
        schema::{
            self, Counts, CountsKey, DeliveryLine, DeliveryLog, DispatchKey, MessageRecord, Meta, Settlement,
            TriesRecord,
        },
        view,
    },
};

/// A message as read for a change: its record and what happened to it.
#[derive(Clone)]
pub(super) struct Stored {
    pub(super) record: MessageRecord,
    pub(super) settlement: Option<Settlement>,
}

impl Stored {
    /// Whether it is still what a change was asked of (none: anything).
    pub(super) fn still_matches(&self, only: Option<&Matching>) -> bool {
        only.is_none_or(|m| m.holds(&self.record.topic, &view::labels_of(self.record.labels.clone())))
    }
}

/// Everything one round changes, committed together or not at all.
pub(super) struct Round<'a> {
    pub(super) db: &'a DB,
    pub(super) batch: WriteBatch,
    pub(super) meta: Meta,
    /// Counts entries this round changes, with their new values.
    pub(super) counts: foldhash::HashMap<CountsKey, Counts>,
    /// Messages changed earlier in this round, as they will be after commit.
    pub(super) overlay: foldhash::HashMap<MessageId, Option<Stored>>,
    /// Claims this round ends at its commit.
    pub(super) claims: RoundClaims,
    /// What this round records of the dispatcher's produces.
    pub(super) produced: Produced,
    /// Due entries this round adds.
    pub(super) added: Added,
    /// First-try deliveries this round logs as one chunk.
    pub(super) chunk: Vec<DeliveryLine>,
    pub(super) replies: Vec<DeferredReply>,
    pub(super) effects: Effects,
    /// Rows this round writes of cached tables (their watchers are told
    /// once it commits) and of tables every shard keeps (a later change in
    /// the same round is compared with them).
    pub(super) watched: Vec<Row>,
    /// Commit even when nothing changed: a probe.
    pub(super) probe: bool,
    /// A replica of a log (cluster mode): what applying it in this round did.
    pub(super) replica: ReplicaRound,
    /// Delivery logs this round read, decoded: none changes before the
    /// round commits.
    pub(super) delivery_logs: RefCell<read::DeliveryLogs>,
}

/// The due entries a round adds: those behind the dispatcher are handed
/// to it, and where one topic's lie in a row is remembered (see
/// [`crate::store::runs`]).
pub(super) struct Added {
    pub(super) entries: Vec<(DispatchKey, MessageId)>,
    pub(super) runs: RoundRuns,
}

/// What a round records of the dispatcher's produces: tried again if the
/// commit fails, since the produces happened.
#[derive(Default)]
pub(super) struct Produced {
    pub(super) settles: Vec<Settle>,
    /// The dispatcher's floor this round records, sent again with them.
    pub(super) floor: Option<Floor>,
    /// The marks of target partitions this round sets or raises, as they
    /// will be: one write per partition at the commit, not one per
    /// delivery that raises it. Forgotten if the commit fails, so that
    /// the settles tried again write them.
    pub(super) marks: foldhash::HashMap<(Arc<str>, i32), i64>,
}

/// The claims a round ends at its commit: those it reserved for its own
/// changes, and those it releases once its commit is in.
pub(super) struct RoundClaims {
    pub(super) reserved: foldhash::HashSet<MessageId>,
    pub(super) released: Vec<MessageId>,
    /// This node's holds on ids whose changes the round applies: only the
    /// writer's own claim on them goes at the commit.
    pub(super) unheld: Vec<MessageId>,
    /// The highest due entry this round removes (a cancel, a move, a
    /// replace): a walk of the due index that started at or below it may
    /// have read it, and must check what it claims.
    pub(super) highest_removed: Option<DispatchKey>,
}

/// A replica of a log (cluster mode): what applying it in a round did.
pub(super) struct ReplicaRound {
    /// Cluster mode: messages settled by records this round applies.
    pub(super) settled: foldhash::HashSet<MessageId>,
    /// Records of the log are applied: a failed commit is applied again
    /// from the log, not retried here.
    pub(super) from_log: bool,
    /// Cluster mode: ids this round forgets and holds until their
    /// tombstones are applied; let go if the commit fails.
    pub(super) holding: Vec<MessageId>,
}

#[derive(Default)]
pub(super) struct Effects {
    pub(super) scheduled: u64,
    /// Of those scheduled, the ones that replaced a message under their id.
    pub(super) replaced: u64,
    pub(super) cancelled: u64,
    pub(super) failed: u64,
    pub(super) expired: u64,
    pub(super) dead_lettered: u64,
    pub(super) purged: u64,
    /// Lateness (delivered-at minus due) of each delivery.
    pub(super) delivered: Vec<Duration>,
}

/// An answer held back until its round commits; it receives the commit's error.
pub(super) type DeferredReply = Box<dyn FnOnce(Option<&StoreError>) + Send>;

impl<'a> Round<'a> {
    pub(super) fn new(db: &'a DB, meta: Meta) -> Self {
        let fresh_from = meta.next_seq;
        Round {
            db,
            batch: WriteBatch::default(),
            meta,
            counts: foldhash::HashMap::default(),
            overlay: foldhash::HashMap::default(),
            claims: RoundClaims {
                reserved: foldhash::HashSet::default(),
                released: Vec::new(),
                unheld: Vec::new(),
                highest_removed: None,
            },
            produced: Produced::default(),
            added: Added { entries: Vec::new(), runs: RoundRuns::new(fresh_from) },
            chunk: Vec::new(),
            replies: Vec::new(),
            effects: Effects::default(),
            watched: Vec::new(),
            probe: false,
            replica: ReplicaRound {
                settled: foldhash::HashSet::default(),
                from_log: false,
                holding: Vec::new(),
            },
            delivery_logs: RefCell::default(),
        }
    }

    pub(super) fn reply<T: Send + 'static>(&mut self, tx: Reply<T>, result: Result<T, StoreError>) {
        self.replies.push(Box::new(move |commit_error: Option<&StoreError>| {
            let _ = tx.send(match commit_error {
                Some(e) => Err(e.clone()),
                None => result,
            });
        }));
    }

    pub(super) fn reserve(&mut self, claims: &Claims, id: &MessageId) -> bool {
        if claims.reserve_for_writer(id) {
            self.claims.reserved.insert(id.clone());
            true
        } else {
            false
        }
    }

    pub(super) fn put_message(&mut self, id: &MessageId, record: &MessageRecord) {
        self.batch.put_cf(cf(self.db, schema::CF_MESSAGES), id.as_bytes(), schema::encode(record));
    }

    /// Puts a due entry holding the message whole.
    pub(super) fn put_due(
        &mut self,
        key: DispatchKey,
        id: &MessageId,
        record: &MessageRecord,
        tries: Option<&TriesRecord>,
    ) {
        let entry = schema::encode_due_parts(id.as_bytes(), record, tries);
        self.batch.put_cf(cf(self.db, schema::CF_DUE), key.encode(), entry);
        self.added.runs.put(key, id, &record.topic);
        self.added.entries.push((key, id.clone()));
    }

    /// Writes this round's first-try deliveries as one chunk's delivery
    /// log; returns its last dispatch key.
    pub(super) fn log_chunk(&mut self) -> Option<DispatchKey> {
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
    pub(super) fn take_out(
        &mut self,
        id: &MessageId,
        key: DispatchKey,
        mut record: MessageRecord,
    ) -> MessageRecord {
        self.delete_due(key);
        if record.is_locator() {
            record.entry_at_ms = None;
            self.put_message(id, &record);
        }
        record
    }

    pub(super) fn delete_due(&mut self, key: DispatchKey) {
        self.batch.delete_cf(cf(self.db, schema::CF_DUE), key.encode());
        self.claims.highest_removed = self.claims.highest_removed.max(Some(key));
    }

    /// Writes a row of a table, and moves its wake.
    pub(super) fn put_row(&mut self, row: Row) {
        let checkpoint = cf(self.db, schema::CF_CHECKPOINT);
        if let Some(old) = row.old_wake {
            self.batch.delete_cf(checkpoint, schema::wake_key(row.table, old, &row.key));
        }
        match &row.value {
            RowValue::Put(bytes) => {
                self.batch.put_cf(checkpoint, schema::row_key(row.table, &row.key), bytes)
            }
            RowValue::Delete => self.batch.delete_cf(checkpoint, schema::row_key(row.table, &row.key)),
            RowValue::Keep => {}
        }
        if let Some(wake) = row.wake {
            self.batch.put_cf(checkpoint, schema::wake_key(row.table, wake, &row.key), []);
        }
        if row.table.cached() || row.table.spread() == Spread::Everywhere {
            self.watched.push(row);
        }
    }

    /// What this round writes of row `key` of `table`, if it writes it
    /// (the latest write) and the table is one every shard keeps.
    pub(super) fn written(&self, table: Table, key: &[u8]) -> Option<&RowValue> {
        self.watched.iter().rev().find(|row| row.table == table && row.key == key).map(|row| &row.value)
    }

    pub(super) fn put_mark(&mut self, topic: &Arc<str>, partition: i32, offset: i64) {
        self.produced.marks.insert((Arc::clone(topic), partition), offset);
    }

    /// Writes the marks this round set or raised.
    pub(super) fn write_marks(&mut self) {
        let checkpoint = cf(self.db, schema::CF_CHECKPOINT);
        for ((topic, partition), offset) in &self.produced.marks {
            self.batch.put_cf(checkpoint, schema::mark_key(topic, *partition), offset.to_be_bytes());
        }
    }

    pub(super) fn put_settlement(&mut self, id: &MessageId, s: &Settlement) {
        self.batch.put_cf(cf(self.db, schema::CF_CHECKPOINT), schema::settlement_key(id), schema::encode(s));
    }

    pub(super) fn delete_settlement(&mut self, id: &MessageId) {
        self.batch.delete_cf(cf(self.db, schema::CF_CHECKPOINT), schema::settlement_key(id));
    }

    pub(super) fn delete_retention(&mut self, at: UnixMillis, id: &MessageId) {
        self.batch.delete_cf(cf(self.db, schema::CF_CHECKPOINT), schema::retention_key(at, id));
    }

    /// Records a final state (delivered, cancelled, failed) and starts its
    /// retention clock.
    pub(super) fn settle(&mut self, id: &MessageId, settlement: &Settlement, at: UnixMillis) {
        self.put_settlement(id, settlement);
        self.start_retention(at, id);
        self.meta.pending = self.meta.pending.saturating_sub(1);
    }

    /// Starts the retention clock of a message settled at `at`.
    pub(super) fn start_retention(&mut self, at: UnixMillis, id: &MessageId) {
        self.batch.put_cf(cf(self.db, schema::CF_CHECKPOINT), schema::retention_key(at, id), []);
    }
}

impl Effects {
    pub(super) fn record(&self) {
        metrics::SCHEDULED.inc_by(self.scheduled);
        metrics::REPLACED.inc_by(self.replaced);
        metrics::CANCELLED.inc_by(self.cancelled);
        metrics::FAILED.inc_by(self.failed);
        metrics::EXPIRED.inc_by(self.expired);
        metrics::DEAD_LETTERED.inc_by(self.dead_lettered);
        metrics::PURGED.inc_by(self.purged);
        metrics::DELIVERED.inc_by(self.delivered.len() as u64);
        let lateness = metrics::LATENESS.local();
        for late in &self.delivered {
            lateness.observe(late.as_secs_f64());
        }
        lateness.flush();
    }
}
