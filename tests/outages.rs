//! What a broker does wrong for a while, played by librdkafka's mock cluster:
//! it refuses a topic (an ACL mistake, a topic deleted and re-created), it
//! answers one topic's produces slowly, or it has not answered when hourglass
//! shuts down. Nothing is failed for a glitch shorter than `--fail-after`,
//! nothing is produced twice by a running server, one slow topic does not
//! hold the others, and a message whose produce is in doubt is never
//! answered CANCELLED.
//!
//! `HOURGLASS_RELIABILITY_FULL=1` makes the glitches 60 s long instead of
//! 20 s.

// Apart from `tests/it/`: it reads the Prometheus registry of the servers
// it starts in this process, which every server in the process shares.
#[path = "it/common/mod.rs"]
mod common;

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use common::{
    mock::{Mock, RDKafkaRespErr as RespErr},
    *,
};
use hourglass::proto::{self, State, scheduler_client::SchedulerClient};
use tonic::{Code, transport::Channel};

/// The mock cluster's metrics are per process and so are hourglass's: one
/// scenario at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn glitch() -> Duration {
    Duration::from_secs(if reliability_full() { 60 } else { 20 })
}

fn with_id(mut r: proto::ScheduleRequest, id: &str) -> proto::ScheduleRequest {
    r.id = Some(id.into());
    r
}

/// Reads `topic` on the mock cluster until `count` records came (or
/// `within` passed) and a little longer; records by id, with their
/// timestamps.
async fn records(mock: &Mock, topic: &str, count: usize, within: Duration) -> HashMap<String, Vec<i64>> {
    let got = tokio::task::spawn_blocking({
        let (bootstrap, topic) = (mock.bootstrap(), topic.to_owned());
        move || consume(&bootstrap, &topic, count, within, Duration::from_secs(2))
    })
    .await
    .unwrap();
    let mut by_id: HashMap<String, Vec<i64>> = HashMap::new();
    for r in got {
        by_id.entry(r.id().to_owned()).or_default().push(r.timestamp_ms);
    }
    by_id
}

/// Schedules `count` messages for `topic`, ids `{prefix}-{i}`, due spread
/// over `over` from `after`; returns each id's due time in Unix ms.
async fn schedule_spread(
    client: &mut SchedulerClient<Channel>,
    topic: &str,
    prefix: &str,
    count: usize,
    after: Duration,
    over: Duration,
) -> HashMap<String, i64> {
    let mut due = HashMap::new();
    for i in 0..count {
        let at = after + over * i as u32 / count.max(1) as u32;
        let id = format!("{prefix}-{i}");
        let s = client.schedule(with_id(request(topic, &id, at), &id)).await.unwrap().into_inner();
        due.insert(id, millis(&s.deliver_at.unwrap()));
    }
    due
}

/// Every scheduled message arrived once, none before its due time.
fn assert_once_on_time(what: &str, due: &HashMap<String, i64>, got: &HashMap<String, Vec<i64>>) {
    let missing: Vec<_> = due.keys().filter(|id| !got.contains_key(*id)).collect();
    assert!(missing.is_empty(), "{what}: {} never arrived: {missing:?}", missing.len());
    for (id, at) in got {
        assert_eq!(at.len(), 1, "{what}: {id} arrived {} times", at.len());
        assert!(at[0] >= due[id], "{what}: {id} arrived {} ms early", due[id] - at[0]);
    }
}

async fn failed_total(server: &Hourglass) -> f64 {
    metric(server, "hourglass_messages_failed_total").await
}

/// A topic the broker refuses for a while, by authorization (an ACL
/// revoked by mistake and put back) and as unknown (deleted and
/// re-created): its messages wait and go out once it is back; none fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_refused_for_a_while_fails_nothing() {
    let _serial = SERIAL.lock().await;
    for (what, deleted) in [("produce ACL revoked", false), ("topic deleted and re-created", true)] {
        let mock = Mock::start(1);
        let topic = random_name("glitch");
        mock.topic(&topic, 1);
        let dir = tempfile::tempdir().unwrap();
        let server = Hourglass::start(config_at(&mock.bootstrap(), dir.path())).await;
        let mut client = server.client().await;
        let failed_before = failed_total(&server).await;
        let count = 60;
        // Due before, during and after the glitch.
        let due = schedule_spread(&mut client, &topic, "m", count, Duration::from_secs(2), glitch()).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let started = Instant::now();
        if deleted {
            mock.topic_error(&topic, RespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART);
            mock.fail_every_produce(RespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART, 100_000);
        } else {
            mock.fail_every_produce(RespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED, 100_000);
        }
        tokio::time::sleep(glitch()).await;
        mock.clear_produce_errors();
        mock.topic_error(&topic, RespErr::RD_KAFKA_RESP_ERR_NO_ERROR);
        let got = records(&mock, &topic, count, Duration::from_secs(60)).await;
        eprintln!(
            "{what} for {:?}: {} of {count} delivered, {:?} after the glitch began",
            glitch(),
            got.len(),
            started.elapsed()
        );
        assert_once_on_time(what, &due, &got);
        assert_eq!(failed_total(&server).await, failed_before, "{what}: a glitch failed messages");
        let stats = client.stats(proto::StatsRequest {}).await.unwrap().into_inner();
        assert_eq!((stats.failed, stats.pending), (0, 0), "{what}: {stats:?}");
        server.stop().await;
    }
}

/// One topic's broker answers produces 8 s late. hourglass never produces
/// one of its records twice, and the other topic's messages go out on
/// time: the slow topic holds its own messages back, not every slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_topic_neither_duplicates_nor_holds_the_others() {
    let _serial = SERIAL.lock().await;
    let mock = Mock::start(2);
    let (slow, healthy) = (random_name("slow"), random_name("healthy"));
    mock.topic(&slow, 1);
    mock.topic(&healthy, 2);
    let dir = tempfile::tempdir().unwrap();
    let mut config = config_at(&mock.bootstrap(), dir.path());
    config.max_in_flight = 8;
    config.stall_after = Duration::from_secs(1).into();
    let server = Hourglass::start(config).await;
    let mut client = server.client().await;
    // Warm both topics up so the producer knows their leaders.
    client.schedule(request(&slow, "warm", Duration::ZERO)).await.unwrap();
    client.schedule(request(&healthy, "warm", Duration::ZERO)).await.unwrap();
    records(&mock, &healthy, 1, Duration::from_secs(30)).await;
    records(&mock, &slow, 1, Duration::from_secs(30)).await;

    mock.slow_broker(1, 8_000);
    let slow_due = schedule_spread(&mut client, &slow, "s", 30, Duration::ZERO, Duration::from_secs(2)).await;
    let healthy_due =
        schedule_spread(&mut client, &healthy, "h", 40, Duration::from_secs(1), Duration::from_secs(6)).await;
    let got = records(&mock, &healthy, 41, Duration::from_secs(30)).await;
    let mut late: Vec<i64> =
        healthy_due.iter().filter_map(|(id, due)| got.get(id).map(|at| at[0] - due)).collect();
    late.sort_unstable();
    eprintln!(
        "healthy topic beside a slow one: lateness ms p50 {} max {}",
        late[late.len() / 2],
        late[late.len() - 1]
    );
    let healthy_got: HashMap<_, _> = got.into_iter().filter(|(id, _)| healthy_due.contains_key(id)).collect();
    assert_once_on_time("healthy", &healthy_due, &healthy_got);
    // Bounded by stall detection (1 s) and a wake-up, not by the 8 s the
    // slow broker takes.
    assert!(late[late.len() - 1] < 5_000, "the healthy topic waited behind the slow one: {late:?}");

    mock.slow_broker(1, 0);
    let got = records(&mock, &slow, 31, Duration::from_secs(60)).await;
    let slow_got: HashMap<_, _> = got.into_iter().filter(|(id, _)| slow_due.contains_key(id)).collect();
    assert_once_on_time("slow", &slow_due, &slow_got);
    server.stop().await;
}

/// A cancel that waits on a produce Kafka has not answered when hourglass
/// shuts down past its grace: the produce is in doubt, so the cancel is
/// never answered CANCELLED, and the message never ends CANCELLED while
/// its record is on the topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_in_doubt_at_shutdown_is_never_cancelled() {
    let _serial = SERIAL.lock().await;
    let mock = Mock::start(1);
    let topic = random_name("doubt");
    mock.topic(&topic, 1);
    let dir = tempfile::tempdir().unwrap();
    let mut config = config_at(&mock.bootstrap(), dir.path());
    config.shutdown_grace = Duration::from_secs(1).into();
    let server = Hourglass::start(config.clone()).await;
    let mut client = server.client().await;
    client.schedule(request(&topic, "warm", Duration::ZERO)).await.unwrap();
    records(&mock, &topic, 1, Duration::from_secs(30)).await;

    mock.slow_broker(1, 6_000);
    client.schedule(with_id(request(&topic, "doubt", Duration::ZERO), "in-doubt")).await.unwrap();
    let started = Instant::now();
    loop {
        let stats = client.stats(proto::StatsRequest {}).await.unwrap().into_inner();
        if stats.dispatching == 1 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "never dispatched: {stats:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cancel = tokio::spawn({
        let mut client = client.clone();
        async move { client.cancel(proto::CancelRequest { id: "in-doubt".into(), ..Default::default() }).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.stop().await;
    match cancel.await.unwrap() {
        Ok(answer) => {
            assert_ne!(
                answer.into_inner().outcome(),
                proto::CancelOutcome::Cancelled,
                "cancelled while in doubt"
            )
        }
        Err(status) => eprintln!("the cancel during shutdown: {status:?}"),
    }
    mock.slow_broker(1, 0);

    // After the restart the message is in doubt until it is produced again;
    // a cancel meanwhile is UNAVAILABLE, and afterwards ALREADY_DELIVERED.
    let server = Hourglass::start(config).await;
    let mut client = server.client().await;
    let got = records(&mock, &topic, 2, Duration::from_secs(30)).await;
    assert!(got.contains_key("in-doubt"), "the record reached the topic: {got:?}");
    let started = Instant::now();
    loop {
        match client.cancel(proto::CancelRequest { id: "in-doubt".into(), ..Default::default() }).await {
            Ok(answer) => {
                assert_eq!(answer.into_inner().outcome(), proto::CancelOutcome::AlreadyDelivered);
                break;
            }
            Err(status) => assert_eq!(status.code(), Code::Unavailable, "{status:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(30), "still in doubt");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let get = client
        .get(proto::GetRequest { id: "in-doubt".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(get.state(), State::Delivered, "{get:?}");
    server.stop().await;
}

/// Cancels of a message whose produce Kafka has not answered: each waits 5 s
/// at most and is told the outcome is not known yet (UNAVAILABLE); those
/// whose caller gave up are dropped at once. None piles up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancels_waiting_on_a_stuck_produce_are_answered_or_dropped() {
    let _serial = SERIAL.lock().await;
    let mock = Mock::start(1);
    let topic = random_name("stuck");
    mock.topic(&topic, 1);
    let dir = tempfile::tempdir().unwrap();
    let server = Hourglass::start(config_at(&mock.bootstrap(), dir.path())).await;
    let mut client = server.client().await;
    client.schedule(request(&topic, "warm", Duration::ZERO)).await.unwrap();
    records(&mock, &topic, 1, Duration::from_secs(30)).await;

    mock.slow_broker(1, 12_000);
    client.schedule(with_id(request(&topic, "stuck", Duration::ZERO), "stuck")).await.unwrap();
    let started = Instant::now();
    while client.stats(proto::StatsRequest {}).await.unwrap().into_inner().dispatching == 0 {
        assert!(started.elapsed() < Duration::from_secs(10), "never dispatched");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Thirty callers who give up after 300 ms, and one who waits.
    let mut impatient = Vec::new();
    for _ in 0..30 {
        let mut client = client.clone();
        impatient.push(tokio::spawn(async move {
            let mut request =
                tonic::Request::new(proto::CancelRequest { id: "stuck".into(), ..Default::default() });
            request.set_timeout(Duration::from_millis(300));
            client.cancel(request).await
        }));
    }
    let patient = tokio::spawn({
        let mut client = client.clone();
        async move {
            let asked = Instant::now();
            (
                client.cancel(proto::CancelRequest { id: "stuck".into(), ..Default::default() }).await,
                asked.elapsed(),
            )
        }
    });
    for call in impatient {
        assert!(call.await.unwrap().is_err(), "the caller gave up");
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let parked = metric(&server, "hourglass_store_parked_requests").await;
    assert!(parked <= 1.0, "{parked} requests still wait; only the patient one should");
    let (answer, waited) = patient.await.unwrap();
    let status = answer.expect_err("the outcome is not known yet");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(waited < Duration::from_secs(8), "waited {waited:?} for an answer");
    assert_eq!(metric(&server, "hourglass_store_parked_requests").await, 0.0);
    mock.slow_broker(1, 0);
    let got = records(&mock, &topic, 2, Duration::from_secs(30)).await;
    assert!(got.contains_key("stuck"));
    server.stop().await;
}
