//! A shard: one store and the dispatcher that drains it, plus the upkeep
//! they need (retention purge, compaction, gauges). A node owns several;
//! nothing here knows of the others.

use std::{sync::Arc, time::Duration};

use tokio_util::{sync::CancellationToken, task::TaskTracker};

use crate::{
    clock::Clock,
    command::DispatchKey,
    dispatcher::{AlwaysOpen, Dispatcher, DispatcherConfig, Gate, Recorder, StoreRecorder},
    kafka::{Delivery, Producer},
    message::UnixMillis,
    store::{Store, StoreConfig, StoreError, StoreHealth},
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

pub(crate) struct Shard {
    store: Store,
    stop: CancellationToken,
    tasks: TaskTracker,
}

/// What a shard is attached to besides its store: where its dispatcher
/// records what became of each produce, whether it may produce now, and
/// how retention forgets.
pub(crate) struct Seams {
    pub recorder: Arc<dyn Recorder>,
    pub gate: Box<dyn Gate>,
    pub retention: Arc<dyn Retention>,
}

impl Seams {
    /// A node on its own: deliveries are recorded in the store, the
    /// dispatcher may always produce, retention forgets in the store.
    pub(crate) fn standalone(store: &Store) -> Seams {
        Seams {
            recorder: Arc::new(StoreRecorder::new(store.clone())),
            gate: Box::new(AlwaysOpen),
            retention: Arc::new(InStore),
        }
    }
}

impl Shard {
    /// Starts the dispatcher and upkeep of an opened store, producing with
    /// `producer` (see [`producer_of`]).
    pub(crate) fn start(
        store: Store,
        config: &ShardConfig,
        producer: Arc<Producer>,
        clock: Arc<dyn Clock>,
        seams: Seams,
    ) -> Shard {
        let Seams { recorder, gate, retention } = seams;
        let dispatcher = Dispatcher::new(
            store.clone(),
            producer,
            Arc::clone(&clock),
            config.dispatcher.clone(),
            recorder,
            gate,
        );
        let stop = CancellationToken::new();
        let tasks = TaskTracker::new();
        tasks.spawn(dispatcher.run(stop.clone()));
        let purge = Purge { store: store.clone(), retention, stop: stop.clone() };
        tasks.spawn(upkeep(purge, clock, config.retention, config.upkeep_every));
        tasks.spawn(probe_while_failing(store.clone(), stop.clone()));
        tasks.close();
        Shard { store, stop, tasks }
    }

    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    /// Stops the dispatcher (after it settles what is in flight) and upkeep,
    /// then closes the store once every queued change is committed.
    pub(crate) async fn shutdown(&self) {
        self.stop_tasks().await;
        self.store.close().await;
    }

    /// Stops the dispatcher (after it settles what is in flight) and
    /// upkeep; the store stays open.
    pub(crate) async fn stop_tasks(&self) {
        self.stop.cancel();
        self.tasks.wait().await;
    }
}

/// What the shard's dispatcher produces with: the node's producer; one of
/// the shard's own if the shard `moves` between nodes (cluster mode), so
/// that a let-go leaves nothing behind in the node's; or with
/// transactional delivery a transactional producer of the shard's own.
pub(crate) fn producer_of(
    store: &Store,
    producer: &Arc<Producer>,
    moves: bool,
) -> Result<Arc<Producer>, StoreError> {
    let identity = match producer.delivery() {
        Delivery::Idempotent => String::new(),
        Delivery::Transactional { .. } => store.identity()?,
    };
    producer.for_shard(store.recorded_shard().shard, &identity, moves).map_err(producer_failed)
}

/// A shard's producer that could not be made, as the store's error.
pub(crate) fn producer_failed(e: std::io::Error) -> StoreError {
    StoreError::Io(format!("starting the shard's producer: {e}"))
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

/// Purges settled messages past retention, drops the bodies of delivered
/// ones, compacts the settled head of the due CF, updates the store gauges
/// and returns freed heap to the kernel. A store that took no write for a
/// whole round is at rest: its memtables are written out once, what was
/// delivered sheds its bodies, and its block cache shrinks to what stays
/// pinned, so that a quiet backlog costs no write buffers and no cached
/// blocks; the next round that finds a write gives the cache its size back.
async fn upkeep(purge: Purge, clock: Arc<dyn Clock>, retention: Duration, every: Duration) {
    const COMPACT_EVERY: u32 = 20;
    let Purge { store, stop, .. } = &purge;
    let mut rounds = 0u32;
    let (mut last_write, mut at_rest) = (store.write_seq(), false);
    loop {
        let now = clock.now();
        let before = UnixMillis(now.0.saturating_sub(retention.as_millis() as u64));
        if let Err(e) = purge.run(before).await {
            tracing::warn!(error = %e, "purging settled messages failed");
        }
        rounds += 1;
        if rounds % COMPACT_EVERY == 0 {
            // Below this lie delivered entries kept until retention and
            // the tombstones of what was cancelled, moved or purged.
            // Compaction drops the tombstones; files already at the
            // bottom level are not rewritten.
            let below = DispatchKey::after(UnixMillis(now.0.saturating_sub(60_000)));
            if let Err(e) = store.compact_settled(below).await {
                tracing::warn!(error = %e, "compacting the settled head of the due index failed");
            }
        }
        match store.reader().size_bytes().await {
            Ok(bytes) => store.metrics().size.set(i64::try_from(bytes).unwrap_or(i64::MAX)),
            Err(e) => tracing::warn!(error = %e, "reading the store's size failed"),
        }
        let write = store.write_seq();
        let rested = write == last_write && !at_rest;
        if write != last_write {
            if at_rest {
                store.in_use();
            }
            (last_write, at_rest) = (write, false);
        } else if rested {
            at_rest = true;
            if let Err(e) = store.rest().await {
                tracing::warn!(error = %e, "writing out the memtables of a store at rest failed");
            }
        }
        // Once a round: a pass if one is due, and at once when the store
        // has just gone quiet.
        shed(store, rested);
        // Read after the memtables of a store at rest are written out.
        match store.reader().memory().await {
            Ok(m) => {
                let parts = [m.block_cache, m.pinned, m.memtables, m.table_readers];
                for (gauge, bytes) in store.metrics().memory.iter().zip(parts) {
                    gauge.set(i64::try_from(bytes).unwrap_or(i64::MAX));
                }
            }
            Err(e) => tracing::warn!(error = %e, "reading the store's memory failed"),
        }
        // Bursts leave freed heap behind; hand it back while idle-ish.
        tokio::task::spawn_blocking(crate::memory::trim);
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// Drops the bodies of delivered messages if a pass is due, or `now`, on
/// its own: on a busy machine its compaction can take minutes, and the
/// upkeep goes on meanwhile.
fn shed(store: &Store, now: bool) {
    let store = store.clone();
    tokio::spawn(async move {
        if let Err(e) = store.shed_delivered(now).await {
            tracing::warn!(error = %e, "dropping the bodies of delivered messages failed");
        }
    });
}

/// The upkeep's retention: the store, what forgets, and the shard's stop.
struct Purge {
    store: Store,
    retention: Arc<dyn Retention>,
    stop: CancellationToken,
}

impl Purge {
    async fn run(&self, before: UnixMillis) -> Result<(), StoreError> {
        self.retention.expire(&self.store, before, &self.stop).await
    }
}

/// How a shard forgets what retention ended for: standalone, in the store
/// ([`InStore`]); in cluster mode through the schedule log, so that every
/// copy of the shard forgets it and compaction drops it from the log.
#[tonic::async_trait]
pub(crate) trait Retention: Send + Sync {
    /// Forgets what was settled before `bound`, in steps of
    /// [`PURGE_BATCH`] entries, until done or `stop`.
    async fn expire(
        &self,
        store: &Store,
        bound: UnixMillis,
        stop: &CancellationToken,
    ) -> Result<(), StoreError>;
}

/// Entries of the retention index (or log chunks) looked at in one step.
pub(crate) const PURGE_BATCH: usize = 10_000;

/// Retention of a node on its own: the store forgets.
pub(crate) struct InStore;

#[tonic::async_trait]
impl Retention for InStore {
    async fn expire(
        &self,
        store: &Store,
        bound: UnixMillis,
        stop: &CancellationToken,
    ) -> Result<(), StoreError> {
        while store.purge(bound, PURGE_BATCH).await? >= PURGE_BATCH {
            if stop.is_cancelled() {
                break;
            }
        }
        Ok(())
    }
}
