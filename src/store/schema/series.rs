//! The series' keys in the checkpoint CF: a series by its id, and its next
//! wake by time (the layout is drawn at the top of the schema).

use super::{SERIES_PREFIX, SERIES_WAKE_PREFIX};
use crate::message::{MessageId, UnixMillis};

/// Where a series is kept, by its id (in its tenant's space).
pub fn series_key(id: &MessageId) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + id.as_bytes().len());
    k.push(SERIES_PREFIX);
    k.extend_from_slice(id.as_bytes());
    k
}

/// The first key of the series of a space (every series: an empty prefix).
pub fn series_prefix(space: &[u8]) -> Vec<u8> {
    let mut k = vec![SERIES_PREFIX];
    k.extend_from_slice(space);
    k
}

/// The series id of a series key.
pub fn decode_series_key(key: &[u8]) -> Option<MessageId> {
    MessageId::from_stored(key.strip_prefix(&[SERIES_PREFIX])?)
}

/// When series `id` next parks an occurrence.
pub fn series_wake_key(at: UnixMillis, id: &MessageId) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + id.as_bytes().len());
    k.push(SERIES_WAKE_PREFIX);
    k.extend_from_slice(&at.0.to_be_bytes());
    k.extend_from_slice(id.as_bytes());
    k
}

/// The first wake key after every wake at or before `t`.
pub fn series_wake_bound(t: UnixMillis) -> Vec<u8> {
    let mut k = vec![SERIES_WAKE_PREFIX];
    k.extend_from_slice(&t.0.saturating_add(1).to_be_bytes());
    k
}

/// The first wake key of all.
pub fn series_wake_start() -> Vec<u8> {
    vec![SERIES_WAKE_PREFIX]
}

/// The first key after every wake key.
pub fn series_wake_end() -> Vec<u8> {
    vec![SERIES_WAKE_PREFIX + 1]
}

pub fn decode_series_wake_key(key: &[u8]) -> Option<(UnixMillis, MessageId)> {
    let rest = key.strip_prefix(&[SERIES_WAKE_PREFIX])?;
    if rest.len() <= 8 {
        return None;
    }
    let (at, id) = rest.split_at(8);
    Some((UnixMillis(u64::from_be_bytes(at.try_into().ok()?)), MessageId::from_stored(id)?))
}
