//! The gRPC adapter: the `hourglass.v1.Scheduler` service. Each method takes
//! the request, converts it (`convert`), calls the [`Service`], and converts
//! the answer back; errors become statuses through the one table in
//! `status`. No decisions are made here.

pub mod convert;
mod status;

use std::{future::Future, sync::Arc, time::Instant};

use tonic::{Request, Response, Status};

use crate::{Error, metrics, proto, service::Service};

pub struct SchedulerApi {
    service: Arc<Service>,
}

impl SchedulerApi {
    pub fn new(service: Arc<Service>) -> Self {
        SchedulerApi { service }
    }

    pub fn into_server(self) -> proto::scheduler_server::SchedulerServer<Self> {
        let max = self.service.limits().max_message_bytes + 64 * 1024;
        proto::scheduler_server::SchedulerServer::new(self).max_decoding_message_size(max)
    }
}

/// Runs one call, counting it by method and status code.
async fn observe<T>(
    method: &'static str,
    call: impl Future<Output = Result<T, Error>>,
) -> Result<Response<T>, Status> {
    let started = Instant::now();
    let result = call.await.map(Response::new).map_err(Status::from);
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
        observe("Schedule", async {
            let scheduled = self.service.schedule(request.into_inner().try_into()?).await?;
            Ok(proto::ScheduleResponse {
                id: scheduled.id.to_string(),
                deliver_at: Some(convert::timestamp(scheduled.due)),
                duplicate: scheduled.duplicate,
            })
        })
        .await
    }

    async fn cancel(
        &self,
        request: Request<proto::CancelRequest>,
    ) -> Result<Response<proto::CancelResponse>, Status> {
        observe("Cancel", async {
            let id = convert::message_id(&request.into_inner().id)?;
            let outcome = self.service.cancel(id).await?;
            Ok(proto::CancelResponse { outcome: proto::CancelOutcome::from(outcome).into() })
        })
        .await
    }

    async fn reschedule(
        &self,
        request: Request<proto::RescheduleRequest>,
    ) -> Result<Response<proto::RescheduleResponse>, Status> {
        observe("Reschedule", async {
            let request = request.into_inner();
            let id = convert::message_id(&request.id)?;
            let due = convert::due_spec(request.due.map(convert::WireDue::from))?;
            let due = self.service.reschedule(id, due).await?;
            Ok(proto::RescheduleResponse { deliver_at: Some(convert::timestamp(due)) })
        })
        .await
    }

    async fn get(&self, request: Request<proto::GetRequest>) -> Result<Response<proto::GetResponse>, Status> {
        observe("Get", async {
            let id = convert::message_id(&request.into_inner().id)?;
            Ok(self.service.get(id).await?.into())
        })
        .await
    }
}
