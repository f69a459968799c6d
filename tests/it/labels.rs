//! Labels and cancel by label selector against a real broker and a real
//! store: a bulk cancel while the messages it selects come due, standalone
//! and in a cluster.
//!
//! Pass: every selected message is either cancelled or delivered, never
//! both, and the counts the calls answer add up; messages the selector
//! does not pick are all delivered.
//!
//! `cargo test --test it labels:: -- --nocapture` shows the counts;
//! `HOURGLASS_RELIABILITY_FULL=1` cancels 100,000.

use crate::common;

use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant, SystemTime},
};

use common::*;
use hourglass::proto::{self, CancelOutcome, State};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_cancel_while_its_messages_come_due_cancels_or_delivers_each_once() {
    bulk_cancel_race(TestBed::start("labels-race", 3).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_a_bulk_cancel_while_its_messages_come_due_cancels_or_delivers_each_once() {
    let log_topic = random_name("hourglass-log");
    bulk_cancel_race(TestBed::start_with("labels-race-cluster", 3, one_node_cluster(&log_topic)).await).await;
}

async fn bulk_cancel_race(bed: TestBed) {
    let (n, others, window) = if reliability_full() {
        (100_000usize, 5_000usize, Duration::from_secs(40))
    } else {
        (8_000, 500, Duration::from_secs(4))
    };
    let TestBed { broker, topic, dir: _dir, server } = bed;
    let mut client = server.client().await;
    let run = random_name("b");
    let id = |i: usize| format!("{run}-{i}");
    // The selected messages and the others interleaved, due one after
    // another across the window.
    let start = SystemTime::now() + Duration::from_secs(if reliability_full() { 30 } else { 6 });
    let total = n + others;
    let requests: Vec<_> = (0..total)
        .map(|i| {
            let mut r = request(&topic, &format!("m{i}"), Duration::ZERO);
            r.id = Some(id(i));
            r.due = Some(proto::schedule_request::Due::DeliverAt(
                (start + window.mul_f64(i as f64 / total as f64)).into(),
            ));
            let batch = if i % (total / others) == 0 { "other" } else { "cancel-me" };
            r.labels = [("batch".to_owned(), batch.to_owned()), ("run".to_owned(), run.clone())].into();
            r
        })
        .collect();
    let selected: HashSet<String> =
        requests.iter().filter(|r| r.labels["batch"] == "cancel-me").map(|r| r.id.clone().unwrap()).collect();
    for chunk in requests.chunks(1000) {
        let batch = proto::ScheduleBatchRequest { requests: chunk.to_vec() };
        let results = client.schedule_batch(batch).await.unwrap().into_inner().results;
        assert!(
            results.iter().all(|r| matches!(r.result, Some(proto::schedule_result::Result::Scheduled(_))))
        );
    }
    if SystemTime::now() > start {
        eprintln!("bulk cancel race: scheduling overran the lead time");
    }

    // Start cancelling a third into the window: the first third is
    // delivered by then, the rest meets the cancels as it comes due.
    let third = start + window / 3;
    tokio::time::sleep(third.duration_since(SystemTime::now()).unwrap_or_default()).await;
    let began = Instant::now();
    let mut request = proto::CancelMatchingRequest {
        selector: format!("run={run},batch=cancel-me"),
        topic: topic.clone(),
        ..Default::default()
    };
    let (mut cancelled, mut calls) = (0u64, 0);
    let mut not_cancelled = HashMap::new();
    loop {
        let done = client.cancel_matching(request.clone()).await.unwrap().into_inner();
        calls += 1;
        cancelled += done.cancelled;
        for miss in done.not_cancelled {
            assert!(
                matches!(miss.outcome(), CancelOutcome::AlreadyDelivered),
                "a pending message's cancel said {miss:?}"
            );
            assert!(not_cancelled.insert(miss.id.clone(), miss).is_none(), "an id answered twice");
        }
        if done.next_page_token.is_empty() {
            break;
        }
        request.page_token = done.next_page_token;
    }
    let took = began.elapsed();

    let got = consume_async(
        &broker,
        &topic,
        total - cancelled as usize,
        Duration::from_secs(120),
        Duration::from_secs(3),
    )
    .await;
    let mut delivered = HashSet::new();
    for r in &got {
        assert!(delivered.insert(r.id().to_owned()), "{} delivered twice", r.id());
    }
    let delivered_selected = delivered.intersection(&selected).count();
    assert_eq!(
        delivered.len() - delivered_selected,
        others,
        "every message the selector did not pick is delivered"
    );
    if cancelled as usize + delivered_selected != n {
        // Say which: every selected message not on the topic, as Get sees it.
        let (mut odd, mut found_cancelled) = (Vec::new(), 0);
        for id in selected.difference(&delivered) {
            let got = client.get(proto::GetRequest { id: id.clone(), ..Default::default() }).await;
            match got.map(|r| r.into_inner()) {
                Ok(m) if m.state() == State::Cancelled => found_cancelled += 1,
                other => odd.push((id.clone(), other, not_cancelled.get(id).cloned())),
            }
        }
        panic!(
            "cancelled ({cancelled}; {found_cancelled} found so) and delivered ({delivered_selected}) do not add \
             up to the selected ({n}); not on the topic and not cancelled: {odd:#?}"
        );
    }
    assert!(not_cancelled.keys().all(|id| delivered.contains(id)), "each ALREADY_DELIVERED is on the topic");
    for i in (0..total).step_by(7) {
        let state = client
            .get(proto::GetRequest { id: id(i), ..Default::default() })
            .await
            .unwrap()
            .into_inner()
            .state();
        let expected = if delivered.contains(&id(i)) { State::Delivered } else { State::Cancelled };
        assert_eq!(state, expected, "{}", id(i));
    }
    eprintln!(
        "bulk cancel race: {n} selected among {total}: {cancelled} cancelled in {calls} calls over {took:?} \
         ({:.0}/s), {delivered_selected} delivered first ({} of them met by the cancel)",
        cancelled as f64 / took.as_secs_f64(),
        not_cancelled.len()
    );
    assert!(cancelled > 0 && delivered_selected > 0, "the cancels must meet the deliveries");
    server.stop().await;
}

/// A selector is bounded in terms and bytes wherever one is taken: past
/// either, the call is refused with INVALID_ARGUMENT naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_selector_too_long_or_with_too_many_terms_is_refused_by_every_call_that_takes_one() {
    let TestBed { server, topic, broker: _broker, dir: _dir } = TestBed::start("labels-bounds", 1).await;
    let mut client = server.client().await;
    let mut series =
        proto::series_client::SeriesClient::connect(format!("http://{}", server.addr)).await.unwrap();
    let many = (0..33).map(|i| format!("k{i}")).collect::<Vec<_>>().join(",");
    let long = format!("k={}", "v".repeat(5000));
    for selector in [many, long] {
        let list = proto::ListRequest { selector: selector.clone(), ..Default::default() };
        let refused = client.list(list).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "List: {refused:?}");
        assert!(refused.message().starts_with("selector "), "{}", refused.message());
        let cancel = proto::CancelMatchingRequest {
            selector: selector.clone(),
            topic: topic.clone(),
            ..Default::default()
        };
        let refused = client.cancel_matching(cancel).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "CancelMatching: {refused:?}");
        let listed = proto::ListSeriesRequest { selector, ..Default::default() };
        let refused = series.list_series(listed).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "ListSeries: {refused:?}");
    }
}

/// A cancel by selector cancels only what still matches when it is
/// cancelled: a message replaced with other labels after it was listed is
/// left pending. `Cancel` with a selector checks it in the same step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_replaced_with_other_labels_while_a_bulk_cancel_runs_is_left_pending() {
    let TestBed { server, topic, broker: _broker, dir: _dir } = TestBed::start("labels-replaced", 1).await;
    let mut client = server.client().await;
    let to = topic.clone();
    let labelled = move |i: usize, batch: &str| {
        let mut r = request(&to, &format!("{batch}-{i}"), Duration::from_secs(3600));
        r.id = Some(format!("m-{i}"));
        r.labels = [("batch".to_owned(), batch.to_owned())].into();
        r.on_conflict = proto::OnConflict::Replace as i32;
        r
    };
    // One message, asked directly.
    client.schedule(labelled(0, "old")).await.unwrap();
    let cancel = |selector: &str| proto::CancelRequest {
        id: "m-0".into(),
        selector: selector.into(),
        topic: topic.clone(),
        ..Default::default()
    };
    let outcome = client.cancel(cancel("batch=new")).await.unwrap().into_inner().outcome();
    assert_eq!(outcome, CancelOutcome::NotFound, "its labels do not match");
    let wrong_topic = proto::CancelRequest { topic: format!("{topic}-other"), ..cancel("batch=old") };
    let outcome = client.cancel(wrong_topic).await.unwrap().into_inner().outcome();
    assert_eq!(outcome, CancelOutcome::NotFound, "its topic does not match");
    let state = client
        .get(proto::GetRequest { id: "m-0".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .state();
    assert_eq!(state, State::Pending);
    let outcome = client.cancel(cancel("batch=old")).await.unwrap().into_inner().outcome();
    assert_eq!(outcome, CancelOutcome::Cancelled);

    // Many, replaced while a bulk cancel of the old labels runs.
    let n = 3000;
    for start in (1..=n).step_by(1000) {
        let requests = (start..start + 1000).map(|i| labelled(i, "old")).collect();
        client.schedule_batch(proto::ScheduleBatchRequest { requests }).await.unwrap();
    }
    let mut replacer = client.clone();
    let replaced = labelled.clone();
    let replacing = tokio::spawn(async move {
        for start in (1..=n).rev().step_by(100).map(|end| end.saturating_sub(99).max(1)) {
            let requests = (start..start + 100).map(|i| replaced(i, "new")).collect();
            replacer.schedule_batch(proto::ScheduleBatchRequest { requests }).await.unwrap();
        }
    });
    let mut request = proto::CancelMatchingRequest {
        selector: "batch=old".into(),
        topic: topic.clone(),
        ..Default::default()
    };
    loop {
        let done = client.cancel_matching(request.clone()).await.unwrap().into_inner();
        if done.next_page_token.is_empty() {
            break;
        }
        request.page_token = done.next_page_token;
    }
    replacing.await.unwrap();
    for i in 1..=n {
        let m = client
            .get(proto::GetRequest { id: format!("m-{i}"), ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        if m.labels.get("batch").map(String::as_str) == Some("new") {
            assert_eq!(m.state(), State::Pending, "m-{i} was replaced with new labels, then cancelled");
        }
    }
}
