//! The gRPC adapter of the `hourglass.v1.Series` service: each call is
//! admitted among the Scheduler's (one bound for the server), counted, and
//! handed to the [`SeriesCalls`] it serves (this node's series, or in
//! cluster mode the router in front of them). No decisions are made here.

use std::sync::Arc;

use tokio::sync::Semaphore;
use tonic::{Request, Response, Status};

use super::{admitted, call_of};
use crate::{Error, proto, scheduler::SeriesCalls};

pub struct SeriesApi {
    series: Arc<dyn SeriesCalls>,
    admission: Arc<Semaphore>,
    max_concurrent: usize,
}

impl SeriesApi {
    pub(super) fn new(
        series: Arc<dyn SeriesCalls>,
        admission: Arc<Semaphore>,
        max_concurrent: usize,
    ) -> SeriesApi {
        SeriesApi { series, admission, max_concurrent }
    }

    pub fn into_server(self) -> proto::series_server::SeriesServer<Self> {
        proto::series_server::SeriesServer::new(self)
    }

    async fn call<T>(
        &self,
        method: &'static str,
        call: impl Future<Output = Result<T, Error>>,
    ) -> Result<Response<T>, Status> {
        admitted(&self.admission, self.max_concurrent, method, call).await
    }
}

#[tonic::async_trait]
impl proto::series_server::Series for SeriesApi {
    async fn create_series(
        &self,
        request: Request<proto::CreateSeriesRequest>,
    ) -> Result<Response<proto::CreateSeriesResponse>, Status> {
        self.call("CreateSeries", async {
            let call = call_of(&request)?;
            self.series.create_series(&call, request.into_inner()).await
        })
        .await
    }

    async fn get_series(
        &self,
        request: Request<proto::GetSeriesRequest>,
    ) -> Result<Response<proto::SeriesInfo>, Status> {
        self.call("GetSeries", async {
            let call = call_of(&request)?;
            self.series.get_series(&call, request.into_inner()).await
        })
        .await
    }

    async fn list_series(
        &self,
        request: Request<proto::ListSeriesRequest>,
    ) -> Result<Response<proto::ListSeriesResponse>, Status> {
        self.call("ListSeries", async {
            let call = call_of(&request)?;
            self.series.list_series(&call, request.into_inner()).await
        })
        .await
    }

    async fn update_series(
        &self,
        request: Request<proto::UpdateSeriesRequest>,
    ) -> Result<Response<proto::UpdateSeriesResponse>, Status> {
        self.call("UpdateSeries", async {
            let call = call_of(&request)?;
            self.series.update_series(&call, request.into_inner()).await
        })
        .await
    }

    async fn pause_series(
        &self,
        request: Request<proto::PauseSeriesRequest>,
    ) -> Result<Response<proto::PauseSeriesResponse>, Status> {
        self.call("PauseSeries", async {
            let call = call_of(&request)?;
            self.series.pause_series(&call, request.into_inner()).await
        })
        .await
    }

    async fn resume_series(
        &self,
        request: Request<proto::ResumeSeriesRequest>,
    ) -> Result<Response<proto::SeriesInfo>, Status> {
        self.call("ResumeSeries", async {
            let call = call_of(&request)?;
            self.series.resume_series(&call, request.into_inner()).await
        })
        .await
    }

    async fn delete_series(
        &self,
        request: Request<proto::DeleteSeriesRequest>,
    ) -> Result<Response<proto::DeleteSeriesResponse>, Status> {
        self.call("DeleteSeries", async {
            let call = call_of(&request)?;
            self.series.delete_series(&call, request.into_inner()).await
        })
        .await
    }
}
