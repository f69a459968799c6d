//! The gRPC adapter: the `hourglass.v1.Scheduler` service. Each method
//! admits the call, reads who makes it, and hands it to the [`Scheduler`]
//! it serves ([`Local`]: this node's service, converting with `convert`);
//! errors become statuses through the one table in [`crate::status`]. No
//! decisions are made here.

mod admin;
pub mod codec;
pub mod convert;
mod limit;
mod local;
mod series;
mod stream;

pub use admin::{AdminApi, Backups};
pub use limit::Budget;
pub use local::Local;
pub use series::SeriesApi;
pub use stream::StreamLimits;

use std::{future::Future, sync::Arc, time::Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::{Request, Response, Status};

use crate::{
    Error,
    auth::Access,
    bulk, metrics, otel, proto,
    scheduler::{Call, FORWARDED, Listing, POSITIONS, Scheduler},
};

/// How the API admits calls.
#[derive(Clone, Debug)]
pub struct ApiConfig {
    /// Calls served at once, at most.
    pub max_concurrent: usize,
    pub stream: stream::StreamLimits,
    /// The bytes of requests held at once, across calls.
    pub memory: limit::Budget,
}

pub struct SchedulerApi {
    scheduler: Arc<dyn Scheduler>,
    config: ApiConfig,
    /// Calls being served at once, at most; one permit per call.
    admission: Arc<Semaphore>,
    /// Streams open at once, at most: half the calls, so that streams,
    /// which last, never leave unary calls without room.
    streams: Arc<Semaphore>,
}

impl SchedulerApi {
    pub fn new(scheduler: Arc<dyn Scheduler>, config: ApiConfig) -> Self {
        SchedulerApi {
            scheduler,
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
        let window = stream::memory(self.scheduler.limits());
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

    /// The `Series` service over `series`, its calls admitted among this
    /// service's.
    pub fn series(&self, series: Arc<dyn crate::scheduler::SeriesCalls>) -> SeriesApi {
        SeriesApi::new(series, Arc::clone(&self.admission), self.config.max_concurrent)
    }

    /// The `Admin` service over `policies` and `backups` (a standalone
    /// node's service; none in a cluster), and this service's scheduler for
    /// the cluster's description, its calls admitted among this service's.
    pub fn admin(
        &self,
        policies: Arc<crate::admin::PolicyService>,
        backups: Option<admin::Backups>,
    ) -> AdminApi {
        AdminApi::new(
            policies,
            Arc::clone(&self.scheduler),
            backups,
            Arc::clone(&self.admission),
            self.config.max_concurrent,
        )
    }

    /// The gRPC service, refusing requests over the size limit unread.
    pub fn into_server(self) -> limit::SizeLimit<proto::scheduler_server::SchedulerServer<Self>> {
        let limits = self.scheduler.limits().clone();
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
/// Runs one call of a service that shares the Scheduler's admission: let
/// in if a permit is free (else refused at once), counted by method and
/// status code.
async fn admitted<T>(
    admission: &Arc<Semaphore>,
    max_concurrent: usize,
    method: &'static str,
    call: impl Future<Output = Result<T, Error>>,
) -> Result<Response<T>, Status> {
    let _permit = Arc::clone(admission)
        .try_acquire_owned()
        .map_err(|_| busy(method, Error::TooManyCalls(max_concurrent)))?;
    observe(method, async { call.await.map(Response::new) }).await
}

fn busy(method: &'static str, refusal: Error) -> Status {
    let status = Status::from(refusal);
    metrics::GRPC_REQUESTS.with_label_values(&[method, &format!("{:?}", status.code())]).inc();
    status
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
            let call = call_of(&request)?;
            let (metadata, _, mut request) = request.into_parts();
            let span = otel::carry(&metadata, "Schedule", request.message.as_mut());
            let answer = self.scheduler.schedule(&call, request).await;
            if let Some(span) = span {
                span.end(&answer);
            }
            answer
        })
        .await
    }

    async fn schedule_batch(
        &self,
        request: Request<proto::ScheduleBatchRequest>,
    ) -> Result<Response<proto::ScheduleBatchResponse>, Status> {
        self.call("ScheduleBatch", async {
            let call = call_of(&request)?;
            let (metadata, _, request) = request.into_parts();
            let mut requests = request.requests;
            self.scheduler.limits().check_batch(requests.len())?;
            let messages = requests.iter_mut().filter_map(|r| r.message.as_mut());
            let span = otel::carry(&metadata, "ScheduleBatch", messages);
            let results = self.scheduler.schedule_batch(&call, "ScheduleBatch", requests).await;
            if let Some(span) = span {
                span.end(&Ok::<_, Error>(()));
            }
            Ok(proto::ScheduleBatchResponse { results })
        })
        .await
    }

    type ScheduleStreamStream = stream::Answers;

    async fn schedule_stream(
        &self,
        request: Request<tonic::Streaming<proto::ScheduleRequest>>,
    ) -> Result<Response<Self::ScheduleStreamStream>, Status> {
        let call = call_of(&request).map_err(Status::from)?;
        let permits = self.admit_stream()?;
        let answers = stream::serve(Arc::clone(&self.scheduler), call, request, self.config.stream, permits);
        Ok(Response::new(answers))
    }

    async fn cancel(
        &self,
        request: Request<proto::CancelRequest>,
    ) -> Result<Response<proto::CancelResponse>, Status> {
        self.call("Cancel", async {
            let call = call_of(&request)?;
            self.scheduler.cancel(&call, request.into_inner()).await
        })
        .await
    }

    async fn reschedule(
        &self,
        request: Request<proto::RescheduleRequest>,
    ) -> Result<Response<proto::RescheduleResponse>, Status> {
        self.call("Reschedule", async {
            let call = call_of(&request)?;
            self.scheduler.reschedule(&call, request.into_inner()).await
        })
        .await
    }

    async fn get(&self, request: Request<proto::GetRequest>) -> Result<Response<proto::GetResponse>, Status> {
        self.call("Get", async {
            let call = call_of(&request)?;
            self.scheduler.get(&call, request.into_inner()).await
        })
        .await
    }

    async fn list(
        &self,
        request: Request<proto::ListRequest>,
    ) -> Result<Response<proto::ListResponse>, Status> {
        self.call_for_response("List", async {
            let call = call_of(&request)?;
            let Listing { page, positions } = self.scheduler.list(&call, request.into_inner()).await?;
            let mut response = Response::new(page);
            // A node that merges pages orders them by these.
            if call.forwarded {
                let positions = positions.iter().map(|p| p.encode()).collect::<Vec<_>>().join(",");
                let value = positions.parse().map_err(|_| Error::Undecodable("page positions".into()))?;
                response.metadata_mut().insert(POSITIONS, value);
            }
            Ok(response)
        })
        .await
    }

    async fn stats(
        &self,
        request: Request<proto::StatsRequest>,
    ) -> Result<Response<proto::StatsResponse>, Status> {
        self.call("Stats", async {
            let call = call_of(&request)?;
            self.scheduler.stats(&call).await
        })
        .await
    }

    async fn forecast(
        &self,
        request: Request<proto::ForecastRequest>,
    ) -> Result<Response<proto::ForecastResponse>, Status> {
        self.call("Forecast", async {
            let call = call_of(&request)?;
            self.scheduler.forecast(&call, request.into_inner()).await
        })
        .await
    }

    async fn cancel_matching(
        &self,
        request: Request<proto::CancelMatchingRequest>,
    ) -> Result<Response<proto::CancelMatchingResponse>, Status> {
        self.call("CancelMatching", async {
            let call = call_of(&request)?;
            bulk::cancel_matching(self.scheduler.as_ref(), &call, request.into_inner()).await
        })
        .await
    }
}

/// Who makes `request`, and what it carries on if it is passed on.
fn call_of<T>(request: &Request<T>) -> Result<Call, Error> {
    let metadata = request.metadata();
    let deadline = metadata
        .get("grpc-timeout")
        .and_then(|t| t.to_str().ok())
        .and_then(grpc_timeout)
        .map(|within| tokio::time::Instant::now() + within);
    Ok(Call { access: Access::of(request)?, forwarded: metadata.contains_key(FORWARDED), deadline })
}

/// A `grpc-timeout` header's time: up to 8 digits and a unit (hours,
/// minutes, seconds, milli-, micro-, nanoseconds).
fn grpc_timeout(text: &str) -> Option<std::time::Duration> {
    use std::time::Duration;
    let (digits, unit) = text.split_at(text.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_grpc_timeout_reads_in_its_unit() {
        use std::time::Duration;
        assert_eq!(super::grpc_timeout("1500m"), Some(Duration::from_millis(1500)));
        assert_eq!(super::grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(super::grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(super::grpc_timeout("99999999n"), Some(Duration::from_nanos(99_999_999)));
        for bad in ["", "S", "123456789S", "5x", "-1S", "1.5S"] {
            assert_eq!(super::grpc_timeout(bad), None, "{bad:?}");
        }
    }
}
