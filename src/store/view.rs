//! What the stored records mean: a message's state, where it waits in the
//! due index, the shapes `Get` and `List` answer with, and whether a
//! retried request is the one a record came from. [`schema`] knows the
//! bytes; this knows the domain.

use super::schema::{
    DispatchKey, HeaderRecord, LabelRecord, MessageRecord, Settlement, SettlementKind, TriesRecord,
};
use crate::message::{
    DeadLetter, DeadReason, Delivery, DueSpec, Envelope, Header, Labels, MessageId, PendingMessage,
    ScheduledMessage, State, UnixMillis, duration_ms, is_trace_header,
};

impl MessageRecord {
    /// The record of a message parked as `envelope`, due at `due`.
    pub fn new(envelope: Envelope, requested: DueSpec, due: UnixMillis, seq: u64, now: UnixMillis) -> Self {
        let (requested_at_ms, requested_delay_ms) = requested.stored();
        MessageRecord {
            topic: envelope.topic,
            key: envelope.key,
            value: envelope.value,
            headers: envelope
                .headers
                .into_iter()
                .map(|h| HeaderRecord { key: h.key, value: h.value })
                .collect(),
            partition: envelope.partition,
            labels: envelope
                .labels
                .into_pairs()
                .into_iter()
                .map(|(key, value)| LabelRecord { key, value })
                .collect(),
            due_ms: due.0,
            seq,
            scheduled_at_ms: now.0,
            requested_at_ms,
            requested_delay_ms,
            entry_at_ms: None,
            max_lateness_ms: envelope.max_lateness.map(duration_ms),
            dead_letter_topic: envelope.dead_letter_topic.clone(),
            digest: None,
        }
    }

    /// The due time as first asked for.
    pub fn requested(&self) -> DueSpec {
        DueSpec::from_stored(self.requested_at_ms, self.requested_delay_ms, self.due())
    }

    /// The message as the client sent it.
    pub fn envelope(&self) -> Envelope {
        self.clone().into_envelope()
    }

    /// The message as the client sent it, taken out of its record.
    pub fn into_envelope(self) -> Envelope {
        Envelope {
            topic: self.topic,
            key: self.key,
            value: self.value,
            headers: self.headers.into_iter().map(|h| Header { key: h.key, value: h.value }).collect(),
            partition: self.partition,
            labels: labels_of(self.labels),
            max_lateness: self.max_lateness_ms.map(std::time::Duration::from_millis),
            dead_letter_topic: self.dead_letter_topic,
        }
    }

    /// Whether `envelope` + `requested` is the request that created this
    /// record (an idempotent retry) rather than a different one.
    pub fn is_same_request(&self, envelope: &Envelope, requested: DueSpec) -> bool {
        if let Some(digest) = &self.digest {
            let asked = MessageRecord::new(envelope.clone(), requested, UnixMillis(0), 0, UnixMillis(0));
            return asked.content_digest()[..] == digest[..];
        }
        requested.stored() == (self.requested_at_ms, self.requested_delay_ms)
            && self.topic == envelope.topic
            && self.key == envelope.key
            && self.value == envelope.value
            && self.partition == envelope.partition
            && self.max_lateness_ms == envelope.max_lateness.map(duration_ms)
            && self.dead_letter_topic == envelope.dead_letter_topic
            // Trace context is not the request's content: a retry carries
            // its own span's.
            && self
                .headers
                .iter()
                .filter(|h| !is_trace_header(&h.key))
                .map(|h| (&h.key, &h.value))
                .eq(envelope.headers.iter().filter(|h| !is_trace_header(&h.key)).map(|h| (&h.key, &h.value)))
            && self.labels.len() == envelope.labels.iter().count()
            && self.labels.iter().zip(envelope.labels.iter()).all(|(a, (k, v))| a.key == k && a.value == v)
    }
}

impl MessageRecord {
    /// The SHA-256 of what [`MessageRecord::is_same_request`] compares: the
    /// request's content, trace headers left out.
    pub(super) fn content_digest(&self) -> [u8; 32] {
        use prost::Message as _;
        use sha2::Digest as _;
        let content = MessageRecord {
            topic: self.topic.clone(),
            key: self.key.clone(),
            value: self.value.clone(),
            headers: self.headers.iter().filter(|h| !is_trace_header(&h.key)).cloned().collect(),
            partition: self.partition,
            requested_at_ms: self.requested_at_ms,
            requested_delay_ms: self.requested_delay_ms,
            labels: self.labels.clone(),
            max_lateness_ms: self.max_lateness_ms,
            dead_letter_topic: self.dead_letter_topic.clone(),
            ..MessageRecord::default()
        };
        sha2::Sha256::digest(content.encode_to_vec()).into()
    }

    /// Drops the message's key, value and headers, and keeps the digest of
    /// its content instead: once its delivery is recorded. Counted.
    pub(super) fn shed(&mut self) {
        if self.digest.is_none() {
            self.digest = Some(self.content_digest().to_vec());
            self.key = None;
            self.value = Vec::new();
            self.headers = Vec::new();
            crate::metrics::DELIVERED_BODIES_DROPPED.inc();
        }
    }

    /// Whether the message's key, value and headers were dropped after its
    /// delivery.
    pub fn body_dropped(&self) -> bool {
        self.digest.is_some()
    }
}

/// Labels as a record holds them.
pub(super) fn labels_of(records: Vec<LabelRecord>) -> Labels {
    Labels::from_stored(records.into_iter().map(|l| (l.key, l.value)))
}

/// A pending message as a listing shows it, from its due entry.
pub(super) fn pending_message(
    id: MessageId,
    key: DispatchKey,
    record: MessageRecord,
    tries: Option<&TriesRecord>,
) -> PendingMessage {
    PendingMessage {
        id,
        value_bytes: record.value.len(),
        due: record.due(),
        dispatch_at: key.at,
        scheduled_at: UnixMillis(record.scheduled_at_ms),
        attempts: tries.map_or(0, |t| t.attempts),
        last_error: tries.filter(|t| !t.last_error.is_empty()).map(|t| t.last_error.clone()),
        deadline: record.max_lateness_ms.map(|late| UnixMillis(record.due_ms.saturating_add(late))),
        dead_letter_topic: record.dead_letter_topic,
        topic: record.topic,
        key: record.key,
        partition: record.partition,
        labels: labels_of(record.labels),
    }
}

/// Where the message waits in the due CF now: where its record says its
/// entry is; else (a record written before 0.2) its due time, or the time
/// of its next try after a failed one.
pub(super) fn dispatch_key(record: &MessageRecord, settlement: Option<&Settlement>) -> DispatchKey {
    if let Some(at) = record.entry_at_ms {
        return DispatchKey { at: UnixMillis(at), seq: record.seq };
    }
    let due = match settlement {
        Some(s) if s.kind() == SettlementKind::Retrying && s.retry_at_ms > 0 => s.retry_at_ms,
        _ => record.due_ms,
    };
    DispatchKey { at: UnixMillis(due), seq: record.seq }
}

pub(super) fn state_of(settlement: Option<&Settlement>) -> State {
    let Some(s) = settlement else {
        return State::Pending { attempts: 0, last_error: None };
    };
    let last_error = (!s.last_error.is_empty()).then(|| s.last_error.clone());
    match s.kind() {
        SettlementKind::Retrying => State::Pending { attempts: s.attempts, last_error },
        SettlementKind::Delivered => State::Delivered(Delivery {
            partition: s.partition,
            offset: s.offset,
            delivered_at: UnixMillis(s.at_ms),
        }),
        SettlementKind::Cancelled => State::Cancelled { at: UnixMillis(s.at_ms) },
        SettlementKind::Failed => {
            State::Failed { reason: s.last_error.clone(), attempts: s.attempts, at: UnixMillis(s.at_ms) }
        }
        SettlementKind::Expired => {
            State::Expired { at: UnixMillis(s.at_ms), deadline: UnixMillis(s.deadline_ms) }
        }
        SettlementKind::DeadLettered => State::DeadLettered(DeadLetter {
            at: UnixMillis(s.at_ms),
            topic: s.dead_letter_topic.clone(),
            partition: s.partition,
            offset: s.offset,
            reason: match s.deadline_ms {
                0 => DeadReason::Failed { error: s.last_error.clone() },
                deadline => DeadReason::Expired { deadline: UnixMillis(deadline) },
            },
            attempts: s.attempts,
        }),
    }
}

pub(super) fn scheduled_message(
    id: MessageId,
    record: &MessageRecord,
    settlement: Option<&Settlement>,
) -> ScheduledMessage {
    ScheduledMessage {
        id,
        envelope: record.envelope(),
        due: record.due(),
        scheduled_at: UnixMillis(record.scheduled_at_ms),
        state: state_of(settlement),
        body_dropped: record.body_dropped(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn record() -> MessageRecord {
        let envelope = Envelope {
            topic: "t".into(),
            key: None,
            value: b"v".to_vec(),
            headers: vec![],
            partition: None,
            labels: Default::default(),
            max_lateness: None,
            dead_letter_topic: None,
        };
        MessageRecord::new(
            envelope,
            DueSpec::After(Duration::from_secs(30)),
            UnixMillis(100),
            3,
            UnixMillis(70),
        )
    }

    #[test]
    fn a_retry_under_another_trace_is_the_same_request() {
        let r = record();
        let mut retried = r.envelope();
        let trace = |span: &str| format!("00-0af7651916cd43dd8448eb211c80319c-{span}-01").into_bytes();
        retried.headers.push(Header { key: "traceparent".into(), value: trace("b7ad6b7169203331") });
        assert!(r.is_same_request(&retried, DueSpec::After(Duration::from_secs(30))));
        let mut traced = MessageRecord::new(
            retried.clone(),
            DueSpec::After(Duration::from_secs(30)),
            UnixMillis(100),
            3,
            UnixMillis(70),
        );
        retried.headers.last_mut().unwrap().value = trace("c7ad6b7169203332");
        assert!(traced.is_same_request(&retried, DueSpec::After(Duration::from_secs(30))));
        // Any other header still tells requests apart.
        traced.headers.push(HeaderRecord { key: "source".into(), value: b"x".to_vec() });
        assert!(!traced.is_same_request(&retried, DueSpec::After(Duration::from_secs(30))));
    }

    #[test]
    fn a_different_request_is_not_the_same() {
        let r = record();
        let same = r.envelope();
        assert!(r.is_same_request(&same, DueSpec::After(Duration::from_secs(30))));
        assert!(!r.is_same_request(&same, DueSpec::After(Duration::from_secs(31))));
        assert!(!r.is_same_request(&same, DueSpec::At(UnixMillis(30_000))));
        let mut other = same.clone();
        other.value = b"w".to_vec();
        assert!(!r.is_same_request(&other, DueSpec::After(Duration::from_secs(30))));
        let mut other = same;
        other.key = Some(vec![]);
        assert!(
            !r.is_same_request(&other, DueSpec::After(Duration::from_secs(30))),
            "empty key is not no key"
        );
    }

    #[test]
    fn dispatch_key_follows_retries() {
        let r = record();
        assert_eq!(dispatch_key(&r, None), DispatchKey { at: UnixMillis(100), seq: 3 });
        let retrying = Settlement { retry_at_ms: 900, attempts: 1, ..Default::default() };
        assert_eq!(dispatch_key(&r, Some(&retrying)), DispatchKey { at: UnixMillis(900), seq: 3 });
    }

    #[test]
    fn state_follows_settlement() {
        assert_eq!(state_of(None), State::Pending { attempts: 0, last_error: None });
        let retrying = Settlement { attempts: 2, last_error: "timed out".into(), ..Default::default() };
        assert_eq!(
            state_of(Some(&retrying)),
            State::Pending { attempts: 2, last_error: Some("timed out".into()) }
        );
        let delivered = Settlement {
            kind: SettlementKind::Delivered as i32,
            partition: 2,
            offset: 9,
            at_ms: 5,
            ..Default::default()
        };
        assert_eq!(
            state_of(Some(&delivered)),
            State::Delivered(Delivery { partition: 2, offset: 9, delivered_at: UnixMillis(5) })
        );
        assert!(delivered.is_settled() && !retrying.is_settled());
    }
}
