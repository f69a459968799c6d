//! The gRPC adapter: the `hourglass.v1.Scheduler` service. Each method takes
//! the request, converts it (`convert`), calls the [`Service`], and converts
//! the answer back; errors become statuses through the one table in
//! `status`. No decisions are made here.

pub mod codec;
pub mod convert;
mod limit;
mod route;
mod status;
mod stream;

pub use limit::Budget;
pub use route::FORWARDED;
pub use stream::StreamLimits;

use std::{future::Future, sync::Arc, time::Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::{Request, Response, Status};

use crate::{Error, auth::Access, message::ListQuery, metrics, proto, service::Service};
use route::{Caller, Router};

/// How the API admits calls.
#[derive(Clone, Debug)]
pub struct ApiConfig {
    /// Calls served at once, at most.
    pub max_concurrent: usize,
    pub stream: stream::StreamLimits,
    /// The bytes of requests held at once, across calls.
    pub memory: limit::Budget,
    /// Cluster mode: how to reach other nodes advertised at https://
    /// addresses (none: the system's roots, no client certificate).
    pub peer_tls: Option<tonic::transport::ClientTlsConfig>,
}

pub struct SchedulerApi {
    service: Arc<Service>,
    router: Arc<Router>,
    config: ApiConfig,
    /// Calls being served at once, at most; one permit per call.
    admission: Arc<Semaphore>,
    /// Streams open at once, at most: half the calls, so that streams,
    /// which last, never leave unary calls without room.
    streams: Arc<Semaphore>,
}

impl SchedulerApi {
    pub fn new(service: Arc<Service>, config: ApiConfig) -> Self {
        SchedulerApi {
            router: Arc::new(Router::new(Arc::clone(&service), config.peer_tls.clone())),
            service,
            admission: Arc::new(Semaphore::new(config.max_concurrent)),
            streams: Arc::new(Semaphore::new((config.max_concurrent / 2).max(1))),
            config,
        }
    }

    /// Lets a call in, or turns it away at once when the server already
    /// serves as many as it may: a quick refusal the client can retry
    /// elsewhere or later, instead of a queue that grows without bound.
    fn admit(&self, method: &'static str) -> Result<OwnedSemaphorePermit, Status> {
        Arc::clone(&self.admission)
            .try_acquire_owned()
            .map_err(|_| busy(method, Error::TooManyCalls(self.config.max_concurrent)))
    }

    /// Lets a stream in: a place among the calls and among the streams, and
    /// the memory its window may take.
    fn admit_stream(&self) -> Result<impl Send + 'static, Status> {
        const METHOD: &str = "ScheduleStream";
        let call = self.admit(METHOD)?;
        let stream = Arc::clone(&self.streams)
            .try_acquire_owned()
            .map_err(|_| busy(METHOD, Error::TooManyStreams((self.config.max_concurrent / 2).max(1))))?;
        let window = stream::memory(self.service.limits());
        let memory = self.config.memory.try_take(window).ok_or_else(|| {
            busy(METHOD, Error::NoRoomForStream { total: self.config.memory.total(), window })
        })?;
        Ok((call, stream, memory))
    }

    /// Runs one admitted call, counting it by method and status code.
    async fn call<T>(
        &self,
        method: &'static str,
        call: impl Future<Output = Result<T, Error>>,
    ) -> Result<Response<T>, Status> {
        self.call_for_response(method, async { call.await.map(Response::new) }).await
    }

    /// [`call`](Self::call), for a call that answers with metadata.
    async fn call_for_response<T>(
        &self,
        method: &'static str,
        call: impl Future<Output = Result<Response<T>, Error>>,
    ) -> Result<Response<T>, Status> {
        let _permit = self.admit(method)?;
        observe(method, call).await
    }

    /// The gRPC service, refusing requests over the size limit unread.
    pub fn into_server(self) -> limit::SizeLimit<proto::scheduler_server::SchedulerServer<Self>> {
        let limits = self.service.limits().clone();
        let memory = self.config.memory.clone();
        let api = Arc::new(self);
        let serve = |limit: limit::Limit| {
            let server = proto::scheduler_server::SchedulerServer::from_arc(Arc::clone(&api));
            (server.max_decoding_message_size(limit.bytes), limit)
        };
        limit::SizeLimit::new(
            serve(limit::Limit::one_message(&limits)),
            serve(limit::Limit::batch(&limits)),
            memory,
        )
    }
}

/// A refusal for want of room, counted.
fn busy(method: &'static str, refusal: Error) -> Status {
    let status = Status::from(refusal);
    metrics::GRPC_REQUESTS.with_label_values(&[method, &format!("{:?}", status.code())]).inc();
    status
}

/// Schedules items of a batch or a stream on this node's shards: answers
/// numbered from 0, counted by status code.
async fn schedule_here(
    service: &Service,
    access: &Access,
    method: &'static str,
    items: Vec<proto::ScheduleRequest>,
) -> Vec<proto::ScheduleResult> {
    let n = items.len();
    let items = items.into_iter().map(TryInto::try_into).collect();
    let results = match service.schedule_batch(access, items).await {
        Ok(results) => results,
        // The write failed: nothing of it was stored.
        Err(e) => vec![Err(e); n],
    };
    schedule_results(method, 0, results)
}

/// The answers to items of a batch or a stream, numbered from
/// `first_index`, counted by status code (the successes in one go).
fn schedule_results(
    method: &'static str,
    first_index: u64,
    results: Vec<Result<crate::message::Scheduled, Error>>,
) -> Vec<proto::ScheduleResult> {
    use proto::schedule_result::Result as R;
    let mut scheduled = 0;
    let answers = (first_index..)
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

/// Runs one call, counting it by method and status code.
async fn observe<T>(
    method: &'static str,
    call: impl Future<Output = Result<Response<T>, Error>>,
) -> Result<Response<T>, Status> {
    let started = Instant::now();
    let result = call.await.map_err(Status::from);
    let code = match &result {
        Ok(_) => tonic::Code::Ok,
        Err(status) => status.code(),
    };
    metrics::GRPC_REQUESTS.with_label_values(&[method, &format!("{code:?}")]).inc();
    metrics::GRPC_SECONDS.with_label_values(&[method]).observe(started.elapsed().as_secs_f64());
    result
}

#[tonic::async_trait]
impl proto::scheduler_server::Scheduler for SchedulerApi {
    async fn schedule(
        &self,
        request: Request<proto::ScheduleRequest>,
    ) -> Result<Response<proto::ScheduleResponse>, Status> {
        self.call("Schedule", async {
            let (access, caller) = (Access::of(&request)?, Caller::of(&request));
            let forwarded = self
                .router
                .one(
                    "Schedule",
                    &caller,
                    &access,
                    request.get_ref().id.as_deref().unwrap_or_default(),
                    request.get_ref(),
                    |mut c, r| Box::pin(async move { c.schedule(r).await }),
                )
                .await?;
            if let Some(answer) = forwarded {
                return Ok(answer);
            }
            let scheduled = self.service.schedule(&access, request.into_inner().try_into()?).await?;
            Ok(scheduled.into())
        })
        .await
    }

    async fn schedule_batch(
        &self,
        request: Request<proto::ScheduleBatchRequest>,
    ) -> Result<Response<proto::ScheduleBatchResponse>, Status> {
        self.call("ScheduleBatch", async {
            let (access, caller) = (Access::of(&request)?, Caller::of(&request));
            let requests = request.into_inner().requests;
            self.service.check_batch(requests.len())?;
            let results = self.router.schedule(&caller, &access, "ScheduleBatch", requests).await;
            Ok(proto::ScheduleBatchResponse { results })
        })
        .await
    }

    type ScheduleStreamStream = stream::Answers;

    async fn schedule_stream(
        &self,
        request: Request<tonic::Streaming<proto::ScheduleRequest>>,
    ) -> Result<Response<Self::ScheduleStreamStream>, Status> {
        let access = Access::of(&request).map_err(Status::from)?;
        let caller = Caller::of(&request);
        let permits = self.admit_stream()?;
        let answers = stream::serve(
            Arc::clone(&self.service),
            Arc::clone(&self.router),
            caller,
            access,
            request.into_inner(),
            self.config.stream,
            permits,
        );
        Ok(Response::new(answers))
    }

    async fn cancel(
        &self,
        request: Request<proto::CancelRequest>,
    ) -> Result<Response<proto::CancelResponse>, Status> {
        self.call("Cancel", async {
            let (access, caller) = (Access::of(&request)?, Caller::of(&request));
            let forwarded = self
                .router
                .one("Cancel", &caller, &access, &request.get_ref().id, request.get_ref(), |mut c, r| {
                    Box::pin(async move { c.cancel(r).await })
                })
                .await?;
            if let Some(answer) = forwarded {
                return Ok(answer);
            }
            let outcome = self.service.cancel(&access, &request.into_inner().id).await?;
            Ok(proto::CancelResponse { outcome: proto::CancelOutcome::from(outcome).into() })
        })
        .await
    }

    async fn reschedule(
        &self,
        request: Request<proto::RescheduleRequest>,
    ) -> Result<Response<proto::RescheduleResponse>, Status> {
        self.call("Reschedule", async {
            let (access, caller) = (Access::of(&request)?, Caller::of(&request));
            let forwarded = self
                .router
                .one("Reschedule", &caller, &access, &request.get_ref().id, request.get_ref(), |mut c, r| {
                    Box::pin(async move { c.reschedule(r).await })
                })
                .await?;
            if let Some(answer) = forwarded {
                return Ok(answer);
            }
            let request = request.into_inner();
            convert::check_id(&request.id)?;
            let due = convert::due_spec(request.due.map(convert::WireDue::from))?;
            let due = self.service.reschedule(&access, &request.id, due).await?;
            Ok(proto::RescheduleResponse { deliver_at: Some(convert::timestamp(due)) })
        })
        .await
    }

    async fn get(&self, request: Request<proto::GetRequest>) -> Result<Response<proto::GetResponse>, Status> {
        self.call("Get", async {
            let (access, caller) = (Access::of(&request)?, Caller::of(&request));
            let forwarded = self
                .router
                .one("Get", &caller, &access, &request.get_ref().id, request.get_ref(), |mut c, r| {
                    Box::pin(async move { c.get(r).await })
                })
                .await?;
            if let Some(answer) = forwarded {
                return Ok(answer);
            }
            Ok(self.service.get(&access, &request.into_inner().id).await?.into())
        })
        .await
    }

    async fn list(
        &self,
        request: Request<proto::ListRequest>,
    ) -> Result<Response<proto::ListResponse>, Status> {
        self.call_for_response("List", async {
            let (access, caller) = (Access::of(&request)?, Caller::of(&request));
            let request = request.into_inner();
            let query: ListQuery = request.clone().try_into()?;
            let limit = query.validate()?;
            let page = self.service.list(&access, query).await?;
            self.router.list(&caller, request, page, limit).await
        })
        .await
    }

    async fn stats(
        &self,
        request: Request<proto::StatsRequest>,
    ) -> Result<Response<proto::StatsResponse>, Status> {
        self.call("Stats", async {
            let (access, caller) = (Access::of(&request)?, Caller::of(&request));
            let here = self.service.stats(&access).await?.into();
            self.router.stats(&caller, here).await
        })
        .await
    }
}
