//! `hourglass topic …`: a target topic's dispatch policy from the command
//! line (the `Admin` service): pause, resume, limit its rate, give its
//! messages a default deadline and a dead-letter topic, show it.
//! Text for people by default; `--output json` prints one object per line.

use std::{process::ExitCode, time::Duration};

use clap::{Args, Subcommand};
use serde::Serialize;

use hourglass_kafka::proto;

use crate::{
    cli::{ClientArgs, Output, duration},
    client::{self, json, print_json, status_error},
};

#[derive(Debug, Subcommand)]
pub enum TopicCommand {
    /// Pause a topic: none of its messages is produced until it is
    /// resumed; every other topic goes on.
    Pause(Target),
    /// Resume a paused topic: what came due meanwhile goes out in due
    /// order, at the topic's rate limit if it has one.
    Resume(Target),
    /// Limit the rate at which a topic's messages are produced (or remove
    /// the limit with --off).
    Limit(LimitArgs),
    /// Give a topic's messages a default deadline: those that name none
    /// (schedule --max-lateness) expire unproduced this long past their
    /// due time (or remove it with --off).
    Deadline(DeadlineArgs),
    /// Send a topic's messages that fail or expire to a dead-letter topic,
    /// when they name none of their own (schedule --dead-letter-topic);
    /// --off falls back to the server's --dead-letter-topic.
    DeadLetter(DeadLetterArgs),
    /// Show a topic's policy.
    Get(Target),
    /// List the topic policies you may see.
    List(ListArgs),
}

#[derive(Debug, Args)]
pub struct TopicArgs {
    #[command(subcommand)]
    pub command: TopicCommand,
}

#[derive(Debug, Args)]
pub struct Target {
    #[command(flatten)]
    pub client: ClientArgs,
    /// The target topic.
    pub topic: String,
    /// For every tenant's messages to the topic, not just your token's
    /// tenant's (needs `admin = "all"` with --token; without tokens every
    /// policy is for every tenant).
    #[arg(long, conflicts_with = "tenant")]
    pub all_tenants: bool,
    /// Another tenant's own policy, for an operator token (admin = "all").
    #[arg(long, default_value = "")]
    pub tenant: String,
}

#[derive(Debug, Args)]
pub struct LimitArgs {
    #[command(flatten)]
    pub target: Target,
    /// Messages per second, at most 10,000,000.
    #[arg(long, required_unless_present = "off", conflicts_with = "off")]
    pub per_second: Option<u32>,
    /// How many may go at once after a quiet spell [default: a tenth of a
    /// second's worth]
    #[arg(long, requires = "per_second")]
    pub burst: Option<u32>,
    /// Remove the topic's rate limit.
    #[arg(long)]
    pub off: bool,
}

#[derive(Debug, Args)]
pub struct DeadlineArgs {
    #[command(flatten)]
    pub target: Target,
    /// How long past their due time its messages may still be produced,
    /// e.g. 3h.
    #[arg(long, value_name = "DURATION", value_parser = duration, required_unless_present = "off", conflicts_with = "off")]
    pub max_lateness: Option<Duration>,
    /// Remove the topic's default deadline.
    #[arg(long)]
    pub off: bool,
}

#[derive(Debug, Args)]
pub struct DeadLetterArgs {
    #[command(flatten)]
    pub target: Target,
    /// The dead-letter topic (another topic than the target).
    #[arg(long, value_name = "TOPIC", required_unless_present = "off", conflicts_with = "off")]
    pub to: Option<String>,
    /// Remove the topic's own dead-letter topic.
    #[arg(long)]
    pub off: bool,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub client: ClientArgs,
}

type Client = hourglass_kafka::AdminClient;

async fn connect(server: &ClientArgs) -> anyhow::Result<Client> {
    Ok(client::connection(server).await?.admin())
}

pub async fn run(args: TopicArgs) -> anyhow::Result<ExitCode> {
    let (output, verb, policy) = match args.command {
        TopicCommand::Pause(t) => {
            let mut admin = connect(&t.client).await?;
            let reply = admin.pause_topic(request(&t)).await;
            (t.client.output, "paused", reply)
        }
        TopicCommand::Resume(t) => {
            let mut admin = connect(&t.client).await?;
            let reply = admin.resume_topic(request(&t)).await;
            (t.client.output, "resumed", reply)
        }
        TopicCommand::Limit(l) => {
            let t = &l.target;
            let limit = proto::SetRateLimitRequest {
                topic: t.topic.clone(),
                all_tenants: t.all_tenants,
                tenant: t.tenant.clone(),
                per_second: if l.off { 0 } else { l.per_second.unwrap_or(0) },
                burst: l.burst.unwrap_or(0),
            };
            let reply = connect(&t.client).await?.set_rate_limit(limit).await;
            (t.client.output, if l.off { "unlimited" } else { "limited" }, reply)
        }
        TopicCommand::Deadline(d) => {
            let t = &d.target;
            let deadline = proto::SetMaxLatenessRequest {
                topic: t.topic.clone(),
                all_tenants: t.all_tenants,
                tenant: t.tenant.clone(),
                max_lateness: d.max_lateness.filter(|_| !d.off).map(client::wire),
            };
            let reply = connect(&t.client).await?.set_max_lateness(deadline).await;
            let off = d.off || d.max_lateness.is_some_and(|late| late.is_zero());
            (t.client.output, if off { "deadline off for" } else { "deadline on" }, reply)
        }
        TopicCommand::DeadLetter(d) => {
            let t = &d.target;
            let to = proto::SetDeadLetterTopicRequest {
                topic: t.topic.clone(),
                all_tenants: t.all_tenants,
                tenant: t.tenant.clone(),
                dead_letter_topic: d.to.clone().filter(|_| !d.off).unwrap_or_default(),
            };
            let reply = connect(&t.client).await?.set_dead_letter_topic(to).await;
            (t.client.output, if d.off { "dead letters off for" } else { "dead letters on" }, reply)
        }
        TopicCommand::Get(t) => {
            let reply = connect(&t.client).await?.get_topic_policy(request(&t)).await;
            (t.client.output, "", reply)
        }
        TopicCommand::List(l) => {
            let reply =
                connect(&l.client).await?.list_topic_policies(proto::ListTopicPoliciesRequest {}).await;
            let policies = reply.map_err(status_error)?.into_inner().policies;
            match l.client.output {
                Output::Json => policies.into_iter().try_for_each(|p| print_json(&Policy::from(p)))?,
                Output::Text if policies.is_empty() => println!("no topic policies"),
                Output::Text => policies.iter().for_each(|p| println!("{}", line(p))),
            }
            return Ok(ExitCode::SUCCESS);
        }
    };
    let policy = policy.map_err(status_error)?.into_inner();
    match output {
        Output::Json => print_json(&Policy::from(policy))?,
        Output::Text if verb.is_empty() => println!("{}", line(&policy)),
        Output::Text => println!("{verb} {}", line(&policy)),
    }
    Ok(ExitCode::SUCCESS)
}

fn request(t: &Target) -> proto::TopicPolicyRequest {
    proto::TopicPolicyRequest { topic: t.topic.clone(), all_tenants: t.all_tenants, tenant: t.tenant.clone() }
}

/// One policy on one line: whose, paused or not, its limit.
fn line(p: &proto::TopicPolicy) -> String {
    let whose = if p.tenant.is_empty() { "every tenant".to_owned() } else { format!("tenant {}", p.tenant) };
    let paused = match &p.paused_at {
        Some(at) if p.paused => format!("paused since {}", client::time(Some(*at))),
        _ => "not paused".to_owned(),
    };
    let limit = match &p.rate_limit {
        Some(r) => format!("limited to {}/s (burst {})", r.per_second, r.burst),
        None => "no rate limit".to_owned(),
    };
    let deadline = match &p.max_lateness {
        Some(late) => format!("messages expire {} late", humantime::format_duration(duration_of(late))),
        None => "no deadline".to_owned(),
    };
    let dead = match p.dead_letter_topic.as_str() {
        "" => String::new(),
        to => format!(", dead letters to {to}"),
    };
    format!("topic {} ({whose}): {paused}, {limit}, {deadline}{dead}", p.topic)
}

fn duration_of(d: &prost_types::Duration) -> Duration {
    Duration::new(d.seconds.max(0) as u64, d.nanos.max(0) as u32)
}

#[derive(Serialize)]
struct Policy {
    topic: String,
    /// None: every tenant.
    tenant: Option<String>,
    paused: bool,
    paused_at: Option<String>,
    rate_limit: Option<Limit>,
    /// The default deadline past the due time, in ms; null: none.
    max_lateness_ms: Option<u64>,
    /// Where its messages go when they fail or expire; null: the server's
    /// default.
    dead_letter_topic: Option<String>,
    updated_at: Option<String>,
    updated_by: Option<String>,
}

#[derive(Serialize)]
struct Limit {
    per_second: u32,
    burst: u32,
}

impl From<proto::TopicPolicy> for Policy {
    fn from(p: proto::TopicPolicy) -> Policy {
        Policy {
            topic: p.topic,
            tenant: (!p.tenant.is_empty()).then_some(p.tenant),
            paused: p.paused,
            paused_at: json::time(p.paused_at),
            rate_limit: p.rate_limit.map(|r| Limit { per_second: r.per_second, burst: r.burst }),
            max_lateness_ms: p.max_lateness.map(|d| duration_of(&d).as_millis() as u64),
            dead_letter_topic: json::text(p.dead_letter_topic),
            updated_at: json::time(p.updated_at),
            updated_by: (!p.updated_by.is_empty()).then_some(p.updated_by),
        }
    }
}
