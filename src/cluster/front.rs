//! The front of a shard in cluster mode: a caller's change is decided
//! against the store, appended to the log, and answered once applied.

use std::{sync::Arc, time::Duration};

use super::waiters::Waiters;
use crate::{
    kafka::LogProducer,
    log::record::LogRecord,
    message::{CancelOutcome, MessageId, Scheduled, Scope, UnixMillis},
    store::{Answer, Decision, Intent, Local, NewMessage, Store, StoreError},
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

    async fn change(&self, intent: Intent) -> Result<Answer, StoreError> {
        if self.store.log_owner() != self.waiters.me() {
            return Err(StoreError::NotOwner(self.partition as u32));
        }
        let (key, change, held) = match self.store.decide(intent).await? {
            Decision::Answer(answer) => return Ok(answer),
            Decision::Log { key, change, held } => (key, change, held),
        };
        let (request, reply) = self.waiters.register(held.map(Local::Held), true);
        let record = LogRecord { writer: self.waiters.me(), request, change: Some(*change) };
        if let Err(e) = self.log.append(self.partition, &key, &record).await {
            // Not written (or not known to be): let go of what it held,
            // unless it was applied meanwhile.
            if let Some(Some(Local::Held(id))) = self.waiters.forget(request) {
                let _ = self.store.unhold(id).await;
            }
            return Err(StoreError::LogUnavailable(format!(
                "the schedule log {} did not take the change: {e}; retry with the same id",
                self.log.topic()
            )));
        }
        let reply = reply.expect("registered with a reply");
        match tokio::time::timeout(APPLY_WAIT, reply).await {
            Ok(Ok(answer)) => Ok(answer),
            _ => {
                self.waiters.forget(request);
                Err(StoreError::LogUnavailable(
                    "the change is in the schedule log but was not applied in time; retry with the same id"
                        .to_owned(),
                ))
            }
        }
    }
}

fn unexpected(answer: &Answer) -> StoreError {
    StoreError::Io(format!("the store answered a change with {answer:?}"))
}
