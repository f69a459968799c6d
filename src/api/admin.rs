//! The gRPC adapter of the `hourglass.v1.Admin` service: each call is
//! admitted among the Scheduler's, counted, and handed to the
//! [`PolicyService`] (`crate::admin`); this file converts to and from the wire types. No
//! decisions are made here.

use std::sync::Arc;

use tokio::sync::Semaphore;
use tonic::{Request, Response, Status};

use super::{
    admitted, call_of,
    convert::{max_lateness, timestamp, wire_duration},
};
use crate::{
    Error,
    admin::{Change, PolicyService, Whose},
    message::UnixMillis,
    policy::{PolicyKey, Rate, TopicPolicy},
    proto,
    scheduler::Scheduler,
    service::Service,
};

pub struct AdminApi {
    policies: Arc<PolicyService>,
    /// What describes the cluster (in cluster mode, asking every node).
    scheduler: Arc<dyn Scheduler>,
    /// What backs the stores up: a standalone node's; none in a cluster.
    backups: Option<Backups>,
    admission: Arc<Semaphore>,
    max_concurrent: usize,
}

impl AdminApi {
    pub(super) fn new(
        policies: Arc<PolicyService>,
        scheduler: Arc<dyn Scheduler>,
        backups: Option<Backups>,
        admission: Arc<Semaphore>,
        max_concurrent: usize,
    ) -> AdminApi {
        AdminApi { policies, scheduler, backups, admission, max_concurrent }
    }

    pub fn into_server(self) -> proto::admin_server::AdminServer<Self> {
        proto::admin_server::AdminServer::new(self)
    }

    async fn call<T>(
        &self,
        method: &'static str,
        call: impl Future<Output = Result<T, Error>>,
    ) -> Result<Response<T>, Status> {
        admitted(&self.admission, self.max_concurrent, method, call).await
    }

    /// A change of one policy: what `what` reads of the request (its
    /// topic, whether for every tenant, the change), made for the caller.
    async fn change<R>(
        &self,
        method: &'static str,
        request: Request<R>,
        what: impl FnOnce(R) -> Result<(String, Whose, Change), Error>,
    ) -> Result<Response<proto::TopicPolicy>, Status> {
        self.call(method, async {
            let call = call_of(&request)?;
            let (topic, whose, change) = what(request.into_inner())?;
            let (key, policy) = self.policies.change(&call.access, &topic, &whose, change).await?;
            Ok(to_proto(&key, &policy))
        })
        .await
    }
}

/// A standalone node's service, and its data dir, which no backup may be
/// written into.
pub struct Backups {
    pub service: Arc<Service>,
    pub data_dir: std::path::PathBuf,
}

#[tonic::async_trait]
impl proto::admin_server::Admin for AdminApi {
    async fn pause_topic(
        &self,
        request: Request<proto::TopicPolicyRequest>,
    ) -> Result<Response<proto::TopicPolicy>, Status> {
        self.change("PauseTopic", request, |r| {
            Ok((r.topic, Whose::of(r.all_tenants, r.tenant), Change::Pause))
        })
        .await
    }

    async fn resume_topic(
        &self,
        request: Request<proto::TopicPolicyRequest>,
    ) -> Result<Response<proto::TopicPolicy>, Status> {
        self.change("ResumeTopic", request, |r| {
            Ok((r.topic, Whose::of(r.all_tenants, r.tenant), Change::Resume))
        })
        .await
    }

    async fn set_rate_limit(
        &self,
        request: Request<proto::SetRateLimitRequest>,
    ) -> Result<Response<proto::TopicPolicy>, Status> {
        self.change("SetRateLimit", request, |r| {
            let rate = (r.per_second > 0).then(|| Rate {
                per_second: r.per_second,
                burst: if r.burst == 0 { Rate::default_burst(r.per_second) } else { r.burst },
            });
            Ok((r.topic, Whose::of(r.all_tenants, r.tenant), Change::Limit(rate)))
        })
        .await
    }

    async fn set_max_lateness(
        &self,
        request: Request<proto::SetMaxLatenessRequest>,
    ) -> Result<Response<proto::TopicPolicy>, Status> {
        self.change("SetMaxLateness", request, |r| {
            let late = max_lateness(r.max_lateness)?;
            Ok((r.topic, Whose::of(r.all_tenants, r.tenant), Change::MaxLateness(late)))
        })
        .await
    }

    async fn set_dead_letter_topic(
        &self,
        request: Request<proto::SetDeadLetterTopicRequest>,
    ) -> Result<Response<proto::TopicPolicy>, Status> {
        self.change("SetDeadLetterTopic", request, |r| {
            let to = (!r.dead_letter_topic.is_empty()).then_some(r.dead_letter_topic);
            Ok((r.topic, Whose::of(r.all_tenants, r.tenant), Change::DeadLetterTopic(to)))
        })
        .await
    }

    async fn get_topic_policy(
        &self,
        request: Request<proto::TopicPolicyRequest>,
    ) -> Result<Response<proto::TopicPolicy>, Status> {
        self.call("GetTopicPolicy", async {
            let call = call_of(&request)?;
            let request = request.into_inner();
            let whose = Whose::of(request.all_tenants, request.tenant);
            let (key, policy) = self.policies.get(&call.access, &request.topic, &whose)?;
            Ok(to_proto(&key, &policy))
        })
        .await
    }

    async fn describe_cluster(
        &self,
        request: Request<proto::DescribeClusterRequest>,
    ) -> Result<Response<proto::DescribeClusterResponse>, Status> {
        self.call("DescribeCluster", async {
            let call = call_of(&request)?;
            self.scheduler.describe(&call).await
        })
        .await
    }

    async fn backup(
        &self,
        request: Request<proto::BackupRequest>,
    ) -> Result<Response<proto::BackupResponse>, Status> {
        self.call("Backup", async {
            let call = call_of(&request)?;
            let Some(backups) = &self.backups else {
                // An operator is told why; anyone else only that it is not theirs.
                if !call.access.is_operator() {
                    return Err(Error::NotOperator { token: call.access.name().to_owned() });
                }
                return Err(Error::NotInCluster(
                    "Backup: a cluster's stores are copies of its schedule log, rebuilt from it; keep the log \
                     topic (its replication, and a copy of it with your Kafka tools) instead",
                ));
            };
            let dir = std::path::Path::new(&request.get_ref().dir);
            let backup = backups.service.back_up(&call.access, dir, &backups.data_dir).await?;
            Ok(proto::BackupResponse {
                dir: backup.dir.display().to_string(),
                shards: backup.shards,
                pending: backup.pending,
                taken_at: Some(timestamp(backup.taken_at)),
            })
        })
        .await
    }

    async fn list_topic_policies(
        &self,
        request: Request<proto::ListTopicPoliciesRequest>,
    ) -> Result<Response<proto::ListTopicPoliciesResponse>, Status> {
        self.call("ListTopicPolicies", async {
            let call = call_of(&request)?;
            let policies = self.policies.list(&call.access)?.iter().map(|(k, p)| to_proto(k, p)).collect();
            Ok(proto::ListTopicPoliciesResponse { policies })
        })
        .await
    }
}

fn to_proto(key: &PolicyKey, policy: &TopicPolicy) -> proto::TopicPolicy {
    proto::TopicPolicy {
        topic: key.topic.to_string(),
        tenant: key.tenant.as_ref().map_or_else(String::new, |t| t.as_str().to_owned()),
        paused: policy.paused(),
        paused_at: policy.paused_at().map(timestamp),
        rate_limit: policy.rate().map(|r| proto::RateLimit { per_second: r.per_second, burst: r.burst }),
        updated_at: (policy.updated_ms > 0).then(|| timestamp(UnixMillis(policy.updated_ms))),
        updated_by: policy.updated_by.clone(),
        max_lateness: policy.max_lateness().map(wire_duration),
        dead_letter_topic: policy.dead_letter_topic.clone(),
    }
}
