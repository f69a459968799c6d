//! The Connect protocol's unary form: `POST /hourglass.v1.Scheduler/Schedule`
//! with a JSON (or binary protobuf) body, answered with the response
//! message, or with an error as JSON (`{"code": "invalid_argument",
//! "message": ..., "details": [...]}`) under the HTTP status the code maps
//! to.
//!
//! Nothing here knows a method: a request is transcoded (proto3 JSON →
//! protobuf, by the descriptors the server is built from) into the gRPC
//! call it stands for and handed to the gRPC services, so the token check,
//! admission, size limits and metrics are gRPC's; the answer is transcoded
//! back. A JSON body takes its bytes from the request-memory budget as it
//! arrives, as gRPC bodies do.

use std::{collections::HashMap, time::Duration};

use base64::Engine as _;
use bytes::{BufMut as _, Bytes, BytesMut};
use http_body_util::{BodyExt as _, Full};
use prost::Message as _;
use prost_reflect::{DescriptorPool, DynamicMessage, MessageDescriptor, MethodDescriptor};
use tokio::sync::OwnedSemaphorePermit;
use tonic::{
    Code, Status,
    body::Body,
    codegen::{
        Service,
        http::{self, HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, header},
    },
};

use crate::{api::Budget, auth::Authenticator};

/// The JSON codec's and the binary one's content types.
const JSON: &str = "application/json";
const PROTO: &str = "application/proto";

/// The unary methods of the services served, by path, and what a body may
/// take.
pub(super) struct Connect {
    pool: DescriptorPool,
    methods: HashMap<String, MethodDescriptor>,
    /// The largest body read, in bytes.
    max_body: usize,
    budget: Budget,
    /// Who may have a body read: the services check the token again.
    auth: Authenticator,
}

impl Connect {
    /// `max_request` is the largest protobuf request the gRPC services take;
    /// a JSON body may be larger by base64's and JSON's overhead.
    pub(super) fn new(
        pool: DescriptorPool,
        max_request: usize,
        budget: Budget,
        auth: Authenticator,
    ) -> Connect {
        let methods = pool
            .services()
            .filter(|service| service.package_name() == "hourglass.v1")
            .flat_map(|service| service.methods().collect::<Vec<_>>())
            .map(|method| (format!("/{}/{}", method.parent_service().full_name(), method.name()), method))
            .collect();
        Connect { pool, methods, max_body: max_request.saturating_mul(2), budget, auth }
    }

    /// Serves one request through `grpc`, the gRPC services.
    pub(super) async fn call<S>(&self, grpc: S, request: Request<Body>) -> Response<Body>
    where
        S: Service<Request<Body>, Response = Response<Body>>,
        S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let (parts, body) = request.into_parts();
        let http1 = parts.version < http::Version::HTTP_2;
        let asked = match self.check(&parts) {
            Ok(asked) => asked,
            Err(refusal) => return drained(body, refusal.into_response(&self.pool), http1).await,
        };
        let (body, held) = match self.read(body).await {
            Ok(read) => read,
            Err(refusal) if http1 => return closing(refusal.into_response(&self.pool)),
            Err(refusal) => return refusal.into_response(&self.pool),
        };
        let within = asked.timeout;
        let answer = self.transcode(grpc, parts, body, held, asked);
        let answer = match within {
            Some(within) => tokio::time::timeout(within, answer).await.unwrap_or_else(|_| {
                Err(Refusal::new(
                    Code::DeadlineExceeded,
                    format!("no answer within Connect-Timeout-Ms ({within:?})"),
                ))
            }),
            None => answer.await,
        };
        answer.unwrap_or_else(|refusal| refusal.into_response(&self.pool))
    }

    /// Lets a request's caller in on its head, before its body is read:
    /// a call with no token or a bad one is refused unread, as over gRPC.
    /// Health answers everyone.
    pub(super) fn admit(&self, parts: &http::request::Parts) -> Result<(), Refusal> {
        if parts.uri.path().starts_with("/grpc.health.") {
            return Ok(());
        }
        let metadata = tonic::metadata::MetadataMap::from_headers(parts.headers.clone());
        self.auth.authenticate(&metadata).map(drop).map_err(|e| Refusal::from(Status::from(e)))
    }

    /// What a request asks for, from its head alone.
    fn check(&self, parts: &http::request::Parts) -> Result<Asked, Refusal> {
        let path = parts.uri.path();
        let Some(method) = self.methods.get(path) else {
            return Err(Refusal::new(
                Code::Unimplemented,
                format!(
                    "no call at {path}: the HTTP API is POST /hourglass.v1.<Service>/<Method> with a JSON body, \
                     as /openapi.json lists"
                ),
            )
            .with_http(StatusCode::NOT_FOUND));
        };
        self.admit(parts)?;
        if method.is_client_streaming() || method.is_server_streaming() {
            return Err(Refusal::new(
                Code::Unimplemented,
                format!("{} is a streaming call: call it over gRPC or gRPC-Web", method.full_name()),
            ));
        }
        if parts.method != http::Method::POST {
            return Err(Refusal::new(
                Code::Unimplemented,
                format!("{path} takes POST, not {}", parts.method),
            )
            .with_http(StatusCode::METHOD_NOT_ALLOWED)
            .with_header(header::ALLOW, HeaderValue::from_static("POST")));
        }
        let codec = Codec::of(&parts.headers)?;
        if let Some(encoding) = parts.headers.get(header::CONTENT_ENCODING)
            && encoding.as_bytes() != b"identity"
        {
            return Err(Refusal::new(
                Code::Unimplemented,
                format!("Content-Encoding {encoding:?} is not supported: send the body uncompressed"),
            )
            .with_header(CONNECT_ACCEPT_ENCODING, HeaderValue::from_static("identity")));
        }
        Ok(Asked { method: method.clone(), codec, timeout: timeout(&parts.headers)? })
    }

    async fn transcode<S>(
        &self,
        mut grpc: S,
        mut parts: http::request::Parts,
        body: Bytes,
        held: Option<OwnedSemaphorePermit>,
        Asked { method, codec, timeout }: Asked,
    ) -> Result<Response<Body>, Refusal>
    where
        S: Service<Request<Body>, Response = Response<Body>>,
        S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let message = codec.decode(method.input(), body)?;
        // The JSON is gone; the services take the protobuf's bytes from
        // the budget as they read them.
        drop(held);
        let mut frame = BytesMut::with_capacity(5 + message.len());
        frame.put_u8(0);
        frame.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
        frame.put_slice(&message);
        grpc_headers(&mut parts.headers, timeout);
        parts.version = http::Version::HTTP_2;
        let call = Request::from_parts(parts, Body::new(Full::new(frame.freeze())));
        std::future::poll_fn(|cx| grpc.poll_ready(cx)).await.map_err(|e| internal(e.into()))?;
        let response = grpc.call(call).await.map_err(|e| internal(e.into()))?;
        let (parts, body) = response.into_parts();
        let collected = body.collect().await.map_err(internal)?;
        let trailers = collected.trailers().cloned().unwrap_or_default();
        let body = collected.to_bytes();
        let status = Status::from_header_map(&parts.headers)
            .or_else(|| Status::from_header_map(&trailers))
            .ok_or_else(|| internal("the call ended without a gRPC status"))?;
        if status.code() != Code::Ok {
            return Err(Refusal::from(status));
        }
        let message = unframe(body)?;
        let answer = codec.encode(method.output(), message)?;
        let mut response = Response::new(Body::new(Full::new(answer)));
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(codec.content_type()));
        Ok(response)
    }

    /// The whole body, its bytes taken from the budget as they arrive and
    /// held until the answer.
    pub(super) async fn read(&self, body: Body) -> Result<(Bytes, Option<OwnedSemaphorePermit>), Refusal> {
        tokio::time::timeout(READ_WITHIN, self.read_all(body)).await.unwrap_or_else(|_| {
            Err(Refusal::new(
                Code::DeadlineExceeded,
                format!("the body did not arrive whole within {READ_WITHIN:?}"),
            )
            .with_http(StatusCode::REQUEST_TIMEOUT))
        })
    }

    async fn read_all(&self, mut body: Body) -> Result<(Bytes, Option<OwnedSemaphorePermit>), Refusal> {
        let mut read = BytesMut::new();
        let mut held: Option<OwnedSemaphorePermit> = None;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| Refusal::new(Code::Cancelled, format!("reading the body: {e}")))?;
            let Ok(data) = frame.into_data() else { continue };
            if read.len() + data.len() > self.max_body {
                return Err(Refusal::new(
                    Code::InvalidArgument,
                    format!(
                        "the body is over {} bytes, the most this server reads (twice --max-message-bytes or \
                         --max-batch-bytes)",
                        self.max_body
                    ),
                )
                .with_http(StatusCode::PAYLOAD_TOO_LARGE));
            }
            let Some(permit) = self.budget.try_take(data.len()) else {
                return Err(Refusal::new(
                    Code::ResourceExhausted,
                    "the server holds as many request bytes as it may (--max-request-memory): retry shortly",
                ));
            };
            match &mut held {
                Some(held) => held.merge(permit),
                None => held = Some(permit),
            }
            read.extend_from_slice(&data);
        }
        Ok((read.freeze(), held))
    }
}

/// A call, as its head asks for it.
struct Asked {
    method: MethodDescriptor,
    codec: Codec,
    timeout: Option<Duration>,
}

/// `response` with `Connection: close`: sent when an HTTP/1.1 request is
/// answered before its body was read whole.
pub(super) fn closing(mut response: Response<Body>) -> Response<Body> {
    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// A refusal of a request made on its head alone. An answer sent with the
/// body unread ends the request under a client still sending it: over
/// HTTP/1.1 the connection closes, over HTTP/2 the stream is reset, and
/// the client may see the reset rather than the answer. So a small body is
/// read and dropped first; a larger or slower one gets the answer at once
/// (over HTTP/1.1 with `Connection: close`).
pub(super) async fn drained(mut body: Body, response: Response<Body>, http1: bool) -> Response<Body> {
    let drain = async {
        let mut seen = 0;
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else { return false };
            seen += frame.data_ref().map_or(0, Bytes::len);
            if seen > DRAIN_AT_MOST {
                return false;
            }
        }
        true
    };
    match tokio::time::timeout(DRAIN_WITHIN, drain).await {
        Ok(true) => response,
        _ if http1 => closing(response),
        _ => response,
    }
}

/// What a refused request's body may be to be read and dropped.
const DRAIN_AT_MOST: usize = 64 * 1024;
const DRAIN_WITHIN: Duration = Duration::from_secs(1);

/// How long a body may take to arrive whole.
const READ_WITHIN: Duration = Duration::from_secs(30);

/// How a body is written.
#[derive(Clone, Copy)]
enum Codec {
    Json,
    Proto,
}

impl Codec {
    fn of(headers: &HeaderMap) -> Result<Codec, Refusal> {
        let given = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
        let essence = given.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
        match essence.as_str() {
            JSON => Ok(Codec::Json),
            PROTO => Ok(Codec::Proto),
            _ => Err(Refusal::new(
                Code::Unimplemented,
                format!("Content-Type {given:?} is not served: send {JSON} (or {PROTO})"),
            )
            .with_http(StatusCode::UNSUPPORTED_MEDIA_TYPE)
            .with_header(ACCEPT_POST, HeaderValue::from_static("application/json, application/proto"))),
        }
    }

    fn content_type(self) -> &'static str {
        match self {
            Codec::Json => JSON,
            Codec::Proto => PROTO,
        }
    }

    /// The request as protobuf bytes.
    fn decode(self, input: MessageDescriptor, body: Bytes) -> Result<Vec<u8>, Refusal> {
        match self {
            Codec::Proto => Ok(body.to_vec()),
            Codec::Json => {
                let text: &[u8] = if body.iter().all(u8::is_ascii_whitespace) { b"{}" } else { &body };
                let mut json = serde_json::Deserializer::from_slice(text);
                let message = DynamicMessage::deserialize(input.clone(), &mut json)
                    .and_then(|message| json.end().map(|()| message))
                    .map_err(|e| {
                        Refusal::new(
                            Code::InvalidArgument,
                            format!("the body is not a {} in JSON: {e}", input.full_name()),
                        )
                    })?;
                Ok(message.encode_to_vec())
            }
        }
    }

    /// The answer as the client asked for it.
    fn encode(self, output: MessageDescriptor, message: Bytes) -> Result<Bytes, Refusal> {
        match self {
            Codec::Proto => Ok(message),
            Codec::Json => {
                let message = DynamicMessage::decode(output, message).map_err(internal)?;
                serde_json::to_vec(&message).map(Bytes::from).map_err(internal)
            }
        }
    }
}

/// The request's headers as the gRPC call's: the caller's metadata (its
/// token, trace context) kept, the Connect protocol's own replaced.
fn grpc_headers(headers: &mut HeaderMap, timeout: Option<Duration>) {
    let connect: Vec<_> = headers
        .keys()
        .filter(|name| name.as_str().starts_with("connect-") || name.as_str().starts_with("content-"))
        .cloned()
        .collect();
    for name in connect {
        headers.remove(name);
    }
    for hop in [header::CONNECTION, header::TRANSFER_ENCODING, header::HOST, header::ACCEPT_ENCODING] {
        headers.remove(hop);
    }
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(header::TE, HeaderValue::from_static("trailers"));
    headers.remove("grpc-timeout");
    // At most 8 digits, as gRPC has it: milliseconds, or whole seconds
    // for a longer time.
    let text = timeout.map(|t| match t.as_millis() {
        ms @ 0..=99_999_999 => format!("{ms}m"),
        _ => format!("{}S", t.as_secs().min(99_999_999)),
    });
    if let Some(value) = text.and_then(|text| HeaderValue::from_str(&text).ok()) {
        headers.insert("grpc-timeout", value);
    }
}

/// `Connect-Timeout-Ms`: at most ten digits, as the protocol says.
fn timeout(headers: &HeaderMap) -> Result<Option<Duration>, Refusal> {
    let Some(value) = headers.get("connect-timeout-ms") else { return Ok(None) };
    value
        .to_str()
        .ok()
        .filter(|text| !text.is_empty() && text.len() <= 10)
        .and_then(|text| text.parse::<u64>().ok())
        .map(|ms| Some(Duration::from_millis(ms)))
        .ok_or_else(|| {
            Refusal::new(Code::InvalidArgument, format!("Connect-Timeout-Ms {value:?} is not 1 to 10 digits"))
        })
}

/// The one message of a unary gRPC answer.
fn unframe(mut body: Bytes) -> Result<Bytes, Refusal> {
    if body.len() < 5 || body[0] != 0 {
        return Err(internal("the answer is not one uncompressed gRPC message"));
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    let _ = body.split_to(5);
    if body.len() != len {
        return Err(internal("the answer is not one gRPC message"));
    }
    Ok(body)
}

const ACCEPT_POST: HeaderName = HeaderName::from_static("accept-post");
const CONNECT_ACCEPT_ENCODING: HeaderName = HeaderName::from_static("connect-accept-encoding");

/// A Connect error: its code, message and details, and the HTTP status
/// and headers it goes out with.
pub(super) struct Refusal {
    code: Code,
    message: String,
    /// `google.rpc.Status` bytes, as gRPC carries them.
    details: Bytes,
    http: Option<StatusCode>,
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl Refusal {
    pub(super) fn new(code: Code, message: impl Into<String>) -> Refusal {
        Refusal { code, message: message.into(), details: Bytes::new(), http: None, headers: Vec::new() }
    }

    /// An HTTP status other than the code's own, where the protocol says so.
    fn with_http(mut self, status: StatusCode) -> Refusal {
        self.http = Some(status);
        self
    }

    fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Refusal {
        self.headers.push((name, value));
        self
    }

    pub(super) fn into_response(self, pool: &DescriptorPool) -> Response<Body> {
        let error = ErrorBody {
            code: code_name(self.code),
            message: self.message,
            details: details(&self.details, pool),
        };
        let body = serde_json::to_vec(&error).unwrap_or_default();
        let mut response = Response::new(Body::new(Full::new(Bytes::from(body))));
        *response.status_mut() = self.http.unwrap_or_else(|| http_status(self.code));
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(JSON));
        for (name, value) in self.headers {
            headers.insert(name, value);
        }
        response
    }
}

impl Refusal {
    /// The refusal as a gRPC-Web answer: trailers only, in the headers.
    pub(super) fn into_grpc_web(self) -> Response<Body> {
        let mut response = Status::new(self.code, self.message).into_http::<Body>();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc-web+proto"));
        response
    }
}

impl From<Status> for Refusal {
    fn from(status: Status) -> Refusal {
        Refusal {
            code: status.code(),
            message: status.message().to_owned(),
            details: Bytes::copy_from_slice(status.details()),
            http: None,
            headers: Vec::new(),
        }
    }
}

fn internal(error: impl std::fmt::Display) -> Refusal {
    tracing::warn!(%error, "an HTTP call failed inside the server");
    Refusal::new(Code::Internal, format!("the server failed the call: {error}"))
}

/// A Connect error as JSON.
#[derive(serde::Serialize)]
struct ErrorBody {
    code: &'static str,
    #[serde(skip_serializing_if = "String::is_empty")]
    message: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    details: Vec<Detail>,
}

/// One detail of an error: its type, its bytes in base64 and, for the
/// types the server knows, the message as JSON.
#[derive(serde::Serialize)]
struct Detail {
    #[serde(rename = "type")]
    kind: String,
    value: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    debug: Option<DynamicMessage>,
}

/// A gRPC status's details (`google.rpc.Status` bytes) as the Connect
/// protocol writes them.
fn details(status: &[u8], pool: &DescriptorPool) -> Vec<Detail> {
    let Ok(status) = tonic_types::pb::Status::decode(status) else { return Vec::new() };
    status
        .details
        .into_iter()
        .map(|any| {
            let kind = any.type_url.rsplit('/').next().unwrap_or_default().to_owned();
            let debug = pool
                .get_message_by_name(&kind)
                .and_then(|descriptor| DynamicMessage::decode(descriptor, any.value.as_slice()).ok());
            let value = base64::engine::general_purpose::STANDARD_NO_PAD.encode(&any.value);
            Detail { kind, value, debug }
        })
        .collect()
}

/// The Connect protocol's name of a code.
pub(super) fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "ok",
        Code::Cancelled => "canceled",
        Code::Unknown => "unknown",
        Code::InvalidArgument => "invalid_argument",
        Code::DeadlineExceeded => "deadline_exceeded",
        Code::NotFound => "not_found",
        Code::AlreadyExists => "already_exists",
        Code::PermissionDenied => "permission_denied",
        Code::ResourceExhausted => "resource_exhausted",
        Code::FailedPrecondition => "failed_precondition",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out_of_range",
        Code::Unimplemented => "unimplemented",
        Code::Internal => "internal",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data_loss",
        Code::Unauthenticated => "unauthenticated",
    }
}

/// The HTTP status of a code, as the Connect protocol maps them.
pub(super) fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_the_protocols_name_and_status() {
        assert_eq!(code_name(Code::Cancelled), "canceled");
        assert_eq!(http_status(Code::Cancelled).as_u16(), 499);
        assert_eq!(http_status(Code::ResourceExhausted), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(http_status(Code::FailedPrecondition), StatusCode::BAD_REQUEST);
        assert_eq!(http_status(Code::Unauthenticated), StatusCode::UNAUTHORIZED);
    }

    #[test]
    fn a_timeout_is_one_to_ten_digits() {
        let mut headers = HeaderMap::new();
        assert_eq!(timeout(&headers).ok(), Some(None));
        headers.insert("connect-timeout-ms", HeaderValue::from_static("1500"));
        assert_eq!(timeout(&headers).ok(), Some(Some(Duration::from_millis(1500))));
        for bad in ["", "12345678901", "-1", "1.5"] {
            headers.insert("connect-timeout-ms", HeaderValue::from_static(bad));
            assert!(timeout(&headers).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_connect_headers_become_grpc_ones_and_metadata_stays() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(JSON));
        headers.insert("connect-protocol-version", HeaderValue::from_static("1"));
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer t"));
        headers.insert(
            "traceparent",
            HeaderValue::from_static("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        );
        grpc_headers(&mut headers, Some(Duration::from_millis(250)));
        assert_eq!(headers[header::CONTENT_TYPE], "application/grpc");
        assert_eq!(headers["grpc-timeout"], "250m");
        // gRPC's 8 digits: a longer time in seconds.
        grpc_headers(&mut headers, Some(Duration::from_millis(9_999_999_999)));
        assert_eq!(headers["grpc-timeout"], "9999999S");
        assert_eq!(headers[header::AUTHORIZATION], "Bearer t");
        assert!(headers.contains_key("traceparent"));
        assert!(!headers.contains_key("connect-protocol-version"));
    }

    #[test]
    fn a_frame_is_one_message() {
        assert_eq!(
            unframe(Bytes::from_static(&[0, 0, 0, 0, 2, 8, 1])).ok(),
            Some(Bytes::from_static(&[8, 1]))
        );
        assert!(unframe(Bytes::from_static(&[0, 0, 0, 0, 3, 8, 1])).is_err());
        assert!(unframe(Bytes::from_static(&[1, 0, 0, 0, 2, 8, 1])).is_err());
        assert!(unframe(Bytes::new()).is_err());
    }
}
