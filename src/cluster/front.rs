//! The front of a shard in cluster mode: a caller's change is decided
//! against the store, appended to the log, and answered once applied.

use std::{future::Future, sync::Arc, time::Duration};

use futures_util::future;

use super::{
    applier::{AckSender, Acked},
    kafka::LogProducer,
    replica,
    waiters::Waiters,
};
use crate::{
    cluster::log::record::{self, Change, LogRecord},
    command::{Answer, Intent, NewMessage, Row, RowValue, Spread},
    message::{MessageId, Scheduled},
    metrics,
    store::{Decided, Decision, Hold, Local, Proposed, Store, StoreError},
};

/// How long a caller waits for its record, once in the log, to be applied.
const APPLY_WAIT: Duration = Duration::from_secs(10);

pub struct Front {
    store: Store,
    log: Arc<LogProducer>,
    partition: i32,
    waiters: Arc<Waiters>,
    /// The shard's applier, told of each change once the log acked it.
    acked: AckSender,
}

impl Front {
    pub fn new(
        store: Store,
        log: Arc<LogProducer>,
        partition: i32,
        waiters: Arc<Waiters>,
        acked: AckSender,
    ) -> Front {
        Front { store, log, partition, waiters, acked }
    }

    /// Parks many messages: decided in one step of the store, appended
    /// together (each a record of its own), each answered once applied.
    pub async fn schedule_all(&self, msgs: Vec<NewMessage>) -> Vec<Result<Scheduled, StoreError>> {
        let count = msgs.len();
        if self.store.log_owner() != self.waiters.me() {
            return (0..count).map(|_| Err(StoreError::NotOwner(self.partition as u32))).collect();
        }
        let decided = match self.store.decide_all(msgs.into_iter().map(Intent::schedule).collect()).await {
            Ok(decided) => decided,
            Err(e) => return (0..count).map(|_| Err(e.clone())).collect(),
        };
        // What each message became: its place among the records appended
        // together, its answer, or a change to make on its own once what
        // it waits for is done.
        enum Slot {
            Logged,
            Answered(Result<Answer, StoreError>),
            Waiting(usize),
        }
        let (mut slots, mut part, mut waiting) = (Vec::with_capacity(count), Vec::new(), Vec::new());
        for decided in decided {
            slots.push(match decided {
                Decided::Now(Ok(Decision::Log { id, change, held })) => {
                    part.push((id, *change, held));
                    Slot::Logged
                }
                Decided::Now(Ok(Decision::Answer(answer))) => Slot::Answered(Ok(answer)),
                Decided::Now(Err(e)) => Slot::Answered(Err(e)),
                Decided::Wait(intent) => {
                    waiting.push(self.change(intent));
                    Slot::Waiting(waiting.len() - 1)
                }
            });
        }
        let (logged, waited) = future::join(self.log_changes(part), future::join_all(waiting)).await;
        let (mut logged, mut waited) = (logged.into_iter(), waited.into_iter().map(Some).collect::<Vec<_>>());
        slots
            .into_iter()
            .map(|slot| {
                let answer = match slot {
                    Slot::Logged => logged.next().unwrap_or_else(|| Err(lost())),
                    Slot::Answered(answer) => answer,
                    Slot::Waiting(i) => waited[i].take().unwrap_or_else(|| Err(lost())),
                };
                answer?.scheduled()
            })
            .collect()
    }

    /// Decides `intent` against the store; a change to make is appended to
    /// the log and answered once applied.
    pub async fn change(&self, intent: Intent) -> Result<Answer, StoreError> {
        if self.store.log_owner() != self.waiters.me() {
            return Err(StoreError::NotOwner(self.partition as u32));
        }
        match self.store.decide(intent).await? {
            Decision::Answer(answer) => Ok(answer),
            Decision::Log { id, change, held } => {
                self.log_changes(vec![(id, *change, held)]).await.pop().unwrap_or_else(|| Err(lost()))
            }
        }
    }

    /// Appends decided changes (queued at once, in order) and waits for
    /// the store's answer to each once it is applied. What follows the
    /// queueing runs in one task of its own: a caller that goes away (its
    /// deadline passed) leaves no hold and no waiter behind.
    fn log_changes(
        &self,
        changes: Vec<(MessageId, Proposed, Option<Hold>)>,
    ) -> impl Future<Output = Vec<Result<Answer, StoreError>>> + use<> {
        self.log_records(
            changes
                .into_iter()
                .map(|(id, change, held)| {
                    let (key, change) = replica::proposed(&id, change);
                    (key, change, held.map(|held| Local::Held(held.into_id())))
                })
                .collect(),
        )
    }

    /// Writes rows of tables: each a record of its own, appended together
    /// and answered once applied. A row of a shard's own table is applied
    /// only while the log names this node the shard's owner, and a
    /// deleted one's record is followed by its tombstone, so that
    /// compaction drops the row from the log. (A row of a table every
    /// shard keeps is answered superseded if a later change of its key
    /// was applied first.)
    pub async fn write_rows(&self, rows: Vec<Row>) -> Result<(), StoreError> {
        let own = |row: &Row| row.table.spread() == Spread::Shard;
        if rows.iter().any(own) && self.store.log_owner() != self.waiters.me() {
            return Err(StoreError::NotOwner(self.partition as u32));
        }
        let mut records = Vec::with_capacity(rows.len());
        let mut deleted = Vec::new();
        for row in rows {
            // The log keeps the latest record of a row only: one that
            // moves only the wake carries the row whole too.
            let kept = match row.value {
                RowValue::Keep => self.store.reader().row(row.table, row.key.clone()).await?,
                _ => None,
            };
            if own(&row) && row.value == RowValue::Delete {
                deleted.push(record::row_key(row.table, &row.key));
            }
            let (key, change) = replica::row(row, kept);
            records.push((key, change, None));
        }
        for answer in self.log_records(records).await {
            answer?.rows()?;
        }
        for key in deleted {
            if let Err(e) = self.log.enqueue(self.partition, &key, None).await {
                // Applied when read back; one missing leaves the deleted
                // row's small record in the log, harmless.
                tracing::debug!(partition = self.partition, error = %e, "a deleted row's tombstone was not appended");
            }
        }
        Ok(())
    }

    /// Appends records (queued at once, in order) and waits for the
    /// store's answer to each once it is applied; see
    /// [`log_changes`](Self::log_changes).
    fn log_records(
        &self,
        changes: Vec<(Vec<u8>, Change, Option<Local>)>,
    ) -> impl Future<Output = Vec<Result<Answer, StoreError>>> + use<> {
        let queued = std::time::Instant::now();
        let count = changes.len();
        let writer = self.waiters.me();
        let pending: Vec<_> = changes
            .into_iter()
            .map(|(key, change, local)| {
                let (request, reply) = self.waiters.register(self.partition, local, true);
                let record = LogRecord { writer, request, change: Some(change) };
                let value = record.encode();
                let appended = self.log.enqueue_appended(self.partition, &key, Some(&value));
                (request, reply.expect("registered with a reply"), appended, (key, value.len(), record))
            })
            .collect();
        let (store, waiters, topic, partition, early) = (
            self.store.clone(),
            Arc::clone(&self.waiters),
            self.log.topic().to_owned(),
            self.partition,
            self.acked.clone(),
        );
        let applied = (count > 0).then(|| {
            tokio::spawn(async move {
                // First every append: the acks of one partition come in
                // order, so each is seen as it comes, and what a change
                // that did not get in held is let go at once.
                let mut answers: Vec<Option<Result<Answer, StoreError>>> = Vec::with_capacity(pending.len());
                let mut in_log = Vec::with_capacity(pending.len());
                let mut applicable = Vec::with_capacity(pending.len());
                for (request, reply, appended, (key, bytes, record)) in pending {
                    let appended = appended.await;
                    let acked = std::time::Instant::now();
                    metrics::LOG_APPEND_SECONDS.observe((acked - queued).as_secs_f64());
                    match appended {
                        Ok(appended) => {
                            in_log.push((answers.len(), request, reply, acked));
                            answers.push(None);
                            applicable.extend(Acked::new(appended, &key, bytes, record));
                        }
                        Err(e) => {
                            tracing::debug!(partition, error = %e, "the schedule log did not take a change");
                            // Not written (or not known to be): let go of
                            // what it held, unless it was applied meanwhile.
                            if let Some(Some(Local::Held(id))) = waiters.forget(request) {
                                let _ = store.unhold(id).await;
                            }
                            answers.push(Some(Err(StoreError::LogUnavailable(format!(
                                "the schedule log {topic} did not take the change: {e}; retry with the same id"
                            )))));
                        }
                    }
                }
                // Applied from here once the records before them are,
                // unless read back first.
                if !applicable.is_empty() {
                    early.send(applicable);
                }
                // Then the answers, each waited for from its own ack: the
                // waits overlap rather than add up.
                for (slot, request, reply, acked) in in_log {
                    let deadline = tokio::time::Instant::from_std(acked + APPLY_WAIT);
                    answers[slot] = Some(match tokio::time::timeout_at(deadline, reply).await {
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
                                "the change is in the schedule log but was not applied in time; retry with the \
                                 same id"
                                    .to_owned(),
                            ))
                        }
                    });
                }
                answers.into_iter().map(|answer| answer.unwrap_or_else(|| Err(lost()))).collect::<Vec<_>>()
            })
        });
        async move {
            let Some(applied) = applied else { return Vec::new() };
            match applied.await {
                Ok(answers) => answers,
                Err(e) => {
                    let e = StoreError::Io(format!("waiting for changes to be applied: {e}"));
                    (0..count).map(|_| Err(e.clone())).collect()
                }
            }
        }
    }
}

/// An answer that went missing between the parts of a batch.
fn lost() -> StoreError {
    StoreError::Io("a change's answer went missing".to_owned())
}
