//! Where the dispatcher records what became of its produces: standalone,
//! in the store ([`StoreRecorder`]); in cluster mode, in the schedule log,
//! applied to the store from there.

use std::{future::Future, pin::Pin, sync::Arc};

use crate::{
    message::UnixMillis,
    store::{Floor, Settle, Store},
};

/// Where a shard's dispatcher records its settles, its marks and its
/// horizon: the store, or in cluster mode the schedule log, applied to the
/// store from there.
pub(crate) trait Recorder: Send + Sync {
    /// Records what became of produces, and, with a `floor`, that no due
    /// entry below it is pending once they are. A failure is the
    /// recorder's to report.
    fn record(
        &self,
        settles: Vec<Settle>,
        floor: Option<Floor>,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;

    /// Waits until every settle recorded so far is in the log (or, in the
    /// store, committed).
    fn flushed(&self) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>>;

    /// Records where `topic`'s partitions end (see [`Store::mark`]);
    /// returns once it is recorded.
    fn mark(
        &self,
        topic: Arc<str>,
        ends: Vec<(i32, i64)>,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>>;

    /// Records that the dispatcher may produce what is due up to `until`
    /// (see [`Store::extend_horizon`]); returns once that is durable. A
    /// recorder that needs no horizon answers at once.
    fn extend_horizon(
        &self,
        until: UnixMillis,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>>;
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

impl Recorder for StoreRecorder {
    fn record(
        &self,
        settles: Vec<Settle>,
        floor: Option<Floor>,
    ) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            if let Err(e) = self.store.settle(settles, floor).await {
                tracing::error!(error = %e, "settling deliveries failed; they will be produced again after restart");
            }
        })
    }

    fn flushed(&self) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>> {
        // Every change queued before the probe is committed when it returns.
        Box::pin(async move { self.store.probe().await.map_err(|e| e.to_string()) })
    }

    fn mark(
        &self,
        topic: Arc<str>,
        ends: Vec<(i32, i64)>,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>> {
        Box::pin(async move { self.store.mark(topic, ends).await.map_err(|e| e.to_string()) })
    }

    fn extend_horizon(
        &self,
        until: UnixMillis,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + '_>> {
        Box::pin(async move { self.store.extend_horizon(until).await.map_err(|e| e.to_string()) })
    }
}
