//! Races, against a real broker and a real store: the same id submitted
//! many times at once, a request retried after the client gave up on it,
//! and cancels that land at the instant a message falls due.
//!
//! Pass: a message is stored once and delivered once however often it is
//! submitted; a cancel is either CANCELLED (never delivered) or
//! ALREADY_DELIVERED (delivered exactly once), never both, nothing
//! unaccounted for.
//!
//! `cargo test --test it races:: -- --nocapture` shows the counts;
//! `HOURGLASS_RELIABILITY_FULL=1` runs the cancel race at full scale.

use crate::common;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::{Duration, Instant, SystemTime},
};

use common::*;
use hourglass::proto::{self, CancelOutcome, State, schedule_result::Result as Item};
use tokio_stream::StreamExt as _;
use tonic::Code;

fn with_id(mut r: proto::ScheduleRequest, id: &str) -> proto::ScheduleRequest {
    r.id = Some(id.into());
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_id_a_thousand_times_at_once_is_stored_and_delivered_once() {
    let TestBed { broker, topic, dir: _dir, server } = TestBed::start("same", 2).await;
    let _warm = server.client().await;
    const CONNECTIONS: usize = 8;
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        clients.push(connect(server.addr).await);
    }
    let started = Instant::now();

    // 1000 Schedule calls with one id, over 8 connections at once.
    let unary_id = random_name("same-unary");
    let r = with_id(request(&topic, "unary", Duration::from_secs(2)), &unary_id);
    let calls: Vec<_> = (0..1000)
        .map(|i| {
            let (mut c, r) = (clients[i % CONNECTIONS].clone(), r.clone());
            tokio::spawn(async move { c.schedule(r).await })
        })
        .collect();
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.unwrap().expect("every submission is answered OK").into_inner());
    }
    let firsts = answers.iter().filter(|a| !a.duplicate).count();
    assert_eq!(firsts, 1, "exactly one submission stored it; the others are duplicates");
    assert!(answers.iter().all(|a| a.id == unary_id && a.deliver_at == answers[0].deliver_at), "all agree");

    // 1000 more for another id, by every method at once: 400 Schedule
    // calls, 30 batches and 30 streams of 10 copies each.
    let mixed_id = random_name("same-mixed");
    let r = with_id(request(&topic, "mixed", Duration::from_secs(2)), &mixed_id);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..460 {
        let (mut c, r) = (clients[i % CONNECTIONS].clone(), r.clone());
        tasks.spawn(async move {
            match i {
                0..400 => vec![c.schedule(r).await.unwrap().into_inner()],
                400..430 => {
                    let requests = vec![r; 10];
                    let reply = c.schedule_batch(proto::ScheduleBatchRequest { requests }).await.unwrap();
                    reply.into_inner().results.into_iter().map(scheduled).collect()
                }
                _ => {
                    let reply = c.schedule_stream(tokio_stream::iter(vec![r; 10])).await.unwrap();
                    let answers: Vec<_> = reply.into_inner().collect().await;
                    answers.into_iter().map(|a| scheduled(a.unwrap())).collect()
                }
            }
        });
    }
    let mut mixed = Vec::new();
    while let Some(answers) = tasks.join_next().await {
        mixed.extend(answers.unwrap());
    }
    assert_eq!(mixed.len(), 1000);
    assert_eq!(mixed.iter().filter(|a| !a.duplicate).count(), 1, "stored once across all methods");
    assert!(mixed.iter().all(|a| a.id == mixed_id && a.deliver_at == mixed[0].deliver_at), "all agree");
    eprintln!("same id: 2 x 1000 submissions answered in {:?}", started.elapsed());

    let got = consume_async(&broker, &topic, 2, Duration::from_secs(30), Duration::from_secs(3)).await;
    let mut ids: Vec<&str> = got.iter().map(Received::id).collect();
    ids.sort();
    let mut expected = vec![unary_id.as_str(), mixed_id.as_str()];
    expected.sort();
    assert_eq!(ids, expected, "each delivered exactly once: {got:?}");
    let mut client = server.client().await;
    for id in [&unary_id, &mixed_id] {
        let got = client
            .get(proto::GetRequest { id: id.clone(), ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(got.state(), State::Delivered, "{id}");
    }
    server.stop().await;
}

fn scheduled(result: proto::ScheduleResult) -> proto::ScheduleResponse {
    match result.result {
        Some(Item::Scheduled(s)) => s,
        other => panic!("an identical copy was refused: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_the_client_gave_up_is_delivered_once() {
    let TestBed { broker, topic, dir: _dir, server } = TestBed::start("deadline", 2).await;
    let client = server.client().await;
    // Connections whose every call the client abandons after 1, 3 or 10 ms.
    let mut impatient = Vec::new();
    for ms in [1, 3, 10] {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr)).unwrap();
        let channel = endpoint.timeout(Duration::from_millis(ms)).connect().await.unwrap();
        impatient.push(proto::scheduler_client::SchedulerClient::new(channel));
    }
    const N: usize = 400;
    let run = random_name("d");
    let requests: Vec<_> = (0..N)
        .map(|i| with_id(request(&topic, &format!("d{i}"), Duration::from_secs(1)), &format!("{run}-{i}")))
        .collect();

    // First attempts, 16 at a time, each with a deadline the server may or
    // may not meet: half sent as grpc-timeout (0 to 20 ms; the server
    // enforces it too), half on an impatient connection.
    const DEADLINES_MS: [u64; 8] = [0, 1, 2, 3, 5, 8, 13, 20];
    let mut gave_up = BTreeMap::<String, usize>::new();
    let mut first_answers = HashMap::new();
    for wave in (0..N).collect::<Vec<_>>().chunks(16) {
        let attempts: Vec<_> = wave
            .iter()
            .map(|&i| {
                let (mut c, r) = (client.clone(), requests[i].clone());
                let mut impatient = impatient[i % impatient.len()].clone();
                tokio::spawn(async move {
                    if i % 2 == 0 {
                        let mut request = tonic::Request::new(r);
                        request
                            .set_timeout(Duration::from_millis(DEADLINES_MS[(i / 2) % DEADLINES_MS.len()]));
                        (i, c.schedule(request).await)
                    } else {
                        (i, impatient.schedule(r).await)
                    }
                })
            })
            .collect();
        for attempt in attempts {
            match attempt.await.unwrap() {
                (i, Ok(reply)) => {
                    first_answers.insert(i, reply.into_inner());
                }
                (_, Err(status)) => {
                    // Abandoned at the deadline (tonic says CANCELLED), or the
                    // connection went down under the burst of abandoned
                    // streams: either way the client does not know.
                    assert!(
                        matches!(
                            status.code(),
                            Code::DeadlineExceeded | Code::Cancelled | Code::Unknown | Code::Unavailable
                        ),
                        "only the deadline may fail a valid request: {status:?}"
                    );
                    *gave_up.entry(format!("{:?}", status.code())).or_default() += 1;
                }
            }
        }
    }
    let abandoned: usize = gave_up.values().sum();
    assert!(abandoned > 0, "no attempt was abandoned; the test did not test anything");

    // Retries without a deadline, twice, on a connection of their own: both
    // answered OK, with one due time.
    let mut client = connect(server.addr).await;
    let mut stored_by_abandoned = 0;
    for (i, r) in requests.iter().enumerate() {
        let retry =
            client.schedule(r.clone()).await.unwrap_or_else(|s| panic!("{i}: retry: {s:?}")).into_inner();
        let again = client.schedule(r.clone()).await.expect("a second retry is OK").into_inner();
        assert!(again.duplicate);
        assert_eq!(again.deliver_at, retry.deliver_at);
        match first_answers.get(&i) {
            Some(first) => {
                assert!(retry.duplicate, "{i}: answered the first time, so stored then");
                assert_eq!(retry.deliver_at, first.deliver_at);
            }
            None => stored_by_abandoned += usize::from(retry.duplicate),
        }
    }
    eprintln!(
        "deadline: {N} requests, {} answered in time, {abandoned} abandoned {gave_up:?}, of which {stored_by_abandoned} \
         were stored all the same (the retry was a duplicate)",
        first_answers.len()
    );

    let got = consume_async(&broker, &topic, N, Duration::from_secs(60), Duration::from_secs(3)).await;
    let mut seen = HashSet::new();
    for r in &got {
        assert!(seen.insert(r.id().to_owned()), "{} delivered twice", r.id());
    }
    let expected: HashSet<String> = (0..N).map(|i| format!("{run}-{i}")).collect();
    assert_eq!(seen, expected, "each delivered exactly once");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_at_the_due_instant_is_either_cancelled_or_delivered() {
    // CI scale: 3000 messages over 6 s; full scale: 20000 over 40 s.
    let (n, window) = if reliability_full() {
        (20_000usize, Duration::from_secs(40))
    } else {
        (3_000, Duration::from_secs(6))
    };
    let TestBed { broker, topic, dir: _dir, server } = TestBed::start("due-race", 3).await;
    let mut client = server.client().await;
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(connect(server.addr).await);
    }
    let started = Instant::now();
    let run = random_name("c");
    let id = |i: usize| format!("{run}-{i}");

    // Due one after another across the window, starting after a lead time
    // that leaves room to schedule them all.
    let start = SystemTime::now() + Duration::from_secs(8);
    let due = |i: usize| start + window.mul_f64(i as f64 / n as f64);
    let requests: Vec<_> = (0..n)
        .map(|i| {
            let mut r = with_id(request(&topic, &format!("m{i}"), Duration::ZERO), &id(i));
            r.due = Some(proto::schedule_request::Due::DeliverAt(prost_types::Timestamp::from(due(i))));
            r
        })
        .collect();
    let mut due_ms = Vec::with_capacity(n);
    for chunk in requests.chunks(1000) {
        let results = client
            .schedule_batch(proto::ScheduleBatchRequest { requests: chunk.to_vec() })
            .await
            .unwrap()
            .into_inner()
            .results;
        due_ms.extend(results.into_iter().map(|r| millis(&scheduled(r).deliver_at.unwrap())));
    }
    let scheduled_in = started.elapsed();
    if SystemTime::now() > start {
        eprintln!("due race: scheduling overran the lead time; early cancels come late");
    }

    // Each cancel is sent at its message's due instant, give or take up to
    // 4 ms (a fixed spread by index), so that many meet the dispatcher.
    let cancels: Vec<_> = (0..n)
        .map(|i| {
            let due = SystemTime::UNIX_EPOCH + Duration::from_millis(due_ms[i] as u64);
            let (offset_ms, when) = around_due(i, due);
            let (mut c, id) = (clients[i % clients.len()].clone(), id(i));
            tokio::spawn(async move {
                tokio::time::sleep_until(when).await;
                let outcome = c
                    .cancel(proto::CancelRequest { id, ..Default::default() })
                    .await
                    .expect("a cancel is answered");
                (offset_ms, outcome.into_inner().outcome())
            })
        })
        .collect();
    let mut cancelled = HashSet::new();
    let mut delivered = HashSet::new();
    let mut by_offset = BTreeMap::<i64, (usize, usize)>::new();
    for (i, cancel) in cancels.into_iter().enumerate() {
        let (offset_ms, outcome) = cancel.await.unwrap();
        let counts = by_offset.entry(offset_ms).or_default();
        match outcome {
            CancelOutcome::Cancelled => {
                cancelled.insert(id(i));
                counts.0 += 1;
            }
            CancelOutcome::AlreadyDelivered => {
                delivered.insert(id(i));
                counts.1 += 1;
            }
            other => panic!("{}: a pending message's cancel said {other:?}", id(i)),
        }
    }
    assert_eq!(cancelled.len() + delivered.len(), n, "every message is accounted for");

    let got =
        consume_async(&broker, &topic, delivered.len(), Duration::from_secs(120), Duration::from_secs(3))
            .await;
    let mut seen = HashMap::new();
    for r in &got {
        assert!(!cancelled.contains(r.id()), "{} was reported cancelled but was delivered", r.id());
        assert!(
            seen.insert(r.id().to_owned(), (r.partition, r.offset)).is_none(),
            "{} delivered twice",
            r.id()
        );
    }
    let seen_ids: HashSet<String> = seen.keys().cloned().collect();
    assert_eq!(seen_ids, delivered, "every ALREADY_DELIVERED is on the topic once, and nothing else");

    // Get agrees with Cancel, and with where the record landed.
    for i in 0..n {
        let got =
            client.get(proto::GetRequest { id: id(i), ..Default::default() }).await.unwrap().into_inner();
        if cancelled.contains(&id(i)) {
            assert_eq!(got.state(), State::Cancelled, "{}", id(i));
        } else {
            assert_eq!(got.state(), State::Delivered, "{}", id(i));
            let Some(proto::get_response::Settlement::Delivered(d)) = got.settlement else {
                panic!("{}: delivered without a delivery record", id(i));
            };
            assert_eq!(Some(&(d.partition, d.offset)), seen.get(&id(i)), "{}", id(i));
        }
    }
    eprintln!(
        "due race: {n} messages over {window:?} (scheduled in {scheduled_in:?}): {} cancelled, {} delivered; \
         by cancel offset from due in ms (cancelled, delivered): {by_offset:?}; {:?} in all",
        cancelled.len(),
        delivered.len(),
        started.elapsed()
    );
    assert!(!cancelled.is_empty() && !delivered.is_empty(), "the cancels must meet the deliveries");
    server.stop().await;
}
