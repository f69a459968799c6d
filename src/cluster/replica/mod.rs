//! The schedule log's records and the store's replica changes, each turned
//! into the other here, once: a record read from a partition becomes the
//! [`Replica`] change the store applies; a change the shard's owner
//! decided ([`Proposed`]) and a settle of its dispatcher become the records
//! it appends.

use std::sync::Arc;

use crate::{
    cluster::log::record::{
        self, Cancelled, Change, Entry, LogMessage, SettledLine as LogLine, SettledOutcome,
    },
    command::MessageRecord,
    command::{DeadLettered, Handed, IngressPosition, Outcome, Row, RowValue, Settle, Table},
    message::{DeadReason, DueSpec, Labels, MessageId, UnixMillis},
    store::{Local, LogEntry, Proposed, Replica, SettledLine},
};

/// The entry the store applies for the record at `offset`.
pub(crate) fn entry(offset: i64, at: UnixMillis, entry: Entry, local: Option<Local>) -> LogEntry {
    let (writer, change) = match entry {
        Entry::Logged { writer, request, change } => (Some(writer), logged(writer, request, change)),
        Entry::Forget(id) => (None, Replica::Forget(id)),
        Entry::ForgetChunk(chunk) => (None, Replica::ForgetChunk(chunk)),
        Entry::ForgetRow(table, key) => (None, Replica::ForgetRow(table, key)),
        // Logged (and a forgery counted) where it is read, with its
        // partition. The applier stops before an unreadable record: none
        // comes here.
        Entry::Skip(_) | Entry::Forged(_) | Entry::Unreadable(_) => (None, Replica::Skip),
    };
    LogEntry { offset, at, writer, change, local }
}

/// What a record hourglass wrote changes.
fn logged(writer: u64, request: u64, change: Change) -> Replica {
    match change {
        Change::Owner(owner) => Replica::Owner { writer, released: owner.released },
        Change::Scheduled(m) => match m.message_id() {
            Some(id) => {
                let fresh = m.fresh;
                Replica::Schedule { id, record: record_of(m), fresh }
            }
            None => unreadable_id(&m.id),
        },
        Change::Rescheduled(m) => match m.message_id() {
            Some(id) => Replica::Reschedule { id, record: record_of(m) },
            None => unreadable_id(&m.id),
        },
        Change::Cancelled(Cancelled { message: Some(m), at_ms }) => match m.message_id() {
            Some(id) => Replica::Cancel { id, record: Some(record_of(m)), at: UnixMillis(at_ms) },
            None => unreadable_id(&m.id),
        },
        Change::Cancelled(Cancelled { message: None, .. }) => Replica::Skip,
        Change::Failed(f) => match MessageId::from_stored(&f.id) {
            Some(id) => Replica::Fail {
                id,
                reason: f.reason,
                at: UnixMillis(f.at_ms),
                record: f.message.map(record_of),
            },
            None => unreadable_id(&f.id),
        },
        Change::Settled(settled) => Replica::Settled {
            chunk: record::chunk_key(UnixMillis(settled.at_ms), writer, request),
            ids: settled.lines.iter().map(|l| l.id.clone()).collect(),
            lines: settled.lines.into_iter().filter_map(settled_of).collect(),
        },
        Change::Marks(marks) => Replica::Marks {
            topic: Arc::from(marks.topic),
            ends: marks.ends.iter().map(|e| (e.partition, e.offset)).collect(),
        },
        // As earlier builds wrote it: the latest says, as compaction keeps.
        Change::Ingress(read) => Replica::Row(
            IngressPosition { topic: read.topic, partition: read.partition, next: read.next }.row(),
        ),
        Change::Series(row) => row_of(Table::Series, row),
        Change::Policy(row) => row_of(Table::Policy, row),
        Change::IngressRead(row) => row_of(Table::Ingress, row),
    }
}

/// A row's record, checked: one its table does not admit (a key or bytes
/// that do not read, a limit past what a call may set) is skipped (and
/// logged), never applied.
fn row_of(table: Table, row: record::Row) -> Replica {
    let value = row.value.map_or(RowValue::Delete, RowValue::Put);
    if !table.admits(&row.key, &value) {
        tracing::warn!(row = %table.describe(&row.key), "skipped a row of the schedule log that does not read");
        return Replica::Skip;
    }
    Replica::Row(Row {
        table,
        key: row.key,
        value,
        old_wake: row.old_wake_ms.map(UnixMillis),
        wake: row.wake_ms.map(UnixMillis),
    })
}

fn unreadable_id(bytes: &[u8]) -> Replica {
    tracing::warn!(id = ?String::from_utf8_lossy(bytes), "skipped a record of the schedule log whose key is no message id");
    Replica::Skip
}

/// The record a log message restores.
fn record_of(mut m: LogMessage) -> MessageRecord {
    // Checked as a caller's is: one that is not a topic, or is the
    // message's own, is dropped.
    let dead_letter_topic = m
        .dead_letter_topic
        .take()
        .filter(|to| crate::message::validate_dead_letter_topic(&m.topic, to).is_ok());
    let requested = DueSpec::from_stored(m.requested_at_ms, m.requested_delay_ms, UnixMillis(m.due_ms));
    let (requested_at_ms, requested_delay_ms) = requested.stored();
    MessageRecord {
        headers: m.headers,
        topic: m.topic,
        key: m.key,
        value: m.value,
        partition: m.partition,
        due_ms: m.due_ms,
        seq: 0,
        scheduled_at_ms: m.scheduled_at_ms,
        requested_at_ms,
        requested_delay_ms,
        entry_at_ms: None,
        // Bounded as a caller's are: the log is read, not trusted blindly.
        labels: m.labels.into_iter().take(Labels::MAX).collect(),
        max_lateness_ms: m.max_lateness_ms,
        dead_letter_topic,
        digest: None,
    }
}

/// A line of a settle record, if its id and outcome read.
fn settled_of(line: LogLine) -> Option<SettledLine> {
    let id = MessageId::from_stored(&line.id)?;
    let (outcome, handed) = match line.outcome? {
        SettledOutcome::Delivered(d) => {
            let handed = match (d.in_order, d.ahead) {
                (false, _) => Handed::Alone,
                (true, false) => Handed::InTurn,
                (true, true) => Handed::Ahead,
            };
            (Outcome::Delivered { partition: d.partition, offset: d.offset }, handed)
        }
        SettledOutcome::Retry(t) => (
            Outcome::Retry { retry_at: UnixMillis(t.retry_at_ms), error: t.error, refused: t.refused },
            Handed::Alone,
        ),
        SettledOutcome::Failed(f) => (Outcome::Failed { error: f.error, tried: f.tried }, Handed::Alone),
        SettledOutcome::Expired(e) => {
            (Outcome::Expired { deadline: UnixMillis(e.deadline_ms) }, Handed::Alone)
        }
        SettledOutcome::DeadLettered(d) => {
            // Read, not trusted: a line that names no topic says nothing.
            crate::message::validate_topic_name(&d.topic).ok()?;
            let reason = match d.deadline_ms {
                0 => DeadReason::Failed { error: d.error },
                deadline => DeadReason::Expired { deadline: UnixMillis(deadline) },
            };
            let (topic, partition, offset, tried) = (d.topic.into(), d.partition, d.offset, d.tried);
            (
                Outcome::DeadLettered(Box::new(DeadLettered { topic, partition, offset, reason, tried })),
                Handed::Alone,
            )
        }
    };
    Some(SettledLine { id, at: UnixMillis(line.at_ms), outcome, handed })
}

/// The key and the change of the record that logs what the owner decided
/// for message `id`.
pub(crate) fn proposed(id: &MessageId, proposed: Proposed) -> (Vec<u8>, Change) {
    let change = match proposed {
        Proposed::Schedule { record, fresh } => {
            Change::Scheduled(LogMessage { fresh, ..message_of(id, record) })
        }
        Proposed::Reschedule { record } => Change::Rescheduled(message_of(id, record)),
        Proposed::Cancel { record, at } => {
            Change::Cancelled(Cancelled { message: Some(message_of(id, record)), at_ms: at.0 })
        }
    };
    (id.as_bytes().to_vec(), change)
}

/// A stored record, whole, as a log record carries it.
fn message_of(id: &MessageId, record: MessageRecord) -> LogMessage {
    let requested = record.requested();
    let (requested_at_ms, requested_delay_ms) = requested.stored();
    LogMessage {
        id: id.as_bytes().to_vec(),
        headers: record.headers,
        topic: record.topic,
        key: record.key,
        value: record.value,
        partition: record.partition,
        due_ms: record.due_ms,
        scheduled_at_ms: record.scheduled_at_ms,
        requested_at_ms,
        requested_delay_ms,
        fresh: false,
        labels: record.labels,
        max_lateness_ms: record.max_lateness_ms,
        dead_letter_topic: record.dead_letter_topic,
    }
}

/// The key and the change of the record that logs a row's write, whole:
/// what is kept of it (`Keep`) comes as `kept`, its bytes as stored.
pub(crate) fn row(row: Row, kept: Option<Vec<u8>>) -> (Vec<u8>, Change) {
    let value = match row.value {
        RowValue::Put(bytes) => Some(bytes),
        RowValue::Keep => kept,
        RowValue::Delete => None,
    };
    let key = record::row_key(row.table, &row.key);
    let change = Change::of_row(
        row.table,
        record::Row {
            key: row.key,
            value,
            old_wake_ms: row.old_wake.map(|t| t.0),
            wake_ms: row.wake.map(|t| t.0),
        },
    );
    (key, change)
}

/// A settle as the log records it.
pub(crate) fn settled_line(settle: &Settle) -> LogLine {
    let outcome = match &settle.outcome {
        Outcome::Delivered { partition, offset } => SettledOutcome::Delivered(record::Delivered {
            partition: *partition,
            offset: *offset,
            in_order: settle.handed.in_order(),
            ahead: settle.handed == Handed::Ahead,
        }),
        Outcome::Retry { retry_at, error, refused } => SettledOutcome::Retry(record::Retry {
            retry_at_ms: retry_at.0,
            error: error.clone(),
            refused: *refused,
        }),
        Outcome::Failed { error, tried } => {
            SettledOutcome::Failed(record::SettledFailure { error: error.clone(), tried: *tried })
        }
        Outcome::Expired { deadline } => {
            SettledOutcome::Expired(record::SettledExpiry { deadline_ms: deadline.0 })
        }
        Outcome::DeadLettered(d) => {
            let (deadline_ms, error) = match &d.reason {
                DeadReason::Expired { deadline } => (deadline.0, String::new()),
                DeadReason::Failed { error } => (0, error.clone()),
            };
            SettledOutcome::DeadLettered(record::SettledDeadLetter {
                topic: d.topic.to_string(),
                partition: d.partition,
                offset: d.offset,
                deadline_ms,
                error,
                tried: d.tried,
            })
        }
    };
    LogLine { id: settle.id.as_bytes().to_vec(), at_ms: settle.at.0, outcome: Some(outcome) }
}

#[cfg(test)]
mod tests;
