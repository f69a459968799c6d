//! The calls hourglass serves, as one seam: the gRPC adapter ([`crate::api`])
//! serves whatever implements [`Scheduler`] and knows nothing of where a
//! call is served. Standalone that is [`crate::api::Local`], this node's
//! [`Service`](crate::service::Service); in cluster mode the cluster's
//! router wraps it and serves each call here or on the node that owns the
//! message's shard. The series calls are a seam of their own,
//! [`SeriesCalls`], served alike.
//!
//! The calls take and answer the API's messages, so that a router passes
//! a call on to another node as it came.

use crate::{
    Error,
    auth::Access,
    message::{Limits, PageToken},
    proto,
};

/// Request metadata of a call one node passes on to another: it is served
/// there, or refused, never passed on again.
pub(crate) const FORWARDED: &str = "hourglass-forwarded";
/// Response metadata of a forwarded `List`: each message's position in the
/// listing's order, as page tokens, comma-separated.
pub(crate) const POSITIONS: &str = "hourglass-positions";

/// Who makes a call, and whether another node passed it on.
#[derive(Clone, Debug)]
pub struct Call {
    /// What the caller may use and see (for a call passed on, the grant
    /// the node that passed it on found for its caller).
    pub access: Access,
    /// Another node passed it on: it is served here, or refused.
    pub forwarded: bool,
    /// When the caller stops waiting (its `grpc-timeout`), if it said: a
    /// call passed on keeps it.
    pub deadline: Option<tokio::time::Instant>,
}

/// A page of a listing, with each message's position in the listing's
/// order (what a node that merges pages from several nodes orders by).
pub struct Listing {
    pub page: proto::ListResponse,
    pub positions: Vec<PageToken>,
}

/// The `hourglass.v1.Scheduler` calls.
#[tonic::async_trait]
pub trait Scheduler: Send + Sync + 'static {
    /// What requests are checked against.
    fn limits(&self) -> &Limits;

    async fn schedule(
        &self,
        call: &Call,
        request: proto::ScheduleRequest,
    ) -> Result<proto::ScheduleResponse, Error>;

    /// Schedules `items` (already checked against the batch limit); each
    /// is answered on its own, numbered by its place in `items`. `method`
    /// names the call they came in, for the metrics.
    async fn schedule_batch(
        &self,
        call: &Call,
        method: &'static str,
        items: Vec<proto::ScheduleRequest>,
    ) -> Vec<proto::ScheduleResult>;

    async fn cancel(
        &self,
        call: &Call,
        request: proto::CancelRequest,
    ) -> Result<proto::CancelResponse, Error>;

    async fn reschedule(
        &self,
        call: &Call,
        request: proto::RescheduleRequest,
    ) -> Result<proto::RescheduleResponse, Error>;

    async fn get(&self, call: &Call, request: proto::GetRequest) -> Result<proto::GetResponse, Error>;

    async fn list(&self, call: &Call, request: proto::ListRequest) -> Result<Listing, Error>;

    async fn stats(&self, call: &Call) -> Result<proto::StatsResponse, Error>;

    /// Pending messages per topic and interval of a window. A call passed
    /// on names its window whole (`from`, `to` and `interval`), so that
    /// every node counts into the same intervals.
    async fn forecast(
        &self,
        call: &Call,
        request: proto::ForecastRequest,
    ) -> Result<proto::ForecastResponse, Error>;

    /// The nodes and the shard copies each keeps (`Admin/DescribeCluster`):
    /// in a cluster every node's, asked of each; a call passed on gets the
    /// answering node's alone.
    async fn describe(&self, call: &Call) -> Result<proto::DescribeClusterResponse, Error>;
}

/// Series a `ListSeries` page holds unless asked.
pub(crate) const DEFAULT_SERIES_PAGE: usize = 100;
/// The most bytes of series a `ListSeries` page holds (one series always,
/// however large): well inside the 4 MiB a gRPC client reads by default.
pub(crate) const SERIES_PAGE_BYTES: usize = 3 << 20;

/// Cuts `series` (in id order) to what [`SERIES_PAGE_BYTES`] holds; if it
/// cut, the id of the last series kept: where the next page starts after.
pub(crate) fn fit_series_page(series: &mut Vec<proto::SeriesInfo>) -> Option<String> {
    use prost::Message as _;
    let mut bytes = 0;
    let keep = series
        .iter()
        .position(|s| {
            bytes += s.encoded_len() + 8;
            bytes > SERIES_PAGE_BYTES
        })?
        .max(1);
    if keep >= series.len() {
        return None;
    }
    series.truncate(keep);
    series.last().map(|s| s.id.clone())
}

/// The series calls, as the gRPC adapter serves them: [`Series`](crate::series::Series) serves
/// them on this node's shards; in cluster mode a router in front of it
/// sends each to the node that owns its series' shard, and asks every
/// node for its part of a listing.
#[tonic::async_trait]
pub trait SeriesCalls: Send + Sync {
    async fn create_series(
        &self,
        call: &Call,
        request: proto::CreateSeriesRequest,
    ) -> Result<proto::CreateSeriesResponse, Error>;

    /// A series, with its next occurrences.
    async fn get_series(
        &self,
        call: &Call,
        request: proto::GetSeriesRequest,
    ) -> Result<proto::SeriesInfo, Error>;

    /// A page of series in id order. Its token is the last id read: every
    /// series up to it was looked at (empty when there are no more).
    async fn list_series(
        &self,
        call: &Call,
        request: proto::ListSeriesRequest,
    ) -> Result<proto::ListSeriesResponse, Error>;

    async fn update_series(
        &self,
        call: &Call,
        request: proto::UpdateSeriesRequest,
    ) -> Result<proto::UpdateSeriesResponse, Error>;

    async fn pause_series(
        &self,
        call: &Call,
        request: proto::PauseSeriesRequest,
    ) -> Result<proto::PauseSeriesResponse, Error>;

    async fn resume_series(
        &self,
        call: &Call,
        request: proto::ResumeSeriesRequest,
    ) -> Result<proto::SeriesInfo, Error>;

    async fn delete_series(
        &self,
        call: &Call,
        request: proto::DeleteSeriesRequest,
    ) -> Result<proto::DeleteSeriesResponse, Error>;
}
