//! Requests that wait for the dispatcher: parked per message while its
//! produce is under way, run again once it lets go of the message, and
//! refused when they waited too long or too many wait.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use super::ops::{Op, refuse};
use crate::{message::MessageId, store::StoreError};

/// How long a request waits for the produce of the message it touches
/// before it is told the outcome is not known yet.
const MAX_PARK: Duration = Duration::from_secs(5);
/// Requests waiting so, at most; more are told at once.
const MAX_PARKED: usize = 4096;

pub(super) struct Parked {
    pub(super) op: Op,
    since: Instant,
}

/// Requests waiting for the dispatcher to settle a message they touch.
#[derive(Default)]
pub(super) struct Parking {
    pub(super) parked: HashMap<MessageId, Vec<Parked>>,
    pub(super) parked_total: usize,
}

impl Parking {
    pub(super) fn park(&mut self, id: MessageId, op: Op) {
        if self.parked_total >= MAX_PARKED {
            refuse(op, StoreError::Dispatching(id));
            return;
        }
        self.parked_total += 1;
        self.parked.entry(id).or_default().push(Parked { op, since: Instant::now() });
    }

    pub(super) fn unpark(&mut self, id: &MessageId) -> Vec<Parked> {
        let parked = self.parked.remove(id).unwrap_or_default();
        self.parked_total -= parked.len();
        parked
    }

    /// Answers requests that waited too long for a produce's outcome, and
    /// forgets those whose caller is gone.
    pub(super) fn expire_parked(&mut self) {
        let mut expired = Vec::new();
        self.parked.retain(|id, parked| {
            parked.retain_mut(|p| {
                if p.op.abandoned() {
                    return false;
                }
                if p.since.elapsed() < MAX_PARK {
                    return true;
                }
                expired.push((id.clone(), std::mem::replace(&mut p.op, Op::Tick)));
                false
            });
            !parked.is_empty()
        });
        self.parked_total = self.parked.values().map(Vec::len).sum();
        for (id, op) in expired {
            refuse(op, StoreError::Dispatching(id));
        }
    }
}
