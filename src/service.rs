//! The service: what a request means, independent of gRPC. It validates a
//! request against the limits and the topic catalog, resolves due times with
//! the clock, and hands the change to the store. The gRPC adapter converts
//! and calls; it decides nothing.
//!
//! Every method takes the caller's [`Access`] first: which topics it may
//! use, and the [`Scope`] of messages it sees. Topics a request names are
//! checked here; the store applies the scope in the same step as the read or
//! change it limits, so a check can never pass for one message and the
//! change land on another. A method without an `Access` cannot be written.
//!
//! | method | a topic outside the grant | a message the caller does not see |
//! |---|---|---|
//! | `schedule` | PERMISSION_DENIED, nothing stored | (its id is the caller's own) |
//! | `schedule_batch` | that item PERMISSION_DENIED | |
//! | `get`, `cancel`, `reschedule` | PERMISSION_DENIED (its own message) | NOT_FOUND |
//! | `list` | filter: PERMISSION_DENIED; else not listed | not listed |
//! | `stats` | not counted | not counted |

use std::sync::{Arc, Mutex};

use crate::{
    Error,
    auth::{Access, AdminScope},
    clock::Clock,
    command::{Intent, NewId, NewMessage},
    kafka::TopicCatalog,
    message::{
        CancelOutcome, DueSpec, Envelope, Forecast, ForecastQuery, Invalid, Limits, ListQuery, Matching,
        MessageId, OnConflict, PendingPage, Scheduled, ScheduledMessage, Scope, Stats, UnixMillis,
    },
    node::{Node, Picture},
    store::{FORECAST_EXAMINE, StoreError},
};

/// Due entries one `List` call looks at, at most, matching or not.
pub(crate) const LIST_EXAMINE: usize = 10_000;

/// Forecasts that may wait for their turn on a node; one more is refused
/// at once, so that waiting forecasts never hold more than these few of
/// the calls the server admits.
pub(crate) const FORECASTS_WAITING: usize = 8;

/// The longest a forecast waits for its turn when its caller set no
/// earlier deadline.
pub(crate) const FORECAST_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Ids generated, at most, to find one in a shard this node owns.
const ID_TRIES: usize = 1024;

/// A request to schedule one message.
#[derive(Clone, Debug)]
pub struct ScheduleCommand {
    /// The client's id; none to have one generated.
    pub id: Option<String>,
    pub envelope: Envelope,
    pub due: DueSpec,
    /// What to do when the id is taken by a different message.
    pub on_conflict: OnConflict,
}

pub struct Service {
    node: Arc<Node>,
    catalog: Arc<TopicCatalog>,
    limits: Limits,
    clock: Arc<dyn Clock>,
    /// Ids for messages scheduled without one: ULIDs, increasing within a
    /// millisecond.
    ids: Mutex<ulid::Generator>,
    /// One forecast walks the due index at a time on this node (each
    /// walks every shard at once): a person polling a week of millions
    /// holds the dispatcher's cores to that.
    forecasting: tokio::sync::Semaphore,
    /// Places to wait for that turn ([`FORECASTS_WAITING`]).
    forecast_queue: tokio::sync::Semaphore,
}

impl Service {
    pub fn new(node: Arc<Node>, catalog: Arc<TopicCatalog>, limits: Limits, clock: Arc<dyn Clock>) -> Self {
        Service {
            node,
            catalog,
            limits,
            clock,
            ids: Mutex::new(ulid::Generator::new()),
            forecasting: tokio::sync::Semaphore::new(1),
            forecast_queue: tokio::sync::Semaphore::new(FORECASTS_WAITING),
        }
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
    async fn prepare(
        &self,
        access: &Access,
        scope: &Scope,
        cmd: ScheduleCommand,
    ) -> Result<NewMessage, Error> {
        let id = match cmd.id.as_deref() {
            Some(id) => NewId::Client(scope.new_id(id)?),
            None => NewId::Generated(self.new_id(scope)),
        };
        self.check_template(access, &cmd.envelope).await?;
        let (due, now) = self.resolve(cmd.due)?;
        Ok(NewMessage {
            id,
            scope: scope.clone(),
            envelope: cmd.envelope,
            requested: cmd.due,
            due,
            now,
            on_conflict: cmd.on_conflict,
        })
    }

    /// Checks a record to produce: its shape and limits, the caller's
    /// grant of its topic, and its partition against the topic's.
    pub async fn check_template(&self, access: &Access, envelope: &Envelope) -> Result<(), Error> {
        envelope.validate(&self.limits)?;
        access.check(&envelope.topic)?;
        if let Some(to) = &envelope.dead_letter_topic {
            // Produced there if it fails or expires.
            access.check(to)?;
        }
        let partitions = self.catalog.partitions(&envelope.topic).await?;
        if let Some(p) = envelope.partition
            && p >= partitions
        {
            return Err(Invalid::new(
                "message.partition",
                format!(
                    "is {p} but topic {:?} has {partitions} partition(s), numbered from 0",
                    envelope.topic
                ),
            )
            .into());
        }
        Ok(())
    }

    /// A new id; in a cluster, one of a shard this node owns (if it owns
    /// any), so that the message is parked here.
    fn new_id(&self, scope: &Scope) -> MessageId {
        let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        let mut id = MessageId::generate(&mut ids, scope.tenant.as_ref());
        for _ in 0..ID_TRIES {
            if self.node.owns(self.node.shard_of(&id)) {
                break;
            }
            id = MessageId::generate(&mut ids, scope.tenant.as_ref());
        }
        id
    }

    pub async fn schedule(&self, access: &Access, cmd: ScheduleCommand) -> Result<Scheduled, Error> {
        let msg = self.prepare(access, &access.scope(), cmd).await?;
        Ok(self.node.change(Intent::schedule(msg)).await?.scheduled()?)
    }

    /// Schedules many requests in one durable write. Items that fail to
    /// convert, validate or pass the caller's grant are answered with their
    /// error and not stored; the rest are parked together. The whole call
    /// fails only when the batch is too large or the write fails (then
    /// nothing was stored).
    pub async fn schedule_batch(
        &self,
        access: &Access,
        items: Vec<Result<ScheduleCommand, Invalid>>,
    ) -> Result<Vec<Result<Scheduled, Error>>, Error> {
        self.limits.check_batch(items.len())?;
        let scope = access.scope();
        let mut results: Vec<Option<Result<Scheduled, Error>>> = Vec::with_capacity(items.len());
        let (mut msgs, mut slots) = (Vec::new(), Vec::new());
        for item in items {
            let prepared = match item {
                Ok(cmd) => self.prepare(access, &scope, cmd).await,
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
        let stored = self.node.schedule_batch(msgs).await?;
        for (slot, result) in slots.into_iter().zip(stored) {
            results[slot] = Some(result.map_err(Error::from));
        }
        Ok(results.into_iter().map(|r| r.expect("every item is answered")).collect())
    }

    /// Cancels a pending message (`id` of `tenant`'s space: empty for the
    /// caller's own); `only` if it still matches that.
    pub async fn cancel(
        &self,
        access: &Access,
        tenant: &str,
        id: &str,
        only: Option<Matching>,
    ) -> Result<CancelOutcome, Error> {
        let scope = access.scope();
        let id = access.id_of(tenant, id)?;
        let only = only.map(Box::new);
        Ok(self.node.change(Intent::Cancel { scope, id, now: self.clock.now(), only }).await?.cancelled()?)
    }

    pub async fn reschedule(
        &self,
        access: &Access,
        tenant: &str,
        id: &str,
        due: DueSpec,
    ) -> Result<UnixMillis, Error> {
        let scope = access.scope();
        let id = access.id_of(tenant, id)?;
        let (due, _) = self.resolve(due)?;
        Ok(self.node.change(Intent::Reschedule { scope, id, due }).await?.rescheduled()?)
    }

    pub async fn get(&self, access: &Access, tenant: &str, id: &str) -> Result<ScheduledMessage, Error> {
        let scope = access.scope();
        let id = access.id_of(tenant, id)?;
        match self.node.get(scope, id.clone()).await? {
            Some(m) => Ok(m),
            None => Err(StoreError::NotFound(id).into()),
        }
    }

    /// A page of the pending messages the caller sees, in dispatch order. A
    /// call looks at no more than [`LIST_EXAMINE`] entries, so a filtered
    /// page may come back short, or empty, with a token to go on.
    pub async fn list(&self, access: &Access, query: ListQuery) -> Result<PendingPage, Error> {
        let limit = query.validate()?;
        if let Some(topic) = &query.topic {
            access.check(topic)?;
        }
        Ok(self.node.list_pending(access.scope(), query, limit, LIST_EXAMINE).await?)
    }

    /// How many pending messages the caller sees come due in each interval
    /// of a window, per topic. A call counts at most [`FORECAST_EXAMINE`]
    /// due entries the caller may know of per shard, and says where it
    /// stopped. Calls take turns: at most [`FORECASTS_WAITING`] wait, each
    /// until its `deadline` or [`FORECAST_WAIT`], whichever comes first;
    /// past either it is refused (RESOURCE_EXHAUSTED), never queued without
    /// bound.
    pub async fn forecast(
        &self,
        access: &Access,
        query: ForecastQuery,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Forecast, Error> {
        let window = query.window(self.clock.now())?;
        if let Some(topic) = &query.topic {
            access.check(topic)?;
        }
        let busy = || Error::ForecastsBusy { waiting: FORECASTS_WAITING };
        let _place = self.forecast_queue.try_acquire().map_err(|_| busy())?;
        let latest = tokio::time::Instant::now() + FORECAST_WAIT;
        let until = deadline.map_or(latest, |d| d.min(latest));
        let _turn = match tokio::time::timeout_at(until, self.forecasting.acquire()).await {
            Ok(turn) => turn,
            Err(_) => return Err(busy()),
        };
        if crate::failpoint::fires("forecast-slow") {
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        }
        let examine = if crate::failpoint::fires("forecast-short") { 3 } else { FORECAST_EXAMINE };
        Ok(self.node.forecast(access.scope(), window, query.topic, examine).await?)
    }

    /// The copies of shards this node keeps, and its latest moves: the
    /// server's own state, for a caller that may see every tenant's.
    pub async fn picture(&self, access: &Access) -> Result<Picture, Error> {
        if access.admin().ok() != Some(AdminScope::All) {
            return Err(Error::NotOperator { token: access.name().to_owned() });
        }
        Ok(Picture { as_of: self.clock.now(), ..self.node.picture().await })
    }

    /// A backup of every store into `dir` (`Admin/Backup`), outside
    /// `data_dir`, for an operator's token: a call that writes where it
    /// names is not for a server without tokens. Audited.
    pub async fn back_up(
        &self,
        access: &Access,
        dir: &std::path::Path,
        data_dir: &std::path::Path,
    ) -> Result<crate::node::Backup, Error> {
        let backup = match access {
            Access::Open => Err(Error::NeedsTokens("Backup")),
            _ if !access.is_operator() => Err(Error::NotOperator { token: access.name().to_owned() }),
            _ => self.node.back_up(dir, data_dir, self.clock.now()).await,
        };
        let what = dir.display();
        match &backup {
            Ok(_) => crate::audit::record(access, "backup", &what, Ok("backed_up")),
            Err(e) => crate::audit::record(access, "backup", &what, Err(e)),
        }
        backup
    }

    /// Counts by state and the oldest overdue message, of what the caller
    /// sees. Figures about the whole server (what is being dispatched, the
    /// store's size) go only to a caller that sees everything.
    pub async fn stats(&self, access: &Access) -> Result<Stats, Error> {
        let now = self.clock.now();
        let scope = access.scope();
        let whole_server = scope.is_everything();
        let stats = self.node.stats(scope, now).await?;
        let (dispatching, store_bytes) = if whole_server {
            (self.node.dispatching() as u64, self.node.size_bytes().await?)
        } else {
            (0, 0)
        };
        Ok(Stats {
            as_of: now,
            pending: stats.counts.pending,
            delivered: stats.counts.delivered,
            cancelled: stats.counts.cancelled,
            failed: stats.counts.failed,
            expired: stats.counts.expired,
            dead_lettered: stats.counts.dead_lettered,
            dispatching,
            oldest_overdue: stats.oldest_overdue,
            store_bytes,
            max_pending: self.node.max_pending(),
            // The topic-wide holds of its topics, and its tenant's own.
            held_back: stats
                .held_back
                .into_iter()
                .filter(|h| access.check(&h.topic).is_ok())
                .filter(|h| h.tenant.is_none() || whole_server || h.tenant == access.scope().tenant)
                .collect(),
        })
    }
}
