//! What a node keeps of the shards, for operators: each copy (owned,
//! standby, being taken or let go), how far it is behind the schedule log,
//! and the node's latest moves. Standalone, every shard is the node's own
//! and there is no log.

use crate::message::UnixMillis;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Owner,
    Standby,
    Taking,
    LettingGo,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardCopy {
    pub shard: u32,
    pub role: Role,
    pub pending: u64,
    /// The log offset the copy applies next; none standalone.
    pub applied: Option<i64>,
    /// The log partition's end; none standalone, or when unread.
    pub log_end: Option<i64>,
}

/// A move of one shard on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Move {
    pub at: UnixMillis,
    pub shard: u32,
    /// taken, let go, take failed, standby kept, standby dropped.
    pub what: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Picture {
    /// When it was taken (set by whoever has the clock).
    pub as_of: UnixMillis,
    pub cluster: bool,
    pub shards: u32,
    /// Where the node answers gRPC (in a cluster).
    pub addr: String,
    pub copies: Vec<ShardCopy>,
    /// Newest first.
    pub moves: Vec<Move>,
}
