//! `hourglass-bench`: throughput, precision and footprint against a real
//! broker and a real store, each figure beside the limit of the machine it
//! ran on, measured in the same run. A tool beside the product: it starts
//! the real `hourglass serve` binary and drives it over gRPC.
//!
//! The server under test is the real binary in its own process (so its
//! memory is its own and it restarts for real); the load generator and the
//! limits run in this process. Phases, in order, on one store:
//!
//! 1. limits: raw RocksDB batches of the same records with the same sync
//!    setting; a bare rdkafka producer with hourglass's producer settings;
//!    for the drain, that producer beside a bare pass of the store over as
//!    many due entries, both at once.
//! 2. ingest: unary `Schedule` from many clients (the bench's own, then,
//!    where it is installed, nghttp2's `h2load`), `ScheduleBatch`,
//!    `ScheduleStream`; everything due a day later, so it stays parked.
//! 3. drain: messages all due in the same millisecond, until Kafka has
//!    acknowledged the last one.
//! 4. precision: messages due at a steady rate over a window while the
//!    backlog stays parked, at the targets' rate and at four times it;
//!    lateness = broker acknowledgement minus due, and where it went (the
//!    server's stage histograms: waiting to be produced, the broker).
//! 5. burst: many due in one millisecond, then a trickle just after it.
//! 6. footprint: memory and disk with the large backlog parked, and the
//!    time from process start to dispatching again, after SIGTERM and after
//!    SIGKILL.
//! 7. reconcile: a drain cut by SIGKILL with the in-flight window full;
//!    the restart's first delivery (what is not in doubt goes out while
//!    the search runs), its search of the topic for what was in doubt,
//!    with and without another producer writing to the topic; duplicates.
//! 8. series: many series each every minute, their starts spread over the
//!    minute: occurrences fired per second and their lateness; then, on a
//!    fresh server and store, one-off messages due at the same rate.

pub mod cluster;
mod console;
mod h2load;
pub mod limits;
mod load;
mod machine;
mod otlp;
mod policy;
mod reconcile;
mod report;
mod series;
mod stages;
mod workload;

use std::{
    path::PathBuf,
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;
use hourglass::{kafka::KafkaConfig, proto, store::Durability};
use hourglass_testkit::{LocalBroker, ServerProcess, create_topic, delete_topic, rss_of};
use load::{DueOf, percentile};
use machine::Machine;
use rdkafka::{mocking::MockCluster, producer::DefaultProducerContext};
pub use report::{Measurement, Report, Target};
use workload::{Workload, now_ms};

/// How much of everything; `full` is the scale the targets are set for.
#[derive(Clone, Debug)]
pub struct Scale {
    pub unary: usize,
    pub batch: usize,
    pub stream: usize,
    /// Parked (due much later) while drain and precision are measured.
    pub backlog: usize,
    pub drain: usize,
    pub precision_rate: usize,
    pub precision_window: Duration,
    pub burst: usize,
    pub trickle_rate: usize,
    pub trickle_window: Duration,
    /// Parked with a label, then cancelled by it (`CancelMatching`).
    pub cancel: usize,
    /// Series each firing once a minute.
    pub series: usize,
    /// Whole minutes their firing is measured over.
    pub series_minutes: u64,
    /// Parked when memory, disk and restart are measured.
    pub footprint: usize,
    /// Cluster mode: how long the steady load of the failover phase lasts.
    pub failover_window: Duration,
}

impl Scale {
    pub fn reduced() -> Scale {
        Scale {
            unary: 30_000,
            batch: 300_000,
            stream: 300_000,
            backlog: 1_000_000,
            drain: 200_000,
            precision_rate: 5_000,
            precision_window: Duration::from_secs(10),
            burst: 200_000,
            trickle_rate: 1_000,
            trickle_window: Duration::from_secs(3),
            cancel: 100_000,
            series: 100_000,
            series_minutes: 1,
            footprint: 1_000_000,
            failover_window: Duration::from_secs(30),
        }
    }

    pub fn full() -> Scale {
        Scale {
            unary: 200_000,
            batch: 1_000_000,
            stream: 1_000_000,
            backlog: 2_000_000,
            drain: 1_000_000,
            precision_rate: 5_000,
            precision_window: Duration::from_secs(60),
            burst: 1_000_000,
            trickle_rate: 1_000,
            trickle_window: Duration::from_secs(5),
            cancel: 1_000_000,
            series: 1_000_000,
            series_minutes: 2,
            footprint: 10_000_000,
            failover_window: Duration::from_secs(30),
        }
    }

    /// Every count times `f` (at least 10); windows shrink with it, to 1 s.
    pub fn times(self, f: f64) -> Scale {
        let n = |x: usize| ((x as f64 * f) as usize).max(10);
        let window = |d: Duration| Duration::from_secs_f64((d.as_secs_f64() * f.min(1.0)).max(1.0));
        let rate = |r: usize| if f < 1.0 { ((r as f64 * f) as usize).max(10) } else { r };
        Scale {
            unary: n(self.unary),
            batch: n(self.batch),
            stream: n(self.stream),
            backlog: n(self.backlog),
            drain: n(self.drain),
            precision_rate: rate(self.precision_rate),
            precision_window: window(self.precision_window),
            burst: n(self.burst),
            trickle_rate: rate(self.trickle_rate),
            trickle_window: window(self.trickle_window),
            cancel: n(self.cancel),
            series: n(self.series),
            series_minutes: self.series_minutes,
            footprint: n(self.footprint),
            failover_window: Duration::from_secs_f64(
                (self.failover_window.as_secs_f64() * f.min(1.0)).max(9.0),
            ),
        }
    }
}

/// How the bench drives hourglass.
#[derive(Clone, Debug)]
pub struct Settings {
    pub scale: Scale,
    /// Bootstrap servers, or [`MOCK`]; none: a local Tansu.
    pub brokers: Option<String>,
    /// `--delivery` of the server under test.
    pub delivery: hourglass::config::DeliveryMode,
    pub dir: Option<PathBuf>,
    pub durability: Durability,
    pub partitions: i32,
    pub value_bytes: usize,
    pub clients: usize,
    /// Connections the unary clients share.
    pub connections: usize,
    pub batch_size: usize,
    pub batch_callers: usize,
    pub streams: usize,
    /// Each call traced, the server's spans exported to the bench.
    pub trace: bool,
    /// The phases to run (limits always run).
    pub phases: Vec<Phase>,
    /// Measure a cluster of nodes instead of one standalone server.
    pub cluster: Option<cluster::ClusterSettings>,
}

/// A phase of the bench that can be run on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Phase {
    Ingest,
    Drain,
    Precision,
    Burst,
    /// Messages parked with a label, cancelled by a selector.
    Cancel,
    Footprint,
    /// Cluster mode only: a node killed under a steady load.
    Failover,
    /// Cluster mode only: every shard restored from the log.
    Restore,
    /// A drain cut by SIGKILL, and the restart's reconciliation.
    Reconcile,
    /// Series each firing once a minute, spread over the minute.
    Series,
    /// A burst into a rate-limited topic; a drain beside a policy.
    Policy,
    /// The console's page loads with the backlog parked, and precision
    /// with and without it polled (after footprint: 10M parked with
    /// `--full`).
    Console,
}

impl Phase {
    pub const ALL: [Phase; 12] = [
        Phase::Ingest,
        Phase::Drain,
        Phase::Precision,
        Phase::Burst,
        Phase::Policy,
        Phase::Cancel,
        Phase::Footprint,
        Phase::Console,
        Phase::Reconcile,
        Phase::Series,
        Phase::Failover,
        Phase::Restore,
    ];
}

/// Runs the bench, prints the table, writes JSON if asked.
pub async fn main(settings: Settings, json: Option<PathBuf>) -> anyhow::Result<ExitCode> {
    let report = match &settings.cluster {
        Some(c) => cluster::run(&settings, c).await?,
        None => run(settings).await?,
    };
    println!("{}", report.table());
    if let Some(path) = json {
        let file = std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        serde_json::to_writer_pretty(file, &report).context("writing the JSON report")?;
        eprintln!("figures written to {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn phase(name: &str) {
    eprintln!("bench: {name}");
}

const DAY: Duration = Duration::from_secs(86_400);

/// Records a second another producer writes to the bench topic in the
/// second run of the reconcile phase.
const FOREIGN_RATE: u64 = 50_000;

/// Due a day from now (parked for the whole run), each a millisecond apart
/// so they spread over the due index as real traffic would.
fn parked(from: u64) -> DueOf {
    let base = now_ms() + DAY.as_millis() as u64;
    Arc::new(move |i| base + from + i as u64)
}

/// Where a run works: its directory (under `--dir`), the report with the
/// machine described, and the broker (`--brokers`, or a local one started
/// for the run and stopped with it).
struct Bench {
    dir: tempfile::TempDir,
    report: Report,
    brokers: String,
    local: Option<LocalBroker>,
    /// `--brokers mock`: the mock cluster, which makes topics itself.
    mock: Option<MockCluster<'static, DefaultProducerContext>>,
}

/// `--brokers mock`: librdkafka's mock cluster, in this process.
pub const MOCK: &str = "mock";

impl Bench {
    fn start(s: &Settings) -> anyhow::Result<Bench> {
        let dir = match &s.dir {
            Some(d) => tempfile::tempdir_in(d)?,
            None => tempfile::tempdir()?,
        };
        let report = Report { machine: Machine::describe(dir.path()), ..Report::default() };
        let (brokers, local, mock) = match s.brokers.as_deref() {
            Some(MOCK) => {
                phase("starting librdkafka's mock cluster");
                let mock = MockCluster::new(1).context("starting the mock cluster")?;
                (mock.bootstrap_servers(), None, Some(mock))
            }
            Some(b) => (b.to_owned(), None, None),
            None => {
                phase("starting a local broker (tansu, in memory)");
                let local = LocalBroker::start()?;
                (local.addr.clone(), Some(local), None)
            }
        };
        Ok(Bench { dir, report, brokers, local, mock })
    }

    /// The local broker's process id, when the bench started one.
    fn broker_pid(&self) -> Option<u32> {
        self.local.as_ref().and_then(LocalBroker::pid)
    }

    /// How the broker is named in the settings line.
    fn broker_setting(&self, s: &Settings) -> String {
        match s.brokers.as_deref() {
            Some(MOCK) => "librdkafka 2.12 mock cluster (in the bench process)".into(),
            Some(_) => self.brokers.clone(),
            None => "local tansu 0.6 (memory)".into(),
        }
    }

    async fn create_topic(&self, name: &str, partitions: i32) -> anyhow::Result<()> {
        match &self.mock {
            Some(mock) => Ok(mock.create_topic(name, partitions, 1)?),
            None => create_topic(&self.brokers, name, partitions).await,
        }
    }
}

/// Due entries a drain reads at a time, as the dispatcher does.
const DRAIN_READ: usize = 8192;
/// Deliveries a drain records at a time, about as the writer does.
const DRAIN_SETTLE: usize = 2048;

pub async fn run(s: Settings) -> anyhow::Result<Report> {
    let mut bench = Bench::start(&s)?;
    let broker_setting = bench.broker_setting(&s);
    let mut report = std::mem::take(&mut bench.report);
    let (dir, brokers) = (&bench.dir, bench.brokers.clone());
    let settings = [
        ("durability", format!("{:?}", s.durability).to_lowercase()),
        ("delivery", s.delivery.to_string()),
        ("broker", broker_setting),
        ("partitions", s.partitions.to_string()),
        ("record", format!("{} B value, 10 B key, 2 headers", s.value_bytes)),
        ("unary", format!("{} clients on {} connections", s.clients, s.connections.clamp(1, s.clients))),
        ("batch", format!("{} x {} callers", s.batch_size, s.batch_callers)),
        ("streams", s.streams.to_string()),
        (
            "tracing",
            if s.trace { "every call traced, spans exported over OTLP to the bench" } else { "off" }.into(),
        ),
    ];
    report.settings = settings.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();

    let run_id = ulid::Ulid::new().to_string().to_lowercase();
    let topic = format!("hourglass-bench-{run_id}");
    let raw_topic = format!("hourglass-bench-raw-{run_id}");
    bench.create_topic(&topic, s.partitions).await?;
    bench.create_topic(&raw_topic, s.partitions).await?;
    let w = Workload { traced: s.trace, ..Workload::new(&topic, s.value_bytes) };
    let sync = s.durability == Durability::Sync;
    let sc = &s.scale;

    // 1. Limits.
    phase("store limit: raw RocksDB atomic writes");
    let raw_dir = dir.path().join("raw");
    let store_limit = |batch: usize, messages: usize, sub: &str| {
        let (dir, w) = (raw_dir.join(sub), w.clone());
        tokio::task::spawn_blocking(move || limits::store_writes(&dir, sync, batch, messages, &w))
    };
    let raw_1 = store_limit(1, sc.unary.min(10_000), "b1").await??;
    let raw_b = store_limit(s.batch_size, sc.batch, "bn").await??;
    let raw_4k = store_limit(4096, sc.batch, "b4k").await??;
    phase("producer limit: bare rdkafka producer");
    let kafka = KafkaConfig { brokers: brokers.clone(), properties: Default::default() };
    // The best of two runs: the limit is what the hardware can do.
    let mut producer_limit = 0f64;
    for _ in 0..2 {
        let (kafka, raw_topic, w, n) = (kafka.clone(), raw_topic.clone(), w.clone(), sc.drain);
        let rate = tokio::task::spawn_blocking(move || limits::producer(&kafka, &raw_topic, n, &w)).await??;
        producer_limit = producer_limit.max(rate);
    }
    report.add("store limit: 1 msg/write", raw_1, "msg/s", None, &[]);
    report.add(format!("store limit: {} msg/write", s.batch_size), raw_b, "msg/s", None, &[]);
    report.add("store limit: 4096 msg/write", raw_4k, "msg/s", None, &[]);
    report.add("producer limit", producer_limit, "msg/s", None, &[]);
    // A drain's own work without hourglass: the producer and a store pass
    // over as many due entries, together. The best of two runs.
    phase("drain limit: bare producer beside a bare store pass");
    let mut drain_limit = 0f64;
    for run in 0..2 {
        let (kafka, raw_topic, w, n) = (kafka.clone(), raw_topic.clone(), w.clone(), sc.drain);
        let dir = raw_dir.join(format!("drain-{run}"));
        let rate = tokio::task::spawn_blocking(move || {
            limits::drain(&dir, sync, &kafka, &raw_topic, n, DRAIN_READ, DRAIN_SETTLE, &w)
        })
        .await??;
        drain_limit = drain_limit.max(rate);
    }
    std::fs::remove_dir_all(&raw_dir).ok();
    report.add("drain limit: producer beside a store pass", drain_limit, "msg/s", None, &[]);

    // 2. Ingest.
    let data = dir.path().join("store");
    let mut server =
        ServerProcess::new(&hourglass_testkit::hourglass_binary()?, &data, &brokers, s.durability)?;
    server.env("HOURGLASS_DELIVERY", &s.delivery.to_string());
    // The series phase makes more series than a tenant may have by default.
    server.env("HOURGLASS_SERIES_MAX_PER_TENANT", &sc.series.max(10_000).to_string());
    let console_addr = console::listen()?;
    server.env("HOURGLASS_CONSOLE_LISTEN", &console_addr.to_string());
    let collector = match s.trace {
        true => Some(otlp::Collector::start().await?),
        false => None,
    };
    if let Some(collector) = &collector {
        server.env("HOURGLASS_OTLP_ENDPOINT", &collector.endpoint);
    }
    let mut server = server.launch().await?;
    report.add("memory: empty", mib(server.rss_bytes()), "MiB", None, &[]);
    let mut offset = 0u64;
    let mut next_parked = |n: usize| {
        let due = parked(offset);
        offset += n as u64;
        due
    };
    let runs = |p: Phase| s.phases.contains(&p);
    let mut parked_now = 0;
    if runs(Phase::Ingest) {
        phase("ingest: unary Schedule");
        let run = load::calls(
            std::slice::from_ref(&server),
            &w,
            sc.unary,
            load::Call::Unary,
            s.clients,
            s.connections,
            next_parked(sc.unary),
        )
        .await?;
        let name = format!("ingest: Schedule, {} clients", s.clients);
        report.add(&name, run.rate(), "msg/s", Some(raw_b), &[Target::AtLeast(45_000.0)]);
        report.add(format!("{name}: p50"), ms(run.percentile(50.0)), "ms", None, &[]);
        report.add(format!("{name}: p99"), ms(run.percentile(99.0)), "ms", None, &[Target::AtMost(5.0)]);
        // The same calls from a client that is not ours, which leaves the
        // server more of the machine.
        if h2load::installed() {
            phase("ingest: unary Schedule from h2load");
            let due = next_parked(sc.unary)(0);
            let run = h2load::unary(&server, &w, sc.unary, s.clients, due, dir.path()).await?;
            let name = format!("ingest: Schedule, {} clients, from h2load", s.clients);
            report.add(&name, run.rate(), "msg/s", Some(raw_b), &[Target::AtLeast(45_000.0)]);
            report.add(format!("{name}: p50"), ms(run.percentile(50.0)), "ms", None, &[]);
            report.add(format!("{name}: p99"), ms(run.percentile(99.0)), "ms", None, &[Target::AtMost(5.0)]);
            parked_now += sc.unary;
        } else {
            report.note(format!(
                "unary Schedule from h2load: not measured, `{}` is not installed (Debian's nghttp2-client)",
                h2load::COMMAND
            ));
        }
        phase("ingest: ScheduleBatch");
        let run = load::calls(
            std::slice::from_ref(&server),
            &w,
            sc.batch,
            load::Call::Batch(s.batch_size),
            s.batch_callers,
            s.batch_callers,
            next_parked(sc.batch),
        )
        .await?;
        add_volume(
            &mut report,
            &format!("ingest: ScheduleBatch of {}", s.batch_size),
            &run,
            raw_b,
            "per call",
        );
        phase("ingest: ScheduleStream");
        let run = load::stream(
            std::slice::from_ref(&server),
            &w,
            sc.stream,
            s.streams,
            next_parked(sc.stream),
            false,
        )
        .await?;
        add_volume(&mut report, &format!("ingest: ScheduleStream x {}", s.streams), &run, raw_b, "per msg");
        parked_now += sc.unary + sc.batch + sc.stream;
    }

    // The series phase alone runs on a fresh store: what a million series
    // take is measured without a backlog's compactions in the same minutes.
    let only_series = s.phases.iter().all(|p| *p == Phase::Series);
    if sc.backlog > parked_now && !only_series {
        phase("parking the backlog");
        let n = sc.backlog - parked_now;
        load::stream(std::slice::from_ref(&server), &w, n, s.streams, next_parked(n), false).await?;
    }
    let backlog = server.metric("hourglass_messages_pending").await?;
    if !only_series {
        report.note(format!(
            "drain, precision and burst ran with {} messages parked for later",
            backlog as u64
        ));
    }

    if runs(Phase::Drain) {
        // 3. Drain.
        phase("drain: all due in the same millisecond");
        let delivered = server.metric("hourglass_messages_delivered_total").await?;
        let dropped = server.metric(DROPPED).await?;
        // The disk at rest (memtables written out, the write-ahead log
        // gone), before and after, for what the drain's messages keep.
        tokio::time::sleep(AT_REST).await;
        let disk_before = dir_bytes(&data);
        let t0 = now_ms() + lead_time(sc.drain);
        load::stream(std::slice::from_ref(&server), &w, sc.drain, s.streams, Arc::new(move |_| t0), false)
            .await?;
        check_lead("drain", t0, &mut report);
        let (elapsed, peak) = drain(&server, t0, delivered + sc.drain as f64).await?;
        // What the store keeps of each once delivered (for --retention):
        // the data dir's growth over the drain's messages, at rest, once
        // their bodies are dropped (a pass starts once 64 MiB were
        // delivered). (Per parked message at rest: the footprint's disk
        // over its backlog.)
        if sc.drain >= SHED_AT_ONCE {
            let started = Instant::now();
            let target = dropped + sc.drain as f64;
            match server.wait_metric(DROPPED, target, Duration::from_secs(120)).await {
                Ok(_) => report.add(
                    "drain: bodies dropped after delivery, within",
                    started.elapsed().as_secs_f64(),
                    "s",
                    None,
                    &[],
                ),
                Err(_) => report.note(format!(
                    "drain: {} of the {} messages' bodies dropped within 120 s",
                    server.metric(DROPPED).await? - dropped,
                    sc.drain
                )),
            }
        } else {
            report.note(format!(
                "drain: {} messages are too few for their bodies to be dropped at once (they are within 5 min)",
                sc.drain
            ));
        }
        tokio::time::sleep(AT_REST).await;
        let kept = dir_bytes(&data).saturating_sub(disk_before) as f64 / sc.drain as f64;
        report.add("drain: disk per delivered message kept for retention", kept, "bytes", None, &[]);
        report.add(
            "drain",
            sc.drain as f64 / elapsed.as_secs_f64(),
            "msg/s",
            Some(drain_limit),
            &[Target::RatioAtLeast(0.8)],
        );
        report.add("drain: memory peak", mib(peak), "MiB", None, &[]);
    }

    if runs(Phase::Precision) {
        // 4. Precision.
        // At the rate the targets are set for, and at four times it (as
        // the one-off messages beside a million series come).
        for (rate, targets) in [
            (sc.precision_rate, LatenessTargets { p99: Some(2.0), p999: Some(5.0), max: None }),
            (sc.precision_rate * 4, LatenessTargets { p99: Some(10.0), p999: None, max: None }),
        ] {
            phase(&format!("precision: {rate}/s due over a window"));
            let name = format!("precision at {rate}/s");
            let window = sc.precision_window;
            // The floor on this broker: a bare producer sending at the due
            // times, timed the same way.
            let floor = {
                let (kafka, raw_topic, w) = (kafka.clone(), raw_topic.clone(), w.clone());
                let window = window.min(Duration::from_secs(10));
                tokio::task::spawn_blocking(move || {
                    limits::producer_lateness(&kafka, &raw_topic, rate, window, &w)
                })
                .await??
            };
            add_lateness_floor(&mut report, &format!("precision limit at {rate}/s: bare producer"), &floor);
            let late = steady(&server, &w, s.streams, rate, window, None, &name, &mut report).await?;
            add_lateness(&mut report, &format!("{name}:"), &late, targets);
        }
    }

    if runs(Phase::Burst) {
        // 5. Burst.
        phase("burst: many due in one millisecond, then a trickle");
        let trickle = sc.trickle_rate * sc.trickle_window.as_secs().max(1) as usize;
        let t2 = now_ms() + lead_time(sc.burst + trickle);
        let delivered = server.metric("hourglass_messages_delivered_total").await?;
        load::stream(std::slice::from_ref(&server), &w, sc.burst, s.streams, Arc::new(move |_| t2), false)
            .await?;
        let trate = sc.trickle_rate as u64;
        let run = load::stream(
            std::slice::from_ref(&server),
            &w,
            trickle,
            1,
            Arc::new(move |i| t2 + 1 + i as u64 * 1000 / trate),
            true,
        )
        .await?;
        // Due order puts the burst first: the first `burst` deliveries are it.
        check_lead("burst", t2, &mut report);
        let (elapsed, peak) = drain(&server, t2, delivered + sc.burst as f64).await?;
        drain(&server, t2, delivered + (sc.burst + trickle) as f64).await?;
        let late = load::lateness(std::slice::from_ref(&server), &run.scheduled, 32).await?;
        let name = format!("burst of {}", sc.burst);
        report.add(
            format!("{name}: drain"),
            sc.burst as f64 / elapsed.as_secs_f64(),
            "msg/s",
            Some(drain_limit),
            &[],
        );
        // The targets are set for a burst of 1M: out within 3 s, and the
        // trickle behind it no later than that.
        let (out_by, trickle_max) =
            if sc.burst >= 1_000_000 { (Some(3_000.0), Some(3_000.0)) } else { (None, None) };
        report.add(
            format!("{name}: drained in"),
            elapsed.as_secs_f64() * 1_000.0,
            "ms",
            None,
            &out_by.map(Target::AtMost).into_iter().collect::<Vec<_>>(),
        );
        report.add(format!("{name}: memory peak"), mib(peak), "MiB", None, &[]);
        let targets = LatenessTargets { max: trickle_max, ..LatenessTargets::default() };
        add_lateness(&mut report, &format!("{name}: trickle"), &late, targets);
    }

    if runs(Phase::Policy) {
        phase("policy: a burst at a topic's rate limit; a drain beside a paused topic");
        let other_topic = format!("{topic}-unlimited");
        bench.create_topic(&other_topic, s.partitions).await?;
        let other = Workload::new(&other_topic, s.value_bytes);
        let run = policy::Policy {
            server: &server,
            w: &w,
            other: &other,
            drain: sc.drain,
            streams: s.streams,
            producer_limit,
        };
        run.run(&mut report).await?;
    }

    if runs(Phase::Cancel) {
        // 6. Cancel by label.
        phase("cancel: messages parked with a label, cancelled by a selector");
        let campaign = format!("bench-{run_id}");
        let labelled = Workload { labels: vec![("campaign".to_owned(), campaign.clone())], ..w.clone() };
        let n = sc.cancel;
        load::stream(std::slice::from_ref(&server), &labelled, n, s.streams, next_parked(n), false).await?;
        let (cancelled, calls, elapsed) =
            load::cancel_matching(&server, &format!("campaign={campaign}")).await?;
        if cancelled != n as u64 {
            report.note(format!("cancel: {cancelled} of the {n} labelled messages cancelled"));
        }
        report.add(
            format!("cancel by label: {n} messages, {calls} calls"),
            cancelled as f64 / elapsed.as_secs_f64(),
            "msg/s",
            Some(raw_b),
            &[],
        );
    }

    if runs(Phase::Footprint) {
        // 7. Footprint.
        let pending = server.metric("hourglass_messages_pending").await? as usize;
        if sc.footprint > pending {
            phase("footprint: parking the large backlog");
            let n = sc.footprint - pending;
            let sampler = RssSampler::start(server.pid());
            let run =
                load::stream(std::slice::from_ref(&server), &w, n, s.streams, next_parked(n), false).await?;
            let peak = sampler.stop();
            report.add(
                format!("sustained ingest: ScheduleStream, {n} more"),
                run.rate(),
                "msg/s",
                Some(raw_b),
                &[],
            );
            report.add("sustained ingest: memory peak", mib(peak), "MiB", None, &[]);
        }
        let pending = server.metric("hourglass_messages_pending").await? as u64;
        // At rest: the server's upkeep (every 10 s) finds a store that took no
        // write for one of its rounds at rest; give it two.
        tokio::time::sleep(AT_REST).await;
        let name = format!("footprint: {pending} parked");
        report.add(
            format!("{name}: memory at rest"),
            mib(server.rss_bytes()),
            "MiB",
            None,
            &[Target::AtMost(64.0)],
        );
        // What RocksDB holds of it, by part, over the shards.
        let metrics = server.metrics_text().await?;
        for part in ["block_cache", "pinned", "memtables", "table_readers"] {
            let bytes: f64 = metrics
                .lines()
                .filter(|l| {
                    l.starts_with("hourglass_store_memory_bytes{") && l.contains(&format!("part=\"{part}\""))
                })
                .filter_map(|l| l.rsplit_once(' ')?.1.trim().parse::<f64>().ok())
                .sum();
            report.add(
                format!("{name}: memory at rest, RocksDB {part}"),
                bytes / (1 << 20) as f64,
                "MiB",
                None,
                &[],
            );
        }
        let disk = dir_bytes(&data);
        report.add(
            format!("{name}: disk"),
            disk as f64 / (1 << 20) as f64,
            "MiB",
            None,
            &[Target::AtMost(4096.0 * pending as f64 / 10_000_000.0)],
        );
        report.add(
            format!("{name}: disk per parked message (with what earlier phases delivered)"),
            disk as f64 / pending.max(1) as f64,
            "bytes",
            None,
            &[],
        );
        for (how, crash) in [("SIGTERM", false), ("SIGKILL", true)] {
            phase(&format!("footprint: restart after {how}"));
            let (serving, dispatching) = restart(&mut server, &w, crash).await?;
            report.add(format!("{name}: restart after {how} to serving"), ms(serving), "ms", None, &[]);
            report.add(
                format!("{name}: restart after {how} to dispatching"),
                ms(dispatching),
                "ms",
                None,
                &[Target::AtMost(1000.0)],
            );
        }
        report.add(
            format!("{name}: memory after restart"),
            mib(server.rss_bytes()),
            "MiB",
            None,
            &[Target::AtMost(256.0)],
        );
    }

    if runs(Phase::Console) {
        phase("console: page loads");
        let console = console::Console {
            server: &server,
            addr: console_addr,
            w: &w,
            streams: s.streams,
            rate: sc.precision_rate,
            window: sc.precision_window,
        };
        console.run(&mut report).await?;
    }

    if runs(Phase::Reconcile) {
        // 7. Reconciliation after a SIGKILL mid-drain.
        for foreign in [0, FOREIGN_RATE] {
            let label = if foreign == 0 {
                "reconcile".to_owned()
            } else {
                format!("reconcile beside {foreign} foreign records/s")
            };
            phase(&format!("{label}: a drain of {} cut by SIGKILL", sc.drain));
            let cut = reconcile::cut_drain(&mut server, &brokers, &w, sc.drain, s.streams, foreign).await?;
            report.add(format!("{label}: in doubt at the restart"), cut.in_doubt, "msgs", None, &[]);
            report.add(format!("{label}: found on the topic"), cut.found, "msgs", None, &[]);
            report.add(format!("{label}: records read back"), cut.read, "records", None, &[]);
            report.add(format!("{label}: search time"), cut.millis, "ms", None, &[]);
            report.add(
                format!("{label}: restart to the first delivery"),
                cut.dispatching_ms,
                "ms",
                None,
                &[Target::AtMost(1000.0)],
            );
            report.add(
                format!("{label}: duplicates"),
                cut.duplicates as f64,
                "msgs",
                None,
                &[Target::AtMost(0.0)],
            );
            if foreign > 0 {
                report.note(format!("{label}: the other producer wrote {} records meanwhile", cut.foreign));
            }
        }
    }

    if runs(Phase::Series) {
        // 8. Series, last: they go on firing until the server stops.
        let n = sc.series;
        phase(&format!("series: {n} series, each every minute"));
        let fired = series::run(&server, &w, n, sc.series_minutes, s.clients, || dir_bytes(&data)).await?;
        let name = format!("series: {n} every minute");
        report.add(format!("{name}: created"), fired.created_rate, "series/s", None, &[]);
        // What the series added, when the store did not shrink meanwhile
        // (a compaction of what earlier phases left hides it).
        let per_million =
            |before: u64, after: u64| (after > before).then(|| (after - before) as f64 * 1e6 / n as f64);
        match fired.rss {
            (Some(before), Some(after)) if after > before => {
                let grew = per_million(before, after).unwrap_or_default();
                report.add(
                    format!("{name}: memory per 1M series"),
                    grew / (1 << 20) as f64,
                    "MiB",
                    None,
                    &[],
                );
            }
            _ => {
                report.note(format!("{name}: memory did not grow with the series (noise of earlier phases)"))
            }
        }
        match per_million(fired.disk.0, fired.disk.1) {
            Some(grew) => {
                report.add(format!("{name}: disk per 1M series"), grew / (1 << 20) as f64, "MiB", None, &[])
            }
            None => report
                .note(format!("{name}: the store did not grow with the series (a compaction meanwhile)")),
        }
        report.add(
            format!("{name}: fired"),
            fired.fired_rate,
            "msg/s",
            Some(n as f64 / 60.0),
            &[Target::RatioAtLeast(0.95)],
        );
        report.add(
            format!("{name}: of {} sampled occurrences, not delivered", fired.sampled),
            fired.missing as f64,
            "msgs",
            None,
            &[Target::AtMost(0.0)],
        );
        add_lateness(&mut report, &format!("{name}:"), &fired.late, LatenessTargets::default());
        let (before, after) = &fired.stages;
        after.add_since(before, &mut report, &format!("{name}:"));
        let parked = fired.parked;
        report.add(format!("{name}: occurrences parked"), parked.total, "msgs", None, &[]);
        report.add(
            format!("{name}: of those, parked at or after due"),
            parked.at_or_after,
            "msgs",
            None,
            &[],
        );
        let name_50 = format!("{name}: of those, parked less than 50 ms before due, or after");
        report.add(name_50, parked.within_50ms, "msgs", None, &[]);
        // Beside them, one-off messages due at the same rate, sampled the
        // same way, on a fresh server and store (the series would go on
        // firing in this one until it stops).
        server.stop()?;
        let rate = n.div_ceil(60);
        phase(&format!("series: one-off messages at the same rate ({rate}/s), on a fresh store"));
        let mut fresh = ServerProcess::new(
            &hourglass_testkit::hourglass_binary()?,
            &dir.path().join("one-off"),
            &brokers,
            s.durability,
        )?;
        fresh.env("HOURGLASS_DELIVERY", &s.delivery.to_string());
        let mut fresh = fresh.launch().await?;
        let window = sc.precision_window;
        let late =
            steady(&fresh, &w, s.streams, rate, window, Some(10_000), "series, one-off", &mut report).await?;
        fresh.stop()?;
        let beside = format!("series: one-off messages at the same rate ({rate}/s):");
        add_lateness(&mut report, &beside, &late, LatenessTargets::default());
    }

    server.stop()?;
    if let Some(collector) = collector {
        // The server sends what it still holds as it stops.
        report.add("tracing: spans the collector received", collector.spans() as f64, "spans", None, &[]);
    }
    if bench.mock.is_none() {
        delete_topic(&brokers, &topic).await.ok();
        delete_topic(&brokers, &raw_topic).await.ok();
    }
    Ok(report)
}

/// The figures of a batch or stream ingest run, against the store limit.
fn add_volume(report: &mut Report, name: &str, run: &load::Run, store_limit: f64, per: &str) {
    let targets = [Target::AtLeast(300_000.0), Target::RatioAtLeast(0.5)];
    report.add(name, run.rate(), "msg/s", Some(store_limit), &targets);
    report.add(format!("{name}: p50 {per}"), ms(run.percentile(50.0)), "ms", None, &[]);
    report.add(format!("{name}: p99 {per}"), ms(run.percentile(99.0)), "ms", None, &[]);
}

/// Lateness targets (ms) of a phase: p99, p999, max.
#[derive(Default)]
struct LatenessTargets {
    p99: Option<f64>,
    p999: Option<f64>,
    max: Option<f64>,
}

/// Lateness percentiles (ms) of delivered messages, and how many were early.
fn add_lateness(report: &mut Report, prefix: &str, late: &[i64], targets: LatenessTargets) {
    let at = |p| percentile(late, p) as f64;
    let target = |t: Option<f64>| t.map(Target::AtMost).into_iter().collect::<Vec<_>>();
    report.add(format!("{prefix} p50 lateness"), at(50.0), "ms", None, &[]);
    report.add(format!("{prefix} p99 lateness"), at(99.0), "ms", None, &target(targets.p99));
    report.add(format!("{prefix} p999 lateness"), at(99.9), "ms", None, &target(targets.p999));
    let max = late.last().copied().unwrap_or(0) as f64;
    report.add(format!("{prefix} max lateness"), max, "ms", None, &target(targets.max));
    let early = late.iter().filter(|l| **l < 0).count() as f64;
    report.add(format!("{prefix} early"), early, "msgs", None, &[Target::AtMost(0.0)]);
}

/// The lateness of a bare producer at a phase's rate, beside it: no
/// targets, the floor the phase's own figures stand on.
fn add_lateness_floor(report: &mut Report, prefix: &str, late: &[i64]) {
    let at = |p| percentile(late, p) as f64;
    for (name, value) in [("p50", at(50.0)), ("p99", at(99.0)), ("p999", at(99.9))] {
        report.add(format!("{prefix} {name} lateness"), value, "ms", None, &[]);
    }
    report.add(format!("{prefix} max lateness"), late.last().copied().unwrap_or(0) as f64, "ms", None, &[]);
}

/// Notes when a phase's messages were not all parked before the first was
/// due: its figures then include scheduling time.
/// One-off messages due at `rate` a second over `window`, all scheduled
/// before the first is due; once every one is delivered, the lateness of
/// `sample` of them spread evenly (of all, without), sorted.
#[allow(clippy::too_many_arguments)]
async fn steady(
    server: &ServerProcess,
    w: &Workload,
    streams: usize,
    rate: usize,
    window: Duration,
    sample: Option<usize>,
    phase: &str,
    report: &mut Report,
) -> anyhow::Result<Vec<i64>> {
    let count = rate * window.as_secs().max(1) as usize;
    let stages = stages::Stages::read(server).await?;
    let t1 = now_ms() + lead_time(count);
    let per_second = rate as u64;
    let delivered = server.metric("hourglass_messages_delivered_total").await?;
    let run = load::stream(
        std::slice::from_ref(server),
        w,
        count,
        streams,
        Arc::new(move |i| t1 + i as u64 * 1000 / per_second),
        true,
    )
    .await?;
    check_lead(phase, t1, report);
    // The server is left alone until the last message is due: a poll of
    // its /metrics every few milliseconds costs it more CPU than the
    // rate's own work, and would be measured as lateness.
    let last_due = t1 + (count.saturating_sub(1) as u64) * 1000 / per_second;
    tokio::time::sleep(Duration::from_millis(last_due.saturating_sub(now_ms()))).await;
    drain(server, t1, delivered + count as f64).await?;
    let scheduled = match sample {
        Some(k) if k < run.scheduled.len() => {
            (0..k).map(|j| run.scheduled[j * run.scheduled.len() / k].clone()).collect()
        }
        _ => run.scheduled,
    };
    stages::Stages::read(server).await?.add_since(&stages, report, &format!("{phase}:"));
    load::lateness(std::slice::from_ref(server), &scheduled, 32).await
}

fn check_lead(phase: &str, due_ms: u64, report: &mut Report) {
    let now = now_ms();
    if now > due_ms {
        report.note(format!(
            "{phase}: scheduling took longer than planned: the first messages were due {} ms before the last was parked",
            now - due_ms
        ));
    }
}

/// Time to start a phase whose messages are scheduled first: enough to park
/// them all before the first is due, at a conservative 40k/s (sustained
/// ingest is bounded by compaction, well below the short-run rate).
fn lead_time(messages: usize) -> u64 {
    2_000 + messages as u64 / 40
}

/// Long enough for a store that takes no more writes to be at rest: a
/// whole upkeep round (10 s) without a write, and the next.
const AT_REST: Duration = Duration::from_secs(22);

/// Delivered messages whose bodies the server dropped.
const DROPPED: &str = "hourglass_delivered_bodies_dropped_total";

/// Messages drained at once that make the 64 MiB that start a pass of the
/// store's at once (about 300 bytes each); fewer are shed within 5 min.
const SHED_AT_ONCE: usize = 250_000;

/// Waits for `target` deliveries; returns the time from `due_ms` until the
/// last was acknowledged, and the server's peak memory meanwhile.
async fn drain(server: &ServerProcess, due_ms: u64, target: f64) -> anyhow::Result<(Duration, Option<u64>)> {
    let sampler = RssSampler::start(server.pid());
    let due_at = Instant::now() + Duration::from_millis(due_ms.saturating_sub(now_ms()));
    let finished =
        server.wait_metric("hourglass_messages_delivered_total", target, Duration::from_secs(600)).await;
    let peak = sampler.stop();
    Ok((finished?.saturating_duration_since(due_at), peak))
}

/// Samples a process's resident memory every 20 ms, keeping the peak.
struct RssSampler {
    peak: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl RssSampler {
    fn start(pid: Option<u32>) -> RssSampler {
        let peak = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicBool::new(false));
        let thread = {
            let (peak, done) = (Arc::clone(&peak), Arc::clone(&done));
            std::thread::spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    if let Some(rss) = pid.and_then(rss_of) {
                        peak.fetch_max(rss, Ordering::Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        RssSampler { peak, done, thread }
    }

    fn stop(self) -> Option<u64> {
        self.done.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        Some(self.peak.load(Ordering::Relaxed)).filter(|p| *p > 0)
    }
}

/// Stops the server (gracefully, or with SIGKILL) with a message coming
/// due while it is down, starts it again, and measures from the new
/// process's start to serving and to that message's delivery.
async fn restart(
    server: &mut ServerProcess,
    w: &Workload,
    crash: bool,
) -> anyhow::Result<(Duration, Duration)> {
    let mut client = server.client().await?;
    let due = now_ms() + 3_000;
    let marker = client.schedule(w.at(0, due)).await?.into_inner().id;
    if crash {
        server.kill();
    } else {
        server.stop()?;
    }
    let wait = due.saturating_sub(now_ms()) + 100;
    tokio::time::sleep(Duration::from_millis(wait)).await;
    let started = Instant::now();
    let started_ms = now_ms();
    server.spawn()?;
    server.wait_serving(Duration::from_secs(300)).await?;
    let serving = started.elapsed();
    let mut client = server.client().await?;
    loop {
        let got =
            client.get(proto::GetRequest { id: marker.clone(), ..Default::default() }).await?.into_inner();
        if let Some(proto::get_response::Settlement::Delivered(d)) = got.settlement {
            let at = d.delivered_at.context("delivered without a time")?;
            let at_ms = (at.seconds * 1000 + i64::from(at.nanos) / 1_000_000) as u64;
            anyhow::ensure!(at_ms >= started_ms, "the restart marker was delivered before the restart");
            return Ok((serving, Duration::from_millis(at_ms - started_ms)));
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(300),
            "the marker was not delivered after restart"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn mib(bytes: Option<u64>) -> f64 {
    bytes.map_or(f64::NAN, |b| b as f64 / (1 << 20) as f64)
}

fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => dir_bytes(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}
