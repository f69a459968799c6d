//! This node's [`Service`] as a [`Scheduler`]: each call converted from the
//! API's messages (`convert`), served, and its answer converted back.

use std::sync::Arc;

use super::convert;
use crate::{
    Error, audit,
    message::{Limits, ListQuery, Scheduled},
    metrics, proto,
    scheduler::{Call, Listing, Scheduler},
    service::Service,
    status,
};

/// Serves every call on this node.
pub struct Local {
    service: Arc<Service>,
}

impl Local {
    pub fn new(service: Arc<Service>) -> Local {
        Local { service }
    }
}

#[tonic::async_trait]
impl Scheduler for Local {
    fn limits(&self) -> &Limits {
        self.service.limits()
    }

    async fn schedule(
        &self,
        call: &Call,
        request: proto::ScheduleRequest,
    ) -> Result<proto::ScheduleResponse, Error> {
        Ok(self.service.schedule(&call.access, request.try_into()?).await?.into())
    }

    async fn schedule_batch(
        &self,
        call: &Call,
        method: &'static str,
        items: Vec<proto::ScheduleRequest>,
    ) -> Vec<proto::ScheduleResult> {
        let n = items.len();
        let items = items.into_iter().map(TryInto::try_into).collect();
        let results = match self.service.schedule_batch(&call.access, items).await {
            Ok(results) => results,
            // The write failed: nothing of it was stored.
            Err(e) => vec![Err(e); n],
        };
        schedule_results(method, results)
    }

    async fn cancel(
        &self,
        call: &Call,
        request: proto::CancelRequest,
    ) -> Result<proto::CancelResponse, Error> {
        let only = convert::matching(&request)?;
        let outcome = self.service.cancel(&call.access, &request.tenant, &request.id, only).await;
        let what = Named(&request.tenant, &request.id);
        let outcome = audit_outcome(&call.access, "Cancel", &what, outcome, |o| o.name())?;
        Ok(proto::CancelResponse { outcome: proto::CancelOutcome::from(outcome).into() })
    }

    async fn reschedule(
        &self,
        call: &Call,
        request: proto::RescheduleRequest,
    ) -> Result<proto::RescheduleResponse, Error> {
        convert::check_id(&request.id)?;
        let due = convert::due_spec(request.due.map(convert::WireDue::from))?;
        let due = self.service.reschedule(&call.access, &request.tenant, &request.id, due).await;
        let what = Named(&request.tenant, &request.id);
        let due = audit_outcome(&call.access, "Reschedule", &what, due, |_| "rescheduled")?;
        Ok(proto::RescheduleResponse { deliver_at: Some(convert::timestamp(due)) })
    }

    async fn get(&self, call: &Call, request: proto::GetRequest) -> Result<proto::GetResponse, Error> {
        Ok(self.service.get(&call.access, &request.tenant, &request.id).await?.into())
    }

    async fn list(&self, call: &Call, request: proto::ListRequest) -> Result<Listing, Error> {
        let query: ListQuery = request.try_into()?;
        let page = self.service.list(&call.access, query).await?;
        Ok(Listing {
            page: proto::ListResponse {
                messages: page.messages.into_iter().map(Into::into).collect(),
                next_page_token: page.next.map(|next| next.encode()).unwrap_or_default(),
            },
            positions: page.positions,
        })
    }

    async fn stats(&self, call: &Call) -> Result<proto::StatsResponse, Error> {
        Ok(self.service.stats(&call.access).await?.into())
    }

    async fn forecast(
        &self,
        call: &Call,
        request: proto::ForecastRequest,
    ) -> Result<proto::ForecastResponse, Error> {
        Ok(self.service.forecast(&call.access, request.try_into()?, call.deadline).await?.into())
    }

    async fn describe(&self, call: &Call) -> Result<proto::DescribeClusterResponse, Error> {
        Ok(self.service.picture(&call.access).await?.into())
    }
}

/// The answers to items of a batch or a stream, numbered from 0, counted
/// by status code (the successes in one go).
fn schedule_results(
    method: &'static str,
    results: Vec<Result<Scheduled, Error>>,
) -> Vec<proto::ScheduleResult> {
    use proto::schedule_result::Result as R;
    let mut scheduled = 0;
    let answers = (0..)
        .zip(results)
        .map(|(index, result)| {
            let result = match result {
                Ok(s) => {
                    scheduled += 1;
                    R::Scheduled(s.into())
                }
                Err(e) => {
                    let error = status::item_error(e);
                    let code = format!("{:?}", tonic::Code::from_i32(error.code));
                    metrics::SCHEDULE_ITEMS.with_label_values(&[method, &code]).inc();
                    R::Error(error)
                }
            };
            proto::ScheduleResult { index, result: Some(result) }
        })
        .collect();
    metrics::SCHEDULE_ITEMS.with_label_values(&[method, "Ok"]).inc_by(scheduled);
    answers
}

/// A message as a call names it, for the audit trail: `tenant/id`, or the
/// id alone in the caller's own space.
struct Named<'a>(&'a str, &'a str);

impl std::fmt::Display for Named<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            "" => write!(f, "id={}", self.1),
            tenant => write!(f, "id={tenant}/{}", self.1),
        }
    }
}

/// Records a change's outcome in the audit trail (its name as `word`
/// says), and passes it on.
fn audit_outcome<T>(
    access: &crate::auth::Access,
    verb: &'static str,
    what: &dyn std::fmt::Display,
    result: Result<T, Error>,
    word: impl FnOnce(&T) -> &'static str,
) -> Result<T, Error> {
    match &result {
        Ok(done) => audit::record(access, verb, what, Ok(word(done))),
        Err(e) => audit::record(access, verb, what, Err(e)),
    }
    result
}
