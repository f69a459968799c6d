//! The core's error: every situation a request can end in other than
//! success. `api::status` maps each one to a gRPC status in one table.

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
    /// The call's credentials no longer hold (a token revoked mid-stream),
    /// or were never checked.
    #[error("{0}")]
    Unauthenticated(String),
}

impl From<CatalogError> for Error {
    fn from(e: CatalogError) -> Self {
        match e {
            CatalogError::Unknown(topic) => Error::TopicUnknown(topic),
            CatalogError::Unreachable { topic, reason } => Error::KafkaUnavailable { topic, reason },
        }
    }
}
