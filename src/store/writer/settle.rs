//! What became of produces, recorded: a settle, the marks of target
//! partitions it raises and the floor the dispatcher sends with it; and,
//! for every change, where a new due entry goes and the counts it keeps.

use std::sync::Arc;

use super::{round::Round, state::Writer};
use crate::{
    command::{DeadLettered, Handed, Outcome, Settle},
    message::{DeadReason, MessageId, UnixMillis},
    store::{
        claims::Floor,
        schema::{
            Counts, CountsKey, DeliveryLine, DispatchKey, MessageRecord, Settlement, SettlementKind,
            TriesRecord,
        },
    },
};

impl Writer {
    /// Marks the partitions of `topic` that have none at `ends` (while
    /// marks wait, once the doubt ends).
    pub(super) fn set_marks(
        &mut self,
        r: &mut Round,
        topic: &Arc<str>,
        ends: impl IntoIterator<Item = (i32, i64)>,
    ) {
        for (partition, end) in ends {
            if let Some(held) = &mut self.marks.held {
                if !self.marks.set.contains_key(&(Arc::clone(topic), partition)) {
                    held.first.entry((Arc::clone(topic), partition)).or_insert(end);
                }
                continue;
            }
            if let std::collections::hash_map::Entry::Vacant(mark) =
                self.marks.set.entry((Arc::clone(topic), partition))
            {
                mark.insert(end);
                r.put_mark(topic, partition, end);
            }
        }
    }

    /// The doubt is over: the marks that waited are written, first marks
    /// before the deliveries that raise them.
    pub(super) fn release_marks(&mut self, r: &mut Round) {
        let Some(held) = self.marks.held.take() else { return };
        for ((topic, partition), end) in held.first {
            self.set_marks(r, &topic, [(partition, end)]);
        }
        for ((topic, partition), next) in held.raised {
            self.raise_mark(r, &topic, partition, next.saturating_sub(1));
        }
    }

    /// A record of this store is at `offset`, and its delivery was handed
    /// over in order: nothing of this store that is not recorded lies at
    /// or before it. Records reach a partition in the order they were sent
    /// (the producer is idempotent), so each earlier one there was
    /// answered before it, and is recorded in this commit or before it.
    pub(super) fn raise_mark(&mut self, r: &mut Round, topic: &Arc<str>, partition: i32, offset: i64) {
        let next = offset.saturating_add(1);
        if let Some(held) = &mut self.marks.held {
            let raised = held.raised.entry((Arc::clone(topic), partition)).or_insert(next);
            *raised = (*raised).max(next);
            return;
        }
        match self.marks.set.get_mut(&(Arc::clone(topic), partition)) {
            Some(mark) if *mark >= next => return,
            Some(mark) => *mark = next,
            None => {
                self.marks.set.insert((Arc::clone(topic), partition), next);
            }
        }
        r.put_mark(topic, partition, next);
    }

    /// Records what became of a produce. The dispatcher's claim has kept
    /// the message as it read it, so nothing needs reading here.
    pub(super) fn settle(&mut self, r: &mut Round, settle: Settle) {
        self.settle_read(r, settle, None);
    }

    /// [`Self::settle`], given the message's record whole if the caller
    /// read it already (it is not read again).
    pub(super) fn settle_read(&mut self, r: &mut Round, settle: Settle, read: Option<MessageRecord>) {
        let id = &settle.id;
        r.claims.released.push(id.clone());
        let prev = settle.tries;
        let at = settle.at;
        let tried = match &settle.outcome {
            Outcome::Failed { tried, .. } => *tried,
            Outcome::DeadLettered(d) => d.tried,
            Outcome::Expired { .. } => false,
            Outcome::Delivered { .. } | Outcome::Retry { .. } => true,
        };
        let attempts = if tried { prev.attempts.saturating_add(1) } else { prev.attempts };
        let first_refused_at_ms = prev.first_refused_at.map_or(0, |t| t.0);
        if let (Outcome::Delivered { partition, offset }, true) = (&settle.outcome, settle.handed.in_order())
        {
            self.raise_mark(r, &settle.topic, *partition, *offset);
        }
        match &settle.outcome {
            // Its due entry stays, as the record of the message.
            Outcome::Delivered { partition, offset }
                if !prev.recorded && settle.handed != Handed::Ahead && self.chunk_high < Some(settle.key) =>
            {
                r.effects.delivered.push(at.since(settle.due));
                r.meta.last_delivered_key.clear();
                r.meta.last_delivered_key.extend_from_slice(&settle.key.encode());
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
                self.count(r, id, &settle.topic, |c| {
                    c.pending = c.pending.saturating_sub(1);
                    c.delivered = c.delivered.saturating_add(1);
                });
            }
            Outcome::Delivered { partition, offset } => {
                // Its delivery is recorded in the same write: its body is
                // no longer needed (see `store::shed`).
                self.take_out_settled(r, id, settle.key, read, !self.config.keep_delivered_bodies);
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
                r.settle(id, &settlement, at);
                self.count(r, id, &settle.topic, |c| {
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
                match self.whole_unless_read(r, id, read) {
                    Ok(Some(mut record)) => {
                        r.delete_due(settle.key);
                        record.entry_at_ms = Some(key.at.0);
                        r.put_message(id, &record.locator());
                        r.put_due(key, id, &record, Some(&TriesRecord::of(&settlement)));
                        r.put_settlement(id, &settlement);
                    }
                    // Not readable now: it stays where it is, and the
                    // dispatcher is told to look at it again.
                    other => {
                        if let Err(e) = other {
                            tracing::error!(error = %e, id = %id.qualified(), "reading a message to retry failed");
                        }
                        r.added.entries.push((settle.key, id.clone()));
                    }
                }
            }
            Outcome::Failed { error, tried } => {
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
                self.settle_unsent(r, &settle, settlement, read, |c| c.failed = c.failed.saturating_add(1));
            }
            Outcome::Expired { deadline } => {
                let settlement = Settlement {
                    kind: SettlementKind::Expired as i32,
                    attempts,
                    rejections: prev.rejections,
                    at_ms: at.0,
                    deadline_ms: deadline.0,
                    first_refused_at_ms,
                    ..Settlement::default()
                };
                r.effects.expired += 1;
                r.meta.expired_total = r.meta.expired_total.saturating_add(1);
                self.settle_unsent(r, &settle, settlement, read, |c| c.expired = c.expired.saturating_add(1));
            }
            Outcome::DeadLettered(d) => {
                let tries = Settlement {
                    attempts,
                    rejections: prev.rejections.saturating_add(u32::from(d.tried)),
                    first_refused_at_ms,
                    ..Settlement::default()
                };
                let settlement = dead_lettered(d, at, tries);
                r.effects.dead_lettered += 1;
                r.meta.dead_lettered_total = r.meta.dead_lettered_total.saturating_add(1);
                self.settle_unsent(r, &settle, settlement, read, |c| {
                    c.dead_lettered = c.dead_lettered.saturating_add(1)
                });
            }
        }
        r.produced.settles.push(settle);
    }

    /// A message that ends without a delivery (failed, expired): out of
    /// the due index, its final `settlement` recorded, and counted by
    /// `counted` where it was pending.
    fn settle_unsent(
        &mut self,
        r: &mut Round,
        settle: &Settle,
        settlement: Settlement,
        read: Option<MessageRecord>,
        counted: impl FnOnce(&mut Counts),
    ) {
        self.take_out_settled(r, &settle.id, settle.key, read, false);
        r.settle(&settle.id, &settlement, settle.at);
        self.count(r, &settle.id, &settle.topic, |c| {
            c.pending = c.pending.saturating_sub(1);
            counted(c);
        });
    }

    /// Where a new due entry asked for at `key` goes: there, unless that
    /// lies below where the dispatcher reads or below the recorded floor;
    /// then just above, so that it is never behind a walk, never below the
    /// floor, and never early.
    pub(super) fn placed(&self, r: &Round, key: DispatchKey) -> DispatchKey {
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
    pub(super) fn raise_floor(&mut self, r: &mut Round, floor: Floor) {
        while self.handed.front().is_some_and(|(n, _)| *n < floor.handed) {
            self.handed.pop_front();
        }
        let lowest = |key| self.handed.iter().map(|(_, key)| *key).fold(key, DispatchKey::min);
        let key = lowest(floor.key);
        if key > r.meta.floor() {
            r.meta.floor = key.encode().to_vec();
        }
        // Not only raised: a paused topic's messages, left out while it
        // was paused, come back in once it may go again (its walk records
        // that first, after every floor sent before it: floors and that
        // record reach the writer in the order the dispatcher sent them).
        // In cluster mode floors are applied from the log, later; there a
        // node taking a shard searches from the start of the due index
        // and never reads this bound.
        let produced_from = lowest(floor.produced_from).max(r.meta.floor());
        if produced_from != r.meta.produced_from() {
            // Written at once when it leaves a paused topic's messages
            // out: a quiet store would otherwise never write it, and a
            // restart after a crash would read them all. Else it goes with
            // the next commit (a lower bound on disk is safe).
            r.probe |= produced_from > r.meta.floor();
            r.meta.produced_from = produced_from.encode().to_vec();
        }
        r.produced.floor = Some(floor);
    }

    /// A settled message leaves the due index other than by a first-try
    /// delivery: its due entry goes, and its record is kept whole, or
    /// without its body (`shed`).
    fn take_out_settled(
        &self,
        r: &mut Round,
        id: &MessageId,
        key: DispatchKey,
        read: Option<MessageRecord>,
        shed: bool,
    ) {
        match self.whole_unless_read(r, id, read) {
            Ok(Some(mut record)) => {
                // A record written before 0.2 stays whole where it is.
                if shed && record.is_locator() {
                    record.shed();
                }
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
    pub(super) fn count(&self, r: &mut Round, id: &MessageId, topic: &str, change: impl FnOnce(&mut Counts)) {
        let key = CountsKey::of(id, topic);
        let counts =
            r.counts.entry(key).or_insert_with_key(|k| self.counts.get(k).copied().unwrap_or_default());
        change(counts);
    }
}

/// The settlement of a message whose record went out (delivered, or
/// dead-lettered) `at`, in place of `was`; none for other outcomes.
pub(super) fn produced_settlement(outcome: &Outcome, at: UnixMillis, was: &Settlement) -> Option<Settlement> {
    match outcome {
        Outcome::Delivered { partition, offset } => Some(Settlement {
            kind: SettlementKind::Delivered as i32,
            at_ms: at.0,
            partition: *partition,
            offset: *offset,
            ..was.clone()
        }),
        Outcome::DeadLettered(d) => Some(dead_lettered(d, at, was.clone())),
        _ => None,
    }
}

/// The settlement of a message dead-lettered as `d` says, `at`, with the
/// tries of `tries`.
fn dead_lettered(d: &DeadLettered, at: UnixMillis, tries: Settlement) -> Settlement {
    let (last_error, deadline_ms) = match &d.reason {
        DeadReason::Failed { error } => (error.clone(), 0),
        DeadReason::Expired { deadline } => (String::new(), deadline.0),
    };
    Settlement {
        kind: SettlementKind::DeadLettered as i32,
        at_ms: at.0,
        partition: d.partition,
        offset: d.offset,
        last_error,
        deadline_ms,
        dead_letter_topic: d.topic.to_string(),
        ..tries
    }
}
