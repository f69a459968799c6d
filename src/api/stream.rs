//! `ScheduleStream`: many schedule requests on one stream, each answered in
//! order once it is durable.
//!
//! A pump task reads the inbound stream. Whatever has already arrived (up to
//! `CHUNK` requests) goes to the store as one batch, so a busy stream costs
//! one commit per chunk rather than one per message, and an idle one is
//! answered at once. Chunks are answered in the order they were read.
//!
//! Backpressure: the pump stops reading once `window` requests, or
//! [`WINDOW_BYTES`] of them, are unanswered, and it stops answering while
//! the client does not read its answers; HTTP/2 flow control then holds the
//! client back. Memory per stream is bounded by the window, and taken from
//! the server's budget of request bytes for as long as the stream is open.
//!
//! A stream is not a way around the tokens file: before each chunk it asks
//! whether the caller's token still holds (a reload may have revoked or
//! narrowed it) and ends with UNAUTHENTICATED if not. A stream with nothing
//! unanswered that sends nothing for `idle` is ended with UNAVAILABLE, so
//! idle clients do not hold the server's call slots.

use std::{pin::Pin, sync::Arc, time::Instant};

use futures_util::{FutureExt as _, StreamExt as _, stream::FuturesOrdered};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use crate::{
    Error, metrics, otel, proto,
    scheduler::{Call, Scheduler},
};

/// The answers to a stream, in request order.
pub(super) type Answers = ReceiverStream<Result<proto::ScheduleResult, Status>>;

/// Requests sent to the store together, at most.
const CHUNK: usize = 1024;

/// Encoded bytes of unanswered requests one stream may have, at most
/// (beyond the one request that crosses it).
pub(super) const WINDOW_BYTES: usize = 1 << 20;

/// How a stream is served.
#[derive(Clone, Copy, Debug)]
pub struct StreamLimits {
    /// Unanswered requests, at most.
    pub window: usize,
    /// How long a stream may send nothing while nothing is unanswered.
    pub idle: std::time::Duration,
}

const METHOD: &str = "ScheduleStream";

/// `permits` are the stream's places among the calls served at once; they
/// are held until the stream ends. Items for topics outside the call's
/// access are answered PERMISSION_DENIED.
pub(super) fn serve<P: Send + 'static>(
    scheduler: Arc<dyn Scheduler>,
    call: Call,
    request: tonic::Request<Streaming<proto::ScheduleRequest>>,
    limits: StreamLimits,
    permits: P,
) -> Answers {
    let (tx, rx) = mpsc::channel(CHUNK);
    // The stream's trace context, kept on each of its records.
    let (metadata, _, inbound) = request.into_parts();
    let metadata = Arc::new(metadata);
    // In the call's log span (its trace), as the call's other work is.
    let work = async move {
        pump(scheduler, call, metadata, inbound, limits, tx).await;
        drop(permits);
    };
    tokio::spawn(tracing::Instrument::in_current_span(work));
    ReceiverStream::new(rx)
}

/// The most a stream holds of requests read and not answered: its byte
/// window, and one request that crosses it. It is taken from the server's
/// budget when the stream opens.
pub(super) fn memory(limits: &crate::message::Limits) -> usize {
    WINDOW_BYTES + limits.max_request_bytes()
}

/// A chunk's answers, and the encoded bytes of its requests.
type Chunk = Pin<Box<dyn Future<Output = (Vec<proto::ScheduleResult>, usize)> + Send>>;

async fn pump(
    scheduler: Arc<dyn Scheduler>,
    call: Call,
    metadata: Arc<tonic::metadata::MetadataMap>,
    mut inbound: Streaming<proto::ScheduleRequest>,
    limits: StreamLimits,
    tx: mpsc::Sender<Result<proto::ScheduleResult, Status>>,
) {
    let started = Instant::now();
    let window = limits.window.max(1);
    let chunk_limit = CHUNK.min(scheduler.limits().max_batch).max(1);
    let mut answers: FuturesOrdered<Chunk> = FuturesOrdered::new();
    let (mut unanswered, mut unanswered_bytes) = (0usize, 0usize);
    let mut next_index = 0u64;
    let mut open = true;
    let mut last_heard = tokio::time::Instant::now();
    // A broken inbound stream ends it, after the answers to what came before.
    let mut broken: Option<Status> = None;
    loop {
        let idle_until = last_heard + limits.idle;
        tokio::select! {
            biased;
            Some((results, bytes)) = answers.next(), if !answers.is_empty() => {
                unanswered -= results.len();
                unanswered_bytes -= bytes;
                for result in results {
                    if tx.send(Ok(result)).await.is_err() {
                        // The client went away; what was stored stays stored.
                        return finish(started, tonic::Code::Cancelled);
                    }
                }
                last_heard = tokio::time::Instant::now();
            }
            _ = tokio::time::sleep_until(idle_until), if open && unanswered == 0 => {
                broken = Some(Status::from(Error::StreamIdle(limits.idle)));
                open = false;
            }
            first = inbound.next(), if open && unanswered < window && unanswered_bytes < WINDOW_BYTES => {
                last_heard = tokio::time::Instant::now();
                // The token may have been revoked or narrowed since the
                // stream opened: nothing more is scheduled with a dead one.
                let access = match call.access.current() {
                    Ok(access) => Call { access, ..call.clone() },
                    Err(e) => {
                        broken = Some(Status::from(e));
                        open = false;
                        continue;
                    }
                };
                let mut chunk = Vec::new();
                let mut chunk_bytes = 0;
                let room = chunk_limit.min(window - unanswered);
                let mut item = first;
                loop {
                    match item {
                        Some(Ok(request)) => {
                            chunk_bytes += prost::Message::encoded_len(&request);
                            chunk.push(request);
                        }
                        Some(Err(status)) => {
                            broken = Some(super::limit::too_large(status, super::limit::Limit::one_message(scheduler.limits())));
                            open = false;
                            break;
                        }
                        None => {
                            open = false;
                            break;
                        }
                    }
                    if chunk.len() >= room || unanswered_bytes + chunk_bytes >= WINDOW_BYTES {
                        break;
                    }
                    // Take what has already arrived, without waiting for more.
                    match inbound.next().now_or_never() {
                        Some(next) => item = next,
                        None => break,
                    }
                }
                if !chunk.is_empty() {
                    unanswered += chunk.len();
                    unanswered_bytes += chunk_bytes;
                    let first_index = next_index;
                    next_index += chunk.len() as u64;
                    let answered =
                        schedule_chunk(Arc::clone(&scheduler), access, Arc::clone(&metadata), chunk, first_index);
                    answers.push_back(Box::pin(answered.map(move |results| (results, chunk_bytes))));
                }
            }
            else => break,
        }
    }
    let code = match broken {
        Some(status) => {
            let code = status.code();
            let _ = tx.send(Err(status)).await;
            code
        }
        None => tonic::Code::Ok,
    };
    finish(started, code);
}

async fn schedule_chunk(
    scheduler: Arc<dyn Scheduler>,
    call: Call,
    metadata: Arc<tonic::metadata::MetadataMap>,
    mut chunk: Vec<proto::ScheduleRequest>,
    first_index: u64,
) -> Vec<proto::ScheduleResult> {
    let span = otel::carry(&metadata, METHOD, chunk.iter_mut().filter_map(|r| r.message.as_mut()));
    let mut answers = scheduler.schedule_batch(&call, METHOD, chunk).await;
    if let Some(span) = span {
        span.end(&Ok::<_, Error>(()));
    }
    for answer in &mut answers {
        answer.index += first_index;
    }
    answers
}

fn finish(started: Instant, code: tonic::Code) {
    metrics::GRPC_REQUESTS.with_label_values(&[METHOD, &format!("{code:?}")]).inc();
    metrics::GRPC_SECONDS.with_label_values(&[METHOD]).observe(started.elapsed().as_secs_f64());
}
