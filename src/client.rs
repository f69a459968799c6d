//! The client subcommands: `schedule`, `cancel`, `reschedule`, `get`, for
//! people at a terminal. Readable output; exit codes: 0 done, 1 the request
//! failed, 2 bad usage, 3 cancel found nothing to cancel.

use std::process::ExitCode;

use anyhow::Context as _;
use tonic::{service::interceptor::InterceptedService, transport::Channel};

use crate::{
    auth::Bearer,
    cli::{IdArgs, RescheduleArgs, ScheduleArgs, ServerArg, When},
    message::UnixMillis,
    proto::{self, scheduler_client::SchedulerClient},
};

pub const EXIT_NOT_APPLIED: u8 = 3;

/// A client that sends `--token`, if given, with every call.
type Client = SchedulerClient<InterceptedService<Channel, Bearer>>;

async fn connect(server: &ServerArg) -> anyhow::Result<Client> {
    let mut endpoint = Channel::from_shared(server.server.clone())
        .with_context(|| format!("--server {:?} is not a URL like http://127.0.0.1:50051", server.server))?;
    if let Some(tls) = crate::tls::client_config(server)? {
        endpoint = endpoint.tls_config(tls).context("setting up TLS")?;
    }
    let channel =
        endpoint.connect().await.with_context(|| format!("cannot reach hourglass at {}", server.server))?;
    Ok(SchedulerClient::with_interceptor(channel, Bearer::new(server.token.as_deref())?))
}

fn status_error(e: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{:?}: {}", e.code(), e.message())
}

fn time(t: Option<prost_types::Timestamp>) -> String {
    t.map(|t| UnixMillis(t.seconds.max(0) as u64 * 1000 + (t.nanos / 1_000_000) as u64).to_rfc3339())
        .unwrap_or_else(|| "-".into())
}

fn schedule_due(when: When) -> proto::schedule_request::Due {
    use proto::schedule_request::Due;
    match (when.delay, when.at) {
        (Some(d), _) => {
            Due::Delay(prost_types::Duration { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 })
        }
        (None, Some(at)) => Due::DeliverAt(prost_types::Timestamp {
            seconds: at.timestamp(),
            nanos: at.timestamp_subsec_nanos() as i32,
        }),
        // clap's group makes one of the two required.
        (None, None) => Due::Delay(prost_types::Duration::default()),
    }
}

pub async fn schedule(args: ScheduleArgs) -> anyhow::Result<ExitCode> {
    let headers = args
        .headers
        .iter()
        .map(|h| {
            h.split_once('=')
                .map(|(k, v)| proto::Header { key: k.to_owned(), value: v.as_bytes().to_vec() })
                .with_context(|| format!("--header {h:?} is not KEY=VALUE"))
        })
        .collect::<anyhow::Result<_>>()?;
    let request = proto::ScheduleRequest {
        message: Some(proto::Message {
            topic: args.topic,
            key: args.key.map(String::into_bytes),
            value: args.value.into_bytes(),
            headers,
            partition: args.partition,
        }),
        id: args.id,
        due: Some(schedule_due(args.when)),
    };
    let reply = connect(&args.server).await?.schedule(request).await.map_err(status_error)?.into_inner();
    let again = if reply.duplicate { " (already scheduled by this same request)" } else { "" };
    println!("scheduled {} for {}{again}", reply.id, time(reply.deliver_at));
    Ok(ExitCode::SUCCESS)
}

pub async fn cancel(args: IdArgs) -> anyhow::Result<ExitCode> {
    let reply = connect(&args.server)
        .await?
        .cancel(proto::CancelRequest { id: args.id.clone() })
        .await
        .map_err(status_error)?
        .into_inner();
    use proto::CancelOutcome::*;
    let (text, code) = match reply.outcome() {
        Cancelled => ("cancelled", ExitCode::SUCCESS),
        AlreadyDelivered => ("not cancelled: already delivered", ExitCode::from(EXIT_NOT_APPLIED)),
        AlreadyCancelled => ("not cancelled: already cancelled", ExitCode::from(EXIT_NOT_APPLIED)),
        AlreadyFailed => ("not cancelled: delivery had failed", ExitCode::from(EXIT_NOT_APPLIED)),
        NotFound => ("not cancelled: no such message", ExitCode::from(EXIT_NOT_APPLIED)),
        Unspecified => ("unknown outcome", ExitCode::FAILURE),
    };
    println!("{} {text}", args.id);
    Ok(code)
}

pub async fn reschedule(args: RescheduleArgs) -> anyhow::Result<ExitCode> {
    use proto::reschedule_request::Due;
    let due = match schedule_due(args.when) {
        proto::schedule_request::Due::Delay(d) => Due::Delay(d),
        proto::schedule_request::Due::DeliverAt(t) => Due::DeliverAt(t),
    };
    let reply = connect(&args.server)
        .await?
        .reschedule(proto::RescheduleRequest { id: args.id.clone(), due: Some(due) })
        .await
        .map_err(status_error)?
        .into_inner();
    println!("rescheduled {} for {}", args.id, time(reply.deliver_at));
    Ok(ExitCode::SUCCESS)
}

fn bytes(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) => format!("{s:?}"),
        Err(_) => format!("{} bytes (not UTF-8)", b.len()),
    }
}

pub async fn get(args: IdArgs) -> anyhow::Result<ExitCode> {
    let m = connect(&args.server)
        .await?
        .get(proto::GetRequest { id: args.id })
        .await
        .map_err(status_error)?
        .into_inner();
    use proto::get_response::Settlement;
    let state = match (&m.settlement, m.state()) {
        (Some(Settlement::Delivered(d)), _) => {
            format!("delivered to partition {} at offset {}, {}", d.partition, d.offset, time(d.delivered_at))
        }
        (Some(Settlement::Cancelled(c)), _) => format!("cancelled {}", time(c.cancelled_at)),
        (Some(Settlement::Failed(f)), _) => format!("failed {}: {}", time(f.failed_at), f.reason),
        (None, state) => state.as_str_name().trim_start_matches("STATE_").to_lowercase(),
    };
    println!("id:           {}", m.id);
    println!("state:        {state}");
    println!("deliver at:   {}", time(m.deliver_at));
    println!("scheduled at: {}", time(m.scheduled_at));
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
    Ok(ExitCode::SUCCESS)
}
