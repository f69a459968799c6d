//! What clients can take from the server, with real connections: request
//! bodies held half-sent (memory is bounded in bytes), streams that send
//! nothing (they cannot take every call slot, and they end), and many
//! connections at once (accepted no faster than they close past the limit).

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use hourglass::proto;
use tonic::Code;

/// A gRPC call opened with a raw HTTP/2 client, whose body is sent in part.
struct HalfSent {
    response: h2::client::ResponseFuture,
    _body: h2::SendStream<Bytes>,
}

/// Opens a connection of its own and a ScheduleBatch on it whose gRPC frame
/// announces `declared` bytes, of which `sent` are sent; the rest never is.
async fn half_sent_batch(addr: std::net::SocketAddr, declared: usize, sent: usize) -> HalfSent {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let request = http::Request::post(format!("http://{addr}/hourglass.v1.Scheduler/ScheduleBatch"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (response, mut body) = client.send_request(request, false).unwrap();
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(declared as u32).to_be_bytes());
    frame.resize(5 + sent, 0x0a);
    let mut frame = Bytes::from(frame);
    while !frame.is_empty() {
        body.reserve_capacity(frame.len());
        let granted = std::future::poll_fn(|cx| body.poll_capacity(cx)).await;
        let Some(Ok(n)) = granted else { break };
        let chunk = frame.split_to(n.min(frame.len()));
        body.send_data(chunk, false).unwrap();
    }
    HalfSent { response, _body: body }
}

/// The gRPC status of a trailers-only answer.
fn grpc_status(response: &http::Response<h2::RecvStream>) -> Option<Code> {
    let code = response.headers().get("grpc-status")?.to_str().ok()?.parse::<i32>().ok()?;
    Some(Code::from_i32(code))
}

/// Requests whose bodies arrive slowly take their bytes from one budget:
/// once it is held by half-sent requests, the next is refused
/// RESOURCE_EXHAUSTED, instead of every one buffering up to its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_are_held_to_a_byte_budget() {
    let bed = TestBed::start_with("memory", 1, |c| {
        c.max_request_memory = 4 << 20;
        c.max_batch_bytes = 1 << 20;
        c.max_message_bytes = 256 << 10;
    })
    .await;
    let _ready = bed.server.client().await;
    let (declared, sent) = (1_000_000, 900_000);
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(half_sent_batch(bed.server.addr, declared, sent).await);
    }
    // Let the server read what was sent.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let refused = half_sent_batch(bed.server.addr, declared, sent).await;
    let response = tokio::time::timeout(Duration::from_secs(10), refused.response)
        .await
        .expect("the request over the budget is answered at once, before its body is complete")
        .unwrap();
    assert_eq!(grpc_status(&response), Some(Code::ResourceExhausted), "{response:?}");
    let message = response.headers().get("grpc-message").map(|m| m.to_str().unwrap().to_owned());
    assert!(message.as_deref().is_some_and(|m| m.contains("--max-request-memory")), "{message:?}");
    for half in &mut held {
        let answered = tokio::time::timeout(Duration::from_millis(100), &mut half.response).await;
        assert!(answered.is_err(), "a request within the budget waits for the rest of its body");
    }
    // Given up on, they free the budget.
    drop(held);
    let mut client = bed.server.client().await;
    let mut freed = false;
    for _ in 0..50 {
        let batch = proto::ScheduleBatchRequest {
            requests: vec![request(&bed.topic, &"x".repeat(200_000), Duration::from_secs(60))],
        };
        match client.schedule_batch(batch).await {
            Ok(_) => {
                freed = true;
                break;
            }
            Err(status) => assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(freed, "the budget came back once the half-sent requests were dropped");
    bed.server.stop().await;
}

/// Streams that send nothing: at most half the call slots, so unary calls
/// still get in; ended after `--stream-idle-timeout`, so they do not hold
/// those slots for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_streams_neither_starve_other_calls_nor_live_for_ever() {
    let bed = TestBed::start_with("idle", 1, |c| {
        c.max_concurrent_requests = 16;
        c.stream_idle_timeout = Duration::from_secs(2).into();
    })
    .await;
    let mut client = bed.server.client().await;
    let (mut open, mut refused, mut senders) = (Vec::new(), 0, Vec::new());
    for _ in 0..16 {
        let (tx, rx) = tokio::sync::mpsc::channel::<proto::ScheduleRequest>(1);
        senders.push(tx);
        match client.schedule_stream(tokio_stream::wrappers::ReceiverStream::new(rx)).await {
            Ok(answers) => open.push(answers.into_inner()),
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                refused += 1;
            }
        }
    }
    assert_eq!((open.len(), refused), (8, 8), "streams take at most half the slots");
    client
        .schedule(request(&bed.topic, "beside idle streams", Duration::from_secs(60)))
        .await
        .expect("a unary call gets in while the streams sit idle");

    for answers in &mut open {
        let end =
            tokio::time::timeout(Duration::from_secs(10), answers.message()).await.expect("the stream ends");
        let status = end.expect_err("ended with a status, not an answer");
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert!(status.message().contains("sent nothing"), "{}", status.message());
    }
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let mut answers = client
        .schedule_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("room for a stream again")
        .into_inner();
    tx.send(request(&bed.topic, "on a fresh stream", Duration::from_secs(60))).await.unwrap();
    assert!(answers.message().await.unwrap().is_some());
    drop(senders);
    bed.server.stop().await;
}

/// More connections than `--max-connections`: the ones past the limit wait
/// to be accepted until others close; none is served beyond it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_limit_wait_until_others_close() {
    let bed = TestBed::start_with("conns", 1, |c| c.max_connections = 4).await;
    let mut clients = Vec::new();
    for _ in 0..4 {
        let mut client = connect(bed.server.addr).await;
        client.get(proto::GetRequest { id: "nobody".into(), ..Default::default() }).await.unwrap_err();
        clients.push(client);
    }
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", bed.server.addr))
        .unwrap()
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(1));
    let mut fifth = proto::scheduler_client::SchedulerClient::new(channel.connect_lazy());
    let waited =
        fifth.get(proto::GetRequest { id: "nobody".into(), ..Default::default() }).await.unwrap_err();
    assert_ne!(waited.code(), Code::NotFound, "a fifth connection was served: {waited:?}");
    clients.clear();
    let mut served = false;
    for _ in 0..50 {
        let mut client = proto::scheduler_client::SchedulerClient::new(channel.connect_lazy());
        if client
            .get(proto::GetRequest { id: "nobody".into(), ..Default::default() })
            .await
            .is_err_and(|s| s.code() == Code::NotFound)
        {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(served, "a place came free once the others closed");
    bed.server.stop().await;
}

/// Forecasts take turns on a node: the few that may wait hold only a few
/// of the server's call slots, the rest are refused at once, and every
/// other call still gets in.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forecasts_waiting_their_turn_hold_a_few_call_slots_and_no_more() {
    use tonic::IntoRequest as _;
    let broker = Broker::start();
    let dir = tempfile::tempdir().unwrap();
    let server = Serve::start_env(
        &broker,
        dir.path(),
        &["--max-concurrent-requests", "32"],
        &[("HOURGLASS_FAILPOINT", "forecast-slow@1..1000")],
    );
    let client = server.client().await;
    let mut forecasts = tokio::task::JoinSet::new();
    for _ in 0..40 {
        let mut client = client.clone();
        forecasts.spawn(async move {
            client.forecast(proto::ForecastRequest::default()).await.map(|_| ()).map_err(|s| s.code())
        });
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Every slow forecast is in by now, answered or waiting.
    let stats = client.clone().stats(proto::StatsRequest {}).await;
    assert!(stats.is_ok(), "a call besides the forecasts gets in: {stats:?}");
    let mut with_deadline = proto::ForecastRequest::default().into_request();
    with_deadline.set_timeout(Duration::from_millis(800));
    let started = std::time::Instant::now();
    let late = client.clone().forecast(with_deadline).await.unwrap_err();
    assert!(
        matches!(late.code(), Code::ResourceExhausted | Code::DeadlineExceeded | Code::Cancelled),
        "{late:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5), "answered within its deadline, not at its turn");
    let (mut served, mut refused) = (0, 0);
    while let Some(answer) = forecasts.join_next().await {
        match answer.unwrap() {
            Ok(()) => served += 1,
            Err(Code::ResourceExhausted) => refused += 1,
            Err(other) => panic!("a forecast ended {other:?}"),
        }
    }
    assert!((1..=9).contains(&served), "one runs and at most eight wait: {served} served");
    assert_eq!(served + refused, 40);
}
