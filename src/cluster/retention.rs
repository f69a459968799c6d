//! Retention in cluster mode: what a shard forgets is forgotten through
//! the schedule log, so that every copy of the shard forgets it and
//! compaction drops it from the log. The store chooses the ids and holds
//! each (a change to it waits) until its tombstone is applied.

use std::{sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

use super::recorder::LogRecorder;
use crate::{
    cluster::log::record,
    message::UnixMillis,
    shard::{PURGE_BATCH, Retention},
    store::{Store, StoreError},
};

/// Longest a purge waits for its tombstones to be applied.
const APPLY_WAIT: Duration = Duration::from_secs(10);

/// Appends the tombstones of a shard's partition while the log names
/// `owner` (this node's incarnation) the shard's owner.
pub(crate) struct LogRetention {
    pub recorder: Arc<LogRecorder>,
    pub owner: u64,
}

#[tonic::async_trait]
impl Retention for LogRetention {
    async fn expire(
        &self,
        store: &Store,
        bound: UnixMillis,
        stop: &CancellationToken,
    ) -> Result<(), StoreError> {
        self.run(store, bound, stop).await
    }
}

impl LogRetention {
    /// Each message's tombstone first; a chunk that recorded deliveries
    /// only once its messages are forgotten (else a store rebuilt from the
    /// compacted log would find a message delivered long ago still
    /// pending). A node another one fenced appends nothing: the new
    /// owner's changes are not held here.
    async fn run(
        &self,
        store: &Store,
        before: UnixMillis,
        stop: &CancellationToken,
    ) -> Result<(), StoreError> {
        let fenced = || store.log_owner() != self.owner;
        loop {
            if fenced() {
                return Ok(());
            }
            let (looked_at, ids) = store.purge_to_log(before, PURGE_BATCH).await?;
            if ids.is_empty() {
                break;
            }
            let keys = ids.iter().map(|id| id.as_bytes().to_vec()).collect();
            let appended = if fenced() {
                Err(StoreError::LogUnavailable("another node claimed the shard".to_owned()))
            } else {
                self.tombstone(keys).await
            };
            match appended {
                Ok(last) => applied(store, last, stop).await?,
                Err(e) => {
                    for id in ids {
                        let _ = store.unhold(id).await;
                    }
                    return Err(e);
                }
            }
            if looked_at < PURGE_BATCH || stop.is_cancelled() {
                break;
            }
        }
        // Chunk keys sort by their time: every chunk of before `before`
        // sorts below the first key of that time.
        let bound = record::chunk_key(before, 0, 0);
        let chunks = store.expired_chunks(bound, PURGE_BATCH).await?;
        if !chunks.is_empty() && !fenced() {
            let last = self.tombstone(chunks).await?;
            applied(store, last, stop).await?;
        }
        Ok(())
    }

    /// Appends a tombstone under each key, in order; returns once all are
    /// in the log, with the offset of the last.
    async fn tombstone(&self, keys: Vec<Vec<u8>>) -> Result<i64, StoreError> {
        let (log, partition) = (&self.recorder.log, self.recorder.partition);
        // Queued one after another: they reach the partition in order.
        let appends: Vec<_> = keys.iter().map(|key| log.enqueue(partition, key, None)).collect();
        let mut last = -1;
        for (key, outcome) in keys.iter().zip(futures_util::future::join_all(appends).await) {
            match outcome {
                Ok(offset) => last = last.max(offset),
                Err(e) => {
                    return Err(StoreError::LogUnavailable(format!(
                        "appending the tombstone of {key:?}: {e}"
                    )));
                }
            }
        }
        Ok(last)
    }
}

/// Waits until the store has applied the log past `offset`.
async fn applied(store: &Store, offset: i64, stop: &CancellationToken) -> Result<(), StoreError> {
    let started = tokio::time::Instant::now();
    while store.log_next() <= offset {
        if started.elapsed() > APPLY_WAIT || stop.is_cancelled() {
            return Err(StoreError::LogUnavailable(format!(
                "the tombstones up to offset {offset} were not applied in time"
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}
