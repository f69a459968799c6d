//! The doors beside gRPC, on the same port: every unary call as JSON over
//! HTTP/1.1 or HTTP/2 (the Connect protocol's unary form, [`connect`]),
//! gRPC-Web for browsers (tonic-web), and the OpenAPI document of the JSON
//! API at `GET /openapi.json`.
//!
//! [`Web`] sits in front of the gRPC services and sorts requests by their
//! content type: gRPC goes through untouched; gRPC-Web is translated to
//! gRPC; anything else is a Connect call, transcoded into the gRPC call it
//! stands for. Every door thus reaches the same services, behind the same
//! token check, admission and limits; TLS is the port's.

mod connect;
#[cfg(test)]
mod openapi;

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body_util::Full;
use prost_reflect::DescriptorPool;
use tonic::{
    body::Body,
    codegen::{
        Service,
        http::{self, HeaderValue, Request, Response, header},
    },
};
use tower_layer::Layer;

use crate::{api::Budget, auth::Authenticator, proto};

/// The OpenAPI document of the JSON API, as served (checked against the
/// descriptors by a test).
pub(crate) const OPENAPI: &str = include_str!("../../docs/openapi.json");

/// The descriptors the HTTP doors transcode with: the services' and the
/// error details' (`google.rpc.BadRequest`).
pub(crate) fn descriptors() -> DescriptorPool {
    let mut pool = DescriptorPool::new();
    for set in [tonic_types::pb::FILE_DESCRIPTOR_SET, proto::FILE_DESCRIPTOR_SET] {
        pool.decode_file_descriptor_set(set).expect("the descriptors built in decode");
    }
    pool
}

/// Puts the HTTP doors in front of the gRPC services.
#[derive(Clone)]
pub(crate) struct WebLayer {
    connect: Arc<connect::Connect>,
}

impl WebLayer {
    /// `max_request` is the largest protobuf request the services take;
    /// bodies read whole take their bytes from `budget` while they are
    /// read, and only once `auth` lets their caller in.
    pub(crate) fn new(max_request: usize, budget: Budget, auth: Authenticator) -> WebLayer {
        WebLayer { connect: Arc::new(connect::Connect::new(descriptors(), max_request, budget, auth)) }
    }
}

impl<S: Clone> Layer<S> for WebLayer {
    type Service = Web<S>;

    fn layer(&self, grpc: S) -> Web<S> {
        Web {
            grpc_web: tonic_web::GrpcWebLayer::new().layer(grpc.clone()),
            grpc,
            connect: Arc::clone(&self.connect),
        }
    }
}

/// The gRPC services behind the HTTP doors.
#[derive(Clone)]
pub(crate) struct Web<S> {
    grpc: S,
    grpc_web: tonic_web::GrpcWebService<S>,
    connect: Arc<connect::Connect>,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<S> Service<Request<Body>> for Web<S>
where
    S: Service<Request<Body>, Response = Response<Body>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError> + std::fmt::Display + Send,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.grpc.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let logs = crate::otel::log_span(request.headers());
        let call: Self::Future = match Door::of(&request) {
            Door::Grpc => Box::pin(self.grpc.call(request)),
            // Over HTTP/2 each call is a stream of its own: straight on.
            Door::GrpcWeb if request.version() >= http::Version::HTTP_2 => {
                let mut grpc_web = self.grpc_web.clone();
                Box::pin(async move {
                    std::future::poll_fn(|cx| Service::<Request<Body>>::poll_ready(&mut grpc_web, cx))
                        .await?;
                    grpc_web.call(request).await
                })
            }
            Door::GrpcWeb => {
                let mut grpc_web = self.grpc_web.clone();
                let connect = Arc::clone(&self.connect);
                Box::pin(async move {
                    // Over HTTP/1.1 the body is read whole (its caller let
                    // in first) before the call: a call refused with its
                    // body unread leaves a connection that cannot be used
                    // again, which the server closes as the client reuses
                    // it. A refusal here says so.
                    let (parts, body) = request.into_parts();
                    if let Err(refusal) = connect.admit(&parts) {
                        let http1 = parts.version < http::Version::HTTP_2;
                        return Ok(connect::drained(body, refusal.into_grpc_web(), http1).await);
                    }
                    let body = match connect.read(body).await {
                        // The services take the bytes from the budget
                        // again as they read them.
                        Ok((body, _held)) => body,
                        Err(refusal) => return Ok(connect::closing(refusal.into_grpc_web())),
                    };
                    let request = Request::from_parts(parts, Body::new(Full::new(body)));
                    std::future::poll_fn(|cx| Service::<Request<Body>>::poll_ready(&mut grpc_web, cx))
                        .await?;
                    grpc_web.call(request).await
                })
            }
            Door::OpenApi => Box::pin(async { Ok(openapi_document()) }),
            Door::Connect => {
                let connect = Arc::clone(&self.connect);
                let grpc = self.grpc.clone();
                Box::pin(async move { Ok(connect.call(grpc, request).await) })
            }
        };
        if logs.is_disabled() { call } else { Box::pin(tracing::Instrument::instrument(call, logs)) }
    }
}

/// Which protocol a request speaks.
#[derive(Debug, PartialEq)]
enum Door {
    Grpc,
    GrpcWeb,
    OpenApi,
    Connect,
}

impl Door {
    fn of<B>(request: &Request<B>) -> Door {
        let content_type =
            request.headers().get(header::CONTENT_TYPE).map(HeaderValue::as_bytes).unwrap_or(b"");
        if content_type.starts_with(b"application/grpc-web") {
            Door::GrpcWeb
        } else if content_type.starts_with(b"application/grpc") {
            Door::Grpc
        } else if request.method() == http::Method::GET && request.uri().path() == "/openapi.json" {
            Door::OpenApi
        } else {
            Door::Connect
        }
    }
}

fn openapi_document() -> Response<Body> {
    let mut response = Response::new(Body::new(Full::new(Bytes::from_static(OPENAPI.as_bytes()))));
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: &str, path: &str, content_type: Option<&str>) -> Request<()> {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(content_type) = content_type {
            request = request.header(header::CONTENT_TYPE, content_type);
        }
        request.body(()).unwrap()
    }

    #[test]
    fn a_request_goes_through_the_door_its_content_type_names() {
        let path = "/hourglass.v1.Scheduler/Schedule";
        assert_eq!(Door::of(&request("POST", path, Some("application/grpc"))), Door::Grpc);
        assert_eq!(Door::of(&request("POST", path, Some("application/grpc+proto"))), Door::Grpc);
        assert_eq!(Door::of(&request("POST", path, Some("application/grpc-web+proto"))), Door::GrpcWeb);
        assert_eq!(Door::of(&request("POST", path, Some("application/grpc-web-text"))), Door::GrpcWeb);
        assert_eq!(Door::of(&request("POST", path, Some("application/json"))), Door::Connect);
        assert_eq!(Door::of(&request("POST", path, None)), Door::Connect);
        assert_eq!(Door::of(&request("GET", "/openapi.json", None)), Door::OpenApi);
        assert_eq!(Door::of(&request("POST", "/openapi.json", None)), Door::Connect);
    }

    #[test]
    fn the_descriptors_hold_every_service_and_the_error_details() {
        let pool = descriptors();
        for service in ["hourglass.v1.Scheduler", "hourglass.v1.Series", "hourglass.v1.Admin"] {
            assert!(pool.get_service_by_name(service).is_some(), "{service}");
        }
        assert!(pool.get_message_by_name("google.rpc.BadRequest").is_some());
    }
}
