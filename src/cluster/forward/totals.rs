//! The reads that span the cluster: each node's part asked for at once
//! and added up (`Stats`, `Forecast`, `DescribeCluster`); a forwarded call
//! gets the answering node's part alone.

use futures_util::future;

use super::{AdminClient, CALL_TIMEOUT, Client, Router, from_peer};
use crate::{
    Error,
    message::{Forecast, Invalid},
    metrics, proto,
    scheduler::Call,
};

impl Router {
    /// This node's figures, summed with those of every other node that
    /// owns shards; a forwarded `Stats` gets this node's alone.
    pub(super) async fn stats_all(&self, call: &Call) -> Result<proto::StatsResponse, Error> {
        let here = self.local.stats(call).await?;
        if call.forwarded {
            return Ok(here);
        }
        let asked = self.cluster.peers().into_iter().map(|addr| {
            let request = self.voucher.request(call, proto::StatsRequest {}, CALL_TIMEOUT);
            async move {
                metrics::FORWARDED.with_label_values(&["Stats"]).inc();
                let (mut client, _slot) = self.peers.client::<Client>(&addr)?;
                Ok::<_, Error>(
                    client.stats(request).await.map_err(|s| from_peer(&addr, "Stats", s))?.into_inner(),
                )
            }
        });
        let mut total = here;
        for other in future::try_join_all(asked).await? {
            total.pending += other.pending;
            total.delivered += other.delivered;
            total.cancelled += other.cancelled;
            total.failed += other.failed;
            total.expired += other.expired;
            total.dead_lettered += other.dead_lettered;
            total.dispatching += other.dispatching;
            total.store_bytes += other.store_bytes;
            total.max_pending = match (total.max_pending, other.max_pending) {
                (Some(a), Some(b)) => Some(a + b),
                (a, b) => a.or(b),
            };
            merge_held_back(&mut total.held_back, other.held_back);
            let at = |m: &proto::PendingMessage| m.dispatch_at.map(|t| (t.seconds, t.nanos));
            if let Some(oldest) = other.oldest_overdue
                && total.oldest_overdue.as_ref().is_none_or(|o| at(&oldest) < at(o))
            {
                total.oldest_overdue = Some(oldest);
            }
        }
        Ok(total)
    }

    /// This node's forecast, and every other node's for the window this
    /// one resolved, added up.
    pub(super) async fn forecast_all(
        &self,
        call: &Call,
        request: proto::ForecastRequest,
    ) -> Result<proto::ForecastResponse, Error> {
        let here = self.local.forecast(call, request.clone()).await?;
        if call.forwarded {
            return Ok(here);
        }
        let whole =
            proto::ForecastRequest { from: here.from, to: here.to, interval: here.interval, ..request };
        let asked = self.cluster.peers().into_iter().map(|addr| {
            let request = self.voucher.request(call, whole.clone(), CALL_TIMEOUT);
            async move {
                metrics::FORWARDED.with_label_values(&["Forecast"]).inc();
                let (mut client, _slot) = self.peers.client::<Client>(&addr)?;
                let answer = client.forecast(request).await.map_err(|s| from_peer(&addr, "Forecast", s))?;
                Forecast::try_from(answer.into_inner()).map_err(|e: Invalid| Error::Relayed {
                    code: tonic::Code::Internal as i32,
                    message: format!("node {addr} answered Forecast with {} {}", e.field, e.reason),
                    details: Vec::new(),
                })
            }
        });
        let mut total = Forecast::try_from(here)?;
        for other in future::try_join_all(asked).await? {
            total.merge(other);
        }
        Ok(total.into())
    }
}

impl Router {
    /// This node's copies of shards, and every other node's; a node that
    /// does not answer is named with why, not an error of the whole.
    pub(super) async fn describe_all(&self, call: &Call) -> Result<proto::DescribeClusterResponse, Error> {
        let mut here = self.local.describe(call).await?;
        if call.forwarded {
            return Ok(here);
        }
        let asked = self.cluster.peers().into_iter().map(|addr| {
            let request = self.voucher.request(call, proto::DescribeClusterRequest {}, CALL_TIMEOUT);
            async move {
                metrics::FORWARDED.with_label_values(&["DescribeCluster"]).inc();
                let answer = async {
                    let (mut client, _slot) = self.peers.client::<AdminClient>(&addr)?;
                    client.describe_cluster(request).await.map_err(|s| from_peer(&addr, "DescribeCluster", s))
                }
                .await;
                (addr, answer)
            }
        });
        for (addr, answer) in future::join_all(asked).await {
            match answer {
                Ok(answer) => here.nodes.extend(answer.into_inner().nodes),
                Err(e) => here.unanswered.push(format!("{addr}: {e}")),
            }
        }
        Ok(here)
    }
}

/// Adds another node's held-back topics to `all`: one entry per topic and
/// tenant, held since the earliest, with the earliest due message.
fn merge_held_back(all: &mut Vec<proto::HeldBack>, more: Vec<proto::HeldBack>) {
    let key = |t: &Option<prost_types::Timestamp>| t.map(|t| (t.seconds, t.nanos));
    for held in more {
        match all.iter_mut().find(|h| h.topic == held.topic && h.tenant == held.tenant) {
            Some(h) => {
                if held.reason == proto::HeldReason::Paused as i32 {
                    h.reason = held.reason;
                }
                if key(&held.since) < key(&h.since) {
                    h.since = held.since;
                }
                if key(&held.oldest_due) < key(&h.oldest_due) {
                    h.oldest_due = held.oldest_due;
                }
            }
            None => all.push(held),
        }
    }
    all.sort_by(|a, b| (&a.topic, &a.tenant).cmp(&(&b.topic, &b.tenant)));
}
