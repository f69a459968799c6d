//! The series phase: many series each firing once a minute, their starts
//! spread evenly over the minute, so that the server fires `n / 60`
//! occurrences a second. Measured: how fast series are created, the memory
//! and disk they take, the occurrences delivered per second over whole
//! minutes, and the lateness of a sample of them (their delivery report
//! minus their time), as the other phases measure one-off messages.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;
use tokio::task::JoinSet;

use hourglass::{
    api::convert::timestamp,
    message::UnixMillis,
    proto::{self, series_client::SeriesClient},
};
use hourglass_testkit::ServerProcess;

use crate::{
    stages::Stages,
    workload::{Workload, now_ms},
};

const MINUTE: u64 = 60_000;

/// What the phase measured.
pub struct Fired {
    /// Series created per second.
    pub created_rate: f64,
    /// Occurrences delivered per second over the measured minutes.
    pub fired_rate: f64,
    /// Lateness of the sampled occurrences delivered, sorted (ms).
    pub late: Vec<i64>,
    /// Occurrences sampled, and of those not delivered (skipped by the
    /// downtime policy when the driver fell more than a minute behind).
    pub sampled: usize,
    pub missing: usize,
    /// Resident memory and disk before and after the series were created.
    pub rss: (Option<u64>, Option<u64>),
    pub disk: (u64, u64),
    /// The dispatch stages over the measured minutes: before and after.
    pub(crate) stages: (Stages, Stages),
    /// Of the occurrences parked over the measured minutes, how many were
    /// parked at or after their due time, and within 50 ms before it; and
    /// how many were parked.
    pub parked: ParkLead,
}

/// How far ahead of their due times the driver parked occurrences (the
/// server's `hourglass_series_park_lead_seconds`), counted over a window.
#[derive(Clone, Copy, Default)]
pub struct ParkLead {
    pub at_or_after: f64,
    pub within_50ms: f64,
    pub total: f64,
}

impl ParkLead {
    async fn read(server: &ServerProcess) -> anyhow::Result<ParkLead> {
        const METRIC: &str = "hourglass_series_park_lead_seconds";
        let bucket = |le: &'static str| server.metric_or_zero(format!("{METRIC}_bucket{{le=\"{le}\"}}"));
        Ok(ParkLead {
            at_or_after: bucket("0").await?,
            within_50ms: bucket("0.05").await?,
            total: server.metric_or_zero(format!("{METRIC}_count")).await?,
        })
    }

    fn since(self, before: ParkLead) -> ParkLead {
        ParkLead {
            at_or_after: self.at_or_after - before.at_or_after,
            within_50ms: self.within_50ms - before.within_50ms,
            total: self.total - before.total,
        }
    }
}

/// Creates `n` series of `w`'s records, each every minute, and measures
/// them over `minutes` whole minutes of firing; `disk` says how much the
/// store's directory takes.
pub async fn run(
    server: &ServerProcess,
    w: &Workload,
    n: usize,
    minutes: u64,
    callers: usize,
    disk: impl Fn() -> u64,
) -> anyhow::Result<Fired> {
    let prefix = format!("bench-series-{}", ulid::Ulid::new().to_string().to_lowercase());
    let (rss0, disk0) = (server.rss_bytes(), disk());
    // Created well before the first fires, at a conservative 5,000 a
    // second; series i starts at t0 + i/n of a minute.
    let t0 = now_ms() + 15_000 + n as u64 / 5;
    let start_of = move |i: usize| t0 + i as u64 * MINUTE / n as u64;
    let next = Arc::new(AtomicUsize::new(0));
    let url = format!("http://{}", server.grpc);
    let mut tasks = JoinSet::new();
    let started = Instant::now();
    for _ in 0..callers.max(1) {
        let mut client = SeriesClient::connect(url.clone()).await.context("connecting for CreateSeries")?;
        let (next, w, prefix) = (Arc::clone(&next), w.clone(), prefix.clone());
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return Ok::<_, anyhow::Error>(());
                }
                let spec = proto::SeriesSpec {
                    template: Some(w.envelope(i).into()),
                    every: Some(proto::series_spec::Every::Interval(prost_types::Duration {
                        seconds: 60,
                        nanos: 0,
                    })),
                    start: Some(timestamp(UnixMillis(start_of(i)))),
                    ..Default::default()
                };
                let request = proto::CreateSeriesRequest { id: format!("{prefix}-{i}"), spec: Some(spec) };
                client.create_series(request).await.context("CreateSeries")?;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    let created_rate = n as f64 / started.elapsed().as_secs_f64();
    eprintln!("bench: series: {n} created in {:.1?}", started.elapsed());
    let created_by = now_ms();
    // Memory and disk once the store has flushed what it took.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (rss1, disk1) = (server.rss_bytes(), disk());

    // Whole minutes from the first one that begins after creation ended.
    let first_minute = t0 + ((created_by.max(t0) - t0) / MINUTE + 1) * MINUTE;
    let last = first_minute + minutes * MINUTE;
    eprintln!("bench: series: measuring from {} for {minutes} min", first_minute as i64 - now_ms() as i64);
    wait_until(first_minute).await;
    let before = server.metric("hourglass_messages_delivered_total").await?;
    let (stages_before, lead_before) = (Stages::read(server).await?, ParkLead::read(server).await?);
    wait_until(last).await;
    let delivered = server.metric("hourglass_messages_delivered_total").await? - before;
    let (stages_after, lead_after) = (Stages::read(server).await?, ParkLead::read(server).await?);
    let fired_rate = delivered / (minutes * MINUTE / 1000) as f64;
    // Let the last ones out, then read a sample's delivery times.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let sample = 10_000.min(n);
    let messages: Vec<(String, u64)> = (0..sample)
        .map(|k| {
            let i = k * n / sample;
            let start = start_of(i);
            let minute = (first_minute.saturating_sub(start)).div_ceil(MINUTE);
            let at = start + minute * MINUTE;
            (format!("{prefix}-{i}@{at}"), at)
        })
        .filter(|(_, at)| *at < last)
        .collect();
    eprintln!("bench: series: reading {} occurrences back", messages.len());
    let sampled = messages.len();
    let (late, missing) =
        crate::load::lateness_of_delivered(std::slice::from_ref(server), &messages, 32).await?;
    Ok(Fired {
        created_rate,
        fired_rate,
        late,
        sampled,
        missing,
        rss: (rss0, rss1),
        disk: (disk0, disk1),
        stages: (stages_before, stages_after),
        parked: lead_after.since(lead_before),
    })
}

async fn wait_until(t: u64) {
    let now = now_ms();
    if t > now {
        tokio::time::sleep(Duration::from_millis(t - now)).await;
    }
}
