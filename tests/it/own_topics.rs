//! The topics hourglass writes itself in cluster mode (the schedule log,
//! its routing topic and the ingress topics) are never a destination nor a
//! dead-letter topic, whatever a token's grant: not through `Schedule`,
//! `ScheduleBatch`, `ScheduleStream`, a series template, a policy or a
//! Kafka-native record. hourglass's own producer may write the log, so a
//! record produced there under a key the cluster uses would replace the
//! cluster's own record of it when the log is compacted.

use crate::common;

use std::time::Duration;

use common::*;
use hourglass::{
    auth::Bearer,
    proto::{
        self, State, admin_client::AdminClient, schedule_result, scheduler_client::SchedulerClient,
        series_client::SeriesClient,
    },
};
use tonic::{Code, transport::Channel};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_granted_every_topic_cannot_send_to_the_log_its_routing_topic_or_an_ingress_topic() {
    let broker = Broker::start();
    let topic = random_name("orders");
    broker.create_topic(&topic, 1).await;
    let log = random_name("hourglass-log");
    let ingress = format!("{log}-native");
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        "[[token]]\nname = \"ops\"\ntoken = \"ops-token-0123456789abcdef\"\ntopics = [\"*\"]\nadmin = \"all\"\n",
    )
    .unwrap();
    let mut config = config(&broker, &dir.path().join("data"));
    one_node_cluster(&log)(&mut config);
    config.auth_tokens = Some(tokens);
    config.ingress = Some(format!("{ingress}=ops"));
    let server = Hourglass::start(config).await;
    let channel = Channel::from_shared(format!("http://{}", server.addr)).unwrap().connect().await.unwrap();
    let bearer = || Bearer::new(Some("ops-token-0123456789abcdef")).unwrap();
    let mut client = SchedulerClient::with_interceptor(channel.clone(), bearer());
    let mut series = SeriesClient::with_interceptor(channel.clone(), bearer());
    let mut admin = AdminClient::with_interceptor(channel.clone(), bearer());

    let own = [log.clone(), format!("{log}-owners"), ingress.clone()];
    for reserved in &own {
        // As its topic.
        let refused = client.schedule(request(reserved, "x", Duration::ZERO)).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{reserved}: {refused:?}");
        assert!(refused.message().contains("keeps for itself"), "{}", refused.message());
        // As its dead-letter topic.
        let mut dead = request(&topic, "x", Duration::from_secs(3600));
        dead.dead_letter_topic = reserved.clone();
        let refused = client.schedule(dead.clone()).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{reserved}: {refused:?}");
        // In a batch, and on a stream: that item alone.
        let batch = proto::ScheduleBatchRequest {
            requests: vec![
                request(reserved, "x", Duration::ZERO),
                dead,
                request(&topic, "ok", Duration::ZERO),
            ],
        };
        let results = client.schedule_batch(batch).await.unwrap().into_inner().results;
        let refused: Vec<_> =
            results.iter().map(|r| matches!(r.result, Some(schedule_result::Result::Error(_)))).collect();
        assert_eq!(refused, [true, true, false], "{reserved}: {results:?}");
        let stream = tokio_stream::iter(vec![request(reserved, "x", Duration::ZERO)]);
        let mut answers = client.schedule_stream(stream).await.unwrap().into_inner();
        let answer = answers.message().await.unwrap().unwrap();
        let Some(schedule_result::Result::Error(e)) = answer.result else { panic!("{answer:?}") };
        assert_eq!(e.code, Code::InvalidArgument as i32, "{reserved}: {e:?}");
        // A series template.
        let spec = proto::SeriesSpec {
            template: Some(proto::Message {
                topic: reserved.clone(),
                value: b"x".to_vec(),
                ..Default::default()
            }),
            every: Some(proto::series_spec::Every::Interval(wire(Duration::from_secs(60)))),
            ..Default::default()
        };
        let create = proto::CreateSeriesRequest { id: "s".into(), spec: Some(spec) };
        let refused = series.create_series(create).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{reserved}: {refused:?}");
        // A policy's dead-letter topic.
        let policy = proto::SetDeadLetterTopicRequest {
            topic: topic.clone(),
            all_tenants: true,
            dead_letter_topic: reserved.clone(),
            ..Default::default()
        };
        let refused = admin.set_dead_letter_topic(policy).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{reserved}: {refused:?}");
    }

    // A Kafka-native record naming the log is never parked; the record
    // after it is.
    let producer = native_producer(&broker);
    let to_log = [("hourglass-topic", log.as_str()), ("hourglass-delay", "0")];
    send_native(&producer, &ingress, "into-the-log", Some("x"), &to_log).await;
    let to_topic = [("hourglass-topic", topic.as_str()), ("hourglass-delay", "0")];
    send_native(&producer, &ingress, "after-it", Some("y"), &to_topic).await;
    let get = |id: &str| proto::GetRequest { id: id.into(), ..Default::default() };
    let mut delivered = false;
    for _ in 0..200 {
        if let Ok(m) = client.get(get("after-it")).await
            && m.into_inner().state() == State::Delivered
        {
            delivered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(delivered, "the native record after it was delivered");
    let never = client.get(get("into-the-log")).await.unwrap_err();
    assert_eq!(never.code(), Code::NotFound, "the record naming the log was refused: {never:?}");
    server.stop().await;
}
