//! The small keyed tables a shard keeps beside its messages ([`Table`]):
//! a room's records by key (a series, a dispatch policy), written by
//! [`Row`]s, each durable and, in cluster mode, replicated through the
//! schedule log. The store keeps and reads any table alike, and the log
//! carries any table's rows alike: a new kind of record is a [`Table`]
//! variant with its rules below, not a new path through the store, the
//! shard sets and the log.

use crate::message::{MessageId, UnixMillis};

/// A kind of record a shard keeps by key. What its bytes hold is its
/// room's; here are the rules every layer applies to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Table {
    /// Recurring series (`crate::series`), by series id, with a wake
    /// index of when each next parks an occurrence.
    Series,
    /// Dispatch policies (`crate::policy`), by `PolicyKey`.
    Policy,
    /// How far each partition of an ingress topic was read
    /// (`crate::ingress`), by topic and partition.
    Ingress,
}

/// Where a table's rows live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spread {
    /// In the shard of their key, written by its owner only (in cluster
    /// mode: applied only from the record of the log's named owner).
    Shard,
    /// In every shard, written by any node: of two changes of one key the
    /// later wins ([`Table::order`]), whatever order they come in.
    Everywhere,
}

impl Table {
    /// Every table, for whoever must walk them all.
    pub const ALL: [Table; 3] = [Table::Series, Table::Policy, Table::Ingress];

    pub fn spread(self) -> Spread {
        match self {
            Table::Series | Table::Ingress => Spread::Shard,
            Table::Policy => Spread::Everywhere,
        }
    }

    /// Of a [`Spread::Shard`] table, whether a row is applied only from
    /// the record of the shard's owner (the log's latest claim). The
    /// ingress table's is not: a read position says how far records were
    /// turned into calls, whoever noted it, and one applied late costs
    /// retries, never a message; while a copy rebuilt from the compacted
    /// log, whose earlier claims are gone, would refuse an owner's.
    pub fn fenced(self) -> bool {
        !matches!(self, Table::Ingress)
    }

    /// Whether the store keeps the whole table in memory too, handed to
    /// whoever watches it after each commit that changed it.
    pub fn cached(self) -> bool {
        matches!(self, Table::Policy)
    }

    /// Whether a row read from outside (the schedule log) is one this
    /// table may hold: a key and bytes its room reads, within the bounds
    /// a caller's own write has. One that is not is skipped, never kept.
    pub fn admits(self, key: &[u8], value: &RowValue) -> bool {
        match self {
            Table::Series => MessageId::from_stored(key).is_some(),
            Table::Policy => match value {
                RowValue::Put(bytes) => crate::policy::row_reads(key, bytes),
                RowValue::Delete | RowValue::Keep => false,
            },
            Table::Ingress => match value {
                RowValue::Put(bytes) => IngressPosition::read(key, bytes).is_some(),
                RowValue::Delete | RowValue::Keep => false,
            },
        }
    }

    /// Of a [`Spread::Everywhere`] table, where a row's bytes stand among
    /// changes of one key: the later is the greater (by its time, then its
    /// bytes, so that every copy keeps the same whatever order they came
    /// in).
    pub fn order(self, bytes: &[u8]) -> (u64, Vec<u8>) {
        let at = match self {
            Table::Series | Table::Ingress => 0,
            Table::Policy => crate::policy::changed_at(bytes),
        };
        (at, bytes.to_vec())
    }

    /// A row's key as a person reads it, for errors and logs.
    pub fn describe(self, key: &[u8]) -> String {
        match self {
            Table::Series => format!("series {}", String::from_utf8_lossy(key)),
            Table::Policy => crate::policy::describe_row(key),
            Table::Ingress => IngressPosition::describe(key),
        }
    }
}

/// A row of [`Table::Ingress`]: partition `partition` of the ingress topic
/// `topic` was read up to `next`, the offset of the next record to read.
/// Keyed by the topic, a 0 (Kafka's topic names never hold one) and the
/// partition; its bytes are `next`, both big-endian.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct IngressPosition {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    pub(crate) next: i64,
}

impl IngressPosition {
    /// The key of `partition` of `topic`.
    pub(crate) fn key(topic: &str, partition: i32) -> Vec<u8> {
        let mut key = Vec::with_capacity(topic.len() + 5);
        key.extend_from_slice(topic.as_bytes());
        key.push(0);
        key.extend_from_slice(&partition.to_be_bytes());
        key
    }

    /// The row that says so.
    pub(crate) fn row(&self) -> Row {
        Row::put(Table::Ingress, Self::key(&self.topic, self.partition), self.next.to_be_bytes().to_vec())
    }

    /// A row read back; none if it does not read.
    pub(crate) fn read(key: &[u8], bytes: &[u8]) -> Option<IngressPosition> {
        let (topic, partition) = key.split_last_chunk::<4>()?;
        let topic = std::str::from_utf8(topic.strip_suffix(&[0])?).ok()?;
        let next = i64::from_be_bytes(bytes.try_into().ok()?);
        (!topic.is_empty() && next >= 0).then(|| IngressPosition {
            topic: topic.to_owned(),
            partition: i32::from_be_bytes(*partition),
            next,
        })
    }

    fn describe(key: &[u8]) -> String {
        match key.split_last_chunk::<4>() {
            Some((topic, partition)) => format!(
                "the read position of partition {} of the ingress topic {}",
                i32::from_be_bytes(*partition),
                String::from_utf8_lossy(topic.strip_suffix(&[0]).unwrap_or(topic))
            ),
            None => format!("the read position {:?}", String::from_utf8_lossy(key)),
        }
    }
}

/// One change of one row of a table: its new bytes, and its entry in the
/// table's wake index moved from `old_wake` to `wake`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub table: Table,
    pub key: Vec<u8>,
    pub value: RowValue,
    pub old_wake: Option<UnixMillis>,
    pub wake: Option<UnixMillis>,
}

impl Row {
    /// The row `key` of `table` becomes `bytes`; no wake moves.
    pub fn put(table: Table, key: Vec<u8>, bytes: Vec<u8>) -> Row {
        Row { table, key, value: RowValue::Put(bytes), old_wake: None, wake: None }
    }
}

/// What a write does to a row's bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RowValue {
    Put(Vec<u8>),
    Delete,
    /// Unchanged: only its wake moves.
    Keep,
}

/// Where rows go: one shard's store, or every shard's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    Shard(usize),
    Everywhere,
}
