//! Tenants, against a real server, broker and store: what one tenant's token
//! can learn of, block or touch of another's messages. Nothing: each tenant
//! has its own id space, List and Stats show only what the caller sees, a
//! check and the change it guards are one step, a revoked token stops
//! working on streams it opened, and a token that covers nothing gets
//! nothing from any RPC of the proto.

use crate::common;

use std::{path::PathBuf, time::Duration};

use common::*;
use hourglass::{
    auth::Bearer,
    proto::{self, CancelOutcome, State, scheduler_client::SchedulerClient},
};
use tonic::{Code, service::interceptor::InterceptedService, transport::Channel};

type Client = SchedulerClient<InterceptedService<Channel, Bearer>>;

/// A server with three tokens: `orders` and `billing`, each covering its
/// own topics, and `nobody`, covering a topic that does not exist.
struct Tenants {
    broker: Broker,
    dir: tempfile::TempDir,
    tokens: PathBuf,
    server: Hourglass,
    /// The orders tenant's topic, and the billing tenant's.
    orders: String,
    billing: String,
}

fn tokens_file(orders_prefix: &str, billing_prefix: &str, with_orders: bool) -> String {
    let mut text = String::new();
    if with_orders {
        text += &format!(
            "[[token]]\nname = \"orders\"\ntoken = \"orders-token\"\ntopics = [\"{orders_prefix}.*\"]\n\n"
        );
    }
    text += &format!(
        "[[token]]\nname = \"billing\"\ntoken = \"billing-token\"\ntopics = [\"{billing_prefix}.*\"]\n\n\
         [[token]]\nname = \"nobody\"\ntoken = \"nobody-token\"\ntopics = [\"no-such-topic-anywhere\"]\n"
    );
    text
}

impl Tenants {
    async fn start() -> Tenants {
        Self::start_with(|_| {}).await
    }

    async fn start_with(tweak: impl FnOnce(&mut hourglass::config::Config)) -> Tenants {
        let broker = Broker::start();
        let (orders_prefix, billing_prefix) = (random_name("orders"), random_name("billing"));
        let (orders, billing) = (format!("{orders_prefix}.events"), format!("{billing_prefix}.events"));
        broker.create_topic(&orders, 1).await;
        broker.create_topic(&billing, 1).await;
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens.toml");
        std::fs::write(&tokens, tokens_file(&orders_prefix, &billing_prefix, true)).unwrap();
        let mut config = config(&broker, &dir.path().join("data"));
        config.auth_tokens = Some(tokens.clone());
        tweak(&mut config);
        let server = Hourglass::start(config).await;
        Tenants { broker, dir, tokens, server, orders, billing }
    }

    async fn client(&self, token: &str) -> Client {
        let channel = Channel::from_shared(format!("http://{}", self.server.addr)).unwrap();
        let mut last = None;
        for _ in 0..100 {
            match channel.clone().connect().await {
                Ok(channel) => {
                    return SchedulerClient::with_interceptor(channel, Bearer::new(Some(token)).unwrap());
                }
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("cannot connect: {last:?}");
    }
}

fn with_id(mut request: proto::ScheduleRequest, id: &str) -> proto::ScheduleRequest {
    request.id = Some(id.into());
    request
}

fn later() -> Duration {
    Duration::from_secs(3600)
}

fn in_an_hour() -> Option<proto::reschedule_request::Due> {
    Some(proto::reschedule_request::Due::Delay(prost_types::Duration { seconds: 3600, nanos: 0 }))
}

fn now_due() -> Option<proto::reschedule_request::Due> {
    Some(proto::reschedule_request::Due::Delay(prost_types::Duration { seconds: 0, nanos: 0 }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_stats_show_only_what_the_token_covers() {
    let t = Tenants::start().await;
    let (mut orders, mut billing, mut nobody) =
        (t.client("orders-token").await, t.client("billing-token").await, t.client("nobody-token").await);
    for i in 0..3 {
        orders.schedule(with_id(request(&t.orders, "o", later()), &format!("o-{i}"))).await.unwrap();
    }
    for i in 0..2 {
        billing.schedule(with_id(request(&t.billing, "b", later()), &format!("b-{i}"))).await.unwrap();
    }
    let list = |topic: &str| proto::ListRequest { topic: topic.into(), ..Default::default() };

    let page = orders.list(list("")).await.unwrap().into_inner();
    let ids: Vec<_> = page.messages.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["o-0", "o-1", "o-2"], "only its own: {page:?}");
    assert!(page.messages.iter().all(|m| m.topic == t.orders && m.tenant == "orders"));
    let status = orders.list(list(&t.billing)).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "a filter outside the grant: {status:?}");
    assert_eq!(billing.list(list("")).await.unwrap().into_inner().messages.len(), 2);
    assert!(nobody.list(list("")).await.unwrap().into_inner().messages.is_empty());

    let stats = |s: proto::StatsResponse| (s.pending, s.delivered, s.cancelled, s.failed);
    assert_eq!(stats(orders.stats(proto::StatsRequest {}).await.unwrap().into_inner()), (3, 0, 0, 0));
    assert_eq!(stats(billing.stats(proto::StatsRequest {}).await.unwrap().into_inner()), (2, 0, 0, 0));
    let empty = nobody.stats(proto::StatsRequest {}).await.unwrap().into_inner();
    assert_eq!(stats(empty.clone()), (0, 0, 0, 0));
    assert_eq!((empty.store_bytes, empty.dispatching), (0, 0), "no figures of the whole server");

    orders.cancel(proto::CancelRequest { id: "o-0".into(), ..Default::default() }).await.unwrap();
    assert_eq!(stats(orders.stats(proto::StatsRequest {}).await.unwrap().into_inner()), (2, 0, 1, 0));
    assert_eq!(stats(billing.stats(proto::StatsRequest {}).await.unwrap().into_inner()), (2, 0, 0, 0));
    t.server.stop().await;
}

/// Two tenants label their messages alike (and use the same ids): a
/// tenant's selector lists and cancels its own messages only, and a topic
/// filter outside its grant is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_label_selector_never_reaches_another_tenants_messages() {
    let t = Tenants::start().await;
    let (mut orders, mut billing) = (t.client("orders-token").await, t.client("billing-token").await);
    let labelled = |topic: &str, id: &str| {
        let mut r = with_id(request(topic, "v", later()), id);
        r.labels.insert("order".into(), "42".into());
        r
    };
    for i in 0..5 {
        orders.schedule(labelled(&t.orders, &format!("m-{i}"))).await.unwrap();
        billing.schedule(labelled(&t.billing, &format!("m-{i}"))).await.unwrap();
    }
    let selected = proto::ListRequest { selector: "order=42".into(), ..Default::default() };
    let page = orders.list(selected.clone()).await.unwrap().into_inner();
    assert_eq!(page.messages.len(), 5);
    assert!(page.messages.iter().all(|m| m.tenant == "orders" && m.labels["order"] == "42"), "{page:?}");

    let cancel = |topic: &str| proto::CancelMatchingRequest {
        selector: "order=42".into(),
        topic: topic.into(),
        ..Default::default()
    };
    let status = orders.cancel_matching(cancel(&t.billing)).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    let done = orders.cancel_matching(cancel("")).await.unwrap().into_inner();
    assert_eq!((done.cancelled, done.not_cancelled.len(), done.next_page_token.as_str()), (5, 0, ""));
    assert!(orders.list(selected.clone()).await.unwrap().into_inner().messages.is_empty());
    let theirs = billing.list(selected).await.unwrap().into_inner();
    assert_eq!(theirs.messages.len(), 5, "the other tenant's messages are untouched");
    for i in 0..5 {
        let got = billing
            .get(proto::GetRequest { id: format!("m-{i}"), ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(got.state(), State::Pending);
    }
    let again = orders.cancel_matching(cancel("")).await.unwrap().into_inner();
    assert_eq!((again.cancelled, again.not_cancelled.len()), (0, 0), "a repeat finds nothing pending");
    t.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tenant_has_its_own_ids_and_cannot_probe_anothers() {
    // Each delivered body is read back.
    let t = Tenants::start_with(|c| c.keep_delivered_bodies = true).await;
    let (mut orders, mut billing) = (t.client("orders-token").await, t.client("billing-token").await);

    // The same id, chosen by both: two messages, each delivered to its own
    // topic with its tenant named.
    let now = Duration::ZERO;
    let first = orders.schedule(with_id(request(&t.orders, "from-orders", now), "shared-1")).await.unwrap();
    let second = billing.schedule(with_id(request(&t.billing, "from-billing", now), "shared-1")).await;
    let second = second.expect("the other tenant's id does not block this one").into_inner();
    assert!(!first.into_inner().duplicate && !second.duplicate);
    for (topic, value, tenant) in
        [(&t.orders, "from-orders", "orders"), (&t.billing, "from-billing", "billing")]
    {
        let got = consume_async(&t.broker, topic, 1, Duration::from_secs(30), Duration::from_secs(1)).await;
        assert_eq!(got.len(), 1, "{topic}: {got:?}");
        assert_eq!((got[0].id(), got[0].value.as_slice()), ("shared-1", value.as_bytes()));
        assert_eq!(got[0].header("hourglass-tenant"), Some(tenant));
    }
    let mine = billing
        .get(proto::GetRequest { id: "shared-1".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(mine.message.unwrap().value, b"from-billing");

    // An id only the other tenant has: as if it did not exist, and nothing
    // in the answer names the other tenant's topic.
    orders.schedule(with_id(request(&t.orders, "secret", later()), "only-orders")).await.unwrap();
    let probe =
        billing.get(proto::GetRequest { id: "only-orders".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!(probe.code(), Code::NotFound, "{probe:?}");
    let outcome = billing
        .cancel(proto::CancelRequest { id: "only-orders".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(outcome.outcome(), CancelOutcome::NotFound);
    let moved = billing
        .reschedule(proto::RescheduleRequest {
            id: "only-orders".into(),
            due: now_due(),
            ..Default::default()
        })
        .await;
    let moved = moved.unwrap_err();
    assert_eq!(moved.code(), Code::NotFound, "{moved:?}");
    for status in [&probe, &moved] {
        assert!(!status.message().contains(&t.orders), "a topic leaked: {}", status.message());
    }
    // The billing tenant may now take that id for itself.
    billing.schedule(with_id(request(&t.billing, "b", later()), "only-orders")).await.unwrap();
    let untouched = orders
        .get(proto::GetRequest { id: "only-orders".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((untouched.state(), untouched.message.unwrap().value), (State::Pending, b"secret".to_vec()));
    t.server.stop().await;
}

/// The attacker cancels and reschedules ids while the victim schedules
/// them: the check of the caller's rights and the change it guards are one
/// step of the writer, so not one of the victim's messages is touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_racing_another_tenants_schedule_never_touches_it() {
    let t = Tenants::start().await;
    let ids: Vec<String> = (0..300).map(|i| format!("race-{i}")).collect();
    let mut attackers = Vec::new();
    for chunk in ids.chunks(75) {
        let (mut billing, chunk) = (t.client("billing-token").await, chunk.to_vec());
        attackers.push(tokio::spawn(async move {
            for _round in 0..20 {
                for id in &chunk {
                    let _ =
                        billing.cancel(proto::CancelRequest { id: id.clone(), ..Default::default() }).await;
                    let _ = billing
                        .reschedule(proto::RescheduleRequest {
                            id: id.clone(),
                            due: now_due(),
                            ..Default::default()
                        })
                        .await;
                }
            }
        }));
    }
    let mut orders = t.client("orders-token").await;
    let mut dues = Vec::new();
    for id in &ids {
        let s = orders.schedule(with_id(request(&t.orders, "v", later()), id)).await.unwrap().into_inner();
        dues.push(s.deliver_at.unwrap());
    }
    for attacker in attackers {
        attacker.await.unwrap();
    }
    for (id, due) in ids.iter().zip(dues) {
        let got = orders
            .get(proto::GetRequest { id: id.clone(), ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(got.state(), State::Pending, "{id} was touched by another tenant: {got:?}");
        assert_eq!(got.deliver_at, Some(due), "{id} was moved by another tenant");
    }
    t.server.stop().await;
}

/// A token revoked by a reload of the tokens file (SIGHUP) schedules
/// nothing more on a stream it opened before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_cannot_go_on_scheduling_on_its_open_stream() {
    let t = Tenants::start().await;
    let mut orders = t.client("orders-token").await;
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let mut answers =
        orders.schedule_stream(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
    tx.send(with_id(request(&t.orders, "before", later()), "before-revoke")).await.unwrap();
    assert!(answers.message().await.unwrap().is_some(), "scheduled while the token was valid");

    // Revoke it: the file without the orders token, and SIGHUP to this
    // process, whose server reloads it.
    let (orders_prefix, billing_prefix) = (
        t.orders.strip_suffix(".events").unwrap().to_owned(),
        t.billing.strip_suffix(".events").unwrap().to_owned(),
    );
    std::fs::write(&t.tokens, tokens_file(&orders_prefix, &billing_prefix, false)).unwrap();
    // SAFETY: sends a signal to this process; its server handles SIGHUP.
    assert_eq!(unsafe { libc::kill(libc::getpid(), libc::SIGHUP) }, 0);
    let mut revoked = false;
    for _ in 0..100 {
        let probe = orders.get(proto::GetRequest { id: "before-revoke".into(), ..Default::default() }).await;
        if probe.is_err_and(|s| s.code() == Code::Unauthenticated) {
            revoked = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(revoked, "the reload did not revoke the token for new calls");

    let _ = tx.send(with_id(request(&t.orders, "after", later()), "after-revoke")).await;
    let end =
        tokio::time::timeout(Duration::from_secs(10), answers.message()).await.expect("the stream ends");
    let status = end.expect_err("the stream ends with an error, not an answer");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    let mut billing = t.client("billing-token").await;
    let stats = billing.stats(proto::StatsRequest {}).await.unwrap().into_inner();
    assert_eq!(stats.pending, 0, "billing sees none of it");
    drop(tx);
    t.server.stop().await;
    // Stored: only what came before the revocation. Read back through a
    // server without authentication over the same store.
    let config = config(&t.broker, &t.dir.path().join("data"));
    let open = Hourglass::start(config).await;
    let mut admin = open.client().await;
    let page = admin.list(proto::ListRequest::default()).await.unwrap().into_inner();
    let ids: Vec<_> = page.messages.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["before-revoke"], "{page:?}");
    open.stop().await;
}

/// The tokens file replaced on disk, as the kubelet updates a mounted
/// Secret (a new file moved over the old), with no signal: a file that
/// does not parse changes nothing; a good one takes effect by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tokens_file_replaced_on_disk_takes_effect_without_a_signal() {
    let t = Tenants::start().await;
    let mut orders = t.client("orders-token").await;
    let get = proto::GetRequest { id: "nothing".into(), ..Default::default() };
    let answered = |r: Result<tonic::Response<proto::GetResponse>, tonic::Status>| match r {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    };
    assert_eq!(answered(orders.get(get.clone()).await), Code::NotFound, "the token is let in");
    let replace = |text: &str| {
        let next = t.dir.path().join("tokens.next");
        std::fs::write(&next, text).unwrap();
        std::fs::rename(&next, &t.tokens).unwrap();
    };

    replace("[[token]]\nname = \"broken\"\n");
    // Longer than the file is looked at: the broken file was seen.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(answered(orders.get(get.clone()).await), Code::NotFound, "a broken file changes nothing");

    let (orders_prefix, billing_prefix) = (
        t.orders.strip_suffix(".events").unwrap().to_owned(),
        t.billing.strip_suffix(".events").unwrap().to_owned(),
    );
    replace(&tokens_file(&orders_prefix, &billing_prefix, false));
    let mut revoked = false;
    for _ in 0..100 {
        if answered(orders.get(get.clone()).await) == Code::Unauthenticated {
            revoked = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(revoked, "the token is still let in 10 s after the file left it out");
    let mut billing = t.client("billing-token").await;
    assert_eq!(answered(billing.get(get).await), Code::NotFound, "the other tokens stay");
    t.server.stop().await;
}

/// Every RPC of the proto, called with a token that covers no topic
/// anybody uses, while another tenant has messages: none answers with any
/// of them. A new RPC fails this test until it is given a case here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_gives_a_token_that_covers_nothing_nothing() {
    use prost::Message as _;
    let t = Tenants::start().await;
    let (mut orders, mut nobody) = (t.client("orders-token").await, t.client("nobody-token").await);
    let mut victim = with_id(request(&t.orders, "secret", later()), "victim");
    victim.labels.insert("order".into(), "42".into());
    orders.schedule(victim).await.unwrap();
    orders.schedule(with_id(request(&t.orders, "secret", Duration::ZERO), "delivered")).await.unwrap();
    consume_async(&t.broker, &t.orders, 1, Duration::from_secs(30), Duration::ZERO).await;

    let set = prost_types::FileDescriptorSet::decode(hourglass::proto::FILE_DESCRIPTOR_SET).unwrap();
    let service = set
        .file
        .iter()
        .flat_map(|f| &f.service)
        .find(|s| s.name() == "Scheduler")
        .expect("the Scheduler service");
    let mut checked = Vec::new();
    for method in &service.method {
        let name = method.name();
        match name {
            "Schedule" => {
                let status = nobody.schedule(request(&t.orders, "x", later())).await.unwrap_err();
                assert_eq!(status.code(), Code::PermissionDenied);
            }
            "ScheduleBatch" => {
                let batch = proto::ScheduleBatchRequest { requests: vec![request(&t.orders, "x", later())] };
                let results = nobody.schedule_batch(batch).await.unwrap().into_inner().results;
                assert!(
                    matches!(&results[0].result, Some(proto::schedule_result::Result::Error(e)) if e.code == Code::PermissionDenied as i32)
                );
            }
            "ScheduleStream" => {
                let requests = tokio_stream::iter(vec![request(&t.orders, "x", later())]);
                let mut answers = nobody.schedule_stream(requests).await.unwrap().into_inner();
                let answer = answers.message().await.unwrap().unwrap();
                assert!(
                    matches!(&answer.result, Some(proto::schedule_result::Result::Error(e)) if e.code == Code::PermissionDenied as i32)
                );
            }
            "Cancel" => {
                let outcome = nobody
                    .cancel(proto::CancelRequest { id: "victim".into(), ..Default::default() })
                    .await
                    .unwrap()
                    .into_inner();
                assert_eq!(outcome.outcome(), CancelOutcome::NotFound);
            }
            "Reschedule" => {
                let request =
                    proto::RescheduleRequest { id: "victim".into(), due: in_an_hour(), ..Default::default() };
                assert_eq!(nobody.reschedule(request).await.unwrap_err().code(), Code::NotFound);
            }
            "Get" => {
                for id in ["victim", "delivered"] {
                    let status = nobody
                        .get(proto::GetRequest { id: id.into(), ..Default::default() })
                        .await
                        .unwrap_err();
                    assert_eq!(status.code(), Code::NotFound, "{id}");
                }
            }
            "List" => {
                let page = nobody.list(proto::ListRequest::default()).await.unwrap().into_inner();
                assert!(page.messages.is_empty() && page.next_page_token.is_empty(), "{page:?}");
            }
            "Stats" => {
                let stats = nobody.stats(proto::StatsRequest {}).await.unwrap().into_inner();
                assert_eq!(
                    (stats.pending, stats.delivered, stats.cancelled, stats.failed, stats.dispatching),
                    (0, 0, 0, 0, 0)
                );
                assert!(stats.oldest_overdue.is_none() && stats.store_bytes == 0, "{stats:?}");
            }
            "CancelMatching" => {
                let request =
                    proto::CancelMatchingRequest { selector: "order=42".into(), ..Default::default() };
                let done = nobody.cancel_matching(request).await.unwrap().into_inner();
                assert_eq!((done.cancelled, done.not_cancelled.len()), (0, 0), "{done:?}");
                let request = proto::CancelMatchingRequest {
                    selector: "order=42".into(),
                    topic: t.orders.clone(),
                    ..Default::default()
                };
                let status = nobody.cancel_matching(request).await.unwrap_err();
                assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
            }
            "Forecast" => {
                // The next two hours: the victim is due in one.
                let window = |topic: &str| proto::ForecastRequest {
                    topic: topic.to_owned(),
                    to: Some(timestamp(now_ms() + 2 * 3_600_000)),
                    ..Default::default()
                };
                let theirs = orders.forecast(window("")).await.unwrap().into_inner();
                assert_eq!(theirs.totals.iter().sum::<u64>(), 1, "the owner counts its victim: {theirs:?}");
                let none = nobody.forecast(window("")).await.unwrap().into_inner();
                assert!(none.topics.is_empty() && none.totals.iter().all(|n| *n == 0), "{none:?}");
                let status = nobody.forecast(window(&t.orders)).await.unwrap_err();
                assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
            }
            other => panic!("RPC {other} has no case in this test: give it one"),
        }
        checked.push(name.to_owned());
    }
    assert_eq!(checked.len(), 10, "{checked:?}");
    let victim = orders
        .get(proto::GetRequest { id: "victim".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(victim.state(), State::Pending, "untouched");
    t.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_watches_are_bounded_and_freed_when_they_end() {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let t = Tenants::start_with(|c| c.max_health_watches = 3).await;
    let channel = Channel::from_shared(format!("http://{}", t.server.addr)).unwrap().connect().await.unwrap();
    let mut health = HealthClient::new(channel);
    let watch = || HealthCheckRequest { service: String::new() };
    let mut open = Vec::new();
    for _ in 0..3 {
        let mut stream = health.watch(watch()).await.expect("a watch within the bound").into_inner();
        stream.message().await.unwrap().expect("the current status");
        open.push(stream);
    }
    let refused = health.watch(watch()).await.map(|_| ()).unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(health.check(watch()).await.is_ok(), "Check is not bounded");
    open.pop();
    let mut again = None;
    for _ in 0..50 {
        match health.watch(watch()).await {
            Ok(stream) => {
                again = Some(stream);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    assert!(again.is_some(), "a place is free again once a watch ends");
    t.server.stop().await;
}

/// Kafka-native schedules in cluster mode get the grant their ingress
/// topic is mapped to, as a caller with that token would: they live in its
/// tenant's id space, may use its topics only, and can neither see nor
/// cancel another tenant's messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ingress_topic_schedules_with_its_grant_and_reaches_no_other_tenant() {
    let ingress = random_name("orders-ingress");
    let (mapped, log) = (format!("{ingress}=orders"), random_name("hourglass-log"));
    let t = Tenants::start_with(move |c| {
        c.cluster = true;
        c.cluster_key_file = Some(hourglass_testkit::cluster_key_file().unwrap());
        c.log_topic = log;
        c.log_partitions = 2;
        c.ingress = Some(mapped);
    })
    .await;
    an_ingress_topic_reaches_no_other_tenant(t, &ingress).await;
}

/// The same standalone: the ingress needs no cluster, and its grant holds
/// as much.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_an_ingress_topic_schedules_with_its_grant_and_reaches_no_other_tenant() {
    let ingress = random_name("orders-ingress");
    let mapped = format!("{ingress}=orders");
    let t = Tenants::start_with(move |c| {
        c.shards = 2;
        c.ingress = Some(mapped);
    })
    .await;
    an_ingress_topic_reaches_no_other_tenant(t, &ingress).await;
}

async fn an_ingress_topic_reaches_no_other_tenant(t: Tenants, ingress: &str) {
    let (mut orders, mut billing) = (t.client("orders-token").await, t.client("billing-token").await);
    billing.schedule(with_id(request(&t.billing, "theirs", later()), "shared")).await.unwrap();

    let producer = native_producer(&t.broker);
    let (o, b) = (t.orders.as_str(), t.billing.as_str());
    send_native(&producer, ingress, "mine", Some("v"), &[("hourglass-topic", o), ("hourglass-delay", "1h")])
        .await;
    // Another tenant's topic: refused, as the orders token is refused it.
    send_native(&producer, ingress, "stolen", Some("v"), &[("hourglass-topic", b), ("hourglass-delay", "0")])
        .await;
    // A tombstone cancels the orders tenant's own "shared", which it has not.
    send_native(&producer, ingress, "shared", None, &[]).await;
    send_native(&producer, ingress, "last", Some("v"), &[("hourglass-topic", o), ("hourglass-delay", "1h")])
        .await;

    let started = std::time::Instant::now();
    while orders.get(proto::GetRequest { id: "last".into(), ..Default::default() }).await.is_err() {
        assert!(started.elapsed() < Duration::from_secs(30), "the ingress topic was not read");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mine =
        orders.get(proto::GetRequest { id: "mine".into(), ..Default::default() }).await.unwrap().into_inner();
    assert_eq!((mine.state(), mine.tenant.as_str()), (State::Pending, "orders"), "{mine:?}");
    for id in ["mine", "stolen"] {
        let status =
            billing.get(proto::GetRequest { id: id.into(), ..Default::default() }).await.unwrap_err();
        assert_eq!(status.code(), Code::NotFound, "{id} from billing's side: {status:?}");
    }
    let status =
        orders.get(proto::GetRequest { id: "stolen".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "refused, it parked nothing: {status:?}");
    let shared = billing
        .get(proto::GetRequest { id: "shared".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(shared.state(), State::Pending, "another tenant's message is untouched: {shared:?}");
    let refused = hourglass::metrics::INGRESS_RECORDS.with_label_values(&[ingress, "refused"]).get();
    assert_eq!(refused, 1, "the record for billing's topic");
    let delivered = consume_async(&t.broker, &t.billing, 1, Duration::from_secs(2), Duration::ZERO).await;
    assert!(delivered.is_empty(), "nothing reached billing's topic: {delivered:?}");
    t.server.stop().await;
}

/// An operator (`admin = "all"`) sees every tenant's messages on its
/// topics, with the server's own figures, names another tenant's message
/// or policy by its tenant, and acts on that one; a tenant's token can name
/// no one else's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_sees_and_acts_across_tenants_and_a_tenant_cannot() {
    use proto::admin_client::AdminClient;
    let broker = Broker::start();
    let prefix = random_name("acme");
    let topic = format!("{prefix}.events");
    broker.create_topic(&topic, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let tokens = acme_and_ops(dir.path(), &[&format!("{prefix}.*")]);
    let mut config = config(&broker, &dir.path().join("data"));
    config.auth_tokens = Some(tokens);
    let server = Hourglass::start(config).await;
    let channel = Channel::from_shared(format!("http://{}", server.addr)).unwrap().connect().await.unwrap();
    let bearer = |token: &str| Bearer::new(Some(token)).unwrap();
    let (acme_token, ops_token) = (ACME_TOKEN, OPS_TOKEN);
    let mut acme = SchedulerClient::with_interceptor(channel.clone(), bearer(acme_token));
    let mut ops = SchedulerClient::with_interceptor(channel.clone(), bearer(ops_token));
    for id in ["a-1", "a-2", "a-3"] {
        acme.schedule(with_id(request(&topic, id, later()), id)).await.unwrap();
    }

    // It sees them, with the server's own figures.
    let page = ops.list(proto::ListRequest::default()).await.unwrap().into_inner();
    let seen: Vec<_> = page.messages.iter().map(|m| (m.id.as_str(), m.tenant.as_str())).collect();
    assert_eq!(seen, [("a-1", "acme"), ("a-2", "acme"), ("a-3", "acme")]);
    let stats = ops.stats(proto::StatsRequest {}).await.unwrap().into_inner();
    assert_eq!(stats.pending, 3);
    assert!(stats.store_bytes > 0, "the server's own figures: {stats:?}");
    let theirs = |id: &str| proto::GetRequest { id: id.into(), tenant: "acme".into() };
    let got = ops.get(theirs("a-1")).await.unwrap().into_inner();
    assert_eq!(got.state(), State::Pending);
    // Without the tenant, the id is its own: none.
    let own = ops.get(proto::GetRequest { id: "a-1".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!(own.code(), Code::NotFound);
    // It acts on that one.
    let cancel = proto::CancelRequest { id: "a-1".into(), tenant: "acme".into(), ..Default::default() };
    assert_eq!(ops.cancel(cancel).await.unwrap().into_inner().outcome(), CancelOutcome::Cancelled);
    let moved = proto::RescheduleRequest { id: "a-2".into(), tenant: "acme".into(), due: now_due() };
    ops.reschedule(moved).await.unwrap();
    let state = |m: proto::GetResponse| m.state();
    let own = |id: &str| proto::GetRequest { id: id.into(), ..Default::default() };
    assert_eq!(state(acme.get(own("a-1")).await.unwrap().into_inner()), State::Cancelled);

    // A tenant names no one else.
    let probe = proto::GetRequest { id: "a-1".into(), tenant: "ops".into() };
    assert_eq!(acme.get(probe).await.unwrap_err().code(), Code::PermissionDenied);
    let cancel = proto::CancelRequest { id: "x".into(), tenant: "ops".into(), ..Default::default() };
    assert_eq!(acme.cancel(cancel).await.unwrap_err().code(), Code::PermissionDenied);
    let moved = proto::RescheduleRequest { id: "x".into(), tenant: "ops".into(), due: in_an_hour() };
    assert_eq!(acme.reschedule(moved).await.unwrap_err().code(), Code::PermissionDenied);
    let stats = acme.stats(proto::StatsRequest {}).await.unwrap().into_inner();
    assert_eq!(stats.store_bytes, 0, "a tenant gets no server figures");

    // Policies: the operator resumes the tenant's own pause by naming it.
    let mut acme_admin = AdminClient::with_interceptor(channel.clone(), bearer(acme_token));
    let mut ops_admin = AdminClient::with_interceptor(channel.clone(), bearer(ops_token));
    let policy = |tenant: &str| proto::TopicPolicyRequest {
        topic: topic.clone(),
        tenant: tenant.into(),
        ..Default::default()
    };
    acme_admin.pause_topic(policy("")).await.unwrap();
    let resumed = ops_admin.resume_topic(policy("acme")).await.unwrap().into_inner();
    assert_eq!((resumed.tenant.as_str(), resumed.paused), ("acme", false), "{resumed:?}");
    let mine = acme_admin.get_topic_policy(policy("")).await.unwrap().into_inner();
    assert!(!mine.paused, "the operator's resume reached acme's own policy: {mine:?}");
    assert!(mine.updated_by.is_empty(), "which operator changed it is not the tenant's to see: {mine:?}");
    let refused = acme_admin.pause_topic(policy("ops")).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    server.stop().await;
}

/// Where a forecast stops counting is the caller's own information: with a
/// walk cut at three entries, a tenant behind five of the operator's
/// messages still counts its two, whole; the operator, who sees all seven,
/// is told where its count stopped.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forecast_cut_never_falls_on_another_tenants_messages() {
    let broker = Broker::start();
    let topic = random_name("forecast-cut");
    broker.create_topic(&topic, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let tokens = acme_and_ops(dir.path(), &[&topic]);
    let tokens = tokens.to_str().unwrap();
    let server = Serve::start_env(
        &broker,
        &dir.path().join("data"),
        &["--auth-tokens", tokens],
        &[("HOURGLASS_FAILPOINT", "forecast-short@1..1000")],
    );
    let channel = Channel::from_shared(server.url()).unwrap().connect().await.unwrap();
    let client =
        |token: &str| SchedulerClient::with_interceptor(channel.clone(), Bearer::new(Some(token)).unwrap());
    let (mut acme, mut ops) = (client(ACME_TOKEN), client(OPS_TOKEN));
    let start = now_ms() + 3_600_000;
    for i in 0..5 {
        ops.schedule(request_at(&topic, &format!("ops-{i}"), start + i * 1000)).await.unwrap();
    }
    for i in 0..2 {
        acme.schedule(request_at(&topic, &format!("acme-{i}"), start + 60_000 + i * 1000)).await.unwrap();
    }
    let window = proto::ForecastRequest {
        from: Some(timestamp(start - start % 60_000)),
        to: Some(timestamp(start - start % 60_000 + 3 * 60_000)),
        interval: Some(wire(Duration::from_secs(60))),
        ..Default::default()
    };
    let theirs = acme.forecast(window.clone()).await.unwrap().into_inner();
    assert_eq!(theirs.totals.iter().sum::<u64>(), 2, "{theirs:?}");
    assert!(theirs.counted_to.is_none(), "nothing of its own was cut: {theirs:?}");
    let all = ops.forecast(window).await.unwrap().into_inner();
    assert!(all.counted_to.is_some(), "seven entries, three counted: {all:?}");
    assert!(all.totals.iter().sum::<u64>() <= 3, "{all:?}");
}
