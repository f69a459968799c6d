//! A node that takes calls and never answers them (SIGSTOPped, or
//! black-holed by the network) costs only its own shards: the calls a
//! node passes on to it are bounded (half of `--max-concurrent-requests`)
//! and the rest fail at once, so the node's calls for every other shard
//! keep being served.

use crate::common;

use std::time::{Duration, Instant};

use common::{verify::*, *};
use hourglass::{
    cluster::{
        ClusterKey,
        log::{
            route::{self, Route},
            seal::SEAL_HEADER,
        },
    },
    proto,
};
use hourglass_testkit::{ServerProcess, shards_owned_by};
use prost::Message as _;
use rdkafka::{
    message::{Header, OwnedHeaders},
    producer::FutureRecord,
};
use tonic::Code;

use crate::cluster_nodes::{LOG_PARTITIONS, THREE_NODES, id_in_shard, node, now_ms, wait_spread};

/// Two nodes, the first with `--max-concurrent-requests 8`. The routing
/// topic is then told, as a node of the cluster would tell it, that the
/// second node's shards are answered at a listener that accepts
/// connections and never answers. Sixteen callers without a deadline ask
/// the first node for messages of those shards; meanwhile its own shards'
/// calls all succeed. Before the bound, the sixteen held all eight of its
/// call slots for 30 s each, and every other call was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_that_never_answers_costs_only_its_own_shards() {
    let broker = Broker::start();
    let topic = random_name("orders");
    broker.create_topic(&topic, 1).await;
    let (log_topic, group) = (random_name("hourglass-log"), random_name("hourglass"));
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut nodes: Vec<ServerProcess> = vec![
        node(&broker, dirs[0].path(), &log_topic, &group).arg("--max-concurrent-requests", 8),
        node(&broker, dirs[1].path(), &log_topic, &group),
    ];
    for n in &mut nodes {
        n.spawn().unwrap();
    }
    for n in &mut nodes {
        n.wait_serving(Duration::from_secs(120)).await.unwrap();
    }
    wait_spread(&nodes, &[0, 1], Duration::from_secs(60)).await;
    let key = ClusterKey::load(&hourglass_testkit::cluster_key_file().unwrap()).unwrap();
    let (brokers, log, addr) =
        (broker.addr().to_owned(), log_topic.clone(), format!("http://{}", nodes[1].grpc));
    let theirs: Vec<u32> =
        tokio::task::spawn_blocking(move || shards_owned_by(&brokers, &log, LOG_PARTITIONS, &addr).unwrap())
            .await
            .unwrap()
            .into_iter()
            .collect();
    assert!(!theirs.is_empty() && theirs.len() < LOG_PARTITIONS as usize, "{theirs:?}");

    // A message in every shard, scheduled while both answer.
    let run = random_name("h");
    let id_in = |shard: u32| id_in_shard(&run, shard);
    let mut client = reconnecting_client(&nodes[0].grpc, Duration::from_secs(5));
    let due = now_ms() + 3_600_000;
    for shard in 0..LOG_PARTITIONS {
        client.schedule(due_message(&topic, &id_in(shard), due)).await.unwrap();
    }
    let (hung, mine): (Vec<u32>, Vec<u32>) = (0..LOG_PARTITIONS).partition(|s| theirs.contains(s));

    // The listener that never answers, and the second node's shards
    // routed to it.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent = format!("http://{}", listener.local_addr().unwrap());
    let holding = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    // Said again every 300 ms: the second node says where its shards are
    // every third of a session timeout (2 s here), which would end the
    // detour before a call finds it on a busy machine.
    let (routing, producer, forged) = (route::topic_of(&log_topic), native_producer(&broker), hung.clone());
    let forging = tokio::spawn(async move {
        loop {
            for shard in &forged {
                let value = Route {
                    writer: 0x51_1e47,
                    addr: silent.clone(),
                    at_ms: now_ms() as u64,
                    released: false,
                    ..Default::default()
                }
                .encode_to_vec();
                let shard_key = route::key(*shard);
                let seal = key.seal(&routing, 0, Some(&shard_key), Some(&value));
                let headers = OwnedHeaders::new().insert(Header { key: SEAL_HEADER, value: Some(&seal) });
                let record = FutureRecord::<[u8], [u8]>::to(&routing)
                    .partition(0)
                    .key(&shard_key)
                    .payload(&value)
                    .headers(headers);
                producer.send(record, Duration::from_secs(30)).await.map_err(|(e, _)| e).unwrap();
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    // Once the first node routes there, a call with a deadline runs out.
    let began = Instant::now();
    loop {
        let mut request = tonic::Request::new(proto::GetRequest { id: id_in(hung[0]), ..Default::default() });
        request.set_timeout(Duration::from_millis(500));
        let answer = client.get(request).await;
        // The server's DEADLINE_EXCEEDED, or the client's own timeout.
        if answer.as_ref().is_err_and(|s| matches!(s.code(), Code::DeadlineExceeded | Code::Cancelled)) {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "the first node never routed to the silent listener: {answer:?}"
        );
    }

    // Sixteen callers without a deadline for the silent node's shards.
    let mut waiting = tokio::task::JoinSet::new();
    for i in 0..16 {
        let (mut client, id) = (client.clone(), id_in(hung[i % hung.len()]));
        waiting.spawn(
            async move { client.get(proto::GetRequest { id, ..Default::default() }).await.map(|_| ()) },
        );
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Meanwhile every call for the first node's own shards is served. (On
    // a busy machine the group may move a shard meanwhile: a call for it
    // then waits for the move, as any call does, and is asked again.)
    for round in 0..5 {
        for shard in &mine {
            let began = Instant::now();
            let got = loop {
                match client.get(proto::GetRequest { id: id_in(*shard), ..Default::default() }).await {
                    Err(s) if s.code() == Code::Unavailable && !refused_as_silent(&s) => {
                        assert!(
                            began.elapsed() < Duration::from_secs(30),
                            "round {round}, shard {shard}: {s:?}"
                        );
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    got => break got,
                }
            };
            let got = got.unwrap_or_else(|s| panic!("round {round}, shard {shard}: {s:?}"));
            assert_eq!(got.into_inner().state(), proto::State::Pending);
        }
    }
    // Of the sixteen, at most the four a node may hold on one peer still
    // wait: the others were refused at once (or, had the group moved the
    // shard meanwhile, answered by its new owner). On a busy machine the
    // sixteen may still be reaching the node (its other call slots admit
    // them as the refused ones end): waited for. Unbounded forwarding holds
    // all sixteen on the silent listener, and the count never falls to four.
    let (began, mut refused, mut answered) = (Instant::now(), 0, 0);
    while waiting.len() > 4 && began.elapsed() < Duration::from_secs(20) {
        match tokio::time::timeout(Duration::from_millis(200), waiting.join_next()).await {
            Ok(Some(Ok(Err(s)))) if refused_as_silent(&s) => refused += 1,
            Ok(Some(Ok(_))) => answered += 1,
            Ok(Some(Err(e))) => panic!("a caller failed: {e}"),
            Ok(None) | Err(_) => {}
        }
    }
    let metric = nodes[0].metric("hourglass_cluster_forward_refused_total").await.unwrap();
    assert!(
        waiting.len() <= 4,
        "{} of the sixteen still wait on the silent node ({refused} refused, {answered} answered otherwise, \
         {metric} forwards refused)",
        waiting.len()
    );
    eprintln!(
        "{refused} of the sixteen refused at once, {answered} answered otherwise, {metric} forwards refused"
    );
    waiting.abort_all();
    forging.abort();
    holding.abort();
    for n in &mut nodes {
        n.stop().unwrap();
    }
}

/// The same with a real hung node: three nodes, the first with
/// `--max-concurrent-requests 64`; the third is stopped with SIGSTOP (its
/// port still takes connections, and nothing answers), and 200 callers
/// without a deadline ask the first for messages of the stopped node's
/// shards. At most half of the first node's call slots wait on the stopped
/// node, the rest of those calls fail at once, and every call for the
/// live nodes' shards is served meanwhile, until the group moves the
/// stopped node's shards.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopped_node_takes_at_most_half_of_another_s_call_slots() {
    let _turn = THREE_NODES.lock().await;
    let broker = Broker::start();
    let topic = random_name("orders");
    broker.create_topic(&topic, 1).await;
    let (log_topic, group) = (random_name("hourglass-log"), random_name("hourglass"));
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut nodes: Vec<ServerProcess> = dirs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let n = node(&broker, d.path(), &log_topic, &group);
            if i == 0 { n.arg("--max-concurrent-requests", 64) } else { n }
        })
        .collect();
    // One after another: the first leads the group on Tansu.
    for n in &mut nodes {
        n.spawn().unwrap();
        n.wait_serving(Duration::from_secs(120)).await.unwrap();
    }
    wait_spread(&nodes, &[0, 1, 2], Duration::from_secs(60)).await;
    // The third node's shards, once the routing topic says the same twice
    // in a row (Tansu moves shards about for a few seconds after a join).
    let owned_by_third = || {
        let (brokers, log, addr) =
            (broker.addr().to_owned(), log_topic.clone(), format!("http://{}", nodes[2].grpc));
        tokio::task::spawn_blocking(move || shards_owned_by(&brokers, &log, LOG_PARTITIONS, &addr).unwrap())
    };
    let mut theirs = owned_by_third().await.unwrap();
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let again = owned_by_third().await.unwrap();
        if again == theirs {
            break;
        }
        theirs = again;
    }
    let run = random_name("s");
    let id_in = |shard: u32| id_in_shard(&run, shard);
    let mut client = reconnecting_client(&nodes[0].grpc, Duration::from_secs(5));
    let due = now_ms() + 3_600_000;
    for shard in 0..LOG_PARTITIONS {
        // A shard still on the move answers UNAVAILABLE: asked again.
        let started = Instant::now();
        while let Err(status) = client.schedule(due_message(&topic, &id_in(shard), due)).await {
            let again = matches!(status.code(), Code::Unavailable | Code::Cancelled | Code::DeadlineExceeded);
            assert!(again && started.elapsed() < Duration::from_secs(30), "{status:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // Still so once they are all scheduled.
    loop {
        let again = owned_by_third().await.unwrap();
        if again == theirs {
            break;
        }
        theirs = again;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let pid = nodes[2].pid().unwrap().to_string();
    let signal = |name: &str| {
        let sent = std::process::Command::new("kill").args([name, &pid]).status().unwrap();
        assert!(sent.success(), "kill {name} failed");
    };
    signal("-STOP");
    let stopped = Instant::now();
    // Its shards as the topic says once it is stopped: a late move of
    // Tansu's may have given it one more since the reading above, and a
    // stopped node takes and gives up nothing.
    let theirs = owned_by_third().await.unwrap();
    let (hung, live): (Vec<u32>, Vec<u32>) = (0..LOG_PARTITIONS).partition(|s| theirs.contains(s));
    assert!(!hung.is_empty() && !live.is_empty(), "{hung:?} {live:?}");
    let mut waiting = tokio::task::JoinSet::new();
    for i in 0..200 {
        let (mut client, id) = (client.clone(), id_in(hung[i % hung.len()]));
        waiting.spawn(
            async move { client.get(proto::GetRequest { id, ..Default::default() }).await.map(|_| ()) },
        );
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    // While the group still gives the stopped node its shards (its session
    // is 6 s, heard of last at most 0.5 s before the stop), calls for the
    // live nodes' shards are served: none is turned away for want of a call
    // slot. (Tansu may still move a live shard about meanwhile; a call for
    // it then waits, as in any move.)
    let began = Instant::now();
    let (mut served, mut waited, mut rounds) = (0, 0, 0);
    while stopped.elapsed() < Duration::from_millis(4_500) {
        for shard in &live {
            let mut request =
                tonic::Request::new(proto::GetRequest { id: id_in(*shard), ..Default::default() });
            request.set_timeout(Duration::from_secs(2));
            match client.get(request).await {
                Ok(got) => {
                    assert_eq!(got.into_inner().state(), proto::State::Pending);
                    served += 1;
                }
                Err(s) if s.code() == Code::ResourceExhausted => {
                    panic!("shard {shard}, {:?} in: turned away: {s:?}", began.elapsed())
                }
                Err(s) if refused_as_silent(&s) => {
                    panic!("shard {shard}, {:?} in: refused as the stopped node's: {s:?}", began.elapsed())
                }
                Err(_) => waited += 1,
            }
        }
        rounds += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(served >= 9 * (served + waited) / 10, "served {served}, waited {waited}");
    let refused = nodes[0].metric("hourglass_cluster_forward_refused_total").await.unwrap();
    assert!(refused >= 200.0 - 32.0, "all but the 32 a node may hold failed at once: {refused}");
    eprintln!(
        "{rounds} rounds: {served} calls for the live shards served, {waited} waited for a move; {refused} calls \
         for the stopped node refused"
    );
    waiting.abort_all();
    signal("-CONT");
    for n in &mut nodes {
        n.stop().unwrap();
    }
}

/// The refusal of a call past the bound on calls to one peer.
fn refused_as_silent(status: &tonic::Status) -> bool {
    status.code() == Code::Unavailable && status.message().contains("calls from this node unanswered")
}
