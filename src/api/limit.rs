//! Requests larger than the server reads. tonic judges a request by the
//! length prefix of its gRPC frame and refuses it before buffering the body,
//! which is what we want, but it answers OUT_OF_RANGE in its own words. A
//! request too large is the sender's fault like any other request the server
//! will not take (a batch with too many items is INVALID_ARGUMENT), so it is
//! INVALID_ARGUMENT here, naming the limit and the flags that set it.
//!
//! tonic decodes a unary request before the method runs, so its refusal is
//! rewritten on the way out ([`SizeLimit`]); a stream's refusal reaches the
//! method and goes through [`too_large`] there.

use std::{
    convert::Infallible,
    pin::Pin,
    task::{Context, Poll},
};

use tonic::{
    Code, Status,
    body::Body,
    codegen::{Service, http},
    server::NamedService,
};

use crate::metrics;

/// Wraps the gRPC service so that a request refused for its size is
/// answered as [`too_large`] says.
#[derive(Clone)]
pub struct SizeLimit<S> {
    inner: S,
    max: usize,
}

impl<S> SizeLimit<S> {
    pub fn new(inner: S, max: usize) -> Self {
        SizeLimit { inner, max }
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
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let method = request.uri().path().rsplit('/').next().unwrap_or_default().to_owned();
        let (answer, max) = (self.inner.call(request), self.max);
        Box::pin(async move {
            let response = answer.await?;
            // A refusal before the method ran is a trailers-only answer: the
            // status is in the headers. Only a method of the service gets
            // this far, so `method` is one of a few names.
            match Status::from_header_map(response.headers()) {
                Some(status) if status.code() == Code::OutOfRange => {
                    let status = too_large(status, max);
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
pub fn too_large(status: Status, max: usize) -> Status {
    if status.code() != Code::OutOfRange {
        return status;
    }
    Status::invalid_argument(format!(
        "the request is larger than the server reads: at most {max} bytes, set by --max-batch-bytes \
         (or --max-message-bytes plus 64 KiB); split it ({})",
        status.message()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_size_refusal_is_rewritten() {
        let tonic = Status::out_of_range(
            "Error, decoded message length too large: found 9 bytes, the limit is: 8 bytes",
        );
        let status = too_large(tonic, 8);
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains("at most 8 bytes"), "{}", status.message());
        assert!(status.message().contains("found 9 bytes"), "tonic's figures are kept: {}", status.message());
        assert_eq!(too_large(Status::internal("x"), 8).code(), Code::Internal);
    }
}
