//! Where a cluster shard's dispatcher records what became of its produces:
//! one `Settled` record per settle in the log, applied like a front's
//! change (from its ack once the records before it are). The dispatcher's
//! claims hold until it is applied. Retention's tombstones go the same
//! way ([`super::retention`]).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::{
    applier::{AckSender, Acked},
    kafka::LogProducer,
    replica,
    waiters::Waiters,
};
use crate::{
    cluster::log::record::{self, Change, LogRecord, Marks, PartitionEnd, Settled},
    command::{DispatchKey, Handed, Settle},
    dispatcher::Recorder,
    store::{Floor, Local, StoreError},
};

/// Settle records appended and not yet acknowledged, at most.
const IN_FLIGHT: usize = 64;

pub(crate) struct LogRecorder {
    pub(super) log: Arc<LogProducer>,
    pub(super) partition: i32,
    waiters: Arc<Waiters>,
    room: Arc<Semaphore>,
    /// An append failed and was retried: records may have reached the log
    /// out of order, so no floor goes with them until all are in.
    reordered: Arc<AtomicBool>,
    stop: CancellationToken,
    /// The shard's applier, told of each record once the log acked it.
    acked: AckSender,
}

impl LogRecorder {
    pub(crate) fn new(
        log: Arc<LogProducer>,
        partition: i32,
        waiters: Arc<Waiters>,
        stop: CancellationToken,
        acked: AckSender,
    ) -> Self {
        LogRecorder {
            log,
            partition,
            waiters,
            room: Arc::new(Semaphore::new(IN_FLIGHT)),
            reordered: Arc::new(AtomicBool::new(false)),
            stop,
            acked,
        }
    }

    /// Waits until every settle handed over so far is in the log (or was
    /// given up at a stop).
    pub(crate) async fn flushed(&self) {
        let _ = self.room.acquire_many(IN_FLIGHT as u32).await;
    }

    async fn append(&self, mut settles: Vec<Settle>, floor: Option<Floor>) {
        if settles.is_empty() {
            // A floor alone is an optimisation; it comes with the next settles.
            return;
        }
        let Ok(permit) = Arc::clone(&self.room).acquire_owned().await else { return };
        let all_in = self.room.available_permits() == IN_FLIGHT - 1;
        if all_in {
            self.reordered.store(false, Ordering::Relaxed);
        }
        let reordered = self.reordered.load(Ordering::Relaxed);
        let floor = floor.filter(|_| !reordered);
        if reordered {
            // Earlier deliveries may reach the log after these: none may
            // raise a mark past them.
            for settle in &mut settles {
                settle.handed = Handed::Alone;
            }
        }
        let lines = settles.iter().map(replica::settled_line).collect();
        let at = settles.iter().map(|s| s.at).max().unwrap_or_default();
        let (writer, (request, _)) = (
            self.waiters.me(),
            self.waiters.register(self.partition, Some(Local::Settles(settles, floor)), false),
        );
        let record =
            LogRecord { writer, request, change: Some(Change::Settled(Settled { lines, at_ms: at.0 })) };
        let key = record::chunk_key(at, writer, request);
        let (log, partition, reordered, stop, early) = (
            Arc::clone(&self.log),
            self.partition,
            Arc::clone(&self.reordered),
            self.stop.clone(),
            self.acked.clone(),
        );
        // Queued now, in order; retried until it is in or the shard stops.
        let value = record.encode();
        let mut record = Some(record);
        let first = log.enqueue_appended(partition, &key, Some(&value));
        tokio::spawn(async move {
            let mut attempt = first;
            loop {
                match attempt.await {
                    Ok(appended) => {
                        // Applied from here once the records before it are,
                        // unless read back first.
                        if let Some(acked) =
                            record.take().and_then(|r| Acked::new(appended, &key, value.len(), r))
                        {
                            early.send(vec![acked]);
                        }
                        break;
                    }
                    Err(e) => {
                        reordered.store(true, Ordering::Relaxed);
                        tracing::warn!(error = %e, "recording deliveries in the schedule log failed; trying again");
                        tokio::select! {
                            _ = stop.cancelled() => {
                                tracing::error!("stopped before deliveries were recorded in the schedule log; they will be produced again");
                                break;
                            }
                            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        }
                        attempt = log.enqueue_appended(partition, &key, Some(&value));
                    }
                }
            }
            drop(permit);
        });
    }
}

impl LogRecorder {
    async fn append_marks(&self, topic: Arc<str>, ends: Vec<(i32, i64)>) -> Result<(), StoreError> {
        let record = LogRecord {
            writer: self.waiters.me(),
            request: 0,
            change: Some(Change::Marks(Marks {
                topic: topic.to_string(),
                ends: ends
                    .into_iter()
                    .map(|(partition, offset)| PartitionEnd { partition, offset })
                    .collect(),
            })),
        };
        let appended =
            self.log.enqueue(self.partition, &record::marks_key(&topic), Some(&record.encode())).await;
        appended.map(|_| ()).map_err(|e| {
            StoreError::LogUnavailable(format!("recording the marks of {topic} in the schedule log: {e}"))
        })
    }
}

#[tonic::async_trait]
impl Recorder for LogRecorder {
    async fn record(&self, settles: Vec<Settle>, floor: Option<Floor>) {
        self.append(settles, floor).await
    }

    async fn flushed(&self) -> Result<(), StoreError> {
        LogRecorder::flushed(self).await;
        Ok(())
    }

    async fn mark(&self, topic: Arc<str>, ends: Vec<(i32, i64)>) -> Result<(), StoreError> {
        self.append_marks(topic, ends).await
    }

    async fn extend_horizon(&self, _until: DispatchKey) -> Result<(), StoreError> {
        // Not needed: a node that takes the shard searches the topics for
        // whatever was due by the end of its claim's grace.
        Ok(())
    }

    async fn lower_horizon(&self, _until: DispatchKey) -> Result<(), StoreError> {
        Ok(())
    }
}
