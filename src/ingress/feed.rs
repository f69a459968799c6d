//! Where an ingress topic's records come from, as the ingress needs it: a
//! partition read from an offset, moved, and its end asked. The Kafka
//! client behind it is the wiring's choice (the same one, standalone and
//! in cluster mode); the tests give a feed of their own.

use std::sync::Arc;

use crate::message::UnixMillis;

/// A record of an ingress topic, as read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Raw {
    pub(crate) offset: i64,
    /// The record's timestamp: a delay counts from it.
    pub(crate) at: UnixMillis,
    pub(crate) key: Option<Vec<u8>>,
    pub(crate) value: Option<Vec<u8>>,
    pub(crate) headers: Vec<(String, Option<Vec<u8>>)>,
}

/// A failure of the feed: reading, moving or asking the end failed. The
/// ingress says so and tries again.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct FeedError(pub(crate) String);

/// One ingress topic's records, by partition.
#[tonic::async_trait]
pub(crate) trait Feed: Send + Sync {
    /// The topic's name.
    fn topic(&self) -> &str;

    /// How many partitions it has; the topic is made first if it is
    /// missing. A failure (the broker unreachable, say) is tried again.
    async fn partitions(&self) -> Result<i32, FeedError>;

    /// A reader of `partition`, put at `offset`. A reader of the partition
    /// still open stops reading.
    fn open(&self, partition: i32, offset: i64) -> Result<Arc<dyn PartitionFeed>, FeedError>;
}

/// One partition of an ingress topic, read in order.
#[tonic::async_trait]
pub(crate) trait PartitionFeed: Send + Sync {
    /// Waits for the next records, and takes up to `max` of those already
    /// fetched. Only committed records: an open transaction holds back its
    /// partition, an aborted one is never read.
    async fn next(&self, max: usize) -> Result<Vec<Raw>, FeedError>;

    /// Reads from `offset` on.
    async fn seek(&self, offset: i64) -> Result<(), FeedError>;

    /// The offset the partition's next record gets.
    async fn end(&self) -> Result<i64, FeedError>;
}
