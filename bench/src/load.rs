//! Load generators: the ways a client can hand hourglass messages (unary
//! calls from many clients, batches, streams), each timing every durable
//! acknowledgement.

use std::{
    collections::VecDeque,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use tokio::task::JoinSet;
use tokio_stream::StreamExt as _;

use hourglass::proto::{self, schedule_result::Result as Item, scheduler_client::SchedulerClient};
use hourglass_testkit::ServerProcess;
use tonic::transport::Channel;

use crate::workload::Workload;

/// The due time, in Unix milliseconds, of message `i`.
pub type DueOf = Arc<dyn Fn(usize) -> u64 + Send + Sync>;

/// What one load run did.
#[derive(Debug, Default)]
pub struct Run {
    pub messages: usize,
    pub elapsed: Duration,
    /// Per call (unary, batch) or per message (stream), sorted.
    pub latencies: Vec<Duration>,
    /// With `keep`: every message's id and due time.
    pub scheduled: Vec<(String, u64)>,
}

impl Run {
    pub fn rate(&self) -> f64 {
        self.messages as f64 / self.elapsed.as_secs_f64()
    }

    pub fn percentile(&self, p: f64) -> Duration {
        percentile(&self.latencies, p)
    }

    fn finish(mut self, started: Instant) -> Run {
        self.elapsed = started.elapsed();
        self.latencies.sort_unstable();
        self
    }
}

pub fn percentile<T: Copy + Default>(sorted: &[T], p: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn scheduled(result: proto::ScheduleResult) -> anyhow::Result<proto::ScheduleResponse> {
    match result.result {
        Some(Item::Scheduled(s)) => Ok(s),
        Some(Item::Error(e)) => bail!("item {} refused: {} ({})", result.index, e.message, e.code),
        None => bail!("item {} has an empty answer", result.index),
    }
}

/// How long a caller goes on retrying a request the server could not
/// settle (a shard that moved while it was made, a node stopping).
const RETRY_FOR: Duration = Duration::from_secs(30);

/// One `Schedule`, retried as a client does when the server answers
/// UNAVAILABLE: with the same id, which makes the retry safe (the server
/// answers what came of the first). A request without an id is not
/// retried: a second try could park it twice.
async fn schedule(
    client: &mut SchedulerClient<Channel>,
    w: &Workload,
    request: proto::ScheduleRequest,
) -> anyhow::Result<proto::ScheduleResponse> {
    let give_up = Instant::now() + RETRY_FOR;
    loop {
        match client.schedule(w.call(request.clone())).await {
            Ok(reply) => return Ok(reply.into_inner()),
            Err(s) if retryable(s.code() as i32, request.id.is_some()) && Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(s) => return Err(s).context("Schedule"),
        }
    }
}

/// Whether a refusal with `code` is retried: only a request with an id.
fn retryable(code: i32, with_id: bool) -> bool {
    code == tonic::Code::Unavailable as i32 && with_id
}

/// A request-response way to schedule.
#[derive(Clone, Copy, Debug)]
pub enum Call {
    /// One `Schedule` per message.
    Unary,
    /// One `ScheduleBatch` of this many messages.
    Batch(usize),
}

/// `callers` callers, each making one call at a time, spread over
/// `connections` HTTP/2 connections (and over the `servers`, the nodes of
/// a cluster); latency is per call.
pub async fn calls(
    servers: &[ServerProcess],
    w: &Workload,
    messages: usize,
    call: Call,
    callers: usize,
    connections: usize,
    due: DueOf,
) -> anyhow::Result<Run> {
    let mut channels = Vec::new();
    for c in 0..connections.clamp(1, callers) {
        channels.push(servers[c % servers.len()].client().await?);
    }
    let size = match call {
        Call::Unary => 1,
        Call::Batch(size) => size.max(1),
    };
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    let started = Instant::now();
    for c in 0..callers {
        let mut client = channels[c % channels.len()].clone();
        let (next, w, due) = (Arc::clone(&next), w.clone(), Arc::clone(&due));
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let first = next.fetch_add(size, Ordering::Relaxed);
                if first >= messages {
                    return Ok::<_, anyhow::Error>(latencies);
                }
                let mut requests: Vec<_> =
                    (first..(first + size).min(messages)).map(|i| w.at(i, due(i))).collect();
                let sent = Instant::now();
                match call {
                    Call::Unary => {
                        let request = requests.pop().context("a unary call needs a message")?;
                        schedule(&mut client, &w, request).await?;
                    }
                    Call::Batch(_) => {
                        let reply = client
                            .schedule_batch(w.call(proto::ScheduleBatchRequest { requests }))
                            .await
                            .context("ScheduleBatch")?;
                        for result in reply.into_inner().results {
                            scheduled(result)?;
                        }
                    }
                }
                latencies.push(sent.elapsed());
            }
        });
    }
    let mut run = Run { messages, ..Run::default() };
    while let Some(done) = tasks.join_next().await {
        run.latencies.extend(done??);
    }
    Ok(run.finish(started))
}

/// `streams` `ScheduleStream` calls (spread over the `servers`), each kept
/// full; latency is from sending a request to its answer. With `keep`,
/// returns every id.
pub async fn stream(
    servers: &[ServerProcess],
    w: &Workload,
    messages: usize,
    streams: usize,
    due: DueOf,
    keep: bool,
) -> anyhow::Result<Run> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    let started = Instant::now();
    for s in 0..streams {
        let mut client = servers[s % servers.len()].client().await?;
        let mut retries = client.clone();
        let (next, w, due) = (Arc::clone(&next), w.clone(), Arc::clone(&due));
        // (index, due, sent at) of each request awaiting its answer, in order.
        let sent: Arc<Mutex<VecDeque<(usize, u64, Instant)>>> = Arc::default();
        let outgoing = {
            let (sent, w) = (Arc::clone(&sent), w.clone());
            let (tx, rx) = tokio::sync::mpsc::channel(1024);
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= messages {
                        return;
                    }
                    let due_ms = due(i);
                    let request = w.at(i, due_ms);
                    sent.lock().unwrap_or_else(|e| e.into_inner()).push_back((i, due_ms, Instant::now()));
                    if tx.send(request).await.is_err() {
                        return;
                    }
                }
            });
            tokio_stream::wrappers::ReceiverStream::new(rx)
        };
        tasks.spawn(async move {
            let mut answers =
                client.schedule_stream(w.call(outgoing)).await.context("ScheduleStream")?.into_inner();
            let (mut latencies, mut ids) = (Vec::new(), Vec::new());
            while let Some(answer) = answers.next().await {
                let answer = answer.context("ScheduleStream")?;
                let (i, due_ms, at) = sent
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .pop_front()
                    .context("an answer with no request")?;
                let reply = match &answer.result {
                    // Retried beside the stream, as a client does.
                    Some(Item::Error(e)) if retryable(e.code, w.ids.is_some()) => {
                        schedule(&mut retries, &w, w.at(i, due_ms)).await?
                    }
                    _ => scheduled(answer)?,
                };
                latencies.push(at.elapsed());
                if keep {
                    ids.push((reply.id, due_ms));
                }
            }
            Ok::<_, anyhow::Error>((latencies, ids))
        });
    }
    let mut run = Run { messages, ..Run::default() };
    while let Some(done) = tasks.join_next().await {
        let (latencies, ids) = done??;
        run.latencies.extend(latencies);
        run.scheduled.extend(ids);
    }
    if run.latencies.len() != messages {
        bail!("{} of {messages} stream requests were answered", run.latencies.len());
    }
    Ok(run.finish(started))
}

/// Lateness of each delivered message (delivered_at minus due, in whole
/// milliseconds, negative if early), read back with `Get`, sorted.
pub async fn lateness(
    servers: &[ServerProcess],
    messages: &[(String, u64)],
    clients: usize,
) -> anyhow::Result<Vec<i64>> {
    let at = delivered_at(servers, messages, clients).await?;
    let mut late: Vec<i64> = at.into_iter().zip(messages).map(|(at, (_, due))| at - *due as i64).collect();
    late.sort_unstable();
    Ok(late)
}

/// [`lateness`] of the messages delivered, sorted, and how many of
/// `messages` were not (unknown, or in another state).
pub async fn lateness_of_delivered(
    servers: &[ServerProcess],
    messages: &[(String, u64)],
    clients: usize,
) -> anyhow::Result<(Vec<i64>, usize)> {
    let at = read_delivered(servers, messages, clients, true).await?;
    let missing = at.iter().filter(|at| at.is_none()).count();
    let mut late: Vec<i64> =
        at.into_iter().zip(messages).filter_map(|(at, (_, due))| Some(at? - *due as i64)).collect();
    late.sort_unstable();
    Ok((late, missing))
}

/// When each message was delivered (Unix milliseconds, when the broker
/// answered its produce), read back with `Get` through the `servers` in turn, in
/// the order of `messages`.
pub async fn delivered_at(
    servers: &[ServerProcess],
    messages: &[(String, u64)],
    clients: usize,
) -> anyhow::Result<Vec<i64>> {
    let at = read_delivered(servers, messages, clients, false).await?;
    Ok(at.into_iter().map(|at| at.expect("every one delivered")).collect())
}

/// [`delivered_at`]; `missing_ok`: a message not found, or not delivered,
/// is `None` rather than an error.
async fn read_delivered(
    servers: &[ServerProcess],
    messages: &[(String, u64)],
    clients: usize,
    missing_ok: bool,
) -> anyhow::Result<Vec<Option<i64>>> {
    let next = Arc::new(AtomicUsize::new(0));
    let messages: Arc<Vec<(String, u64)>> = Arc::new(messages.to_vec());
    let mut tasks = JoinSet::new();
    for c in 0..clients {
        let mut client = servers[c % servers.len()].client().await?;
        let (next, messages) = (Arc::clone(&next), Arc::clone(&messages));
        tasks.spawn(async move {
            let mut out = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((id, _)) = messages.get(i) else { return Ok::<_, anyhow::Error>(out) };
                let got = match client.get(proto::GetRequest { id: id.clone(), ..Default::default() }).await {
                    Ok(got) => got.into_inner(),
                    Err(s) if missing_ok && s.code() == tonic::Code::NotFound => {
                        out.push((i, None));
                        continue;
                    }
                    Err(s) => return Err(s).context("Get"),
                };
                let Some(proto::get_response::Settlement::Delivered(d)) = got.settlement else {
                    if missing_ok {
                        out.push((i, None));
                        continue;
                    }
                    bail!("message {id} is {:?}, not delivered", got.state());
                };
                let at = d.delivered_at.context("delivered without a time")?;
                out.push((i, Some(at.seconds * 1000 + i64::from(at.nanos) / 1_000_000)));
            }
        });
    }
    let mut all = Vec::with_capacity(messages.len());
    while let Some(done) = tasks.join_next().await {
        all.extend(done??);
    }
    all.sort_unstable();
    Ok(all.into_iter().map(|(_, at)| at).collect())
}

/// Cancels what `selector` picks, call after call as a client does, until
/// the server says every match was looked at: how many were cancelled, in
/// how many calls, and how long it took.
pub async fn cancel_matching(
    server: &ServerProcess,
    selector: &str,
) -> anyhow::Result<(u64, usize, std::time::Duration)> {
    let mut client = server.client().await?;
    let mut request = proto::CancelMatchingRequest { selector: selector.to_owned(), ..Default::default() };
    let (mut cancelled, mut calls) = (0, 0);
    let started = Instant::now();
    loop {
        let done = client.cancel_matching(request.clone()).await.context("CancelMatching")?.into_inner();
        calls += 1;
        cancelled += done.cancelled;
        if let Some(miss) = done.not_cancelled.first() {
            bail!("{} of the parked messages were not cancelled, e.g. {miss:?}", done.not_cancelled.len());
        }
        if done.next_page_token.is_empty() {
            return Ok((cancelled, calls, started.elapsed()));
        }
        request.page_token = done.next_page_token;
    }
}
