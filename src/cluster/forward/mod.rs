//! Cluster mode: any node answers any call. A call about a message whose
//! shard another node owns goes to that node (found in the routing topic),
//! vouched for with the cluster key and naming the caller's grant, not
//! its token ([`super::vouch`]), marked [`FORWARDED`](crate::scheduler::FORWARDED) so that it is served
//! there or refused, never sent on again. In a cluster whose nodes speak
//! TLS, a call is never passed on in plaintext; answers are read up to a
//! bound. A batch is split by owner; `List` and
//! `Stats` ask every node that owns shards and merge.
//!
//! A forwarded call the other node refuses without acting on it (it no
//! longer owns the shard, or it cannot be reached at all) is sent again to
//! the shard's next owner, a bounded number of times. Any other answer,
//! errors included, is passed on as it came.
//!
//! [`Router`] is the [`Scheduler`] the gRPC adapter serves in cluster mode:
//! what is served here goes to the scheduler it wraps, this node's own.
//! [`SeriesRouter`] does the same for the series calls, over the same
//! connections and slots.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures_util::future::{self, BoxFuture};
use tonic::{
    Request, Response, Status,
    metadata::MetadataMap,
    transport::{Channel, ClientTlsConfig},
};

mod peers;
mod series;
mod totals;

use peers::Peers;
pub use series::SeriesRouter;

use super::{Cluster, Place, Voucher};
use crate::{
    Error,
    message::{Limits, ListQuery, PageToken, merge_pages, shard_of},
    metrics, proto,
    scheduler::{Call, Listing, POSITIONS, Scheduler},
    status::{NOT_OWNER, item_error},
    store::LIST_KEY_BYTES,
};

/// How long connecting to another node may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a forwarded call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How many times a request refused unacted goes on to the next owner.
const RESENDS: usize = 3;
/// Room in an answer from another node beyond a message or a page's keys.
const ANSWER_OVERHEAD_BYTES: usize = 4 << 20;
/// Clients of other nodes kept before those the routing topic no longer
/// names are dropped.
const KEPT_CLIENTS: usize = 64;

type Client = proto::scheduler_client::SchedulerClient<Channel>;

/// A gRPC client of another node's, over the channel kept for it.
trait PeerClient: Sized {
    /// A client on `channel` that reads answers up to `max_answer` bytes
    /// (the node that serves a request checks its size).
    fn on(channel: Channel, max_answer: usize) -> Self;
}

impl PeerClient for Client {
    fn on(channel: Channel, max_answer: usize) -> Self {
        Client::new(channel).max_decoding_message_size(max_answer).max_encoding_message_size(usize::MAX)
    }
}

/// A client of another node's `Admin` service.
type AdminClient = proto::admin_client::AdminClient<Channel>;

impl PeerClient for AdminClient {
    fn on(channel: Channel, max_answer: usize) -> Self {
        AdminClient::new(channel).max_decoding_message_size(max_answer).max_encoding_message_size(usize::MAX)
    }
}

/// Sends requests on to the nodes that own their shards.
pub struct Router {
    /// This node's own scheduler: what is served here.
    local: Arc<dyn Scheduler>,
    cluster: Arc<Cluster>,
    voucher: Voucher,
    /// The clients of the other nodes.
    peers: Peers,
    /// Which node a call without a shard goes to next.
    turn: AtomicUsize,
}

impl Router {
    /// Serves calls on `local` or on the node that owns their shard in
    /// `cluster`. `tls`: how to reach the other nodes when they are
    /// advertised at https:// addresses.
    /// `per_peer`: how many calls one other node may have unanswered from
    /// this one (more fail at once).
    pub fn new(
        local: Arc<dyn Scheduler>,
        cluster: Arc<Cluster>,
        tls: Option<ClientTlsConfig>,
        per_peer: usize,
    ) -> Router {
        let limits = local.limits();
        // A message whole (Get), or a page of a listing, with room for the
        // rest of the answer.
        let max_answer = limits.max_message_bytes.max(LIST_KEY_BYTES) + ANSWER_OVERHEAD_BYTES;
        Router {
            voucher: Voucher::new(cluster.key().clone()),
            peers: Peers::new(Arc::clone(&cluster), tls, per_peer, max_answer),
            local,
            cluster,
            turn: AtomicUsize::new(0),
        }
    }

    /// `message` as `call` passes it on to another node.
    fn forwarded<T>(&self, call: &Call, message: T) -> Request<T> {
        self.voucher.request(call, message, CALL_TIMEOUT)
    }

    /// The shard of `id` of `tenant`'s space (as the caller names it: none
    /// for its own); none for a call without
    /// an id (a schedule that gets one made where it is served).
    fn shard_of(&self, call: &Call, tenant: &str, id: &str) -> Result<Option<usize>, Error> {
        if id.is_empty() {
            return Ok(None);
        }
        let id = call.access.id_of(tenant, id)?;
        Ok(Some(shard_of(&id, self.cluster.partitions()) as usize))
    }

    /// Where a call for `shard` is served (waiting a bounded time while it
    /// moves). One without a shard is served here when this node owns a
    /// shard, else by one of the nodes that do, in turn.
    async fn place(&self, shard: Option<usize>) -> Result<Place, Error> {
        if let Some(shard) = shard {
            return Ok(self.cluster.place(shard).await?);
        }
        if (0..self.cluster.partitions() as usize).any(|s| self.cluster.owns(s)) {
            return Ok(Place::Here);
        }
        let peers = self.cluster.peers();
        if peers.is_empty() {
            return Ok(self.cluster.place(0).await?);
        }
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        Ok(Place::There(peers[turn % peers.len()].clone()))
    }

    /// Where a call for `shard` goes now that the node at `refused` did
    /// not take it.
    async fn moved(&self, shard: Option<usize>, refused: &str) -> Result<Place, Error> {
        match shard {
            Some(shard) => Ok(self.cluster.moved(shard, refused).await?),
            None => self.place(None).await,
        }
    }

    /// A request about the message `id`: `None` when this node serves it,
    /// else the answer of the node that did.
    async fn one<C: PeerClient, Req: Clone, Resp>(
        &self,
        method: &'static str,
        call: &Call,
        (tenant, id): (&str, &str),
        request: &Req,
        send: impl Fn(C, Request<Req>) -> BoxFuture<'static, Result<Response<Resp>, Status>>,
    ) -> Result<Option<Resp>, Error> {
        if call.forwarded {
            return Ok(None);
        }
        let shard = self.shard_of(call, tenant, id)?;
        let mut place = self.place(shard).await?;
        for resend in 0..=RESENDS {
            let Place::There(addr) = place else {
                return Ok(None);
            };
            metrics::FORWARDED.with_label_values(&[method]).inc();
            let (client, _slot) = self.peers.client(&addr)?;
            match send(client, self.forwarded(call, request.clone())).await {
                Ok(response) => return Ok(Some(response.into_inner())),
                Err(status) if resend < RESENDS && not_taken(&status) => {
                    tracing::debug!(%addr, ?shard, status = %status.message(), "sending the request to the shard's next owner");
                    place = self.moved(shard, &addr).await?;
                }
                Err(status) => return Err(relayed(status)),
            }
        }
        unreachable!("the last resend returns")
    }

    /// This node's page of a listing, merged with those of every other
    /// node that owns shards; a forwarded `List` gets this node's page
    /// alone, with the positions of its messages.
    async fn list_all(&self, call: &Call, request: proto::ListRequest) -> Result<Listing, Error> {
        let limit = ListQuery::try_from(request.clone())?.validate()?;
        let Listing { page, positions } = self.local.list(call, request.clone()).await?;
        if call.forwarded {
            return Ok(Listing { page, positions });
        }
        let next = match page.next_page_token.as_str() {
            "" => None,
            token => Some(PageToken::decode(token).map_err(|_| Error::Undecodable("page token".into()))?),
        };
        let here: Vec<(PageToken, proto::PendingMessage)> =
            positions.into_iter().zip(page.messages).collect();
        let asked = self.cluster.peers().into_iter().map(|addr| {
            let request = self.forwarded(call, request.clone());
            async move {
                metrics::FORWARDED.with_label_values(&["List"]).inc();
                let (mut client, _slot) = self.peers.client::<Client>(&addr)?;
                let response = client.list(request).await.map_err(|s| from_peer(&addr, "List", s))?;
                let (metadata, page, _) = response.into_parts();
                positioned(&addr, &metadata, page)
            }
        });
        let mut pages = vec![(here, next)];
        pages.extend(future::try_join_all(asked).await?);
        let (messages, next) = merge_pages(pages, limit, LIST_KEY_BYTES, |m: &proto::PendingMessage| {
            m.key.as_ref().map_or(0, Vec::len)
        });
        let (positions, messages) = messages.into_iter().unzip();
        Ok(Listing {
            page: proto::ListResponse {
                messages,
                next_page_token: next.map(PageToken::encode).unwrap_or_default(),
            },
            positions,
        })
    }
}

#[tonic::async_trait]
impl Scheduler for Router {
    fn limits(&self) -> &Limits {
        self.local.limits()
    }

    async fn schedule(
        &self,
        call: &Call,
        request: proto::ScheduleRequest,
    ) -> Result<proto::ScheduleResponse, Error> {
        let id = request.id.clone().unwrap_or_default();
        let send =
            |mut c: Client, r| -> BoxFuture<'static, _> { Box::pin(async move { c.schedule(r).await }) };
        match self.one("Schedule", call, ("", &id), &request, send).await? {
            Some(answer) => Ok(answer),
            None => self.local.schedule(call, request).await,
        }
    }

    /// Schedules `items` where their shards are: those of this node's
    /// shards here, the others on their owners, one batch per node, all
    /// at once. Answers are numbered by the items' places in `items`.
    async fn schedule_batch(
        &self,
        call: &Call,
        method: &'static str,
        items: Vec<proto::ScheduleRequest>,
    ) -> Vec<proto::ScheduleResult> {
        if call.forwarded {
            return self.local.schedule_batch(call, method, items).await;
        }
        let mut answers: Vec<Option<proto::ScheduleResult>> = vec![None; items.len()];
        let mut places: HashMap<Option<usize>, Place> = HashMap::new();
        // (index, shard, item, where it goes)
        let mut todo = Vec::with_capacity(items.len());
        for (index, item) in items.into_iter().enumerate() {
            // An id that does not parse is answered here, as Schedule would.
            let shard = self.shard_of(call, "", item.id.as_deref().unwrap_or_default()).ok().flatten();
            let place = match places.get(&shard) {
                Some(place) => place.clone(),
                None => match self.place(shard).await {
                    Ok(place) => places.entry(shard).or_insert(place).clone(),
                    Err(e) => {
                        answers[index] = Some(item_answer(index, item_error(e)));
                        continue;
                    }
                },
            };
            todo.push((index, shard, item, place));
        }
        for resend in 0..=RESENDS {
            let mut here = (Vec::new(), Vec::new());
            let mut there: BTreeMap<String, Vec<(usize, Option<usize>, proto::ScheduleRequest)>> =
                BTreeMap::new();
            for (index, shard, item, place) in todo.drain(..) {
                match place {
                    Place::Here => {
                        here.0.push(index);
                        here.1.push(item);
                    }
                    Place::There(addr) => there.entry(addr).or_default().push((index, shard, item)),
                }
            }
            let local = async {
                let (indexes, items) = here;
                if items.is_empty() {
                    return Vec::new();
                }
                let answered = self.local.schedule_batch(call, method, items).await;
                indexes.into_iter().zip(answered).collect::<Vec<_>>()
            };
            let remote = there.into_iter().map(|(addr, group)| async move {
                let requests = group.iter().map(|(_, _, item)| item.clone()).collect();
                metrics::FORWARDED.with_label_values(&[method]).inc_by(group.len() as u64);
                let sent = match self.peers.client::<Client>(&addr) {
                    Ok((mut client, _slot)) => {
                        client
                            .schedule_batch(self.forwarded(call, proto::ScheduleBatchRequest { requests }))
                            .await
                    }
                    Err(e) => Err(Status::from(e)),
                };
                (addr, group, sent)
            });
            let (local, remote) = future::join(local, future::join_all(remote)).await;
            for (index, mut answer) in local {
                answer.index = index as u64;
                answers[index] = Some(answer);
            }
            for (addr, group, sent) in remote {
                match sent {
                    Ok(response) => {
                        for mut answer in response.into_inner().results {
                            let Some((index, _, _)) = group.get(answer.index as usize) else {
                                continue;
                            };
                            answer.index = *index as u64;
                            answers[*index] = Some(answer);
                        }
                    }
                    Err(status) if resend < RESENDS && not_taken(&status) => {
                        // Where each shard went, once per shard, all at once:
                        // not once per item, one after another.
                        let mut shards: Vec<Option<usize>> =
                            group.iter().map(|(_, shard, _)| *shard).collect();
                        shards.sort_unstable();
                        shards.dedup();
                        let moved =
                            future::join_all(shards.iter().map(|shard| self.moved(*shard, &addr))).await;
                        let moved: HashMap<Option<usize>, Result<Place, Error>> =
                            shards.into_iter().zip(moved).collect();
                        for (index, shard, item) in group {
                            match &moved[&shard] {
                                Ok(place) => todo.push((index, shard, item, place.clone())),
                                Err(e) => answers[index] = Some(item_answer(index, item_error(e.clone()))),
                            }
                        }
                    }
                    Err(status) => {
                        for (index, _, _) in group {
                            let error = proto::ItemError {
                                code: status.code() as i32,
                                message: status.message().to_owned(),
                                field: String::new(),
                            };
                            answers[index] = Some(item_answer(index, error));
                        }
                    }
                }
            }
            if todo.is_empty() {
                break;
            }
        }
        (0..)
            .zip(answers)
            .map(|(index, answer)| {
                answer.unwrap_or_else(|| {
                    let error = proto::ItemError {
                        code: tonic::Code::Unavailable as i32,
                        message: "the owner of the message's shard did not answer; retry with the same id"
                            .into(),
                        field: String::new(),
                    };
                    item_answer(index, error)
                })
            })
            .collect()
    }

    async fn cancel(
        &self,
        call: &Call,
        request: proto::CancelRequest,
    ) -> Result<proto::CancelResponse, Error> {
        let send = |mut c: Client, r| -> BoxFuture<'static, _> { Box::pin(async move { c.cancel(r).await }) };
        match self.one("Cancel", call, (&request.tenant, &request.id), &request, send).await? {
            Some(answer) => Ok(answer),
            None => self.local.cancel(call, request).await,
        }
    }

    async fn reschedule(
        &self,
        call: &Call,
        request: proto::RescheduleRequest,
    ) -> Result<proto::RescheduleResponse, Error> {
        let send =
            |mut c: Client, r| -> BoxFuture<'static, _> { Box::pin(async move { c.reschedule(r).await }) };
        match self.one("Reschedule", call, (&request.tenant, &request.id), &request, send).await? {
            Some(answer) => Ok(answer),
            None => self.local.reschedule(call, request).await,
        }
    }

    async fn get(&self, call: &Call, request: proto::GetRequest) -> Result<proto::GetResponse, Error> {
        let send = |mut c: Client, r| -> BoxFuture<'static, _> { Box::pin(async move { c.get(r).await }) };
        match self.one("Get", call, (&request.tenant, &request.id), &request, send).await? {
            Some(answer) => Ok(answer),
            None => self.local.get(call, request).await,
        }
    }

    async fn list(&self, call: &Call, request: proto::ListRequest) -> Result<Listing, Error> {
        self.list_all(call, request).await
    }

    async fn stats(&self, call: &Call) -> Result<proto::StatsResponse, Error> {
        self.stats_all(call).await
    }

    async fn forecast(
        &self,
        call: &Call,
        request: proto::ForecastRequest,
    ) -> Result<proto::ForecastResponse, Error> {
        self.forecast_all(call, request).await
    }

    async fn describe(&self, call: &Call) -> Result<proto::DescribeClusterResponse, Error> {
        self.describe_all(call).await
    }
}

/// A forwarded listing's page with the positions of its messages.
#[allow(clippy::type_complexity)]
fn positioned(
    addr: &str,
    metadata: &MetadataMap,
    page: proto::ListResponse,
) -> Result<(Vec<(PageToken, proto::PendingMessage)>, Option<PageToken>), Error> {
    let bad = || {
        tracing::warn!(node = %addr, "a node answered List without the positions of its messages");
        Error::Relayed {
            code: tonic::Code::Internal as i32,
            message: "a node answered List without the positions of its messages".to_owned(),
            details: Vec::new(),
        }
    };
    let text = metadata.get(POSITIONS).and_then(|v| v.to_str().ok()).ok_or_else(bad)?;
    let positions: Vec<PageToken> = text
        .split(',')
        .filter(|t| !t.is_empty())
        .map(PageToken::decode)
        .collect::<Result<_, _>>()
        .map_err(|_| bad())?;
    if positions.len() != page.messages.len() {
        return Err(bad());
    }
    let next = match page.next_page_token.as_str() {
        "" => None,
        token => Some(PageToken::decode(token).map_err(|_| bad())?),
    };
    Ok((positions.into_iter().zip(page.messages).collect(), next))
}

/// Whether another node refused a request without acting on it: it does
/// not own the shard (any more), or no connection to it could be made, so
/// nothing was sent. A connection lost once made, or an answer that only
/// speaks of one, may have followed a request the node acted on.
fn not_taken(status: &Status) -> bool {
    if status.metadata().contains_key(NOT_OWNER) {
        return true;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(e) = source {
        if e.is::<tonic::ConnectError>() {
            return true;
        }
        source = e.source();
    }
    false
}

/// Another node's answer, passed on as it came; a call the connection
/// lost on the way (the node stopped mid-call) is UNAVAILABLE: whether it
/// was made there is not known, and a retry with the same id says.
fn relayed(status: Status) -> Error {
    if lost_on_the_way(&status) {
        return Error::Relayed {
            code: tonic::Code::Unavailable as i32,
            message: format!(
                "the node that owns the message's shard stopped answering during the call ({}); retry with the \
                 same id: the answer says what came of it",
                status.message()
            ),
            details: Vec::new(),
        };
    }
    Error::Relayed {
        code: status.code() as i32,
        message: status.message().to_owned(),
        details: status.details().to_vec(),
    }
}

/// Whether `status` is this node's client's own, for a call the transport
/// lost (a reset connection, an HTTP/2 error: INTERNAL or UNKNOWN), rather
/// than the other node's answer: only a failure here carries its cause. A
/// deadline that ran out stays what it is.
fn lost_on_the_way(status: &Status) -> bool {
    matches!(status.code(), tonic::Code::Internal | tonic::Code::Unknown)
        && std::error::Error::source(status).is_some()
}

/// Another node's refusal of a part of a call that spans nodes. Its
/// address goes to the log, not to the caller.
fn from_peer(addr: &str, method: &str, status: Status) -> Error {
    tracing::warn!(node = %addr, method, error = %status.message(), "a node that owns shards did not answer its part of a call");
    let code = if lost_on_the_way(&status) { tonic::Code::Unavailable } else { status.code() };
    Error::Relayed {
        code: code as i32,
        message: format!("a node that owns shards did not answer {method}: {}", status.message()),
        details: Vec::new(),
    }
}

fn item_answer(index: usize, error: proto::ItemError) -> proto::ScheduleResult {
    proto::ScheduleResult { index: index as u64, result: Some(proto::schedule_result::Result::Error(error)) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn client_of(addr: std::net::SocketAddr) -> Client {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_timeout(CONNECT_TIMEOUT);
        Client::new(endpoint.connect_lazy())
    }

    fn get() -> proto::GetRequest {
        proto::GetRequest { id: "m".into(), ..Default::default() }
    }

    #[tokio::test]
    async fn a_node_that_cannot_be_reached_took_nothing() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let status = client_of(port).get(get()).await.unwrap_err();
        assert!(not_taken(&status), "{status:?}");
    }

    #[test]
    fn a_caller_learns_no_node_address() {
        let addr = "http://10.0.0.7:50051";
        let Error::Relayed { message, .. } = from_peer(addr, "Stats", Status::unavailable("busy")) else {
            panic!("relayed")
        };
        assert_eq!(message, "a node that owns shards did not answer Stats: busy");
        let Err(Error::Relayed { message, .. }) = positioned(addr, &MetadataMap::new(), Default::default())
        else {
            panic!("refused")
        };
        assert!(!message.contains("10.0.0.7"), "{message}");
    }

    #[test]
    fn an_answer_that_speaks_of_a_connection_is_no_refusal() {
        // As another node relays a failure of its own: the words, not the
        // failure.
        let relayed =
            Status::unavailable("cannot reach the node at http://10.0.0.7:50051: tcp connect error");
        assert!(!not_taken(&relayed));
        assert!(!not_taken(&Status::unavailable("connection reset by peer")));
        let mut refused = Status::unavailable("not the owner");
        refused.metadata_mut().insert(NOT_OWNER, "1".parse().unwrap());
        assert!(not_taken(&refused));
    }

    #[tokio::test]
    async fn a_connection_lost_once_the_request_went_may_have_been_taken() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            // Reads what the client sends (its preface, its request) and
            // closes the connection without an answer.
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut buf = vec![0; 4096];
            let _ = tokio::time::timeout(Duration::from_millis(300), socket.read(&mut buf)).await;
            let _ = tokio::time::timeout(Duration::from_millis(300), socket.read(&mut buf)).await;
        });
        let status = client_of(addr).get(get()).await.unwrap_err();
        assert!(!not_taken(&status), "{status:?}");
        // The caller is told to retry, not that the server failed.
        let Error::Relayed { code, message, .. } = relayed(status) else { panic!("relayed") };
        assert_eq!(code, tonic::Code::Unavailable as i32, "{message}");
        assert!(message.contains("retry with the same id"), "{message}");
        let Error::Relayed { code, .. } = relayed(Status::internal("the other node's own answer")) else {
            panic!("relayed")
        };
        assert_eq!(code, tonic::Code::Internal as i32, "an answer of the other node passes as it came");
    }
}
