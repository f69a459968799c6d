//! The front of a shard in cluster mode: a caller's change is decided
//! against the store, appended to the log, and answered once applied.

use std::{future::Future, sync::Arc, time::Duration};

use futures_util::future;

use super::waiters::Waiters;
use crate::{
    kafka::LogProducer,
    log::record::{Change, LogRecord},
    message::{CancelOutcome, MessageId, Scheduled, Scope, UnixMillis},
    metrics,
    store::{Answer, Decided, Decision, Hold, Intent, Local, NewMessage, Store, StoreError},
};

/// How long a caller waits for its record, once in the log, to be applied.
const APPLY_WAIT: Duration = Duration::from_secs(10);

pub struct Front {
    store: Store,
    log: Arc<LogProducer>,
    partition: i32,
    waiters: Arc<Waiters>,
}

impl Front {
    pub fn new(store: Store, log: Arc<LogProducer>, partition: i32, waiters: Arc<Waiters>) -> Front {
        Front { store, log, partition, waiters }
    }

    pub async fn schedule(&self, msg: NewMessage) -> Result<Scheduled, StoreError> {
        match self.change(Intent::Schedule(msg)).await? {
            Answer::Scheduled(result) => result,
            other => Err(unexpected(&other)),
        }
    }

    pub async fn cancel(
        &self,
        scope: Scope,
        id: MessageId,
        now: UnixMillis,
    ) -> Result<CancelOutcome, StoreError> {
        match self.change(Intent::Cancel { scope, id, now }).await? {
            Answer::Cancelled(result) => result,
            other => Err(unexpected(&other)),
        }
    }

    pub async fn reschedule(
        &self,
        scope: Scope,
        id: MessageId,
        due: UnixMillis,
    ) -> Result<UnixMillis, StoreError> {
        match self.change(Intent::Reschedule { scope, id, due }).await? {
            Answer::Rescheduled(result) => result,
            other => Err(unexpected(&other)),
        }
    }

    /// Parks many messages: decided in one step of the store, appended
    /// together (each a record of its own), each answered once applied.
    pub async fn schedule_all(&self, msgs: Vec<NewMessage>) -> Vec<Result<Scheduled, StoreError>> {
        let count = msgs.len();
        if self.store.log_owner() != self.waiters.me() {
            return (0..count).map(|_| Err(StoreError::NotOwner(self.partition as u32))).collect();
        }
        let decided = match self.store.decide_all(msgs.into_iter().map(Intent::Schedule).collect()).await {
            Ok(decided) => decided,
            Err(e) => return (0..count).map(|_| Err(e.clone())).collect(),
        };
        // Queued in order now; each awaited on its own.
        let changes = decided.into_iter().map(|decided| {
            let logged = match decided {
                Decided::Now(Ok(Decision::Log { key, change, held })) => {
                    Ok(self.log_change(key, *change, held))
                }
                Decided::Now(Ok(Decision::Answer(answer))) => Err(Ok(answer)),
                Decided::Now(Err(e)) => Err(Err(e)),
                Decided::Wait(intent) => return future::Either::Right(self.change(intent)),
            };
            future::Either::Left(async move {
                match logged {
                    Ok(logged) => logged.await,
                    Err(answered) => answered,
                }
            })
        });
        future::join_all(changes.collect::<Vec<_>>())
            .await
            .into_iter()
            .map(|answer| match answer? {
                Answer::Scheduled(result) => result,
                other => Err(unexpected(&other)),
            })
            .collect()
    }

    async fn change(&self, intent: Intent) -> Result<Answer, StoreError> {
        if self.store.log_owner() != self.waiters.me() {
            return Err(StoreError::NotOwner(self.partition as u32));
        }
        match self.store.decide(intent).await? {
            Decision::Answer(answer) => Ok(answer),
            Decision::Log { key, change, held } => self.log_change(key, *change, held).await,
        }
    }

    /// Appends a decided change (queued at once) and waits for the store's
    /// answer once it is applied. What follows the queueing runs on its
    /// own: a caller that goes away (its deadline passed) leaves no hold
    /// and no waiter behind.
    fn log_change(
        &self,
        key: Vec<u8>,
        change: Change,
        held: Option<Hold>,
    ) -> impl Future<Output = Result<Answer, StoreError>> + use<> {
        let (request, reply) = self.waiters.register(held.map(|held| Local::Held(held.into_id())), true);
        let record = LogRecord { writer: self.waiters.me(), request, change: Some(change) };
        let appended = self.log.enqueue(self.partition, &key, Some(&record.encode()));
        let (store, waiters, topic, partition) =
            (self.store.clone(), Arc::clone(&self.waiters), self.log.topic().to_owned(), self.partition);
        let queued = std::time::Instant::now();
        let applied = tokio::spawn(async move {
            let appended = appended.await;
            let acked = std::time::Instant::now();
            metrics::LOG_APPEND_SECONDS.observe((acked - queued).as_secs_f64());
            if let Err(e) = appended {
                tracing::debug!(partition, error = %e, "the schedule log did not take a change");
                // Not written (or not known to be): let go of what it held,
                // unless it was applied meanwhile.
                if let Some(Some(Local::Held(id))) = waiters.forget(request) {
                    let _ = store.unhold(id).await;
                }
                return Err(StoreError::LogUnavailable(format!(
                    "the schedule log {topic} did not take the change: {e}; retry with the same id"
                )));
            }
            let reply = reply.expect("registered with a reply");
            match tokio::time::timeout(APPLY_WAIT, reply).await {
                Ok(Ok(answer)) => {
                    metrics::LOG_APPLY_WAIT_SECONDS.observe(acked.elapsed().as_secs_f64());
                    Ok(answer)
                }
                _ => {
                    tracing::debug!(
                        partition,
                        request,
                        "a change in the schedule log was not applied in time"
                    );
                    // Its hold goes when the record is applied.
                    waiters.stop_waiting(request);
                    Err(StoreError::LogUnavailable(
                        "the change is in the schedule log but was not applied in time; retry with the same id"
                            .to_owned(),
                    ))
                }
            }
        });
        async move {
            applied.await.map_err(|e| StoreError::Io(format!("waiting for a change to be applied: {e}")))?
        }
    }
}

fn unexpected(answer: &Answer) -> StoreError {
    StoreError::Io(format!("the store answered a change with {answer:?}"))
}
