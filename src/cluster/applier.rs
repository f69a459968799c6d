//! The applier: follows one partition of the schedule log and applies it to
//! the shard's store, in offset order, from where the store says it is.

use std::{sync::Arc, time::Duration};

use tokio::sync::watch;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use super::{ClusterConfig, waiters::Waiters};
use crate::{
    kafka::{KafkaConfig, LogReader, Read},
    log::record::Entry,
    message::Limits,
    metrics,
    store::{LogEntry, Store, StoreConfig, StoreError},
};

/// Records applied in one call at most.
const BATCH: usize = 2048;
/// How long to wait before reading again after a failure.
const BACKOFF: Duration = Duration::from_secs(1);

pub struct Applier {
    partition: i32,
    store: Store,
    reader: Arc<LogReader>,
    waiters: Arc<Waiters>,
    limits: Limits,
}

impl Applier {
    /// An applier of `partition` of `topic`, reading from where `store`
    /// has applied to.
    pub fn new(
        kafka: &KafkaConfig,
        topic: &str,
        partition: i32,
        store: Store,
        waiters: Arc<Waiters>,
        limits: Limits,
    ) -> Result<Applier, StoreError> {
        let reader = LogReader::new(kafka, topic, partition, store.log_next())
            .map_err(|e| StoreError::LogUnavailable(format!("reading the schedule log {topic}: {e}")))?;
        Ok(Applier { partition, store, reader: Arc::new(reader), waiters, limits })
    }

    /// What it reads the partition with.
    pub fn reader(&self) -> Arc<LogReader> {
        Arc::clone(&self.reader)
    }

    /// Applies until `stop`. `applied` follows the next offset to apply.
    pub async fn run(self, stop: CancellationToken, applied: watch::Sender<i64>) {
        let mut last_owner = self.store.log_owner();
        loop {
            let read = tokio::select! {
                _ = stop.cancelled() => return,
                read = self.reader.next(BATCH, &self.limits) => read,
            };
            let reads = match read {
                Ok(reads) => reads,
                Err(e) => {
                    tracing::warn!(error = %e, "reading the schedule log failed; trying again");
                    self.pause(&stop).await;
                    continue;
                }
            };
            // Records read again after a failure are already applied.
            let next = self.store.log_next();
            let reads: Vec<Read> = reads.into_iter().filter(|r| r.offset >= next).collect();
            if reads.is_empty() {
                continue;
            }
            count_skipped(self.partition, next, &reads);
            let mut writers = Vec::with_capacity(reads.len());
            let entries: Vec<LogEntry> = reads
                .into_iter()
                .map(|Read { offset, entry }| {
                    let (local, writer) = match &entry {
                        Entry::Logged { writer, request, .. } => {
                            (self.waiters.take_local(*writer, *request), Some((*writer, *request)))
                        }
                        _ => (None, None),
                    };
                    writers.push(writer);
                    LogEntry { offset, entry, local }
                })
                .collect();
            let count = entries.len() as u64;
            match self.store.apply(entries).await {
                Ok(answers) => {
                    metrics::LOG_APPLIED.inc_by(count);
                    for (writer, answer) in writers.into_iter().zip(answers) {
                        if let Some((writer, request)) = writer {
                            self.waiters.answer(writer, request, answer);
                        }
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "applying the schedule log failed; reading it again from the last record applied");
                    self.pause(&stop).await;
                    if let Err(e) = self.reader.seek_to(self.store.log_next()) {
                        tracing::warn!(error = %e, "seeking in the schedule log failed");
                    }
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
    /// applying its partition from the offset it recorded.
    pub async fn open(
        config: &StoreConfig,
        cluster: &ClusterConfig,
        waiters: Arc<Waiters>,
    ) -> Result<View, StoreError> {
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
        let applier = Applier::new(
            &cluster.kafka,
            &cluster.log.name,
            partition,
            store.clone(),
            waiters,
            cluster.limits.clone(),
        );
        let applier = match applier {
            Ok(applier) => applier,
            Err(e) => {
                store.close().await;
                return Err(e);
            }
        };
        let (reader, stop, tracker) = (applier.reader(), CancellationToken::new(), TaskTracker::new());
        let (tx, applied) = watch::channel(store.log_next());
        tracker.spawn(applier.run(stop.clone(), tx));
        tracker.close();
        Ok(View { store, reader, applied, stop, applier: tracker })
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
