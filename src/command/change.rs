//! A change a caller asks of a shard ([`Intent`]) and what it is answered
//! ([`Answer`]): the one vocabulary every way to a shard speaks, the store
//! of a standalone node and the log's front in a cluster alike; and the
//! message a schedule parks ([`NewMessage`]).

use super::StoreError;
use crate::message::{
    CancelOutcome, DueSpec, Envelope, Matching, MessageId, OnConflict, Scheduled, Scope, UnixMillis,
};

/// A change a caller asks of the shard's owner.
#[derive(Debug)]
pub enum Intent {
    Schedule(Box<NewMessage>),
    /// `only`: cancelled only if it still matches (else answered not
    /// found).
    Cancel {
        scope: Scope,
        id: MessageId,
        now: UnixMillis,
        only: Option<Box<Matching>>,
    },
    Reschedule {
        scope: Scope,
        id: MessageId,
        due: UnixMillis,
    },
}

impl Intent {
    pub fn schedule(msg: NewMessage) -> Intent {
        Intent::Schedule(Box::new(msg))
    }

    /// The message the change is of.
    pub fn id(&self) -> &MessageId {
        match self {
            Intent::Schedule(msg) => msg.id.id(),
            Intent::Cancel { id, .. } | Intent::Reschedule { id, .. } => id,
        }
    }
}

/// What a caller is answered.
#[derive(Debug)]
pub enum Answer {
    Scheduled(Result<Scheduled, StoreError>),
    Cancelled(Result<CancelOutcome, StoreError>),
    Rescheduled(Result<UnixMillis, StoreError>),
    /// Rows of a table written (cluster mode: a shard's table, from its
    /// owner only; every shard's, unless a later change came first).
    Rows(Result<(), StoreError>),
    /// Nobody waits on this record.
    None,
}

impl Answer {
    /// The answer to an [`Intent::Schedule`].
    pub fn scheduled(self) -> Result<Scheduled, StoreError> {
        match self {
            Answer::Scheduled(result) => result,
            other => Err(other.unexpected()),
        }
    }

    /// The answer to an [`Intent::Cancel`].
    pub fn cancelled(self) -> Result<CancelOutcome, StoreError> {
        match self {
            Answer::Cancelled(result) => result,
            other => Err(other.unexpected()),
        }
    }

    /// The answer to an [`Intent::Reschedule`].
    pub fn rescheduled(self) -> Result<UnixMillis, StoreError> {
        match self {
            Answer::Rescheduled(result) => result,
            other => Err(other.unexpected()),
        }
    }

    /// This answer, made unknown: the change was applied after another
    /// node took the shard, whose dispatcher may have settled the message
    /// first. A retry with the same id learns what came of it.
    pub(crate) fn superseded(self) -> Answer {
        let moved = || {
            StoreError::LogUnavailable(
                "the shard moved to another node while this change was made, and that node decides what came \
                 of it: retry with the same id to learn the outcome"
                    .to_owned(),
            )
        };
        match self {
            Answer::Scheduled(_) => Answer::Scheduled(Err(moved())),
            Answer::Cancelled(_) => Answer::Cancelled(Err(moved())),
            Answer::Rescheduled(_) => Answer::Rescheduled(Err(moved())),
            Answer::Rows(_) => Answer::Rows(Err(moved())),
            Answer::None => Answer::None,
        }
    }

    /// The answer to a write of rows.
    pub fn rows(self) -> Result<(), StoreError> {
        match self {
            Answer::Rows(result) => result,
            other => Err(other.unexpected()),
        }
    }

    fn unexpected(&self) -> StoreError {
        StoreError::Io(format!("the store answered a change with {self:?}"))
    }
}

/// A message to park.
#[derive(Debug)]
pub struct NewMessage {
    /// Its id, in the caller's space.
    pub id: NewId,
    /// Who asks: a retry is recognised in what the caller sees.
    pub scope: Scope,
    pub envelope: Envelope,
    pub requested: DueSpec,
    pub due: UnixMillis,
    pub now: UnixMillis,
    /// What to do when the id is taken by a different message.
    pub on_conflict: OnConflict,
}

/// The id of a message to park, and who chose it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NewId {
    /// The client's: a retry of the same request finds the message it
    /// parked.
    Client(MessageId),
    /// Made for this request: new by construction, nothing to look up.
    Generated(MessageId),
}

impl NewId {
    pub fn id(&self) -> &MessageId {
        match self {
            NewId::Client(id) | NewId::Generated(id) => id,
        }
    }
}
