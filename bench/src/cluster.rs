//! `--cluster N`: N `hourglass serve --cluster` processes of one cluster on
//! this machine (sharing the broker), measured beside a bare producer
//! writing the same records to a topic shaped like the schedule log (the
//! physical limit of a design that logs every change to Kafka first):
//! ingest, drain, failover after a SIGKILL with a backlog parked, and
//! restore of every shard from the log into an empty data dir. One
//! standalone node runs the same ingest and drain first, for comparison.

use std::{collections::HashMap, sync::Arc, time::Duration};

use tokio::time::Instant;

use hourglass::{kafka::KafkaConfig, message::murmur2};
use hourglass_testkit::{
    ServerProcess, cpu_seconds_of, create_topic, delete_topic, hourglass_binary, shards_owned_by, threads_of,
};

use crate::{
    Bench, Phase, Report, Settings, Target, lead_time, limits, load, mib, ms, parked, phase,
    workload::{Workload, now_ms},
};

/// How the cluster is laid out.
#[derive(Clone, Debug)]
pub struct ClusterSettings {
    pub nodes: usize,
    pub log_partitions: u32,
    pub standby_replicas: u32,
}

/// Messages per second of the failover phase's steady load (it lasts the
/// scale's `failover_window`; the node is stopped a third of the way in).
const FAILOVER_RATE: u64 = 1_000;
/// The nodes' group session timeout (the default), and the bare group's.
const SESSION: Duration = Duration::from_secs(6);

pub async fn run(s: &Settings, c: &ClusterSettings) -> anyhow::Result<Report> {
    anyhow::ensure!(c.nodes >= 2, "--cluster needs at least 2 nodes: the failover phase kills one");
    let bench = Bench::start(s)?;
    let (dir, brokers) = (&bench.dir, bench.brokers.clone());
    let broker_setting = bench.broker_setting(s);
    let broker = bench.broker_pid();
    let mut report = bench.report;
    let settings = [
        ("mode", format!("cluster of {} nodes on this machine", c.nodes)),
        ("log partitions", c.log_partitions.to_string()),
        ("standby replicas", c.standby_replicas.to_string()),
        ("session timeout", "6s (the default)".into()),
        ("durability", format!("{:?}", s.durability).to_lowercase()),
        ("broker", broker_setting),
        ("partitions", s.partitions.to_string()),
        ("record", format!("{} B value, 10 B key, 2 headers", s.value_bytes)),
        ("unary", format!("{} clients over the nodes", s.clients)),
        ("streams", format!("{} over the nodes", s.streams)),
    ];
    report.settings = settings.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();

    let run_id = ulid::Ulid::new().to_string().to_lowercase();
    let topic = format!("hourglass-bench-{run_id}");
    let raw_log = format!("hourglass-bench-raw-log-{run_id}");
    let log_topic = format!("hourglass-bench-log-{run_id}");
    create_topic(&brokers, &topic, s.partitions).await?;
    create_topic(&brokers, &raw_log, c.log_partitions as i32).await?;
    let w = Workload::new(&topic, s.value_bytes);
    let sc = &s.scale;

    // 1. The limit: a bare producer writing the same records to a topic of
    // the log's partition count.
    phase("log limit: bare rdkafka producer to a topic shaped like the schedule log");
    let kafka = KafkaConfig { brokers: brokers.clone(), properties: Default::default() };
    let mut log_limit = 0f64;
    for _ in 0..2 {
        let (kafka, raw_log, w, n) = (kafka.clone(), raw_log.clone(), w.clone(), sc.drain);
        let rate = tokio::task::spawn_blocking(move || limits::producer(&kafka, &raw_log, n, &w)).await??;
        log_limit = log_limit.max(rate);
    }
    report.add(
        format!("log limit: bare producer, {} partitions", c.log_partitions),
        log_limit,
        "msg/s",
        None,
        &[],
    );

    // The floor of a unary call: one append as a node appends, and the
    // same read back as a node reads the log.
    let mut floor = None;
    if s.phases.contains(&Phase::Ingest) {
        phase("log floor: bare appends, one record each, as many callers as the unary phase has");
        let floor_topic = format!("hourglass-bench-floor-{run_id}");
        create_topic(&brokers, &floor_topic, c.log_partitions as i32).await?;
        let (acked, seen) =
            limits::log_round_trips(&kafka, &floor_topic, c.log_partitions as i32, ROUND_TRIPS).await?;
        let appends =
            limits::log_appends(&kafka, &floor_topic, sc.unary.min(FLOOR_APPENDS), s.clients, &w).await?;
        delete_topic(&brokers, &floor_topic).await.ok();
        let name = format!("log floor: bare append, {} callers", s.clients);
        report.add(&name, appends.rate(), "msg/s", None, &[]);
        report.add(format!("{name}: p50"), ms(appends.percentile(50.0)), "ms", None, &[]);
        report.add(format!("{name}: p99"), ms(appends.percentile(99.0)), "ms", None, &[]);
        let one = "log floor: one append alone";
        report.add(format!("{one}, acked: p50"), ms(load::percentile(&acked, 50.0)), "ms", None, &[]);
        report.add(format!("{one}, read back: p50"), ms(load::percentile(&seen, 50.0)), "ms", None, &[]);
        report.add(format!("{one}, read back: p99"), ms(load::percentile(&seen, 99.0)), "ms", None, &[]);
        report.note(
            "read back: as a node's log reader fetches (fetch.wait.max.ms 100); Kafka answers a fetch once a \
             record is there, Tansu 0.6 holds each fetch for its whole wait. An owner answers from the \
             append's acknowledgement, so the unary targets are set against the bare appends",
        );
        floor = Some(appends);
    }

    let mut alone = None;
    if s.phases.iter().any(|p| matches!(p, Phase::Ingest | Phase::Drain)) {
        alone = Some(standalone(s, dir.path(), (&brokers, broker), &w, log_limit, &mut report).await?);
    }

    // 2. The nodes.
    phase(&format!("starting {} nodes", c.nodes));
    let group = format!("hourglass-bench-{run_id}");
    let bin = hourglass_binary()?;
    let node = |i: usize, group: &str| -> anyhow::Result<ServerProcess> {
        Ok(ServerProcess::new(&bin, &dir.path().join(format!("node-{i}")), &brokers, s.durability)?
            .clustered()?
            .arg("--log-topic", &log_topic)
            .arg("--log-partitions", c.log_partitions)
            .arg("--group-id", group)
            .arg("--standby-replicas", c.standby_replicas))
    };
    let mut nodes = (0..c.nodes).map(|i| node(i, &group)).collect::<anyhow::Result<Vec<_>>>()?;
    for n in &mut nodes {
        n.spawn()?;
    }
    for n in &mut nodes {
        n.wait_serving(Duration::from_secs(120)).await?;
    }
    let spread = spread(&nodes, c.log_partitions, Duration::from_secs(120)).await?;
    report.note(format!("shards per node once started: {spread:?}"));

    let runs = |p: Phase| s.phases.contains(&p);
    let mut offset = 0u64;
    let mut next_parked = |n: usize| {
        let due = parked(offset);
        offset += n as u64;
        due
    };
    let mut parked_now = 0;
    if runs(Phase::Ingest) {
        phase("ingest: unary Schedule, callers spread over the nodes");
        let calls =
            load::calls(&nodes, &w, sc.unary, load::Call::Unary, s.clients, s.clients, next_parked(sc.unary));
        let (run, unary_cpu) = with_cpu(&nodes, broker, sc.unary, calls).await;
        let run = run?;
        let name = format!("cluster ingest: Schedule, {} clients", s.clients);
        // Held to the bare appends: half their rate, p50 within 2x and
        // p99 within 3x of theirs.
        let against =
            |p: f64, times: f64| floor.as_ref().map(|f| Target::AtMost(times * ms(f.percentile(p))));
        let rate_target = floor.as_ref().map(|_| Target::RatioAtLeast(0.5));
        let (p50_target, p99_target) = (against(50.0, 2.0), against(99.0, 3.0));
        let limit = floor.as_ref().map(load::Run::rate);
        report.add(&name, run.rate(), "msg/s", limit, rate_target.as_slice());
        report.add(format!("{name}: p50"), ms(run.percentile(50.0)), "ms", None, p50_target.as_slice());
        report.add(format!("{name}: p99"), ms(run.percentile(99.0)), "ms", None, p99_target.as_slice());
        let of_alone = alone.as_ref().map(|a| &a.unary_cpu);
        add_cpu(&mut report, &format!("{name}: CPU per 1M"), &unary_cpu, of_alone);
        phase("ingest: ScheduleStream, streams spread over the nodes");
        let streams = load::stream(&nodes, &w, sc.stream, s.streams, next_parked(sc.stream), false);
        let (run, stream_cpu) = with_cpu(&nodes, broker, sc.stream, streams).await;
        let run = run?;
        let name = format!("cluster ingest: ScheduleStream x {}", s.streams);
        report.add(&name, run.rate(), "msg/s", Some(log_limit), &[Target::RatioAtLeast(0.5)]);
        if let Some(alone) = &alone {
            report.note(format!(
                "{name}: {:.0}% of one standalone node's {:.0} msg/s on the same machine",
                100.0 * run.rate() / alone.stream,
                alone.stream
            ));
        }
        report.add(format!("{name}: p99 per msg"), ms(run.percentile(99.0)), "ms", None, &[]);
        add_cpu(
            &mut report,
            &format!("{name}: CPU per 1M"),
            &stream_cpu,
            alone.as_ref().map(|a| &a.stream_cpu),
        );
        parked_now = sc.unary + sc.stream;
    }
    if sc.backlog > parked_now {
        phase("parking the backlog");
        let n = sc.backlog - parked_now;
        load::stream(&nodes, &w, n, s.streams, next_parked(n), false).await?;
    }
    // Asked of the cluster: the nodes' own gauges count standby copies too.
    let stats = nodes[0].client().await?.stats(hourglass::proto::StatsRequest {}).await?.into_inner();
    let backlog = stats.pending as f64;
    report.note(format!("drain and failover ran with {} messages parked for later", backlog as u64));

    if runs(Phase::Drain) {
        phase("drain: all due in the same millisecond, over every node");
        let delivered = sum(&nodes, "hourglass_messages_delivered_total").await?;
        // A cluster parks at a fifth of a node's pace or less: twice the
        // node's lead (on a slow day a cluster of this machine streamed
        // 45k msg/s, about what the node's lead allows for).
        let t0 = now_ms() + 2 * lead_time(sc.drain);
        load::stream(&nodes, &w, sc.drain, s.streams, Arc::new(move |_| t0), false).await?;
        anyhow::ensure!(now_ms() < t0, "the drain's messages were not all parked before they came due");
        let due_at = Instant::now() + Duration::from_millis(t0.saturating_sub(now_ms()));
        tokio::time::sleep_until(due_at).await;
        let drained = wait_sum(&nodes, "hourglass_messages_delivered_total", delivered + sc.drain as f64);
        let (done, drain_cpu) = with_cpu(&nodes, broker, sc.drain, drained).await;
        let done = done?;
        let rate = sc.drain as f64 / done.saturating_duration_since(due_at).as_secs_f64();
        report.add("cluster drain", rate, "msg/s", Some(log_limit), &[]);
        let of_alone = alone.as_ref().and_then(|a| a.drain_cpu.as_ref());
        add_cpu(&mut report, "cluster drain: CPU per 1M", &drain_cpu, of_alone);
    }

    if runs(Phase::Failover) {
        // 3. Failover: the group alone first (a bare group on the log's
        // shape, one member killed), then the nodes: one killed, then one
        // stopped, each under a steady load.
        phase("failover limit: a bare consumer group, one member killed");
        let (group_first, group_all) =
            limits::group_failover(&kafka, &raw_log, c.log_partitions as i32, c.nodes, SESSION).await?;
        let name = "failover limit: the group alone, kill -9 to";
        report.add(format!("{name} the first partition given away"), ms(group_first), "ms", None, &[]);
        report.add(format!("{name} every partition given away"), ms(group_all), "ms", None, &[]);
        let standbys = if c.standby_replicas > 0 { "with standbys" } else { "without standbys" };
        let name = format!("failover {standbys}, {} parked", backlog as u64);
        let with_standbys = c.standby_replicas > 0;
        let targets =
            |at_most: f64| with_standbys.then_some(Target::AtMost(at_most)).into_iter().collect::<Vec<_>>();

        settled(&nodes, c, Duration::from_secs(120)).await?;
        let killed = stop_under_load(&mut nodes, Stop::Kill, &brokers, &log_topic, c, s, &w, &run_id).await?;
        let (first, every) = killed.takeover();
        report.add(
            format!("{name}: kill -9 to first delivery of a lost shard"),
            first,
            "ms",
            None,
            &targets(5_000.0),
        );
        report.add(
            format!("{name}: kill -9 to every lost shard delivering"),
            every,
            "ms",
            None,
            &targets(8_000.0),
        );
        report.add(
            format!("{name}: kill -9, longest a lost shard waited"),
            killed.longest_wait(),
            "ms",
            None,
            &[],
        );
        report.add("failover: lateness p50 of the steady load", killed.lateness_p50(), "ms", None, &[]);
        report.note(format!(
            "the killed node owned shards {:?}; the longest wait: {}",
            killed.lost,
            killed.where_longest()
        ));

        let stopped =
            stop_under_load(&mut nodes, Stop::Term, &brokers, &log_topic, c, s, &w, &run_id).await?;
        report.add(
            format!("{name}: SIGTERM, longest a lost shard waited"),
            stopped.longest_wait(),
            "ms",
            None,
            &targets(1_000.0),
        );
        report.note(format!(
            "the stopped node owned shards {:?}; the longest wait: {}",
            stopped.lost,
            stopped.where_longest()
        ));
        let skipped = sum(&nodes, "hourglass_cluster_log_offsets_skipped_total").await?;
        report.note(format!("offsets of the schedule log the nodes skipped while reading: {skipped}"));
    }

    if runs(Phase::Restore) {
        // 4. Restore: every node stopped; a node with an empty data dir takes
        // every shard, read from the log. It joins a group of its own: Tansu
        // 0.6 lets no new member lead a group a SIGKILLed member was in once
        // the others have left it.
        phase("restore: one node alone, with an empty data dir, takes every shard from the log");
        for n in &mut nodes {
            n.stop()?;
        }
        phase("restore limit: bare consumers, one per partition, read the whole schedule log");
        let (kafka, log, partitions) = (kafka.clone(), log_topic.clone(), c.log_partitions as i32);
        let (read_limit, log_records) =
            tokio::task::spawn_blocking(move || limits::consumer(&kafka, &log, partitions)).await??;
        report.add(
            format!("restore limit: bare consumers, one per partition ({log_records} records)"),
            read_limit,
            "msg/s",
            None,
            &[],
        );
        std::fs::remove_dir_all(dir.path().join("node-0")).ok();
        let mut restoring = node(0, &format!("{group}-restore"))?;
        let started = Instant::now();
        restoring.spawn()?;
        // Applying starts once the group has given the node its shards.
        let applying = loop {
            let applied =
                restoring.metric("hourglass_cluster_log_records_applied_total").await.unwrap_or(0.0);
            if applied > 0.0 {
                break Instant::now();
            }
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(120),
                "the restored node applied nothing"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        restoring.wait_serving(Duration::from_secs(600)).await?;
        let (took, applied) = (applying.elapsed(), started.elapsed());
        let restored = restoring.metric("hourglass_messages_pending").await?;
        let records = restoring.metric("hourglass_cluster_log_records_applied_total").await?;
        let name = format!("restore of {} pending ({} log records)", restored as u64, records as u64);
        report.add(format!("{name}: start to serving"), ms(applied), "ms", None, &[]);
        report.add(format!("{name}: first record applied to serving"), ms(took), "ms", None, &[]);
        let rate = restored / took.as_secs_f64();
        report.add("restore rate", rate, "msg/s", None, &[Target::AtLeast(200_000.0)]);
        report.add(
            "restore: log records applied per second",
            records / took.as_secs_f64(),
            "msg/s",
            Some(read_limit),
            &[],
        );
        report.add("restore: memory after", mib(restoring.rss_bytes()), "MiB", None, &[]);
        restoring.stop()?;
    }

    delete_topic(&brokers, &topic).await.ok();
    delete_topic(&brokers, &raw_log).await.ok();
    Ok(report)
}

/// How the failover phase stops a node.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Stop {
    /// SIGKILL: the node's shards are taken over without a word from it.
    Kill,
    /// SIGTERM: the node hands its shards over as it stops.
    Term,
}

/// What a node's stop under a steady load cost: per message, when it was
/// due and delivered; the shards the node owned; and when it was stopped.
struct Stopped {
    lost: std::collections::BTreeSet<u32>,
    /// Per message of the steady load: its shard, when it was due, and
    /// when it was delivered (ms since the epoch).
    delivered: Vec<(u32, i64, i64)>,
    at_ms: i64,
}

impl Stopped {
    /// From the stop to the first delivery of a lost shard, and to the
    /// latest of those firsts (every lost shard delivering), in ms.
    fn takeover(&self) -> (f64, f64) {
        let mut first: std::collections::BTreeMap<u32, i64> = Default::default();
        for (shard, _, at) in &self.delivered {
            if self.lost.contains(shard) && *at >= self.at_ms {
                let f = first.entry(*shard).or_insert(*at);
                *f = (*f).min(*at);
            }
        }
        let after = |at: Option<&i64>| at.map_or(f64::NAN, |at| (at - self.at_ms) as f64);
        (after(first.values().min()), after(first.values().max()))
    }

    /// The most late a message of a lost shard due after the stop was:
    /// the longest its shard went without its owner.
    fn longest_wait(&self) -> f64 {
        self.latest().map_or(0, |(_, due, at)| at - due) as f64
    }

    /// The message of [`Stopped::longest_wait`]: its shard, and when it
    /// was due and delivered, in ms after the stop.
    fn latest(&self) -> Option<(u32, i64, i64)> {
        let late =
            self.delivered.iter().filter(|(shard, due, _)| self.lost.contains(shard) && *due >= self.at_ms);
        let (shard, due, at) = late.max_by_key(|(_, due, at)| at - due)?;
        Some((*shard, due - self.at_ms, at - self.at_ms))
    }

    /// Says where [`Stopped::longest_wait`] was, and each lost shard's
    /// longest wait.
    fn where_longest(&self) -> String {
        let mut by_shard: std::collections::BTreeMap<u32, i64> = Default::default();
        for (shard, due, at) in &self.delivered {
            if self.lost.contains(shard) && *due >= self.at_ms {
                let wait = by_shard.entry(*shard).or_default();
                *wait = (*wait).max(at - due);
            }
        }
        match self.latest() {
            Some((shard, due, at)) => format!(
                "shard {shard}'s message due {due} ms after the stop, delivered {at} ms after it \
                 (ms by lost shard: {by_shard:?})"
            ),
            None => "no message of a lost shard was due after the stop".into(),
        }
    }

    fn lateness_p50(&self) -> f64 {
        let mut late: Vec<i64> = self.delivered.iter().map(|(_, due, at)| at - due).collect();
        late.sort_unstable();
        load::percentile(&late, 50.0) as f64
    }
}

/// A steady load due over the scale's failover window, the last node
/// stopped `how` a third of the way in; once every message is delivered,
/// the node is started again. Fails unless every message is delivered.
#[allow(clippy::too_many_arguments)]
async fn stop_under_load(
    nodes: &mut [ServerProcess],
    how: Stop,
    brokers: &str,
    log_topic: &str,
    c: &ClusterSettings,
    s: &Settings,
    w: &Workload,
    run_id: &str,
) -> anyhow::Result<Stopped> {
    let sc = &s.scale;
    phase(&format!("failover: {how:?} a node under a steady load"));
    let count = (FAILOVER_RATE * sc.failover_window.as_secs()) as usize;
    // Room to park it while the cluster may still record what came before.
    let t1 = now_ms() + 10_000 + lead_time(count);
    // Ids of the bench's own, so that every shard has messages of the
    // steady load whichever node owns it when the stop comes.
    let own_ids = Workload { ids: Some(format!("failover-{how:?}-{run_id}")), ..w.clone() };
    let steady = load::stream(
        nodes,
        &own_ids,
        count,
        s.streams,
        Arc::new(move |i| t1 + i as u64 * 1000 / FAILOVER_RATE),
        true,
    )
    .await?;
    anyhow::ensure!(now_ms() < t1, "the failover load was not all parked before it came due");
    let stop_at = t1 + sc.failover_window.as_millis() as u64 / 3;
    let victim = nodes.len() - 1;
    // Read before the wait, not at the stop: reading the routing topic
    // can take seconds on a loaded machine, and every node is up, so the
    // owners stand still until the stop.
    let lost =
        shards_owned_by(brokers, log_topic, c.log_partitions, &format!("http://{}", nodes[victim].grpc))?;
    anyhow::ensure!(!lost.is_empty(), "node {victim} owned no shard before the stop");
    tokio::time::sleep(Duration::from_millis(stop_at.saturating_sub(now_ms()))).await;
    let at_ms = match how {
        // From when it is gone (kill waits for the process to end): whatever
        // it delivered came before.
        Stop::Kill => {
            nodes[victim].kill();
            now_ms()
        }
        // From the signal: the node hands its shards over as it stops.
        Stop::Term => {
            let (signalled, victim) = (now_ms(), &mut nodes[victim]);
            tokio::task::block_in_place(|| victim.stop())?;
            signalled
        }
    };
    let end = t1 + sc.failover_window.as_millis() as u64;
    anyhow::ensure!(
        at_ms + 1_000 < end,
        "the stop came {} ms late, less than a second before the steady load's last message was due: \
         nothing is left to measure a takeover by (is the machine loaded?)",
        at_ms.saturating_sub(stop_at)
    );
    tokio::time::sleep(Duration::from_millis(end.saturating_sub(now_ms()) + 10_000)).await;
    let survivors = &nodes[..victim];
    let give_up = Instant::now() + Duration::from_secs(120);
    let at = loop {
        match load::delivered_at(survivors, &steady.scheduled, 32).await {
            Ok(at) => break at,
            Err(e) if Instant::now() < give_up => {
                phase(&format!("failover: not all delivered yet ({e:#}); looking again"));
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Err(e) => {
                let skipped = sum(survivors, "hourglass_cluster_log_offsets_skipped_total").await?;
                return Err(e.context(format!(
                    "the steady load was not all delivered after the {how:?} (the survivors skipped {skipped} \
                     offsets of the schedule log while reading)"
                )));
            }
        }
    };
    let delivered = steady
        .scheduled
        .iter()
        .zip(&at)
        .map(|((id, due), at)| {
            let shard = (murmur2(id.as_bytes()) & 0x7fff_ffff) as u32 % c.log_partitions;
            (shard, *due as i64, *at)
        })
        .collect();
    let stopped = Stopped { lost: lost.into_iter().collect(), delivered, at_ms: at_ms as i64 };
    anyhow::ensure!(
        !stopped.takeover().0.is_nan(),
        "none of the stopped node's shards {:?} delivered after the {how:?}",
        stopped.lost
    );
    nodes[victim].spawn()?;
    nodes[victim].wait_serving(Duration::from_secs(120)).await?;
    // The group done moving shards and every standby copy kept again
    // before what comes next.
    settled(nodes, c, Duration::from_secs(120)).await?;
    Ok(stopped)
}

/// Waits until the nodes own every shard and keep every standby copy, and
/// that stayed so for a few seconds (the group has stopped moving shards).
async fn settled(nodes: &[ServerProcess], c: &ClusterSettings, within: Duration) -> anyhow::Result<()> {
    const STILL: Duration = Duration::from_secs(5);
    let copies = u64::from(c.log_partitions) * (c.standby_replicas as u64).min(nodes.len() as u64 - 1);
    let started = Instant::now();
    let mut last = (Vec::new(), Instant::now());
    loop {
        let mut now = Vec::new();
        for n in nodes {
            now.push(n.metric("hourglass_cluster_shards_owned").await.unwrap_or(0.0) as u64);
            now.push(n.metric("hourglass_cluster_standbys").await.unwrap_or(0.0) as u64);
        }
        let owned: u64 = now.iter().step_by(2).sum();
        let kept: u64 = now.iter().skip(1).step_by(2).sum();
        if now != last.0 {
            last = (now, Instant::now());
        } else if owned == u64::from(c.log_partitions) && kept == copies && last.1.elapsed() >= STILL {
            return Ok(());
        }
        anyhow::ensure!(
            started.elapsed() < within,
            "the cluster did not settle within {within:?}: shards owned and standbys per node {:?}",
            last.0
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The sum of a metric over the nodes.
async fn sum(nodes: &[ServerProcess], metric: &str) -> anyhow::Result<f64> {
    let mut total = 0.0;
    for n in nodes {
        total += n.metric(metric).await.unwrap_or(0.0);
    }
    Ok(total)
}

/// Waits until the sum of a metric over the nodes reaches `target`;
/// returns when it first read so.
async fn wait_sum(nodes: &[ServerProcess], metric: &str, target: f64) -> anyhow::Result<Instant> {
    let started = Instant::now();
    loop {
        if sum(nodes, metric).await? >= target {
            return Ok(Instant::now());
        }
        anyhow::ensure!(started.elapsed() < Duration::from_secs(600), "{metric} did not reach {target}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until the nodes own every shard; returns how many each owns.
async fn spread(nodes: &[ServerProcess], shards: u32, within: Duration) -> anyhow::Result<Vec<u64>> {
    let started = Instant::now();
    loop {
        let mut owned = Vec::new();
        for n in nodes {
            owned.push(n.metric("hourglass_cluster_shards_owned").await.unwrap_or(0.0) as u64);
        }
        if owned.iter().sum::<u64>() == u64::from(shards) {
            return Ok(owned);
        }
        anyhow::ensure!(
            started.elapsed() < within,
            "the shards were not spread within {within:?}: {owned:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What one standalone node did with the cluster's load: its stream's
/// rate, and what each phase spent.
struct Alone {
    stream: f64,
    unary_cpu: Spent,
    stream_cpu: Spent,
    drain_cpu: Option<Spent>,
}

/// The same ingest and drain on one standalone node, the cluster's nodes
/// not yet started: what a node does per message without the log. A
/// cluster node does all of it too (decide, write the store, answer), and
/// then appends, reads back and applies again on each standby.
async fn standalone(
    s: &Settings,
    dir: &std::path::Path,
    (brokers, broker): (&str, Option<u32>),
    w: &Workload,
    log_limit: f64,
    report: &mut Report,
) -> anyhow::Result<Alone> {
    let sc = &s.scale;
    let mut server = ServerProcess::start(&dir.join("standalone"), brokers, s.durability).await?;
    let mut offset = 0u64;
    let mut next_parked = |n: usize| {
        let due = parked(offset);
        offset += n as u64;
        due
    };
    let one = std::slice::from_ref(&server);
    let mut drain_cpu = None;
    phase("standalone ingest: unary Schedule");
    let calls = load::calls(one, w, sc.unary, load::Call::Unary, s.clients, s.clients, next_parked(sc.unary));
    let (run, unary_cpu) = with_cpu(one, broker, sc.unary, calls).await;
    let run = run?;
    report.add(
        format!("standalone ingest: Schedule, {} clients", s.clients),
        run.rate(),
        "msg/s",
        Some(log_limit),
        &[],
    );
    phase("standalone ingest: ScheduleStream");
    let streams = load::stream(one, w, sc.stream, s.streams, next_parked(sc.stream), false);
    let (run, stream_cpu) = with_cpu(one, broker, sc.stream, streams).await;
    let stream = run?.rate();
    report.add(
        format!("standalone ingest: ScheduleStream x {}", s.streams),
        stream,
        "msg/s",
        Some(log_limit),
        &[],
    );
    if s.phases.contains(&Phase::Drain) {
        phase("standalone drain: all due in the same millisecond");
        let delivered = server.metric("hourglass_messages_delivered_total").await?;
        let t0 = now_ms() + lead_time(sc.drain);
        load::stream(one, w, sc.drain, s.streams, Arc::new(move |_| t0), false).await?;
        anyhow::ensure!(now_ms() < t0, "the drain's messages were not all parked before they came due");
        tokio::time::sleep(Duration::from_millis(t0.saturating_sub(now_ms()))).await;
        let (drained, cpu) =
            with_cpu(one, broker, sc.drain, crate::drain(&server, t0, delivered + sc.drain as f64)).await;
        let (elapsed, _) = drained?;
        drain_cpu = Some(cpu);
        report.add(
            "standalone drain",
            sc.drain as f64 / elapsed.as_secs_f64(),
            "msg/s",
            Some(log_limit),
            &[],
        );
    }
    server.stop()?;
    report.add("standalone ingest: Schedule: CPU per 1M", unary_cpu.cpu, "core-s", None, &[]);
    report.add("standalone ingest: ScheduleStream: CPU per 1M", stream_cpu.cpu, "core-s", None, &[]);
    if let Some(spent) = &drain_cpu {
        report.add("standalone drain: CPU per 1M", spent.cpu, "core-s", None, &[]);
    }
    Ok(Alone { stream, unary_cpu, stream_cpu, drain_cpu })
}

/// `work`'s outcome, and what the `servers` (and the local broker, whose
/// process is `broker`) spent on its `messages` meanwhile.
async fn with_cpu<T>(
    servers: &[ServerProcess],
    broker: Option<u32>,
    messages: usize,
    work: impl Future<Output = T>,
) -> (T, Spent) {
    let pids: Vec<u32> = servers.iter().filter_map(ServerProcess::pid).collect();
    let before = Use::of(&pids, broker);
    let outcome = work.await;
    (outcome, Use::of(&pids, broker).since(&before, messages))
}

/// What servers spent on a load, per message.
#[derive(Clone, Debug, Default)]
struct Spent {
    /// Core-seconds per 1M messages (microseconds per message), every
    /// thread of the servers together.
    cpu: f64,
    /// The same by kind of thread, largest first.
    by_kind: Vec<(&'static str, f64)>,
    /// Times a thread of the servers was switched off a core (it waited,
    /// or was made to), per message.
    switches: f64,
    /// The local broker's core-seconds per 1M messages meanwhile.
    broker: Option<f64>,
}

impl Spent {
    /// Said in a note: where the CPU went.
    fn said(&self) -> String {
        let kinds: Vec<String> = self.by_kind.iter().map(|(kind, cpu)| format!("{kind} {cpu:.1}")).collect();
        let broker =
            self.broker.map(|b| format!("; the broker {b:.1} core-s per 1M beside them")).unwrap_or_default();
        format!(
            "{:.1} core-s per 1M: {}; {:.2} thread switches per message{broker}",
            self.cpu,
            kinds.join(", "),
            self.switches
        )
    }
}

/// The CPU servers' threads have used so far, and the broker's.
struct Use {
    total: f64,
    /// Thread id: its kind, CPU seconds, switches.
    threads: HashMap<u32, (&'static str, f64, u64)>,
    broker: Option<f64>,
}

impl Use {
    fn of(pids: &[u32], broker: Option<u32>) -> Use {
        let total = pids.iter().filter_map(|&pid| cpu_seconds_of(pid)).sum();
        let threads = pids
            .iter()
            .flat_map(|&pid| threads_of(pid))
            .map(|t| (t.id, (thread_kind(&t.name), t.cpu, t.switches)))
            .collect();
        Use { total, threads, broker: broker.and_then(cpu_seconds_of) }
    }

    /// What was used from `before` to this, per message of `messages`. A
    /// thread that ended meanwhile is counted in the total only, under
    /// "threads that ended".
    fn since(&self, before: &Use, messages: usize) -> Spent {
        let per_1m = 1e6 / messages.max(1) as f64;
        let mut kinds: HashMap<&'static str, f64> = HashMap::new();
        let mut switches = 0;
        for (id, &(kind, cpu, switched)) in &self.threads {
            let (was_cpu, was_switched) = before.threads.get(id).map_or((0.0, 0), |&(_, c, s)| (c, s));
            *kinds.entry(kind).or_default() += cpu - was_cpu;
            switches += switched.saturating_sub(was_switched);
        }
        let cpu = self.total - before.total;
        let ended = cpu - kinds.values().sum::<f64>();
        if ended > 0.005 {
            kinds.insert("threads that ended", ended);
        }
        let mut by_kind: Vec<_> =
            kinds.into_iter().map(|(k, c)| (k, c * per_1m)).filter(|(_, c)| *c >= 0.05).collect();
        by_kind.sort_by(|a, b| b.1.total_cmp(&a.1));
        Spent {
            cpu: cpu * per_1m,
            by_kind,
            switches: switches as f64 / messages.max(1) as f64,
            broker: self.broker.zip(before.broker).map(|(now, was)| (now - was) * per_1m),
        }
    }
}

/// What a thread of a node does, by its name: the async runtime (gRPC, the
/// log's front and appliers, the dispatchers), the stores' writer threads,
/// librdkafka's threads (one per broker and a main one per client, and a
/// producer's polling thread), RocksDB's flushes and compactions.
fn thread_kind(name: &str) -> &'static str {
    match name {
        "tokio-rt-worker" => "runtime",
        "hourglass-write" => "store writers",
        n if n.starts_with("rdk:") || n.starts_with("producer pollin") => "Kafka clients",
        n if n.starts_with("rocksdb:") => "RocksDB background",
        _ => "other threads",
    }
}

/// A cluster's CPU per 1M messages, with its ratio to one standalone
/// node's for the same load: at most 3x, so that three nodes on three
/// machines out-run one; and where it went, beside the node's.
fn add_cpu(report: &mut Report, name: &str, spent: &Spent, alone: Option<&Spent>) {
    match alone {
        Some(alone) => {
            report.add(name, spent.cpu, "core-s", None, &[Target::AtMost(3.0 * alone.cpu)]);
            report.note(format!(
                "{name}: {:.1}x one standalone node's {:.1} core-s",
                spent.cpu / alone.cpu,
                alone.cpu
            ));
            report.note(format!(
                "{name}, where it went: {}; one standalone node: {}",
                spent.said(),
                alone.said()
            ));
        }
        None => {
            report.add(name, spent.cpu, "core-s", None, &[]);
            report.note(format!("{name}, where it went: {}", spent.said()));
        }
    }
}

/// Round trips of one record through the log, one after another.
const ROUND_TRIPS: usize = 50;
/// Bare appends of the floor's unary measure, at most.
const FLOOR_APPENDS: usize = 50_000;
