//! Dead-letter topics against a real broker and a real store: messages
//! past their deadline, and messages their topic refuses for good, are
//! produced to their dead-letter topic instead (their own, their topic's
//! policy's, or the server's), once each, with headers that say why, and
//! settled DEAD_LETTERED where they landed; through a broker outage and
//! two crashes, none is lost and none goes out twice.

use crate::common;

use std::{collections::HashMap, time::Duration};

use common::*;
use hourglass::proto::{self, get_response::Settlement};

/// The records of `topic`, by id, each id with every copy of it.
async fn arrived(broker: &Broker, topic: &str, expected: usize) -> HashMap<String, Vec<Received>> {
    let mut seen: HashMap<String, Vec<Received>> = HashMap::new();
    for m in consume_async(broker, topic, expected, Duration::from_secs(90), Duration::from_secs(3)).await {
        seen.entry(m.id().to_owned()).or_default().push(m);
    }
    seen
}

/// Through an outage and crashes: needs the fail points.
#[cfg(feature = "failpoints")]
mod through_crashes {
    use super::*;
    use hourglass::proto::{admin_client::AdminClient, scheduler_client::SchedulerClient};
    use tonic::transport::Channel;

    async fn schedule(
        client: &mut SchedulerClient<Channel>,
        topic: &str,
        id: &str,
        due_ms: u64,
        (max_lateness, dead_letter_topic): (Option<Duration>, &str),
    ) {
        let mut r = request_at(topic, id, due_ms);
        r.max_lateness = max_lateness.map(wire);
        r.dead_letter_topic = dead_letter_topic.to_owned();
        client.schedule(r).await.unwrap();
    }

    /// Two topics whose messages expire through an outage: one whose
    /// messages name their own dead-letter topic, one whose policy gives its
    /// messages a deadline and a dead-letter topic. The first hourglass is
    /// killed while they wait; the second, started while the broker is away,
    /// crashes at its first acknowledged produce once the broker is back
    /// (with dead letters and deliveries on their way); the third finds on
    /// the topics what the second sent and sends the rest.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn through_an_outage_and_two_crashes_expired_messages_reach_their_dead_letter_topic_once() {
        let mut broker = Broker::start_persistent();
        let [own, wide, own_dead, wide_dead] =
            ["dl-own", "dl-wide", "dl-own-dead", "dl-wide-dead"].map(random_name);
        for topic in [&own, &wide, &wide_dead] {
            broker.create_topic(topic, 2).await;
        }
        broker.create_topic(&own_dead, 1).await;
        let dir = tempfile::tempdir().unwrap();
        // A topic stalls 1 s after a produce is left unanswered, so that while
        // the broker is away due messages wait in the store, not in the
        // producer's queue.
        let stall: &[&str] = &["--stall-after", "1s"];
        let server = Serve::start_with(&broker, dir.path(), stall);
        let mut client = server.client().await;
        let mut admin =
            AdminClient::new(Channel::from_shared(server.url()).unwrap().connect().await.unwrap());
        let deadline = wire(Duration::from_secs(2));
        let (topic, all_tenants) = (wide.clone(), true);
        admin
            .set_max_lateness(proto::SetMaxLatenessRequest {
                topic,
                all_tenants,
                max_lateness: Some(deadline),
                ..Default::default()
            })
            .await
            .unwrap();
        let policy = admin
            .set_dead_letter_topic(proto::SetDeadLetterTopicRequest {
                topic: wide.clone(),
                all_tenants,
                dead_letter_topic: wide_dead.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(policy.dead_letter_topic, wide_dead);

        let start = now_ms();
        let long = (Some(Duration::from_secs(600)), "");
        let n = 20;
        let (mut dead, mut lasting) = (Vec::new(), vec!["own-first".to_owned(), "wide-first".to_owned()]);
        // In the producer's hands when the broker goes: they stall the topics.
        schedule(&mut client, &own, "own-first", start + 1_500, long).await;
        schedule(&mut client, &wide, "wide-first", start + 1_500, long).await;
        for i in 0..n {
            let due = start + 3_500 + i as u64 * 10;
            let ids = [
                format!("own-dead-{i}"),
                format!("own-long-{i}"),
                format!("wide-dead-{i}"),
                format!("wide-long-{i}"),
            ];
            schedule(&mut client, &own, &ids[0], due, (Some(Duration::from_secs(2)), &own_dead)).await;
            schedule(&mut client, &own, &ids[1], due, long).await;
            schedule(&mut client, &wide, &ids[2], due, (None, "")).await;
            schedule(&mut client, &wide, &ids[3], due, long).await;
            dead.extend([ids[0].clone(), ids[2].clone()]);
            lasting.extend([ids[1].clone(), ids[3].clone()]);
        }
        assert!(now_ms() < start + 1_000, "scheduling took too long for the timeline below");
        tokio::time::sleep(Duration::from_millis(start + 1_000 - now_ms())).await;
        broker.stop();
        tokio::time::sleep(Duration::from_millis(start + 4_500 - now_ms())).await;
        server.kill9();
        // Past every deadline (due + 2 s), the broker still away.
        tokio::time::sleep(Duration::from_millis(start + 6_000 - now_ms())).await;
        let crash = [("HOURGLASS_FAILPOINT", "dispatch-before-settle")];
        let mut second = Serve::start_env(&broker, dir.path(), stall, &crash);
        tokio::time::sleep(Duration::from_millis(start + 8_000 - now_ms())).await;
        broker.resume();
        let status =
            second.exited(Duration::from_secs(120)).expect("the second hourglass reached its fail point");
        assert!(!status.success(), "it crashed at its first acknowledged produce: {status}");
        let server = Serve::start_with(&broker, dir.path(), stall);

        let own_seen = arrived(&broker, &own, n + 1).await;
        let wide_seen = arrived(&broker, &wide, n + 1).await;
        let own_dead_seen = arrived(&broker, &own_dead, n).await;
        let wide_dead_seen = arrived(&broker, &wide_dead, n).await;
        for id in &lasting {
            let seen = if id.starts_with("own") { &own_seen } else { &wide_seen };
            assert_eq!(seen.get(id).map(Vec::len), Some(1), "{id} was not past its deadline: delivered once");
        }
        let mut client = server.client().await;
        for id in &dead {
            let (topic, to, seen) = if id.starts_with("own") {
                (&own, &own_dead, &own_dead_seen)
            } else {
                (&wide, &wide_dead, &wide_dead_seen)
            };
            assert!(
                !own_seen.contains_key(id) && !wide_seen.contains_key(id),
                "{id} was produced past its deadline"
            );
            let copies = seen.get(id).map_or(&[][..], Vec::as_slice);
            assert_eq!(copies.len(), 1, "{id} is on its dead-letter topic {to} once");
            let record = &copies[0];
            assert_eq!(record.header("hourglass-dead-letter-reason"), Some("expired"), "{id}");
            assert_eq!(record.header("hourglass-original-topic"), Some(topic.as_str()), "{id}");
            assert_eq!(record.value, id.as_bytes(), "{id}: its value as it was");
            let m = client
                .get(proto::GetRequest { id: id.clone(), ..Default::default() })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(m.state(), proto::State::DeadLettered, "{id}");
            let Some(Settlement::DeadLettered(letter)) = m.settlement else {
                panic!("{id}: {:?}", m.settlement)
            };
            assert_eq!(
                (&letter.topic, letter.partition, letter.offset),
                (to, record.partition, record.offset),
                "{id}"
            );
            assert_eq!(letter.reason, "expired");
            let deadline = millis(&letter.deadline.unwrap());
            assert_eq!(
                deadline,
                millis(&m.deliver_at.unwrap()) + 2_000,
                "{id}: its own deadline, or its topic's"
            );
            assert_eq!(record.header("hourglass-deadline-ms"), Some(deadline.to_string().as_str()), "{id}");
        }
        let stats = client.stats(proto::StatsRequest {}).await.unwrap().into_inner();
        assert_eq!((stats.dead_lettered, stats.expired, stats.pending), (dead.len() as u64, 0, 0));
        // A dead-lettered message is re-driven to its own topic by a
        // reschedule; its deadline counts from its new due time.
        let again = &dead[0];
        let now = Some(proto::reschedule_request::Due::Delay(wire(Duration::ZERO)));
        client
            .reschedule(proto::RescheduleRequest { id: again.clone(), due: now, ..Default::default() })
            .await
            .unwrap();
        let seen = arrived(&broker, &own, n + 2).await;
        assert_eq!(seen.get(again).map(Vec::len), Some(1), "re-driven: delivered once");
        let stats = client.stats(proto::StatsRequest {}).await.unwrap().into_inner();
        assert_eq!(stats.dead_lettered, dead.len() as u64 - 1, "a re-driven message leaves the count");
        drop(server);
    }
}

/// A message its topic refuses for good (the topic was deleted) goes to
/// the server's `--dead-letter-topic`, with the error; one that the
/// dead-letter topic refuses too (too large for both) ends FAILED, saying
/// so; messages to a healthy topic go on meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_their_topic_refuses_go_to_the_servers_dead_letter_topic_with_the_error() {
    let dead_topic = random_name("dl-server");
    let to = dead_topic.clone();
    let tweak = move |c: &mut hourglass::config::Config| {
        c.max_delivery_attempts = 2;
        c.fail_after = Duration::ZERO.into();
        c.dead_letter_topic = Some(to.clone());
        c.kafka_properties.insert("message.max.bytes".into(), "1000000".into());
    };
    let TestBed { broker, topic: healthy, dir, server } =
        TestBed::start_with("dl-healthy", 1, tweak.clone()).await;
    broker.create_topic(&dead_topic, 1).await;
    let gone = random_name("dl-gone");
    broker.create_topic(&gone, 1).await;
    // The server looks a topic it does not know up again at most once a
    // second.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let mut client = server.client().await;
    let mut refused = Vec::new();
    for i in 0..3 {
        let r = client.schedule(request(&gone, &format!("gone-{i}"), Duration::from_secs(3))).await.unwrap();
        refused.push(r.into_inner().id);
    }
    let big = request(&healthy, &"x".repeat(1_000_100), Duration::from_secs(3));
    let big = client.schedule(big).await.unwrap().into_inner().id;
    for i in 0..5 {
        client.schedule(request(&healthy, &format!("h{i}"), Duration::from_secs(3))).await.unwrap();
    }
    // Deleted while hourglass is down: its producer never saw the topic.
    server.stop().await;
    broker.delete_topic(&gone).await;
    let mut config = config(&broker, dir.path());
    tweak(&mut config);
    let server = Hourglass::start(config).await;
    let mut client = server.client().await;

    let got = consume_async(&broker, &healthy, 5, Duration::from_secs(60), Duration::from_secs(1)).await;
    assert_eq!(got.len(), 5, "the healthy topic's messages arrive meanwhile");
    let letters = arrived(&broker, &dead_topic, refused.len()).await;
    for id in &refused {
        let copies = letters.get(id).map_or(&[][..], Vec::as_slice);
        assert_eq!(copies.len(), 1, "{id} is on the dead-letter topic once: {:?}", letters.keys());
        let record = &copies[0];
        assert_eq!(record.header("hourglass-dead-letter-reason"), Some("failed"));
        assert_eq!(record.header("hourglass-original-topic"), Some(gone.as_str()));
        assert!(
            record.header("hourglass-dead-letter-error").unwrap().contains("Unknown topic"),
            "{record:?}"
        );
        let m = client
            .get(proto::GetRequest { id: id.clone(), ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(m.state(), proto::State::DeadLettered, "{id}");
        let Some(Settlement::DeadLettered(letter)) = m.settlement else { panic!("{id}: {:?}", m.settlement) };
        assert_eq!((letter.topic.as_str(), letter.offset), (dead_topic.as_str(), record.offset));
        assert_eq!(letter.reason, "failed");
        assert!(letter.error.contains("Unknown topic"), "{}", letter.error);
    }
    // Too large for its topic, and so for the dead-letter topic too.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let big = loop {
        let m = client
            .get(proto::GetRequest { id: big.clone(), ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        if m.state() != proto::State::Pending || std::time::Instant::now() > deadline {
            break m;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(big.state(), proto::State::Failed, "{big:?}");
    assert!(big.last_error.contains("its dead-letter topic"), "{}", big.last_error);
    let stats = client.stats(proto::StatsRequest {}).await.unwrap().into_inner();
    assert_eq!((stats.dead_lettered, stats.failed), (refused.len() as u64, 1));
    server.stop().await;
}
