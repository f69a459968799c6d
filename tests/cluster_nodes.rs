//! Cluster mode with several `hourglass serve` processes sharing one broker
//! and one schedule log: the consumer group spreads the shards, a node
//! killed with SIGKILL loses its shards to the others after the session
//! timeout, a node restarted (or restarted without its data dir) takes some
//! back, and a consumer of the target topic finds every acknowledged
//! message, none early.
//!
//! The short runs are part of `cargo test`; `HOURGLASS_CLUSTER_FULL=1`
//! makes them long.

mod common;

use std::{
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use common::{verify::*, *};
use hourglass::{proto, proto::scheduler_client::SchedulerClient, store::Durability};
use hourglass_testkit::ServerProcess;
use tonic::{Code, transport::Channel};

const BIN: &str = env!("CARGO_BIN_EXE_hourglass");

const LOG_PARTITIONS: u32 = 12;

fn full() -> bool {
    std::env::var("HOURGLASS_CLUSTER_FULL").is_ok_and(|v| v == "1")
}

/// A node of the cluster, not started yet.
fn node(broker: &Broker, data_dir: &Path, log_topic: &str, group: &str) -> ServerProcess {
    ServerProcess::new(Path::new(BIN), data_dir, broker.addr(), Durability::Buffered)
        .unwrap()
        .arg("--cluster", "true")
        .arg("--log-topic", log_topic)
        .arg("--log-partitions", LOG_PARTITIONS)
        .arg("--group-id", group)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// Schedules `request` through whichever node takes it, starting at
/// `first`: a node that does not own the message's shard, or is down or
/// moving it, refuses with UNAVAILABLE and the next one is tried.
async fn schedule_anywhere(
    clients: &mut [SchedulerClient<Channel>],
    first: usize,
    request: proto::ScheduleRequest,
    ledger: &Ledger,
) {
    let give_up = Instant::now() + Duration::from_secs(90);
    let topic = request.message.as_ref().unwrap().topic.clone();
    for attempt in 0.. {
        assert!(Instant::now() < give_up, "{:?} was never acknowledged", request.id);
        let client = &mut clients[(first + attempt) % clients.len()];
        match client.schedule(request.clone()).await {
            Ok(reply) => {
                let reply = reply.into_inner();
                ledger.ack(&reply.id, millis(reply.deliver_at.as_ref().unwrap()), &topic);
                return;
            }
            Err(status) if matches!(status.code(), Code::Unavailable | Code::Unknown | Code::Cancelled) => {
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
async fn wait_spread(nodes: &[ServerProcess], live: &[usize], within: Duration) -> Vec<f64> {
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
async fn wait_even(nodes: &[ServerProcess], live: &[usize], within: Duration) -> Vec<f64> {
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
struct Bed {
    broker: Broker,
    topic: String,
    dirs: Vec<tempfile::TempDir>,
    nodes: Vec<ServerProcess>,
}

impl Bed {
    async fn start(partitions: i32, running: usize) -> Bed {
        let broker = Broker::start();
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
        Bed { broker, topic, dirs, nodes }
    }
}

/// 1 (short) and 4. Three nodes, twelve shards: messages scheduled through
/// every node while one node is killed with SIGKILL and later restarted,
/// then another killed and restarted without its data dir. Nothing
/// acknowledged is lost or early; duplicates are counted and reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_survive_kill_9_and_a_lost_data_dir() {
    let (count, window_ms) = if full() { (20_000, 60_000) } else { (3_000, 20_000) };
    let Bed { broker, topic, dirs, mut nodes } = Bed::start(4, 3).await;
    let spread = wait_spread(&nodes, &[0, 1, 2], Duration::from_secs(60)).await;
    eprintln!("shards per node after start: {spread:?}");

    let mut clients: Vec<_> =
        nodes.iter().map(|n| reconnecting_client(&n.grpc, Duration::from_secs(5))).collect();
    let ledger = Arc::new(Ledger::default());
    let start = now_ms() + 3_000;
    let run = random_name("m");
    let mut killed_at = None;
    let mut wiped_at = None;
    for i in 0..count {
        let due = start + (i as i64 * window_ms) / count as i64;
        let id = format!("{run}-{i}");
        schedule_anywhere(&mut clients, i % 3, due_message(&topic, &id, due), &ledger).await;
        if i == count / 3 {
            nodes[1].kill();
            killed_at = Some(Instant::now());
            eprintln!("killed node 1 after {i} acknowledged");
        }
        if i == count / 2 {
            nodes[1].spawn().unwrap();
            eprintln!("restarted node 1 after {i} acknowledged");
        }
        if i == 2 * count / 3 {
            nodes[2].kill();
            std::fs::remove_dir_all(dirs[2].path()).unwrap();
            nodes[2].spawn().unwrap();
            wiped_at = Some(Instant::now());
            eprintln!("node 2 killed and restarted without its data dir after {i} acknowledged");
        }
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
    let Bed { broker, topic, dirs: _dirs, mut nodes } = Bed::start(2, 1).await;
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

/// 5 (short). A node stopped with SIGSTOP for longer than the session
/// timeout, then continued: the group gives its shards to the others
/// meanwhile, and once it runs again it produces nothing until it knows
/// what it still owns (its lease ran out while it was stopped, and the
/// others' claims in the log fence it). Nothing is lost; duplicates are
/// counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_paused_past_its_session_stops_dispatching_what_it_lost() {
    let Bed { broker, topic, dirs: _dirs, mut nodes } = Bed::start(2, 3).await;
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
