//! Recurring schedules (series) against a real broker and a real store:
//! occurrences delivered once each with their headers, never early; the
//! calls (create again, get, list, update, pause, resume, delete) and what
//! they answer; the downtime policies after a stop, and across a Kafka
//! outage, of five occurrences; a kill -9 while occurrences fire every
//! second; what
//! another tenant can reach of a series (nothing); and cluster mode: calls
//! through any node, and a failover while occurrences fire.
//!
//! `cargo test --test it series:: -- --nocapture` shows the counts.

use crate::common;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    time::Duration,
};

use common::*;
use hourglass::{
    auth::Bearer,
    config::Config,
    proto::{self, CancelOutcome, SeriesState, series_client::SeriesClient},
};
use tonic::{Code, service::interceptor::InterceptedService, transport::Channel};

async fn series_client(server: &Hourglass) -> SeriesClient<Channel> {
    let url = format!("http://{}", server.addr);
    for _ in 0..100 {
        if let Ok(c) = SeriesClient::connect(url.clone()).await {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("cannot connect to hourglass at {url}");
}

/// A series producing `value` to `topic` every `every`.
fn every(topic: &str, value: &str, every: Duration) -> proto::SeriesSpec {
    proto::SeriesSpec {
        template: Some(proto::Message {
            topic: topic.into(),
            value: value.as_bytes().to_vec(),
            ..Default::default()
        }),
        every: Some(proto::series_spec::Every::Interval(wire(every))),
        ..Default::default()
    }
}

fn create(id: &str, spec: proto::SeriesSpec) -> proto::CreateSeriesRequest {
    proto::CreateSeriesRequest { id: id.into(), spec: Some(spec) }
}

/// Each record's occurrence time, from its header; checks the headers
/// agree with its id (`<series>@<ms>`, or `<series>@<ms>.<n>` where the
/// plain id would hash to another shard than the series').
fn occurrence(r: &Received, series: &str) -> u64 {
    assert_eq!(r.header("hourglass-series"), Some(series), "{r:?}");
    let at: u64 = r.header("hourglass-occurrence-ms").expect("the occurrence header").parse().unwrap();
    let id = r.id();
    let placed = id.strip_prefix(&format!("{series}@{at}")).is_some_and(|rest| {
        rest.is_empty() || rest.strip_prefix('.').is_some_and(|n| n.parse::<u32>().is_ok())
    });
    assert!(placed, "{id} is no id of {series}'s occurrence at {at}");
    at
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_level_cron_series_delivers_each_occurrence_once_and_never_early() {
    let bed = TestBed::start("series-cron", 2).await;
    let mut series = series_client(&bed.server).await;
    let spec = proto::SeriesSpec {
        every: Some(proto::series_spec::Every::Cron("*/2 * * * * *".into())),
        time_zone: "Europe/Berlin".into(),
        count: 4,
        labels: [("kind".to_owned(), "tick".to_owned())].into(),
        ..every(&bed.topic, "tick", Duration::ZERO)
    };
    let created = series.create_series(create("ticks", spec.clone())).await.unwrap().into_inner();
    assert!(created.created);
    let info = created.series.unwrap();
    assert_eq!(info.state(), SeriesState::Active);
    let first = millis(&info.next[0]) as u64;
    assert_eq!(first % 2000, 0, "every even second: {info:?}");

    let records =
        consume_async(&bed.broker, &bed.topic, 4, Duration::from_secs(30), Duration::from_secs(3)).await;
    assert_eq!(records.len(), 4, "{records:?}");
    let mut times = Vec::new();
    for r in &records {
        let at = occurrence(r, "ticks");
        assert!(r.timestamp_ms as u64 >= at, "produced before its time: {r:?}");
        assert_eq!(r.value, b"tick");
        times.push(at);
    }
    times.sort();
    let expected: Vec<u64> = (0..4).map(|k| first + 2000 * k).collect();
    assert_eq!(times, expected, "each occurrence once, two seconds apart");

    // The series is over; the same create again is a retry.
    let info = series
        .get_series(proto::GetSeriesRequest { id: "ticks".into(), next: 3, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((info.state(), info.fired, info.next.len()), (SeriesState::Finished, 4, 0), "{info:?}");
    let again = series.create_series(create("ticks", spec)).await.unwrap().into_inner();
    assert!(!again.created);
    // Each occurrence is a message: Get tells what became of it.
    let mut client = bed.server.client().await;
    let got = client
        .get(proto::GetRequest { id: format!("ticks@{first}"), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.state(), proto::State::Delivered);
    assert_eq!(got.labels.get("kind").map(String::as_str), Some("tick"));
    bed.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_answer_what_they_did_and_refuse_what_is_wrong() {
    let bed = TestBed::start("series-calls", 1).await;
    let mut series = series_client(&bed.server).await;
    let hourly = proto::SeriesSpec {
        every: Some(proto::series_spec::Every::Cron("0 * * * *".into())),
        labels: [("team".to_owned(), "a".to_owned())].into(),
        ..every(&bed.topic, "v1", Duration::ZERO)
    };
    series.create_series(create("hourly", hourly.clone())).await.unwrap();
    let other = proto::SeriesSpec { labels: [("team".to_owned(), "b".to_owned())].into(), ..hourly.clone() };
    series.create_series(create("hourly-b", other.clone())).await.unwrap();

    // A different definition under a taken id.
    let status = series.create_series(create("hourly", other)).await.unwrap_err();
    assert_eq!(status.code(), Code::AlreadyExists, "{status:?}");
    assert!(status.message().contains("UpdateSeries"), "{status:?}");

    // Get: the next occurrences, on the hour.
    let info = series
        .get_series(proto::GetSeriesRequest { id: "hourly".into(), next: 3, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    let next: Vec<u64> = info.next.iter().map(|t| millis(t) as u64).collect();
    assert_eq!(next.len(), 3);
    assert!(next.iter().all(|t| t % 3_600_000 == 0) && next.windows(2).all(|w| w[1] - w[0] == 3_600_000));

    // List, by label.
    let page = series
        .list_series(proto::ListSeriesRequest { selector: "team=a".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<_> = page.series.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["hourly"]);
    let all = series.list_series(proto::ListSeriesRequest::default()).await.unwrap().into_inner();
    assert_eq!(all.series.len(), 2);

    // Update: every two hours from now on.
    let update = proto::UpdateSeriesRequest {
        id: "hourly".into(),
        spec: Some(proto::SeriesSpec {
            every: Some(proto::series_spec::Every::Cron("0 */2 * * *".into())),
            ..hourly.clone()
        }),
    };
    let updated = series.update_series(update).await.unwrap().into_inner();
    let next = millis(&updated.series.unwrap().next[0]) as u64;
    assert_eq!(next % 7_200_000, 0);

    // Pause and resume.
    let paused = series
        .pause_series(proto::PauseSeriesRequest { id: "hourly".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(paused.series.unwrap().state(), SeriesState::Paused);
    let resumed = series
        .resume_series(proto::ResumeSeriesRequest { id: "hourly".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resumed.state(), SeriesState::Active);

    // Delete; then it is gone.
    series
        .delete_series(proto::DeleteSeriesRequest { id: "hourly".into(), ..Default::default() })
        .await
        .unwrap();
    let status = series
        .get_series(proto::GetSeriesRequest { id: "hourly".into(), next: 0, ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    let status = series
        .delete_series(proto::DeleteSeriesRequest { id: "hourly".into(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");

    // What is wrong is named.
    let bad = |f: fn(&mut proto::SeriesSpec)| {
        let mut spec = hourly.clone();
        f(&mut spec);
        spec
    };
    let cases: Vec<(&str, proto::SeriesSpec, &str)> = vec![
        ("x", bad(|s| s.every = Some(proto::series_spec::Every::Cron("61 * * * *".into()))), "spec.cron"),
        ("x", bad(|s| s.time_zone = "Mars/Olympus".into()), "spec.time_zone"),
        ("x", bad(|s| s.every = None), "spec.every"),
        (
            "x",
            bad(|s| s.every = Some(proto::series_spec::Every::Interval(wire(Duration::from_millis(10))))),
            "spec.interval",
        ),
        ("x", bad(|s| s.template = None), "spec.template"),
        ("x", bad(|s| s.template.as_mut().unwrap().topic = "no-such-topic-here".into()), ""),
        ("a@b", hourly.clone(), "id"),
    ];
    for (id, spec, field) in cases {
        let status = series.create_series(create(id, spec)).await.unwrap_err();
        if field.is_empty() {
            assert_eq!(status.code(), Code::NotFound, "{status:?}");
            continue;
        }
        assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
        let details = tonic_types::StatusExt::get_error_details(&status);
        let violation = &details.bad_request().expect("a bad request").field_violations[0];
        assert_eq!(violation.field, field, "{status:?}");
    }
    bed.server.stop().await;
}

/// A series every second, deleted (or paused) while its occurrences fire:
/// after the answer, nothing more is delivered but the occurrence the
/// answer says was already delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_and_pause_racing_an_occurrence_leave_nothing_after_their_answer() {
    let bed = TestBed::start("series-race", 1).await;
    let mut series = series_client(&bed.server).await;
    for (round, id) in ["deleted", "paused"].iter().enumerate() {
        series.create_series(create(id, every(&bed.topic, id, Duration::from_secs(1)))).await.unwrap();
        // Let a few fire, then stop it close to an occurrence's time.
        tokio::time::sleep(Duration::from_millis(3_000 + 700 * round as u64)).await;
        let (answered_at, outcomes) = if *id == "deleted" {
            let done = series
                .delete_series(proto::DeleteSeriesRequest { id: id.to_string(), ..Default::default() })
                .await
                .unwrap();
            (now_ms(), done.into_inner().occurrences)
        } else {
            let done = series
                .pause_series(proto::PauseSeriesRequest { id: id.to_string(), ..Default::default() })
                .await
                .unwrap();
            (now_ms(), done.into_inner().occurrences)
        };
        tokio::time::sleep(Duration::from_secs(3)).await;
        let records =
            consume_async(&bed.broker, &bed.topic, 1000, Duration::from_secs(3), Duration::ZERO).await;
        let mine: Vec<&Received> = records.iter().filter(|r| r.value == id.as_bytes()).collect();
        let delivered: BTreeSet<String> = mine.iter().map(|r| r.id().to_owned()).collect();
        assert_eq!(delivered.len(), mine.len(), "each occurrence once: {mine:?}");
        for o in &outcomes {
            match o.outcome() {
                CancelOutcome::Cancelled => {
                    assert!(!delivered.contains(&o.id), "cancelled yet delivered: {o:?}")
                }
                CancelOutcome::AlreadyDelivered => assert!(delivered.contains(&o.id), "{o:?}"),
                other => panic!("{other:?}"),
            }
        }
        // Nothing produced after the answer but what it said was delivered.
        let reported: BTreeSet<&str> = outcomes.iter().map(|o| o.id.as_str()).collect();
        for r in &mine {
            if r.timestamp_ms as u64 > answered_at {
                assert!(reported.contains(r.id()), "{} produced after the answer: {outcomes:?}", r.id());
            }
        }
        eprintln!("{id}: {} delivered, answer {outcomes:?}", mine.len());
        assert!(mine.len() >= 2, "some fired before: {mine:?}");
    }
    bed.server.stop().await;
}

/// A pause, then a resume, while an occurrence is parked (inside the lead
/// before its time): the pause cancels it, and the series goes on with the
/// occurrence after it, under an id of its own, rather than parking the
/// cancelled one's id again (which would deliver nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_and_resume_inside_the_lead_go_on_with_the_next_occurrence() {
    let bed = TestBed::start("series-resume", 1).await;
    let mut series = series_client(&bed.server).await;
    let created =
        series.create_series(create("r", every(&bed.topic, "r", Duration::from_secs(4)))).await.unwrap();
    let anchor = millis(&created.into_inner().series.unwrap().next[0]) as u64;
    // 1.5 s before the second occurrence: it is parked.
    let second = anchor + 4_000;
    tokio::time::sleep(Duration::from_millis((second - 1_500).saturating_sub(now_ms()))).await;
    let paused = series
        .pause_series(proto::PauseSeriesRequest { id: "r".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    let cancelled: Vec<_> = paused
        .occurrences
        .iter()
        .filter(|o| o.outcome() == CancelOutcome::Cancelled)
        .map(|o| o.id.clone())
        .collect();
    assert_eq!(cancelled, [format!("r@{second}")], "{paused:?}");
    let resumed = series
        .resume_series(proto::ResumeSeriesRequest { id: "r".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    let next = millis(&resumed.next[0]) as u64;
    assert_eq!(next, second + 4_000, "the occurrence after the cancelled one: {resumed:?}");
    let records =
        consume_async(&bed.broker, &bed.topic, 2, Duration::from_secs(15), Duration::from_secs(1)).await;
    let times: Vec<u64> = records.iter().map(|r| occurrence(r, "r")).collect();
    assert_eq!(times, [anchor, next], "the first, then the one after the cancelled one");
    bed.server.stop().await;
}

/// Five occurrences fall while hourglass is stopped; each policy decides
/// what fires of them when it starts again.
async fn downtime(policy: proto::MissedPolicy, expected: usize) {
    let broker = Broker::start();
    let topic = random_name("series-downtime");
    broker.create_topic(&topic, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let server = Hourglass::start(config(&broker, dir.path())).await;
    let mut series = series_client(&server).await;
    let period = Duration::from_secs(4);
    let spec = proto::SeriesSpec {
        missed: Some(proto::Missed {
            policy: policy.into(),
            at_most: 10,
            after: Some(wire(Duration::from_secs(1))),
        }),
        ..every(&topic, "d", period)
    };
    let info = series.create_series(create("d", spec)).await.unwrap().into_inner().series.unwrap();
    let anchor = millis(&info.next[0]) as u64;
    // The first occurrence, then a stop at once: the next is parked two
    // seconds before its time, after the stop.
    let first = consume_async(&broker, &topic, 1, Duration::from_secs(20), Duration::ZERO).await;
    assert_eq!(first.len(), 1);
    let stopped_at = now_ms();
    server.stop().await;
    tokio::time::sleep(period * 5 + Duration::from_millis(500)).await;
    let restarted_at = now_ms();
    let server = Hourglass::start(config(&broker, dir.path())).await;
    // The occurrences that fell while it was stopped (those that could
    // not have been parked before the stop).
    let missed: Vec<u64> = (1..100)
        .map(|k| anchor + k * period.as_millis() as u64)
        .filter(|t| *t > stopped_at + 2_500 && *t <= restarted_at)
        .collect();
    assert!(missed.len() >= 4, "{missed:?}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let records = consume_async(&broker, &topic, 1000, Duration::from_secs(3), Duration::ZERO).await;
    let times: Vec<u64> = records.iter().map(|r| occurrence(r, "d")).collect();
    let ids: BTreeSet<u64> = times.iter().copied().collect();
    assert_eq!(ids.len(), times.len(), "each once: {times:?}");
    let fired: Vec<u64> = missed.iter().copied().filter(|t| ids.contains(t)).collect();
    let want = expected.min(missed.len());
    assert_eq!(fired.len(), want, "{policy:?}: of {missed:?} fired {fired:?}");
    if want > 0 {
        assert_eq!(fired.last(), missed.last(), "the latest fires");
    }
    let mut series = series_client(&server).await;
    let info = series
        .get_series(proto::GetSeriesRequest { id: "d".into(), next: 1, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert!(info.skipped as usize >= missed.len() - want, "{info:?}");
    // And it goes on.
    assert!(millis(&info.next[0]) as u64 > restarted_at);
    eprintln!("{policy:?}: {} missed, {} fired, {} skipped", missed.len(), fired.len(), info.skipped);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_downtime_skip_fires_none_of_the_missed() {
    downtime(proto::MissedPolicy::Skip, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_downtime_fire_one_fires_the_latest_missed_once() {
    downtime(proto::MissedPolicy::FireOne, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_downtime_fire_each_fires_every_missed_one() {
    downtime(proto::MissedPolicy::FireEach, 100).await;
}

/// Kafka goes away across five occurrences while hourglass runs, with a
/// series of each policy: each occurrence is parked on time and cannot go
/// out. Once one is `missed.after` past its time, the policy decides
/// whether it waits for Kafka or is cancelled (counted as skipped). In the
/// end each occurrence is delivered once or cancelled, never both, none
/// left pending; of those that fell well inside the outage, none goes out
/// (skip), at most one (fire one), or each (fire each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_outage_across_five_occurrences_sends_what_each_policy_says() {
    use proto::MissedPolicy::{FireEach, FireOne, Skip};
    let mut broker = Broker::start_persistent();
    let topic = random_name("series-kafka-down");
    broker.create_topic(&topic, 1).await;
    let dir = tempfile::tempdir().unwrap();
    // What the dispatcher handed to Kafka's client before the topic
    // stalled goes out when Kafka is back, whatever the policy: a short
    // stall leaves that to the first occurrence of each series.
    let stall_after = Duration::from_secs(1);
    let server =
        Hourglass::start(Config { stall_after: stall_after.into(), ..config(&broker, dir.path()) }).await;
    let mut series = series_client(&server).await;
    let period = Duration::from_secs(3);
    let missed_after = Duration::from_secs(1);
    let mut anchors = BTreeMap::new();
    for (id, policy) in [("skip", Skip), ("one", FireOne), ("each", FireEach)] {
        let spec = proto::SeriesSpec {
            missed: Some(proto::Missed {
                policy: policy.into(),
                at_most: 10,
                after: Some(wire(missed_after)),
            }),
            ..every(&topic, id, period)
        };
        let info = series.create_series(create(id, spec)).await.unwrap().into_inner().series.unwrap();
        anchors.insert(id, (policy, millis(&info.next[0]) as u64));
    }
    let first = consume_async(&broker, &topic, 3, Duration::from_secs(20), Duration::ZERO).await;
    assert_eq!(first.len(), 3);
    let stopped_at = now_ms();
    broker.stop();
    tokio::time::sleep(period * 5).await;
    let resumed_at = now_ms();
    broker.resume();
    // Delivery resumes, and a few occurrences go out after it.
    let records = consume_async(&broker, &topic, usize::MAX, Duration::from_secs(25), Duration::ZERO).await;
    let checked_until = now_ms() - 2 * period.as_millis() as u64;
    let mut client = server.client().await;
    for (id, (policy, anchor)) in anchors {
        let info = series
            .get_series(proto::GetSeriesRequest { id: id.into(), next: 1, ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        let times: Vec<u64> = records
            .iter()
            .filter(|r| r.header("hourglass-series") == Some(id))
            .map(|r| occurrence(r, id))
            .collect();
        let delivered: BTreeSet<u64> = times.iter().copied().collect();
        assert_eq!(delivered.len(), times.len(), "{id}: each once: {times:?}");
        // Every occurrence up to a while ago: delivered, or cancelled.
        let all: Vec<u64> = (0..)
            .map(|k| anchor + k * period.as_millis() as u64)
            .take_while(|t| *t < checked_until)
            .collect();
        let mut cancelled = BTreeSet::new();
        for t in &all {
            let got = client
                .get(proto::GetRequest { id: format!("{id}@{t}"), ..Default::default() })
                .await
                .unwrap()
                .into_inner();
            match got.state() {
                proto::State::Delivered => {
                    assert!(delivered.contains(t), "{id}@{t} delivered, not in the topic")
                }
                proto::State::Cancelled => {
                    assert!(!delivered.contains(t), "{id}@{t} cancelled and delivered");
                    cancelled.insert(*t);
                }
                other => panic!("{id}@{t} is {other:?}; of {all:?}, delivered {delivered:?}"),
            }
        }
        assert_eq!(info.skipped as usize, cancelled.len(), "{id}: skipped is what was cancelled: {info:?}");
        // Those that fell well inside the outage: after the topic stalled
        // (the first occurrence after the stop, handed to Kafka's client,
        // stalls it `stall_after` later), and still before Kafka was back
        // when each was missed.
        let first_after_stop = all.iter().copied().find(|t| *t > stopped_at).expect("one fell in the outage");
        let stalled_by = first_after_stop + stall_after.as_millis() as u64 + 500;
        let inside: Vec<u64> = all
            .iter()
            .copied()
            .filter(|t| *t > stalled_by && *t + (missed_after.as_millis() as u64) + 500 < resumed_at)
            .collect();
        assert!(inside.len() >= 3, "{id}: {inside:?}");
        let out: Vec<u64> = inside.iter().copied().filter(|t| delivered.contains(t)).collect();
        match policy {
            Skip => assert!(out.is_empty(), "skip: of {inside:?} went out {out:?}"),
            FireOne => assert!(out.len() <= 1, "fire one: of {inside:?} went out {out:?}"),
            _ => assert_eq!(out, inside, "fire each (at most 10)"),
        }
        eprintln!(
            "{policy:?}: {} occurrences, {} inside the outage, {} of those out; {} cancelled in all",
            all.len(),
            inside.len(),
            out.len(),
            cancelled.len()
        );
    }
    server.stop().await;
}

/// A series every second; the server is killed (SIGKILL) twice while its
/// occurrences fire, and started again over the same store. Every
/// occurrence from the first to the last is delivered exactly once: the
/// ones that fell while it was down fire late (within `missed.after`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_while_occurrences_fire_loses_and_repeats_none() {
    use hourglass::store::Durability;
    use hourglass_testkit::{ServerProcess, hourglass_binary};
    let broker = Broker::start();
    let topic = random_name("series-kill");
    broker.create_topic(&topic, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let mut server =
        ServerProcess::new(&hourglass_binary().unwrap(), dir.path(), broker.addr(), Durability::Sync)
            .unwrap();
    server.spawn().unwrap();
    server.wait_serving(Duration::from_secs(60)).await.unwrap();
    let url = format!("http://{}", server.grpc);
    let mut series = SeriesClient::connect(url).await.unwrap();
    series.create_series(create("k", every(&topic, "k", Duration::from_secs(1)))).await.unwrap();
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(3_500)).await;
        server.kill();
        server.spawn().unwrap();
        server.wait_serving(Duration::from_secs(60)).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let url = format!("http://{}", server.grpc);
    let mut series = SeriesClient::connect(url).await.unwrap();
    series.delete_series(proto::DeleteSeriesRequest { id: "k".into(), ..Default::default() }).await.unwrap();
    let records = consume_async(&broker, &topic, 10_000, Duration::from_secs(5), Duration::ZERO).await;
    let mut counts: BTreeMap<u64, usize> = BTreeMap::new();
    for r in &records {
        *counts.entry(occurrence(r, "k")).or_default() += 1;
    }
    let repeated: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(repeated.is_empty(), "delivered twice: {repeated:?}");
    let times: Vec<u64> = counts.keys().copied().collect();
    let gaps: Vec<_> = times.windows(2).filter(|w| w[1] - w[0] != 1000).collect();
    assert!(gaps.is_empty(), "occurrences lost: {gaps:?} in {times:?}");
    assert!(times.len() >= 8, "{times:?}");
    eprintln!("kill -9: {} occurrences, each once", times.len());
    server.stop().unwrap();
}

/// Series under tokens: another tenant reaches none of a tenant's series
/// by any call, and a token may not make a series for a topic outside its
/// grant; standalone, and in cluster mode (where the calls go through the
/// router and the series' changes through the schedule log).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenant_reaches_none_of_a_tenants_series() {
    other_tenant(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenant_reaches_none_of_a_tenants_series_in_cluster_mode() {
    other_tenant(true).await;
}

async fn other_tenant(cluster: bool) {
    use prost::Message as _;
    type Client = SeriesClient<InterceptedService<Channel, Bearer>>;
    let broker = Broker::start();
    let (orders_prefix, billing_prefix) = (random_name("orders"), random_name("billing"));
    let (orders, billing) = (format!("{orders_prefix}.events"), format!("{billing_prefix}.events"));
    broker.create_topic(&orders, 1).await;
    broker.create_topic(&billing, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let tokens: PathBuf = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[[token]]\nname = \"orders\"\ntoken = \"orders-token\"\ntopics = [\"{orders_prefix}.*\"]\n\n\
             [[token]]\nname = \"billing\"\ntoken = \"billing-token\"\ntopics = [\"{billing_prefix}.*\"]\n"
        ),
    )
    .unwrap();
    let mut config = config(&broker, &dir.path().join("data"));
    config.auth_tokens = Some(tokens);
    let log_topic = random_name("hourglass-log");
    if cluster {
        one_node_cluster(&log_topic)(&mut config);
    }
    let server = Hourglass::start(config).await;
    let channel = Channel::from_shared(format!("http://{}", server.addr)).unwrap().connect().await.unwrap();
    let client = |token: &str| -> Client {
        SeriesClient::with_interceptor(channel.clone(), Bearer::new(Some(token)).unwrap())
    };
    let (mut mine, mut theirs) = (client("orders-token"), client("billing-token"));
    let spec = proto::SeriesSpec {
        every: Some(proto::series_spec::Every::Cron("0 9 * * MON-FRI".into())),
        time_zone: "America/New_York".into(),
        ..every(&orders, "digest", Duration::ZERO)
    };
    mine.create_series(create("digest", spec.clone())).await.unwrap();
    // Outside its grant.
    let status = theirs.create_series(create("digest", spec.clone())).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    // The same id in its own space is its own series.
    let own = proto::SeriesSpec {
        template: Some(proto::Message { topic: billing.clone(), value: b"b".to_vec(), ..Default::default() }),
        ..spec.clone()
    };
    theirs.create_series(create("mine-too", own)).await.unwrap();

    let set = prost_types::FileDescriptorSet::decode(hourglass::proto::FILE_DESCRIPTOR_SET).unwrap();
    let service = set.file.iter().flat_map(|f| &f.service).find(|s| s.name() == "Series").unwrap();
    let id = || "digest".to_owned();
    for method in &service.method {
        let status = match method.name() {
            "CreateSeries" => continue,
            "GetSeries" => theirs
                .get_series(proto::GetSeriesRequest { id: id(), next: 0, ..Default::default() })
                .await
                .map(|_| ()),
            "ListSeries" => {
                let page =
                    theirs.list_series(proto::ListSeriesRequest::default()).await.unwrap().into_inner();
                let ids: Vec<_> = page.series.iter().map(|s| s.id.as_str()).collect();
                assert_eq!(ids, ["mine-too"], "only its own");
                continue;
            }
            "UpdateSeries" => theirs
                .update_series(proto::UpdateSeriesRequest { id: id(), spec: Some(spec.clone()) })
                .await
                .map(|_| ()),
            "PauseSeries" => theirs
                .pause_series(proto::PauseSeriesRequest { id: id(), ..Default::default() })
                .await
                .map(|_| ()),
            "ResumeSeries" => theirs
                .resume_series(proto::ResumeSeriesRequest { id: id(), ..Default::default() })
                .await
                .map(|_| ()),
            "DeleteSeries" => theirs
                .delete_series(proto::DeleteSeriesRequest { id: id(), ..Default::default() })
                .await
                .map(|_| ()),
            other => panic!("RPC {other} has no case in this test: give it one"),
        };
        let code = status.unwrap_err().code();
        assert!(matches!(code, Code::NotFound | Code::PermissionDenied), "{}: {code:?}", method.name());
    }
    let info = mine
        .get_series(proto::GetSeriesRequest { id: id(), next: 0, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.state(), SeriesState::Active, "untouched");
    server.stop().await;
}

/// Retries `call` while the node answers UNAVAILABLE (a shard moving
/// between nodes, or the node that owns it gone), for up to 90 s.
pub(crate) async fn anywhere<
    T,
    F: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
>(
    what: &str,
    mut call: impl FnMut() -> F,
) -> T {
    let give_up = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        match call().await {
            Ok(answer) => return answer.into_inner(),
            Err(s) if s.code() == Code::Unavailable && std::time::Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(s) => panic!("{what}: {s:?}"),
        }
    }
}

/// Cluster mode, three node processes and twelve shards: a series in each
/// shard, every second, created through one node (the calls about the
/// others' series go to them), listed page by page through another; then
/// the third is killed with SIGKILL while they fire, and the other two
/// take its shards over. Every occurrence from each series' first to its last
/// is delivered once, none early, each under an id of its series' shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_series_fire_on_their_shards_owner_and_across_a_failover() {
    use crate::cluster_nodes::{Bed, LOG_PARTITIONS, THREE_NODES, id_in_shard, wait_spread};
    let _turn = THREE_NODES.lock().await;
    let Bed { broker, topic, dirs: _dirs, mut nodes, .. } = Bed::start(1, 3).await;
    wait_spread(&nodes, &[0, 1, 2], Duration::from_secs(60)).await;
    let client = |grpc: &str| {
        let channel = Channel::from_shared(format!("http://{grpc}"))
            .unwrap()
            .connect_timeout(Duration::from_secs(1))
            .timeout(Duration::from_secs(20))
            .connect_lazy();
        SeriesClient::new(channel)
    };
    let (first, second) = (client(&nodes[0].grpc), client(&nodes[1].grpc));
    let run = random_name("s");
    let ids: Vec<String> = (0..LOG_PARTITIONS).map(|shard| id_in_shard(&run, shard)).collect();
    let mut spec = every(&topic, "c", Duration::from_secs(1));
    // The failover is shorter: every occurrence it holds back fires late.
    spec.missed = Some(proto::Missed {
        policy: proto::MissedPolicy::FireEach.into(),
        at_most: 1000,
        after: Some(wire(Duration::from_secs(300))),
    });
    for id in &ids {
        let request = create(id, spec.clone());
        let answer = anywhere("CreateSeries", || {
            let (mut c, r) = (first.clone(), request.clone());
            async move { c.create_series(r).await }
        })
        .await;
        assert!(answer.created, "{id}");
    }
    // Through the other node, a page at a time: every series, once.
    let (mut listed, mut token) = (Vec::new(), String::new());
    loop {
        let request =
            proto::ListSeriesRequest { page_size: 5, page_token: token.clone(), ..Default::default() };
        let page = anywhere("ListSeries", || {
            let (mut c, r) = (second.clone(), request.clone());
            async move { c.list_series(r).await }
        })
        .await;
        assert!(page.series.len() <= 5);
        listed.extend(page.series.into_iter().map(|s| s.id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(listed, sorted, "listed in id order across both nodes");
    let request = proto::GetSeriesRequest { id: ids[0].clone(), next: 3, ..Default::default() };
    let info = anywhere("GetSeries", || {
        let (mut c, r) = (second.clone(), request.clone());
        async move { c.get_series(r).await }
    })
    .await;
    assert_eq!(info.next.len(), 3);

    tokio::time::sleep(Duration::from_secs(4)).await;
    let killed = std::time::Instant::now();
    nodes[2].kill();
    let spread = wait_spread(&nodes, &[0, 1], Duration::from_secs(60)).await;
    eprintln!("cluster series: the others own every shard {:?} after the kill: {spread:?}", killed.elapsed());
    tokio::time::sleep(Duration::from_secs(4)).await;
    for id in &ids {
        let request = proto::DeleteSeriesRequest { id: id.clone(), ..Default::default() };
        anywhere("DeleteSeries", || {
            let (mut c, r) = (first.clone(), request.clone());
            async move { c.delete_series(r).await }
        })
        .await;
    }
    let records = consume_async(&broker, &topic, 100_000, Duration::from_secs(10), Duration::ZERO).await;
    let mut counts: BTreeMap<(String, u64), usize> = BTreeMap::new();
    for r in &records {
        let series = r.header("hourglass-series").expect("the series header").to_owned();
        let at = occurrence(r, &series);
        assert!(r.timestamp_ms as u64 >= at, "early: {r:?}");
        let shard = |id: &str| java_partition(id.as_bytes(), LOG_PARTITIONS as i32);
        assert_eq!(shard(r.id()), shard(&series), "{} is not in its series' shard", r.id());
        *counts.entry((series, at)).or_default() += 1;
    }
    let duplicates: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(duplicates.is_empty(), "delivered twice: {duplicates:?}");
    for id in &ids {
        let times: Vec<u64> = counts.keys().filter(|(s, _)| s == id).map(|(_, at)| *at).collect();
        assert!(times.len() >= 8, "{id}: {times:?}");
        let gaps: Vec<_> = times.windows(2).filter(|w| w[1] - w[0] != 1000).collect();
        assert!(gaps.is_empty(), "{id}: occurrences lost: {gaps:?} in {times:?}");
    }
    eprintln!("cluster series: {} occurrences of {} series, each once, none early", counts.len(), ids.len());
    for node in &mut nodes[..2] {
        node.stop().unwrap();
    }
}

/// The field an INVALID_ARGUMENT names.
fn field_of(status: &tonic::Status) -> String {
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let details = tonic_types::StatusExt::get_error_details(status);
    details.bad_request().expect("a bad request").field_violations[0].field.clone()
}

/// The last second a protobuf Timestamp holds: 9999-12-31T23:59:59Z.
const LAST_SECOND: i64 = 253_402_300_799;

/// Times past 9999 (a protobuf Timestamp's last year) are refused, for a
/// series' start and end and for a message's due time, even where
/// --max-delay reaches further: taken in, they saturated (a start at
/// `i64::MAX` seconds made a series whose rule fired in 1970, over and
/// over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn times_past_9999_are_refused_however_far_max_delay_reaches() {
    let bed = TestBed::start_with("series-calendar", 1, |c| {
        c.max_delay = Duration::from_secs(3_000_000 * 86_400).into();
    })
    .await;
    let mut series = series_client(&bed.server).await;
    let at = |seconds| Some(prost_types::Timestamp { seconds, nanos: 0 });
    let hourly = proto::SeriesSpec {
        every: Some(proto::series_spec::Every::Cron("0 * * * *".into())),
        ..every(&bed.topic, "v", Duration::ZERO)
    };
    for t in [LAST_SECOND + 1, i64::MAX] {
        for (spec, field) in [
            (proto::SeriesSpec { start: at(t), ..hourly.clone() }, "spec.start"),
            (
                proto::SeriesSpec { start: at(t), ..every(&bed.topic, "v", Duration::from_secs(60)) },
                "spec.start",
            ),
            (proto::SeriesSpec { end: at(t), ..hourly.clone() }, "spec.end"),
        ] {
            let status = series.create_series(create("far", spec)).await.unwrap_err();
            assert_eq!(field_of(&status), field, "{t}: {status:?}");
        }
    }
    let listed = series.list_series(proto::ListSeriesRequest::default()).await.unwrap().into_inner();
    assert!(listed.series.is_empty(), "{listed:?}");

    let mut client = bed.server.client().await;
    let far_at =
        |seconds| proto::schedule_request::Due::DeliverAt(prost_types::Timestamp { seconds, nanos: 0 });
    let far_delay =
        |seconds| proto::schedule_request::Due::Delay(prost_types::Duration { seconds, nanos: 0 });
    for due in [far_at(LAST_SECOND + 1), far_at(i64::MAX), far_delay(LAST_SECOND + 1), far_delay(i64::MAX)] {
        let r = proto::ScheduleRequest { due: Some(due), ..request(&bed.topic, "v", Duration::ZERO) };
        let status = client.schedule(r).await.unwrap_err();
        assert_eq!(field_of(&status), "due", "{due:?}: {status:?}");
        assert!(status.message().contains("9999-12-31"), "{status:?}");
    }
    // The last second itself is a time.
    let r =
        proto::ScheduleRequest { due: Some(far_at(LAST_SECOND)), ..request(&bed.topic, "v", Duration::ZERO) };
    client.schedule(r).await.unwrap();
    bed.server.stop().await;
}

/// A new series is held to the server's bounds, each refusal naming its
/// field: a start or end beyond --max-delay; a jitter longer than the time
/// between two occurrences (the next would be parked late, and judged
/// missed); a `missed.after` over a week, or over 1,000 times that time
/// (more occurrences would wait to be judged than the series keeps in
/// view); occurrences closer than --series-min-interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_series_is_held_to_the_servers_bounds() {
    let bed = TestBed::start_with("series-bounds", 1, |c| {
        c.series_min_interval = Duration::from_secs(5).into();
    })
    .await;
    let mut series = series_client(&bed.server).await;
    let now = (now_ms() / 1000) as i64;
    let at = |seconds| Some(prost_types::Timestamp { seconds, nanos: 0 });
    let four_years = 4 * 366 * 86_400;
    let ten_s = every(&bed.topic, "v", Duration::from_secs(10));
    let cron = |expr: &str| proto::SeriesSpec {
        every: Some(proto::series_spec::Every::Cron(expr.into())),
        ..ten_s.clone()
    };
    let jitter = |seconds, spec: proto::SeriesSpec| proto::SeriesSpec {
        jitter: Some(wire(Duration::from_secs(seconds))),
        ..spec
    };
    let after = |seconds, spec: proto::SeriesSpec| proto::SeriesSpec {
        missed: Some(proto::Missed { after: Some(wire(Duration::from_secs(seconds))), ..Default::default() }),
        ..spec
    };
    let refused = [
        (proto::SeriesSpec { start: at(now + four_years), ..ten_s.clone() }, "spec.start", "--max-delay"),
        (proto::SeriesSpec { end: at(now + four_years), ..ten_s.clone() }, "spec.end", "--max-delay"),
        (jitter(11, ten_s.clone()), "spec.jitter", "10s"),
        (jitter(40, cron("*/30 * * * * *")), "spec.jitter", "30s"),
        (after(7 * 86_400 + 1, cron("0 9 * * *")), "spec.missed.after", "7days"),
        (after(10_001, ten_s.clone()), "spec.missed.after", "10000s"),
        (every(&bed.topic, "v", Duration::from_secs(4)), "spec.interval", "--series-min-interval"),
        (cron("*/2 * * * * *"), "spec.cron", "--series-min-interval"),
    ];
    for (i, (spec, field, says)) in refused.into_iter().enumerate() {
        let status = series.create_series(create(&format!("r{i}"), spec)).await.unwrap_err();
        assert_eq!(field_of(&status), field, "{status:?}");
        assert!(status.message().contains(says), "{status:?}");
    }
    let taken = [
        proto::SeriesSpec { start: at(now + 3600), end: at(now + 7200), ..ten_s.clone() },
        jitter(10, ten_s.clone()),
        after(7 * 86_400, cron("0 9 * * *")),
        after(10_000, ten_s.clone()),
        cron("*/5 * * * * *"),
    ];
    for (i, spec) in taken.into_iter().enumerate() {
        series.create_series(create(&format!("t{i}"), spec)).await.unwrap();
    }
    // UpdateSeries is held to the same.
    let update = proto::UpdateSeriesRequest { id: "t0".into(), spec: Some(jitter(11, ten_s.clone())) };
    assert_eq!(field_of(&series.update_series(update).await.unwrap_err()), "spec.jitter");
    bed.server.stop().await;
}

/// A tenant may have --series-max-per-tenant series, no more (without
/// tokens the whole server is one tenant): the next is RESOURCE_EXHAUSTED,
/// saying what to do; one deleted makes room; a retry of one it has is
/// answered still. Another tenant's series do not count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_has_at_most_its_bound_of_series() {
    type Client = SeriesClient<InterceptedService<Channel, Bearer>>;
    let bed = TestBed::start_with("series-per-tenant", 1, |c| c.series_max_per_tenant = 2).await;
    let mut series = series_client(&bed.server).await;
    let spec = |value: &str| every(&bed.topic, value, Duration::from_secs(3600));
    series.create_series(create("a", spec("a"))).await.unwrap();
    series.create_series(create("b", spec("b"))).await.unwrap();
    let status = series.create_series(create("c", spec("c"))).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("--series-max-per-tenant"), "{status:?}");
    let again = series.create_series(create("b", spec("b"))).await.unwrap().into_inner();
    assert!(!again.created, "a retry is answered: {again:?}");
    series.delete_series(proto::DeleteSeriesRequest { id: "a".into(), ..Default::default() }).await.unwrap();
    series.create_series(create("c", spec("c"))).await.unwrap();
    bed.server.stop().await;

    // Under tokens, each tenant has its bound.
    let dir = tempfile::tempdir().unwrap();
    let tokens: PathBuf = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        "[[token]]\nname = \"one\"\ntoken = \"one-token\"\ntopics = [\"*\"]\n\n\
         [[token]]\nname = \"two\"\ntoken = \"two-token\"\ntopics = [\"*\"]\n",
    )
    .unwrap();
    let mut config = config(&bed.broker, &dir.path().join("data"));
    config.auth_tokens = Some(tokens);
    config.series_max_per_tenant = 2;
    let server = Hourglass::start(config).await;
    let channel = Channel::from_shared(format!("http://{}", server.addr)).unwrap().connect().await.unwrap();
    let client = |token: &str| -> Client {
        SeriesClient::with_interceptor(channel.clone(), Bearer::new(Some(token)).unwrap())
    };
    let (mut one, mut two) = (client("one-token"), client("two-token"));
    for id in ["a", "b"] {
        one.create_series(create(id, spec(id))).await.unwrap();
    }
    let status = one.create_series(create("c", spec("c"))).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("\"one\""), "names the tenant: {status:?}");
    for id in ["a", "b"] {
        two.create_series(create(id, spec(id))).await.unwrap();
    }
    server.stop().await;
}

/// A client may not take the id an occurrence of a series will have
/// (`<series>@<ms>`, or `<series>@<ms>.<n>`) by any call that schedules:
/// it would be parked first, the occurrence counted as fired and the
/// squatter's record delivered in its place. The occurrence goes out as
/// the series'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_may_not_take_the_id_of_a_series_occurrence() {
    let bed = TestBed::start("series-squat", 1).await;
    let mut series = series_client(&bed.server).await;
    let info = series
        .create_series(create("tick", every(&bed.topic, "tick", Duration::from_secs(5))))
        .await
        .unwrap()
        .into_inner()
        .series
        .unwrap();
    let first = millis(&info.next[0]) as u64;
    let mut client = bed.server.client().await;
    let squat = |id: String| proto::ScheduleRequest {
        id: Some(id),
        ..request(&bed.topic, "squatter", Duration::from_secs(30))
    };
    for id in [format!("tick@{first}"), format!("tick@{}", first + 5_000), format!("tick@{first}.3")] {
        let status = client.schedule(squat(id.clone())).await.unwrap_err();
        assert_eq!(field_of(&status), "id", "{id}: {status:?}");
    }
    let batch = proto::ScheduleBatchRequest {
        requests: vec![squat(format!("tick@{}", first + 10_000)), squat("tick-at-noon".into())],
    };
    let results = client.schedule_batch(batch).await.unwrap().into_inner().results;
    let Some(proto::schedule_result::Result::Error(e)) = &results[0].result else { panic!("{results:?}") };
    assert_eq!((e.code, e.field.as_str()), (Code::InvalidArgument as i32, "id"), "{e:?}");
    assert!(matches!(results[1].result, Some(proto::schedule_result::Result::Scheduled(_))), "{results:?}");
    let stream = tokio_stream::iter(vec![squat(format!("tick@{}", first + 15_000))]);
    let mut answers = client.schedule_stream(stream).await.unwrap().into_inner();
    let answer = answers.message().await.unwrap().expect("an answer");
    let Some(proto::schedule_result::Result::Error(e)) = &answer.result else { panic!("{answer:?}") };
    assert_eq!((e.code, e.field.as_str()), (Code::InvalidArgument as i32, "id"), "{e:?}");
    // Ids that merely hold an '@' are a client's to take.
    for id in ["bob@example.com", "tick@noon", "a@1x"] {
        client.schedule(squat(id.into())).await.unwrap();
    }
    let records = consume_async(&bed.broker, &bed.topic, 1, Duration::from_secs(20), Duration::ZERO).await;
    assert_eq!(records.len(), 1);
    assert_eq!((occurrence(&records[0], "tick"), records[0].value.as_slice()), (first, &b"tick"[..]));
    bed.server.stop().await;
}

/// A series whose tenant loses its topic (the tokens file is narrowed and
/// reloaded) is paused by hourglass, saying why, and parks nothing more
/// there; its tenant can still delete it; an operator (`admin = "all"`)
/// lists every tenant's series and pauses or deletes one by naming its
/// tenant; a tenant's token names no other tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_series_stops_when_its_tenant_loses_its_topic_and_stays_its_tenants_and_operators_to_delete() {
    let broker = Broker::start();
    let prefix = random_name("grants");
    let (lost, kept) = (format!("{prefix}.lost"), format!("{prefix}.kept"));
    broker.create_topic(&lost, 1).await;
    broker.create_topic(&kept, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let tokens = acme_and_ops(dir.path(), &[&lost, &kept]);
    let server =
        Serve::start_with(&broker, &dir.path().join("data"), &["--auth-tokens", tokens.to_str().unwrap()]);
    let channel = Channel::from_shared(server.url()).unwrap().connect().await.unwrap();
    let client =
        |token: &str| SeriesClient::with_interceptor(channel.clone(), Bearer::new(Some(token)).unwrap());
    let (mut acme, mut ops) = (client(ACME_TOKEN), client(OPS_TOKEN));
    acme.create_series(create("tick", every(&lost, "tick", Duration::from_secs(1)))).await.unwrap();
    acme.create_series(create("hourly", every(&kept, "h", Duration::from_secs(3600)))).await.unwrap();
    assert!(!consume_async(&broker, &lost, 1, Duration::from_secs(15), Duration::ZERO).await.is_empty());

    // The tokens file takes the topic away.
    acme_and_ops(dir.path(), &[&kept]);
    let hup = std::process::Command::new("kill").args(["-HUP", &server.child.id().to_string()]).status();
    assert!(hup.unwrap().success());
    let get =
        |id: &str| proto::GetSeriesRequest { id: id.into(), tenant: "acme".into(), ..Default::default() };
    let mut paused = None;
    for _ in 0..100 {
        let info = ops.get_series(get("tick")).await.unwrap().into_inner();
        if info.state() == SeriesState::Paused {
            paused = Some(info);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let paused = paused.expect("the series was not paused when its tenant lost its topic");
    assert!(paused.paused_reason.contains(&lost), "{paused:?}");
    // What was parked before goes out; nothing after.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before =
        consume_async(&broker, &lost, usize::MAX, Duration::from_secs(2), Duration::ZERO).await.len();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = consume_async(&broker, &lost, usize::MAX, Duration::from_secs(2), Duration::ZERO).await.len();
    assert_eq!(before, after, "occurrences went on to the topic the tenant lost");
    // Its tenant may still delete its own series.
    acme.delete_series(proto::DeleteSeriesRequest { id: "tick".into(), ..Default::default() }).await.unwrap();

    // The operator lists every tenant's, and stops one by naming it.
    let listed = ops.list_series(proto::ListSeriesRequest::default()).await.unwrap().into_inner();
    let whose: Vec<_> = listed.series.iter().map(|s| (s.tenant.as_str(), s.id.as_str())).collect();
    assert_eq!(whose, [("acme", "hourly")], "{listed:?}");
    let pause = proto::PauseSeriesRequest { id: "hourly".into(), tenant: "acme".into() };
    ops.pause_series(pause).await.unwrap();
    let mine = acme.get_series(proto::GetSeriesRequest { id: "hourly".into(), ..Default::default() });
    assert_eq!(mine.await.unwrap().into_inner().state(), SeriesState::Paused);
    let other = proto::DeleteSeriesRequest { id: "hourly".into(), tenant: "ops".into() };
    assert_eq!(acme.delete_series(other).await.unwrap_err().code(), Code::PermissionDenied);
    ops.delete_series(proto::DeleteSeriesRequest { id: "hourly".into(), tenant: "acme".into() })
        .await
        .unwrap();
    let gone = acme.get_series(proto::GetSeriesRequest { id: "hourly".into(), ..Default::default() });
    assert_eq!(gone.await.unwrap_err().code(), Code::NotFound);
}
