//! The records hourglass writes to the schedule log itself, and how any
//! record read from a partition becomes an [`Entry`] to apply.
//!
//! A record hourglass writes carries the [`RECORD_HEADER`] with the format
//! version; its value is a [`LogRecord`] (protobuf). Per message, the key is
//! the message id as the store keeps it ([`MessageId::as_bytes`]), and the
//! record carries the message whole, so that the latest record of an id is
//! enough to restore it once compaction has dropped the earlier ones:
//!
//! ```text
//! key                value (LogRecord.change)       applied
//! id                 Scheduled(message)             parked as it is (a retry of the pending
//!                                                   message changes nothing)
//! id                 Rescheduled(message)           parked at its due time (moved, re-armed)
//! id                 Cancelled(message, at)         recorded as cancelled
//! id                 Failed(id, reason, message?)   recorded as failed (earlier builds)
//! id                 none (tombstone)               forgotten (retention ended)
//! 0x01 ‖ at ‖ chunk  Settled(lines, at)             what the dispatcher's produces became:
//!                                                   delivered (partition, offset), retry, failed
//! 0x01 ‖ at ‖ chunk  none (tombstone)               the chunk's retention ended
//! 0x02 ‖ "owner"     Owner(at, released)            the writer owns the shard from here on: only
//!                                                   it dispatches (and takes changes); released:
//!                                                   the owner let go, none owns it
//! 0x03 ‖ topic       Marks(topic, ends)             where the topic's partitions ended before the
//!                                                   shard first produced to it: marks for those
//!                                                   that have none (see `crate::dispatcher`'s
//!                                                   reconciliation)
//! 0x04 ‖ topic ‖ 0 ‖ p Ingress(topic, partition,   a row of the ingress table (`crate::ingress`):
//!                      next)                        how far the shard read partition p of an
//!                                                   ingress topic, the next offset to read; from
//!                                                   any node, the latest record says
//! 0x05 ‖ series id   Series(row)                    a row of the series table (`crate::series`) as
//!                                                   its owner wrote it, and its wake moved; no
//!                                                   bytes: deleted. Applied only from the shard's
//!                                                   owner
//! 0x05 ‖ series id   none (tombstone)               the deleted series is gone for good
//! 0x06 ‖ policy key  Policy(row)                    a row of the policy table (`crate::policy`), written to
//!                                                   every partition by any node; of two records of
//!                                                   one key the later change wins (by its time,
//!                                                   then its bytes), so that every partition comes
//!                                                   to the same policy whatever order they came in.
//!                                                   A removed policy stays as an empty record
//! ```
//!
//! Every table (`crate::command::Table`) is logged alike: a [`Row`] under
//! the table's key mark and the row's key, in the table's variant of
//! [`Change`]; a row of a shard's own table is applied only from the
//! shard's owner, and its tombstone forgets it; one of every shard's is
//! written to every partition. A new table takes a key mark and a variant.
//!
//! The latest record of an id says all there is of its message, whatever
//! came before it, as compaction keeps only that record: a copy rebuilt
//! from the compacted log holds what the copies that applied every record
//! hold. A `Settled` record changes only a message the shard holds.
//!
//! Deliveries are recorded by chunk, one record for what one settle of the
//! dispatcher covers, as the store's own delivery logs do: a drain writes
//! one log record per few hundred messages, not one per message.
//!
//! Every record names the node incarnation and the request that wrote it
//! ([`LogRecord::writer`], [`LogRecord::request`]), so that the node waiting
//! for it can answer its caller once it is applied.

use crate::{
    command::{HeaderRecord, IngressPosition, LabelRecord, RowValue, Spread, Table},
    message::{DueSpec, Envelope, MessageId, UnixMillis},
};

use super::RECORD_HEADER;

/// The version of the record format this build writes and reads.
pub const FORMAT: &str = "1";

/// The first byte of the key of a chunk's [`Settled`] record: no message
/// id starts with it (an id is printable, a tenant's starts with 0).
pub const CHUNK_KEY_MARK: u8 = 1;

/// The first byte of the key of [`Owner`] records (one key per partition:
/// compaction keeps the latest claim).
pub const OWNER_KEY_MARK: u8 = 2;

/// The first byte of the key of [`Marks`] records (one key per target
/// topic).
pub const MARKS_KEY_MARK: u8 = 3;

/// The first byte of the key of the ingress table's records, [`Ingress`]
/// or [`Change::IngressRead`] (one key per partition of an ingress topic).
pub const INGRESS_KEY_MARK: u8 = 4;

/// The first byte of the key of [`Series`] records (one key per series).
pub const SERIES_KEY_MARK: u8 = 5;

/// The first byte of the key of [`Policy`] records (one key per policy).
pub const POLICY_KEY_MARK: u8 = 6;

#[derive(Clone, PartialEq, prost::Message)]
pub struct LogRecord {
    /// The node incarnation that wrote the record (random per start).
    #[prost(uint64, tag = "1")]
    pub writer: u64,
    /// Which of its requests: the node answers it once this is applied.
    #[prost(uint64, tag = "2")]
    pub request: u64,
    #[prost(oneof = "Change", tags = "3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13")]
    pub change: Option<Change>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Change {
    #[prost(message, tag = "3")]
    Scheduled(LogMessage),
    #[prost(message, tag = "4")]
    Rescheduled(LogMessage),
    #[prost(message, tag = "5")]
    Cancelled(Cancelled),
    #[prost(message, tag = "6")]
    Settled(Settled),
    #[prost(message, tag = "7")]
    Failed(Failed),
    #[prost(message, tag = "8")]
    Owner(Owner),
    #[prost(message, tag = "9")]
    Marks(Marks),
    /// How far an ingress partition was read, as earlier builds wrote it:
    /// read as a row of the ingress table.
    #[prost(message, tag = "10")]
    Ingress(Ingress),
    /// A row of the series table.
    #[prost(message, tag = "11")]
    Series(Row),
    /// A row of the policy table.
    #[prost(message, tag = "12")]
    Policy(Row),
    /// A row of the ingress table (how far an ingress partition was read).
    #[prost(message, tag = "13")]
    IngressRead(Row),
}

impl Change {
    /// The record of a row of `table`.
    pub fn of_row(table: Table, row: Row) -> Change {
        match table {
            Table::Series => Change::Series(row),
            Table::Policy => Change::Policy(row),
            // As earlier builds write it, so that a cluster of mixed
            // builds reads it; a row that is no position (none is written)
            // as a row.
            Table::Ingress => {
                match row.value.as_deref().and_then(|bytes| IngressPosition::read(&row.key, bytes)) {
                    Some(IngressPosition { topic, partition, next }) => {
                        Change::Ingress(Ingress { topic, partition, next })
                    }
                    None => Change::IngressRead(row),
                }
            }
        }
    }
}

/// The key mark of `table`'s records.
fn key_mark(table: Table) -> u8 {
    match table {
        Table::Series => SERIES_KEY_MARK,
        Table::Policy => POLICY_KEY_MARK,
        Table::Ingress => INGRESS_KEY_MARK,
    }
}

/// The table whose records carry key mark `mark`.
fn table_of(mark: u8) -> Option<Table> {
    Table::ALL.into_iter().find(|t| key_mark(*t) == mark)
}

/// A row of a table (`crate::command::Table`): its key and bytes as its
/// room keeps them, kept as they come (checked when read); and its entry
/// in the table's wake index, moved from `old_wake_ms` to `wake_ms`. No
/// bytes: the row was deleted. (Field for field the `Series` and `Policy`
/// records of earlier builds, which read as rows.)
#[derive(Clone, PartialEq, prost::Message)]
pub struct Row {
    /// A series id as the store keeps it; a policy's key.
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", optional, tag = "2")]
    pub value: Option<Vec<u8>>,
    #[prost(uint64, optional, tag = "3")]
    pub old_wake_ms: Option<u64>,
    #[prost(uint64, optional, tag = "4")]
    pub wake_ms: Option<u64>,
}

/// How far the shard's owner has read a partition of an ingress topic
/// (see `crate::ingress`): every record before `next` was turned
/// into the log's records (or refused). The latest record of its key says.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Ingress {
    #[prost(string, tag = "1")]
    pub topic: String,
    #[prost(int32, tag = "2")]
    pub partition: i32,
    #[prost(int64, tag = "3")]
    pub next: i64,
}

/// Where each partition of a target topic ended before the shard's first
/// produce to it: no record of the shard lies before. Sets the marks of
/// partitions that have none; deliveries raise them from there.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Marks {
    #[prost(string, tag = "1")]
    pub topic: String,
    #[prost(message, repeated, tag = "2")]
    pub ends: Vec<PartitionEnd>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PartitionEnd {
    #[prost(int32, tag = "1")]
    pub partition: i32,
    #[prost(int64, tag = "2")]
    pub offset: i64,
}

/// The record's writer took the shard: from this record on, the shard's
/// owner is its writer, and any other node that applies it stops
/// dispatching the shard.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Owner {
    /// When it was taken (wall clock, for people reading the log).
    #[prost(uint64, tag = "1")]
    pub at_ms: u64,
    /// The writer let go of the shard: if it was the owner, the shard has
    /// none until the next claim.
    #[prost(bool, tag = "2")]
    pub released: bool,
    /// A release with nothing in doubt: every produce of the writer was
    /// answered and recorded before it, so the next owner has nothing to
    /// look for on the topics. Not set by older builds.
    #[prost(bool, tag = "3")]
    pub clean: bool,
}

/// A message whole: what to deliver, when, and as what it was asked for.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LogMessage {
    /// The id as the store keeps it: the id alone in the shared space,
    /// `\0 tenant \0 id` in a tenant's.
    #[prost(bytes = "vec", tag = "1")]
    pub id: Vec<u8>,
    #[prost(string, tag = "2")]
    pub topic: String,
    #[prost(bytes = "vec", optional, tag = "3")]
    pub key: Option<Vec<u8>>,
    #[prost(bytes = "vec", tag = "4")]
    pub value: Vec<u8>,
    #[prost(message, repeated, tag = "5")]
    pub headers: Vec<HeaderRecord>,
    #[prost(int32, optional, tag = "6")]
    pub partition: Option<i32>,
    /// When it is due (moves on reschedule).
    #[prost(uint64, tag = "7")]
    pub due_ms: u64,
    /// When it was first accepted.
    #[prost(uint64, tag = "8")]
    pub scheduled_at_ms: u64,
    /// The due time as first asked for: an instant, or a delay.
    #[prost(uint64, optional, tag = "9")]
    pub requested_at_ms: Option<u64>,
    #[prost(uint64, optional, tag = "10")]
    pub requested_delay_ms: Option<u64>,
    /// The id was made for this message: no earlier one can hold it.
    #[prost(bool, tag = "11")]
    pub fresh: bool,
    /// The caller's labels, sorted by key.
    #[prost(message, repeated, tag = "12")]
    pub labels: Vec<LabelRecord>,
    /// Its deadline past its due time, in ms.
    #[prost(uint64, optional, tag = "13")]
    pub max_lateness_ms: Option<u64>,
    /// Its own dead-letter topic, if it names one.
    #[prost(string, optional, tag = "14")]
    pub dead_letter_topic: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Cancelled {
    #[prost(message, optional, tag = "1")]
    pub message: Option<LogMessage>,
    #[prost(uint64, tag = "2")]
    pub at_ms: u64,
}

/// A message that could not be scheduled, recorded as failed so that `Get`
/// says why: earlier builds wrote it for a Kafka-native record of the log
/// that did not parse. Still applied, so that such a log reads the same.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Failed {
    #[prost(bytes = "vec", tag = "1")]
    pub id: Vec<u8>,
    #[prost(string, tag = "2")]
    pub reason: String,
    #[prost(uint64, tag = "3")]
    pub at_ms: u64,
    #[prost(message, optional, tag = "4")]
    pub message: Option<LogMessage>,
}

/// What became of the produces one settle of the dispatcher covers.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Settled {
    #[prost(message, repeated, tag = "1")]
    pub lines: Vec<SettledLine>,
    /// When the last of its outcomes was known: its retention counts from
    /// here, and its key ([`chunk_key`]) begins with it.
    #[prost(uint64, tag = "2")]
    pub at_ms: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SettledLine {
    #[prost(bytes = "vec", tag = "1")]
    pub id: Vec<u8>,
    /// When the outcome was known.
    #[prost(uint64, tag = "2")]
    pub at_ms: u64,
    #[prost(oneof = "SettledOutcome", tags = "3, 4, 5, 6, 7")]
    pub outcome: Option<SettledOutcome>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum SettledOutcome {
    #[prost(message, tag = "3")]
    Delivered(Delivered),
    #[prost(message, tag = "4")]
    Retry(Retry),
    #[prost(message, tag = "5")]
    Failed(SettledFailure),
    /// Its deadline passed before it was produced.
    #[prost(message, tag = "6")]
    Expired(SettledExpiry),
    /// It failed or expired, and went to its dead-letter topic.
    #[prost(message, tag = "7")]
    DeadLettered(SettledDeadLetter),
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SettledDeadLetter {
    /// The dead-letter topic, and where the record landed on it.
    #[prost(string, tag = "1")]
    pub topic: String,
    #[prost(int32, tag = "2")]
    pub partition: i32,
    #[prost(int64, tag = "3")]
    pub offset: i64,
    /// It expired at this deadline; 0: it failed with `error`.
    #[prost(uint64, tag = "4")]
    pub deadline_ms: u64,
    #[prost(string, tag = "5")]
    pub error: String,
    /// It failed on a produce of its own.
    #[prost(bool, tag = "6")]
    pub tried: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SettledExpiry {
    /// The deadline that passed.
    #[prost(uint64, tag = "1")]
    pub deadline_ms: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Delivered {
    #[prost(int32, tag = "1")]
    pub partition: i32,
    #[prost(int64, tag = "2")]
    pub offset: i64,
    /// Handed over in the order sent: it raises the partition's mark.
    #[prost(bool, tag = "3")]
    pub in_order: bool,
    /// Handed over ahead of a record sent before it (see
    /// [`Handed::Ahead`](crate::command::Handed::Ahead)): recorded apart
    /// from the delivery chunks. (Absent in records of earlier builds:
    /// such a line joins a chunk if it may.)
    #[prost(bool, tag = "4")]
    pub ahead: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Retry {
    #[prost(uint64, tag = "1")]
    pub retry_at_ms: u64,
    #[prost(string, tag = "2")]
    pub error: String,
    /// The broker refused the message itself (counts toward giving up).
    #[prost(bool, tag = "3")]
    pub refused: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SettledFailure {
    #[prost(string, tag = "1")]
    pub error: String,
    /// The message was produced and refused this time.
    #[prost(bool, tag = "2")]
    pub tried: bool,
}

impl LogMessage {
    pub fn new(
        id: &MessageId,
        envelope: &Envelope,
        requested: DueSpec,
        due: UnixMillis,
        at: UnixMillis,
    ) -> Self {
        let (requested_at_ms, requested_delay_ms) = requested.stored();
        LogMessage {
            id: id.as_bytes().to_vec(),
            topic: envelope.topic.clone(),
            key: envelope.key.clone(),
            value: envelope.value.clone(),
            headers: envelope
                .headers
                .iter()
                .map(|h| HeaderRecord { key: h.key.clone(), value: h.value.clone() })
                .collect(),
            partition: envelope.partition,
            due_ms: due.0,
            scheduled_at_ms: at.0,
            requested_at_ms,
            requested_delay_ms,
            fresh: false,
            labels: envelope
                .labels
                .iter()
                .map(|(k, v)| LabelRecord { key: k.to_owned(), value: v.to_owned() })
                .collect(),
            max_lateness_ms: envelope.max_lateness.map(crate::message::duration_ms),
            dead_letter_topic: envelope.dead_letter_topic.clone(),
        }
    }

    /// The message's id; none if the bytes are not one.
    pub fn message_id(&self) -> Option<MessageId> {
        MessageId::from_stored(&self.id)
    }
}

impl LogRecord {
    pub fn encode(&self) -> Vec<u8> {
        prost::Message::encode_to_vec(self)
    }
}

/// The key of a partition's [`Owner`] records.
pub fn owner_key() -> Vec<u8> {
    let mut key = vec![OWNER_KEY_MARK];
    key.extend_from_slice(b"owner");
    key
}

/// The key of a target topic's [`Marks`] record.
pub fn marks_key(topic: &str) -> Vec<u8> {
    let mut key = vec![MARKS_KEY_MARK];
    key.extend_from_slice(topic.as_bytes());
    key
}

/// The key of the records of row `key` of `table`.
pub fn row_key(table: Table, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + key.len());
    k.push(key_mark(table));
    k.extend_from_slice(key);
    k
}

/// The key of the [`Settled`] record of a chunk: its time ([`Settled::at_ms`])
/// then its writer and request, unique, so that compaction keeps every
/// chunk until its retention ends and the shard's owner tombstones it.
pub fn chunk_key(at: UnixMillis, writer: u64, request: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(CHUNK_KEY_LEN);
    key.push(CHUNK_KEY_MARK);
    key.extend_from_slice(&at.0.to_be_bytes());
    key.extend_from_slice(&writer.to_be_bytes());
    key.extend_from_slice(&request.to_be_bytes());
    key
}

/// The length of a [`chunk_key`].
pub const CHUNK_KEY_LEN: usize = 25;

/// What one record read from a log partition asks of the shard's store.
#[derive(Clone, Debug, PartialEq)]
#[expect(
    clippy::large_enum_variant,
    reason = "nearly every record is a change; boxing it would allocate once more per record read"
)]
pub enum Entry {
    /// A record hourglass wrote, with who wrote it.
    Logged { writer: u64, request: u64, change: Change },
    /// The end of an id's retention: forget it.
    Forget(MessageId),
    /// The end of a chunk's retention: its [`Settled`] record, under this
    /// key, is gone once the log is compacted.
    ForgetChunk(Vec<u8>),
    /// A deleted row's tombstone (of a shard's own table): whatever is
    /// left of it goes.
    ForgetRow(Table, Vec<u8>),
    /// Nothing to apply: the tombstone of an owner, of marks, or of a row
    /// no copy of a shard forgets.
    Skip(String),
    /// A sealed record this build cannot read: a newer release wrote it
    /// (another format, a change or a key this build does not know), or it
    /// is damaged. Skipping it could lose a change (a schedule, a cancel),
    /// so the copy of the shard stops before it ([`crate::cluster`]'s
    /// applier), saying why.
    Unreadable(String),
    /// A record without the cluster's seal ([`super::seal`]): no node of
    /// this cluster wrote it. Not applied, and counted and logged as
    /// forged, with why.
    Forged(&'static str),
}

/// Reads one record of a log partition: its key, value (none for a
/// tombstone) and headers, and whether it carries the cluster's seal. Only
/// the nodes of the cluster write the log: a record without the seal is
/// [`Entry::Forged`], whatever it says it is (Kafka-native schedules come
/// through an ingress topic, `crate::ingress`).
pub fn read<'a>(
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: impl IntoIterator<Item = (&'a str, Option<&'a [u8]>)>,
    sealed: bool,
) -> Entry {
    if !sealed {
        return Entry::Forged(if value.is_some() {
            "a record without the cluster's seal"
        } else {
            "a tombstone without the cluster's seal"
        });
    }
    let format = headers.into_iter().find(|(name, _)| *name == RECORD_HEADER).map(|(_, v)| v);
    let Some(format) = format else {
        return Entry::Unreadable(format!("a sealed record without the {RECORD_HEADER} header"));
    };
    if format != Some(FORMAT.as_bytes()) {
        let shown = format.map(String::from_utf8_lossy).unwrap_or_default();
        return Entry::Unreadable(format!("record format {shown:?} is not one this build reads ({FORMAT})"));
    }
    let Some(value) = value else {
        let row = key.and_then(|key| Some((table_of(*key.first()?)?, &key[1..])));
        if let Some((table, row)) = row {
            return if table.spread() == Spread::Shard && table.admits(row, &RowValue::Delete) {
                Entry::ForgetRow(table, row.to_vec())
            } else {
                Entry::Skip(format!("a tombstone of {} that this build does not forget", table.describe(row)))
            };
        }
        return match key {
            Some(key @ [CHUNK_KEY_MARK, ..]) if key.len() == CHUNK_KEY_LEN => {
                Entry::ForgetChunk(key.to_vec())
            }
            Some([CHUNK_KEY_MARK | OWNER_KEY_MARK | MARKS_KEY_MARK, ..]) => {
                Entry::Skip("the tombstone of an owner, of marks, or of no chunk".to_owned())
            }
            // A key that begins with a mark this build does not know is
            // of a newer release's record, not an id (a tenant's id begins
            // with 0; a shared one is printable).
            Some([mark @ 1..=31, ..]) => {
                Entry::Unreadable(format!("a tombstone whose key begins with the unknown mark {mark}"))
            }
            _ => match key.and_then(MessageId::from_stored) {
                Some(id) => Entry::Forget(id),
                None => Entry::Unreadable("a tombstone whose key is no message id".to_owned()),
            },
        };
    };
    match <LogRecord as prost::Message>::decode(value) {
        Ok(LogRecord { writer, request, change: Some(change) }) => Entry::Logged { writer, request, change },
        Ok(LogRecord { change: None, .. }) => {
            Entry::Unreadable("a record of a change this build does not know".to_owned())
        }
        Err(e) => Entry::Unreadable(format!("undecodable record: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::message::Header;

    fn message() -> LogMessage {
        let envelope = Envelope {
            topic: "orders".into(),
            key: Some(b"k".to_vec()),
            value: b"v".to_vec(),
            headers: vec![Header { key: "trace".into(), value: b"1".to_vec() }],
            partition: Some(2),
            labels: crate::message::Labels::new([("order".to_owned(), "1".to_owned())]).unwrap(),
            max_lateness: None,
            dead_letter_topic: None,
        };
        let id = MessageId::parse("order-1").unwrap();
        LogMessage::new(
            &id,
            &envelope,
            DueSpec::After(Duration::from_secs(30)),
            UnixMillis(31_000),
            UnixMillis(1_000),
        )
    }

    fn read_internal(key: &[u8], value: Option<&[u8]>, format: &str) -> Entry {
        let headers = [(RECORD_HEADER, Some(format.as_bytes()))];
        read(Some(key), value, headers, true)
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let record = LogRecord { writer: 7, request: 9, change: Some(Change::Scheduled(message())) };
        let entry = read_internal(b"order-1", Some(&record.encode()), FORMAT);
        assert_eq!(entry, Entry::Logged { writer: 7, request: 9, change: Change::Scheduled(message()) });
        let m = message();
        assert_eq!(m.message_id().unwrap().as_str(), "order-1");
        assert_eq!((m.requested_at_ms, m.requested_delay_ms), (None, Some(30_000)));
        assert_eq!(m.headers[0].key, "trace");
    }

    #[test]
    fn a_tombstone_forgets_an_id_or_a_chunk_and_skips_an_owner() {
        assert_eq!(
            read_internal(b"order-1", None, FORMAT),
            Entry::Forget(MessageId::parse("order-1").unwrap())
        );
        let chunk = chunk_key(UnixMillis(5), 1, 2);
        assert_eq!(read_internal(&chunk, None, FORMAT), Entry::ForgetChunk(chunk));
        assert!(matches!(read_internal(&owner_key(), None, FORMAT), Entry::Skip(_)));
        let tenants = read_internal(b"\0acme\0order-1", None, FORMAT);
        assert!(matches!(&tenants, Entry::Forget(id) if id.tenant() == Some("acme")), "{tenants:?}");
    }

    #[test]
    fn chunk_keys_sort_by_time_first() {
        let (early, late) = (chunk_key(UnixMillis(1), u64::MAX, u64::MAX), chunk_key(UnixMillis(2), 0, 0));
        assert!(early < late);
        assert_eq!(early.len(), CHUNK_KEY_LEN);
    }

    #[test]
    fn an_unknown_format_change_or_key_is_unreadable_not_skipped() {
        let unreadable = |entry: Entry, says: &str| matches!(entry, Entry::Unreadable(r) if r.contains(says));
        assert!(unreadable(read_internal(b"a", Some(b"\x08\x01"), "2"), "\"2\""));
        let empty = LogRecord { writer: 1, request: 1, change: None };
        assert!(unreadable(read_internal(b"a", Some(&empty.encode()), FORMAT), "change"));
        assert!(unreadable(read_internal(b"a", Some(b"\xff\xff"), FORMAT), "undecodable"));
        assert!(unreadable(read_internal(b"\xff\x00", None, FORMAT), "no message id"));
        assert!(unreadable(read_internal(b"\x07row", None, FORMAT), "unknown mark 7"));
    }

    #[test]
    fn a_record_marked_as_hourglass_s_without_the_seal_is_forged() {
        let record = LogRecord { writer: 7, request: 9, change: Some(Change::Owner(Owner::default())) };
        let headers = [(RECORD_HEADER, Some(FORMAT.as_bytes()))];
        for value in [Some(record.encode()), None] {
            let entry = read(Some(&owner_key()), value.as_deref(), headers, false);
            assert!(matches!(entry, Entry::Forged(_)), "{entry:?}");
        }
        let chunk = chunk_key(UnixMillis(5), 1, 2);
        let entry = read(Some(&chunk), None, headers, false);
        assert!(matches!(entry, Entry::Forged(_)), "a chunk's tombstone too: {entry:?}");
    }

    /// Kafka-native schedules come through an ingress topic now: one
    /// written to the log, headers and all, is as forged as any other
    /// record the cluster did not write.
    #[test]
    fn a_record_without_the_seal_is_forged_whatever_it_says() {
        let native = [("hourglass-topic", Some(&b"orders"[..])), ("hourglass-delay", Some(&b"5s"[..]))];
        assert!(matches!(read(Some(b"n-1"), Some(b"v"), native, false), Entry::Forged(_)));
        assert!(matches!(read(Some(b"n-1"), None, [], false), Entry::Forged(_)), "a tombstone too");
        assert!(
            matches!(read(Some(b"n-1"), Some(b"v"), [], true), Entry::Unreadable(_)),
            "sealed, no format"
        );
    }

    #[test]
    fn the_ingress_table_keeps_the_keys_of_earlier_builds_records() {
        // `Ingress` records were keyed by the mark, the topic, a 0 and the
        // partition: the rows of the ingress table are, so compaction keeps
        // the latest of either.
        let row = crate::command::IngressPosition { topic: "in".into(), partition: 3, next: 7 }.row();
        assert_eq!(row_key(Table::Ingress, &row.key), b"\x04in\0\0\0\0\x03");
        let RowValue::Put(bytes) = row.value.clone() else { unreachable!() };
        let as_row = Row { key: row.key.clone(), value: Some(bytes), old_wake_ms: None, wake_ms: None };
        let earlier = Change::Ingress(Ingress { topic: "in".into(), partition: 3, next: 7 });
        assert!(Change::of_row(Table::Ingress, as_row) == earlier, "written as earlier builds read it");
        assert!(matches!(read_internal(&row_key(Table::Ingress, &row.key), None, FORMAT), Entry::Skip(_)));
    }
}
