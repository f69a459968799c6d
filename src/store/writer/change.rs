//! A caller's change to a message: schedule (a new message, or one in place
//! of a message under the same id), cancel and reschedule, each
//! checked and made in one step of the writer, or waiting ([`Flow::Park`])
//! while the dispatcher produces the message.

use super::{
    round::{Round, Stored},
    state::Writer,
};
use crate::{
    command::{NewId, NewMessage},
    message::{
        CancelOutcome, Matching, MessageId, OnConflict, Placed, RescheduleRefusal, Scheduled, Scope,
        UnixMillis,
    },
    store::{
        StoreError,
        options::cf,
        schema::{self, DispatchKey, MessageRecord, Settlement, SettlementKind, TriesRecord},
        view,
    },
};

/// A schedule made, or waiting (with its message) while the dispatcher
/// produces the message it would replace.
pub(super) enum Placing {
    Done(Result<Scheduled, StoreError>),
    Wait(MessageId, Box<NewMessage>),
}

pub(super) enum Flow<T> {
    Done(Result<T, StoreError>),
    /// The dispatcher holds the message; run the op again once it settles.
    Park(MessageId),
}

impl Writer {
    pub(super) fn schedule(&mut self, r: &mut Round, msg: NewMessage) -> Placing {
        let (id, client_id) = match msg.id {
            NewId::Client(ref id) => {
                let found = match self.find(r, &msg.scope, id) {
                    Ok(found) => found,
                    Err(e) => return Placing::Done(Err(e)),
                };
                if let Some((found, existing)) = found {
                    if existing.record.is_same_request(&msg.envelope, msg.requested) {
                        let due = existing.record.due();
                        return Placing::Done(Ok(Scheduled { id: found, due, placed: Placed::Duplicate }));
                    }
                    return match msg.on_conflict {
                        OnConflict::Reject => Placing::Done(Err(StoreError::IdConflict(found))),
                        OnConflict::Replace => self.replace(r, found, existing, msg),
                    };
                }
                (id.clone(), true)
            }
            NewId::Generated(ref id) => (id.clone(), false),
        };
        if self.at_capacity(r.meta.pending) {
            return Placing::Done(Err(StoreError::AtCapacity { pending: r.meta.pending }));
        }
        let record = MessageRecord::new(msg.envelope, msg.requested, msg.due, 0, msg.now);
        self.park_new(r, &id, record, client_id);
        Placing::Done(Ok(Scheduled { id, due: msg.due, placed: Placed::Created }))
    }

    /// A schedule that replaces the message under its id: a pending one
    /// (waiting while the dispatcher produces it) or a failed one; a
    /// settled one is refused as final.
    fn replace(&mut self, r: &mut Round, id: MessageId, existing: Stored, msg: NewMessage) -> Placing {
        if !r.reserve(&self.shared.claims, &id) {
            return Placing::Wait(id, Box::new(msg));
        }
        if let Err(refusal) = self.replaceable(r, &id, &existing) {
            return Placing::Done(Err(refusal));
        }
        let record = MessageRecord::new(msg.envelope, msg.requested, msg.due, 0, msg.now);
        self.put_in_place(r, &id, existing, record);
        Placing::Done(Ok(Scheduled { id, due: msg.due, placed: Placed::Replaced }))
    }

    /// Whether the message `existing` of `id` may be replaced now.
    pub(super) fn replaceable(&self, r: &Round, id: &MessageId, existing: &Stored) -> Result<(), StoreError> {
        let state = view::state_of(existing.settlement.as_ref());
        match state.reschedule() {
            Err(RescheduleRefusal::AlreadyDelivered) => Err(StoreError::AlreadyDelivered(id.clone())),
            Err(RescheduleRefusal::AlreadyCancelled) => Err(StoreError::AlreadyCancelled(id.clone())),
            Ok(()) if state.is_pending() && self.in_doubt(existing) => {
                Err(StoreError::Dispatching(id.clone()))
            }
            Ok(()) if !state.is_pending() && self.at_capacity(r.meta.pending) => {
                Err(StoreError::AtCapacity { pending: r.meta.pending })
            }
            Ok(()) => Ok(()),
        }
    }

    /// Parks `record` under `id` in place of `existing`: what the store
    /// held of the id goes, a failed, expired or dead-lettered message
    /// leaves its count.
    pub(super) fn put_in_place(
        &mut self,
        r: &mut Round,
        id: &MessageId,
        existing: Stored,
        record: MessageRecord,
    ) {
        let kind = existing.settlement.as_ref().map(Settlement::kind);
        let topic = existing.record.topic.clone();
        self.discard(r, id, existing);
        if let Some(kind) = kind {
            self.uncount_redriven(r, id, &topic, kind);
        }
        self.park_new(r, id, record, true);
        r.effects.replaced += 1;
    }

    /// Parks a message not in the store yet; `seen`: its id may come again
    /// in this round (a client's, or one read from the log).
    pub(super) fn park_new(&mut self, r: &mut Round, id: &MessageId, mut record: MessageRecord, seen: bool) {
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
    pub(super) fn in_doubt(&self, stored: &Stored) -> bool {
        self.in_doubt.is_some_and(|d| {
            stored.record.seq < d.before_seq
                && view::dispatch_key(&stored.record, stored.settlement.as_ref()) < d.below
        })
    }

    pub(super) fn cancel(
        &mut self,
        r: &mut Round,
        scope: &Scope,
        id: &MessageId,
        now: UnixMillis,
        only: Option<&Matching>,
    ) -> Flow<CancelOutcome> {
        let (id, stored) = match self.find(r, scope, id) {
            Ok(Some(found)) => found,
            Ok(None) => return Flow::Done(Ok(CancelOutcome::NotFound)),
            Err(e) => return Flow::Done(Err(e)),
        };
        if !stored.still_matches(only) {
            // Changed since it was found by its labels.
            return Flow::Done(Ok(CancelOutcome::NotFound));
        }
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
    pub(super) fn cancel_pending(&mut self, r: &mut Round, id: &MessageId, stored: Stored, now: UnixMillis) {
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

    pub(super) fn reschedule(
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

    /// Takes a message settled `kind` out of its count, if a re-drive
    /// takes it out of that state (failed, expired, dead-lettered).
    pub(super) fn uncount_redriven(
        &mut self,
        r: &mut Round,
        id: &MessageId,
        topic: &str,
        kind: SettlementKind,
    ) {
        if matches!(kind, SettlementKind::Failed | SettlementKind::Expired | SettlementKind::DeadLettered) {
            self.recount(r, id, topic, Some(kind), None);
        }
    }

    /// Moves a message from the count of messages settled `from` to that
    /// of `to` (none: out of the counts), store-wide and by topic.
    pub(super) fn recount(
        &mut self,
        r: &mut Round,
        id: &MessageId,
        topic: &str,
        from: Option<SettlementKind>,
        to: Option<SettlementKind>,
    ) {
        for (kind, add) in [(from, false), (to, true)] {
            let Some(kind) = kind else { continue };
            if let Some(total) = r.meta.settled_total(kind) {
                *total = if add { total.saturating_add(1) } else { total.saturating_sub(1) };
            }
            self.count(r, id, topic, |c| {
                let n = c.of_kind(kind);
                *n = if add { n.saturating_add(1) } else { n.saturating_sub(1) };
            });
        }
    }

    /// Moves a pending message to `due`, or re-arms a failed, expired or
    /// dead-lettered one there.
    pub(super) fn move_to(&mut self, r: &mut Round, id: MessageId, mut stored: Stored, due: UnixMillis) {
        let state = view::state_of(stored.settlement.as_ref());
        if state.is_pending() {
            r.delete_due(view::dispatch_key(&stored.record, stored.settlement.as_ref()));
            if let Some(s) = stored.settlement.as_mut() {
                // Keep the history of tries, drop the pending retry time.
                s.retry_at_ms = 0;
                r.put_settlement(&id, s);
            }
        } else {
            // Failed or expired: re-armed with a clean slate.
            if let Some(at) = stored.settlement.as_ref().and_then(Settlement::settled_at) {
                r.delete_retention(at, &id);
            }
            r.delete_settlement(&id);
            if let Some(s) = stored.settlement.take() {
                self.uncount_redriven(r, &id, &stored.record.topic, s.kind());
            }
            r.meta.pending += 1;
            self.count(r, &id, &stored.record.topic, |c| c.pending = c.pending.saturating_add(1));
        }
        stored.record.due_ms = due.0;
        let key = self.placed(r, DispatchKey { at: due, seq: stored.record.seq });
        stored.record.entry_at_ms = Some(key.at.0);
        r.put_message(&id, &stored.record.locator());
        let tries = stored.settlement.as_ref().map(TriesRecord::of);
        r.put_due(key, &id, &stored.record, tries.as_ref());
        r.overlay.insert(id, Some(stored));
    }

    /// A record applied changed `id`: if the dispatcher holds it, its
    /// settle is checked against the store when it comes.
    pub(super) fn touched(&mut self, id: &MessageId) {
        if self.shared.claims.held_by_dispatcher(id) {
            self.replica.touched_while_claimed.insert(id.clone());
        }
    }

    /// Drops whatever the store holds of `id`, in whatever state: a
    /// message replaced, or one a record of the log says all there is of.
    /// Cluster mode: a dispatcher holding it has its settle checked
    /// against the store.
    pub(super) fn discard(&mut self, r: &mut Round, id: &MessageId, stored: Stored) {
        self.touched(id);
        if view::state_of(stored.settlement.as_ref()).is_pending() {
            r.delete_due(view::dispatch_key(&stored.record, stored.settlement.as_ref()));
            r.meta.pending = r.meta.pending.saturating_sub(1);
            self.count(r, id, &stored.record.topic, |c| c.pending = c.pending.saturating_sub(1));
        } else if stored.record.is_locator() {
            r.delete_due(view::dispatch_key(&stored.record, None));
        } else if let Some(settled_at) = stored.settlement.as_ref().and_then(Settlement::settled_at) {
            r.delete_retention(settled_at, id);
        }
        r.batch.delete_cf(cf(self.shared.db.as_ref(), schema::CF_MESSAGES), id.as_bytes());
        r.delete_settlement(id);
        r.overlay.insert(id.clone(), None);
    }
}
