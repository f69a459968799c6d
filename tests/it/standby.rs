//! Standby copies: a shard's first standby takes it over from an owner
//! that is gone before the group notices; a copy whose store stopped is
//! opened again; and a standby copy that stopped
//! following the log while it was kept open is rebuilt from the log when
//! its node takes the shard over, not taken over as it is: it may have
//! missed tombstones that compaction has erased since, and would bring
//! delivered messages back.
//!
//! The rebuilt copy, on librdkafka's mock cluster: the last record of the log when the
//! standby opens is one of hourglass's, dated two days back, so by the
//! record timestamps the copy is further behind than Kafka keeps
//! tombstones (12 h here) as soon as the log goes on, as a copy whose
//! reader stalled for that long is. The fail point `log-reader-stalls`
//! stops the standby's applier the first time it has read all there was,
//! up to that record.

use crate::common;

use std::time::Duration;

use common::{mock::Mock, *};
use hourglass::{
    cluster::log::record::{self, Change, LogRecord},
    proto,
};
use hourglass_testkit::ServerProcess;
use rdkafka::{ClientConfig, producer::FutureProducer};

use crate::{
    cluster_nodes::{LOG_PARTITIONS, THREE_NODES, append_sealed, id_in_shard, node as cluster_node, now_ms},
    let_go::{consume_async, node, wait_metric},
};

/// A one-shard cluster on a mock broker (the log has one partition), its
/// first node up and owning the shard; a second node's directory ready.
struct OneShard {
    mock: Mock,
    topic: String,
    log_topic: String,
    group: String,
    dirs: [tempfile::TempDir; 2],
    owner: ServerProcess,
}

impl OneShard {
    async fn start(name: &str) -> OneShard {
        let mock = Mock::start(1);
        let (topic, log_topic, group) =
            (random_name(name), random_name("hourglass-log"), random_name("hourglass"));
        mock.topic_led(&topic, 1, 1);
        for (name, partitions) in
            [(log_topic.clone(), 1), (format!("{log_topic}-owners"), 1), (format!("{log_topic}-ingress"), 1)]
        {
            mock.topic_led(&name, partitions, 1);
        }
        let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
        let mut owner = node(&mock, dirs[0].path(), &log_topic, &group, 1);
        owner.spawn().unwrap();
        owner.wait_serving(Duration::from_secs(60)).await.unwrap();
        OneShard { mock, topic, log_topic, group, dirs, owner }
    }

    /// The second node, with `HOURGLASS_FAILPOINT` set to `failpoint`, up
    /// and keeping its standby copy of the shard.
    async fn standby(&self, failpoint: &str) -> ServerProcess {
        let mut standby = node(&self.mock, self.dirs[1].path(), &self.log_topic, &self.group, 1);
        standby.env("HOURGLASS_FAILPOINT", failpoint);
        standby.spawn().unwrap();
        standby.wait_serving(Duration::from_secs(60)).await.unwrap();
        wait_metric(&standby, "hourglass_cluster_standbys", 1.0, Duration::from_secs(60)).await;
        standby
    }

    /// Schedules `ids` through the owner, due `after` from now.
    async fn schedule(&self, ids: &[String], after: Duration) {
        let mut client = reconnecting_client(&self.owner.grpc, Duration::from_secs(10));
        for id in ids {
            let request = proto::ScheduleRequest { id: Some(id.clone()), ..request(&self.topic, id, after) };
            client.schedule(request).await.unwrap_or_else(|e| panic!("{id}: {e:?}"));
        }
    }

    /// Kills the owner; `standby` takes the shard, and every one of `ids`
    /// is delivered once. Whether its copy was rebuilt from the log, not
    /// taken over as it was: `rebuilt`.
    async fn owner_dies(&mut self, standby: &ServerProcess, ids: &[String], rebuilt: bool) {
        self.owner.kill();
        wait_metric(standby, "hourglass_cluster_shards_owned", 1.0, Duration::from_secs(60)).await;
        assert_eq!(
            standby.metric("hourglass_cluster_stale_copies_rebuilt_total").await.unwrap(),
            if rebuilt { 1.0 } else { 0.0 },
            "the copy rebuilt from the log ({rebuilt}) rather than taken over as it was"
        );
        let got = consume_async(&self.mock, &self.topic, ids.len(), Duration::from_secs(2)).await;
        let mut delivered: Vec<&str> = got.iter().map(|r| r.id()).collect();
        delivered.sort_unstable();
        let mut wanted: Vec<&str> = ids.iter().map(String::as_str).collect();
        wanted.sort_unstable();
        assert_eq!(delivered, wanted, "each scheduled message delivered once, by the node that took over");
    }
}

fn run_ids(n: usize) -> Vec<String> {
    let run = random_name("m");
    (0..n).map(|i| format!("{run}-{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_standby_that_stopped_following_the_log_is_rebuilt_when_its_shard_is_taken() {
    let mut cluster = OneShard::start("standby").await;
    // A record as hourglass writes it (a message recorded as failed), two
    // days old by its timestamp, last in the log.
    let two_days_ago = now_ms() - 2 * 24 * 3_600_000;
    let failed = LogRecord {
        writer: 7,
        request: 1,
        change: Some(Change::Failed(record::Failed {
            id: b"long-ago".to_vec(),
            reason: "made up".into(),
            at_ms: two_days_ago as u64,
            message: None,
        })),
    };
    let producer: FutureProducer =
        ClientConfig::new().set("bootstrap.servers", cluster.mock.bootstrap()).create().unwrap();
    append_sealed(&producer, &cluster.log_topic, 0, "long-ago", &failed, two_days_ago).await;
    let mut standby = cluster.standby("log-reader-stalls").await;
    // The copy reads the log to its end, finds nothing more within a
    // quarter of a second, and stops there.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The log goes on past what the standby applied.
    let ids = run_ids(10);
    cluster.schedule(&ids, Duration::from_secs(20)).await;
    cluster.owner_dies(&standby, &ids, true).await;
    standby.stop().unwrap();
}

/// A standby copy whose store's writer thread panics (the fail point
/// `store-writer-panics` at its third round of changes, in the standby's
/// process only, where the copy is the only store: after it has applied
/// some of the log) is closed and opened again, and goes on from the log
/// offset it recorded; the node stays up, and when the owner dies it takes
/// the shard over from that copy (up to date, not rebuilt): every message
/// is delivered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_standby_copy_whose_writer_stopped_is_opened_again_and_takes_over() {
    let mut cluster = OneShard::start("copy-stopped").await;
    let mut standby = cluster.standby("store-writer-panics@3").await;
    // One at a time: each a record of the log, applied by the copy in a
    // round of its own or a few together.
    let ids = run_ids(20);
    cluster.schedule(&ids, Duration::from_secs(30)).await;
    wait_metric(&standby, "hourglass_cluster_standby_copies_stopped_total", 1.0, Duration::from_secs(60))
        .await;
    wait_metric(&standby, "hourglass_cluster_standbys", 1.0, Duration::from_secs(60)).await;
    cluster.owner_dies(&standby, &ids, false).await;
    standby.stop().unwrap();
}

/// A node killed with its shards' standbys up: each standby finds nothing
/// listening where the owner answered and takes its shard over before the
/// group could notice (its session is a minute here), and every message is
/// delivered once.
///
/// On Tansu: librdkafka's mock cluster takes a member out of its group as
/// soon as its connection closes, which a real coordinator does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_owner_s_shards_are_taken_over_by_their_standbys_before_the_group_notices() {
    let _turn = THREE_NODES.lock().await;
    let broker = Broker::start();
    let (topic, log_topic, group) =
        (random_name("takeover"), random_name("hourglass-log"), random_name("hourglass"));
    broker.create_topic(&topic, 1).await;
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut nodes: Vec<ServerProcess> = dirs
        .iter()
        .map(|dir| {
            cluster_node(&broker, dir.path(), &log_topic, &group).arg("--group-session-timeout", "60s")
        })
        .collect();
    for node in &mut nodes {
        node.spawn().unwrap();
    }
    for node in &mut nodes {
        node.wait_serving(Duration::from_secs(60)).await.unwrap();
    }
    // Half the shards each, each standing by for the other's.
    let half = f64::from(LOG_PARTITIONS / 2);
    for node in &nodes {
        wait_metric(node, "hourglass_cluster_shards_owned", half, Duration::from_secs(60)).await;
        wait_metric(node, "hourglass_cluster_standbys", half, Duration::from_secs(60)).await;
    }
    let mut client = reconnecting_client(&nodes[1].grpc, Duration::from_secs(10));
    let run = random_name("m");
    let ids: Vec<String> = (0..LOG_PARTITIONS).map(|shard| id_in_shard(&run, shard)).collect();
    for id in &ids {
        let request =
            proto::ScheduleRequest { id: Some(id.clone()), ..request(&topic, id, Duration::from_secs(3)) };
        client.schedule(request).await.unwrap_or_else(|e| panic!("{id}: {e:?}"));
    }
    // The survivor has connected to the owner: its death is told by a refusal.
    wait_metric(&nodes[1], "hourglass_cluster_peers_listening", 1.0, Duration::from_secs(10)).await;
    nodes[0].kill();
    let killed = std::time::Instant::now();
    let taken_over = r#"hourglass_cluster_shard_moves_total{move="taken over"}"#;
    wait_metric(&nodes[1], taken_over, half, Duration::from_secs(30)).await;
    let got =
        common::consume_async(&broker, &topic, ids.len(), Duration::from_secs(30), Duration::from_secs(2))
            .await;
    assert!(
        killed.elapsed() < Duration::from_secs(50),
        "delivered {:?} after the kill: the group's session (60 s) may have moved the shards instead",
        killed.elapsed()
    );
    let mut delivered: Vec<&str> = got.iter().map(|r| r.id()).collect();
    delivered.sort_unstable();
    let mut wanted: Vec<&str> = ids.iter().map(String::as_str).collect();
    wanted.sort_unstable();
    assert_eq!(delivered, wanted, "each message delivered once, the killed node's by its standby");
    nodes[1].stop().unwrap();
}
