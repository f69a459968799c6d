//! What a shard answers when a read or a change fails: every way, named by
//! situation.

use crate::message::MessageId;

#[derive(Clone, Debug, thiserror::Error)]
pub enum StoreError {
    #[error("no message with id {0}")]
    NotFound(MessageId),
    #[error("id {0} is already taken by a different message")]
    IdConflict(MessageId),
    #[error("message {0} was already delivered")]
    AlreadyDelivered(MessageId),
    #[error("message {0} was cancelled")]
    AlreadyCancelled(MessageId),
    #[error(
        "message {0} is being produced to Kafka and Kafka has not confirmed it yet, so it is not known \
         whether it is on its topic; retry: the answer then says so"
    )]
    Dispatching(MessageId),
    #[error(
        "the token {token:?} may not use topic {topic:?}; the tokens file (--auth-tokens) lists its topics"
    )]
    Forbidden { token: String, topic: String },
    #[error("the store's disk is full: {0}")]
    Full(String),
    #[error(
        "{pending} messages are pending, the most this server holds (--max-pending); try again once some are delivered"
    )]
    AtCapacity { pending: u64 },
    /// A read that walks entries its caller does not see ran out of time
    /// before it could stop at one the caller may know of.
    #[error(
        "this window holds more due messages than one forecast counts in {seconds} s; ask for a shorter \
         window (a `to` nearer its `from`)"
    )]
    WalkTooLong { seconds: u64 },
    #[error("the store is closed")]
    Closed,
    /// Cluster mode: the schedule log could not take or apply a change.
    #[error("{0}")]
    LogUnavailable(String),
    /// Cluster mode: another node owns the shard; nothing was changed
    /// here, and the request can go to the owner.
    #[error(
        "shard {0} (the schedule log's partition {0}) is owned by another node of the cluster; nothing was \
         changed here: retry with the same id (any node forwards it to the owner)"
    )]
    NotOwner(u32),
    #[error("the store is corrupt: {0}")]
    Corrupt(String),
    #[error("store I/O failed: {0}")]
    Io(String),
}
