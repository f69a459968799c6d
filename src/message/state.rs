//! A message's states and what the API answers about one.

use super::{DeadReason, Envelope, Labels, MessageId, UnixMillis};

/// Where a delivered record landed, and when the broker acknowledged it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivery {
    pub partition: i32,
    pub offset: i64,
    pub delivered_at: UnixMillis,
}

/// Where a message that failed or expired went instead of its topic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    pub at: UnixMillis,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub reason: DeadReason,
    /// Tries of its own topic.
    pub attempts: u32,
}

/// A message's lifecycle:
///
/// ```text
/// Pending ──produce acked──► Delivered
///    │  ├─tries exhausted──► Failed ──reschedule──► Pending
///    │  ╰─deadline passed──► Expired ─reschedule──► Pending
///    │     (either, with a dead-letter topic) ──► DeadLettered ─reschedule──► Pending
///    ╰──────cancel────────► Cancelled
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    Pending {
        attempts: u32,
        last_error: Option<String>,
    },
    Delivered(Delivery),
    Cancelled {
        at: UnixMillis,
    },
    Failed {
        reason: String,
        attempts: u32,
        at: UnixMillis,
    },
    /// Its deadline passed before it could be produced.
    Expired {
        at: UnixMillis,
        deadline: UnixMillis,
    },
    /// It failed or expired, and went to its dead-letter topic.
    DeadLettered(DeadLetter),
}

/// What a cancel did, or why it did nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelOutcome {
    Cancelled,
    AlreadyDelivered,
    AlreadyCancelled,
    AlreadyFailed,
    AlreadyExpired,
    AlreadyDeadLettered,
    NotFound,
}

impl CancelOutcome {
    /// Its name in logs and the audit trail.
    pub fn name(self) -> &'static str {
        match self {
            CancelOutcome::Cancelled => "cancelled",
            CancelOutcome::AlreadyDelivered => "already_delivered",
            CancelOutcome::AlreadyCancelled => "already_cancelled",
            CancelOutcome::AlreadyFailed => "already_failed",
            CancelOutcome::AlreadyExpired => "already_expired",
            CancelOutcome::AlreadyDeadLettered => "already_dead_lettered",
            CancelOutcome::NotFound => "not_found",
        }
    }
}

/// Why a reschedule was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RescheduleRefusal {
    AlreadyDelivered,
    AlreadyCancelled,
}

impl State {
    pub fn is_pending(&self) -> bool {
        matches!(self, State::Pending { .. })
    }

    pub fn is_expired(&self) -> bool {
        matches!(self, State::Expired { .. })
    }

    /// Whether a cancel may take this message; the outcome to report if not.
    pub fn cancel(&self) -> Result<(), CancelOutcome> {
        match self {
            State::Pending { .. } => Ok(()),
            State::Delivered(_) => Err(CancelOutcome::AlreadyDelivered),
            State::Cancelled { .. } => Err(CancelOutcome::AlreadyCancelled),
            State::Failed { .. } => Err(CancelOutcome::AlreadyFailed),
            State::Expired { .. } => Err(CancelOutcome::AlreadyExpired),
            State::DeadLettered(_) => Err(CancelOutcome::AlreadyDeadLettered),
        }
    }

    /// Whether a reschedule may move this message. A failed, expired or
    /// dead-lettered message may be rescheduled: that is how an operator
    /// re-drives it to its own topic.
    pub fn reschedule(&self) -> Result<(), RescheduleRefusal> {
        match self {
            State::Pending { .. } | State::Failed { .. } | State::Expired { .. } | State::DeadLettered(_) => {
                Ok(())
            }
            State::Delivered(_) => Err(RescheduleRefusal::AlreadyDelivered),
            State::Cancelled { .. } => Err(RescheduleRefusal::AlreadyCancelled),
        }
    }
}

/// A message as `Get` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduledMessage {
    pub id: MessageId,
    pub envelope: Envelope,
    pub due: UnixMillis,
    pub scheduled_at: UnixMillis,
    pub state: State,
    /// Delivered, and its key, value and headers were not kept.
    pub body_dropped: bool,
}

/// What a schedule with an id that is taken does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnConflict {
    /// A different request under the id is refused (`ALREADY_EXISTS`);
    /// the same request is a retry, answered as the first was.
    #[default]
    Reject,
    /// A pending or failed message under the id is replaced, content and
    /// due time, in one step; a delivered or cancelled one is final, and
    /// the replace is refused: a retried or replayed older request could
    /// otherwise deliver again what was delivered.
    Replace,
}

/// What a schedule did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placed {
    /// A new message was parked.
    Created,
    /// This same request had parked it already; nothing changed.
    Duplicate,
    /// A message under the id was replaced by this one.
    Replaced,
}

/// The answer to a schedule request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scheduled {
    pub id: MessageId,
    pub due: UnixMillis,
    pub placed: Placed,
}

impl Scheduled {
    /// The id was already scheduled by this same request.
    pub fn duplicate(&self) -> bool {
        self.placed == Placed::Duplicate
    }
}

/// A pending message as a listing shows it: everything but the value and
/// the headers, so a page of them stays small.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingMessage {
    pub id: MessageId,
    pub topic: String,
    pub key: Option<Vec<u8>>,
    pub partition: Option<i32>,
    pub value_bytes: usize,
    /// The due time it was parked with (or rescheduled to).
    pub due: UnixMillis,
    /// When it is produced next: `due`, or its retry time after a failed try.
    pub dispatch_at: UnixMillis,
    pub scheduled_at: UnixMillis,
    pub attempts: u32,
    pub last_error: Option<String>,
    /// The caller's labels.
    pub labels: Labels,
    /// When it expires unproduced, if it has a deadline.
    pub deadline: Option<UnixMillis>,
    /// Its own dead-letter topic, if it names one.
    pub dead_letter_topic: Option<String>,
}
