//! Conversions between the wire types (`proto`) and the domain. Everything a
//! request carries is checked for shape here; what it means is checked by
//! the service.

use std::time::Duration;

use crate::{
    message::{
        CancelOutcome, DeadReason, Delivery, DueSpec, Envelope, Forecast, ForecastQuery, Header, Invalid,
        LAST_TIMESTAMP_SECOND, Labels, ListQuery, Matching, MessageId, OnConflict, PageToken, PendingMessage,
        PendingPage, Placed, Scheduled, ScheduledMessage, Selector, State, Stats, UnixMillis, Window,
    },
    node::{Picture, Role},
    proto,
    service::ScheduleCommand,
};

pub fn timestamp(t: UnixMillis) -> prost_types::Timestamp {
    t.to_timestamp()
}

/// A wire timestamp as Unix milliseconds, rounded up so that a due time is
/// never moved earlier. Times before 1970 count as "in the past".
fn unix_millis(field: &'static str, t: prost_types::Timestamp) -> Result<UnixMillis, Invalid> {
    if !(0..1_000_000_000).contains(&t.nanos) {
        return Err(Invalid::new(field, format!("has nanos {} outside 0..1e9", t.nanos)));
    }
    if t.seconds < 0 {
        return Ok(UnixMillis(0));
    }
    let millis = (t.seconds as u64).saturating_mul(1000).saturating_add((t.nanos as u64).div_ceil(1_000_000));
    Ok(UnixMillis(millis))
}

fn delay(d: prost_types::Duration) -> Result<Duration, Invalid> {
    if d.seconds < 0 || d.nanos < 0 {
        return Err(Invalid::new("delay", "must not be negative; use deliver_at for a past time"));
    }
    if d.nanos >= 1_000_000_000 {
        return Err(Invalid::new("delay", format!("has nanos {} outside 0..1e9", d.nanos)));
    }
    Ok(Duration::new(d.seconds as u64, d.nanos as u32))
}

/// A deadline past the due time, in whole milliseconds (rounded up, so
/// that a message is never expired sooner than asked); zero or unset: none.
pub fn max_lateness(d: Option<prost_types::Duration>) -> Result<Option<Duration>, Invalid> {
    millis("max_lateness", d)
}

/// A duration field in whole milliseconds (rounded up); zero or unset: none.
fn millis(field: &'static str, d: Option<prost_types::Duration>) -> Result<Option<Duration>, Invalid> {
    let Some(d) = d else { return Ok(None) };
    if d.seconds < 0 || d.nanos < 0 {
        return Err(Invalid::new(field, "must not be negative; leave it unset for the default"));
    }
    if d.nanos >= 1_000_000_000 {
        return Err(Invalid::new(field, format!("has nanos {} outside 0..1e9", d.nanos)));
    }
    let ms = (d.seconds as u64).saturating_mul(1000).saturating_add((d.nanos as u64).div_ceil(1_000_000));
    Ok((ms > 0).then(|| Duration::from_millis(ms)))
}

pub fn wire_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: d.subsec_nanos() as i32,
    }
}

/// A due time as a request gives it. One past 9999-12-31T23:59:59Z (the
/// last a Timestamp holds), or a delay longer than the time from 1970 to
/// then, is refused as beyond any --max-delay: taken in, it would saturate
/// to a time no answer could give back.
pub fn due_spec<D: Into<Option<WireDue>>>(due: D) -> Result<DueSpec, Invalid> {
    let beyond = |given: String| {
        Invalid::new(
            "due",
            format!(
                "is past 9999-12-31T23:59:59Z, the last time a Timestamp holds ({given}); pick an earlier time"
            ),
        )
    };
    match due.into() {
        Some(WireDue::DeliverAt(t)) => {
            let at = unix_millis("deliver_at", t)?;
            if t.seconds > LAST_TIMESTAMP_SECOND {
                return Err(beyond(format!("deliver_at is {} s after 1970", t.seconds)));
            }
            Ok(DueSpec::At(at))
        }
        Some(WireDue::Delay(d)) => {
            let after = delay(d)?;
            if d.seconds > LAST_TIMESTAMP_SECOND {
                return Err(beyond(format!("delay is {} s", d.seconds)));
            }
            Ok(DueSpec::After(after))
        }
        None => Err(Invalid::new("due", "is missing; set deliver_at (a time) or delay (a duration)")),
    }
}

/// Checks the shape of a client's id; the service places it in the
/// caller's id space.
pub fn check_id(id: &str) -> Result<(), Invalid> {
    MessageId::parse(id).map(|_| ())
}

/// The `due` oneof, shared by schedule and reschedule requests.
pub enum WireDue {
    DeliverAt(prost_types::Timestamp),
    Delay(prost_types::Duration),
}

impl From<proto::schedule_request::Due> for WireDue {
    fn from(d: proto::schedule_request::Due) -> Self {
        match d {
            proto::schedule_request::Due::DeliverAt(t) => WireDue::DeliverAt(t),
            proto::schedule_request::Due::Delay(d) => WireDue::Delay(d),
        }
    }
}

impl From<proto::reschedule_request::Due> for WireDue {
    fn from(d: proto::reschedule_request::Due) -> Self {
        match d {
            proto::reschedule_request::Due::DeliverAt(t) => WireDue::DeliverAt(t),
            proto::reschedule_request::Due::Delay(d) => WireDue::Delay(d),
        }
    }
}

impl From<proto::Message> for Envelope {
    fn from(m: proto::Message) -> Self {
        Envelope {
            topic: m.topic,
            key: m.key,
            value: m.value,
            headers: m.headers.into_iter().map(|h| Header { key: h.key, value: h.value }).collect(),
            partition: m.partition,
            labels: Labels::default(),
            max_lateness: None,
            dead_letter_topic: None,
        }
    }
}

impl From<Envelope> for proto::Message {
    fn from(e: Envelope) -> Self {
        proto::Message {
            topic: e.topic,
            key: e.key,
            value: e.value,
            headers: e.headers.into_iter().map(|h| proto::Header { key: h.key, value: h.value }).collect(),
            partition: e.partition,
        }
    }
}

impl TryFrom<proto::ScheduleRequest> for ScheduleCommand {
    type Error = Invalid;

    fn try_from(r: proto::ScheduleRequest) -> Result<Self, Invalid> {
        let message = r.message.ok_or_else(|| Invalid::new("message", "is missing"))?;
        if let Some(id) = &r.id {
            check_id(id)?;
        }
        let on_conflict = match proto::OnConflict::try_from(r.on_conflict) {
            Ok(proto::OnConflict::Unspecified | proto::OnConflict::Reject) => OnConflict::Reject,
            Ok(proto::OnConflict::Replace) if r.id.is_none() => {
                return Err(Invalid::new(
                    "on_conflict",
                    "is REPLACE without an id: a replace names the message it replaces; set id",
                ));
            }
            Ok(proto::OnConflict::Replace) => OnConflict::Replace,
            Err(_) => {
                return Err(Invalid::new(
                    "on_conflict",
                    format!("is {}, not one of REJECT (1) and REPLACE (2)", r.on_conflict),
                ));
            }
        };
        let mut envelope = Envelope::from(message);
        envelope.labels = Labels::new(r.labels)?;
        envelope.max_lateness = max_lateness(r.max_lateness)?;
        envelope.dead_letter_topic = (!r.dead_letter_topic.is_empty()).then_some(r.dead_letter_topic);
        Ok(ScheduleCommand { id: r.id, envelope, due: due_spec(r.due.map(WireDue::from))?, on_conflict })
    }
}

impl From<Scheduled> for proto::ScheduleResponse {
    fn from(s: Scheduled) -> Self {
        proto::ScheduleResponse {
            id: s.id.to_string(),
            deliver_at: Some(timestamp(s.due)),
            duplicate: s.duplicate(),
            outcome: match s.placed {
                Placed::Created => proto::ScheduleOutcome::Created,
                Placed::Duplicate => proto::ScheduleOutcome::Duplicate,
                Placed::Replaced => proto::ScheduleOutcome::Replaced,
            } as i32,
        }
    }
}

impl From<CancelOutcome> for proto::CancelOutcome {
    fn from(o: CancelOutcome) -> Self {
        match o {
            CancelOutcome::Cancelled => proto::CancelOutcome::Cancelled,
            CancelOutcome::AlreadyDelivered => proto::CancelOutcome::AlreadyDelivered,
            CancelOutcome::AlreadyCancelled => proto::CancelOutcome::AlreadyCancelled,
            CancelOutcome::AlreadyFailed => proto::CancelOutcome::AlreadyFailed,
            CancelOutcome::AlreadyExpired => proto::CancelOutcome::AlreadyExpired,
            CancelOutcome::AlreadyDeadLettered => proto::CancelOutcome::AlreadyDeadLettered,
            CancelOutcome::NotFound => proto::CancelOutcome::NotFound,
        }
    }
}

impl From<ScheduledMessage> for proto::GetResponse {
    fn from(m: ScheduledMessage) -> Self {
        use proto::get_response::Settlement;
        let mut out = proto::GetResponse {
            tenant: m.id.tenant().unwrap_or_default().to_owned(),
            id: m.id.to_string(),
            labels: wire_labels(&m.envelope.labels),
            max_lateness: m.envelope.max_lateness.map(wire_duration),
            dead_letter_topic: m.envelope.dead_letter_topic.clone().unwrap_or_default(),
            message: Some(m.envelope.into()),
            // 0: a refused Kafka-native record that said no due time.
            deliver_at: (m.due != UnixMillis(0)).then(|| timestamp(m.due)),
            scheduled_at: Some(timestamp(m.scheduled_at)),
            body_dropped: m.body_dropped,
            ..Default::default()
        };
        let state = match m.state {
            State::Pending { attempts, last_error } => {
                out.attempts = attempts;
                out.last_error = last_error.unwrap_or_default();
                proto::State::Pending
            }
            State::Delivered(Delivery { partition, offset, delivered_at }) => {
                out.settlement = Some(Settlement::Delivered(proto::Delivery {
                    partition,
                    offset,
                    delivered_at: Some(timestamp(delivered_at)),
                }));
                proto::State::Delivered
            }
            State::Cancelled { at } => {
                out.settlement =
                    Some(Settlement::Cancelled(proto::Cancellation { cancelled_at: Some(timestamp(at)) }));
                proto::State::Cancelled
            }
            State::Failed { reason, attempts, at } => {
                out.attempts = attempts;
                out.last_error = reason.clone();
                out.settlement =
                    Some(Settlement::Failed(proto::Failure { reason, failed_at: Some(timestamp(at)) }));
                proto::State::Failed
            }
            State::Expired { at, deadline } => {
                out.settlement = Some(Settlement::Expired(proto::Expiry {
                    expired_at: Some(timestamp(at)),
                    deadline: Some(timestamp(deadline)),
                }));
                proto::State::Expired
            }
            State::DeadLettered(d) => {
                out.attempts = d.attempts;
                let (error, deadline) = match d.reason {
                    DeadReason::Failed { ref error } => (error.clone(), None),
                    DeadReason::Expired { deadline } => (String::new(), Some(timestamp(deadline))),
                };
                out.last_error = error.clone();
                out.settlement = Some(Settlement::DeadLettered(proto::DeadLetter {
                    dead_lettered_at: Some(timestamp(d.at)),
                    reason: d.reason.name().to_owned(),
                    topic: d.topic,
                    partition: d.partition,
                    offset: d.offset,
                    error,
                    deadline,
                }));
                proto::State::DeadLettered
            }
        };
        out.set_state(state);
        out
    }
}

impl TryFrom<proto::ListRequest> for ListQuery {
    type Error = Invalid;

    #[allow(deprecated)]
    fn try_from(r: proto::ListRequest) -> Result<Self, Invalid> {
        let (from_field, from) = either("dispatch_from", r.dispatch_from, "due_from", r.due_from)?;
        let (to_field, to) = either("dispatch_to", r.dispatch_to, "due_to", r.due_to)?;
        // Checked here, where the names the caller used are known.
        if let (Some(from), Some(to)) = (from, to)
            && to <= from
        {
            return Err(Invalid::new(
                to_field,
                format!("{} is not after {from_field} {}", to.to_rfc3339(), from.to_rfc3339()),
            ));
        }
        Ok(ListQuery {
            topic: (!r.topic.is_empty()).then_some(r.topic),
            from,
            to,
            page_size: r.page_size,
            page_token: (!r.page_token.is_empty()).then(|| PageToken::decode(&r.page_token)).transpose()?,
            selector: Selector::parse("selector", &r.selector)?,
        })
    }
}

/// What a `Cancel` asks the message still be (its `selector` and
/// `topic`); none when it names neither.
pub fn matching(r: &proto::CancelRequest) -> Result<Option<Matching>, Invalid> {
    if r.selector.trim().is_empty() && r.topic.is_empty() {
        return Ok(None);
    }
    Ok(Some(Matching {
        selector: Selector::parse("selector", &r.selector)?,
        topic: (!r.topic.is_empty()).then(|| r.topic.clone()),
    }))
}

impl TryFrom<proto::ForecastRequest> for ForecastQuery {
    type Error = Invalid;

    fn try_from(r: proto::ForecastRequest) -> Result<Self, Invalid> {
        Ok(ForecastQuery {
            topic: (!r.topic.is_empty()).then_some(r.topic),
            from: r.from.map(|t| unix_millis("from", t)).transpose()?,
            to: r.to.map(|t| unix_millis("to", t)).transpose()?,
            interval: millis("interval", r.interval)?,
        })
    }
}

impl From<Forecast> for proto::ForecastResponse {
    fn from(f: Forecast) -> Self {
        let totals = f.totals();
        let mut topics: Vec<proto::TopicForecast> = f
            .topics
            .into_iter()
            .map(|(topic, counts)| proto::TopicForecast { topic, total: counts.iter().sum(), counts })
            .collect();
        // Most first; by name among equals (the map's order, kept).
        topics.sort_by_key(|t| std::cmp::Reverse(t.total));
        proto::ForecastResponse {
            from: Some(timestamp(f.window.from)),
            to: Some(timestamp(f.window.to)),
            interval: Some(wire_duration(Duration::from_millis(f.window.interval_ms))),
            totals,
            topics,
            counted_to: f.counted_to.map(timestamp),
        }
    }
}

impl From<Picture> for proto::DescribeClusterResponse {
    fn from(p: Picture) -> Self {
        let role = |r| match r {
            Role::Owner => proto::CopyRole::Owner,
            Role::Standby => proto::CopyRole::Standby,
            Role::Taking => proto::CopyRole::Taking,
            Role::LettingGo => proto::CopyRole::LettingGo,
        };
        let node = proto::NodeStatus {
            addr: p.addr,
            as_of: Some(timestamp(p.as_of)),
            copies: p
                .copies
                .into_iter()
                .map(|c| proto::ShardCopy {
                    shard: c.shard,
                    role: role(c.role).into(),
                    pending: c.pending,
                    applied: c.applied,
                    log_end: c.log_end,
                })
                .collect(),
            moves: p
                .moves
                .into_iter()
                .map(|m| proto::ShardMove {
                    at: Some(timestamp(m.at)),
                    shard: m.shard,
                    what: m.what.to_owned(),
                })
                .collect(),
        };
        proto::DescribeClusterResponse {
            cluster: p.cluster,
            shards: p.shards,
            nodes: vec![node],
            unanswered: Vec::new(),
        }
    }
}

/// Another node's forecast, to add to this one's.
impl TryFrom<proto::ForecastResponse> for Forecast {
    type Error = Invalid;

    fn try_from(r: proto::ForecastResponse) -> Result<Self, Invalid> {
        let missing = |field| Invalid::new(field, "is missing from a node's forecast");
        let window = Window {
            from: unix_millis("from", r.from.ok_or_else(|| missing("from"))?)?,
            to: unix_millis("to", r.to.ok_or_else(|| missing("to"))?)?,
            interval_ms: millis("interval", r.interval)?.ok_or_else(|| missing("interval"))?.as_millis()
                as u64,
        };
        let mut forecast = Forecast::new(window);
        for t in r.topics {
            if t.counts.len() != window.intervals() {
                return Err(Invalid::new("topics", "a node counted into other intervals"));
            }
            forecast.topics.insert(t.topic, t.counts);
        }
        forecast.stop_at(r.counted_to.map(|t| unix_millis("counted_to", t)).transpose()?);
        Ok(forecast)
    }
}

/// A time given under its name or under its deprecated one (not both), and
/// the name it came under.
fn either(
    name: &'static str,
    value: Option<prost_types::Timestamp>,
    deprecated: &'static str,
    old: Option<prost_types::Timestamp>,
) -> Result<(&'static str, Option<UnixMillis>), Invalid> {
    match (value, old) {
        (Some(_), Some(_)) => {
            Err(Invalid::new(deprecated, format!("is the deprecated name of {name}; set only {name}")))
        }
        (Some(t), None) => Ok((name, Some(unix_millis(name, t)?))),
        (None, Some(t)) => Ok((deprecated, Some(unix_millis(deprecated, t)?))),
        (None, None) => Ok((name, None)),
    }
}

impl From<PendingMessage> for proto::PendingMessage {
    fn from(m: PendingMessage) -> Self {
        proto::PendingMessage {
            tenant: m.id.tenant().unwrap_or_default().to_owned(),
            id: m.id.to_string(),
            topic: m.topic,
            key: m.key,
            partition: m.partition,
            deliver_at: Some(timestamp(m.due)),
            dispatch_at: Some(timestamp(m.dispatch_at)),
            scheduled_at: Some(timestamp(m.scheduled_at)),
            attempts: m.attempts,
            last_error: m.last_error.unwrap_or_default(),
            value_bytes: m.value_bytes as u64,
            labels: wire_labels(&m.labels),
            deadline: m.deadline.map(timestamp),
            dead_letter_topic: m.dead_letter_topic.unwrap_or_default(),
        }
    }
}

fn wire_labels(labels: &Labels) -> std::collections::HashMap<String, String> {
    labels.iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect()
}

impl From<PendingPage> for proto::ListResponse {
    fn from(page: PendingPage) -> Self {
        proto::ListResponse {
            messages: page.messages.into_iter().map(Into::into).collect(),
            next_page_token: page.next.map(PageToken::encode).unwrap_or_default(),
        }
    }
}

impl From<Stats> for proto::StatsResponse {
    fn from(s: Stats) -> Self {
        proto::StatsResponse {
            as_of: Some(timestamp(s.as_of)),
            pending: s.pending,
            delivered: s.delivered,
            cancelled: s.cancelled,
            failed: s.failed,
            expired: s.expired,
            dead_lettered: s.dead_lettered,
            dispatching: s.dispatching,
            oldest_overdue: s.oldest_overdue.map(Into::into),
            store_bytes: s.store_bytes,
            max_pending: s.max_pending,
            held_back: s
                .held_back
                .into_iter()
                .map(|h| proto::HeldBack {
                    topic: h.topic,
                    tenant: h.tenant.map_or_else(String::new, |t| t.as_str().to_owned()),
                    reason: if h.paused { proto::HeldReason::Paused } else { proto::HeldReason::RateLimited }
                        .into(),
                    since: Some(timestamp(h.since)),
                    oldest_due: Some(timestamp(h.oldest_due)),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> proto::ScheduleRequest {
        proto::ScheduleRequest {
            message: Some(proto::Message {
                topic: "orders".into(),
                key: Some(b"k".to_vec()),
                value: b"v".to_vec(),
                headers: vec![proto::Header { key: "h".into(), value: b"x".to_vec() }],
                partition: Some(1),
            }),
            id: Some("order-1".into()),
            due: Some(proto::schedule_request::Due::Delay(prost_types::Duration { seconds: 30, nanos: 0 })),
            on_conflict: 0,
            labels: [("order".to_owned(), "1".to_owned())].into(),
            max_lateness: None,
            dead_letter_topic: String::new(),
        }
    }

    #[test]
    fn a_deadline_is_whole_milliseconds_rounded_up_and_zero_is_none() {
        let with = |seconds, nanos| {
            let r = proto::ScheduleRequest {
                max_lateness: Some(prost_types::Duration { seconds, nanos }),
                ..request()
            };
            ScheduleCommand::try_from(r).map(|c| c.envelope.max_lateness)
        };
        assert_eq!(with(60, 0), Ok(Some(Duration::from_secs(60))));
        assert_eq!(with(0, 1_500_000), Ok(Some(Duration::from_millis(2))), "never sooner than asked");
        assert_eq!(with(0, 0), Ok(None));
        assert_eq!(with(-1, 0).unwrap_err().field, "max_lateness");
        assert_eq!(with(0, 1_000_000_000).unwrap_err().field, "max_lateness");
    }

    #[test]
    fn a_full_request_converts() {
        let cmd = ScheduleCommand::try_from(request()).unwrap();
        assert_eq!(cmd.id.as_deref(), Some("order-1"));
        assert_eq!(cmd.due, DueSpec::After(Duration::from_secs(30)));
        assert_eq!(cmd.envelope.partition, Some(1));
        assert_eq!(cmd.envelope.headers, vec![Header { key: "h".into(), value: b"x".to_vec() }]);
        assert_eq!(cmd.envelope.labels.get("order"), Some("1"));
    }

    #[test]
    fn bad_labels_and_selectors_are_named() {
        let mut r = request();
        r.labels.insert("bad key".into(), "v".into());
        assert_eq!(ScheduleCommand::try_from(r).unwrap_err().field, "labels");
        let list = proto::ListRequest { selector: "order==".into(), ..Default::default() };
        assert!(ListQuery::try_from(list).is_ok(), "order== is order equal to empty");
        let list = proto::ListRequest { selector: "order=a b".into(), ..Default::default() };
        assert_eq!(ListQuery::try_from(list).unwrap_err().field, "selector");
    }

    #[test]
    fn missing_parts_are_named() {
        let mut r = request();
        r.message = None;
        assert_eq!(ScheduleCommand::try_from(r).unwrap_err().field, "message");
        let mut r = request();
        r.due = None;
        assert_eq!(ScheduleCommand::try_from(r).unwrap_err().field, "due");
        let mut r = request();
        r.id = Some(String::new());
        assert_eq!(ScheduleCommand::try_from(r).unwrap_err().field, "id");
    }

    #[test]
    fn negative_delay_is_refused() {
        let mut r = request();
        r.due = Some(proto::schedule_request::Due::Delay(prost_types::Duration { seconds: -1, nanos: 0 }));
        assert_eq!(ScheduleCommand::try_from(r).unwrap_err().field, "delay");
    }

    #[test]
    fn timestamps_round_up_to_the_millisecond_and_past_is_fine() {
        let t =
            |seconds, nanos| due_spec(Some(WireDue::DeliverAt(prost_types::Timestamp { seconds, nanos })));
        assert_eq!(t(1, 1).unwrap(), DueSpec::At(UnixMillis(1001)), "never earlier than asked");
        assert_eq!(t(1, 0).unwrap(), DueSpec::At(UnixMillis(1000)));
        assert_eq!(t(-5, 0).unwrap(), DueSpec::At(UnixMillis(0)));
        assert_eq!(t(1, -1).unwrap_err().field, "deliver_at");
        assert_eq!(timestamp(UnixMillis(1234)), prost_types::Timestamp { seconds: 1, nanos: 234_000_000 });
    }

    #[test]
    #[allow(deprecated)]
    fn list_requests_convert_and_name_bad_fields() {
        let token = PageToken { dispatch_at: UnixMillis(9), shard: 0, seq: 1 };
        let request = proto::ListRequest {
            topic: "orders".into(),
            due_from: Some(prost_types::Timestamp { seconds: 1, nanos: 0 }),
            due_to: Some(prost_types::Timestamp { seconds: 2, nanos: 0 }),
            page_size: 10,
            page_token: token.encode(),
            ..Default::default()
        };
        let query = ListQuery::try_from(request.clone()).unwrap();
        assert_eq!(query.topic.as_deref(), Some("orders"));
        assert_eq!((query.from, query.to), (Some(UnixMillis(1000)), Some(UnixMillis(2000))));
        assert_eq!(query.page_token, Some(token));
        let empty = ListQuery::try_from(proto::ListRequest::default()).unwrap();
        assert_eq!(empty, ListQuery::default(), "empty fields are unset");
        let bad = proto::ListRequest { page_token: "nope".into(), ..request.clone() };
        assert_eq!(ListQuery::try_from(bad).unwrap_err().field, "page_token");
        let bad = proto::ListRequest {
            due_to: Some(prost_types::Timestamp { seconds: 1, nanos: -1 }),
            ..request.clone()
        };
        assert_eq!(ListQuery::try_from(bad).unwrap_err().field, "due_to");

        // The current names mean the same; errors name what was set.
        let current = proto::ListRequest {
            due_from: None,
            due_to: None,
            dispatch_from: request.due_from,
            dispatch_to: request.due_to,
            ..request.clone()
        };
        assert_eq!(ListQuery::try_from(current.clone()).unwrap(), query);
        let backwards = proto::ListRequest { dispatch_to: current.dispatch_from, ..current.clone() };
        assert_eq!(ListQuery::try_from(backwards).unwrap_err().field, "dispatch_to");
        let backwards = proto::ListRequest { due_to: request.due_from, ..request.clone() };
        assert_eq!(ListQuery::try_from(backwards).unwrap_err().field, "due_to");
        let both = proto::ListRequest { due_from: request.due_from, ..current };
        assert_eq!(ListQuery::try_from(both).unwrap_err().field, "due_from");
    }
}
