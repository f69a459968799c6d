//! The client subcommands: `schedule`, `cancel`, `reschedule`, `get`, and
//! `list` and `stats` for operators. Readable text by default; with
//! `--output json`, one JSON object per line with the field names of
//! [`json`], for scripts. Exit codes either way: 0 done, 1 the request
//! failed (the error goes to stderr as text), 2 bad usage, 3 cancel found
//! nothing to cancel.

use std::process::ExitCode;

use anyhow::Context as _;

use hourglass::message::UnixMillis;
use hourglass_kafka::proto;

use crate::cli::{
    BackupArgs, CancelArgs, ClientArgs, HealthArgs, IdArgs, ListArgs, Output, RescheduleArgs, ScheduleArgs,
    StatsArgs, When,
};

pub const EXIT_NOT_APPLIED: u8 = 3;

type Client = hourglass_kafka::SchedulerClient;

/// A connection to `--server`, with `--token` on every call and TLS as the
/// flags say; the services' stubs come from it.
pub async fn connection(server: &ClientArgs) -> anyhow::Result<hourglass_kafka::Client> {
    let mut builder = hourglass_kafka::Client::builder(&server.server).timeout(CALL_TIMEOUT);
    if let Some(token) = &server.token {
        builder = builder.token(token.expose());
    }
    if let Some(ca) = &server.ca_cert {
        builder = builder.ca_cert(ca);
    }
    if let Some((cert, key)) = server.client_cert.as_deref().zip(server.client_key.as_deref()) {
        builder = builder.identity(cert, key);
    }
    if let Some(name) = &server.tls_server_name {
        builder = builder.tls_server_name(name);
    }
    Ok(builder.connect().await?)
}

/// How long one call of a command may take.
const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

async fn connect(server: &ClientArgs) -> anyhow::Result<Client> {
    Ok(connection(server).await?.scheduler())
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
        dead_letter_topic: args.dead_letter_topic.unwrap_or_default(),
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
        .cancel(proto::CancelRequest { id: id.clone(), tenant: args.tenant.clone(), ..Default::default() })
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
        AlreadyDeadLettered => {
            ("not cancelled: it had gone to its dead-letter topic", ExitCode::from(EXIT_NOT_APPLIED))
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
        .reschedule(proto::RescheduleRequest {
            id: args.id.clone(),
            due: Some(due),
            tenant: args.tenant.clone(),
        })
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
        .get(proto::GetRequest { id: args.id, tenant: args.tenant })
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
        (Some(Settlement::DeadLettered(d)), _) => {
            let why = match &d.deadline {
                Some(deadline) => format!("expired: deadline {}", time(Some(*deadline))),
                None => format!("failed: {}", d.error),
            };
            format!(
                "dead-lettered to {} partition {} at offset {}, {} ({why})",
                d.topic,
                d.partition,
                d.offset,
                time(d.dead_lettered_at)
            )
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
    if !m.dead_letter_topic.is_empty() {
        println!("dead letters: {}", m.dead_letter_topic);
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

/// `hourglass backup DIR`: says where the copy is and how to restore it.
pub async fn backup(args: BackupArgs) -> anyhow::Result<ExitCode> {
    let request = proto::BackupRequest { dir: args.dir };
    let mut admin = connection(&args.client).await?.admin();
    let b = admin.backup(request).await.map_err(status_error)?.into_inner();
    if args.client.output == Output::Json {
        print_json(&json::Backup {
            dir: &b.dir,
            shards: b.shards,
            pending: b.pending,
            taken_at: time(b.taken_at),
        })?;
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "backed up {} store(s), {} pending, as of {}, to {}",
        b.shards,
        b.pending,
        time(b.taken_at),
        b.dir
    );
    println!("to restore: stop the server, and start it with --data-dir {} (or a copy of it)", b.dir);
    Ok(ExitCode::SUCCESS)
}

/// `hourglass health`: SERVING exits 0; anything else, an unreachable
/// server included, says what and exits 1.
pub async fn health(args: HealthArgs) -> anyhow::Result<ExitCode> {
    let service = if args.service.is_empty() { "the server" } else { args.service.as_str() };
    let asked = async {
        let client = connection(&args.client).await?;
        anyhow::Ok(client.serving(&args.service).await?)
    };
    let (serving, why) = match tokio::time::timeout(args.timeout, asked).await {
        Ok(Ok(serving)) => (serving, None),
        Ok(Err(e)) => (false, Some(format!("{e:#}"))),
        Err(_) => (false, Some(format!("no answer within {:?}", args.timeout))),
    };
    if args.client.output == Output::Json {
        print_json(&json::Health { service: &args.service, serving, error: why.as_deref() })?;
    } else {
        match &why {
            None if serving => println!("{service}: SERVING"),
            None => println!("{service}: NOT_SERVING"),
            Some(why) => eprintln!("error: {service} at {}: {why}", args.client.server),
        }
    }
    Ok(if serving { ExitCode::SUCCESS } else { ExitCode::FAILURE })
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
    println!("dead-lettered:  {}", s.dead_lettered);
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

pub mod json;
