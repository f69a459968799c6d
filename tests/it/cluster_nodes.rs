//! Cluster mode with several `hourglass serve` processes sharing one broker
//! and one schedule log: the consumer group spreads the shards, a node
//! killed with SIGKILL loses its shards to the others after the session
//! timeout, a node restarted (or restarted without its data dir) takes some
//! back, and a consumer of the target topic finds every acknowledged
//! message, none early.
//!
//! The short runs are part of `cargo test`; `HOURGLASS_CLUSTER_FULL=1`
//! makes them long.

use crate::{common, let_go::wait_metric};

use std::{
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use common::{verify::*, *};
use hourglass::{
    cluster::log::{
        RECORD_HEADER,
        record::{self, Change, LogMessage, LogRecord},
        seal::{ClusterKey, SEAL_HEADER},
    },
    message::{DueSpec, Envelope, MessageId, UnixMillis},
    proto,
    proto::scheduler_client::SchedulerClient,
    store::Durability,
};
use hourglass_testkit::ServerProcess;
use rdkafka::{
    message::{Header, OwnedHeaders},
    producer::{FutureProducer, FutureRecord},
};
use tonic::{Code, transport::Channel};

const BIN: &str = env!("CARGO_BIN_EXE_hourglass");

pub(crate) const LOG_PARTITIONS: u32 = 12;

/// Scenarios of three node processes take turns: on a 2-core machine,
/// two of them at once beside the other tests starve each other's group
/// heartbeats and calls, and fail for want of CPU, not of correctness.
pub(crate) static THREE_NODES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn full() -> bool {
    std::env::var("HOURGLASS_CLUSTER_FULL").is_ok_and(|v| v == "1")
}

/// A node of the cluster, not started yet.
pub(crate) fn node(broker: &Broker, data_dir: &Path, log_topic: &str, group: &str) -> ServerProcess {
    node_of(Path::new(BIN), broker, data_dir, log_topic, group)
}

/// [`node`], of the server `exe` (another release's, say).
pub(crate) fn node_of(
    exe: &Path,
    broker: &Broker,
    data_dir: &Path,
    log_topic: &str,
    group: &str,
) -> ServerProcess {
    ServerProcess::new(exe, data_dir, broker.addr(), Durability::Buffered)
        .unwrap()
        .clustered()
        .unwrap()
        .arg("--log-topic", log_topic)
        .arg("--log-partitions", LOG_PARTITIONS)
        .arg("--group-id", group)
}

/// The first id beginning with `run` whose shard is `shard`.
pub(crate) fn id_in_shard(run: &str, shard: u32) -> String {
    (0..)
        .map(|i| format!("{run}-{i}"))
        .find(|id| java_partition(id.as_bytes(), LOG_PARTITIONS as i32) as u32 == shard)
        .expect("some id falls in every shard")
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// Schedules `request` through whichever node takes it, starting at
/// `first`: a node that is down, or whose request waited too long for a
/// moving shard, answers UNAVAILABLE and the next one is tried.
pub(crate) async fn schedule_anywhere(
    clients: &mut [SchedulerClient<Channel>],
    first: usize,
    request: proto::ScheduleRequest,
    ledger: &Ledger,
) {
    let give_up = Instant::now() + Duration::from_secs(90);
    let topic = request.message.as_ref().unwrap().topic.clone();
    let mut last = None;
    for attempt in 0.. {
        assert!(
            Instant::now() < give_up,
            "{:?} was never acknowledged; the last answer: {last:?}",
            request.id
        );
        let client = &mut clients[(first + attempt) % clients.len()];
        match client.schedule(request.clone()).await {
            Ok(reply) => {
                let reply = reply.into_inner();
                ledger.ack(&reply.id, millis(reply.deliver_at.as_ref().unwrap()), &topic);
                return;
            }
            Err(status) if matches!(status.code(), Code::Unavailable | Code::Unknown | Code::Cancelled) => {
                last = Some(status);
                if attempt % clients.len() == clients.len() - 1 {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            Err(status) => panic!("scheduling {:?} failed: {status:?}", request.id),
        }
    }
}

/// Prints the first duplicates, with their shards and the times of their
/// copies, so that a run can be set beside the nodes' logs.
fn report_duplicates(verdict: &Verdict) {
    for (id, copies) in verdict.duplicates.iter().take(10) {
        let shard = (murmur2(id.as_bytes()) as u32 & 0x7fff_ffff) % LOG_PARTITIONS;
        eprintln!("duplicate {id} (shard {shard}) at {copies:?}");
    }
}

/// Shards each live node owns, by its metric (0 for the others, which are
/// not asked: a stopped process would not answer).
async fn owned(nodes: &[ServerProcess], live: &[usize]) -> Vec<f64> {
    let mut owned = vec![0.0; nodes.len()];
    for i in live {
        let asked = nodes[*i].metric("hourglass_cluster_shards_owned");
        owned[*i] = tokio::time::timeout(Duration::from_secs(2), asked)
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or(0.0);
    }
    owned
}

/// Waits until the live nodes own every shard between them.
pub(crate) async fn wait_spread(nodes: &[ServerProcess], live: &[usize], within: Duration) -> Vec<f64> {
    let started = Instant::now();
    loop {
        let owned = owned(nodes, live).await;
        let total: f64 = live.iter().map(|i| owned[*i]).sum();
        if total == f64::from(LOG_PARTITIONS) && live.iter().all(|i| owned[*i] > 0.0) {
            return owned;
        }
        assert!(started.elapsed() < within, "shards not spread over nodes {live:?} in {within:?}: {owned:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the live nodes own every shard between them, as evenly as
/// the count allows.
pub(crate) async fn wait_even(nodes: &[ServerProcess], live: &[usize], within: Duration) -> Vec<f64> {
    let started = Instant::now();
    loop {
        let owned = wait_spread(nodes, live, within).await;
        let counts: Vec<f64> = live.iter().map(|i| owned[*i]).collect();
        let (most, least) = counts.iter().fold((f64::MIN, f64::MAX), |(hi, lo), n| (hi.max(*n), lo.min(*n)));
        if most - least <= 1.0 {
            return owned;
        }
        assert!(
            started.elapsed() < within,
            "shards not spread evenly over nodes {live:?} in {within:?}: {owned:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One broker, a target topic of `partitions`, and three nodes sharing a
/// fresh log topic and group, of which the first `running` are started
/// and serving.
pub(crate) struct Bed {
    pub broker: Broker,
    pub topic: String,
    pub log_topic: String,
    pub dirs: Vec<tempfile::TempDir>,
    pub nodes: Vec<ServerProcess>,
}

impl Bed {
    pub async fn start(partitions: i32, running: usize) -> Bed {
        Bed::start_on(Broker::start(), partitions, running).await
    }

    /// As [`start`](Self::start), on `broker`.
    async fn start_on(broker: Broker, partitions: i32, running: usize) -> Bed {
        let topic = random_name("orders");
        let log_topic = random_name("hourglass-log");
        let group = random_name("hourglass");
        broker.create_topic(&topic, partitions).await;
        let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let mut nodes: Vec<ServerProcess> =
            dirs.iter().map(|d| node(&broker, d.path(), &log_topic, &group)).collect();
        for node in &mut nodes[..running] {
            node.spawn().unwrap();
        }
        for node in &mut nodes[..running] {
            node.wait_serving(Duration::from_secs(120)).await.unwrap();
        }
        Bed { broker, topic, log_topic, dirs, nodes }
    }
}

/// Schedules a message by producing it to the ingress topic, as a Kafka
/// application does (Kafka-native ingest): acknowledged once the topic has
/// it with acks=all.
async fn schedule_natively(
    producer: &FutureProducer,
    log_topic: &str,
    topic: &str,
    id: &str,
    due_ms: i64,
    ledger: &Ledger,
) {
    let due = due_ms.to_string();
    let headers = OwnedHeaders::new()
        .insert(Header { key: "hourglass-topic", value: Some(topic.as_bytes()) })
        .insert(Header { key: "hourglass-deliver-at", value: Some(due.as_bytes()) });
    let ingress = ingress_of(log_topic);
    let record = FutureRecord::<str, str>::to(&ingress).key(id).payload(id).headers(headers);
    match producer.send(record, Duration::from_secs(60)).await {
        Ok(_) => ledger.ack(id, due_ms, topic),
        Err((e, _)) => panic!("producing {id} to the ingress topic failed: {e}"),
    }
}

/// Appends `record` under `key` to `partition` of the log, dated
/// `timestamp`, sealed as a node seals it: the test holds the cluster's
/// key.
pub(crate) async fn append_sealed(
    producer: &FutureProducer,
    log_topic: &str,
    partition: i32,
    key: &str,
    record: &LogRecord,
    timestamp: i64,
) {
    let value = record.encode();
    let cluster_key = ClusterKey::load(&hourglass_testkit::cluster_key_file().unwrap()).unwrap();
    let seal = cluster_key.seal(log_topic, partition, Some(key.as_bytes()), Some(&value));
    let headers = OwnedHeaders::new()
        .insert(Header { key: RECORD_HEADER, value: Some(record::FORMAT.as_bytes()) })
        .insert(Header { key: SEAL_HEADER, value: Some(&seal) });
    let written = FutureRecord::<str, [u8]>::to(log_topic)
        .key(key)
        .partition(partition)
        .payload(&value)
        .headers(headers)
        .timestamp(timestamp);
    producer.send(written, Duration::from_secs(10)).await.map_err(|(e, _)| e).unwrap();
}

/// The default ingress topic of a cluster whose log is `log_topic`.
pub(crate) fn ingress_of(log_topic: &str) -> String {
    format!("{log_topic}-ingress")
}

/// 1 (short) and 4. Three nodes, twelve shards: messages scheduled through
/// every node (and one in five produced to the ingress topic)
/// while one node is killed with SIGKILL and later restarted, then another
/// killed and restarted without its data dir. Nothing acknowledged is lost
/// or early; duplicates are counted and reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_survive_kill_9_and_a_lost_data_dir() {
    let _turn = THREE_NODES.lock().await;
    let (count, window_ms) = if full() { (20_000, 60_000) } else { (3_000, 20_000) };
    let Bed { broker, topic, log_topic, dirs, mut nodes } = Bed::start(4, 3).await;
    let producer = native_producer(&broker);
    let spread = wait_spread(&nodes, &[0, 1, 2], Duration::from_secs(60)).await;
    eprintln!("shards per node after start: {spread:?}");

    let clients: Vec<_> =
        nodes.iter().map(|n| reconnecting_client(&n.grpc, Duration::from_secs(5))).collect();
    let ledger = Arc::new(Ledger::default());
    let start = now_ms() + 3_000;
    let run = random_name("m");
    let mut killed_at = None;
    let mut wiped_at = None;
    // Fifty at a time, each about 2.5 s before it is due, as many clients
    // would: a request waiting for a shard that moves holds back no other.
    // The kills fall while messages are scheduled and delivered.
    let mut scheduling = tokio::task::JoinSet::new();
    for first in (0..count).step_by(50) {
        let pace = start - 2_500 + (first as i64 * window_ms) / count as i64;
        tokio::time::sleep(Duration::from_millis((pace - now_ms()).max(0) as u64)).await;
        for i in first..(first + 50).min(count) {
            let due = start + (i as i64 * window_ms) / count as i64;
            let id = format!("{run}-{i}");
            let (mut clients, ledger) = (clients.clone(), Arc::clone(&ledger));
            if i % 5 == 4 {
                let (producer, log_topic, topic) = (producer.clone(), log_topic.clone(), topic.clone());
                scheduling.spawn(async move {
                    schedule_natively(&producer, &log_topic, &topic, &id, due, &ledger).await
                });
                continue;
            }
            let request = due_message(&topic, &id, due);
            scheduling.spawn(async move { schedule_anywhere(&mut clients, i % 3, request, &ledger).await });
        }
        let i = (first + 50).min(count);
        let reached = |mark: usize| (first..i).contains(&mark);
        if reached(count / 3) {
            nodes[1].kill();
            killed_at = Some(Instant::now());
            eprintln!("killed node 1 after {i} sent");
        }
        if reached(count / 2) {
            nodes[1].spawn().unwrap();
            eprintln!("restarted node 1 after {i} sent");
        }
        if reached(2 * count / 3) {
            nodes[2].kill();
            std::fs::remove_dir_all(dirs[2].path()).unwrap();
            nodes[2].spawn().unwrap();
            wiped_at = Some(Instant::now());
            eprintln!("node 2 killed and restarted without its data dir after {i} sent");
        }
    }
    while let Some(done) = scheduling.join_next().await {
        done.unwrap();
    }
    eprintln!("acknowledged {} in {:?} since the first kill", ledger.len(), killed_at.unwrap().elapsed());
    for node in &mut nodes {
        node.wait_serving(Duration::from_secs(120)).await.unwrap();
    }
    let spread = wait_spread(&nodes, &[0, 1, 2], Duration::from_secs(60)).await;
    eprintln!("shards per node at the end: {spread:?} ({:?} after the wipe)", wiped_at.unwrap().elapsed());

    let wait = Duration::from_millis((start + window_ms - now_ms()).max(0) as u64) + Duration::from_secs(60);
    let deliveries =
        collect_async(broker.addr(), &[topic.as_str()], ledger.expected(), wait, Duration::from_secs(3))
            .await;
    let verdict = ledger.verdict(&deliveries);
    eprintln!("3 nodes, kill -9 and a lost data dir: {}", verdict.summary());
    report_duplicates(&verdict);
    verdict.assert_nothing_lost_or_early();
    for node in &mut nodes {
        node.stop().unwrap();
    }
}

/// 3 (short). Scale out from one node to three, and back to two by a
/// graceful stop: the shards spread evenly, and a stopped node's shards go
/// to the others at once (it leaves the group), with nothing lost.
/// Tansu 0.6 may complete a rebalance before every member rejoined, and
/// give a shard to a second node before the first let go of it; the claims
/// in the log keep that from sending anything twice. Duplicates are
/// reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shards_spread_as_nodes_join_and_move_when_one_leaves() {
    let _turn = THREE_NODES.lock().await;
    let Bed { broker, topic, dirs: _dirs, mut nodes, .. } = Bed::start(2, 1).await;
    assert_eq!(wait_spread(&nodes, &[0], Duration::from_secs(60)).await[0], f64::from(LOG_PARTITIONS));

    let mut clients = vec![reconnecting_client(&nodes[0].grpc, Duration::from_secs(5))];
    let ledger = Ledger::default();
    let start = now_ms() + 2_000;
    let count = 600;
    for i in 0..count / 2 {
        let id = format!("early-{i}");
        schedule_anywhere(&mut clients, 0, due_message(&topic, &id, start + i as i64 * 40), &ledger).await;
    }
    let joined = Instant::now();
    for node in &mut nodes[1..] {
        node.spawn().unwrap();
    }
    for node in &mut nodes[1..] {
        node.wait_serving(Duration::from_secs(120)).await.unwrap();
    }
    let spread = wait_even(&nodes, &[0, 1, 2], Duration::from_secs(60)).await;
    eprintln!("1 -> 3 nodes: {spread:?} in {:?}", joined.elapsed());
    // The first node dispatched what the group took back from it until the
    // new nodes said they own it, and released it for them.
    let handed_over = r#"hourglass_cluster_shard_moves_total{move="handed over"}"#;
    wait_metric(&nodes[0], handed_over, 1.0, Duration::from_secs(10)).await;

    let mut clients: Vec<_> =
        nodes.iter().map(|n| reconnecting_client(&n.grpc, Duration::from_secs(5))).collect();
    for i in count / 2..count {
        let id = format!("late-{i}");
        schedule_anywhere(&mut clients, i % 3, due_message(&topic, &id, start + i as i64 * 40), &ledger)
            .await;
    }
    let left = Instant::now();
    nodes[2].stop().unwrap();
    let spread = wait_spread(&nodes, &[0, 1], Duration::from_secs(30)).await;
    eprintln!("3 -> 2 nodes (graceful stop): {spread:?} in {:?}", left.elapsed());
    let even = wait_even(&nodes, &[0, 1], Duration::from_secs(30)).await;
    eprintln!("3 -> 2 nodes, spread evenly: {even:?} in {:?}", left.elapsed());

    let wait =
        Duration::from_millis((start + count as i64 * 40 - now_ms()).max(0) as u64) + Duration::from_secs(30);
    let deliveries =
        collect_async(broker.addr(), &[topic.as_str()], ledger.expected(), wait, Duration::from_secs(2))
            .await;
    let verdict = ledger.verdict(&deliveries);
    eprintln!("scale out and in: {}", verdict.summary());
    report_duplicates(&verdict);
    verdict.assert_nothing_lost_or_early();
    for node in &mut nodes[..2] {
        node.stop().unwrap();
    }
}

/// The sidecar pattern (`deploy/kubernetes/sidecar`): each pod's hourglass
/// a node of one cluster, its store an emptyDir that goes with the pod.
/// Three nodes are scaled down to one as a Deployment scales down: each
/// removed pod stopped with SIGTERM, then its data dir deleted. Messages
/// scheduled through every node before and between the stops, due all
/// along, are each delivered once, none early, none later than failover
/// allows; the last node owns every shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sidecars_scaled_down_from_three_to_one_deliver_every_message_once() {
    let _turn = THREE_NODES.lock().await;
    let Bed { broker, topic, dirs, mut nodes, .. } = Bed::start(2, 3).await;
    wait_even(&nodes, &[0, 1, 2], Duration::from_secs(60)).await;
    let clients: Vec<_> =
        nodes.iter().map(|n| reconnecting_client(&n.grpc, Duration::from_secs(5))).collect();
    let (ledger, run) = (Arc::new(Ledger::default()), random_name("sidecar"));
    // Due every 40 ms over 16 s, from 8 s on: the stops fall at 4 s and
    // 9 s into it. A second half is scheduled after the first stop,
    // through the nodes left.
    let (start, count, every) = (now_ms() + 8_000, 400, 40);
    let schedule = |clients: Vec<SchedulerClient<Channel>>, range: std::ops::Range<usize>| {
        let mut scheduling = tokio::task::JoinSet::new();
        for i in range {
            let (mut clients, ledger) = (clients.clone(), Arc::clone(&ledger));
            let request = due_message(&topic, &format!("{run}-{i}"), start + (i as i64) * every);
            scheduling.spawn(async move { schedule_anywhere(&mut clients, i % 3, request, &ledger).await });
        }
        scheduling
    };
    for done in schedule(clients.clone(), 0..count / 2).join_all().await {
        let () = done;
    }
    assert!(now_ms() < start, "scheduling took past the first due time");

    let scale_down = |node: &mut ServerProcess, dir: &Path| {
        node.stop().unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    };
    tokio::time::sleep(Duration::from_millis((start + 4_000 - now_ms()).max(0) as u64)).await;
    scale_down(&mut nodes[2], dirs[2].path());
    eprintln!("3 -> 2: node 2 stopped and its data dir removed");
    let left = clients[..2].to_vec();
    for done in schedule(left, count / 2..count).join_all().await {
        let () = done;
    }
    tokio::time::sleep(Duration::from_millis((start + 9_000 - now_ms()).max(0) as u64)).await;
    scale_down(&mut nodes[1], dirs[1].path());
    eprintln!("2 -> 1: node 1 stopped and its data dir removed");
    let spread = wait_spread(&nodes, &[0], Duration::from_secs(30)).await;
    assert_eq!(spread[0], f64::from(LOG_PARTITIONS), "the last node owns every shard");

    let wait = Duration::from_millis((start + count as i64 * every - now_ms()).max(0) as u64)
        + Duration::from_secs(30);
    let deliveries =
        collect_async(broker.addr(), &[topic.as_str()], ledger.expected(), wait, Duration::from_secs(3))
            .await;
    let verdict = ledger.verdict(&deliveries);
    eprintln!("sidecars scaled down 3 -> 1: {}", verdict.summary());
    verdict.assert_nothing_lost_or_early();
    assert!(verdict.duplicates.is_empty(), "delivered twice: {:?}", verdict.duplicates);
    assert_eq!(verdict.unacknowledged, 0, "delivered what no one scheduled");
    let latest = verdict.lateness(1.0);
    assert!(latest <= 5_000, "a message {latest} ms late: past failover's bound (5 s)");
    nodes[0].stop().unwrap();
}

/// 5 (short). A node stopped with SIGSTOP for longer than the session
/// timeout, then continued: the group gives its shards to the others
/// meanwhile, and once it runs again it produces nothing until it knows
/// what it still owns (its lease ran out while it was stopped, and the
/// others' claims in the log fence it). Nothing is lost; duplicates are
/// counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_paused_past_its_session_stops_dispatching_what_it_lost() {
    let _turn = THREE_NODES.lock().await;
    let Bed { broker, topic, dirs: _dirs, mut nodes, .. } = Bed::start(2, 3).await;
    wait_even(&nodes, &[0, 1, 2], Duration::from_secs(60)).await;

    // Due every 10 ms over 20 s, once all are scheduled: the pause falls in
    // the middle.
    let mut clients: Vec<_> =
        nodes.iter().map(|n| reconnecting_client(&n.grpc, Duration::from_secs(5))).collect();
    let ledger = Ledger::default();
    let start = now_ms() + 15_000;
    let count = 2_000;
    for i in 0..count {
        let id = format!("p-{i}");
        schedule_anywhere(&mut clients, i % 3, due_message(&topic, &id, start + i as i64 * 10), &ledger)
            .await;
    }
    tokio::time::sleep(Duration::from_millis((start + 5_000 - now_ms()).max(0) as u64)).await;
    let pid = nodes[1].pid().unwrap().to_string();
    let signal = |name: &str| {
        let sent = std::process::Command::new("kill").args([name, &pid]).status().unwrap();
        assert!(sent.success(), "kill {name} failed");
    };
    signal("-STOP");
    let paused = Instant::now();
    let spread = wait_spread(&nodes, &[0, 2], Duration::from_secs(30)).await;
    eprintln!("node 1 paused: its shards moved to the others in {:?}: {spread:?}", paused.elapsed());
    tokio::time::sleep(Duration::from_secs(2)).await;
    signal("-CONT");
    eprintln!("node 1 continued after {:?}", paused.elapsed());
    nodes[1].wait_serving(Duration::from_secs(60)).await.unwrap();

    let wait =
        Duration::from_millis((start + count as i64 * 10 - now_ms()).max(0) as u64) + Duration::from_secs(30);
    let deliveries =
        collect_async(broker.addr(), &[topic.as_str()], ledger.expected(), wait, Duration::from_secs(3))
            .await;
    let verdict = ledger.verdict(&deliveries);
    eprintln!("a node paused past its session: {}", verdict.summary());
    report_duplicates(&verdict);
    verdict.assert_nothing_lost_or_early();
    for node in &mut nodes {
        node.stop().unwrap();
    }
}

/// 7. The broker restarted mid-run: Tansu on SQLite, so that it keeps the
/// log and the target topic across its own restart, is killed while three
/// nodes schedule and deliver, and started again five seconds later.
/// Calls meanwhile fail with UNAVAILABLE and are retried; the nodes find
/// the broker again, the group gives the shards out anew, and every
/// message acknowledged before, during or after the outage is delivered,
/// none early.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_restart_mid_run_loses_nothing() {
    let _turn = THREE_NODES.lock().await;
    let Bed { mut broker, topic, dirs: _dirs, mut nodes, .. } =
        Bed::start_on(Broker::start_persistent(), 2, 3).await;
    wait_spread(&nodes, &[0, 1, 2], Duration::from_secs(60)).await;

    let clients: Vec<_> =
        nodes.iter().map(|n| reconnecting_client(&n.grpc, Duration::from_secs(5))).collect();
    let ledger = Arc::new(Ledger::default());
    let (count, window_ms) = (1_500, 30_000);
    let start = now_ms() + 3_000;
    let mut scheduling = tokio::task::JoinSet::new();
    let mut outage = None;
    // Twenty at a time, each about 2.5 s before it is due; the broker goes
    // down a third of the way in, while some are in flight and some due.
    for first in (0..count).step_by(20) {
        let pace = start - 2_500 + (first as i64 * window_ms) / count as i64;
        tokio::time::sleep(Duration::from_millis((pace - now_ms()).max(0) as u64)).await;
        for i in first..(first + 20).min(count) {
            let due = start + (i as i64 * window_ms) / count as i64;
            let request = due_message(&topic, &format!("b-{i}"), due);
            let (mut clients, ledger) = (clients.clone(), Arc::clone(&ledger));
            scheduling.spawn(async move { schedule_anywhere(&mut clients, i % 3, request, &ledger).await });
        }
        if (first..first + 20).contains(&(count / 3)) {
            broker.stop();
            outage = Some(Instant::now());
            eprintln!("broker stopped after {} sent", first + 20);
        }
        if outage.is_some_and(|at| at.elapsed() >= Duration::from_secs(5)) && !broker.is_running() {
            broker.resume();
            eprintln!("broker started again after {:?}", outage.unwrap().elapsed());
        }
    }
    if !broker.is_running() {
        broker.resume();
    }
    while let Some(done) = scheduling.join_next().await {
        done.unwrap();
    }
    eprintln!("acknowledged {} of {count}", ledger.len());
    for node in &mut nodes {
        node.wait_serving(Duration::from_secs(120)).await.unwrap();
    }
    let spread = wait_spread(&nodes, &[0, 1, 2], Duration::from_secs(120)).await;
    eprintln!("shards per node after the broker came back: {spread:?}");

    let wait = Duration::from_millis((start + window_ms - now_ms()).max(0) as u64) + Duration::from_secs(60);
    let deliveries =
        collect_async(broker.addr(), &[topic.as_str()], ledger.expected(), wait, Duration::from_secs(3))
            .await;
    let verdict = ledger.verdict(&deliveries);
    eprintln!("a broker restart mid-run: {}", verdict.summary());
    report_duplicates(&verdict);
    verdict.assert_nothing_lost_or_early();
    for node in &mut nodes {
        node.stop().unwrap();
    }
}

/// A copy of a shard that last applied the log longer ago than Kafka
/// keeps tombstones (12 h here; the timestamps of hourglass's own records
/// say when) is not brought up to date from where it stopped, which could
/// miss deliveries compaction has since erased: it is rebuilt from the
/// log. Here the last record a node applied and wrote out before it was
/// killed is one of hourglass's, dated two days back, and a Kafka-native
/// schedule follows while the node is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_far_behind_the_log_is_rebuilt_not_resumed() {
    let broker = Broker::start();
    let (topic, log_topic, group) =
        (random_name("orders"), random_name("hourglass-log"), random_name("hourglass"));
    broker.create_topic(&topic, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let mut one = node(&broker, dir.path(), &log_topic, &group);
    // A store writes no WAL of its own: what a kill leaves is what it
    // wrote out, here at every tick.
    one.env("HOURGLASS_FAILPOINT", "store-writes-out-at-once@1..1000000000");
    one.spawn().unwrap();
    one.wait_serving(Duration::from_secs(120)).await.unwrap();
    let producer = native_producer(&broker);

    // A record as hourglass writes it (a message recorded as failed), two
    // days old by its timestamp.
    let (old, two_days_ago) = ("stale-a".to_owned(), now_ms() - 2 * 24 * 3_600_000);
    let failed = LogRecord {
        writer: 7,
        request: 1,
        change: Some(Change::Failed(record::Failed {
            id: old.as_bytes().to_vec(),
            reason: "made up".into(),
            at_ms: two_days_ago as u64,
            message: None,
        })),
    };
    let partition = java_partition(old.as_bytes(), LOG_PARTITIONS as i32);
    append_sealed(&producer, &log_topic, partition, &old, &failed, two_days_ago).await;
    let mut client = reconnecting_client(&one.grpc, Duration::from_secs(5));
    let state = |client: &mut SchedulerClient<Channel>, id: &str| {
        let (mut client, id) = (client.clone(), id.to_owned());
        async move {
            client.get(proto::GetRequest { id, ..Default::default() }).await.map(|r| r.into_inner().state())
        }
    };
    let started = Instant::now();
    while state(&mut client, &old).await.ok() != Some(proto::State::Failed) {
        assert!(started.elapsed() < Duration::from_secs(20), "the backdated record was not applied");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Written out at the next tick.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    one.kill();
    let later = id_in_shard("stale-b", partition as u32);
    // The partition goes on while the node is down.
    let envelope = Envelope {
        topic: topic.clone(),
        key: None,
        value: b"later".to_vec(),
        headers: Vec::new(),
        partition: None,
        labels: Default::default(),
        max_lateness: None,
        dead_letter_topic: None,
    };
    let (now, due) = (now_ms() as u64, now_ms() as u64 + 3_600_000);
    let id = MessageId::parse(&later).unwrap();
    let message =
        LogMessage::new(&id, &envelope, DueSpec::At(UnixMillis(due)), UnixMillis(due), UnixMillis(now));
    let scheduled = LogRecord { writer: 7, request: 2, change: Some(Change::Scheduled(message)) };
    append_sealed(&producer, &log_topic, partition, &later, &scheduled, now as i64).await;
    one.spawn().unwrap();
    one.wait_serving(Duration::from_secs(120)).await.unwrap();
    assert_eq!(
        one.metric("hourglass_cluster_stale_copies_rebuilt_total").await.unwrap(),
        1.0,
        "that shard alone: the others applied their last records just now"
    );
    assert_eq!(state(&mut client, &old).await.unwrap(), proto::State::Failed, "rebuilt from the log");
    assert_eq!(state(&mut client, &later).await.unwrap(), proto::State::Pending);
    one.stop().unwrap();
}

/// Calls `op` on the nodes in turn from `first` until one answers other
/// than UNAVAILABLE (a node stopped, a shard moving for too long): what a
/// client retrying with the same id does.
pub(crate) async fn on_any_node<T>(
    clients: &[SchedulerClient<Channel>],
    first: usize,
    op: impl Fn(SchedulerClient<Channel>) -> Answer<T>,
) -> Result<T, tonic::Status> {
    let give_up = Instant::now() + Duration::from_secs(60);
    for attempt in 0.. {
        let client = clients[(first + attempt) % clients.len()].clone();
        match op(client).await {
            Err(status)
                if matches!(status.code(), Code::Unavailable | Code::Unknown | Code::Cancelled)
                    && Instant::now() < give_up =>
            {
                if attempt % clients.len() == clients.len() - 1 {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            answer => return answer,
        }
    }
    unreachable!()
}

pub(crate) type Answer<T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, tonic::Status>> + Send>>;

fn ts(ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: ms.div_euclid(1000), nanos: (ms.rem_euclid(1000) * 1_000_000) as i32 }
}

/// 6. Any node answers for any shard: Schedule, Get, Cancel and Reschedule
/// through every node (two in three reach a node that does not own the
/// message's shard, which sends them on to the owner the routing topic
/// names), a batch and a stream split by owner, List and Stats over every
/// node. Then cancels and reschedules race shard moves (a node stopped,
/// then started again): every answer is the truth, so nothing answered
/// CANCELLED is delivered and a rescheduled message comes at its new time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn any_node_answers_for_any_shard_and_cancels_hold_while_shards_move() {
    let _turn = THREE_NODES.lock().await;
    let Bed { broker, topic, log_topic, dirs: _dirs, mut nodes } = Bed::start(2, 3).await;
    wait_even(&nodes, &[0, 1, 2], Duration::from_secs(60)).await;
    let clients: Vec<_> =
        nodes.iter().map(|n| reconnecting_client(&n.grpc, Duration::from_secs(5))).collect();
    let ledger = Ledger::default();

    // Through a node that may not own the shard: every call is answered by
    // the node asked, with the owner's answer.
    let soon = now_ms() + 25_000;
    let count = 120;
    for i in 0..count {
        let (id, due) = (format!("a-{i}"), if i % 2 == 0 { soon } else { soon + 600_000 });
        let reply = clients[i % 3].clone().schedule(due_message(&topic, &id, due)).await;
        let reply = reply.unwrap_or_else(|s| panic!("node {} did not take {id}: {s:?}", i % 3)).into_inner();
        assert_eq!((reply.id.as_str(), millis(reply.deliver_at.as_ref().unwrap())), (id.as_str(), due));
        ledger.ack(&id, due, &topic);
    }
    let again = clients[1].clone().schedule(due_message(&topic, "a-0", soon)).await.unwrap().into_inner();
    assert!(again.duplicate, "a retry through another node is answered as the duplicate it is");
    for i in 0..count {
        let id = format!("a-{i}");
        let got = clients[(i + 1) % 3]
            .clone()
            .get(proto::GetRequest { id: id.clone(), ..Default::default() })
            .await;
        let got =
            got.unwrap_or_else(|s| panic!("node {} did not find {id}: {s:?}", (i + 1) % 3)).into_inner();
        assert_eq!((got.state(), got.message.unwrap().topic), (proto::State::Pending, topic.clone()), "{id}");
        if i % 4 == 0 {
            let cancelled = clients[(i + 2) % 3]
                .clone()
                .cancel(proto::CancelRequest { id: id.clone(), ..Default::default() })
                .await;
            assert_eq!(cancelled.unwrap().into_inner().outcome(), proto::CancelOutcome::Cancelled, "{id}");
            ledger.cancelled(&id);
        }
        if i % 2 == 1 {
            // Far off: brought forward to when the others come.
            let due = soon + 2_000;
            let moved = clients[(i + 2) % 3]
                .clone()
                .reschedule(proto::RescheduleRequest {
                    id: id.clone(),
                    due: Some(proto::reschedule_request::Due::DeliverAt(ts(due))),
                    ..Default::default()
                })
                .await;
            assert_eq!(millis(&moved.unwrap().into_inner().deliver_at.unwrap()), due, "{id}");
            ledger.rescheduled(&id, due);
        }
    }
    let nothing = clients[2]
        .clone()
        .get(proto::GetRequest { id: "never-scheduled".into(), ..Default::default() })
        .await;
    assert_eq!(nothing.unwrap_err().code(), Code::NotFound, "the owner's NOT_FOUND comes back as it was");

    // A batch and a stream, split by owner.
    let batch = (0..60).map(|i| due_message(&topic, &format!("b-{i}"), soon)).collect();
    let answers = clients[0].clone().schedule_batch(proto::ScheduleBatchRequest { requests: batch }).await;
    for (i, answer) in answers.unwrap().into_inner().results.into_iter().enumerate() {
        assert_eq!(answer.index, i as u64);
        match answer.result {
            Some(proto::schedule_result::Result::Scheduled(s)) => assert_eq!(s.id, format!("b-{i}")),
            other => panic!("batch item {i}: {other:?}"),
        }
        ledger.ack(&format!("b-{i}"), soon, &topic);
    }
    let items: Vec<_> = (0..60).map(|i| due_message(&topic, &format!("s-{i}"), soon)).collect();
    let stream = tokio_stream::iter(items);
    let mut answers = clients[1].clone().schedule_stream(stream).await.unwrap().into_inner();
    let mut streamed = 0;
    while let Some(answer) = answers.message().await.unwrap() {
        match answer.result {
            Some(proto::schedule_result::Result::Scheduled(s)) => {
                assert_eq!(s.id, format!("s-{}", answer.index))
            }
            other => panic!("stream item {}: {other:?}", answer.index),
        }
        ledger.ack(&format!("s-{}", answer.index), soon, &topic);
        streamed += 1;
    }
    assert_eq!(streamed, 60);

    // List and Stats see every node's shards.
    let expected = ledger.expected();
    let stats = clients[2].clone().stats(proto::StatsRequest {}).await.unwrap().into_inner();
    assert_eq!((stats.pending, stats.cancelled), (expected.len() as u64, 30), "{stats:?}");
    let mut listed = std::collections::HashSet::new();
    let mut token = String::new();
    loop {
        let page = clients[1]
            .clone()
            .list(proto::ListRequest { page_size: 50, page_token: token, ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        assert!(page.messages.len() <= 50);
        for m in page.messages {
            assert!(listed.insert(m.id.clone()), "{} listed twice", m.id);
        }
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(listed, expected, "List pages through every node's shards, each message once");
    let mut forwarded = 0.0;
    for node in &nodes {
        forwarded += node.metric("hourglass_cluster_forwarded_total").await.unwrap_or(0.0);
    }
    assert!(forwarded > 0.0, "no call went to another node");
    eprintln!("through any node: {forwarded} calls sent on to the owner; stats {stats:?}");

    // Kafka-native records that cannot be scheduled (no due time): each is
    // refused once, by the owner of its ingress partition, and parks
    // nothing; the good record after them in their partitions is taken.
    let producer = native_producer(&broker);
    let ingress = ingress_of(&log_topic);
    let refused: Vec<String> = (0..6).map(|i| format!("refused-{i}")).collect();
    for id in &refused {
        let headers =
            OwnedHeaders::new().insert(Header { key: "hourglass-topic", value: Some(topic.as_bytes()) });
        let record = FutureRecord::<str, str>::to(&ingress).key(id).payload("v").headers(headers);
        producer.send(record, Duration::from_secs(30)).await.map_err(|(e, _)| e).unwrap();
    }
    let series = format!("hourglass_ingress_records_total{{outcome=\"refused\",topic=\"{ingress}\"}}");
    let started = Instant::now();
    let mut counted = 0.0;
    while counted < refused.len() as f64 {
        assert!(started.elapsed() < Duration::from_secs(30), "refused records not counted: {counted}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        counted = 0.0;
        for node in &nodes {
            counted += node.metric(&series).await.unwrap_or(0.0);
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut again = 0.0;
    for node in &nodes {
        again += node.metric(&series).await.unwrap_or(0.0);
    }
    assert_eq!(again, refused.len() as f64, "each refused record is counted once across the nodes");
    for id in &refused {
        let got = clients[0]
            .clone()
            .get(proto::GetRequest { id: id.clone(), ..Default::default() })
            .await
            .unwrap_err();
        assert_eq!(got.code(), tonic::Code::NotFound, "{id} parked nothing");
    }

    // Cancels and reschedules racing moves: node 2 stops (its shards go to
    // the others) and starts again (some come back).
    let start = now_ms() + 20_000;
    let raced = 300;
    for i in 0..raced {
        let id = format!("m-{i}");
        let due = start + i as i64 * 20;
        schedule_anywhere(&mut clients.clone(), i % 3, due_message(&topic, &id, due), &ledger).await;
    }
    let racing = {
        let (clients, ledger_ops) = (clients.clone(), Arc::new(std::sync::Mutex::new(Vec::new())));
        let ops = Arc::clone(&ledger_ops);
        let task = tokio::spawn(async move {
            let mut counts = [0usize; 4];
            for i in 0..raced {
                let id = format!("m-{i}");
                if i % 3 == 0 {
                    let outcome = on_any_node(&clients, i % 3, |mut c| {
                        let request = proto::CancelRequest { id: id.clone(), ..Default::default() };
                        Box::pin(async move { c.cancel(request).await.map(|r| r.into_inner().outcome()) })
                    })
                    .await
                    .unwrap_or_else(|s| panic!("cancel {id}: {s:?}"));
                    counts[0] += 1;
                    if matches!(
                        outcome,
                        proto::CancelOutcome::Cancelled | proto::CancelOutcome::AlreadyCancelled
                    ) {
                        ops.lock().unwrap().push((id, None));
                        counts[1] += 1;
                    }
                } else if i % 3 == 1 {
                    let due = start + i as i64 * 20 + 3_000;
                    let moved = on_any_node(&clients, i % 3, |mut c| {
                        let request = proto::RescheduleRequest {
                            id: id.clone(),
                            due: Some(proto::reschedule_request::Due::DeliverAt(ts(due))),
                            ..Default::default()
                        };
                        Box::pin(async move {
                            c.reschedule(request).await.map(|r| millis(&r.into_inner().deliver_at.unwrap()))
                        })
                    })
                    .await;
                    counts[2] += 1;
                    match moved {
                        Ok(at) => {
                            assert_eq!(at, due, "{id}");
                            ops.lock().unwrap().push((id, Some(due)));
                            counts[3] += 1;
                        }
                        Err(s) if s.code() == Code::FailedPrecondition => {}
                        Err(s) => panic!("reschedule {id}: {s:?}"),
                    }
                }
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
            counts
        });
        (task, ledger_ops)
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    nodes[2].stop().unwrap();
    eprintln!("node 2 stopped while cancels and reschedules go on");
    tokio::time::sleep(Duration::from_secs(2)).await;
    nodes[2].spawn().unwrap();
    nodes[2].wait_serving(Duration::from_secs(60)).await.unwrap();
    let counts = racing.0.await.unwrap();
    for (id, due) in racing.1.lock().unwrap().drain(..) {
        match due {
            None => ledger.cancelled(&id),
            Some(due) => ledger.rescheduled(&id, due),
        }
    }
    eprintln!(
        "while shards moved: {} cancels ({} answered cancelled), {} reschedules ({} moved)",
        counts[0], counts[1], counts[2], counts[3]
    );
    wait_spread(&nodes, &[0, 1, 2], Duration::from_secs(60)).await;

    let wait = Duration::from_millis((start + raced as i64 * 20 + 3_000 - now_ms()).max(0) as u64)
        + Duration::from_secs(30);
    let deliveries =
        collect_async(broker.addr(), &[topic.as_str()], ledger.expected(), wait, Duration::from_secs(3))
            .await;
    let verdict = ledger.verdict(&deliveries);
    eprintln!("any node, and cancels while shards move: {}", verdict.summary());
    report_duplicates(&verdict);
    verdict.assert_nothing_lost_or_early();
    for node in &mut nodes {
        node.stop().unwrap();
    }
}
