//! The JSON the client subcommands print with `--output json`. These field
//! names are an interface: scripts read them, docs/API.md lists them, and
//! they change only by adding fields. Times are RFC 3339 in UTC with
//! milliseconds; bytes (keys, values) are base64, as in protobuf's JSON.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::Serialize;

use super::millis;
use hourglass_kafka::proto;

pub fn time(t: Option<prost_types::Timestamp>) -> Option<String> {
    t.map(|t| millis(t).to_rfc3339())
}

fn base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

pub fn text(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

/// How long before `as_of` a message was due, in milliseconds.
pub fn overdue_ms(as_of: Option<prost_types::Timestamp>, due: Option<prost_types::Timestamp>) -> u64 {
    match (as_of, due) {
        (Some(now), Some(due)) => millis(now).0.saturating_sub(millis(due).0),
        _ => 0,
    }
}

#[derive(Debug, Serialize)]
pub struct Scheduled {
    pub id: String,
    pub deliver_at: Option<String>,
    pub duplicate: bool,
    /// `created`, `duplicate` or `replaced`.
    pub outcome: &'static str,
}

impl From<proto::ScheduleResponse> for Scheduled {
    fn from(r: proto::ScheduleResponse) -> Self {
        let outcome = match r.outcome() {
            proto::ScheduleOutcome::Created => "created",
            proto::ScheduleOutcome::Duplicate => "duplicate",
            proto::ScheduleOutcome::Replaced => "replaced",
            proto::ScheduleOutcome::Unspecified => "unknown",
        };
        Scheduled { id: r.id, deliver_at: time(r.deliver_at), duplicate: r.duplicate, outcome }
    }
}

#[derive(Debug, Serialize)]
pub struct Cancelled {
    pub id: String,
    /// `cancelled`, `already_delivered`, `already_cancelled`,
    /// `already_failed`, `already_expired`, `already_dead_lettered` or
    /// `not_found`.
    pub outcome: String,
}

pub fn outcome(o: proto::CancelOutcome) -> String {
    o.as_str_name().trim_start_matches("CANCEL_OUTCOME_").to_lowercase()
}

#[derive(Debug, Serialize)]
pub struct Rescheduled {
    pub id: String,
    pub deliver_at: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct Header {
    pub key: String,
    pub value: String,
}

#[derive(Debug, Serialize)]
pub struct Delivery {
    pub partition: i32,
    pub offset: i64,
    pub delivered_at: Option<String>,
}

/// `get`: the message and its state. Fields that do not apply are null.
#[derive(Debug, Serialize)]
pub struct Message {
    pub id: String,
    /// `pending`, `delivered`, `cancelled`, `failed`, `expired` or
    /// `dead_lettered`.
    pub state: String,
    pub deliver_at: Option<String>,
    pub scheduled_at: Option<String>,
    pub attempts: u32,
    pub last_error: Option<String>,
    pub topic: String,
    pub partition: Option<i32>,
    pub key: Option<String>,
    pub value: String,
    pub headers: Vec<Header>,
    /// Delivered, and its key, value and headers were not kept: they read
    /// null, empty and none here.
    pub body_dropped: bool,
    /// Written in place, field by field.
    #[serde(flatten)]
    pub ending: Ending,
    /// Its own dead-letter topic, if it named one.
    pub dead_letter_topic: Option<String>,
    pub labels: BTreeMap<String, String>,
}

/// How a message ended, or when it will if it is not produced in time:
/// the fields that do not apply are null.
#[derive(Debug, Default, Serialize)]
pub struct Ending {
    pub delivery: Option<Delivery>,
    pub cancelled_at: Option<String>,
    pub failed_at: Option<String>,
    pub expired_at: Option<String>,
    /// When a pending message expires unproduced, or an expired one's
    /// deadline; null otherwise.
    pub deadline: Option<String>,
    /// Where a dead-lettered message went.
    pub dead_letter: Option<DeadLetter>,
}

#[derive(Debug, Serialize)]
pub struct DeadLetter {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub dead_lettered_at: Option<String>,
    /// `expired` or `failed`.
    pub reason: String,
    /// Failed: why its topic did not take it.
    pub error: Option<String>,
}

impl From<proto::GetResponse> for Message {
    fn from(m: proto::GetResponse) -> Self {
        use proto::get_response::Settlement;
        let pending = m.state() == proto::State::Pending;
        let state = m.state().as_str_name().trim_start_matches("STATE_").to_lowercase();
        let msg = m.message.unwrap_or_default();
        // The deadline of a pending message, from its due time.
        let deadline = m.max_lateness.filter(|_| pending).and_then(|late| {
            let due = m.deliver_at?;
            time(Some(prost_types::Timestamp {
                seconds: due.seconds.saturating_add(late.seconds),
                nanos: due.nanos + late.nanos,
            }))
        });
        let mut ending = Ending { deadline, ..Ending::default() };
        match m.settlement {
            Some(Settlement::Delivered(d)) => {
                ending.delivery = Some(Delivery {
                    partition: d.partition,
                    offset: d.offset,
                    delivered_at: time(d.delivered_at),
                })
            }
            Some(Settlement::Cancelled(c)) => ending.cancelled_at = time(c.cancelled_at),
            Some(Settlement::Failed(f)) => ending.failed_at = time(f.failed_at),
            Some(Settlement::Expired(e)) => {
                ending.expired_at = time(e.expired_at);
                ending.deadline = time(e.deadline);
            }
            Some(Settlement::DeadLettered(d)) => {
                ending.deadline = time(d.deadline);
                ending.dead_letter = Some(DeadLetter {
                    topic: d.topic,
                    partition: d.partition,
                    offset: d.offset,
                    dead_lettered_at: time(d.dead_lettered_at),
                    reason: d.reason,
                    error: text(d.error),
                })
            }
            None => {}
        }
        Message {
            id: m.id,
            state,
            deliver_at: time(m.deliver_at),
            scheduled_at: time(m.scheduled_at),
            attempts: m.attempts,
            last_error: text(m.last_error),
            topic: msg.topic,
            partition: msg.partition,
            key: msg.key.as_deref().map(base64),
            value: base64(&msg.value),
            headers: msg
                .headers
                .iter()
                .map(|h| Header { key: h.key.clone(), value: base64(&h.value) })
                .collect(),
            body_dropped: m.body_dropped,
            ending,
            dead_letter_topic: text(m.dead_letter_topic),
            labels: m.labels.into_iter().collect(),
        }
    }
}

/// A pending message in `list` and `stats`.
#[derive(Debug, Serialize)]
pub struct Pending {
    pub id: String,
    pub topic: String,
    pub partition: Option<i32>,
    pub key: Option<String>,
    pub value_bytes: u64,
    pub deliver_at: Option<String>,
    pub dispatch_at: Option<String>,
    pub scheduled_at: Option<String>,
    pub attempts: u32,
    pub last_error: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// When it expires unproduced; null: no deadline.
    pub deadline: Option<String>,
}

impl From<proto::PendingMessage> for Pending {
    fn from(m: proto::PendingMessage) -> Self {
        Pending {
            id: m.id,
            topic: m.topic,
            partition: m.partition,
            key: m.key.as_deref().map(base64),
            value_bytes: m.value_bytes,
            deliver_at: time(m.deliver_at),
            dispatch_at: time(m.dispatch_at),
            scheduled_at: time(m.scheduled_at),
            attempts: m.attempts,
            last_error: text(m.last_error),
            labels: m.labels.into_iter().collect(),
            deadline: time(m.deadline),
        }
    }
}

/// What one `cancel --selector` did, over every call it made.
#[derive(Debug, Default, Serialize)]
pub struct CancelledMatching {
    pub cancelled: u64,
    pub not_cancelled: Vec<NotCancelled>,
}

#[derive(Debug, Serialize)]
pub struct NotCancelled {
    pub id: String,
    /// As `cancel` says it, or `error`.
    pub outcome: String,
    pub error: Option<String>,
}

/// One page of `list`; with `--all`, one line per page.
#[derive(Debug, Serialize)]
pub struct Page {
    pub messages: Vec<Pending>,
    /// Empty on the last page.
    pub next_page_token: String,
}

impl From<proto::ListResponse> for Page {
    fn from(p: proto::ListResponse) -> Self {
        Page {
            messages: p.messages.into_iter().map(Into::into).collect(),
            next_page_token: p.next_page_token,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Overdue {
    #[serde(flatten)]
    pub message: Pending,
    /// How long past its `dispatch_at` it was at `as_of`.
    pub overdue_ms: u64,
}

/// `hourglass backup`'s answer.
#[derive(Debug, Serialize)]
pub struct Backup<'a> {
    pub dir: &'a str,
    pub shards: u32,
    pub pending: u64,
    pub taken_at: String,
}

/// `hourglass health`'s answer.
#[derive(Debug, Serialize)]
pub struct Health<'a> {
    pub service: &'a str,
    pub serving: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<&'a str>,
}

#[derive(Debug, Serialize)]
pub struct Stats {
    pub as_of: Option<String>,
    pub pending: u64,
    pub dispatching: u64,
    pub delivered: u64,
    pub cancelled: u64,
    pub failed: u64,
    pub expired: u64,
    pub dead_lettered: u64,
    pub oldest_overdue: Option<Overdue>,
    pub store_bytes: u64,
    pub max_pending: Option<u64>,
    pub held_back: Vec<HeldBack>,
}

/// A topic a dispatch policy holds back.
#[derive(Debug, Serialize)]
pub struct HeldBack {
    pub topic: String,
    /// None: the topic's policy for every tenant.
    pub tenant: Option<String>,
    /// `paused` or `rate_limited`.
    pub reason: &'static str,
    pub since: Option<String>,
    pub oldest_due: Option<String>,
}

impl From<proto::HeldBack> for HeldBack {
    fn from(h: proto::HeldBack) -> Self {
        HeldBack {
            reason: if h.reason() == proto::HeldReason::Paused { "paused" } else { "rate_limited" },
            topic: h.topic,
            tenant: (!h.tenant.is_empty()).then_some(h.tenant),
            since: time(h.since),
            oldest_due: time(h.oldest_due),
        }
    }
}

impl From<proto::StatsResponse> for Stats {
    fn from(s: proto::StatsResponse) -> Self {
        let oldest_overdue = s
            .oldest_overdue
            .map(|m| Overdue { overdue_ms: overdue_ms(s.as_of, m.dispatch_at), message: m.into() });
        Stats {
            as_of: time(s.as_of),
            pending: s.pending,
            dispatching: s.dispatching,
            delivered: s.delivered,
            cancelled: s.cancelled,
            failed: s.failed,
            expired: s.expired,
            dead_lettered: s.dead_lettered,
            oldest_overdue,
            store_bytes: s.store_bytes,
            max_pending: s.max_pending,
            held_back: s.held_back.into_iter().map(Into::into).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_json_has_every_field_and_base64_bytes() {
        let m = proto::GetResponse {
            id: "a".into(),
            message: Some(proto::Message {
                topic: "t".into(),
                key: Some(b"k".to_vec()),
                value: b"hello".to_vec(),
                headers: vec![proto::Header { key: "h".into(), value: b"x".to_vec() }],
                partition: None,
            }),
            deliver_at: Some(prost_types::Timestamp { seconds: 1, nanos: 5_000_000 }),
            state: proto::State::Pending as i32,
            ..Default::default()
        };
        let v = serde_json::to_value(Message::from(m)).unwrap();
        assert_eq!(v["state"], "pending");
        assert_eq!(v["value"], "aGVsbG8=");
        assert_eq!(v["key"], "aw==");
        assert_eq!(v["headers"][0]["value"], "eA==");
        assert_eq!(v["deliver_at"], "1970-01-01T00:00:01.005Z");
        for null in ["last_error", "partition", "delivery", "cancelled_at", "failed_at", "scheduled_at"] {
            assert!(v[null].is_null() && v.get(null).is_some(), "{null} is present and null: {v}");
        }
    }

    #[test]
    fn outcomes_are_snake_case() {
        assert_eq!(outcome(proto::CancelOutcome::AlreadyDelivered), "already_delivered");
        assert_eq!(outcome(proto::CancelOutcome::NotFound), "not_found");
    }
}
