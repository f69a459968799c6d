//! `hourglass series …`: recurring schedules from the command line. Text
//! for people by default; `--output json` prints one object per line.

use std::{process::ExitCode, time::Duration};

use clap::{Args, Subcommand};
use serde::Serialize;

use hourglass_kafka::proto;

use crate::{
    cli::{ClientArgs, Output, RecordArgs, duration, label, time as parse_time},
    client::{self, json, print_json, status_error, time, to_timestamp},
};

#[derive(Debug, Subcommand)]
pub enum SeriesCommand {
    /// Create a series: a record produced again and again, by a cron
    /// expression in a time zone or at a fixed interval.
    Create(SpecArgs),
    /// Show a series, its state and its next occurrences.
    Get(GetArgs),
    /// List series, a page at a time.
    List(ListArgs),
    /// Replace a series' record and rule from its next occurrence on (give
    /// the whole definition, as to create).
    Update(SpecArgs),
    /// Stop a series: its parked occurrence is cancelled, nothing more is
    /// parked until it is resumed.
    Pause(SeriesId),
    /// Start a paused series again from its next occurrence after now.
    Resume(SeriesId),
    /// Delete a series: its parked occurrence is cancelled.
    Delete(SeriesId),
}

#[derive(Debug, Args)]
pub struct SeriesArgs {
    #[command(subcommand)]
    pub command: SeriesCommand,
}

#[derive(Debug, Args)]
pub struct SeriesId {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Series id.
    pub id: String,
    /// Another tenant's series, for an operator token (admin = "all");
    /// your own tenant's unless given.
    #[arg(long, default_value = "")]
    pub tenant: String,
}

#[derive(Debug, Args)]
pub struct GetArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Series id.
    pub id: String,
    /// How many next occurrences to show, at most 100.
    #[arg(long, default_value_t = 5)]
    pub next: u32,
    /// Another tenant's series, for an operator token (admin = "all");
    /// your own tenant's unless given.
    #[arg(long, default_value = "")]
    pub tenant: String,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Only series producing to this topic.
    #[arg(long)]
    pub topic: Option<String>,
    /// Only series whose labels match: key=value, key!=value, key or !key,
    /// comma-separated.
    #[arg(long)]
    pub selector: Option<String>,
    /// Series per page, at most 1000 [default: 100]
    #[arg(long)]
    pub page_size: Option<u32>,
    /// Start at this page (a previous page's next page token).
    #[arg(long)]
    pub page_token: Option<String>,
    /// Follow the pages to the end instead of stopping after one.
    #[arg(long)]
    pub all: bool,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum MissedArg {
    /// Fire none of the missed occurrences.
    Skip,
    /// Fire the latest of them, once.
    FireOne,
    /// Fire each of them (at most --missed-at-most, the latest).
    FireEach,
}

#[derive(Debug, Args)]
#[group(id = "rule", required = true, multiple = false)]
pub struct Every {
    /// Cron expression: five fields (minute hour day-of-month month
    /// day-of-week), six with seconds first, or @hourly, @daily, @weekly,
    /// @monthly, @yearly. Read in --zone.
    #[arg(long, group = "rule")]
    pub cron: Option<String>,
    /// A fixed interval instead, e.g. 30s, 15m, 1h.
    #[arg(long, value_parser = duration, group = "rule")]
    pub every: Option<Duration>,
}

#[derive(Debug, Args)]
pub struct SpecArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Series id: up to 100 printable characters, no spaces or '@'.
    pub id: String,
    #[command(flatten)]
    pub every: Every,
    /// IANA time zone of --cron, e.g. Europe/Berlin [default: UTC]
    #[arg(long, requires = "cron")]
    pub zone: Option<String>,
    #[command(flatten)]
    pub record: RecordArgs,
    /// Label KEY=VALUE of the series and of each occurrence, repeatable.
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = label)]
    pub labels: Vec<(String, String)>,
    /// No occurrence before this time, RFC 3339.
    #[arg(long, value_parser = parse_time)]
    pub start: Option<chrono::DateTime<chrono::FixedOffset>>,
    /// No occurrence after this time, RFC 3339.
    #[arg(long, value_parser = parse_time)]
    pub end: Option<chrono::DateTime<chrono::FixedOffset>>,
    /// At most this many occurrences.
    #[arg(long)]
    pub count: Option<u64>,
    /// Deliver each occurrence later by up to this much (the same for the
    /// same occurrence), e.g. 30s.
    #[arg(long, value_parser = duration)]
    pub jitter: Option<Duration>,
    /// What fires of the occurrences missed while hourglass or Kafka was
    /// down [default: fire-one]
    #[arg(long, value_enum)]
    pub missed: Option<MissedArg>,
    /// With --missed fire-each: fire at most this many [default: 10]
    #[arg(long)]
    pub missed_at_most: Option<u32>,
    /// How late an occurrence may come and still count as on time
    /// [default: 60s]
    #[arg(long, value_parser = duration)]
    pub missed_after: Option<Duration>,
}

impl SpecArgs {
    fn spec(&self) -> proto::SeriesSpec {
        let every = match (&self.every.cron, self.every.every) {
            (Some(cron), _) => proto::series_spec::Every::Cron(cron.clone()),
            (None, Some(every)) => proto::series_spec::Every::Interval(client::wire(every)),
            // clap's group makes one of the two required.
            (None, None) => proto::series_spec::Every::Cron(String::new()),
        };
        let policy = match self.missed {
            None => proto::MissedPolicy::Unspecified,
            Some(MissedArg::Skip) => proto::MissedPolicy::Skip,
            Some(MissedArg::FireOne) => proto::MissedPolicy::FireOne,
            Some(MissedArg::FireEach) => proto::MissedPolicy::FireEach,
        };
        proto::SeriesSpec {
            template: Some(self.record.message()),
            every: Some(every),
            time_zone: self.zone.clone().unwrap_or_default(),
            start: self.start.map(to_timestamp),
            end: self.end.map(to_timestamp),
            count: self.count.unwrap_or(0),
            jitter: self.jitter.map(client::wire),
            missed: Some(proto::Missed {
                policy: policy.into(),
                at_most: self.missed_at_most.unwrap_or(0),
                after: self.missed_after.map(client::wire),
            }),
            labels: self.labels.iter().cloned().collect(),
        }
    }
}

type Client = hourglass_kafka::SeriesClient;

async fn connect(server: &ClientArgs) -> anyhow::Result<Client> {
    Ok(client::connection(server).await?.series())
}

pub async fn run(args: SeriesArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        SeriesCommand::Create(args) => create(args).await,
        SeriesCommand::Get(args) => get(args).await,
        SeriesCommand::List(args) => list(args).await,
        SeriesCommand::Update(args) => update(args).await,
        SeriesCommand::Pause(args) => pause(args).await,
        SeriesCommand::Resume(args) => resume(args).await,
        SeriesCommand::Delete(args) => delete(args).await,
    }
}

async fn create(args: SpecArgs) -> anyhow::Result<ExitCode> {
    let request = proto::CreateSeriesRequest { id: args.id.clone(), spec: Some(args.spec()) };
    let reply = connect(&args.client).await?.create_series(request).await.map_err(status_error)?.into_inner();
    let info = reply.series.unwrap_or_default();
    match args.client.output {
        Output::Json => print_json(&Created { created: reply.created, series: Info::from(info) })?,
        Output::Text => {
            let again = if reply.created { "" } else { " (already created by this same request)" };
            println!("created series {}{again}; next occurrence {}", info.id, next(&info));
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn update(args: SpecArgs) -> anyhow::Result<ExitCode> {
    let request = proto::UpdateSeriesRequest { id: args.id.clone(), spec: Some(args.spec()) };
    let reply = connect(&args.client).await?.update_series(request).await.map_err(status_error)?.into_inner();
    let info = reply.series.unwrap_or_default();
    changed(args.client.output, "updated", info, reply.occurrences)
}

async fn pause(args: SeriesId) -> anyhow::Result<ExitCode> {
    let request = proto::PauseSeriesRequest { id: args.id, tenant: args.tenant };
    let reply = connect(&args.client).await?.pause_series(request).await.map_err(status_error)?.into_inner();
    changed(args.client.output, "paused", reply.series.unwrap_or_default(), reply.occurrences)
}

async fn resume(args: SeriesId) -> anyhow::Result<ExitCode> {
    let request = proto::ResumeSeriesRequest { id: args.id, tenant: args.tenant };
    let info = connect(&args.client).await?.resume_series(request).await.map_err(status_error)?.into_inner();
    changed(args.client.output, "resumed", info, Vec::new())
}

async fn delete(args: SeriesId) -> anyhow::Result<ExitCode> {
    let request = proto::DeleteSeriesRequest { id: args.id.clone(), tenant: args.tenant };
    let reply = connect(&args.client).await?.delete_series(request).await.map_err(status_error)?.into_inner();
    let info = proto::SeriesInfo { id: args.id, ..Default::default() };
    match args.client.output {
        Output::Json => print_json(&Deleted { id: info.id, occurrences: outcomes(reply.occurrences) })?,
        Output::Text => {
            println!("deleted series {}", info.id);
            print_outcomes(&reply.occurrences);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints what a change did: the series, and its parked occurrences'
/// outcomes.
fn changed(
    output: Output,
    verb: &str,
    info: proto::SeriesInfo,
    occurrences: Vec<proto::OccurrenceOutcome>,
) -> anyhow::Result<ExitCode> {
    match output {
        Output::Json => {
            print_json(&Changed { series: Info::from(info), occurrences: outcomes(occurrences) })?
        }
        Output::Text => {
            println!("{verb} series {}; next occurrence {}", info.id, next(&info));
            print_outcomes(&occurrences);
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_outcomes(occurrences: &[proto::OccurrenceOutcome]) {
    for o in occurrences {
        println!("occurrence {}: {}", o.id, json::outcome(o.outcome()).replace('_', " "));
    }
}

fn next(info: &proto::SeriesInfo) -> String {
    match info.state() {
        proto::SeriesState::Paused => "none (paused)".to_owned(),
        proto::SeriesState::Finished => "none (finished)".to_owned(),
        _ => time(info.next.first().copied()),
    }
}

async fn get(args: GetArgs) -> anyhow::Result<ExitCode> {
    let request = proto::GetSeriesRequest { id: args.id, next: args.next, tenant: args.tenant };
    let info = connect(&args.client).await?.get_series(request).await.map_err(status_error)?.into_inner();
    if args.client.output == Output::Json {
        print_json(&Info::from(info))?;
        return Ok(ExitCode::SUCCESS);
    }
    let spec = info.spec.clone().unwrap_or_default();
    println!("id:         {}", info.id);
    println!("state:      {}", state(info.state()));
    println!("every:      {}", every(&spec));
    if let Some(t) = &spec.template {
        println!("topic:      {}", t.topic);
        if let Some(k) = &t.key {
            println!("key:        {}", client::bytes(k));
        }
        println!("value:      {}", client::bytes(&t.value));
    }
    let labels: std::collections::BTreeMap<_, _> = spec.labels.iter().collect();
    for (key, value) in labels {
        println!("label:      {key}={value}");
    }
    println!("fired:      {}", info.fired);
    if info.skipped > 0 {
        println!("skipped:    {}", info.skipped);
    }
    for id in &info.parked {
        println!("parked:     {id}");
    }
    for t in &info.next {
        println!("next:       {}", time(Some(*t)));
    }
    Ok(ExitCode::SUCCESS)
}

async fn list(args: ListArgs) -> anyhow::Result<ExitCode> {
    let mut client = connect(&args.client).await?;
    let mut request = proto::ListSeriesRequest {
        topic: args.topic.unwrap_or_default(),
        selector: args.selector.unwrap_or_default(),
        page_size: args.page_size.unwrap_or(0),
        page_token: args.page_token.unwrap_or_default(),
    };
    let mut listed = 0usize;
    loop {
        let page = client.list_series(request.clone()).await.map_err(status_error)?.into_inner();
        listed += page.series.len();
        let next_token = page.next_page_token.clone();
        match args.client.output {
            Output::Json => print_json(&Page {
                series: page.series.into_iter().map(Info::from).collect(),
                next_page_token: json::text(page.next_page_token),
            })?,
            Output::Text => {
                let width = page.series.iter().map(|s| s.id.len()).max().unwrap_or(0);
                for s in &page.series {
                    let spec = s.spec.clone().unwrap_or_default();
                    let topic = spec.template.as_ref().map_or("", |t| t.topic.as_str());
                    println!(
                        "{:width$}  {:8}  {}  {topic}  next {}",
                        s.id,
                        state(s.state()),
                        every(&spec),
                        next(s)
                    );
                }
            }
        }
        if next_token.is_empty() || !args.all {
            if args.client.output == Output::Text {
                if listed == 0 {
                    println!("no series match");
                }
                if !next_token.is_empty() {
                    println!("more: --page-token {next_token}");
                }
            }
            return Ok(ExitCode::SUCCESS);
        }
        anyhow::ensure!(next_token != request.page_token, "the server returned the same page token twice");
        request.page_token = next_token;
    }
}

fn state(s: proto::SeriesState) -> String {
    s.as_str_name().trim_start_matches("SERIES_STATE_").to_lowercase()
}

/// The rule as written: `cron "…" in Zone`, or `every 1m`.
fn every(spec: &proto::SeriesSpec) -> String {
    match &spec.every {
        Some(proto::series_spec::Every::Cron(expr)) => {
            let zone = if spec.time_zone.is_empty() { "UTC" } else { spec.time_zone.as_str() };
            format!("cron {expr:?} in {zone}")
        }
        Some(proto::series_spec::Every::Interval(d)) => {
            let d = Duration::new(d.seconds.max(0) as u64, d.nanos.max(0) as u32);
            format!("every {}", humantime::format_duration(d))
        }
        None => "-".to_owned(),
    }
}

#[derive(Debug, Serialize)]
struct Info {
    id: String,
    state: String,
    every: String,
    topic: String,
    labels: std::collections::BTreeMap<String, String>,
    fired: u64,
    skipped: u64,
    parked: Vec<String>,
    next: Vec<String>,
    created_at: Option<String>,
    updated_at: Option<String>,
}

impl From<proto::SeriesInfo> for Info {
    fn from(s: proto::SeriesInfo) -> Info {
        let spec = s.spec.clone().unwrap_or_default();
        Info {
            state: state(s.state()),
            every: every(&spec),
            topic: spec.template.map(|t| t.topic).unwrap_or_default(),
            labels: spec.labels.into_iter().collect(),
            id: s.id,
            fired: s.fired,
            skipped: s.skipped,
            parked: s.parked,
            next: s.next.into_iter().filter_map(|t| json::time(Some(t))).collect(),
            created_at: json::time(s.created_at),
            updated_at: json::time(s.updated_at),
        }
    }
}

#[derive(Debug, Serialize)]
struct Created {
    created: bool,
    series: Info,
}

#[derive(Debug, Serialize)]
struct Outcome {
    id: String,
    outcome: String,
}

fn outcomes(occurrences: Vec<proto::OccurrenceOutcome>) -> Vec<Outcome> {
    occurrences.into_iter().map(|o| Outcome { outcome: json::outcome(o.outcome()), id: o.id }).collect()
}

#[derive(Debug, Serialize)]
struct Changed {
    series: Info,
    occurrences: Vec<Outcome>,
}

#[derive(Debug, Serialize)]
struct Deleted {
    id: String,
    occurrences: Vec<Outcome>,
}

#[derive(Debug, Serialize)]
struct Page {
    series: Vec<Info>,
    next_page_token: Option<String>,
}
