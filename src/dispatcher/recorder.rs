//! Where the dispatcher records what became of its produces: standalone,
//! in the store ([`StoreRecorder`]); in cluster mode, in the schedule log,
//! applied to the store from there.

use std::sync::Arc;

use crate::{
    command::{DispatchKey, Settle},
    store::{Floor, Store, StoreError},
};

/// Where a shard's dispatcher records its settles, its marks and its
/// horizon: the store, or in cluster mode the schedule log, applied to the
/// store from there. A failure to record is the store's kind of error (in
/// cluster mode, the log's unavailability is one).
#[tonic::async_trait]
pub(crate) trait Recorder: Send + Sync {
    /// Records what became of produces, and, with a `floor`, that no due
    /// entry below it is pending once they are. A failure is the
    /// recorder's to report.
    async fn record(&self, settles: Vec<Settle>, floor: Option<Floor>);

    /// Waits until every settle recorded so far is in the log (or, in the
    /// store, committed).
    async fn flushed(&self) -> Result<(), StoreError>;

    /// Records where `topic`'s partitions end (see [`Store::mark`]);
    /// returns once it is recorded.
    async fn mark(&self, topic: Arc<str>, ends: Vec<(i32, i64)>) -> Result<(), StoreError>;

    /// Records that the dispatcher may produce what lies below `until`
    /// (see [`Store::extend_horizon`]); returns once that is durable. A
    /// recorder that needs no horizon answers at once.
    async fn extend_horizon(&self, until: DispatchKey) -> Result<(), StoreError>;

    /// Records that the dispatcher produces nothing from `until` on (lower
    /// than the horizon recorded: nothing was produced past it); returns
    /// once that is durable.
    async fn lower_horizon(&self, until: DispatchKey) -> Result<(), StoreError>;
}

/// Standalone: the dispatcher records in the store itself.
pub(crate) struct StoreRecorder {
    store: Store,
}

impl StoreRecorder {
    pub(crate) fn new(store: Store) -> Self {
        StoreRecorder { store }
    }
}

#[tonic::async_trait]
impl Recorder for StoreRecorder {
    async fn record(&self, settles: Vec<Settle>, floor: Option<Floor>) {
        if let Err(e) = self.store.settle(settles, floor).await {
            tracing::error!(error = %e, "settling deliveries failed; they will be produced again after restart");
        }
    }

    async fn flushed(&self) -> Result<(), StoreError> {
        // Every change queued before the probe is committed when it returns.
        self.store.probe().await
    }

    async fn mark(&self, topic: Arc<str>, ends: Vec<(i32, i64)>) -> Result<(), StoreError> {
        self.store.mark(topic, ends).await
    }

    async fn extend_horizon(&self, until: DispatchKey) -> Result<(), StoreError> {
        self.store.extend_horizon(until).await
    }

    async fn lower_horizon(&self, until: DispatchKey) -> Result<(), StoreError> {
        self.store.lower_horizon(until).await
    }
}
