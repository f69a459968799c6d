//! The calls hourglass serves, as one seam: the gRPC adapter ([`crate::api`])
//! serves whatever implements [`Scheduler`] and knows nothing of where a
//! call is served. Standalone that is [`crate::api::Local`], this node's
//! [`Service`](crate::service::Service); in cluster mode the cluster's
//! router wraps it and serves each call here or on the node that owns the
//! message's shard.
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
pub const FORWARDED: &str = "hourglass-forwarded";
/// Response metadata of a forwarded `List`: each message's position in the
/// listing's order, as page tokens, comma-separated.
pub const POSITIONS: &str = "hourglass-positions";

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
}
