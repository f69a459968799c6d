//! The one table from core errors to gRPC status codes.
//!
//! | situation                                   | code                |
//! |---------------------------------------------|---------------------|
//! | bad request field                           | INVALID_ARGUMENT    |
//! | unknown topic, unknown id                   | NOT_FOUND           |
//! | id taken by a different message             | ALREADY_EXISTS      |
//! | reschedule of a delivered/cancelled message | FAILED_PRECONDITION |
//! | disk full, backlog cap, server busy         | RESOURCE_EXHAUSTED  |
//! | Kafka unreachable, shutting down, I/O error | UNAVAILABLE         |
//! | a cancel or reschedule of a message whose produce is not yet confirmed | UNAVAILABLE |
//! | store corruption                            | DATA_LOSS           |
//! | the caller's token does not cover the topic | PERMISSION_DENIED   |
//! | a token revoked while its stream was open   | UNAUTHENTICATED     |
//!
//! A missing or unknown token never gets this far: `auth` refuses it with
//! UNAUTHENTICATED before the call is read.

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::{Error, proto, store::StoreError};

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        let message = e.to_string();
        match e {
            Error::Invalid(invalid) => Status::with_error_details(
                Code::InvalidArgument,
                message,
                ErrorDetails::with_bad_request_violation(invalid.field, invalid.reason),
            ),
            Error::TopicUnknown(_) => Status::not_found(message),
            Error::KafkaUnavailable { .. } => Status::unavailable(message),
            Error::Store(e) => Status::new(store_code(&e), message),
            Error::Forbidden { .. } => Status::permission_denied(message),
            Error::Unauthenticated(_) => Status::unauthenticated(message),
        }
    }
}

/// The refusal of one item of a batch or a stream: the status `Schedule`
/// would have returned for it.
pub fn item_error(e: Error) -> proto::ItemError {
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
        StoreError::Full(_) | StoreError::AtCapacity { .. } => Code::ResourceExhausted,
        StoreError::Closed | StoreError::Io(_) | StoreError::Dispatching(_) => Code::Unavailable,
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
            (StoreError::Closed.into(), Code::Unavailable),
            (StoreError::Dispatching(id()).into(), Code::Unavailable),
            (StoreError::Corrupt("bad block".into()).into(), Code::DataLoss),
            (Error::Forbidden { token: "a".into(), topic: "t".into() }, Code::PermissionDenied),
            (StoreError::Forbidden { token: "a".into(), topic: "t".into() }.into(), Code::PermissionDenied),
            (Error::Unauthenticated("revoked".into()), Code::Unauthenticated),
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
