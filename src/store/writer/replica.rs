//! Cluster mode: what a record of the shard's log means to the store, in
//! the store's own terms. The cluster reads the log's format and hands the
//! store a [`LogEntry`] holding a [`Replica`] change for each record; the
//! owner's decisions come back as a [`Proposed`] change for the cluster to
//! write in that format. Nothing here knows how a record is laid out.

use std::sync::Arc;

use crate::{
    command::{Handed, Outcome, Row, Settle, Table},
    message::{MessageId, UnixMillis},
    store::{claims::Floor, schema::MessageRecord},
};

/// One record of the shard's log partition, to apply.
#[derive(Debug)]
pub(crate) struct LogEntry {
    pub offset: i64,
    /// The record's timestamp.
    pub at: UnixMillis,
    /// The node that wrote the record, if hourglass did (a Kafka-native
    /// record has none): only such a record tells the log's time.
    pub writer: Option<u64>,
    pub change: Replica,
    /// What this node knows of the record because it wrote it.
    pub local: Option<Local>,
}

/// What applying one record of the log changes.
#[derive(Debug)]
pub(crate) enum Replica {
    /// The writer took the shard, or let go of it (`released`): if it was
    /// the owner, the shard has none until the next claim.
    Owner { writer: u64, released: bool },
    /// Park a message. `fresh`: its id was made for it, so no earlier
    /// message can hold it.
    Schedule { id: MessageId, record: MessageRecord, fresh: bool },
    /// Move a message to the record's due time (or park it, if its earlier
    /// records were compacted away).
    Reschedule { id: MessageId, record: MessageRecord },
    /// Cancel a message at `at`; `record`, the message whole, restores it
    /// as cancelled where its earlier records were compacted away.
    Cancel { id: MessageId, record: Option<MessageRecord>, at: UnixMillis },
    /// A message failed for `reason` (or never parsed); `record`: what
    /// arrived, for `Get`.
    Fail { id: MessageId, reason: String, at: UnixMillis, record: Option<MessageRecord> },
    /// What became of the produces of one settle. `chunk`: the key of the
    /// record that says so, kept until its messages are forgotten; chunk
    /// keys sort by time (see [`Store::expired_chunks`](crate::store::Store::expired_chunks));
    /// `ids`: every id it names, as stored.
    Settled { chunk: Vec<u8>, ids: Vec<Vec<u8>>, lines: Vec<SettledLine> },
    /// Where each partition of `topic` ended before its first produce.
    Marks { topic: Arc<str>, ends: Vec<(i32, i64)> },
    /// Retention ended for a settled message: forget it.
    Forget(MessageId),
    /// Retention ended for a chunk: forget its key.
    ForgetChunk(Vec<u8>),
    /// A row of a table. One of a shard's table is applied only when the
    /// record's writer owns the shard (an owner fenced meanwhile may have
    /// decided from what the next one changed since); one every shard
    /// keeps, from any node, only if it is a later change of its key than
    /// the one kept, in whatever order they are applied.
    Row(Row),
    /// A deleted row's tombstone: whatever is left of it goes.
    ForgetRow(Table, Vec<u8>),
    /// Nothing to apply; the partition's next offset moves past it.
    Skip,
}

/// One outcome of a [`Replica::Settled`].
#[derive(Debug)]
pub(crate) struct SettledLine {
    pub id: MessageId,
    pub at: UnixMillis,
    pub outcome: Outcome,
    /// How its writer handed a delivery over (see [`Settle::handed`]).
    pub handed: Handed,
}

impl SettledLine {
    /// A settle of this node's dispatcher, as the log records it.
    pub(crate) fn of(settle: &Settle) -> SettledLine {
        SettledLine {
            id: settle.id.clone(),
            at: settle.at,
            outcome: settle.outcome.clone(),
            handed: settle.handed,
        }
    }
}

/// A change the shard's owner decided to log, for a caller: once read back
/// it is applied as the matching [`Replica`].
#[derive(Debug)]
pub enum Proposed {
    Schedule { record: MessageRecord, fresh: bool },
    Reschedule { record: MessageRecord },
    Cancel { record: MessageRecord, at: UnixMillis },
}

#[derive(Debug)]
pub(crate) enum Local {
    /// A change this node decided: its hold on the message ends with it.
    Held(MessageId),
    /// The dispatcher's settles the record covers, as the dispatcher knows
    /// them (no read needed), and the floor it sent with them.
    Settles(Vec<Settle>, Option<Floor>),
}
