//! Standalone: every shard is this process's. [`LocalShards`] opens each
//! shard's store from the data dir at start (refusing a data dir laid out
//! for another shard count) and starts its dispatcher, sends each shard's
//! changes to its store, and mirrors the stores' health and damage into
//! one of each, until shutdown.

use std::sync::Arc;

use futures_util::future;
use tokio::sync::watch;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use super::{NodeConfig, NodeError, ShardSet};
use crate::{
    clock::Clock,
    command::{Answer, Intent, NewMessage, Place, Row},
    kafka::Producer,
    message::Scheduled,
    shard::{self, Seams, Shard},
    store::{Reader, ShardOf, Store, StoreError, StoreHealth},
};

/// Every shard, opened by this process: the node's [`ShardSet`] when it
/// runs alone.
pub(crate) struct LocalShards {
    /// Every shard, in shard order.
    shards: Vec<Shard>,
    health: watch::Receiver<StoreHealth>,
    damaged: CancellationToken,
    stop: CancellationToken,
    watchers: TaskTracker,
}

impl LocalShards {
    /// Opens every shard's store (refusing a data dir laid out for another
    /// shard count) and starts their dispatchers. A shard that fails to
    /// open stops those opened before it.
    pub(crate) async fn open(
        config: &NodeConfig,
        producer: Arc<Producer>,
        clock: Arc<dyn Clock>,
    ) -> Result<LocalShards, NodeError> {
        let paths = config.shard_paths()?;
        let per_shard = config.max_pending_per_shard();
        let mut shards: Vec<Shard> = Vec::with_capacity(paths.len());
        for (shard, path) in (0..).zip(paths) {
            let mut shard_config = config.shard.clone();
            shard_config.store.path = path.clone();
            shard_config.store.shard = ShardOf { shard, shards: config.shards };
            shard_config.store.max_pending = per_shard;
            let store = match Store::open(&shard_config.store) {
                Ok(store) => store,
                Err(source) => {
                    future::join_all(shards.iter().map(Shard::shutdown)).await;
                    return Err(NodeError::Open { path, source });
                }
            };
            let recorded = store.recorded_shard();
            if recorded != shard_config.store.shard {
                store.close().await;
                future::join_all(shards.iter().map(Shard::shutdown)).await;
                return Err(NodeError::ShardCount {
                    dir: config.data_dir.clone(),
                    found: recorded.shards,
                    asked: config.shards,
                });
            }
            let seams = Seams::standalone(&store);
            match shard::producer_of(&store, &producer, false) {
                Ok(producer) => shards.push(Shard::start(
                    store.clone(),
                    &shard_config,
                    producer,
                    Arc::clone(&clock),
                    seams,
                )),
                Err(source) => {
                    store.close().await;
                    future::join_all(shards.iter().map(Shard::shutdown)).await;
                    return Err(NodeError::Open { path, source });
                }
            }
        }
        let (damaged, stop) = (CancellationToken::new(), CancellationToken::new());
        let watchers = TaskTracker::new();
        let stores: Vec<Store> = shards.iter().map(|s| s.store().clone()).collect();
        let (tx, health) = watch::channel(StoreHealth::Ok);
        watchers.spawn(watch_health(stores.clone(), tx, stop.clone()));
        watchers.spawn(watch_damage(stores, damaged.clone(), stop.clone()));
        watchers.close();
        Ok(LocalShards { shards, health, damaged, stop, watchers })
    }

    fn store_of(&self, shard: usize) -> &Store {
        self.shards[shard].store()
    }
}

#[tonic::async_trait]
impl ShardSet for LocalShards {
    fn count(&self) -> usize {
        self.shards.len()
    }

    fn serves(&self, _shard: usize) -> bool {
        true
    }

    async fn served(&self, _shard: usize) -> CancellationToken {
        self.stop.child_token()
    }

    async fn reader(&self, shard: usize) -> Result<Reader, StoreError> {
        Ok(self.store_of(shard).reader())
    }

    fn readers(&self) -> Vec<(u32, Reader)> {
        (0..).zip(self.shards.iter().map(|s| s.store().reader())).collect()
    }

    async fn change(&self, shard: usize, intent: Intent) -> Result<Answer, StoreError> {
        self.store_of(shard).change(intent).await
    }

    async fn schedule_batch(
        &self,
        shard: usize,
        msgs: Vec<NewMessage>,
    ) -> Result<Vec<Result<Scheduled, StoreError>>, StoreError> {
        self.store_of(shard).schedule_batch(msgs).await
    }

    async fn write_rows(&self, to: Place, rows: Vec<Row>) -> Result<(), StoreError> {
        match to {
            Place::Shard(shard) => self.store_of(shard).write_rows(rows).await,
            Place::Everywhere => {
                let written = self.shards.iter().map(|shard| shard.store().write_rows(rows.clone()));
                future::try_join_all(written).await.map(|_| ())
            }
        }
    }

    fn health(&self) -> watch::Receiver<StoreHealth> {
        self.health.clone()
    }

    fn damaged(&self) -> CancellationToken {
        self.damaged.clone()
    }

    async fn shutdown(&self) {
        future::join_all(self.shards.iter().map(Shard::shutdown)).await;
        self.stop.cancel();
        self.watchers.wait().await;
    }
}

/// The worst health of any shard, mirrored until `stop`.
async fn watch_health(stores: Vec<Store>, health: watch::Sender<StoreHealth>, stop: CancellationToken) {
    let mut shards: Vec<watch::Receiver<StoreHealth>> = stores.iter().map(Store::health).collect();
    loop {
        let now = worst(shards.iter_mut().map(|h| h.borrow_and_update().clone()));
        health.send_if_modified(|h| std::mem::replace(h, now.clone()) != now);
        let changed = future::select_all(shards.iter_mut().map(|h| Box::pin(h.changed())));
        tokio::select! {
            _ = stop.cancelled() => return,
            (result, _, _) = changed => if result.is_err() { return },
        }
    }
}

/// Damage found in any shard, passed on to the node's token.
async fn watch_damage(stores: Vec<Store>, damaged: CancellationToken, stop: CancellationToken) {
    let shards: Vec<CancellationToken> = stores.iter().map(Store::damaged).collect();
    tokio::select! {
        _ = stop.cancelled() => {}
        _ = future::select_all(shards.iter().map(|d| Box::pin(d.cancelled()))) => damaged.cancel(),
    }
}

/// Failing before at capacity before ok; the first failing shard's reason.
fn worst(healths: impl Iterator<Item = StoreHealth>) -> StoreHealth {
    healths.fold(StoreHealth::Ok, |worst, h| match (&worst, &h) {
        (StoreHealth::Failing(_), _) => worst,
        (_, StoreHealth::Failing(_)) | (StoreHealth::Ok, StoreHealth::AtCapacity) => h,
        _ => worst,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_is_as_healthy_as_its_worst_shard() {
        use StoreHealth::*;
        assert_eq!(worst([Ok, Ok].into_iter()), Ok);
        assert_eq!(worst([Ok, AtCapacity].into_iter()), AtCapacity);
        assert_eq!(
            worst([AtCapacity, Failing("disk".into()), Failing("other".into())].into_iter()),
            Failing("disk".into())
        );
    }
}
