//! The dispatch policy phase: a burst due at once into a rate-limited
//! topic (how close to the limit it comes out, and how late another
//! topic's messages are meanwhile), and a drain of a topic without a
//! policy and with policies that do not hold it back: another topic
//! paused, and its own deadline and dead-letter topic (what the policy
//! checks cost a drain; beside the drain phase's figure).

use std::sync::Arc;

use hourglass::proto::{self, admin_client::AdminClient};
use hourglass_testkit::ServerProcess;

use crate::{
    LatenessTargets, add_lateness, check_lead, drain, lead_time, load,
    report::{Report, Target},
    workload::{Workload, now_ms},
};

/// Seconds the limited burst takes at its limit.
const LIMITED_SECONDS: usize = 10;

pub struct Policy<'a> {
    pub server: &'a ServerProcess,
    /// The bench topic, and another (unlimited) one.
    pub w: &'a Workload,
    pub other: &'a Workload,
    /// Messages of the unlimited drain.
    pub drain: usize,
    pub streams: usize,
    pub producer_limit: f64,
}

impl Policy<'_> {
    pub async fn run(&self, report: &mut Report) -> anyhow::Result<()> {
        let mut admin = AdminClient::connect(format!("http://{}", self.server.grpc)).await?;
        let limit = |topic: &str, per_second: u32| proto::SetRateLimitRequest {
            topic: topic.to_owned(),
            all_tenants: true,
            per_second,
            burst: 0,
            ..Default::default()
        };

        // Unlimited drains, with and without policies that let it go:
        // another topic paused, and the drained topic's deadline (an hour:
        // none expires) and dead-letter topic (every message then looked
        // up against the policies, checked against its deadline, and kept
        // in flight for its dead-letter topic). In the order without,
        // with, with, without, so that what the store gathers from one
        // drain to the next weighs on both alike.
        // The other topic: a policy is kept only for a topic that exists.
        let elsewhere = self.other.topic.clone();
        let paused =
            proto::TopicPolicyRequest { topic: elsewhere.clone(), all_tenants: true, ..Default::default() };
        let deadline = |hour: bool| proto::SetMaxLatenessRequest {
            topic: self.w.topic.clone(),
            all_tenants: true,
            max_lateness: hour.then_some(prost_types::Duration { seconds: 3_600, nanos: 0 }),
            ..Default::default()
        };
        let dead_letters = |to: &str| proto::SetDeadLetterTopicRequest {
            topic: self.w.topic.clone(),
            all_tenants: true,
            dead_letter_topic: to.to_owned(),
            ..Default::default()
        };
        let servers = std::slice::from_ref(self.server);
        let (mut with, mut without) = (Vec::new(), Vec::new());
        for policy in [false, true, true, false] {
            if policy {
                admin.pause_topic(paused.clone()).await?;
                admin.set_max_lateness(deadline(true)).await?;
                admin.set_dead_letter_topic(dead_letters(&elsewhere)).await?;
            }
            let delivered = self.server.metric("hourglass_messages_delivered_total").await?;
            let t0 = now_ms() + lead_time(self.drain);
            load::stream(servers, self.w, self.drain, self.streams, Arc::new(move |_| t0), false).await?;
            check_lead("policy: drain", t0, report);
            let (elapsed, _) = drain(self.server, t0, delivered + self.drain as f64).await?;
            let rate = self.drain as f64 / elapsed.as_secs_f64();
            if policy {
                with.push(rate);
                admin.resume_topic(paused.clone()).await?;
                admin.set_max_lateness(deadline(false)).await?;
                admin.set_dead_letter_topic(dead_letters("")).await?;
            } else {
                without.push(rate);
            }
        }
        let mean = |rates: &[f64]| rates.iter().sum::<f64>() / rates.len() as f64;
        let (with, without) = (mean(&with), mean(&without));
        let producer = Some(self.producer_limit);
        report.add("drain, no policy (mean of 2)", without, "msg/s", producer, &[]);
        report.add("drain, with policies that let it go (mean of 2)", with, "msg/s", producer, &[]);
        report.add("drain with policies, of without", with / without * 100.0, "%", None, &[]);

        // A burst into a limited topic, an unlimited trickle beside it.
        let count = (self.drain / 2).max(LIMITED_SECONDS * 10);
        let rate = (count / LIMITED_SECONDS) as u32;
        admin.set_rate_limit(limit(&self.w.topic, rate)).await?;
        let trickle_rate = 200usize;
        let trickle = trickle_rate * LIMITED_SECONDS;
        let t1 = now_ms() + lead_time(count + trickle);
        let delivered = self.server.metric("hourglass_messages_delivered_total").await?;
        load::stream(servers, self.w, count, self.streams, Arc::new(move |_| t1), false).await?;
        let every = 1000 / trickle_rate as u64;
        let beside =
            load::stream(servers, self.other, trickle, 1, Arc::new(move |i| t1 + 1 + i as u64 * every), true)
                .await?;
        check_lead("policy: limited burst", t1, report);
        let (elapsed, _) = drain(self.server, t1, delivered + (count + trickle) as f64).await?;
        admin.set_rate_limit(limit(&self.w.topic, 0)).await?;
        let name = format!("{count} due at once, limited to {rate}/s");
        report.add(
            format!("{name}: came out at"),
            count as f64 / elapsed.as_secs_f64(),
            "msg/s",
            Some(f64::from(rate)),
            &[Target::RatioAtLeast(0.9), Target::AtMost(f64::from(rate) * 1.1)],
        );
        let late = load::lateness(servers, &beside.scheduled, 8).await?;
        let targets = LatenessTargets { p99: Some(20.0), ..LatenessTargets::default() };
        add_lateness(report, &format!("{name}: another topic at {trickle_rate}/s"), &late, targets);
        Ok(())
    }
}
