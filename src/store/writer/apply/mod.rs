//! Cluster mode: the store as a view of its shard's log partition.
//!
//! Two steps, both on the writer thread:
//!
//! - **Decide** ([`Intent`] → [`Decision`]): the shard's owner checks a
//!   caller's change against the store as it is, before anything is logged.
//!   What needs no change (a retried schedule, a cancel of what was
//!   delivered) is answered at once. A change to log holds its message:
//!   until the record is applied, the dispatcher does not take it and
//!   another change to it waits, so that applying the record does what was
//!   decided.
//! - **Apply** ([`LogEntry`] → [`Answer`]): a record read from the
//!   partition, in offset order. What it does depends on the store alone,
//!   never on claims or clocks, so every node that applies a partition
//!   reaches the same state. The offset after the last record applied is
//!   written in the same batch ([`Meta::log_next`]): after a crash, applying
//!   resumes there, and no record is applied twice.

use std::sync::{Arc, Mutex};

use super::{
    change::Flow,
    replica::{Local, LogEntry, Proposed, Replica, SettledLine},
    round::{Round, Stored},
    settle::produced_settlement,
    state::Writer,
};
use crate::{
    command::{Answer, Handed, Intent, NewId, NewMessage, Outcome, Row, RowValue, Settle, Spread, Tries},
    message::{
        CancelOutcome, Matching, MessageId, OnConflict, Placed, RescheduleRefusal, Scheduled, Scope,
        UnixMillis,
    },
    store::{
        StoreError,
        options::cf,
        schema::{self, MessageRecord, Settlement, SettlementKind},
        view,
    },
};

/// An intent of a batch: decided, or handed back because its message is
/// held by a change under way (decide it alone: it waits for that one).
#[derive(Debug)]
pub enum Decided {
    Now(Result<Decision, StoreError>),
    Wait(Intent),
}

/// What the owner does with an [`Intent`].
#[derive(Debug)]
pub enum Decision {
    /// Answered from the store as it is: nothing to log.
    Answer(Answer),
    /// Log this change of message `id`; `held`: the message it holds until
    /// the record is applied (or [`Store::unhold`](crate::store::Store::unhold)
    /// says it never will be).
    Log { id: MessageId, change: Box<Proposed>, held: Option<Hold> },
}

/// A decided change's hold on its message, from the decision until its
/// record is queued for the log ([`Hold::into_id`]: from then on, applying
/// the record lets go of it). A hold dropped before that, because its
/// caller went away, is let go of by the writer at its next round, so that
/// the message does not stay held with no record to release it.
#[derive(Debug)]
pub struct Hold {
    id: Option<MessageId>,
    dropped: Arc<Mutex<Vec<MessageId>>>,
}

impl Hold {
    /// The message held, now held until the record is applied.
    pub fn into_id(mut self) -> MessageId {
        self.id.take().expect("a hold names its message until taken")
    }

    pub fn id(&self) -> &MessageId {
        self.id.as_ref().expect("a hold names its message until taken")
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.dropped.lock().unwrap_or_else(|e| e.into_inner()).push(id);
        }
    }
}

impl Writer {
    pub(super) fn decide(&mut self, r: &mut Round, intent: &Intent) -> Flow<Decision> {
        match intent {
            Intent::Schedule(msg) => self.decide_schedule(r, msg),
            Intent::Cancel { scope, id, now, only } => {
                self.decide_cancel(r, scope, id, *now, only.as_deref())
            }
            Intent::Reschedule { scope, id, due } => self.decide_reschedule(r, scope, id, *due),
        }
    }

    fn decide_schedule(&mut self, r: &mut Round, msg: &NewMessage) -> Flow<Decision> {
        let answer = |result| Flow::Done(Ok(Decision::Answer(Answer::Scheduled(result))));
        let id = match &msg.id {
            NewId::Client(id) => {
                if self.replica.holds.contains(id) {
                    return Flow::Park(id.clone());
                }
                match self.find(r, &msg.scope, id) {
                    Ok(Some((found, existing))) => {
                        if existing.record.is_same_request(&msg.envelope, msg.requested) {
                            let due = existing.record.due();
                            return answer(Ok(Scheduled { id: found, due, placed: Placed::Duplicate }));
                        }
                        return match msg.on_conflict {
                            OnConflict::Reject => answer(Err(StoreError::IdConflict(found))),
                            OnConflict::Replace => self.decide_replace(r, found, &existing, msg),
                        };
                    }
                    Ok(None) => {}
                    Err(e) => return Flow::Done(Err(e)),
                }
                Some(id)
            }
            NewId::Generated(_) => None,
        };
        if self.at_capacity(r.meta.pending) {
            return answer(Err(StoreError::AtCapacity { pending: r.meta.pending }));
        }
        // A second schedule of this id waits for this one to be applied,
        // and is then answered as a retry (or a conflict).
        let held = id.map(|id| {
            self.replica.holds.insert(id.clone());
            self.hold(id.clone())
        });
        let record = MessageRecord::new(msg.envelope.clone(), msg.requested, msg.due, 0, msg.now);
        let fresh = matches!(msg.id, NewId::Generated(_));
        Flow::Done(Ok(Decision::Log {
            id: msg.id.id().clone(),
            change: Box::new(Proposed::Schedule { record, fresh }),
            held,
        }))
    }

    /// A schedule in place of the message `existing` of `id`: logged as a
    /// schedule of the id, which every copy applies as a replace.
    fn decide_replace(
        &mut self,
        r: &mut Round,
        id: MessageId,
        existing: &Stored,
        msg: &NewMessage,
    ) -> Flow<Decision> {
        if !self.shared.claims.reserve_for_writer(&id) {
            return Flow::Park(id);
        }
        self.replica.holds.insert(id.clone());
        if let Err(refusal) = self.replaceable(r, &id, existing) {
            self.unhold(&id);
            return Flow::Done(Ok(Decision::Answer(Answer::Scheduled(Err(refusal)))));
        }
        let record = MessageRecord::new(msg.envelope.clone(), msg.requested, msg.due, 0, msg.now);
        Flow::Done(Ok(Decision::Log {
            id: id.clone(),
            change: Box::new(Proposed::Schedule { record, fresh: false }),
            held: Some(self.hold(id)),
        }))
    }

    /// The message `id` names for `scope`, held for a change: the
    /// dispatcher's claim and other changes' holds are waited for.
    fn find_and_hold(
        &mut self,
        r: &Round,
        scope: &Scope,
        id: &MessageId,
    ) -> Flow<Option<(MessageId, Stored)>> {
        let (id, stored) = match self.find(r, scope, id) {
            Ok(Some(found)) => found,
            Ok(None) => return Flow::Done(Ok(None)),
            Err(e) => return Flow::Done(Err(e)),
        };
        if self.replica.holds.contains(&id) || !self.shared.claims.reserve_for_writer(&id) {
            return Flow::Park(id);
        }
        self.replica.holds.insert(id.clone());
        Flow::Done(Ok(Some((id, stored))))
    }

    /// Lets go of a hold taken for a change that will not be logged.
    pub(super) fn unhold(&mut self, id: &MessageId) {
        if self.replica.holds.remove(id) {
            self.shared.claims.unhold(id);
            // The dispatcher may have found it held: it looks again.
            self.shared.wake.poke();
            let parked = self.parking.unpark(id);
            self.again.extend(parked.into_iter().map(|p| p.op));
        }
    }

    fn decide_cancel(
        &mut self,
        r: &mut Round,
        scope: &Scope,
        id: &MessageId,
        now: UnixMillis,
        only: Option<&Matching>,
    ) -> Flow<Decision> {
        let answer = |result| Flow::Done(Ok(Decision::Answer(Answer::Cancelled(result))));
        let (id, stored) = match self.find_and_hold(r, scope, id) {
            Flow::Done(Ok(Some(found))) => found,
            Flow::Done(Ok(None)) => return answer(Ok(CancelOutcome::NotFound)),
            Flow::Done(Err(e)) => return Flow::Done(Err(e)),
            Flow::Park(held) => return Flow::Park(held),
        };
        if !stored.still_matches(only) {
            // Changed since it was found by its labels.
            self.unhold(&id);
            return answer(Ok(CancelOutcome::NotFound));
        }
        if let Err(outcome) = view::state_of(stored.settlement.as_ref()).cancel() {
            self.unhold(&id);
            return answer(Ok(outcome));
        }
        if self.in_doubt(&stored) {
            self.unhold(&id);
            return answer(Err(StoreError::Dispatching(id)));
        }
        match self.whole_record(r, &id) {
            Ok(record) => Flow::Done(Ok(Decision::Log {
                id: id.clone(),
                change: Box::new(Proposed::Cancel { record, at: now }),
                held: Some(self.hold(id)),
            })),
            Err(e) => {
                self.unhold(&id);
                Flow::Done(Err(e))
            }
        }
    }

    /// The guard of a hold just taken on `id`.
    fn hold(&self, id: MessageId) -> Hold {
        Hold { id: Some(id), dropped: Arc::clone(&self.shared.dropped_holds) }
    }

    fn decide_reschedule(
        &mut self,
        r: &mut Round,
        scope: &Scope,
        id: &MessageId,
        due: UnixMillis,
    ) -> Flow<Decision> {
        let answer = |result| Flow::Done(Ok(Decision::Answer(Answer::Rescheduled(result))));
        let (id, stored) = match self.find_and_hold(r, scope, id) {
            Flow::Done(Ok(Some(found))) => found,
            Flow::Done(Ok(None)) => return answer(Err(StoreError::NotFound(id.clone()))),
            Flow::Done(Err(e)) => return Flow::Done(Err(e)),
            Flow::Park(held) => return Flow::Park(held),
        };
        let state = view::state_of(stored.settlement.as_ref());
        let refusal = match state.reschedule() {
            Err(RescheduleRefusal::AlreadyDelivered) => Some(StoreError::AlreadyDelivered(id.clone())),
            Err(RescheduleRefusal::AlreadyCancelled) => Some(StoreError::AlreadyCancelled(id.clone())),
            Ok(()) if state.is_pending() && self.in_doubt(&stored) => {
                Some(StoreError::Dispatching(id.clone()))
            }
            Ok(()) if !state.is_pending() && self.at_capacity(r.meta.pending) => {
                Some(StoreError::AtCapacity { pending: r.meta.pending })
            }
            Ok(()) => None,
        };
        if let Some(refusal) = refusal {
            self.unhold(&id);
            return answer(Err(refusal));
        }
        match self.whole_record(r, &id) {
            Ok(mut record) => {
                // The due time as first asked for stays what it was.
                (record.requested_at_ms, record.requested_delay_ms) = record.requested().stored();
                record.due_ms = due.0;
                Flow::Done(Ok(Decision::Log {
                    id: id.clone(),
                    change: Box::new(Proposed::Reschedule { record }),
                    held: Some(self.hold(id)),
                }))
            }
            Err(e) => {
                self.unhold(&id);
                Flow::Done(Err(e))
            }
        }
    }

    /// The message `id` whole, as a log record carries it.
    fn whole_record(&self, r: &Round, id: &MessageId) -> Result<MessageRecord, StoreError> {
        self.whole(r, id)?.ok_or_else(|| StoreError::NotFound(id.clone()))
    }
}

/// Whether `stored` is the message `record` carries, pending and untried:
/// what parking `record` would make.
fn untried_as(stored: &Stored, record: &MessageRecord) -> bool {
    stored.settlement.is_none() && stored.record.due_ms == record.due_ms && same_message(stored, record)
}

/// Whether `stored` holds the message `record` carries (its due time
/// aside).
fn same_message(stored: &Stored, record: &MessageRecord) -> bool {
    stored.record.scheduled_at_ms == record.scheduled_at_ms
        && stored.record.is_same_request(&record.envelope(), record.requested())
}

/// The messages an entry changes.
pub(super) fn ids_of(entry: &LogEntry) -> Vec<MessageId> {
    match &entry.change {
        Replica::Schedule { id, .. }
        | Replica::Reschedule { id, .. }
        | Replica::Cancel { id, .. }
        | Replica::Fail { id, .. }
        | Replica::Forget(id) => vec![id.clone()],
        Replica::Settled { ids, .. } => match &entry.local {
            Some(Local::Settles(settles, _)) => settles.iter().map(|s| s.id.clone()).collect(),
            _ => ids.iter().filter_map(|id| MessageId::from_stored(id)).collect(),
        },
        Replica::Owner { .. }
        | Replica::Marks { .. }
        | Replica::ForgetChunk(_)
        | Replica::Row(_)
        | Replica::ForgetRow(..)
        | Replica::Skip => Vec::new(),
    }
}

impl Writer {
    /// Applies one record; the partition's next offset moves past it only
    /// if it applied.
    pub(super) fn apply_entry(&mut self, r: &mut Round, e: LogEntry) -> Result<Answer, StoreError> {
        let LogEntry { offset, at, writer, change, local } = e;
        if let Some(Local::Held(id)) = &local {
            // Released with this commit; changes waiting on it run then.
            self.replica.holds.remove(id);
            r.claims.unheld.push(id.clone());
        }
        // A delivery raises a mark only if the shard's owner sent it: one
        // fenced by a later claim may have delivered after records of the
        // new owner still unrecorded.
        let from_owner = writer == Some(r.meta.log_owner);
        let decided_here = matches!(local, Some(Local::Held(_)));
        let answer = self.apply_change(r, change, local, from_owner)?;
        // A change this node decided, applied after another node claimed
        // the shard (or this one let go): every copy applies it, but the
        // new owner's dispatcher may have taken the message first, so what
        // it came to is that node's to say, not an outcome to answer here.
        let answer = if decided_here && !from_owner { answer.superseded() } else { answer };
        r.meta.log_next = offset + 1;
        // Only hourglass's own records tell the log's time: a Kafka-native
        // record's timestamp is whatever its producer set.
        if writer.is_some() {
            r.meta.log_time_ms = at.0;
        }
        Ok(answer)
    }

    fn apply_change(
        &mut self,
        r: &mut Round,
        change: Replica,
        local: Option<Local>,
        from_owner: bool,
    ) -> Result<Answer, StoreError> {
        Ok(match change {
            Replica::Owner { writer, released } => {
                // A release by a node that is not the owner (it was fenced
                // by a later claim) changes nothing.
                if !released {
                    r.meta.log_owner = writer;
                } else if r.meta.log_owner == writer {
                    r.meta.log_owner = 0;
                }
                Answer::None
            }
            Replica::Schedule { id, record, fresh } => {
                Answer::Scheduled(self.apply_schedule(r, id, record, fresh))
            }
            Replica::Reschedule { id, record } => Answer::Rescheduled(self.apply_reschedule(r, id, record)),
            Replica::Cancel { id, record, at } => Answer::Cancelled(self.apply_cancel(r, &id, record, at)),
            Replica::Settled { chunk, ids, lines } => {
                // Kept until the owner tombstones the chunk: once its
                // retention ended and its messages are forgotten.
                let ids = schema::LogChunk { ids };
                r.batch.put_cf(self.checkpoint(), schema::log_chunk_key(&chunk), schema::encode(&ids));
                match local {
                    Some(Local::Settles(settles, floor)) => {
                        for mut settle in settles {
                            if !from_owner {
                                settle.handed = Handed::Alone;
                            }
                            self.apply_own_settle(r, settle)?;
                        }
                        if let Some(floor) = floor {
                            self.raise_floor(r, floor);
                        }
                    }
                    _ => {
                        for line in lines {
                            self.apply_settled_line(r, line, from_owner)?;
                        }
                    }
                }
                Answer::None
            }
            Replica::Fail { id, reason, at, record } => {
                // A refused Kafka-native record is counted and logged by the
                // shard's owner, where it is read (the cluster's applier);
                // here it is only recorded.
                self.apply_failed(r, &id, &reason, at, record)?;
                Answer::None
            }
            Replica::Marks { topic, ends } => {
                self.set_marks(r, &topic, ends);
                Answer::None
            }
            Replica::Forget(id) => {
                self.forget(r, &id)?;
                // The owner held the id from its purge to here.
                if self.replica.holds.remove(&id) {
                    r.claims.unheld.push(id);
                }
                Answer::None
            }
            Replica::ForgetChunk(chunk) => {
                r.batch.delete_cf(self.checkpoint(), schema::log_chunk_key(&chunk));
                Answer::None
            }
            Replica::Row(row) => Answer::Rows(match row.table.spread() {
                Spread::Shard if from_owner || !row.table.fenced() => {
                    r.put_row(row);
                    Ok(())
                }
                // Written by a node the log no longer names the owner: its
                // driver or call decided from a row the owner may have
                // changed since. Every copy leaves it out alike.
                Spread::Shard => Err(StoreError::LogUnavailable(format!(
                    "the shard moved to another node while {} was changed; retry",
                    row.table.describe(&row.key)
                ))),
                Spread::Everywhere => self.later_row(r, row)?,
            }),
            Replica::ForgetRow(table, key) => {
                r.batch.delete_cf(self.checkpoint(), schema::row_key(table, &key));
                Answer::None
            }
            Replica::Skip => Answer::None,
        })
    }

    /// A message's latest record says all there is of it, as compaction
    /// keeps only that one: a schedule parks the message it carries,
    /// whatever the store held of the id, in its place. (A schedule of a
    /// taken id reaches the log as a replace the owner decided, or when two
    /// nodes own the shard at once, or a record is written again: the owner
    /// answers a retry or a conflict without logging anything.) One that
    /// finds the very message already pending, untried, changes nothing: a
    /// retry.
    fn apply_schedule(
        &mut self,
        r: &mut Round,
        id: MessageId,
        record: MessageRecord,
        fresh: bool,
    ) -> Result<Scheduled, StoreError> {
        let due = record.due();
        if !fresh && let Some(existing) = self.load(r, &id)? {
            if untried_as(&existing, &record) {
                return Ok(Scheduled { id, due, placed: Placed::Duplicate });
            }
            self.put_in_place(r, &id, existing, record);
            return Ok(Scheduled { id, due, placed: Placed::Replaced });
        }
        // Seen by what follows in this round (its settle, say), fresh or not.
        self.park_new(r, &id, record, true);
        Ok(Scheduled { id, due, placed: Placed::Created })
    }

    /// A reschedule carries its message whole: it is parked at the record's
    /// due time, whatever the store held of the id (a pending message moves;
    /// a failed one is armed again; one whose earlier records compaction
    /// dropped is parked).
    fn apply_reschedule(
        &mut self,
        r: &mut Round,
        id: MessageId,
        record: MessageRecord,
    ) -> Result<UnixMillis, StoreError> {
        let due = record.due();
        match self.load(r, &id)? {
            // The same message, untried: moving it is what parking it anew
            // would make.
            Some(stored) if stored.settlement.is_none() && same_message(&stored, &record) => {
                self.touched(&id);
                self.move_to(r, id, stored, due);
                return Ok(due);
            }
            Some(stored) => {
                // Re-driven: out of the count of what it was.
                if let Some(s) = &stored.settlement {
                    self.uncount_redriven(r, &id, &stored.record.topic, s.kind());
                }
                self.discard(r, &id, stored)
            }
            None => {}
        }
        self.park_new(r, &id, record, true);
        Ok(due)
    }

    /// A cancel carries its message whole: it is recorded as cancelled at
    /// `at`, whatever the store held of the id, except that a delivery that
    /// comes after it wins (see [`Self::apply_settled_line`]).
    fn apply_cancel(
        &mut self,
        r: &mut Round,
        id: &MessageId,
        record: Option<MessageRecord>,
        at: UnixMillis,
    ) -> Result<CancelOutcome, StoreError> {
        let stored = self.load(r, id)?;
        let Some(record) = record else {
            // No message to record (none is written now): a pending one
            // is cancelled as it is.
            return Ok(match stored {
                Some(stored) if view::state_of(stored.settlement.as_ref()).is_pending() => {
                    self.touched(id);
                    self.cancel_pending(r, id, stored, at);
                    CancelOutcome::Cancelled
                }
                Some(stored) => view::state_of(stored.settlement.as_ref())
                    .cancel()
                    .err()
                    .unwrap_or(CancelOutcome::Cancelled),
                None => CancelOutcome::NotFound,
            });
        };
        // What the store holds after it is what the answer says: a cancel
        // that finds the message settled otherwise (two nodes owned the
        // shard at once) records it as cancelled all the same, as a copy
        // built from the compacted log, which keeps only this record of
        // the id, would.
        let outcome = match &stored {
            Some(s)
                if matches!(
                    view::state_of(s.settlement.as_ref()).cancel(),
                    Err(CancelOutcome::AlreadyCancelled)
                ) =>
            {
                CancelOutcome::AlreadyCancelled
            }
            _ => CancelOutcome::Cancelled,
        };
        if let Some(stored) = stored {
            self.discard(r, id, stored);
        }
        let settlement =
            Settlement { kind: SettlementKind::Cancelled as i32, at_ms: at.0, ..Settlement::default() };
        self.record_settled(r, id, record, settlement);
        r.meta.cancelled_total += 1;
        if outcome == CancelOutcome::Cancelled {
            r.effects.cancelled += 1;
        }
        Ok(outcome)
    }

    /// A failure (written by earlier builds for a Kafka-native record that
    /// did not parse) is recorded as it says, whatever the store held.
    fn apply_failed(
        &mut self,
        r: &mut Round,
        id: &MessageId,
        reason: &str,
        at: UnixMillis,
        record: Option<MessageRecord>,
    ) -> Result<(), StoreError> {
        if let Some(stored) = self.load(r, id)? {
            self.discard(r, id, stored);
        }
        let settlement = Settlement {
            kind: SettlementKind::Failed as i32,
            last_error: reason.to_owned(),
            at_ms: at.0,
            ..Settlement::default()
        };
        let record =
            record.unwrap_or_else(|| MessageRecord { scheduled_at_ms: at.0, ..MessageRecord::default() });
        self.record_settled(r, id, record, settlement);
        r.meta.failed_total = r.meta.failed_total.saturating_add(1);
        Ok(())
    }

    /// Records a message that arrives settled (its earlier records were
    /// compacted away, or it never parsed): its record whole, what became
    /// of it, and its retention clock.
    fn record_settled(
        &mut self,
        r: &mut Round,
        id: &MessageId,
        mut record: MessageRecord,
        settlement: Settlement,
    ) {
        let seq = r.meta.next_seq;
        r.meta.next_seq += 1;
        record.seq = seq;
        record.entry_at_ms = None;
        r.put_message(id, &record);
        r.put_settlement(id, &settlement);
        r.start_retention(UnixMillis(settlement.at_ms), id);
        let kind = settlement.kind();
        self.count(r, id, &record.topic, |c| {
            let n = c.of_kind(kind);
            *n = n.saturating_add(1);
        });
        r.overlay.insert(id.clone(), Some(Stored { record, settlement: Some(settlement) }));
    }

    /// A settle this node's dispatcher sent: as in a standalone store,
    /// unless a record applied since it claimed the message changed it.
    fn apply_own_settle(&mut self, r: &mut Round, settle: Settle) -> Result<(), StoreError> {
        if !self.replica.touched_while_claimed.remove(&settle.id) {
            r.replica.settled.insert(settle.id.clone());
            self.settle(r, settle);
            return Ok(());
        }
        r.claims.released.push(settle.id.clone());
        let from_owner = settle.handed.in_order();
        let line = SettledLine::of(&settle);
        let applied = self.apply_settled_line(r, line, from_owner);
        // Read as a line, it counts as touching the message while this very
        // claim holds it; the claim ends with this commit, and so does that.
        self.replica.touched_while_claimed.remove(&settle.id);
        applied
    }

    /// A settle read from the log: what the dispatcher read is read again,
    /// here; a message no longer pending is left as it is, except that a
    /// delivery is a fact and wins over a cancel.
    fn apply_settled_line(
        &mut self,
        r: &mut Round,
        line: SettledLine,
        from_owner: bool,
    ) -> Result<(), StoreError> {
        let SettledLine { id, at, outcome, handed } = line;
        let Some(stored) = self.load(r, &id)? else { return Ok(()) };
        let state = view::state_of(stored.settlement.as_ref());
        let handed =
            if from_owner && matches!(outcome, Outcome::Delivered { .. }) { handed } else { Handed::Alone };
        if !state.is_pending() {
            // Settled already (by a line of another node, or one read
            // before the dispatcher's own): an in-order delivery still
            // tells how far its partition is recorded.
            if let (true, Outcome::Delivered { partition, offset }) = (handed.in_order(), &outcome) {
                let topic: Arc<str> = stored.record.topic.as_str().into();
                self.raise_mark(r, &topic, *partition, *offset);
            }
            // A record on a topic (its own, or its dead-letter topic)
            // wins over a cancel that came before it.
            if let Some(s) = &stored.settlement
                && s.kind() == SettlementKind::Cancelled
                && let Some(produced) = produced_settlement(&outcome, at, s)
            {
                r.put_settlement(&id, &produced);
                r.delete_retention(UnixMillis(s.at_ms), &id);
                r.start_retention(at, &id);
                let to = Some(produced.kind());
                self.recount(r, &id, &stored.record.topic, Some(SettlementKind::Cancelled), to);
                r.overlay.insert(id, Some(Stored { record: stored.record, settlement: Some(produced) }));
            }
            return Ok(());
        }
        // The dispatcher's own settle of it, if it holds it, then changes
        // nothing more.
        self.touched(&id);
        let settle = Settle {
            id: id.clone(),
            key: view::dispatch_key(&stored.record, stored.settlement.as_ref()),
            due: stored.record.due(),
            topic: stored.record.topic.as_str().into(),
            tries: Tries::of(stored.settlement.as_ref()),
            at,
            outcome,
            handed,
        };
        r.replica.settled.insert(id);
        // Read whole just now: not read again.
        self.settle_read(r, settle, Some(stored.record));
        Ok(())
    }

    /// Retention ended for `id`: the message is forgotten. (Its owner
    /// writes the tombstone once the message is settled; one that finds it
    /// pending forgets it all the same, as a copy built once compaction
    /// kept only the tombstone would.)
    fn forget(&mut self, r: &mut Round, id: &MessageId) -> Result<(), StoreError> {
        let Some(stored) = self.load(r, id)? else { return Ok(()) };
        self.discard(r, id, stored);
        r.effects.purged += 1;
        Ok(())
    }

    /// Writes `row` of a table every shard keeps if it is a later change
    /// of its key than the one the store has (or this round writes), by
    /// [`Table::order`](crate::command::Table::order), so that every copy
    /// keeps the same whatever order the partitions brought them in. Kept
    /// as it is (the same change again): fine; an earlier one: superseded.
    fn later_row(&self, r: &mut Round, row: Row) -> Result<Result<(), StoreError>, StoreError> {
        let RowValue::Put(new) = &row.value else {
            // Only a put is ordered; a log's row of such a table is one.
            return Ok(Ok(()));
        };
        let current = match r.written(row.table, &row.key) {
            Some(RowValue::Put(bytes)) => Some(bytes.clone()),
            Some(_) => None,
            None => self.shared.db.get_cf(self.checkpoint(), schema::row_key(row.table, &row.key))?,
        };
        let order = |bytes: &[u8]| row.table.order(bytes);
        Ok(match current {
            Some(current) if order(new) < order(&current) => Err(StoreError::LogUnavailable(format!(
                "the change of {} was superseded by a later one made meanwhile through another node; read it again",
                row.table.describe(&row.key)
            ))),
            Some(current) if current == *new => Ok(()),
            _ => {
                r.put_row(row);
                Ok(())
            }
        })
    }

    fn checkpoint(&self) -> &rocksdb::ColumnFamily {
        cf(self.shared.db.as_ref(), schema::CF_CHECKPOINT)
    }
}
