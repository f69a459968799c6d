//! The audit trail against the real binary: each change a caller makes is
//! one `hourglass::audit` line naming the token, its tenant, whether it
//! acted as an operator, the verb, what and the outcome (a refusal too);
//! reads and schedules are not in it.

use crate::common;

use std::{
    io::Read as _,
    process::Stdio,
    time::{Duration, Instant},
};

use common::*;
use hourglass::{
    auth::Bearer,
    proto::{
        self, admin_client::AdminClient, scheduler_client::SchedulerClient, series_client::SeriesClient,
    },
};
use tonic::transport::Channel;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_change_is_one_audit_line_with_who_what_and_the_outcome() {
    let broker = Broker::start();
    let prefix = random_name("audited");
    let topic = format!("{prefix}.events");
    broker.create_topic(&topic, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[[token]]\nname = \"acme-app\"\ntoken = \"acme-token-0123456789abcdef\"\ntenant = \"acme\"\n\
             topics = [\"{prefix}.*\"]\nadmin = \"tenant\"\n\n\
             [[token]]\nname = \"ops\"\ntoken = \"ops-token-0123456789abcdef\"\ntopics = [\"*\"]\nadmin = \"all\"\n"
        ),
    )
    .unwrap();
    let flags = ["--auth-tokens", tokens.to_str().unwrap()];
    let (mut child, grpc, _) = spawn_serve_with(
        &broker,
        &dir.path().join("data"),
        Stdio::piped(),
        &flags,
        &[("HOURGLASS_LOG", "warn,hourglass::audit=info")],
    );
    let started = Instant::now();
    while !hourglass_testkit::listening(&grpc) {
        assert!(started.elapsed() < Duration::from_secs(30), "hourglass did not start listening");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let channel = Channel::from_shared(format!("http://{grpc}")).unwrap().connect().await.unwrap();
    let bearer = |token: &str| Bearer::new(Some(token)).unwrap();
    let (acme_token, ops_token) = ("acme-token-0123456789abcdef", "ops-token-0123456789abcdef");
    let mut acme = SchedulerClient::with_interceptor(channel.clone(), bearer(acme_token));
    let mut ops = SchedulerClient::with_interceptor(channel.clone(), bearer(ops_token));
    for id in ["a-1", "a-2"] {
        let mut r = request(&topic, id, Duration::from_secs(3600));
        r.id = Some(id.into());
        acme.schedule(r).await.unwrap();
    }
    acme.get(proto::GetRequest { id: "a-1".into(), ..Default::default() }).await.unwrap();
    // The operator cancels acme's message by naming its tenant.
    let cancel = proto::CancelRequest { id: "a-1".into(), tenant: "acme".into(), ..Default::default() };
    ops.cancel(cancel).await.unwrap();
    // A refusal is recorded too.
    let probe = proto::CancelRequest { id: "x".into(), tenant: "ops".into(), ..Default::default() };
    acme.cancel(probe).await.unwrap_err();
    let due = Some(proto::reschedule_request::Due::Delay(prost_types::Duration { seconds: 60, nanos: 0 }));
    acme.reschedule(proto::RescheduleRequest { id: "a-2".into(), due, ..Default::default() }).await.unwrap();
    let selected = proto::CancelMatchingRequest { selector: "nothing=here".into(), ..Default::default() };
    acme.cancel_matching(selected).await.unwrap();
    let mut admin = AdminClient::with_interceptor(channel.clone(), bearer(acme_token));
    admin
        .pause_topic(proto::TopicPolicyRequest { topic: topic.clone(), ..Default::default() })
        .await
        .unwrap();
    let mut series = SeriesClient::with_interceptor(channel.clone(), bearer(acme_token));
    let spec = proto::SeriesSpec {
        template: Some(proto::Message { topic: topic.clone(), value: b"t".to_vec(), ..Default::default() }),
        every: Some(proto::series_spec::Every::Interval(wire(Duration::from_secs(3600)))),
        ..Default::default()
    };
    series.create_series(proto::CreateSeriesRequest { id: "digest".into(), spec: Some(spec) }).await.unwrap();
    series
        .delete_series(proto::DeleteSeriesRequest { id: "digest".into(), ..Default::default() })
        .await
        .unwrap();

    child.kill().unwrap();
    child.wait().unwrap();
    let mut log = String::new();
    child.stderr.take().unwrap().read_to_string(&mut log).unwrap();
    let audit: Vec<&str> = log.lines().filter(|l| l.contains("hourglass::audit")).collect();
    let line = |verb: &str, what: &str| {
        audit
            .iter()
            .find(|l| l.contains(&format!("verb=\"{verb}\"")) && l.contains(what))
            .unwrap_or_else(|| panic!("no audit line for {verb} {what}:\n{}", audit.join("\n")))
            .to_string()
    };
    let cancelled = line("Cancel", "id=acme/a-1");
    assert!(
        cancelled.contains("token=\"ops\"")
            && cancelled.contains("operator=true")
            && cancelled.contains("outcome=\"cancelled\""),
        "{cancelled}"
    );
    let refused = line("Cancel", "id=ops/x");
    assert!(refused.contains("token=\"acme-app\"") && refused.contains("outcome=\"refused\""), "{refused}");
    let moved = line("Reschedule", "id=a-2");
    assert!(moved.contains("tenant=\"acme\"") && moved.contains("operator=false"), "{moved}");
    line("CancelMatching", "nothing=here");
    line("PauseTopic", &topic);
    line("CreateSeries", "series=digest");
    line("DeleteSeries", "series=digest");
    assert_eq!(audit.len(), 7, "one line per change, none for reads or schedules:\n{}", audit.join("\n"));
}
