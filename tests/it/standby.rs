//! A standby copy that stopped following the log while it was kept open is
//! rebuilt from the log when its node takes the shard over, not taken over
//! as it is: it may have missed tombstones that compaction has erased
//! since, and would bring delivered messages back.
//!
//! On librdkafka's mock cluster: the last record of the log when the
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
use rdkafka::{ClientConfig, producer::FutureProducer};

use crate::{
    cluster_nodes::{append_sealed, now_ms},
    let_go::{consume_async, node, wait_metric},
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_standby_that_stopped_following_the_log_is_rebuilt_when_its_shard_is_taken() {
    let mock = Mock::start(1);
    let (topic, log_topic, group) =
        (random_name("standby"), random_name("hourglass-log"), random_name("hourglass"));
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
        ClientConfig::new().set("bootstrap.servers", mock.bootstrap()).create().unwrap();
    append_sealed(&producer, &log_topic, 0, "long-ago", &failed, two_days_ago).await;
    let mut standby = node(&mock, dirs[1].path(), &log_topic, &group, 1);
    standby.env("HOURGLASS_FAILPOINT", "log-reader-stalls");
    standby.spawn().unwrap();
    standby.wait_serving(Duration::from_secs(60)).await.unwrap();
    wait_metric(&standby, "hourglass_cluster_standbys", 1.0, Duration::from_secs(60)).await;
    // The copy reads the log to its end, finds nothing more within a
    // quarter of a second, and stops there.
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The log goes on past what the standby applied.
    let mut client = reconnecting_client(&owner.grpc, Duration::from_secs(10));
    let run = random_name("m");
    let ids: Vec<String> = (0..10).map(|i| format!("{run}-{i}")).collect();
    for id in &ids {
        let request =
            proto::ScheduleRequest { id: Some(id.clone()), ..request(&topic, id, Duration::from_secs(20)) };
        client.schedule(request).await.unwrap_or_else(|e| panic!("{id}: {e:?}"));
    }
    owner.kill();
    wait_metric(&standby, "hourglass_cluster_shards_owned", 1.0, Duration::from_secs(60)).await;
    assert_eq!(
        standby.metric("hourglass_cluster_stale_copies_rebuilt_total").await.unwrap(),
        1.0,
        "the copy is rebuilt from the log, not taken over"
    );
    let got = consume_async(&mock, &topic, ids.len(), Duration::from_secs(2)).await;
    let mut delivered: Vec<&str> = got.iter().map(|r| r.id()).collect();
    delivered.sort_unstable();
    let mut wanted: Vec<&str> = ids.iter().map(String::as_str).collect();
    wanted.sort_unstable();
    assert_eq!(delivered, wanted, "each scheduled message delivered once, by the node that took over");
    standby.stop().unwrap();
}
