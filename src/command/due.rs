//! Where a message waits in a shard's due order.

use crate::message::UnixMillis;

/// A position in a shard's due order: when the message is to be
/// dispatched (its due time, or the time of its next try after a failed
/// one), then its acceptance sequence. How the store lays it out in bytes
/// is the store's own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DispatchKey {
    pub at: UnixMillis,
    pub seq: u64,
}

impl DispatchKey {
    pub const MIN: DispatchKey = DispatchKey { at: UnixMillis(0), seq: 0 };

    /// The first key to dispatch strictly after `t`: the exclusive upper
    /// bound of everything to dispatch at or before `t`.
    pub fn after(t: UnixMillis) -> DispatchKey {
        DispatchKey { at: UnixMillis(t.0.saturating_add(1)), seq: 0 }
    }

    /// The smallest key greater than `self`.
    pub fn successor(self) -> DispatchKey {
        match self.seq.checked_add(1) {
            Some(seq) => DispatchKey { at: self.at, seq },
            None => DispatchKey { at: UnixMillis(self.at.0.saturating_add(1)), seq: 0 },
        }
    }
}
