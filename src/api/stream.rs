//! `ScheduleStream`: many schedule requests on one stream, each answered in
//! order once it is durable.
//!
//! A pump task reads the inbound stream. Whatever has already arrived (up to
//! `CHUNK` requests) goes to the store as one batch, so a busy stream costs
//! one commit per chunk rather than one per message, and an idle one is
//! answered at once. Chunks are answered in the order they were read.
//!
//! Backpressure: the pump stops reading once `window` requests are
//! unanswered, and it stops answering while the client does not read its
//! answers; HTTP/2 flow control then holds the client back. Memory per
//! stream is bounded by the window.

use std::{pin::Pin, sync::Arc, time::Instant};

use futures_util::{FutureExt as _, StreamExt as _, stream::FuturesOrdered};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use super::schedule_results;
use crate::{auth::Access, message::Scheduled, metrics, proto, service::Service};

/// The answers to a stream, in request order.
pub type Answers = ReceiverStream<Result<proto::ScheduleResult, Status>>;

/// Requests sent to the store together, at most.
const CHUNK: usize = 1024;

const METHOD: &str = "ScheduleStream";

/// `permit` is the stream's place among the calls served at once; it is
/// held until the stream ends. Items for topics outside `access` are
/// answered PERMISSION_DENIED.
pub fn serve(
    service: Arc<Service>,
    access: Access,
    inbound: Streaming<proto::ScheduleRequest>,
    window: usize,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> Answers {
    let (tx, rx) = mpsc::channel(CHUNK);
    tokio::spawn(async move {
        pump(service, access, inbound, window.max(1), tx).await;
        drop(permit);
    });
    ReceiverStream::new(rx)
}

type Chunk = Pin<Box<dyn Future<Output = Vec<proto::ScheduleResult>> + Send>>;

async fn pump(
    service: Arc<Service>,
    access: Access,
    mut inbound: Streaming<proto::ScheduleRequest>,
    window: usize,
    tx: mpsc::Sender<Result<proto::ScheduleResult, Status>>,
) {
    let started = Instant::now();
    let chunk_limit = CHUNK.min(service.limits().max_batch).max(1);
    let mut answers: FuturesOrdered<Chunk> = FuturesOrdered::new();
    let mut unanswered = 0usize;
    let mut next_index = 0u64;
    let mut open = true;
    // A broken inbound stream ends it, after the answers to what came before.
    let mut broken: Option<Status> = None;
    loop {
        tokio::select! {
            biased;
            Some(results) = answers.next(), if !answers.is_empty() => {
                unanswered -= results.len();
                for result in results {
                    if tx.send(Ok(result)).await.is_err() {
                        // The client went away; what was stored stays stored.
                        return finish(started, tonic::Code::Cancelled);
                    }
                }
            }
            first = inbound.next(), if open && unanswered < window => {
                let mut chunk = Vec::new();
                let room = chunk_limit.min(window - unanswered);
                let mut item = first;
                loop {
                    match item {
                        Some(Ok(request)) => chunk.push(request),
                        Some(Err(status)) => {
                            broken = Some(super::limit::too_large(status, super::limit::Limit::one_message(service.limits())));
                            open = false;
                            break;
                        }
                        None => {
                            open = false;
                            break;
                        }
                    }
                    if chunk.len() >= room {
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
                    let first_index = next_index;
                    next_index += chunk.len() as u64;
                    let service = Arc::clone(&service);
                    answers.push_back(Box::pin(schedule_chunk(service, access.clone(), chunk, first_index)));
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
    service: Arc<Service>,
    access: Access,
    chunk: Vec<proto::ScheduleRequest>,
    first_index: u64,
) -> Vec<proto::ScheduleResult> {
    let n = chunk.len();
    let items = chunk.into_iter().map(TryInto::try_into).collect();
    let results: Vec<Result<Scheduled, crate::Error>> = match service.schedule_batch_for(&access, items).await
    {
        Ok(results) => results,
        // The write failed: nothing of the chunk was stored.
        Err(e) => vec![Err(e); n],
    };
    schedule_results(METHOD, first_index, results)
}

fn finish(started: Instant, code: tonic::Code) {
    metrics::GRPC_REQUESTS.with_label_values(&[METHOD, &format!("{code:?}")]).inc();
    metrics::GRPC_SECONDS.with_label_values(&[METHOD]).observe(started.elapsed().as_secs_f64());
}
