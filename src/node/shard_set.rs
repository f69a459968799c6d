//! What a node needs of the shards its process serves, as one seam:
//! [`ShardSet`]. The node routes each id to its shard and merges what spans
//! shards; a `ShardSet` says which shards are here and where a shard's
//! reads and changes go. Standalone that is [`LocalShards`](super::LocalShards),
//! every shard opened by this process; in cluster mode the cluster's, the
//! shards the consumer group gives this node, which move between nodes.

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Picture, Role, ShardCopy};
use crate::{
    command::{Answer, Intent, NewMessage, Place, Row},
    message::Scheduled,
    store::{Reader, StoreError, StoreHealth},
};

/// The shards one process serves, numbered from 0 to
/// [`count`](Self::count) − 1. What reaches one shard waits a bounded time
/// while the shard moves between nodes (in a cluster), and fails when
/// another node serves it.
#[tonic::async_trait]
pub trait ShardSet: Send + Sync {
    /// How many shards the ids are spread over (in a cluster, over every
    /// node).
    fn count(&self) -> usize;

    /// Whether this process serves `shard` now.
    fn serves(&self, shard: usize) -> bool;

    /// Waits until this process serves `shard`, and returns a token
    /// cancelled once it no longer serves it as it does now (in a cluster,
    /// the shard moved away, or moved away and back), or by the caller.
    /// Standalone, at once, until the node stops.
    async fn served(&self, shard: usize) -> CancellationToken;

    /// What `shard`'s store answers its readers, once this process
    /// serves it (waiting a bounded time while it moves). Its changes go
    /// through the calls below.
    async fn reader(&self, shard: usize) -> Result<Reader, StoreError>;

    /// The readers of the shards this process serves now, with their shard
    /// numbers, in shard order.
    fn readers(&self) -> Vec<(u32, Reader)>;

    /// Makes the change `intent` asks of `shard`: parks a message (once
    /// durable), cancels or moves one.
    async fn change(&self, shard: usize, intent: Intent) -> Result<Answer, StoreError>;

    /// Parks `msgs`, all of `shard`, each answered in order. Fails as a
    /// whole only when nothing of it was stored.
    async fn schedule_batch(
        &self,
        shard: usize,
        msgs: Vec<NewMessage>,
    ) -> Result<Vec<Result<Scheduled, StoreError>>, StoreError>;

    /// Writes rows of tables (see [`Store::write_rows`]) to one shard or
    /// to every shard, durably: standalone each store's commit; in a
    /// cluster, records of the log (of one shard: applied only while this
    /// node owns it; of every shard: a record in every partition, by any
    /// node). Returns once each shard served here that they go to has
    /// them.
    async fn write_rows(&self, to: Place, rows: Vec<Row>) -> Result<(), StoreError>;

    /// Whether every shard served takes new messages (the worst of their
    /// healths), and in a cluster whether the first shards are taken.
    fn health(&self) -> watch::Receiver<StoreHealth>;

    /// Cancelled once damage is found in a served shard's store.
    fn damaged(&self) -> CancellationToken;

    /// Says the process is about to stop answering: in a cluster, the
    /// nodes standing by for its shards then take each as it lets go of
    /// it. Standalone, nothing.
    async fn stopping(&self) {}

    /// Stops every shard: dispatchers settle what is in flight, stores
    /// commit what is queued and close.
    async fn shutdown(&self);

    /// The copies of shards kept here, for operators. By default (a
    /// standalone node) every shard served, owned, with no log.
    async fn picture(&self) -> Picture {
        let copies = self
            .readers()
            .into_iter()
            .map(|(shard, reader)| ShardCopy {
                shard,
                role: Role::Owner,
                pending: reader.pending(),
                applied: None,
                log_end: None,
            })
            .collect();
        Picture {
            as_of: Default::default(),
            cluster: false,
            shards: self.count() as u32,
            addr: String::new(),
            copies,
            moves: Vec::new(),
        }
    }
}
