//! The service: what a request means, independent of gRPC. It validates a
//! request against the limits and the topic catalog, resolves due times with
//! the clock, and hands the change to the store. The gRPC adapter converts
//! and calls; it decides nothing.

use std::sync::Arc;

use crate::{
    Error,
    clock::Clock,
    kafka::TopicCatalog,
    message::{
        CancelOutcome, DueSpec, Envelope, Invalid, Limits, MessageId, Scheduled, ScheduledMessage, UnixMillis,
    },
    store::{NewMessage, Store, StoreError},
};

/// A request to schedule one message.
#[derive(Clone, Debug)]
pub struct ScheduleCommand {
    pub id: Option<MessageId>,
    pub envelope: Envelope,
    pub due: DueSpec,
}

pub struct Service {
    store: Store,
    catalog: Arc<TopicCatalog>,
    limits: Limits,
    clock: Arc<dyn Clock>,
}

impl Service {
    pub fn new(store: Store, catalog: Arc<TopicCatalog>, limits: Limits, clock: Arc<dyn Clock>) -> Self {
        Service { store, catalog, limits, clock }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    fn resolve(&self, due: DueSpec) -> Result<(UnixMillis, UnixMillis), Invalid> {
        let now = self.clock.now();
        let due_at = due.resolve(now);
        self.limits.check_due(due_at, now)?;
        Ok((due_at, now))
    }

    pub async fn schedule(&self, cmd: ScheduleCommand) -> Result<Scheduled, Error> {
        cmd.envelope.validate(&self.limits)?;
        let (due, now) = self.resolve(cmd.due)?;
        let partitions = self.catalog.partitions(&cmd.envelope.topic).await?;
        if let Some(p) = cmd.envelope.partition
            && p >= partitions
        {
            return Err(Invalid::new(
                "message.partition",
                format!(
                    "is {p} but topic {:?} has {partitions} partition(s), numbered from 0",
                    cmd.envelope.topic
                ),
            )
            .into());
        }
        let msg = NewMessage { id: cmd.id, envelope: cmd.envelope, requested: cmd.due, due, now };
        Ok(self.store.schedule(msg).await?)
    }

    pub async fn cancel(&self, id: MessageId) -> Result<CancelOutcome, Error> {
        Ok(self.store.cancel(id, self.clock.now()).await?)
    }

    pub async fn reschedule(&self, id: MessageId, due: DueSpec) -> Result<UnixMillis, Error> {
        let (due, _) = self.resolve(due)?;
        Ok(self.store.reschedule(id, due).await?)
    }

    pub async fn get(&self, id: MessageId) -> Result<ScheduledMessage, Error> {
        match self.store.get(id.clone()).await? {
            Some(m) => Ok(m),
            None => Err(StoreError::NotFound(id).into()),
        }
    }
}
