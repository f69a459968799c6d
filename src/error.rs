//! The core's error: every situation a request can end in other than
//! success, from a bad field to a full server. `status` maps each one
//! to a gRPC status in one table; nothing else builds a status.

use std::time::Duration;

use crate::{kafka::CatalogError, message::Invalid, store::StoreError};

#[derive(Clone, Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Invalid(#[from] Invalid),
    #[error("topic {0:?} does not exist on the Kafka cluster; create it first")]
    TopicUnknown(String),
    #[error("cannot check topic {topic:?} because Kafka is unreachable ({reason}); try again")]
    KafkaUnavailable { topic: String, reason: String },
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The caller's token does not cover the topic (see `auth`).
    #[error(
        "the token {token:?} may not use topic {topic:?}; the tokens file (--auth-tokens) lists its topics"
    )]
    Forbidden { token: String, topic: String },
    /// The caller's token has no `admin` in the tokens file.
    #[error(
        "the token {token:?} may not change dispatch policies; give it `admin = \"tenant\"` (or \"all\") in \
         the tokens file (--auth-tokens)"
    )]
    NotAdmin { token: String },
    /// A tenant admin asked for a policy of every tenant.
    #[error(
        "the token {token:?} may set policies for its own tenant only (admin = \"tenant\"); a policy for every \
         tenant (all_tenants) needs admin = \"all\""
    )]
    NotAdminOfAll { token: String },
    /// What only an operator may do (see the server's own state, name
    /// another tenant's message, policy or series) asked for without
    /// `admin = "all"`.
    #[error(
        "the token {token:?} is not an operator: the cluster's nodes and shards, and other tenants' messages, \
         policies and series, need `admin = \"all\"` in the tokens file (--auth-tokens)"
    )]
    NotOperator { token: String },
    #[error("no bearer token: send the header `authorization: Bearer <token>`")]
    NoToken,
    #[error("the bearer token is not valid")]
    BadToken,
    /// Cluster mode: a call marked as passed on by another node that no
    /// node vouches for as it should.
    #[error("a call passed on by another node was refused: {0}")]
    Unvouched(String),
    /// A token revoked by a reload while its stream was open.
    #[error("the token {token:?} was revoked (the tokens file was reloaded); this call ends")]
    Revoked { token: String },
    /// A call that reached the service without passing the token check (a
    /// wiring bug): refused, not let in.
    #[error("the server checked no credentials for this call; it is refused")]
    Unchecked,
    /// A request larger than the server reads.
    #[error(
        "the request is larger than the server reads: at most {bytes} bytes, set by {set_by}; split it ({detail})"
    )]
    TooLarge { bytes: usize, set_by: &'static str, detail: String },
    #[error("the message does not decode as this method's protobuf type: {0}")]
    Undecodable(String),
    #[error(
        "the server is busy: it already serves {0} calls (--max-concurrent-requests); retry with backoff"
    )]
    TooManyCalls(usize),
    #[error("the server already has {0} streams open, half of --max-concurrent-requests; retry with backoff")]
    TooManyStreams(usize),
    #[error(
        "the server's memory for requests ({total} bytes, --max-request-memory) has no room for another \
         stream's window ({window} bytes); retry with backoff"
    )]
    NoRoomForStream { total: usize, window: usize },
    #[error("the server already holds {0} bytes of requests (--max-request-memory); retry with backoff")]
    RequestMemory(usize),
    #[error(
        "{0} health Watch streams are open, the most this server keeps (--max-health-watches); use Check, \
         or watch from fewer places"
    )]
    TooManyWatches(usize),
    /// Cluster mode: the answer of the node a request was forwarded to,
    /// passed on as it came (its code, message and details).
    #[error("{message}")]
    Relayed { code: i32, message: String, details: Vec<u8> },
    /// Forecasts take turns on a node, and enough wait already (or this
    /// one waited as long as it may).
    #[error(
        "this node is busy with other forecasts (one runs at a time, at most {waiting} wait their turn); retry \
         shortly"
    )]
    ForecastsBusy { waiting: usize },
    /// A new dispatch policy past its owner's room.
    #[error(
        "{whose} already keeps {most} dispatch policies, the most it may{flag}; remove one first (ResumeTopic \
         and clearing its limit, deadline and dead-letter topic remove a policy)"
    )]
    TooManyPolicies { whose: String, most: usize, flag: &'static str },
    /// A call that writes where its caller names, on a server that checks
    /// no tokens.
    #[error(
        "{0} writes files where it is told, so it needs an operator's token, and this server checks none: \
         start it with --auth-tokens and a token with admin = \"all\""
    )]
    NeedsTokens(&'static str),
    /// A call a cluster does not serve, and what to do instead.
    #[error("{0}")]
    NotInCluster(&'static str),
    #[error("no series {0:?} (never created, or deleted)")]
    SeriesNotFound(String),
    #[error("series {0:?} exists with a different definition; UpdateSeries changes it, or choose another id")]
    SeriesExists(String),
    /// A tenant (the whole server, without tokens) has as many series as
    /// it may: `share` of --series-max-per-tenant's `max` on this node.
    #[error(
        "{} already has {share} series, the most it may have{}; delete series it no longer needs, or raise \
         --series-max-per-tenant (now {max})",
        .tenant.as_deref().map_or_else(|| "the server".to_owned(), |t| format!("tenant {t:?}")),
        if .share < .max { " on this node (its share of its shards)" } else { "" }
    )]
    SeriesLimit { tenant: Option<String>, share: usize, max: usize },
    #[error("the stream sent nothing for {}, so the server ended it; open a new one to go on", humantime::format_duration(*.0))]
    StreamIdle(Duration),
}

impl From<CatalogError> for Error {
    fn from(e: CatalogError) -> Self {
        match e {
            CatalogError::Unknown(topic) => Error::TopicUnknown(topic),
            CatalogError::Unreachable { topic, reason } => Error::KafkaUnavailable { topic, reason },
        }
    }
}
