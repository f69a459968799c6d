//! The console phase, with the backlog parked (10 million with `--full
//! --only footprint,console`, due a day from when they were parked) and
//! 200,000 more due over the next day: how long a person's page takes (the
//! overview by hour, day and week, a find by label among the backlog, a
//! message's page), and what a person browsing costs the dispatcher: the
//! precision of a steady rate measured twice, the console left alone, then
//! polled every second.

use std::{net::SocketAddr, time::Duration};

use anyhow::{Context as _, bail};
use hourglass::proto::{self, scheduler_client::SchedulerClient};
use hourglass_testkit::ServerProcess;
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    time::Instant,
};

use crate::{
    LatenessTargets, add_lateness,
    load::percentile,
    report::Report,
    steady,
    workload::{Workload, now_ms},
};

/// Labelled messages parked among the backlog, each ten seconds apart.
const LABELLED: usize = 1_000;
/// Messages due over the next day (the backlog lies beyond it), so that
/// the hour's and the day's histograms have something to count.
const TODAY: usize = 200_000;
/// Loads of each page measured.
const LOADS: usize = 10;

pub struct Console<'a> {
    pub server: &'a ServerProcess,
    pub addr: SocketAddr,
    pub w: &'a Workload,
    pub streams: usize,
    pub rate: usize,
    pub window: Duration,
}

/// One GET with the session's cookie; the answer's status line and body.
async fn get(addr: SocketAddr, path: &str, cookie: &str) -> anyhow::Result<(String, String)> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nCookie: {cookie}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).await?;
    let (head, body) = raw.split_once("\r\n\r\n").context("no HTTP answer")?;
    Ok((head.to_owned(), body.to_owned()))
}

/// A session of the console (no tokens: it opens one at once).
async fn session(addr: SocketAddr) -> anyhow::Result<String> {
    let (head, _) = get(addr, "/sign-in", "").await?;
    let cookie = head
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: ").or_else(|| l.strip_prefix("Set-Cookie: ")))
        .context("the console set no cookie")?;
    Ok(cookie.split(';').next().unwrap_or_default().to_owned())
}

/// The pages a person opens, with their paths.
fn pages(topic: &str) -> Vec<(&'static str, String)> {
    vec![
        ("overview, next hour", "/?span=hour".to_owned()),
        ("overview, next day", "/?span=day".to_owned()),
        ("overview, next week", "/?span=week".to_owned()),
        ("find by label", format!("/messages?label=console%3Dbench&topic={topic}")),
        ("a message", "/message?id=console-bench-500".to_owned()),
    ]
}

impl Console<'_> {
    pub async fn run(&self, report: &mut Report) -> anyhow::Result<()> {
        // Labelled messages among the parked ones, over the same hours.
        let mut client = SchedulerClient::connect(format!("http://{}", self.server.grpc)).await?;
        let first = now_ms() + 86_400_000;
        let requests: Vec<proto::ScheduleRequest> = (0..LABELLED)
            .map(|i| {
                let mut r = self.w.at(i, first + i as u64 * 10_000);
                r.id = Some(format!("console-bench-{i}"));
                r.labels = [("console".to_owned(), "bench".to_owned())].into();
                r
            })
            .collect();
        let start = now_ms() + 300_000;
        let spread = 86_000_000 / TODAY as u64;
        let today = (0..TODAY).map(|i| self.w.at(i, start + i as u64 * spread));
        for part in requests
            .chunks(500)
            .map(<[_]>::to_vec)
            .chain(today.collect::<Vec<_>>().chunks(1000).map(<[_]>::to_vec).collect::<Vec<_>>())
        {
            client.schedule_batch(proto::ScheduleBatchRequest { requests: part }).await?;
        }
        let parked = self.server.metric("hourglass_messages_pending").await? as u64;
        let cookie = session(self.addr).await?;
        for (name, path) in pages(&self.w.topic) {
            // The first load counts; the overview shows a slow count again
            // for a while, so the loads after it may not.
            let mut took = Vec::with_capacity(LOADS + 1);
            let mut shown_again = 0;
            for _ in 0..=LOADS {
                let started = Instant::now();
                let (head, body) = get(self.addr, &path, &cookie).await?;
                if !head.starts_with("HTTP/1.1 200") || body.contains("id=\"refused\"") {
                    bail!("console page {path}: {head}\n{body}");
                }
                took.push(started.elapsed().as_secs_f64() * 1000.0);
                shown_again += usize::from(body.contains("id=\"counted\""));
            }
            let first = took.remove(0);
            took.sort_by(f64::total_cmp);
            let label = format!("console, {parked} parked: {name}");
            report.add(format!("{label}: first"), first, "ms", None, &[]);
            report.add(format!("{label}: p50"), percentile(&took, 50.0), "ms", None, &[]);
            report.add(format!("{label}: max"), took.last().copied().unwrap_or(0.0), "ms", None, &[]);
            if shown_again > 0 {
                report.note(format!(
                    "console: {name}: {shown_again} of {LOADS} loads after the first showed its count again"
                ));
            }
        }

        // Precision, alone and while a person browses: every second the
        // overview (next day), a find and a message's page, one after the
        // other.
        let targets = || LatenessTargets { p99: Some(2.0), p999: None, max: None };
        let name = format!("precision at {}/s", self.rate);
        crate::phase("console: precision, the console left alone");
        let alone =
            steady(self.server, self.w, self.streams, self.rate, self.window, None, "console alone", report)
                .await?;
        add_lateness(report, &format!("{name}, console alone:"), &alone, targets());
        crate::phase("console: precision, the console polled every second");
        let stop = tokio_util::sync::CancellationToken::new();
        let browsing = tokio::spawn({
            let (addr, cookie, stop, paths) = (self.addr, cookie.clone(), stop.clone(), pages(&self.w.topic));
            async move {
                let mut loads = 0u64;
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                while !stop.is_cancelled() {
                    tick.tick().await;
                    for (_, path) in paths.iter().skip(1) {
                        if get(addr, path, &cookie).await.is_ok() {
                            loads += 1;
                        }
                    }
                }
                loads
            }
        });
        let polled =
            steady(self.server, self.w, self.streams, self.rate, self.window, None, "console polled", report)
                .await;
        stop.cancel();
        let loads = browsing.await?;
        add_lateness(report, &format!("{name}, console polled:"), &polled?, targets());
        report.note(format!("console: {loads} page loads while the polled precision ran"));
        Ok(())
    }
}

/// The console's address for a server started by the bench.
pub fn listen() -> anyhow::Result<SocketAddr> {
    Ok(SocketAddr::from(([127, 0, 0, 1], hourglass_testkit::free_port()?)))
}
