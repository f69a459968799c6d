//! The one table from core errors to gRPC status codes.
//!
//! | situation                                                | code                |
//! |----------------------------------------------------------|---------------------|
//! | bad request field, undecodable or oversized request      | INVALID_ARGUMENT    |
//! | unknown topic, unknown id                                | NOT_FOUND           |
//! | id taken by a different message                          | ALREADY_EXISTS      |
//! | reschedule of a delivered/cancelled message              | FAILED_PRECONDITION |
//! | disk full, backlog cap, a forecast past its time budget  | RESOURCE_EXHAUSTED  |
//! | server busy: calls, streams, request memory, health watches | RESOURCE_EXHAUSTED |
//! | Kafka unreachable, shutting down, I/O error, idle stream | UNAVAILABLE         |
//! | a cancel or reschedule of a message whose produce is not yet confirmed | UNAVAILABLE |
//! | store corruption                                         | DATA_LOSS           |
//! | the caller's token does not cover the topic              | PERMISSION_DENIED   |
//! | no token, an unknown one, one revoked mid-stream, none checked | UNAUTHENTICATED |
//!
//! Nothing else in the crate builds a status: the token check, the request
//! limits and the codec hand their refusals over as an [`Error`].

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::{Error, proto, store::StoreError};

/// Response metadata of a refusal by a node that does not own the shard:
/// the shard's number.
pub(crate) const NOT_OWNER: &str = "hourglass-not-owner";

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        let message = e.to_string();
        let code = match e {
            Error::Invalid(invalid) => {
                return Status::with_error_details(
                    Code::InvalidArgument,
                    message,
                    ErrorDetails::with_bad_request_violation(invalid.field, invalid.reason),
                );
            }
            Error::Relayed { code, details, .. } => {
                return Status::with_details(Code::from_i32(code), message, details.into());
            }
            Error::Store(StoreError::NotOwner(shard)) => {
                // Marked, so that a node that forwarded it knows nothing
                // was done and sends it on to the owner.
                let mut status = Status::new(Code::Unavailable, message);
                status.metadata_mut().insert(NOT_OWNER, shard.into());
                return status;
            }
            Error::TooLarge { .. } | Error::Undecodable(_) => Code::InvalidArgument,
            Error::TopicUnknown(_) | Error::SeriesNotFound(_) => Code::NotFound,
            Error::SeriesExists(_) => Code::AlreadyExists,
            Error::NotInCluster(_) | Error::NeedsTokens(_) => Code::FailedPrecondition,
            Error::KafkaUnavailable { .. } | Error::StreamIdle(_) => Code::Unavailable,
            Error::Store(e) => store_code(&e),
            Error::Forbidden { .. }
            | Error::NotAdmin { .. }
            | Error::NotAdminOfAll { .. }
            | Error::NotOperator { .. } => Code::PermissionDenied,
            Error::NoToken
            | Error::BadToken
            | Error::Revoked { .. }
            | Error::Unchecked
            | Error::Unvouched(_) => Code::Unauthenticated,
            Error::TooManyCalls(_)
            | Error::TooManyStreams(_)
            | Error::NoRoomForStream { .. }
            | Error::RequestMemory(_)
            | Error::TooManyWatches(_)
            | Error::TooManyPolicies { .. }
            | Error::ForecastsBusy { .. }
            | Error::SeriesLimit { .. } => Code::ResourceExhausted,
        };
        Status::new(code, message)
    }
}

/// The refusal of one item of a batch or a stream: the status `Schedule`
/// would have returned for it.
pub(crate) fn item_error(e: Error) -> proto::ItemError {
    let field = match &e {
        Error::Invalid(invalid) => invalid.field.to_owned(),
        _ => String::new(),
    };
    let status = Status::from(e);
    proto::ItemError { code: status.code() as i32, message: status.message().to_owned(), field }
}

fn store_code(e: &StoreError) -> Code {
    match e {
        StoreError::NotFound(_) => Code::NotFound,
        StoreError::IdConflict(_) => Code::AlreadyExists,
        StoreError::AlreadyDelivered(_) | StoreError::AlreadyCancelled(_) => Code::FailedPrecondition,
        StoreError::Full(_) | StoreError::AtCapacity { .. } | StoreError::WalkTooLong { .. } => {
            Code::ResourceExhausted
        }
        StoreError::Closed
        | StoreError::Io(_)
        | StoreError::Dispatching(_)
        | StoreError::LogUnavailable(_)
        | StoreError::NotOwner(_) => Code::Unavailable,
        StoreError::Corrupt(_) => Code::DataLoss,
        StoreError::Forbidden { .. } => Code::PermissionDenied,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Invalid, MessageId};

    #[test]
    fn each_situation_has_its_code() {
        let id = || MessageId::parse("a").unwrap();
        let cases: Vec<(Error, Code)> = vec![
            (Invalid::new("message.value", "must not be empty").into(), Code::InvalidArgument),
            (Error::TopicUnknown("t".into()), Code::NotFound),
            (Error::KafkaUnavailable { topic: "t".into(), reason: "down".into() }, Code::Unavailable),
            (StoreError::NotFound(id()).into(), Code::NotFound),
            (StoreError::IdConflict(id()).into(), Code::AlreadyExists),
            (StoreError::AlreadyDelivered(id()).into(), Code::FailedPrecondition),
            (StoreError::AlreadyCancelled(id()).into(), Code::FailedPrecondition),
            (StoreError::Full("no space".into()).into(), Code::ResourceExhausted),
            (StoreError::AtCapacity { pending: 9 }.into(), Code::ResourceExhausted),
            (StoreError::WalkTooLong { seconds: 5 }.into(), Code::ResourceExhausted),
            (StoreError::Closed.into(), Code::Unavailable),
            (StoreError::LogUnavailable("down".into()).into(), Code::Unavailable),
            (StoreError::NotOwner(3).into(), Code::Unavailable),
            (StoreError::Dispatching(id()).into(), Code::Unavailable),
            (StoreError::Corrupt("bad block".into()).into(), Code::DataLoss),
            (Error::Forbidden { token: "a".into(), topic: "t".into() }, Code::PermissionDenied),
            (StoreError::Forbidden { token: "a".into(), topic: "t".into() }.into(), Code::PermissionDenied),
            (Error::Revoked { token: "a".into() }, Code::Unauthenticated),
            (Error::NoToken, Code::Unauthenticated),
            (Error::BadToken, Code::Unauthenticated),
            (Error::Unchecked, Code::Unauthenticated),
            (Error::Unvouched("no vouch".into()), Code::Unauthenticated),
            (
                Error::TooLarge { bytes: 8, set_by: "--max-batch-bytes", detail: "9 bytes".into() },
                Code::InvalidArgument,
            ),
            (Error::Undecodable("bad wire type".into()), Code::InvalidArgument),
            (Error::TooManyCalls(4), Code::ResourceExhausted),
            (Error::TooManyStreams(2), Code::ResourceExhausted),
            (Error::NoRoomForStream { total: 8, window: 9 }, Code::ResourceExhausted),
            (Error::RequestMemory(8), Code::ResourceExhausted),
            (Error::ForecastsBusy { waiting: 8 }, Code::ResourceExhausted),
            (
                Error::TooManyPolicies { whose: "tenant \"a\"".into(), most: 1, flag: "" },
                Code::ResourceExhausted,
            ),
            (Error::TooManyWatches(64), Code::ResourceExhausted),
            (Error::SeriesLimit { tenant: None, share: 10, max: 10 }, Code::ResourceExhausted),
            (Error::StreamIdle(std::time::Duration::from_secs(120)), Code::Unavailable),
            (
                Error::Relayed { code: Code::NotFound as i32, message: "m".into(), details: vec![] },
                Code::NotFound,
            ),
        ];
        for (error, code) in cases {
            let text = error.to_string();
            let status = Status::from(error);
            assert_eq!(status.code(), code, "{text}");
            assert_eq!(status.message(), text);
        }
    }

    #[test]
    fn invalid_argument_names_the_field() {
        let status = Status::from(Error::from(Invalid::new("message.topic", "must not be empty")));
        let details = status.get_error_details();
        let violation = &details.bad_request().expect("bad request details").field_violations[0];
        assert_eq!(violation.field, "message.topic");
        assert_eq!(violation.description, "must not be empty");
    }
}
