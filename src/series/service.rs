//! The series calls: create, get, list, update, pause, resume, delete.
//!
//! A series lives in its creator's id space, as a message does: another
//! tenant's series do not exist for a caller. Its template's topic is
//! checked against the caller's grant when it is created or updated, and
//! again on every call that names it; the driver then parks its
//! occurrences in the series' space. A call that changes a series holds
//! the series' lock, so the driver never parks an occurrence of a series
//! being changed: after Delete or Pause answers, none is parked, and every
//! occurrence parked before that may be pending is cancelled, its outcome
//! in the answer. Each create is held to the server's limits: what a spec
//! may say ([`Limits`](super::spec::Limits)), and how many series a tenant
//! may have.

use std::time::Instant;

use tokio::sync::RwLockReadGuard;

use super::{
    Series,
    book::{Change, Record, wake_of},
    driver::space_of,
    record::SeriesRecord,
    spec::{Spec, every_token, every_token_of, occurrence_id, series_id},
    tally::Reserve,
};
use crate::{
    Error, audit,
    auth::Access,
    command::Intent,
    message::{Invalid, MessageId, SHARED_SPACE, Selector, Tenant, UnixMillis, validate_topic_name},
    proto,
    scheduler::{Call, DEFAULT_SERIES_PAGE, SeriesCalls, fit_series_page},
};

/// A series whose spec no longer reads (a damaged record, or a newer
/// build's): said as such; it can still be deleted.
fn unreadable(id: &MessageId, e: Invalid) -> Error {
    crate::store::StoreError::Corrupt(format!(
        "series {}: its stored spec does not read ({}: {}); delete it and create it again",
        id.as_str(),
        e.field,
        e.reason
    ))
    .into()
}

/// Cancels of a series' occurrences under way at once.
const CANCELS_AT_ONCE: usize = 32;
/// Next occurrences Get shows unless asked.
const DEFAULT_NEXT: usize = 5;
/// The most next occurrences Get shows.
const MAX_NEXT: usize = 100;
const MAX_PAGE: usize = 1000;

impl Series {
    /// The caller's series `id`: checked, in its space; or, for an
    /// operator, in the space of the `tenant` it names.
    fn id(&self, access: &Access, tenant: &str, id: &str) -> Result<MessageId, Error> {
        let own = access.scope().tenant;
        if tenant.is_empty() || own.as_ref().is_some_and(|t| t.as_str() == tenant) {
            return Ok(series_id(own.as_ref(), id)?);
        }
        if !access.is_operator() {
            return Err(Error::NotOperator { token: access.name().to_owned() });
        }
        if tenant == SHARED_SPACE {
            return Ok(series_id(None, id)?);
        }
        let tenant = Tenant::parse(tenant).map_err(|reason| Invalid::new("tenant", reason.0))?;
        Ok(series_id(Some(&tenant), id)?)
    }

    /// Series `id` as the caller may see it: its topic within the grant.
    async fn load_visible(&self, access: &Access, id: &MessageId) -> Result<(SeriesRecord, Spec), Error> {
        let record = self.load_record(access, id, Grant::Topic).await?;
        let spec = record.spec().map_err(|e| unreadable(id, e))?;
        Ok((record, spec))
    }

    /// As [`load_visible`](Self::load_visible), whether its spec reads or
    /// not; `grant` says whether the caller's grant must cover its topic.
    async fn load_record(
        &self,
        access: &Access,
        id: &MessageId,
        grant: Grant,
    ) -> Result<SeriesRecord, Error> {
        let record =
            self.book.load(id).await?.ok_or_else(|| Error::SeriesNotFound(id.as_str().to_owned()))?;
        let own = access.scope().tenant.as_ref().map(|t| t.as_str()) == id.tenant();
        // A series no token of its tenant covers any more is its tenant's
        // to stop with any of its tokens; else the caller's must cover it.
        let orphaned = own && !self.grants.covers(id.tenant(), record.topic());
        if grant == Grant::Topic || !orphaned {
            access.check(record.topic())?;
        }
        Ok(record)
    }
}

/// What a call on a series needs of the caller's grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Grant {
    /// Its topic, as every call that reads it or makes it go on.
    Topic,
    /// Nothing more for its own tenant's series that no token of the
    /// tenant covers any more: a call that stops it (pause, delete) is
    /// always its tenant's to make, even after the tokens file took the
    /// topic away.
    OwnToStop,
}

/// Records a series call in the audit trail, and passes its result on.
fn audited<T>(
    access: &Access,
    verb: &'static str,
    id: &str,
    tenant: &str,
    result: Result<T, Error>,
) -> Result<T, Error> {
    let what = if tenant.is_empty() { format!("series={id}") } else { format!("series={tenant}/{id}") };
    match &result {
        Ok(_) => audit::record(access, verb, &what, Ok("done")),
        Err(e) => audit::record(access, verb, &what, Err(e)),
    }
    result
}

/// The calls, each whole; the seam below records the changes.
impl Series {
    async fn create(
        &self,
        call: &Call,
        request: proto::CreateSeriesRequest,
    ) -> Result<proto::CreateSeriesResponse, Error> {
        let access = &call.access;
        let id = self.id(access, "", &request.id)?;
        let given = request.spec.ok_or_else(|| Invalid::new("spec", "is missing"))?;
        let now = self.clock.now();
        let spec = Spec::parse(&given, now, now, &self.limits)?;
        self.service.check_template(access, &spec.template).await?;
        let _lock = self.book.lock(&id).await;
        if let Some(existing) = self.book.load(&id).await? {
            if existing.spec.as_ref() == Some(&given) {
                access.check(&spec.template.topic)?;
                let spec = existing.spec()?;
                return Ok(proto::CreateSeriesResponse {
                    series: Some(existing.info(&id, &spec, 1, self.shards())),
                    created: false,
                });
            }
            return Err(Error::SeriesExists(id.as_str().to_owned()));
        }
        let next = spec.rule.next_after(UnixMillis(now.0.saturating_sub(1)), 0).ok_or_else(|| {
            Invalid::new(
                "spec",
                "has no occurrence from now on: its end, count or expression rules out every one",
            )
        })?;
        let tenant = access.scope().tenant;
        let _making = self.take_place(tenant.as_ref()).await?;
        let record = SeriesRecord {
            spec: Some(given),
            created_ms: now.0,
            updated_ms: now.0,
            anchor_ms: now.0,
            next_ms: Some(next.0),
            ..Default::default()
        };
        if let Err(e) = self.save(&id, &record, &spec, None).await {
            self.tally.removed(tenant.as_ref());
            return Err(e);
        }
        Ok(proto::CreateSeriesResponse {
            series: Some(record.info(&id, &spec, 1, self.shards())),
            created: true,
        })
    }

    async fn get(&self, call: &Call, request: proto::GetSeriesRequest) -> Result<proto::SeriesInfo, Error> {
        let access = &call.access;
        let id = self.id(access, &request.tenant, &request.id)?;
        let n = match request.next as usize {
            0 => DEFAULT_NEXT,
            n if n > MAX_NEXT => {
                return Err(Invalid::new("next", format!("is {n}; the most is {MAX_NEXT}")).into());
            }
            n => n,
        };
        let (record, spec) = self.load_visible(access, &id).await?;
        Ok(record.info(&id, &spec, n, self.shards()))
    }

    async fn list(
        &self,
        call: &Call,
        request: proto::ListSeriesRequest,
    ) -> Result<proto::ListSeriesResponse, Error> {
        let access = &call.access;
        let limit = match request.page_size as usize {
            0 => DEFAULT_SERIES_PAGE,
            n if n > MAX_PAGE => {
                return Err(Invalid::new("page_size", format!("is {n}; the most is {MAX_PAGE}")).into());
            }
            n => n,
        };
        let topic = (!request.topic.is_empty()).then_some(request.topic);
        if let Some(topic) = &topic {
            validate_topic_name(topic).map_err(|e| Invalid::new("topic", e.reason))?;
            access.check(topic)?;
        }
        let selector = Selector::parse("selector", &request.selector)?;
        let scope = access.scope();
        // An operator lists every tenant's.
        let every = access.is_operator();
        let not_given = || Invalid::new("page_token", "is not a token a ListSeries answer gave");
        let after = match request.page_token.as_str() {
            "" => None,
            token if every => Some(every_token(token).ok_or_else(not_given)?),
            token => Some(series_id(scope.tenant.as_ref(), token).map_err(|_| not_given())?),
        };
        let page = if every {
            self.book.page_all(after, limit).await?
        } else {
            self.book.page(scope.tenant.as_ref(), after, limit).await?
        };
        let token_of = |id: &MessageId| if every { every_token_of(id) } else { id.as_str().to_owned() };
        let next_page_token = if page.len() < limit {
            String::new()
        } else {
            page.last().map(|(id, _)| token_of(id)).unwrap_or_default()
        };
        let mut series = Vec::with_capacity(page.len());
        for (id, record) in page {
            let spec = match record
                .map_err(|e| e.to_string())
                .and_then(|r| Ok((r.spec().map_err(|e| e.reason)?, r)))
            {
                Ok((spec, record)) => (spec, record),
                Err(e) => {
                    tracing::warn!(series = %id.qualified(), error = e, "a series' record does not read; not listed");
                    continue;
                }
            };
            let (spec, record) = spec;
            if !scope.covers(&spec.template.topic)
                || topic.as_ref().is_some_and(|t| *t != spec.template.topic)
                || !selector.matches(&spec.template.labels)
            {
                continue;
            }
            series.push(record.info(&id, &spec, 1, self.shards()));
        }
        let next_page_token = match fit_series_page(&mut series) {
            None => next_page_token,
            Some(last) if !every => last,
            // Cut by size: after the last one kept, in whoever's space.
            Some(last) => {
                let tenant = series.last().map(|s| s.tenant.as_str()).filter(|t| !t.is_empty());
                let tenant =
                    tenant.map(Tenant::parse).transpose().map_err(|e| Invalid::new("tenant", e.0))?;
                every_token_of(&series_id(tenant.as_ref(), &last)?)
            }
        };
        Ok(proto::ListSeriesResponse { series, next_page_token })
    }

    async fn update(
        &self,
        call: &Call,
        request: proto::UpdateSeriesRequest,
    ) -> Result<proto::UpdateSeriesResponse, Error> {
        let access = &call.access;
        let id = self.id(access, "", &request.id)?;
        let given = request.spec.ok_or_else(|| Invalid::new("spec", "is missing"))?;
        // Checked before the series is locked: the check may ask Kafka.
        let now = self.clock.now();
        self.service.check_template(access, &Spec::parse(&given, now, now, &self.limits)?.template).await?;
        let _lock = self.book.lock(&id).await;
        let mut record = self.load_record(access, &id, Grant::Topic).await?;
        let old_wake = record.spec().ok().and_then(|old| wake_of(&id, &record, &old));
        let spec = Spec::parse(&given, UnixMillis(record.anchor_ms), now, &self.limits)?;
        let occurrences = self.cancel_parked(&id, &mut record).await?;
        record.next_ms = record.next_from(&spec, now).map(|t| t.0);
        record.spec = Some(given);
        record.updated_ms = now.0;
        self.save(&id, &record, &spec, old_wake).await?;
        Ok(proto::UpdateSeriesResponse {
            series: Some(record.info(&id, &spec, 1, self.shards())),
            occurrences,
        })
    }

    async fn pause(
        &self,
        call: &Call,
        request: proto::PauseSeriesRequest,
    ) -> Result<proto::PauseSeriesResponse, Error> {
        let access = &call.access;
        let id = self.id(access, &request.tenant, &request.id)?;
        let _lock = self.book.lock(&id).await;
        let mut record = self.load_record(access, &id, Grant::OwnToStop).await?;
        let spec = record.spec().map_err(|e| unreadable(&id, e))?;
        let old_wake = wake_of(&id, &record, &spec);
        let occurrences = self.cancel_parked(&id, &mut record).await?;
        record.paused = true;
        record.paused_reason.clear();
        record.updated_ms = self.clock.now().0;
        self.save(&id, &record, &spec, old_wake).await?;
        Ok(proto::PauseSeriesResponse {
            series: Some(record.info(&id, &spec, 1, self.shards())),
            occurrences,
        })
    }

    async fn resume(
        &self,
        call: &Call,
        request: proto::ResumeSeriesRequest,
    ) -> Result<proto::SeriesInfo, Error> {
        let access = &call.access;
        let id = self.id(access, &request.tenant, &request.id)?;
        let _lock = self.book.lock(&id).await;
        let (mut record, spec) = self.load_visible(access, &id).await?;
        if record.paused {
            let now = self.clock.now();
            record.paused = false;
            record.paused_reason.clear();
            record.updated_ms = now.0;
            if record.next_ms.is_some() {
                record.next_ms = record.next_from(&spec, now).map(|t| t.0);
            }
            self.save(&id, &record, &spec, None).await?;
        }
        Ok(record.info(&id, &spec, 1, self.shards()))
    }

    async fn delete(
        &self,
        call: &Call,
        request: proto::DeleteSeriesRequest,
    ) -> Result<proto::DeleteSeriesResponse, Error> {
        let access = &call.access;
        let id = self.id(access, &request.tenant, &request.id)?;
        let _lock = self.book.lock(&id).await;
        // Even one whose spec no longer reads can be deleted, and one whose
        // topic its tenant lost.
        let mut record = self.load_record(access, &id, Grant::OwnToStop).await?;
        let old_wake = record.spec().ok().and_then(|spec| wake_of(&id, &record, &spec));
        let occurrences = self.cancel_parked(&id, &mut record).await?;
        let tenant = id.tenant().and_then(|t| Tenant::parse(t).ok());
        let _making = self.making.read().await;
        self.book.save(vec![Change { id, record: Record::Delete, old_wake, wake: None }]).await?;
        self.tally.removed(tenant.as_ref());
        Ok(proto::DeleteSeriesResponse { occurrences })
    }
}

impl Series {
    /// Takes a place for a new series of `tenant` (the shared space,
    /// without tokens), or refuses it if the tenant has as many as
    /// --series-max-per-tenant allows: in a cluster, each node holds it to
    /// its share, by the shards it serves. The place is held (the guard
    /// returned) until the series is written, or given back if it is not.
    async fn take_place(&self, tenant: Option<&Tenant>) -> Result<RwLockReadGuard<'_, ()>, Error> {
        let max = self.limits.max_per_tenant;
        let served: Vec<u32> = self.book.node().readers().into_iter().map(|(shard, _)| shard).collect();
        let share = (max.saturating_mul(served.len())).div_ceil((self.shards() as usize).max(1)).min(max);
        let full = || Error::SeriesLimit { tenant: tenant.map(|t| t.as_str().to_owned()), share, max };
        let making = self.making.read().await;
        match self.tally.reserve(tenant, &served, share, Instant::now()) {
            Reserve::Taken => return Ok(making),
            Reserve::Full => return Err(full()),
            Reserve::Unknown => drop(making),
        }
        // Counted with no create or delete of this node's in flight; once,
        // however many creates found the count stale at once.
        let alone = self.making.write().await;
        let taken = match self.tally.reserve(tenant, &served, share, Instant::now()) {
            Reserve::Taken => true,
            Reserve::Full => false,
            Reserve::Unknown => {
                let at = Instant::now();
                let count = self.book.count(tenant, share).await?;
                self.tally.counted(tenant, served, count, share, at)
            }
        };
        if taken { Ok(alone.downgrade()) } else { Err(full()) }
    }

    /// Cancels the occurrences the series parked and may not have settled,
    /// and forgets them. If a cancel fails, the series is left as it was
    /// (an occurrence cancelled meanwhile answers ALREADY_CANCELLED when
    /// the call is repeated).
    pub(super) async fn cancel_parked(
        &self,
        id: &MessageId,
        record: &mut SeriesRecord,
    ) -> Result<Vec<proto::OccurrenceOutcome>, Error> {
        use futures_util::{StreamExt as _, TryStreamExt as _, stream};
        let scope = space_of(id);
        let now = self.clock.now();
        let node = self.book.node();
        // Every one, however many (`missed.after` bounds them to about a
        // thousand, and the late ones a policy keeps), a few at once.
        let pending: Vec<u64> = record.pending().copied().collect();
        let outcomes = stream::iter(pending)
            .map(|at| {
                let occurrence = occurrence_id(id, UnixMillis(at), self.shards());
                let intent = Intent::Cancel { scope: scope.clone(), id: occurrence.clone(), now, only: None };
                async move {
                    let outcome = node.change(intent).await?.cancelled()?;
                    Ok::<_, Error>(proto::OccurrenceOutcome {
                        id: occurrence.as_str().to_owned(),
                        outcome: proto::CancelOutcome::from(outcome).into(),
                    })
                }
            })
            .buffered(CANCELS_AT_ONCE)
            .try_collect()
            .await?;
        record.parked.clear();
        record.late.clear();
        record.firing.clear();
        Ok(outcomes)
    }

    /// Writes `record`, moving its wake from `old_wake`, and wakes the
    /// driver.
    async fn save(
        &self,
        id: &MessageId,
        record: &SeriesRecord,
        spec: &Spec,
        old_wake: Option<UnixMillis>,
    ) -> Result<(), Error> {
        let wake = wake_of(id, record, spec);
        let change = Change { id: id.clone(), record: Record::Put(Box::new(record.clone())), old_wake, wake };
        self.book.save(vec![change]).await?;
        self.wake.notify_one();
        Ok(())
    }
}

#[tonic::async_trait]
impl SeriesCalls for Series {
    async fn create_series(
        &self,
        call: &Call,
        request: proto::CreateSeriesRequest,
    ) -> Result<proto::CreateSeriesResponse, Error> {
        let id = request.id.clone();
        audited(&call.access, "CreateSeries", &id, "", self.create(call, request).await)
    }

    async fn get_series(
        &self,
        call: &Call,
        request: proto::GetSeriesRequest,
    ) -> Result<proto::SeriesInfo, Error> {
        self.get(call, request).await
    }

    async fn list_series(
        &self,
        call: &Call,
        request: proto::ListSeriesRequest,
    ) -> Result<proto::ListSeriesResponse, Error> {
        self.list(call, request).await
    }

    async fn update_series(
        &self,
        call: &Call,
        request: proto::UpdateSeriesRequest,
    ) -> Result<proto::UpdateSeriesResponse, Error> {
        let id = request.id.clone();
        audited(&call.access, "UpdateSeries", &id, "", self.update(call, request).await)
    }

    async fn pause_series(
        &self,
        call: &Call,
        request: proto::PauseSeriesRequest,
    ) -> Result<proto::PauseSeriesResponse, Error> {
        let (id, tenant) = (request.id.clone(), request.tenant.clone());
        audited(&call.access, "PauseSeries", &id, &tenant, self.pause(call, request).await)
    }

    async fn resume_series(
        &self,
        call: &Call,
        request: proto::ResumeSeriesRequest,
    ) -> Result<proto::SeriesInfo, Error> {
        let (id, tenant) = (request.id.clone(), request.tenant.clone());
        audited(&call.access, "ResumeSeries", &id, &tenant, self.resume(call, request).await)
    }

    async fn delete_series(
        &self,
        call: &Call,
        request: proto::DeleteSeriesRequest,
    ) -> Result<proto::DeleteSeriesResponse, Error> {
        let (id, tenant) = (request.id.clone(), request.tenant.clone());
        audited(&call.access, "DeleteSeries", &id, &tenant, self.delete(call, request).await)
    }
}
