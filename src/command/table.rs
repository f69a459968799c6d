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
    pub const ALL: [Table; 2] = [Table::Series, Table::Policy];

    pub fn spread(self) -> Spread {
        match self {
            Table::Series => Spread::Shard,
            Table::Policy => Spread::Everywhere,
        }
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
        }
    }

    /// Of a [`Spread::Everywhere`] table, where a row's bytes stand among
    /// changes of one key: the later is the greater (by its time, then its
    /// bytes, so that every copy keeps the same whatever order they came
    /// in).
    pub fn order(self, bytes: &[u8]) -> (u64, Vec<u8>) {
        let at = match self {
            Table::Series => 0,
            Table::Policy => crate::policy::changed_at(bytes),
        };
        (at, bytes.to_vec())
    }

    /// A row's key as a person reads it, for errors and logs.
    pub fn describe(self, key: &[u8]) -> String {
        match self {
            Table::Series => format!("series {}", String::from_utf8_lossy(key)),
            Table::Policy => crate::policy::describe_row(key),
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
