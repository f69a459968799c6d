//! The applier: follows one partition of the schedule log and applies it to
//! the shard's store, in offset order, from where the store says it is.

use std::{sync::Arc, time::Duration};

use tokio::sync::watch;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use super::{ClusterConfig, waiters::Waiters};
use crate::{
    clock::Clock as _,
    kafka::{LogConsumer, LogReader, Read, seek::Seek},
    log::record::Entry,
    message::Limits,
    metrics,
    store::{LogEntry, Store, StoreConfig, StoreError},
};

/// Records applied in one call at most.
const BATCH: usize = 2048;
/// How long to wait before reading again after a failure.
const BACKOFF: Duration = Duration::from_secs(1);
/// How long a read after a seek may find nothing before the partition's
/// end is looked at.
const SEEK_WAIT: Duration = Duration::from_secs(3);

pub struct Applier {
    partition: i32,
    store: Store,
    reader: Arc<LogReader>,
    waiters: Arc<Waiters>,
    limits: Limits,
    /// Where the reader was put first.
    first: Seek,
}

impl Applier {
    /// An applier of `partition` of the log `log` reads, reading from
    /// where `store` has applied to.
    pub fn new(
        log: &Arc<LogConsumer>,
        partition: i32,
        store: Store,
        waiters: Arc<Waiters>,
        limits: Limits,
    ) -> Result<Applier, StoreError> {
        let first = Seek::to(store.log_next(), 0);
        let reader = log.reader(partition, first.at).map_err(|e| {
            StoreError::LogUnavailable(format!("reading partition {partition} of the schedule log: {e}"))
        })?;
        Ok(Applier { partition, store, reader: Arc::new(reader), waiters, limits, first })
    }

    /// What it reads the partition with.
    pub fn reader(&self) -> Arc<LogReader> {
        Arc::clone(&self.reader)
    }

    /// Applies until `stop`. `applied` follows the next offset to apply.
    pub async fn run(self, stop: CancellationToken, applied: watch::Sender<i64>) {
        let mut last_owner = self.store.log_owner();
        let mut seek = Some(self.first);
        loop {
            let read = tokio::select! {
                _ = stop.cancelled() => return,
                read = self.reader.next(BATCH, &self.limits) => Some(read),
                // After a seek, a broker that skipped the rest of the last
                // batch answers nothing at all.
                _ = tokio::time::sleep(SEEK_WAIT), if seek.is_some() => None,
            };
            let read = match (read, seek) {
                (Some(read), _) => read,
                (None, Some(put)) => {
                    let Some(end) = end_of(&self.reader, &stop).await else { return };
                    // Nothing past the offset yet: the next record read is
                    // the one appended next, at the offset.
                    seek = put.check(i64::MAX).filter(|_| end > put.next);
                    if let Some(again) = seek {
                        tracing::debug!(
                            partition = self.partition,
                            ?put,
                            end,
                            "nothing read from a seek before the partition's end; reading from further back"
                        );
                        if !self.put(again, &stop).await {
                            return;
                        }
                    }
                    continue;
                }
                (None, None) => continue,
            };
            let reads = match read {
                Ok(reads) => reads,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the schedule log failed; trying again");
                    self.pause(&stop).await;
                    continue;
                }
            };
            if let (Some(put), Some(first)) = (seek, reads.first()) {
                seek = put.check(first.offset);
                if let Some(again) = seek {
                    tracing::debug!(
                        partition = self.partition,
                        ?put,
                        first = first.offset,
                        "the first record read lies past the offset to apply; reading from further back"
                    );
                    if !self.put(again, &stop).await {
                        return;
                    }
                    continue;
                }
            }
            // Records read again (after a seek, or a failure) are already
            // applied.
            let next = self.store.log_next();
            let reads: Vec<Read> = reads.into_iter().filter(|r| r.offset >= next).collect();
            if reads.is_empty() {
                continue;
            }
            count_skipped(self.partition, next, &reads);
            let writers: Vec<Option<(u64, u64)>> = reads
                .iter()
                .map(|r| match &r.entry {
                    Entry::Logged { writer, request, .. } => Some((*writer, *request)),
                    _ => None,
                })
                .collect();
            let entries: Vec<LogEntry> = reads
                .into_iter()
                .zip(self.waiters.take_locals(&writers))
                .map(|(Read { offset, at, entry }, local)| LogEntry { offset, at, entry, local })
                .collect();
            let count = entries.len() as u64;
            match self.store.apply(entries).await {
                Ok(answers) => {
                    metrics::LOG_APPLIED.inc_by(count);
                    self.waiters.answer_all(writers.into_iter().zip(answers));
                }
                Err(e) => {
                    tracing::error!(error = %e, "applying the schedule log failed; reading it again from the last record applied");
                    self.pause(&stop).await;
                    let again = Seek::to(self.store.log_next(), 0);
                    if !self.put(again, &stop).await {
                        return;
                    }
                    seek = Some(again);
                }
            }
            applied.send_replace(self.store.log_next());
            let owner = self.store.log_owner();
            if owner != last_owner {
                if last_owner == self.waiters.me() && owner != 0 {
                    tracing::warn!(
                        partition = self.partition,
                        "another node claimed the shard in the schedule log: this node no longer dispatches it"
                    );
                }
                last_owner = owner;
            }
        }
    }

    /// Puts the reader at `seek.at`, trying again until it is there;
    /// false if stopped first.
    async fn put(&self, seek: Seek, stop: &CancellationToken) -> bool {
        loop {
            // The client answers a seek once it has moved: off the runtime.
            let reader = Arc::clone(&self.reader);
            match tokio::task::spawn_blocking(move || reader.seek_to(seek.at)).await {
                Ok(Ok(())) => return true,
                Ok(Err(e)) => tracing::warn!(error = %e, "seeking in the schedule log failed; trying again"),
                Err(e) => tracing::warn!(error = %e, "seeking in the schedule log failed; trying again"),
            }
            self.pause(stop).await;
            if stop.is_cancelled() {
                return false;
            }
        }
    }

    async fn pause(&self, stop: &CancellationToken) {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(BACKOFF) => {}
        }
    }
}

/// Counts offsets the reads skipped: compaction removes records (and
/// transactions leave markers), so gaps are expected on a compacted log;
/// the count tells how many records a restore did not see.
fn count_skipped(partition: i32, next: i64, reads: &[Read]) {
    let mut expected = next;
    let mut skipped = 0;
    for read in reads {
        skipped += (read.offset - expected).max(0);
        expected = read.offset + 1;
    }
    if skipped > 0 {
        metrics::LOG_SKIPPED.inc_by(skipped as u64);
        tracing::debug!(partition, from = next, skipped, "offsets of the schedule log skipped");
    }
}

/// The end of the partition `reader` reads, the offset its next record
/// gets; retried until the broker answers or `stop`.
pub async fn end_of(reader: &Arc<LogReader>, stop: &CancellationToken) -> Option<i64> {
    loop {
        let reading = Arc::clone(reader);
        match tokio::task::spawn_blocking(move || reading.end(Duration::from_secs(5))).await {
            Ok(Ok(end)) => return Some(end),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "reading the end of the schedule log failed; trying again")
            }
            Err(e) => tracing::warn!(error = %e, "reading the end of the schedule log failed; trying again"),
        }
        tokio::select! {
            _ = stop.cancelled() => return None,
            _ = tokio::time::sleep(BACKOFF) => {}
        }
    }
}

/// How long ago a copy of a shard may have last applied the log and still
/// be brought up to date from there. Kafka keeps a tombstone for
/// `delete.retention.ms` once compaction reached it (hourglass creates the
/// log with a day, Kafka's default), and then drops it along with the
/// records it replaced: a copy that resumed later would miss that the
/// message was delivered, and still hold it pending. Half of it leaves a
/// margin for compaction's own pace.
pub const STALE_AFTER: Duration = Duration::from_secs(12 * 3600);

/// Whether `store` last applied its partition longer than [`STALE_AFTER`]
/// ago (by the timestamps of hourglass's own records) and records were
/// appended since. A partition's end the broker does not tell within 30 s
/// counts as past: rebuilding is the safe side.
async fn stale(store: &Store, reader: &Arc<LogReader>) -> bool {
    let (next, last) = (store.log_next(), store.log_time_at_open().0);
    let behind = crate::clock::SystemClock.now().0.saturating_sub(last);
    if next == 0 || last == 0 || Duration::from_millis(behind) < STALE_AFTER {
        return false;
    }
    let end = tokio::time::timeout(Duration::from_secs(30), end_of(reader, &CancellationToken::new())).await;
    !matches!(end, Ok(Some(end)) if end <= next)
}

/// A shard's store following its partition of the log: opened, and its
/// applier running. An owner dispatches from it; a standby only keeps it
/// up to date, ready to be taken over.
pub struct View {
    pub store: Store,
    pub reader: Arc<LogReader>,
    /// The next offset to apply, as applied.
    pub applied: watch::Receiver<i64>,
    /// Stops the applier.
    pub stop: CancellationToken,
    applier: TaskTracker,
}

impl View {
    /// Opens the store `config` names (empty if there is none) and starts
    /// applying its partition from the offset it recorded. A copy too far
    /// behind to be brought up to date (see [`STALE_AFTER`]) is dropped and
    /// rebuilt from the start of the partition.
    pub async fn open(
        config: &StoreConfig,
        cluster: &ClusterConfig,
        log: &Arc<LogConsumer>,
        waiters: Arc<Waiters>,
    ) -> Result<View, StoreError> {
        let (store, applier) = Self::open_copy(config, cluster, log, &waiters).await?;
        let (store, applier) = if !stale(&store, &applier.reader).await {
            (store, applier)
        } else {
            metrics::STALE_COPIES.inc();
            tracing::warn!(
                path = %config.path.display(),
                applied_to = store.log_next(),
                last_applied_at = store.log_time_at_open().0,
                "this copy of the shard fell further behind the schedule log than Kafka keeps tombstones: \
                 rebuilding it from the log"
            );
            store.close().await;
            // Every handle gone, RocksDB is closed before its files go;
            // moved aside first, so that a crash midway leaves no half
            // store where the shard's is opened.
            drop((store, applier));
            let aside = config.path.with_extension("stale");
            let removed = std::fs::remove_dir_all(&aside)
                .or_else(|e| if e.kind() == std::io::ErrorKind::NotFound { Ok(()) } else { Err(e) })
                .and_then(|()| std::fs::rename(&config.path, &aside))
                .and_then(|()| std::fs::remove_dir_all(&aside));
            removed.map_err(|e| {
                StoreError::Io(format!("removing the stale copy {}: {e}", config.path.display()))
            })?;
            Self::open_copy(config, cluster, log, &waiters).await?
        };
        let (reader, stop, tracker) = (applier.reader(), CancellationToken::new(), TaskTracker::new());
        let (tx, applied) = watch::channel(store.log_next());
        tracker.spawn(applier.run(stop.clone(), tx));
        tracker.close();
        Ok(View { store, reader, applied, stop, applier: tracker })
    }

    /// The store and an applier of its partition, not started.
    async fn open_copy(
        config: &StoreConfig,
        cluster: &ClusterConfig,
        log: &Arc<LogConsumer>,
        waiters: &Arc<Waiters>,
    ) -> Result<(Store, Applier), StoreError> {
        let opening = config.clone();
        let store = tokio::task::spawn_blocking(move || Store::open(&opening))
            .await
            .map_err(|e| StoreError::Io(format!("opening the store: {e}")))??;
        let recorded = store.recorded_shard();
        if recorded != config.shard {
            store.close().await;
            return Err(StoreError::Corrupt(format!(
                "the store in {} is shard {} of {}, not shard {} of {}: each partition of the schedule log \
                 needs its own store",
                config.path.display(),
                recorded.shard,
                recorded.shards,
                config.shard.shard,
                config.shard.shards,
            )));
        }
        let partition = config.shard.shard as i32;
        let applier =
            Applier::new(log, partition, store.clone(), Arc::clone(waiters), cluster.limits.clone());
        match applier {
            Ok(applier) => Ok((store, applier)),
            Err(e) => {
                store.close().await;
                Err(e)
            }
        }
    }

    /// The partition's end now; see [`end_of`].
    pub async fn end(&self, stop: &CancellationToken) -> Option<i64> {
        end_of(&self.reader, stop).await
    }

    /// Stops applying and closes the store.
    pub async fn close(&self) {
        self.stop.cancel();
        self.applier.wait().await;
        self.store.close().await;
    }
}
