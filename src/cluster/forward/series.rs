//! The series calls in cluster mode: a call about one series goes to the
//! node that owns its shard, as a call about one message does (its driver
//! and its lock are there); `ListSeries` asks every node that owns shards
//! and merges their pages in id order.

use std::sync::Arc;

use futures_util::future::{self, BoxFuture};
use tonic::transport::Channel;

use super::{PeerClient, Router, from_peer};
use crate::{
    Error, metrics, proto,
    scheduler::{Call, DEFAULT_SERIES_PAGE, SeriesCalls, fit_series_page},
    series::spec::page_position,
};

type SeriesClient = proto::series_client::SeriesClient<Channel>;

impl PeerClient for SeriesClient {
    fn on(channel: Channel, max_answer: usize) -> Self {
        SeriesClient::new(channel).max_decoding_message_size(max_answer).max_encoding_message_size(usize::MAX)
    }
}

/// Serves the series calls on this node's series
/// or on the node that owns their shard.
pub struct SeriesRouter {
    local: Arc<dyn SeriesCalls>,
    router: Arc<Router>,
}

impl SeriesRouter {
    pub fn new(local: Arc<dyn SeriesCalls>, router: Arc<Router>) -> SeriesRouter {
        SeriesRouter { local, router }
    }
}

/// Sends a call about one series where its shard is: the answer of the
/// node that served it, or this node's.
macro_rules! one_series {
    ($self:ident, $call:ident, $request:ident, $method:literal, $verb:ident) => {{ one_series!($self, $call, $request, $method, $verb, "") }};
    ($self:ident, $call:ident, $request:ident, $method:literal, $verb:ident, $tenant:expr) => {{
        let send =
            |mut c: SeriesClient, r| -> BoxFuture<'static, _> { Box::pin(async move { c.$verb(r).await }) };
        let tenant: &str = $tenant;
        match $self.router.one($method, $call, (tenant, &$request.id), &$request, send).await? {
            Some(answer) => Ok(answer),
            None => $self.local.$verb($call, $request).await,
        }
    }};
}

#[tonic::async_trait]
impl SeriesCalls for SeriesRouter {
    async fn create_series(
        &self,
        call: &Call,
        request: proto::CreateSeriesRequest,
    ) -> Result<proto::CreateSeriesResponse, Error> {
        one_series!(self, call, request, "CreateSeries", create_series)
    }

    async fn get_series(
        &self,
        call: &Call,
        request: proto::GetSeriesRequest,
    ) -> Result<proto::SeriesInfo, Error> {
        one_series!(self, call, request, "GetSeries", get_series, &request.tenant.clone())
    }

    /// This node's page merged with every other node's; a forwarded call
    /// gets this node's alone.
    async fn list_series(
        &self,
        call: &Call,
        request: proto::ListSeriesRequest,
    ) -> Result<proto::ListSeriesResponse, Error> {
        // Checked here first: a bad request is refused once, not by each.
        let here = self.local.list_series(call, request.clone()).await?;
        if call.forwarded {
            return Ok(here);
        }
        let limit = match request.page_size {
            0 => DEFAULT_SERIES_PAGE,
            n => n as usize,
        };
        let asked = self.router.cluster.peers().into_iter().map(|addr| {
            let request = self.router.forwarded(call, request.clone());
            async move {
                metrics::FORWARDED.with_label_values(&["ListSeries"]).inc();
                let (mut client, _slot) = self.router.peers.client::<SeriesClient>(&addr)?;
                let page =
                    client.list_series(request).await.map_err(|s| from_peer(&addr, "ListSeries", s))?;
                Ok::<_, Error>(page.into_inner())
            }
        });
        let mut pages = vec![here];
        pages.extend(future::try_join_all(asked).await?);
        Ok(merge(pages, limit, call.access.is_operator()))
    }

    async fn update_series(
        &self,
        call: &Call,
        request: proto::UpdateSeriesRequest,
    ) -> Result<proto::UpdateSeriesResponse, Error> {
        one_series!(self, call, request, "UpdateSeries", update_series)
    }

    async fn pause_series(
        &self,
        call: &Call,
        request: proto::PauseSeriesRequest,
    ) -> Result<proto::PauseSeriesResponse, Error> {
        one_series!(self, call, request, "PauseSeries", pause_series, &request.tenant.clone())
    }

    async fn resume_series(
        &self,
        call: &Call,
        request: proto::ResumeSeriesRequest,
    ) -> Result<proto::SeriesInfo, Error> {
        one_series!(self, call, request, "ResumeSeries", resume_series, &request.tenant.clone())
    }

    async fn delete_series(
        &self,
        call: &Call,
        request: proto::DeleteSeriesRequest,
    ) -> Result<proto::DeleteSeriesResponse, Error> {
        one_series!(self, call, request, "DeleteSeries", delete_series, &request.tenant.clone())
    }
}

/// One page of the nodes' pages: each node looked at every series up to
/// its token (at all of its own when it has none), so the merged page
/// holds the series up to the least of them, at most `limit`, and goes on
/// from the last it holds.
/// An operator's listing (`every`) spans tenants: its order and tokens are
/// by stored id ([`page_position`]).
fn merge(pages: Vec<proto::ListSeriesResponse>, limit: usize, every: bool) -> proto::ListSeriesResponse {
    let bound = pages.iter().map(|p| &p.next_page_token).filter(|t| !t.is_empty()).min().cloned();
    let mut series: Vec<(String, proto::SeriesInfo)> = pages
        .into_iter()
        .flat_map(|p| p.series)
        .map(|s| (page_position(&s, every), s))
        .filter(|(at, _)| bound.as_ref().is_none_or(|b| at <= b))
        .collect();
    series.sort_by(|a, b| a.0.cmp(&b.0));
    let next_page_token = if series.len() > limit {
        series.truncate(limit);
        series.last().map(|(at, _)| at.clone()).unwrap_or_default()
    } else {
        bound.unwrap_or_default()
    };
    let mut series: Vec<proto::SeriesInfo> = series.into_iter().map(|(_, s)| s).collect();
    let next_page_token = match fit_series_page(&mut series) {
        Some(_) => series.last().map(|s| page_position(s, every)).unwrap_or(next_page_token),
        None => next_page_token,
    };
    proto::ListSeriesResponse { series, next_page_token }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(ids: &[&str], next: &str) -> proto::ListSeriesResponse {
        proto::ListSeriesResponse {
            series: ids
                .iter()
                .map(|id| proto::SeriesInfo { id: (*id).to_owned(), ..Default::default() })
                .collect(),
            next_page_token: next.to_owned(),
        }
    }

    fn ids(page: &proto::ListSeriesResponse) -> Vec<&str> {
        page.series.iter().map(|s| s.id.as_str()).collect()
    }

    #[test]
    fn a_merged_page_holds_what_every_node_looked_at() {
        // One node read up to "c" and has more; the other read all it has.
        let merged = merge(vec![page(&["a", "c"], "c"), page(&["b", "d"], "")], 10, false);
        assert_eq!(ids(&merged), ["a", "b", "c"]);
        assert_eq!(merged.next_page_token, "c", "d comes on the next page");
        let merged = merge(vec![page(&["a"], ""), page(&["b"], "")], 10, false);
        assert_eq!((ids(&merged), merged.next_page_token.as_str()), (vec!["a", "b"], ""));
    }

    /// Large templates: a page stops where the next series would take it
    /// past what a client reads, and goes on from there; one series is
    /// always sent, however large.
    #[test]
    fn a_merged_page_stops_at_the_bytes_a_client_reads() {
        let big = |id: &str| proto::SeriesInfo {
            id: id.to_owned(),
            spec: Some(proto::SeriesSpec {
                template: Some(proto::Message { value: vec![b'x'; 1_200_000], ..Default::default() }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let pages = vec![
            proto::ListSeriesResponse { series: vec![big("a"), big("c")], next_page_token: String::new() },
            proto::ListSeriesResponse { series: vec![big("b"), big("d")], next_page_token: String::new() },
        ];
        let merged = merge(pages, 10, false);
        assert_eq!(ids(&merged), ["a", "b"]);
        assert_eq!(merged.next_page_token, "b", "c comes on the next page");
        let mut one = vec![proto::SeriesInfo {
            spec: Some(proto::SeriesSpec {
                template: Some(proto::Message { value: vec![b'x'; 5 << 20], ..Default::default() }),
                ..Default::default()
            }),
            ..big("huge")
        }];
        assert_eq!(fit_series_page(&mut one), None, "one series is sent whole");
        assert_eq!(one.len(), 1);
    }

    #[test]
    fn a_merged_page_is_no_longer_than_asked() {
        let merged = merge(vec![page(&["a", "c"], ""), page(&["b", "d"], "")], 3, false);
        assert_eq!(ids(&merged), ["a", "b", "c"]);
        assert_eq!(merged.next_page_token, "c");
    }

    #[test]
    fn an_operators_pages_across_tenants_merge_in_stored_order_with_tokens_it_reads_back() {
        let info = |tenant: &str, id: &str| proto::SeriesInfo {
            id: id.to_owned(),
            tenant: tenant.to_owned(),
            ..Default::default()
        };
        let token = |tenant: &str, id: &str| page_position(&info(tenant, id), true);
        // Tenants' series come before the shared space's, each space in id order.
        let first = proto::ListSeriesResponse {
            series: vec![info("acme", "z"), info("", "a")],
            next_page_token: token("", "a"),
        };
        let second = proto::ListSeriesResponse {
            series: vec![info("beta", "y"), info("", "b")],
            next_page_token: token("", "b"),
        };
        let merged = merge(vec![first, second], 10, true);
        let got: Vec<_> = merged.series.iter().map(|s| (s.tenant.as_str(), s.id.as_str())).collect();
        assert_eq!(got, [("acme", "z"), ("beta", "y"), ("", "a")], "up to the least token, in stored order");
        assert_eq!(merged.next_page_token, token("", "a"));
        let after = crate::series::spec::every_token(&merged.next_page_token).unwrap();
        assert_eq!(after.as_str(), "a");
        assert_eq!(after.tenant(), None);
    }
}
