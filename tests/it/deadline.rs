//! Deadlines against a real broker and a real store: through a broker
//! outage longer than their deadlines, and a kill -9 in the middle of it,
//! the messages past their deadline (their own, or their topic's) expire,
//! none of them is produced, and every other message arrives once.

use crate::common;

use std::{collections::HashMap, time::Duration};

use common::*;
use hourglass::proto::{self, admin_client::AdminClient, scheduler_client::SchedulerClient};
use tonic::transport::Channel;

/// `hourglass serve` over `dir`, stalling a topic after 1 s without an
/// answer (so that, while the broker is away, due messages wait in the
/// store rather than in the producer's queue).
fn serve(broker: &Broker, dir: &std::path::Path) -> Serve {
    Serve::start_with(broker, dir, &["--stall-after", "1s"])
}

async fn schedule(
    client: &mut SchedulerClient<Channel>,
    topic: &str,
    id: &str,
    due_ms: u64,
    max_lateness: Option<Duration>,
) {
    let mut r = request_at(topic, id, due_ms);
    r.max_lateness = max_lateness.map(wire);
    client.schedule(r).await.unwrap();
}

/// Each id that reached `topic`, with how many times.
async fn arrived(broker: &Broker, topic: &str, expected: usize) -> HashMap<String, usize> {
    let mut seen = HashMap::new();
    for m in consume_async(broker, topic, expected, Duration::from_secs(90), Duration::from_secs(3)).await {
        *seen.entry(m.id().to_owned()).or_default() += 1;
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_an_outage_and_a_kill_messages_past_their_deadline_expire_and_the_rest_arrive_once() {
    let mut broker = Broker::start_persistent();
    let (own, wide) = (random_name("deadline-own"), random_name("deadline-topic"));
    broker.create_topic(&own, 2).await;
    broker.create_topic(&wide, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let server = serve(&broker, dir.path());
    let mut client = server.client().await;
    // The second topic's messages that name no deadline expire 4 s late.
    let mut admin = AdminClient::new(Channel::from_shared(server.url()).unwrap().connect().await.unwrap());
    let policy = admin
        .set_max_lateness(proto::SetMaxLatenessRequest {
            topic: wide.clone(),
            all_tenants: true,
            max_lateness: Some(wire(Duration::from_secs(4))),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(policy.max_lateness, Some(wire(Duration::from_secs(4))));

    let start = now_ms();
    // Each topic: a first message that is in the producer's hands when
    // the broker goes (it stalls the topic), then those due while it is
    // away: 3 s or 4 s of lateness allowed (they expire), or 10 minutes
    // (they go out once it is back).
    let long = Some(Duration::from_secs(600));
    let (n, mut expiring, mut lasting) = (20, Vec::new(), Vec::new());
    schedule(&mut client, &own, "own-first", start + 1_500, None).await;
    schedule(&mut client, &wide, "wide-first", start + 1_500, long).await;
    for i in 0..n {
        let due = start + 3_500 + i as u64 * 10;
        let ids = [
            format!("own-short-{i}"),
            format!("own-long-{i}"),
            format!("wide-{i}"),
            format!("wide-long-{i}"),
        ];
        schedule(&mut client, &own, &ids[0], due, Some(Duration::from_secs(3))).await;
        schedule(&mut client, &own, &ids[1], due, long).await;
        schedule(&mut client, &wide, &ids[2], due, None).await;
        schedule(&mut client, &wide, &ids[3], due, long).await;
        expiring.extend([ids[0].clone(), ids[2].clone()]);
        lasting.extend([ids[1].clone(), ids[3].clone()]);
    }
    assert!(now_ms() < start + 1_000, "scheduling took too long for the timeline below");
    tokio::time::sleep(Duration::from_millis(start + 1_000 - now_ms())).await;
    broker.stop();
    // Killed while every one of them is due and the broker is away.
    tokio::time::sleep(Duration::from_millis(start + 5_000 - now_ms())).await;
    server.kill9();
    // Back once every short deadline (due + 4 s at most) has passed, the
    // broker still away: whatever the restart does first, none of them
    // is handed to the producer.
    tokio::time::sleep(Duration::from_millis(start + 8_000 - now_ms())).await;
    let server = serve(&broker, dir.path());
    tokio::time::sleep(Duration::from_millis(start + 12_000 - now_ms())).await;
    broker.resume();

    let own_seen = arrived(&broker, &own, n + 1).await;
    let wide_seen = arrived(&broker, &wide, n + 1).await;
    let mut client = server.client().await;
    for id in &lasting {
        let seen = if id.starts_with("own") { &own_seen } else { &wide_seen };
        assert_eq!(seen.get(id), Some(&1), "{id} was not past its deadline: delivered once");
    }
    for first in ["own-first", "wide-first"] {
        let seen = if first.starts_with("own") { &own_seen } else { &wide_seen };
        assert_eq!(seen.get(first), Some(&1), "{first} has no deadline, or a long one: delivered once");
    }
    for id in &expiring {
        assert!(
            !own_seen.contains_key(id) && !wide_seen.contains_key(id),
            "{id} was produced past its deadline"
        );
        let m = client
            .get(proto::GetRequest { id: id.clone(), ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(m.state(), proto::State::Expired, "{id}");
        let Some(proto::get_response::Settlement::Expired(expiry)) = m.settlement else {
            panic!("{id}: {:?}", m.settlement)
        };
        let (deadline, expired_at) = (millis(&expiry.deadline.unwrap()), millis(&expiry.expired_at.unwrap()));
        let late: i64 = if id.starts_with("own") { 3_000 } else { 4_000 };
        assert_eq!(deadline, millis(&m.deliver_at.unwrap()) + late, "{id}: its own deadline, or its topic's");
        assert!(expired_at > deadline, "{id} expired at {expired_at}, before its deadline {deadline}");
    }
    let stats = client.stats(proto::StatsRequest {}).await.unwrap().into_inner();
    assert_eq!(stats.expired, expiring.len() as u64);
    assert_eq!(stats.pending, 0);
    // An expired message is re-driven by a reschedule, and then goes out.
    let again = &expiring[0];
    client
        .reschedule(proto::RescheduleRequest {
            id: again.clone(),
            due: Some(proto::reschedule_request::Due::Delay(wire(Duration::ZERO))),
            ..Default::default()
        })
        .await
        .unwrap();
    let seen = arrived(&broker, &own, n + 2).await;
    assert_eq!(seen.get(again), Some(&1), "re-driven: delivered once");
    let stats = client.stats(proto::StatsRequest {}).await.unwrap().into_inner();
    assert_eq!(stats.expired, expiring.len() as u64 - 1, "a re-driven message leaves the expired count");
    drop(server);
}
