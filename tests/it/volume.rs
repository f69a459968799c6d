//! The volume API against a real broker and a real store: `ScheduleBatch`
//! answers each item on its own and parks the good ones; `ScheduleStream`
//! answers every request in order, delivers each once, and stops reading a
//! client that does not read its answers.

use crate::common;

use std::{collections::HashSet, time::Duration};

use common::*;
use hourglass::proto::{self, schedule_result::Result as Item};
use tokio_stream::StreamExt as _;
use tonic::Code;

fn code_of(result: &proto::ScheduleResult) -> Code {
    match result.result.as_ref().expect("every result says something") {
        Item::Scheduled(_) => Code::Ok,
        Item::Error(e) => Code::from_i32(e.code),
    }
}

fn with_id(mut r: proto::ScheduleRequest, id: &str) -> proto::ScheduleRequest {
    r.id = Some(id.into());
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_answers_each_item_and_parks_only_the_good_ones() {
    let TestBed { broker, topic, dir: _dir, server } = TestBed::start("batch", 2).await;
    let mut client = server.client().await;
    let soon = Duration::from_millis(300);

    let mut empty_value = request(&topic, "", soon);
    empty_value.id = Some("bad-empty".into());
    let mut bad_partition = request(&topic, "p", soon);
    bad_partition.message.as_mut().unwrap().partition = Some(7);
    bad_partition.id = Some("bad-partition".into());
    let requests = vec![
        with_id(request(&topic, "one", soon), "good-1"),
        with_id(request("no-such-topic-here", "x", soon), "bad-topic"),
        request(&topic, "two", soon),
        empty_value,
        // The same id and request twice in one batch: parked once.
        with_id(request(&topic, "three", soon), "good-3"),
        with_id(request(&topic, "three", soon), "good-3"),
        // The same id, a different message: refused.
        with_id(request(&topic, "other", soon), "good-3"),
        bad_partition,
    ];
    let results = client
        .schedule_batch(proto::ScheduleBatchRequest { requests })
        .await
        .expect("a batch with bad items still succeeds as a call")
        .into_inner()
        .results;
    let codes: Vec<Code> = results.iter().map(code_of).collect();
    assert_eq!(
        codes,
        [
            Code::Ok,
            Code::NotFound,
            Code::Ok,
            Code::InvalidArgument,
            Code::Ok,
            Code::Ok,
            Code::AlreadyExists,
            Code::InvalidArgument
        ]
    );
    assert!(results.iter().enumerate().all(|(i, r)| r.index == i as u64), "indexes follow the request");
    let Some(Item::Error(e)) = &results[3].result else { unreachable!() };
    assert_eq!(e.field, "message.value", "the bad field is named: {e:?}");
    let Some(Item::Error(e)) = &results[1].result else { unreachable!() };
    assert!(e.message.contains("no-such-topic-here"), "{e:?}");
    let scheduled = |i: usize| match &results[i].result {
        Some(Item::Scheduled(s)) => s.clone(),
        other => panic!("item {i}: {other:?}"),
    };
    assert!(!scheduled(4).duplicate);
    assert!(scheduled(5).duplicate, "the second identical item is the first one");
    assert_eq!(scheduled(5).deliver_at, scheduled(4).deliver_at);

    let got = consume_async(&broker, &topic, 3, Duration::from_secs(20), Duration::from_millis(500)).await;
    let mut values: Vec<String> = got.iter().map(|r| String::from_utf8(r.value.clone()).unwrap()).collect();
    values.sort();
    assert_eq!(values, ["one", "three", "two"], "good items delivered once each, bad ones never");
    for id in ["bad-topic", "bad-empty", "bad-partition"] {
        let err = client.get(proto::GetRequest { id: id.into(), ..Default::default() }).await.unwrap_err();
        assert_eq!(err.code(), Code::NotFound, "a refused item is not stored: {id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_batch_is_refused_whole() {
    let TestBed { topic, server, broker: _broker, dir: _dir } =
        TestBed::start_with("big", 1, |c| c.max_batch = 10).await;
    let mut client = server.client().await;
    let requests: Vec<_> =
        (0..11).map(|i| with_id(request(&topic, "v", Duration::from_secs(60)), &format!("b-{i}"))).collect();
    let err = client.schedule_batch(proto::ScheduleBatchRequest { requests }).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("at most 10"), "{}", err.message());
    let err = client.get(proto::GetRequest { id: "b-0".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "nothing of a refused batch is stored");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_answers_in_order_and_delivers_each_once() {
    let TestBed { broker, topic, dir: _dir, server } = TestBed::start("stream", 3).await;
    let mut client = server.client().await;
    const N: usize = 5000;
    const BAD: usize = 1234;
    let requests: Vec<_> = (0..N)
        .map(|i| {
            let mut r = request(&topic, &format!("m-{i}"), Duration::from_millis(500));
            if i == BAD {
                r.due = None;
            }
            r
        })
        .collect();
    let answers: Vec<proto::ScheduleResult> = client
        .schedule_stream(tokio_stream::iter(requests))
        .await
        .unwrap()
        .into_inner()
        .map(|r| r.expect("the stream does not break on a bad item"))
        .collect()
        .await;
    assert_eq!(answers.len(), N, "every request is answered");
    let mut ids = HashSet::new();
    for (i, answer) in answers.iter().enumerate() {
        assert_eq!(answer.index, i as u64, "answers come in request order");
        match &answer.result {
            Some(Item::Scheduled(s)) => assert!(ids.insert(s.id.clone()), "ids are unique"),
            Some(Item::Error(e)) => {
                assert_eq!(i, BAD, "only the bad request fails: {e:?}");
                assert_eq!((Code::from_i32(e.code), e.field.as_str()), (Code::InvalidArgument, "due"));
            }
            None => panic!("empty answer at {i}"),
        }
    }
    assert_eq!(ids.len(), N - 1);

    let got = consume_async(&broker, &topic, N - 1, Duration::from_secs(60), Duration::from_secs(1)).await;
    let delivered: HashSet<String> = got.iter().map(|r| r.id().to_owned()).collect();
    assert_eq!(got.len(), N - 1, "each delivered once");
    assert_eq!(delivered, ids, "exactly the acknowledged ids are delivered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_answers_are_not_read_is_not_read_either() {
    let TestBed { topic, server, broker: _broker, dir: _dir } =
        TestBed::start_with("window", 1, |c| c.stream_window = 16).await;
    let _warm = server.client().await;
    // A client with small HTTP/2 receive windows, so that what is buffered
    // is the server's doing, not the client's (hyper's default is 2 MiB).
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .initial_stream_window_size(64 * 1024)
        .initial_connection_window_size(64 * 1024)
        .connect()
        .await
        .unwrap();
    let mut client = proto::scheduler_client::SchedulerClient::new(channel);
    const N: usize = 50_000;
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let topic2 = topic.clone();
    let sender = tokio::spawn(async move {
        for i in 0..N {
            let r = with_id(request(&topic2, "w", Duration::from_secs(3600)), &format!("w-{i}"));
            if tx.send(r).await.is_err() {
                break;
            }
        }
    });
    let mut answers =
        client.schedule_stream(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
    // Read nothing for a while: the server must stop taking requests.
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Metrics are per process and tests share it: ask for the ids instead.
    let mut probe = server.client().await;
    let stored = |r: Result<tonic::Response<proto::GetResponse>, tonic::Status>| match r {
        Ok(_) => true,
        Err(s) if s.code() == Code::NotFound => false,
        Err(s) => panic!("{s}"),
    };
    assert!(
        stored(probe.get(proto::GetRequest { id: "w-0".into(), ..Default::default() }).await),
        "the stream made progress"
    );
    let half = format!("w-{}", N / 2);
    assert!(
        !stored(probe.get(proto::GetRequest { id: half, ..Default::default() }).await),
        "with nobody reading answers the server parked half of {N}; it must stop reading"
    );
    assert!(!sender.is_finished(), "the client is held back by flow control");
    // Reading resumes the flow, and everything is answered.
    let mut answered = 0;
    while let Some(answer) = answers.next().await {
        assert_eq!(code_of(&answer.unwrap()), Code::Ok);
        answered += 1;
    }
    assert_eq!(answered, N);
    sender.await.unwrap();
    let last = format!("w-{}", N - 1);
    assert!(stored(probe.get(proto::GetRequest { id: last, ..Default::default() }).await));
    server.stop().await;
}
