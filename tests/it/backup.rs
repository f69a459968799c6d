//! `hourglass backup DIR` against the real binary, a real broker and real
//! stores: a copy taken while the server serves, restored by starting a
//! server on it after the original went on delivering. What was pending in
//! the copy and delivered since is found on its topic and not sent again;
//! what is still due is delivered once, on time; what was scheduled since
//! is not in the copy, and a cancel made since is undone (both as
//! docs/OPERATIONS.md says). Only an operator may take a backup, and a
//! cluster refuses.

use crate::common;

use std::{
    collections::{BTreeMap, HashSet},
    path::Path,
    process::Command,
    time::Duration,
};

use common::{verify::*, *};
use hourglass::{
    auth::Bearer,
    proto::{self, admin_client::AdminClient, scheduler_client::SchedulerClient},
    store::Durability,
};
use hourglass_testkit::ServerProcess;
use tonic::{Code, transport::Channel};

const BIN: &str = env!("CARGO_BIN_EXE_hourglass");
const OPS: &str = "ops-token-0123456789abcdef";
const APP: &str = "app-token-0123456789abcdef";

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

/// A server of two shards over `data`, with an operator's token and an
/// application's (its own tenant, every topic).
async fn server(broker: &Broker, data: &Path, tokens: &Path) -> ServerProcess {
    ServerProcess::new(Path::new(BIN), data, broker.addr(), Durability::Sync)
        .unwrap()
        .arg("--shards", 2)
        .arg("--auth-tokens", tokens.display())
        .launch()
        .await
        .unwrap()
}

async fn clients(
    server: &ServerProcess,
    token: &str,
) -> (
    SchedulerClient<tonic::service::interceptor::InterceptedService<Channel, Bearer>>,
    AdminClient<tonic::service::interceptor::InterceptedService<Channel, Bearer>>,
) {
    let channel = Channel::from_shared(format!("http://{}", server.grpc)).unwrap().connect().await.unwrap();
    let bearer = Bearer::new(Some(token)).unwrap();
    (
        SchedulerClient::with_interceptor(channel.clone(), bearer.clone()),
        AdminClient::with_interceptor(channel, bearer),
    )
}

/// How many times each id reached `topic`, read until `expected` all did.
async fn delivered(broker: &Broker, topic: &str, expected: HashSet<String>) -> BTreeMap<String, usize> {
    let records =
        collect_async(broker.addr(), &[topic], expected, Duration::from_secs(30), Duration::from_secs(2))
            .await;
    let mut times = BTreeMap::new();
    for r in records {
        *times.entry(r.id).or_insert(0) += 1;
    }
    times
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_restored_later_loses_nothing_pending_then_and_repeats_nothing_delivered_since() {
    let broker = Broker::start();
    let topic = random_name("backed-up");
    broker.create_topic(&topic, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[[token]]\nname = \"app\"\ntoken = \"{APP}\"\ntenant = \"app\"\ntopics = [\"*\"]\n\n\
             [[token]]\nname = \"ops\"\ntoken = \"{OPS}\"\ntopics = [\"*\"]\nadmin = \"all\"\n"
        ),
    )
    .unwrap();
    let mut original = server(&broker, &dir.path().join("data"), &tokens).await;
    let (mut app, mut app_admin) = clients(&original, APP).await;
    let schedule = |id: String, due: i64| {
        let mut request = due_message(&topic, &id, due);
        request.id = Some(id);
        request
    };

    // Delivered before the backup; due between the backup and the restore;
    // due after the restore.
    let t0 = now_ms();
    let ids = |kind: &str| (0..10).map(|i| format!("{kind}-{i}")).collect::<Vec<_>>();
    let (before, between, after) = (ids("before"), ids("between"), ids("after"));
    for id in &before {
        app.schedule(schedule(id.clone(), t0 + 500)).await.unwrap();
    }
    // The first half within what the dispatcher recorded it may produce
    // without recording more (5 s past the next due), the second past it:
    // only the restore puts the second in doubt.
    for (i, id) in between.iter().enumerate() {
        app.schedule(schedule(id.clone(), t0 + if i < 5 { 9_000 } else { 15_000 })).await.unwrap();
    }
    for id in &after {
        app.schedule(schedule(id.clone(), t0 + 24_000)).await.unwrap();
    }
    delivered(&broker, &topic, before.iter().cloned().collect()).await;

    // Only an operator backs up.
    let backup = dir.path().join("backup");
    let request = proto::BackupRequest { dir: backup.display().to_string() };
    let refused = app_admin.backup(request.clone()).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(!backup.exists(), "a refused backup writes nothing");
    let (_, mut ops_admin) = clients(&original, OPS).await;
    let data = dir.path().join("data");
    for (path, says) in [("backup".into(), "absolute"), (data.join("copy").display().to_string(), "data dir")]
    {
        let invalid = ops_admin.backup(proto::BackupRequest { dir: path }).await.unwrap_err();
        assert_eq!(invalid.code(), Code::InvalidArgument, "{invalid:?}");
        assert!(invalid.message().contains(says), "{}", invalid.message());
    }
    // The command line, as an operator runs it, while the server serves.
    let out = Command::new(BIN)
        .args([
            "backup",
            backup.to_str().unwrap(),
            "--server",
            &original.grpc,
            "--token",
            OPS,
            "--output",
            "json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "hourglass backup: {}", String::from_utf8_lossy(&out.stderr));
    let said: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((said["shards"].as_u64(), said["pending"].as_u64()), (Some(2), Some(20)), "{said}");
    assert!(backup.join("shard-0/CURRENT").exists() && backup.join("shard-1/CURRENT").exists());
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&backup).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700, "the server's user alone reads a backup");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(
        left.iter().all(|n| !n.to_string_lossy().contains("partial")),
        "nothing half made is left: {left:?}"
    );
    let again = ops_admin.backup(request).await.unwrap_err();
    assert_eq!(again.code(), Code::InvalidArgument, "an existing directory is refused: {again:?}");

    // Since the backup: one scheduled, one cancelled; and "between" delivered.
    app.schedule(schedule("since".into(), t0 + 9_000)).await.unwrap();
    app.cancel(proto::CancelRequest { id: after[0].clone(), ..Default::default() }).await.unwrap();
    let mut expected: HashSet<String> = before.iter().chain(&between).cloned().collect();
    expected.insert("since".into());
    delivered(&broker, &topic, expected).await;
    assert!(now_ms() >= t0 + 15_000);
    original.stop().unwrap();

    // Restored: a server started on the backup.
    let mut restored = server(&broker, &backup, &tokens).await;
    let (mut app, _) = clients(&restored, APP).await;
    let all: HashSet<String> = before.iter().chain(&between).chain(&after).cloned().collect();
    let times = delivered(&broker, &topic, all.clone()).await;
    assert!(now_ms() >= t0 + 24_000, "read until every one was delivered");
    for id in &all {
        assert_eq!(times.get(id), Some(&1), "{id} delivered once: {times:?}");
    }
    assert_eq!(times.get("since"), Some(&1), "scheduled since the backup: delivered by the original alone");
    let got = app.get(proto::GetRequest { id: between[0].clone(), ..Default::default() }).await.unwrap();
    assert_eq!(
        got.into_inner().state,
        proto::State::Delivered as i32,
        "found on its topic, recorded as delivered"
    );
    let since = app.get(proto::GetRequest { id: "since".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!(since.code(), Code::NotFound, "scheduled since the backup: not in it");
    assert!(!backup.join("shard-0/HOURGLASS-BACKUP").exists(), "the restore is recorded once");
    restored.stop().unwrap();
}

/// A cluster's stores are copies of its schedule log: a backup of one node
/// would be a part of a copy, and is refused with what to keep instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_refuses_a_backup_and_says_what_to_keep() {
    let crate::cluster_nodes::Bed { dirs, mut nodes, .. } = crate::cluster_nodes::Bed::start(1, 1).await;
    let channel = Channel::from_shared(format!("http://{}", nodes[0].grpc)).unwrap().connect().await.unwrap();
    let dir = dirs[0].path().join("backup").display().to_string();
    let refused = AdminClient::new(channel).backup(proto::BackupRequest { dir }).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("log topic"), "{}", refused.message());
    nodes[0].stop().unwrap();
}

/// A call that writes where it is told is not for a server that checks no
/// tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_tokens_refuses_a_backup() {
    let broker = Broker::start();
    let dir = tempfile::tempdir().unwrap();
    let mut server =
        ServerProcess::start(&dir.path().join("data"), broker.addr(), Durability::Sync).await.unwrap();
    let channel = Channel::from_shared(format!("http://{}", server.grpc)).unwrap().connect().await.unwrap();
    let backup = dir.path().join("backup");
    let request = proto::BackupRequest { dir: backup.display().to_string() };
    let refused = AdminClient::new(channel).backup(request).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("--auth-tokens"), "{}", refused.message());
    assert!(!backup.exists());
    server.stop().unwrap();
}
