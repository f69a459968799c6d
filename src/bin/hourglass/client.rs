//! The client subcommands: `schedule`, `cancel`, `reschedule`, `get`, and
//! `list` and `stats` for operators. Readable text by default; with
//! `--output json`, one JSON object per line with the field names of
//! [`json`], for scripts. Exit codes either way: 0 done, 1 the request
//! failed (the error goes to stderr as text), 2 bad usage, 3 cancel found
//! nothing to cancel.

use std::process::ExitCode;

use anyhow::Context as _;
use tonic::{service::interceptor::InterceptedService, transport::Channel};

use hourglass::{
    auth::Bearer,
    message::UnixMillis,
    proto::{self, scheduler_client::SchedulerClient},
    secret::Secret,
    tls,
};

use crate::cli::{
    CancelArgs, ClientArgs, IdArgs, ListArgs, Output, RescheduleArgs, ScheduleArgs, StatsArgs, When,
};

pub const EXIT_NOT_APPLIED: u8 = 3;

/// A client that sends `--token`, if given, with every call.
type Client = SchedulerClient<InterceptedService<Channel, Bearer>>;

/// A channel to `--server`, and what sends `--token` with every call.
pub async fn channel(server: &ClientArgs) -> anyhow::Result<(Channel, Bearer)> {
    // The command line checked the URL.
    let mut endpoint = Channel::from_shared(server.server.clone())
        .with_context(|| format!("--server {:?} is not a URL like http://127.0.0.1:50051", server.server))?;
    let identity = server.client_cert.as_deref().zip(server.client_key.as_deref());
    if let Some(tls) = tls::client_config(&server.server, server.ca_cert.as_deref(), identity)? {
        endpoint = endpoint.tls_config(tls).context("setting up TLS")?;
    }
    let channel =
        endpoint.connect().await.with_context(|| format!("cannot reach hourglass at {}", server.server))?;
    Ok((channel, Bearer::new(server.token.as_ref().map(Secret::expose))?))
}

async fn connect(server: &ClientArgs) -> anyhow::Result<Client> {
    let (channel, bearer) = channel(server).await?;
    Ok(SchedulerClient::with_interceptor(channel, bearer))
}

pub fn status_error(e: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{:?}: {}", e.code(), e.message())
}

fn millis(t: prost_types::Timestamp) -> UnixMillis {
    UnixMillis(t.seconds.max(0) as u64 * 1000 + (t.nanos.max(0) / 1_000_000) as u64)
}

pub fn time(t: Option<prost_types::Timestamp>) -> String {
    t.map(|t| millis(t).to_rfc3339()).unwrap_or_else(|| "-".into())
}

pub fn to_timestamp(t: chrono::DateTime<chrono::FixedOffset>) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: t.timestamp(), nanos: t.timestamp_subsec_nanos() as i32 }
}

/// Prints one JSON object on a line of its own.
pub fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string(value).context("writing JSON")?);
    Ok(())
}

fn schedule_due(when: When) -> proto::schedule_request::Due {
    use proto::schedule_request::Due;
    match (when.delay, when.at) {
        (Some(d), _) => Due::Delay(wire(d)),
        (None, Some(at)) => Due::DeliverAt(to_timestamp(at)),
        // clap's group makes one of the two required.
        (None, None) => Due::Delay(prost_types::Duration::default()),
    }
}

/// A length of time as the wire carries it.
pub fn wire(d: std::time::Duration) -> prost_types::Duration {
    prost_types::Duration { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }
}

pub async fn schedule(args: ScheduleArgs) -> anyhow::Result<ExitCode> {
    let request = proto::ScheduleRequest {
        message: Some(args.record.message()),
        id: args.id,
        due: Some(schedule_due(args.when)),
        on_conflict: if args.replace { proto::OnConflict::Replace } else { proto::OnConflict::Reject } as i32,
        labels: args.labels.into_iter().collect(),
        max_lateness: args.max_lateness.map(wire),
    };
    let reply = connect(&args.client).await?.schedule(request).await.map_err(status_error)?.into_inner();
    if args.client.output == Output::Json {
        print_json(&json::Scheduled::from(reply))?;
        return Ok(ExitCode::SUCCESS);
    }
    let verb = match reply.outcome() {
        proto::ScheduleOutcome::Replaced => "replaced",
        _ => "scheduled",
    };
    let again = if reply.duplicate { " (already scheduled by this same request)" } else { "" };
    println!("{verb} {} for {}{again}", reply.id, time(reply.deliver_at));
    Ok(ExitCode::SUCCESS)
}

pub async fn cancel(args: CancelArgs) -> anyhow::Result<ExitCode> {
    let Some(id) = args.id else {
        return cancel_matching(args).await;
    };
    let reply = connect(&args.client)
        .await?
        .cancel(proto::CancelRequest { id: id.clone() })
        .await
        .map_err(status_error)?
        .into_inner();
    use proto::CancelOutcome::*;
    let (text, code) = match reply.outcome() {
        Cancelled => ("cancelled", ExitCode::SUCCESS),
        AlreadyDelivered => ("not cancelled: already delivered", ExitCode::from(EXIT_NOT_APPLIED)),
        AlreadyCancelled => ("not cancelled: already cancelled", ExitCode::from(EXIT_NOT_APPLIED)),
        AlreadyFailed => ("not cancelled: delivery had failed", ExitCode::from(EXIT_NOT_APPLIED)),
        AlreadyExpired => {
            ("not cancelled: its deadline had passed (expired)", ExitCode::from(EXIT_NOT_APPLIED))
        }
        NotFound => ("not cancelled: no such message", ExitCode::from(EXIT_NOT_APPLIED)),
        Unspecified => ("unknown outcome", ExitCode::FAILURE),
    };
    match args.client.output {
        Output::Json => print_json(&json::Cancelled { id, outcome: json::outcome(reply.outcome()) })?,
        Output::Text => println!("{id} {text}"),
    }
    Ok(code)
}

/// Cancels what a selector picks, call after call until the server says
/// every match was looked at.
async fn cancel_matching(args: CancelArgs) -> anyhow::Result<ExitCode> {
    let mut client = connect(&args.client).await?;
    let mut request = proto::CancelMatchingRequest {
        selector: args.selector.unwrap_or_default(),
        topic: args.topic.unwrap_or_default(),
        dispatch_from: args.from.map(to_timestamp),
        dispatch_to: args.to.map(to_timestamp),
        page_token: String::new(),
    };
    let mut done = json::CancelledMatching::default();
    loop {
        let reply = client.cancel_matching(request.clone()).await.map_err(status_error)?.into_inner();
        done.cancelled += reply.cancelled;
        for n in reply.not_cancelled {
            let outcome = match n.outcome() {
                proto::CancelOutcome::Unspecified => "error".to_owned(),
                other => json::outcome(other),
            };
            done.not_cancelled.push(json::NotCancelled { id: n.id, outcome, error: json::text(n.error) });
        }
        if reply.next_page_token.is_empty() {
            break;
        }
        request.page_token = reply.next_page_token;
    }
    match args.client.output {
        Output::Json => print_json(&done)?,
        Output::Text => {
            println!("cancelled {}, not cancelled {}", done.cancelled, done.not_cancelled.len());
            for n in &done.not_cancelled {
                println!("{} not cancelled: {}", n.id, n.error.as_deref().unwrap_or(&n.outcome));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn reschedule(args: RescheduleArgs) -> anyhow::Result<ExitCode> {
    use proto::reschedule_request::Due;
    let due = match schedule_due(args.when) {
        proto::schedule_request::Due::Delay(d) => Due::Delay(d),
        proto::schedule_request::Due::DeliverAt(t) => Due::DeliverAt(t),
    };
    let reply = connect(&args.client)
        .await?
        .reschedule(proto::RescheduleRequest { id: args.id.clone(), due: Some(due) })
        .await
        .map_err(status_error)?
        .into_inner();
    match args.client.output {
        Output::Json => {
            print_json(&json::Rescheduled { id: args.id, deliver_at: json::time(reply.deliver_at) })?
        }
        Output::Text => println!("rescheduled {} for {}", args.id, time(reply.deliver_at)),
    }
    Ok(ExitCode::SUCCESS)
}

pub fn bytes(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) => format!("{s:?}"),
        Err(_) => format!("{} bytes (not UTF-8)", b.len()),
    }
}

pub async fn get(args: IdArgs) -> anyhow::Result<ExitCode> {
    let m = connect(&args.client)
        .await?
        .get(proto::GetRequest { id: args.id })
        .await
        .map_err(status_error)?
        .into_inner();
    if args.client.output == Output::Json {
        print_json(&json::Message::from(m))?;
        return Ok(ExitCode::SUCCESS);
    }
    use proto::get_response::Settlement;
    let state = match (&m.settlement, m.state()) {
        (Some(Settlement::Delivered(d)), _) => {
            format!("delivered to partition {} at offset {}, {}", d.partition, d.offset, time(d.delivered_at))
        }
        (Some(Settlement::Cancelled(c)), _) => format!("cancelled {}", time(c.cancelled_at)),
        (Some(Settlement::Failed(f)), _) => format!("failed {}: {}", time(f.failed_at), f.reason),
        (Some(Settlement::Expired(e)), _) => {
            format!("expired {}, not produced (deadline {})", time(e.expired_at), time(e.deadline))
        }
        (None, state) => state.as_str_name().trim_start_matches("STATE_").to_lowercase(),
    };
    println!("id:           {}", m.id);
    println!("state:        {state}");
    println!("deliver at:   {}", time(m.deliver_at));
    println!("scheduled at: {}", time(m.scheduled_at));
    if let Some(late) = m.max_lateness {
        let late = std::time::Duration::new(late.seconds.max(0) as u64, late.nanos.max(0) as u32);
        println!("max lateness: {}", humantime::format_duration(late));
    }
    if m.attempts > 0 {
        println!("attempts:     {}", m.attempts);
    }
    if !m.last_error.is_empty() {
        println!("last error:   {}", m.last_error);
    }
    if let Some(msg) = m.message {
        println!("topic:        {}", msg.topic);
        if let Some(p) = msg.partition {
            println!("partition:    {p}");
        }
        if let Some(k) = msg.key {
            println!("key:          {}", bytes(&k));
        }
        for h in msg.headers {
            println!("header:       {}={}", h.key, bytes(&h.value));
        }
        println!("value:        {}", bytes(&msg.value));
    }
    let labels: std::collections::BTreeMap<_, _> = m.labels.into_iter().collect();
    for (key, value) in labels {
        println!("label:        {key}={value}");
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn list(args: ListArgs) -> anyhow::Result<ExitCode> {
    let mut client = connect(&args.client).await?;
    let mut request = proto::ListRequest {
        topic: args.topic.unwrap_or_default(),
        dispatch_from: args.from.map(to_timestamp),
        dispatch_to: args.to.map(to_timestamp),
        page_size: args.page_size.unwrap_or(0),
        page_token: args.page_token.unwrap_or_default(),
        selector: args.selector.unwrap_or_default(),
        ..Default::default()
    };
    let mut listed = 0usize;
    loop {
        let page = client.list(request.clone()).await.map_err(status_error)?.into_inner();
        listed += page.messages.len();
        let next = page.next_page_token.clone();
        match args.client.output {
            Output::Json => print_json(&json::Page::from(page))?,
            Output::Text => print_rows(&page.messages),
        }
        if next.is_empty() || !args.all {
            if args.client.output == Output::Text {
                if listed == 0 {
                    println!("no pending messages match");
                }
                if !next.is_empty() {
                    println!("more: --page-token {next}");
                }
            }
            return Ok(ExitCode::SUCCESS);
        }
        // Each page moves past at least one entry, so this ends; a token
        // that does not move would be a server fault, not a reason to spin.
        anyhow::ensure!(next != request.page_token, "the server returned the same page token twice");
        request.page_token = next;
    }
}

/// One aligned line per message: dispatch time, id, topic, tries.
fn print_rows(messages: &[proto::PendingMessage]) {
    let id_width = messages.iter().map(|m| m.id.len()).max().unwrap_or(0);
    let topic_width = messages.iter().map(|m| m.topic.len()).max().unwrap_or(0);
    for m in messages {
        let mut line = format!("{}  {:id_width$}  {:topic_width$}", time(m.dispatch_at), m.id, m.topic);
        if m.dispatch_at != m.deliver_at {
            line.push_str(&format!("  (due {})", time(m.deliver_at)));
        }
        if m.deadline.is_some() {
            line.push_str(&format!("  (expires {})", time(m.deadline)));
        }
        if m.attempts > 0 {
            line.push_str(&format!("  attempts {}: {}", m.attempts, m.last_error));
        }
        println!("{}", line.trim_end());
    }
}

pub async fn stats(args: StatsArgs) -> anyhow::Result<ExitCode> {
    let s =
        connect(&args.client).await?.stats(proto::StatsRequest {}).await.map_err(status_error)?.into_inner();
    if args.client.output == Output::Json {
        print_json(&json::Stats::from(s))?;
        return Ok(ExitCode::SUCCESS);
    }
    let cap = s.max_pending.map(|cap| format!(" (cap {cap})")).unwrap_or_default();
    println!("as of:          {}", time(s.as_of));
    println!("pending:        {}{cap}", s.pending);
    println!("dispatching:    {}", s.dispatching);
    println!("delivered:      {}", s.delivered);
    println!("cancelled:      {}", s.cancelled);
    println!("failed:         {}", s.failed);
    println!("expired:        {}", s.expired);
    match &s.oldest_overdue {
        Some(m) => println!(
            "oldest overdue: {} on {}, due {} ({} ms ago)",
            m.id,
            m.topic,
            time(m.dispatch_at),
            json::overdue_ms(s.as_of, m.dispatch_at)
        ),
        None => println!("oldest overdue: none"),
    }
    println!("store size:     {} bytes", s.store_bytes);
    for h in &s.held_back {
        let whose =
            if h.tenant.is_empty() { "every tenant".to_owned() } else { format!("tenant {}", h.tenant) };
        let why = if h.reason() == proto::HeldReason::Paused { "paused" } else { "at its rate limit" };
        println!(
            "held back:      topic {} ({whose}) {why} since {}; oldest held due {} ({} ms ago)",
            h.topic,
            time(h.since),
            time(h.oldest_due),
            json::overdue_ms(s.as_of, h.oldest_due)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The JSON the client subcommands print with `--output json`. These field
/// names are an interface: scripts read them, docs/API.md lists them, and
/// they change only by adding fields. Times are RFC 3339 in UTC with
/// milliseconds; bytes (keys, values) are base64, as in protobuf's JSON.
pub mod json {
    use std::collections::BTreeMap;

    use base64::Engine as _;
    use serde::Serialize;

    use super::millis;
    use hourglass::proto;

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
        /// `already_failed`, `already_expired` or `not_found`.
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
        /// `pending`, `delivered`, `cancelled`, `failed` or `expired`.
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
        pub delivery: Option<Delivery>,
        pub cancelled_at: Option<String>,
        pub failed_at: Option<String>,
        pub expired_at: Option<String>,
        /// When a pending message expires unproduced, or an expired one's
        /// deadline; null otherwise.
        pub deadline: Option<String>,
        pub labels: BTreeMap<String, String>,
    }

    impl From<proto::GetResponse> for Message {
        fn from(m: proto::GetResponse) -> Self {
            use proto::get_response::Settlement;
            let pending = m.state() == proto::State::Pending;
            let state = m.state().as_str_name().trim_start_matches("STATE_").to_lowercase();
            let msg = m.message.unwrap_or_default();
            let (mut delivery, mut cancelled_at, mut failed_at, mut expired_at) = (None, None, None, None);
            // The deadline of a pending message, from its due time.
            let mut deadline = m.max_lateness.filter(|_| pending).and_then(|late| {
                let due = m.deliver_at?;
                time(Some(prost_types::Timestamp {
                    seconds: due.seconds.saturating_add(late.seconds),
                    nanos: due.nanos + late.nanos,
                }))
            });
            match m.settlement {
                Some(Settlement::Delivered(d)) => {
                    delivery = Some(Delivery {
                        partition: d.partition,
                        offset: d.offset,
                        delivered_at: time(d.delivered_at),
                    })
                }
                Some(Settlement::Cancelled(c)) => cancelled_at = time(c.cancelled_at),
                Some(Settlement::Failed(f)) => failed_at = time(f.failed_at),
                Some(Settlement::Expired(e)) => {
                    expired_at = time(e.expired_at);
                    deadline = time(e.deadline);
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
                delivery,
                cancelled_at,
                failed_at,
                expired_at,
                deadline,
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

    #[derive(Debug, Serialize)]
    pub struct Stats {
        pub as_of: Option<String>,
        pub pending: u64,
        pub dispatching: u64,
        pub delivered: u64,
        pub cancelled: u64,
        pub failed: u64,
        pub expired: u64,
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
}
