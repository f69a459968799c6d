//! The cluster suite's main scenario as production runs it: TLS on every
//! gRPC port, a tokens file, and a tenant's Kafka-native schedules through
//! an ingress topic mapped to its grant. Nodes are killed with SIGKILL
//! while messages are scheduled and come due, one restarted as it was and
//! one without its data dir: every acknowledged message is delivered once,
//! none early, whichever way it came.

use crate::common;

use std::{
    path::Path,
    time::{Duration, Instant},
};

use common::{verify::*, *};
use hourglass::{
    auth::Bearer,
    proto::{self, scheduler_client::SchedulerClient},
};
use hourglass_testkit::ServerProcess;
use tonic::{Code, service::interceptor::InterceptedService, transport::Channel};

use crate::cluster_nodes::{THREE_NODES, node, now_ms, wait_spread};

type Client = SchedulerClient<InterceptedService<Channel, Bearer>>;

/// Schedules `request` through `client` until a node takes it: a shard on
/// the move, or a node just killed, answers UNAVAILABLE.
async fn schedule(client: &Client, request: proto::ScheduleRequest, ledger: &Ledger) {
    let give_up = Instant::now() + Duration::from_secs(90);
    let topic = request.message.as_ref().unwrap().topic.clone();
    loop {
        match client.clone().schedule(request.clone()).await {
            Ok(reply) => {
                let reply = reply.into_inner();
                ledger.ack(&reply.id, millis(reply.deliver_at.as_ref().unwrap()), &topic);
                return;
            }
            Err(status) if matches!(status.code(), Code::Unavailable | Code::Unknown | Code::Cancelled) => {
                assert!(Instant::now() < give_up, "{:?} never acknowledged: {status:?}", request.id);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(status) => panic!("scheduling {:?} failed: {status:?}", request.id),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_with_tls_and_tokens_survives_kill_9_and_a_lost_data_dir() {
    let _turn = THREE_NODES.lock().await;
    let (count, window_ms) = (900, 15_000);
    let broker = Broker::start();
    let topic = random_name("orders");
    broker.create_topic(&topic, 4).await;
    let pki = crate::security::pki();
    let tokens = pki.path().join("tokens.toml");
    let file = format!("[[token]]\nname = \"orders\"\ntoken = \"orders-secret\"\ntopics = [\"{topic}\"]\n");
    std::fs::write(&tokens, file).unwrap();
    let (log_topic, group) = (random_name("hourglass-log"), random_name("hourglass"));
    let ingress = format!("{log_topic}-orders");
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let pem = |name: &str| pki.path().join(name).display().to_string();
    let make = |dir: &Path| {
        node(&broker, dir, &log_topic, &group)
            .arg("--auth-tokens", tokens.display())
            .arg("--tls-cert", pem("server.pem"))
            .arg("--tls-key", pem("server.key"))
            .arg("--tls-peer-ca", pem("ca.pem"))
            .arg("--ingress", format!("{ingress}=orders"))
    };
    let mut nodes: Vec<ServerProcess> = dirs.iter().map(|d| make(d.path())).collect();
    // One after another: the first leads the group and is never killed
    // (Tansu 0.6 makes no other member the leader once its leader died).
    // Health speaks TLS too: the metrics say when the shards are spread.
    for i in 0..nodes.len() {
        nodes[i].spawn().unwrap();
        wait_spread(&nodes, &(0..=i).collect::<Vec<_>>(), Duration::from_secs(120)).await;
    }
    let channel =
        crate::security::tls_channel(nodes[0].grpc.parse().unwrap(), pki.path(), None).await.unwrap();
    let client: Client =
        SchedulerClient::with_interceptor(channel, Bearer::new(Some("orders-secret")).unwrap());
    let producer = native_producer(&broker);

    let ledger = std::sync::Arc::new(Ledger::default());
    let (start, run) = (now_ms() + 3_000, random_name("s"));
    let mut scheduling = tokio::task::JoinSet::new();
    for first in (0..count).step_by(50) {
        let pace = start - 2_500 + (first as i64 * window_ms) / count as i64;
        tokio::time::sleep(Duration::from_millis((pace - now_ms()).max(0) as u64)).await;
        for i in first..(first + 50).min(count) {
            let due = start + (i as i64 * window_ms) / count as i64;
            let id = format!("{run}-{i}");
            let (client, ledger, topic) = (client.clone(), std::sync::Arc::clone(&ledger), topic.clone());
            if i % 5 == 4 {
                // The tenant's own ingress topic; its grant covers the topic.
                let (producer, ingress) = (producer.clone(), ingress.clone());
                scheduling.spawn(async move {
                    let due_text = due.to_string();
                    let headers =
                        [("hourglass-topic", topic.as_str()), ("hourglass-deliver-at", due_text.as_str())];
                    send_native(&producer, &ingress, &id, Some(&id), &headers).await;
                    ledger.ack(&id, due, &topic);
                });
                continue;
            }
            scheduling.spawn(async move { schedule(&client, due_message(&topic, &id, due), &ledger).await });
        }
        let i = (first + 50).min(count);
        let reached = |mark: usize| (first..i).contains(&mark);
        if reached(count / 3) {
            nodes[2].kill();
            eprintln!("killed node 2 after {i} sent");
        }
        if reached(count / 2) {
            nodes[2].spawn().unwrap();
            eprintln!("restarted node 2 after {i} sent");
        }
        if reached(2 * count / 3) {
            nodes[1].kill();
            std::fs::remove_dir_all(dirs[1].path()).unwrap();
            nodes[1].spawn().unwrap();
            eprintln!("node 1 killed and restarted without its data dir after {i} sent");
        }
    }
    while let Some(done) = scheduling.join_next().await {
        done.unwrap();
    }
    let spread = wait_spread(&nodes, &[0, 1, 2], Duration::from_secs(120)).await;
    eprintln!("shards per node at the end: {spread:?}");
    let wait = Duration::from_millis((start + window_ms - now_ms()).max(0) as u64) + Duration::from_secs(60);
    let deliveries =
        collect_async(broker.addr(), &[topic.as_str()], ledger.expected(), wait, Duration::from_secs(3))
            .await;
    let verdict = ledger.verdict(&deliveries);
    eprintln!("3 nodes with TLS and tokens, kill -9 and a lost data dir: {}", verdict.summary());
    verdict.assert_nothing_lost_or_early();
    assert_eq!(verdict.unacknowledged, 0, "delivered what no one scheduled");
    let refused: f64 = {
        let series = format!("hourglass_ingress_records_total{{outcome=\"refused\",topic=\"{ingress}\"}}");
        let mut sum = 0.0;
        for n in &nodes {
            sum += n.metric(&series).await.unwrap_or(0.0);
        }
        sum
    };
    assert_eq!(refused, 0.0, "the ingress topic's grant covers its records");
    for n in &mut nodes {
        n.stop().unwrap();
    }
}
