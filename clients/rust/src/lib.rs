//! The Rust client of [hourglass](https://github.com/hourglass-kafka/hourglass):
//! delayed delivery for Apache Kafka. A record is scheduled for a topic and
//! a due time; hourglass parks it durably and produces it when it is due.
//!
//! ```no_run
//! # async fn run() -> Result<(), hourglass_kafka::Error> {
//! use std::time::Duration;
//! use hourglass_kafka::{Client, Schedule};
//!
//! let client = Client::builder("http://127.0.0.1:50051").connect().await?;
//! let done = client
//!     .schedule(Schedule::new("reminders", "class starts in 10 minutes").delay(Duration::from_secs(1200)).id("class-7"))
//!     .await?;
//! println!("{} due {:?}", done.id, done.deliver_at);
//! client.cancel("class-7").await?;
//! # Ok(()) }
//! ```
//!
//! - **Ids are idempotency keys**: a request with an `id` is stored once,
//!   however often it is sent; without one the client makes one before the
//!   first try, so its own retries are safe.
//! - **Retries**: a call answered `UNAVAILABLE` (a restart, a shard
//!   moving) is made again, backing off, `retries` times (6 by default).
//! - **Errors** carry the gRPC code, the server's message and the fields it
//!   refused ([`Error::violations`]).
//! - [`proto`] is the generated code: [`Client::scheduler`],
//!   [`Client::series`] and [`Client::admin`] are the raw stubs, with the
//!   token on every call, for what the conveniences do not cover.

use std::{
    path::{Path, PathBuf},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use tonic::{
    Code, Status,
    metadata::AsciiMetadataValue,
    service::interceptor::InterceptedService,
    transport::{Certificate, Channel, ClientTlsConfig, Identity},
};
use tonic_types::StatusExt as _;

/// The wire types and gRPC stubs, generated from `hourglass.proto`.
pub mod proto {
    #![allow(clippy::all, missing_docs)]
    include!("gen/hourglass.v1.rs");
}

/// A channel with the token on every call.
pub type TokenChannel = InterceptedService<Channel, Token>;
/// The `Scheduler` service's stub.
pub type SchedulerClient = proto::scheduler_client::SchedulerClient<TokenChannel>;
/// The `Series` service's stub.
pub type SeriesClient = proto::series_client::SeriesClient<TokenChannel>;
/// The `Admin` service's stub.
pub type AdminClient = proto::admin_client::AdminClient<TokenChannel>;

/// What went wrong: a call the server refused or could not answer, or
/// settings that cannot work.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{code:?}: {message}")]
    Call { code: Code, message: String, violations: Vec<Violation> },
    #[error("cannot reach hourglass at {server}: {source}")]
    Connect { server: String, source: tonic::transport::Error },
    #[error("{0}")]
    Settings(String),
}

/// A field the server refused, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub field: String,
    pub description: String,
}

impl Error {
    /// The gRPC code of a refused call; `None` for a connection or
    /// settings error.
    pub fn code(&self) -> Option<Code> {
        match self {
            Error::Call { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The fields the server refused, from its `BadRequest` detail.
    pub fn violations(&self) -> &[Violation] {
        match self {
            Error::Call { violations, .. } => violations,
            _ => &[],
        }
    }
}

impl From<Status> for Error {
    fn from(status: Status) -> Error {
        let violations = status
            .get_details_bad_request()
            .map(|bad| {
                bad.field_violations
                    .into_iter()
                    .map(|v| Violation { field: v.field, description: v.description })
                    .collect()
            })
            .unwrap_or_default();
        Error::Call { code: status.code(), message: status.message().to_owned(), violations }
    }
}

/// Sends `Authorization: Bearer <token>` with every call, when there is one.
#[derive(Clone, Debug, Default)]
pub struct Token(Option<AsciiMetadataValue>);

impl tonic::service::Interceptor for Token {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(value) = &self.0 {
            request.metadata_mut().insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// How to reach a server: [`Client::builder`].
#[derive(Clone, Debug)]
pub struct Builder {
    server: String,
    token: Option<String>,
    ca_cert: Option<PathBuf>,
    identity: Option<(PathBuf, PathBuf)>,
    server_name: Option<String>,
    timeout: Duration,
    connect_timeout: Duration,
    retries: u32,
    backoff: Duration,
}

impl Builder {
    /// The bearer token of a server with tokens (`--auth-tokens`).
    pub fn token(mut self, token: impl Into<String>) -> Builder {
        self.token = Some(token.into());
        self
    }

    /// A PEM file of the CA to trust (https:// only; the system's roots
    /// otherwise).
    pub fn ca_cert(mut self, path: impl AsRef<Path>) -> Builder {
        self.ca_cert = Some(path.as_ref().to_owned());
        self
    }

    /// A certificate and its key (PEM files), for mutual TLS.
    pub fn identity(mut self, cert: impl AsRef<Path>, key: impl AsRef<Path>) -> Builder {
        self.identity = Some((cert.as_ref().to_owned(), key.as_ref().to_owned()));
        self
    }

    /// The name the server's certificate must hold, when it is not the
    /// host of the URL (a probe inside the server's pod that connects to
    /// 127.0.0.1, say).
    pub fn tls_server_name(mut self, name: impl Into<String>) -> Builder {
        self.server_name = Some(name.into());
        self
    }

    /// Each call's deadline. Default 10 s.
    pub fn timeout(mut self, timeout: Duration) -> Builder {
        self.timeout = timeout;
        self
    }

    /// How long connecting may take. Default 5 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Builder {
        self.connect_timeout = timeout;
        self
    }

    /// How many times a call answered `UNAVAILABLE` is made again, the
    /// first after `backoff`, doubling to 5 s. Default 6 and 200 ms (about
    /// 11 s in all).
    pub fn retries(mut self, retries: u32, backoff: Duration) -> Builder {
        self.retries = retries;
        self.backoff = backoff;
        self
    }

    /// Connects (with TLS for an https:// server).
    pub async fn connect(self) -> Result<Client, Error> {
        let settings = |what: String| Error::Settings(what);
        let mut endpoint = Channel::from_shared(self.server.clone())
            .map_err(|_| settings(format!("{:?} is not a URL like http://127.0.0.1:50051", self.server)))?
            .timeout(self.timeout)
            .connect_timeout(self.connect_timeout);
        let tls = self.server.starts_with("https://");
        if !tls && (self.ca_cert.is_some() || self.identity.is_some() || self.server_name.is_some()) {
            return Err(settings(format!(
                "a CA, an identity or a TLS server name is for TLS: give an https:// server, not {}",
                self.server
            )));
        }
        if tls {
            let read = |path: &Path| {
                std::fs::read(path).map_err(|e| settings(format!("cannot read {}: {e}", path.display())))
            };
            // PEM that holds what it should, or an error naming the file.
            let pem = |path: &Path, what: &str, mark: &str| {
                let text = read(path)?;
                match std::str::from_utf8(&text).is_ok_and(|t| t.contains(mark)) {
                    true => Ok(text),
                    false => Err(settings(format!("{}: no {what} in PEM form", path.display()))),
                }
            };
            // A CA given is the only one trusted; the system's otherwise.
            let mut config = match &self.ca_cert {
                Some(ca) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem(
                    ca,
                    "certificate",
                    "-----BEGIN CERTIFICATE-----",
                )?)),
                None => ClientTlsConfig::new().with_native_roots(),
            };
            if let Some((cert, key)) = &self.identity {
                let cert = pem(cert, "certificate", "-----BEGIN CERTIFICATE-----")?;
                config =
                    config.identity(Identity::from_pem(cert, pem(key, "private key", "PRIVATE KEY-----")?));
            }
            if let Some(name) = &self.server_name {
                config = config.domain_name(name);
            }
            endpoint = endpoint.tls_config(config).map_err(|e| settings(format!("setting up TLS: {e}")))?;
        }
        let token = match &self.token {
            None => Token(None),
            Some(token) => {
                let mut value: AsciiMetadataValue = format!("Bearer {}", token.trim())
                    .parse()
                    .map_err(|_| settings("the token must be printable ASCII".into()))?;
                value.set_sensitive(true);
                Token(Some(value))
            }
        };
        let channel = endpoint
            .connect()
            .await
            .map_err(|source| Error::Connect { server: self.server.clone(), source })?;
        Ok(Client {
            channel: InterceptedService::new(channel, token),
            retries: self.retries,
            backoff: self.backoff,
        })
    }
}

/// A record to schedule: [`Client::schedule`].
#[derive(Clone, Debug)]
pub struct Schedule {
    request: proto::ScheduleRequest,
}

impl Schedule {
    /// `value` for `topic`, due now unless [`at`](Schedule::at) or
    /// [`delay`](Schedule::delay) say otherwise.
    pub fn new(topic: impl Into<String>, value: impl Into<Vec<u8>>) -> Schedule {
        let message = proto::Message { topic: topic.into(), value: value.into(), ..Default::default() };
        let due = Some(proto::schedule_request::Due::Delay(duration(Duration::ZERO)));
        Schedule { request: proto::ScheduleRequest { message: Some(message), due, ..Default::default() } }
    }

    /// Due at `at`.
    pub fn at(mut self, at: SystemTime) -> Schedule {
        self.request.due = Some(proto::schedule_request::Due::DeliverAt(timestamp(at)));
        self
    }

    /// Due `delay` from now (the server's now).
    pub fn delay(mut self, delay: Duration) -> Schedule {
        self.request.due = Some(proto::schedule_request::Due::Delay(duration(delay)));
        self
    }

    /// Your idempotency key.
    pub fn id(mut self, id: impl Into<String>) -> Schedule {
        self.request.id = Some(id.into());
        self
    }

    pub fn key(mut self, key: impl Into<Vec<u8>>) -> Schedule {
        self.message().key = Some(key.into());
        self
    }

    pub fn header(mut self, key: impl Into<String>, value: impl Into<Vec<u8>>) -> Schedule {
        self.message().headers.push(proto::Header { key: key.into(), value: value.into() });
        self
    }

    pub fn partition(mut self, partition: i32) -> Schedule {
        self.message().partition = Some(partition);
        self
    }

    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Schedule {
        self.request.labels.insert(key.into(), value.into());
        self
    }

    /// Replace a pending message with the same id instead of refusing.
    pub fn replace(mut self) -> Schedule {
        self.request.on_conflict = proto::OnConflict::Replace as i32;
        self
    }

    /// Expire it rather than deliver it later than this after its due time.
    pub fn max_lateness(mut self, lateness: Duration) -> Schedule {
        self.request.max_lateness = Some(duration(lateness));
        self
    }

    pub fn dead_letter_topic(mut self, topic: impl Into<String>) -> Schedule {
        self.request.dead_letter_topic = topic.into();
        self
    }

    /// The request as it goes out.
    pub fn into_request(self) -> proto::ScheduleRequest {
        self.request
    }

    fn message(&mut self) -> &mut proto::Message {
        self.request.message.get_or_insert_with(Default::default)
    }
}

/// A scheduled record, as the server answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scheduled {
    pub id: String,
    pub deliver_at: SystemTime,
    /// The same request had been made before: nothing new was stored.
    pub duplicate: bool,
    pub outcome: proto::ScheduleOutcome,
}

/// A client of one hourglass server. Cloning is cheap: clones share the
/// connection.
#[derive(Clone, Debug)]
pub struct Client {
    channel: TokenChannel,
    retries: u32,
    backoff: Duration,
}

impl Client {
    /// `server`: http://host:port, or https:// for TLS.
    pub fn builder(server: impl Into<String>) -> Builder {
        Builder {
            server: server.into(),
            token: None,
            ca_cert: None,
            identity: None,
            server_name: None,
            timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            retries: 6,
            backoff: Duration::from_millis(200),
        }
    }

    pub fn scheduler(&self) -> SchedulerClient {
        SchedulerClient::new(self.channel.clone())
    }

    pub fn series(&self) -> SeriesClient {
        SeriesClient::new(self.channel.clone())
    }

    pub fn admin(&self) -> AdminClient {
        AdminClient::new(self.channel.clone())
    }

    /// Whether the server says `service` is serving, in gRPC health
    /// (`grpc.health.v1.Health/Check`): `""` for the server as a whole (it
    /// takes new messages), `liveness` for the process. Not retried: a
    /// probe wants the answer of now.
    pub async fn serving(&self, service: &str) -> Result<bool, Error> {
        use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus, health_client};
        let mut health = health_client::HealthClient::new(self.channel.clone());
        let answer = health.check(HealthCheckRequest { service: service.to_owned() }).await?;
        Ok(answer.into_inner().status == ServingStatus::Serving as i32)
    }

    /// Makes `call` until it is not answered `UNAVAILABLE`, or the retries
    /// are spent. `call` must be safe to repeat: every convenience here is.
    pub async fn retrying<T, F, Fut>(&self, mut call: F) -> Result<T, Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let mut wait = self.backoff;
        for attempt in 0.. {
            match call().await {
                Ok(response) => return Ok(response.into_inner()),
                Err(status) if status.code() == Code::Unavailable && attempt < self.retries => {
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
                Err(status) => return Err(status.into()),
            }
        }
        unreachable!("the loop returns")
    }

    /// Parks a record. Without an id, one is made before the first try, so
    /// that a retry names the same message.
    pub async fn schedule(&self, schedule: Schedule) -> Result<Scheduled, Error> {
        let mut request = schedule.request;
        request.id.get_or_insert_with(|| ulid::Ulid::new().to_string());
        let answer = self
            .retrying(|| {
                let (mut stub, request) = (self.scheduler(), request.clone());
                async move { stub.schedule(request).await }
            })
            .await?;
        Ok(Scheduled {
            outcome: answer.outcome(),
            id: answer.id,
            deliver_at: answer.deliver_at.map(system_time).unwrap_or(UNIX_EPOCH),
            duplicate: answer.duplicate,
        })
    }

    /// Cancels a pending record and says what happened.
    pub async fn cancel(&self, id: impl Into<String>) -> Result<proto::CancelOutcome, Error> {
        let request = proto::CancelRequest { id: id.into(), ..Default::default() };
        let answer = self
            .retrying(|| {
                let (mut stub, request) = (self.scheduler(), request.clone());
                async move { stub.cancel(request).await }
            })
            .await?;
        Ok(answer.outcome())
    }

    /// Moves a pending record's due time.
    pub async fn reschedule(&self, id: impl Into<String>, at: SystemTime) -> Result<SystemTime, Error> {
        let request = proto::RescheduleRequest {
            id: id.into(),
            due: Some(proto::reschedule_request::Due::DeliverAt(timestamp(at))),
            ..Default::default()
        };
        let answer = self
            .retrying(|| {
                let (mut stub, request) = (self.scheduler(), request.clone());
                async move { stub.reschedule(request).await }
            })
            .await?;
        Ok(answer.deliver_at.map(system_time).unwrap_or(UNIX_EPOCH))
    }

    /// A record, its state and where it was delivered.
    pub async fn get(&self, id: impl Into<String>) -> Result<proto::GetResponse, Error> {
        let request = proto::GetRequest { id: id.into(), ..Default::default() };
        self.retrying(|| {
            let (mut stub, request) = (self.scheduler(), request.clone());
            async move { stub.get(request).await }
        })
        .await
    }

    /// Every page of a listing, in order.
    pub async fn list(&self, mut request: proto::ListRequest) -> Result<Vec<proto::PendingMessage>, Error> {
        let mut all = Vec::new();
        loop {
            let page = self
                .retrying(|| {
                    let (mut stub, request) = (self.scheduler(), request.clone());
                    async move { stub.list(request).await }
                })
                .await?;
            all.extend(page.messages);
            if page.next_page_token.is_empty() {
                return Ok(all);
            }
            request.page_token = page.next_page_token;
        }
    }
}

fn timestamp(at: SystemTime) -> prost_types::Timestamp {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    prost_types::Timestamp { seconds: since.as_secs() as i64, nanos: since.subsec_nanos() as i32 }
}

fn system_time(t: prost_types::Timestamp) -> SystemTime {
    UNIX_EPOCH + Duration::new(t.seconds.max(0) as u64, t.nanos.clamp(0, 999_999_999) as u32)
}

fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedule_is_the_request_it_says() {
        let at = UNIX_EPOCH + Duration::from_millis(1_795_770_010_123);
        let request = Schedule::new("reminders", "hello")
            .at(at)
            .id("r-1")
            .key("k")
            .header("source", "rust")
            .label("class", "7")
            .replace()
            .into_request();
        let message = request.message.as_ref().unwrap();
        assert_eq!((message.topic.as_str(), message.value.as_slice()), ("reminders", &b"hello"[..]));
        assert_eq!(message.key.as_deref(), Some(&b"k"[..]));
        assert_eq!(message.headers[0].key, "source");
        assert_eq!(request.id.as_deref(), Some("r-1"));
        assert_eq!(request.on_conflict(), proto::OnConflict::Replace);
        let Some(proto::schedule_request::Due::DeliverAt(t)) = request.due else { panic!("{request:?}") };
        assert_eq!(system_time(t), at);
    }

    #[test]
    fn a_refusal_carries_its_fields() {
        use tonic_types::{ErrorDetails, StatusExt as _};
        let status = Status::with_error_details(
            Code::InvalidArgument,
            "id contains ' '",
            ErrorDetails::with_bad_request_violation("id", "use printable ASCII"),
        );
        let error = Error::from(status);
        assert_eq!(error.code(), Some(Code::InvalidArgument));
        assert_eq!(
            error.violations(),
            [Violation { field: "id".into(), description: "use printable ASCII".into() }]
        );
        assert_eq!(error.to_string(), "InvalidArgument: id contains ' '");
    }
}
