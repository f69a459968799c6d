//! A shard: one store and the dispatcher that drains it, plus the upkeep
//! they need (retention purge, compaction, gauges). A node owns several;
//! nothing here knows of the others.

use std::{sync::Arc, time::Duration};

use tokio_util::{sync::CancellationToken, task::TaskTracker};

use crate::{
    clock::Clock,
    dispatcher::{Dispatcher, DispatcherConfig, Lease, Recorder},
    kafka::Producer,
    store::{Store, StoreConfig, StoreHealth, schema::DispatchKey},
};

#[derive(Clone, Debug)]
pub struct ShardConfig {
    pub store: StoreConfig,
    pub dispatcher: DispatcherConfig,
    /// How long delivered, cancelled and failed messages stay queryable.
    pub retention: Duration,
    /// How often upkeep runs.
    pub upkeep_every: Duration,
}

pub struct Shard {
    store: Store,
    stop: CancellationToken,
    tasks: TaskTracker,
}

impl Shard {
    /// Starts the dispatcher and upkeep of an opened store.
    pub fn start(
        store: Store,
        config: &ShardConfig,
        producer: Arc<Producer>,
        clock: Arc<dyn Clock>,
    ) -> Shard {
        let dispatcher =
            Dispatcher::new(store.clone(), producer, Arc::clone(&clock), config.dispatcher.clone());
        Shard::launch(store, config, clock, dispatcher)
    }

    /// Cluster mode: starts a shard whose dispatcher records its settles
    /// through `recorder` rather than in the store, and produces only while
    /// `lease` holds and the log names `owner` the shard's owner.
    pub(crate) fn start_in_cluster(
        store: Store,
        config: &ShardConfig,
        producer: Arc<Producer>,
        clock: Arc<dyn Clock>,
        recorder: Arc<dyn Recorder>,
        lease: Arc<Lease>,
        owner: u64,
    ) -> Shard {
        let dispatcher =
            Dispatcher::new(store.clone(), producer, Arc::clone(&clock), config.dispatcher.clone())
                .recording_to(recorder)
                .leased(lease, owner);
        Shard::launch(store, config, clock, dispatcher)
    }

    fn launch(store: Store, config: &ShardConfig, clock: Arc<dyn Clock>, dispatcher: Dispatcher) -> Shard {
        let stop = CancellationToken::new();
        let tasks = TaskTracker::new();
        tasks.spawn(dispatcher.run(stop.clone()));
        tasks.spawn(upkeep(store.clone(), clock, config.retention, config.upkeep_every, stop.clone()));
        tasks.spawn(probe_while_failing(store.clone(), stop.clone()));
        tasks.close();
        Shard { store, stop, tasks }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Stops the dispatcher (after it settles what is in flight) and upkeep,
    /// then closes the store once every queued change is committed.
    pub async fn shutdown(&self) {
        self.stop_tasks().await;
        self.store.close().await;
    }

    /// Stops the dispatcher (after it settles what is in flight) and
    /// upkeep; the store stays open.
    pub async fn stop_tasks(&self) {
        self.stop.cancel();
        self.tasks.wait().await;
    }
}

/// While the store's writes fail (disk full, I/O error), tries a tiny write
/// every second, so that it reports healthy again as soon as it can take
/// writes, even if no client sends any meanwhile.
async fn probe_while_failing(store: Store, stop: CancellationToken) {
    const EVERY: Duration = Duration::from_secs(1);
    let mut health = store.health();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            failing = health.wait_for(|h| matches!(h, StoreHealth::Failing(_))) => {
                if failing.is_err() {
                    return;
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(EVERY) => {}
        }
        if let Err(e) = store.probe().await {
            tracing::debug!(error = %e, "the store still refuses writes");
        }
    }
}

/// Purges settled messages past retention, compacts the settled head of the
/// due CF, updates the store gauges and returns freed heap to the kernel.
/// A store that took no write for a whole round is at rest: its memtables
/// are written out once, so that a quiet backlog costs no write buffers.
async fn upkeep(
    store: Store,
    clock: Arc<dyn Clock>,
    retention: Duration,
    every: Duration,
    stop: CancellationToken,
) {
    const PURGE_BATCH: usize = 10_000;
    const COMPACT_EVERY: u32 = 20;
    let mut rounds = 0u32;
    let (mut last_write, mut at_rest) = (store.write_seq(), false);
    loop {
        let now = clock.now();
        let before = crate::message::UnixMillis(now.0.saturating_sub(retention.as_millis() as u64));
        loop {
            match store.purge(before, PURGE_BATCH).await {
                Ok(n) if n >= PURGE_BATCH && !stop.is_cancelled() => continue,
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "purging settled messages failed");
                    break;
                }
            }
        }
        rounds += 1;
        if rounds % COMPACT_EVERY == 0 {
            // Below this lie delivered entries kept until retention and
            // the tombstones of what was cancelled, moved or purged.
            // Compaction drops the tombstones; files already at the
            // bottom level are not rewritten.
            let below = DispatchKey::after(crate::message::UnixMillis(now.0.saturating_sub(60_000)));
            if let Err(e) = store.compact_settled(below).await {
                tracing::warn!(error = %e, "compacting the settled head of the due index failed");
            }
        }
        match store.size_bytes().await {
            Ok(bytes) => store.metrics().size.set(i64::try_from(bytes).unwrap_or(i64::MAX)),
            Err(e) => tracing::warn!(error = %e, "reading the store's size failed"),
        }
        let write = store.write_seq();
        if write != last_write {
            (last_write, at_rest) = (write, false);
        } else if !at_rest {
            at_rest = true;
            if let Err(e) = store.flush_memtables().await {
                tracing::warn!(error = %e, "writing out the memtables of a store at rest failed");
            }
        }
        // Bursts leave freed heap behind; hand it back while idle-ish.
        tokio::task::spawn_blocking(crate::memory::trim);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}
