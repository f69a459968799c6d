//! The cluster as the node's shards: [`ShardSet`] for [`Cluster`]. The
//! shards are the schedule log's partitions; this node serves those it
//! owns now. A shard's reads go to its owned store, and its changes to its
//! front, which appends them to the log and answers once they are applied.

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::Cluster;
use crate::{
    command::{Answer, Intent, NewMessage, Place, Row},
    message::Scheduled,
    node::{Picture, ShardSet},
    store::{Reader, StoreError, StoreHealth},
};

#[tonic::async_trait]
impl ShardSet for Cluster {
    fn count(&self) -> usize {
        self.partitions() as usize
    }

    async fn picture(&self) -> Picture {
        Cluster::picture(self).await
    }

    fn serves(&self, shard: usize) -> bool {
        self.owns(shard)
    }

    async fn served(&self, shard: usize) -> CancellationToken {
        self.owned_while(shard).await
    }

    async fn reader(&self, shard: usize) -> Result<Reader, StoreError> {
        Ok(self.owner_of(shard).await?.store().reader())
    }

    fn readers(&self) -> Vec<(u32, Reader)> {
        self.owned().into_iter().map(|(n, owned)| (n, owned.store().reader())).collect()
    }

    async fn change(&self, shard: usize, intent: Intent) -> Result<Answer, StoreError> {
        self.owner_of(shard).await?.front().change(intent).await
    }

    /// Each message is a record of its own, answered on its own; the part
    /// is decided and appended together. The call as a whole never fails:
    /// a shard this node cannot serve answers each message with why.
    async fn schedule_batch(
        &self,
        shard: usize,
        msgs: Vec<NewMessage>,
    ) -> Result<Vec<Result<Scheduled, StoreError>>, StoreError> {
        Ok(match self.owner_of(shard).await {
            Ok(owned) => owned.front().schedule_all(msgs).await,
            Err(e) => msgs.iter().map(|_| Err(e.clone())).collect(),
        })
    }

    async fn write_rows(&self, to: Place, rows: Vec<Row>) -> Result<(), StoreError> {
        match to {
            Place::Shard(shard) => self.owner_of(shard).await?.front().write_rows(rows).await,
            Place::Everywhere => Cluster::write_everywhere(self, rows).await,
        }
    }

    fn health(&self) -> watch::Receiver<StoreHealth> {
        Cluster::health(self)
    }

    fn damaged(&self) -> CancellationToken {
        Cluster::damaged(self)
    }

    async fn stopping(&self) {
        Cluster::stopping(self).await;
    }

    /// Each shard is let go as in a move: its last deliveries go to the
    /// log and are applied before its store closes.
    async fn shutdown(&self) {
        Cluster::shutdown(self).await;
    }
}
