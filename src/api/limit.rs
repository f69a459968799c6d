//! Requests larger than the server reads. tonic judges a request by the
//! length prefix of its gRPC frame and refuses it before buffering the body,
//! which is what we want, but it answers OUT_OF_RANGE in its own words. A
//! request too large is the sender's fault like any other request the server
//! will not take (a batch with too many items is INVALID_ARGUMENT), so it is
//! INVALID_ARGUMENT here, naming the limit and the flag that sets it.
//!
//! tonic has one decoding limit per service; a `ScheduleBatch` may be far
//! larger than any other request, so [`SizeLimit`] routes it to a copy of the
//! service with the batch limit and everything else to one with the limit of
//! one message. tonic decodes a unary request before the method runs, so its
//! refusal is rewritten on the way out; a stream's refusal reaches the
//! method and goes through [`too_large`] there.
//!
//! Memory is bounded in bytes, not in calls: every request body of a unary
//! call takes its bytes from one budget (`--max-request-memory`) as they
//! arrive, and holds them until the call is answered; a call the budget
//! cannot take is refused with RESOURCE_EXHAUSTED before the rest of its
//! body is read. A stream takes from the same budget for the requests it
//! has read and not answered (see `stream`), and waits for room instead.

use std::{
    convert::Infallible,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll, ready},
};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::{
    Code, Status,
    body::Body,
    codegen::{Service, http},
    server::NamedService,
};

use crate::{Error, message::Limits, metrics};

/// How large a request may be, and what sets that.
#[derive(Clone, Copy, Debug)]
pub struct Limit {
    pub bytes: usize,
    set_by: &'static str,
}

impl Limit {
    /// A `ScheduleBatch` request.
    pub fn batch(limits: &Limits) -> Limit {
        Limit { bytes: limits.max_batch_request_bytes(), set_by: "--max-batch-bytes" }
    }

    /// Any other request, including each request of a stream.
    pub fn one_message(limits: &Limits) -> Limit {
        Limit { bytes: limits.max_request_bytes(), set_by: "--max-message-bytes plus 64 KiB" }
    }
}

/// The bytes of request bodies the server holds at once, across calls.
#[derive(Clone, Debug)]
pub struct Budget {
    bytes: Arc<Semaphore>,
    total: usize,
}

impl Budget {
    pub fn new(total: usize) -> Budget {
        Budget { bytes: Arc::new(Semaphore::new(total.min(Semaphore::MAX_PERMITS))), total }
    }

    /// Takes `bytes` until the permit is dropped, if they are free now.
    pub fn try_take(&self, bytes: usize) -> Option<OwnedSemaphorePermit> {
        let bytes = u32::try_from(bytes).ok()?;
        Arc::clone(&self.bytes).try_acquire_many_owned(bytes).ok()
    }

    pub fn total(&self) -> usize {
        self.total
    }
}

/// The bytes one call holds, given back when every holder is dropped (the
/// body and the call's answer).
#[derive(Clone)]
struct Ticket {
    budget: Budget,
    held: Arc<Mutex<Option<OwnedSemaphorePermit>>>,
    /// The budget could not take the call's bytes.
    refused: Arc<std::sync::atomic::AtomicBool>,
}

impl Ticket {
    fn take(&self, bytes: usize) -> Result<(), Status> {
        let taken = u32::try_from(bytes)
            .ok()
            .and_then(|n| Arc::clone(&self.budget.bytes).try_acquire_many_owned(n).ok())
            .ok_or_else(|| {
                self.refused.store(true, std::sync::atomic::Ordering::Relaxed);
                Status::from(Error::RequestMemory(self.budget.total))
            })?;
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        match held.as_mut() {
            Some(permit) => permit.merge(taken),
            None => *held = Some(taken),
        }
        Ok(())
    }
}

/// A request body whose bytes are taken from the budget as they arrive.
struct Metered {
    inner: Body,
    ticket: Ticket,
}

impl http_body::Body for Metered {
    type Data = bytes::Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Status>>> {
        let this = self.get_mut();
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        if let Some(Ok(frame)) = &frame
            && let Some(data) = frame.data_ref()
            && let Err(refused) = this.ticket.take(data.len())
        {
            return Poll::Ready(Some(Err(refused)));
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        http_body::Body::is_end_stream(&self.inner)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::Body::size_hint(&self.inner)
    }
}

/// The gRPC service, twice: with the batch limit for `ScheduleBatch`, with
/// the one-message limit for the rest. A request refused for its size is
/// answered as [`too_large`] says; the bodies of unary calls are metered
/// against the budget.
#[derive(Clone)]
pub struct SizeLimit<S> {
    one: (S, Limit),
    batch: (S, Limit),
    budget: Budget,
}

impl<S> SizeLimit<S> {
    pub fn new(one: (S, Limit), batch: (S, Limit), budget: Budget) -> Self {
        SizeLimit { one, batch, budget }
    }
}

impl<S: NamedService> NamedService for SizeLimit<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for SizeLimit<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        ready!(self.one.0.poll_ready(cx))?;
        self.batch.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let method = request.uri().path().rsplit('/').next().unwrap_or_default().to_owned();
        let ticket = Ticket { budget: self.budget.clone(), held: Arc::default(), refused: Arc::default() };
        // A stream holds bytes for what it has read and not answered,
        // itself; metering its body would hold every byte it ever sent.
        let request = if method == "ScheduleStream" {
            request
        } else {
            let ticket = ticket.clone();
            request.map(move |inner| Body::new(Metered { inner, ticket }))
        };
        let (service, limit) = if method == "ScheduleBatch" { &mut self.batch } else { &mut self.one };
        let (answer, limit) = (service.call(request), *limit);
        Box::pin(async move {
            let response = answer.await?;
            // A unary call is answered: its request is gone.
            if ticket.refused.load(std::sync::atomic::Ordering::Relaxed) {
                metrics::GRPC_REQUESTS
                    .with_label_values(&[&method, &format!("{:?}", Code::ResourceExhausted)])
                    .inc();
            }
            drop(ticket);
            // A refusal before the method ran is a trailers-only answer: the
            // status is in the headers. Only a method of the service gets
            // this far, so `method` is one of a few names.
            match Status::from_header_map(response.headers()) {
                Some(status) if status.code() == Code::OutOfRange => {
                    let status = too_large(status, limit);
                    metrics::GRPC_REQUESTS
                        .with_label_values(&[&method, &format!("{:?}", status.code())])
                        .inc();
                    Ok(status.into_http())
                }
                _ => Ok(response),
            }
        })
    }
}

/// tonic's refusal of an oversized request (OUT_OF_RANGE, which the server
/// never answers otherwise) as INVALID_ARGUMENT; any other status as is.
pub(super) fn too_large(status: Status, limit: Limit) -> Status {
    if status.code() != Code::OutOfRange {
        return status;
    }
    Status::from(Error::TooLarge {
        bytes: limit.bytes,
        set_by: limit.set_by,
        detail: status.message().to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_size_refusal_is_rewritten() {
        let tonic = Status::out_of_range(
            "Error, decoded message length too large: found 9 bytes, the limit is: 8 bytes",
        );
        let limit = Limit { bytes: 8, set_by: "--max-batch-bytes" };
        let status = too_large(tonic, limit);
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(
            status.message().contains("at most 8 bytes, set by --max-batch-bytes"),
            "{}",
            status.message()
        );
        assert!(status.message().contains("found 9 bytes"), "tonic's figures are kept: {}", status.message());
        assert_eq!(too_large(Status::internal("x"), limit).code(), Code::Internal);
    }

    #[test]
    fn a_batch_may_always_hold_one_message() {
        let limits = Limits { max_message_bytes: 1 << 20, max_batch_bytes: 1024, ..Limits::default() };
        assert_eq!(Limit::one_message(&limits).bytes, (1 << 20) + 64 * 1024);
        assert_eq!(Limit::batch(&limits).bytes, Limit::one_message(&limits).bytes);
        let limits = Limits::default();
        assert_eq!(Limit::batch(&limits).bytes, limits.max_batch_bytes);
    }
}
