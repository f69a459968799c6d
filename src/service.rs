//! The service: what a request means, independent of gRPC. It validates a
//! request against the limits and the topic catalog, resolves due times with
//! the clock, and hands the change to the store. The gRPC adapter converts
//! and calls; it decides nothing.

mod access;

use std::sync::Arc;

use crate::{
    Error,
    clock::Clock,
    kafka::TopicCatalog,
    message::{
        CancelOutcome, DueSpec, Envelope, Invalid, Limits, ListQuery, MessageId, PendingPage, Scheduled,
        ScheduledMessage, Stats, UnixMillis,
    },
    store::{ListFilter, NewMessage, Store, StoreError, schema::DueKey},
};

/// Due entries one `List` call looks at, at most, matching or not.
pub const LIST_EXAMINE: usize = 10_000;

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

    /// Checks a request and resolves its due time: what the store parks.
    async fn prepare(&self, cmd: ScheduleCommand) -> Result<NewMessage, Error> {
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
        Ok(NewMessage { id: cmd.id, envelope: cmd.envelope, requested: cmd.due, due, now })
    }

    pub async fn schedule(&self, cmd: ScheduleCommand) -> Result<Scheduled, Error> {
        let msg = self.prepare(cmd).await?;
        Ok(self.store.schedule(msg).await?)
    }

    /// Schedules many requests in one durable write. Items that fail to
    /// convert or validate are answered with their error and not stored;
    /// the rest are parked together. The whole call fails only when the
    /// batch is too large or the write fails (then nothing was stored).
    pub async fn schedule_batch(
        &self,
        items: Vec<Result<ScheduleCommand, Invalid>>,
    ) -> Result<Vec<Result<Scheduled, Error>>, Error> {
        if items.len() > self.limits.max_batch {
            return Err(Invalid::new(
                "requests",
                format!(
                    "has {} items; the server takes at most {} per batch (--max-batch)",
                    items.len(),
                    self.limits.max_batch
                ),
            )
            .into());
        }
        let mut results: Vec<Option<Result<Scheduled, Error>>> = Vec::with_capacity(items.len());
        let (mut msgs, mut slots) = (Vec::new(), Vec::new());
        for item in items {
            let prepared = match item {
                Ok(cmd) => self.prepare(cmd).await,
                Err(invalid) => Err(invalid.into()),
            };
            match prepared {
                Ok(msg) => {
                    slots.push(results.len());
                    msgs.push(msg);
                    results.push(None);
                }
                Err(e) => results.push(Some(Err(e))),
            }
        }
        let stored = self.store.schedule_batch(msgs).await?;
        for (slot, result) in slots.into_iter().zip(stored) {
            results[slot] = Some(result.map_err(Error::from));
        }
        Ok(results.into_iter().map(|r| r.expect("every item is answered")).collect())
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

    /// A page of pending messages in dispatch order. A call looks at no
    /// more than [`LIST_EXAMINE`] entries, so a filtered page may come back
    /// short, or empty, with a token to go on.
    pub async fn list(&self, query: ListQuery) -> Result<PendingPage, Error> {
        let limit = query.validate()?;
        let start = DueKey { due: query.from.unwrap_or_default(), seq: 0 };
        let from = query.page_token.map(DueKey::from_token).map_or(start, |token| token.max(start));
        let filter = ListFilter { topic: query.topic, from, to: query.to, limit, examine: LIST_EXAMINE };
        Ok(self.store.list_pending(filter).await?)
    }

    /// Counts by state, the oldest overdue message, the store's size.
    pub async fn stats(&self) -> Result<Stats, Error> {
        let now = self.clock.now();
        let stats = self.store.stats(now).await?;
        let store = self.store.clone();
        let store_bytes = tokio::task::spawn_blocking(move || store.size_bytes()).await.unwrap_or(0);
        Ok(Stats {
            as_of: now,
            pending: stats.meta.pending,
            delivered: stats.meta.delivered_total,
            cancelled: stats.meta.cancelled_total,
            failed: stats.meta.failed_total,
            dispatching: self.store.dispatching() as u64,
            oldest_overdue: stats.oldest_overdue,
            store_bytes,
            max_pending: self.store.max_pending(),
        })
    }
}
