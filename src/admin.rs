//! The `Admin` calls: dispatch policies (see [`crate::policy`]), who may
//! change which, what a valid change is, and the change written to every
//! shard through the node. Reads answer from the table the node's stores
//! keep. Served by the gRPC adapter `api::admin`.

use std::{sync::Arc, time::Duration};

use tokio::sync::Mutex;

use crate::{
    Error,
    auth::{Access, AdminScope},
    clock::Clock,
    message::{Invalid, duration_ms, validate_dead_letter_topic, validate_topic_name},
    node::Node,
    policy::{MAX_RATE, PolicyKey, PolicyWrite, Rate, Table, TopicPolicy},
    store::StoreError,
};

/// The most policies a server keeps: each is looked at when a message of
/// its topic goes out.
pub const MAX_POLICIES: usize = 10_000;

/// The longest burst a limit may name, in seconds of its rate.
const MAX_BURST_SECONDS: u64 = 60;

/// A change of one topic's policy.
#[derive(Clone, Debug)]
pub enum Change {
    Pause,
    Resume,
    /// A limit, or none.
    Limit(Option<Rate>),
    /// A default deadline past the due time, or none.
    MaxLateness(Option<Duration>),
    /// Where its messages go when they fail or expire, or nowhere of its
    /// own.
    DeadLetterTopic(Option<String>),
}

pub struct PolicyService {
    node: Arc<Node>,
    clock: Arc<dyn Clock>,
    /// One change at a time on this node: each reads the policy it changes.
    writing: Mutex<()>,
}

impl PolicyService {
    pub fn new(node: Arc<Node>, clock: Arc<dyn Clock>) -> PolicyService {
        PolicyService { node, clock, writing: Mutex::new(()) }
    }

    /// Changes the policy of `topic` (for every tenant, or the caller's
    /// own), once the caller may; returns it as written.
    pub async fn change(
        &self,
        access: &Access,
        topic: &str,
        all_tenants: bool,
        change: Change,
    ) -> Result<(PolicyKey, TopicPolicy), Error> {
        let key = target(access, topic, all_tenants)?;
        let scope = access.admin()?;
        if key.tenant.is_none() && scope != AdminScope::All {
            return Err(Error::NotAdminOfAll { token: access.name().to_owned() });
        }
        match &change {
            Change::Limit(Some(rate)) => validate_rate(*rate)?,
            Change::DeadLetterTopic(Some(to)) => {
                validate_dead_letter_topic(topic, to)
                    .map_err(|e| Invalid::new("dead_letter_topic", e.reason))?;
                // Its messages are produced there: the caller must be
                // granted it as it is granted the topic.
                access.check(to)?;
            }
            _ => {}
        }
        let _one = self.writing.lock().await;
        let table = self.table()?;
        let mut policy = table.get(&key).cloned().unwrap_or_default();
        if table.get(&key).is_none()
            && table.iter().count() >= MAX_POLICIES
            && !matches!(
                change,
                Change::Resume
                    | Change::Limit(None)
                    | Change::MaxLateness(None)
                    | Change::DeadLetterTopic(None)
            )
        {
            return Err(Invalid::new(
                "topic",
                format!(
                    "this server already keeps {MAX_POLICIES} policies, the most it keeps; remove some first"
                ),
            )
            .into());
        }
        let now = self.clock.now();
        match &change {
            Change::Pause if !policy.paused() => policy.paused_at_ms = now.0.max(1),
            Change::Pause => {}
            Change::Resume => policy.paused_at_ms = 0,
            Change::Limit(Some(rate)) => {
                (policy.rate_per_second, policy.rate_burst) = (rate.per_second, rate.burst)
            }
            Change::Limit(None) => (policy.rate_per_second, policy.rate_burst) = (0, 0),
            Change::MaxLateness(late) => policy.max_lateness_ms = late.map_or(0, duration_ms),
            Change::DeadLetterTopic(to) => policy.dead_letter_topic = to.clone().unwrap_or_default(),
        }
        // Later than the change it replaces, whatever the clocks say: in a
        // cluster the later change of a policy is the one every copy keeps.
        let last = table.last_change(&key).map_or(0, |p| p.updated_ms);
        policy.updated_ms = now.0.max(last.saturating_add(1));
        policy.updated_by = access.name().to_owned();
        self.node
            .write_policies(vec![PolicyWrite { key: key.clone(), policy: Some(policy.clone()) }])
            .await?;
        tracing::info!(policy = %key.describe(), ?change, by = access.name(), "dispatch policy changed");
        Ok((key, policy))
    }

    /// The policy of `topic` for every tenant, or the caller's own (an
    /// empty one if there is none). Reading needs the topic's grant only.
    pub fn get(
        &self,
        access: &Access,
        topic: &str,
        all_tenants: bool,
    ) -> Result<(PolicyKey, TopicPolicy), Error> {
        let key = target(access, topic, all_tenants)?;
        let policy = self.table()?.get(&key).cloned().unwrap_or_default();
        Ok((key, policy))
    }

    /// Every policy the caller may see: on its topics, for every tenant or
    /// its own (every tenant's, for an `admin = "all"` token).
    pub fn list(&self, access: &Access) -> Result<Vec<(PolicyKey, TopicPolicy)>, Error> {
        let scope = access.scope();
        let operator = matches!(access.admin(), Ok(AdminScope::All));
        let table = self.table()?;
        let mut seen: Vec<_> = table
            .iter()
            .filter(|(key, _)| access.check(&key.topic).is_ok())
            .filter(|(key, _)| operator || key.tenant.is_none() || key.tenant == scope.tenant)
            .map(|(key, policy)| (key.clone(), policy.clone()))
            .collect();
        seen.sort_by(|(a, _), (b, _)| (&a.topic, &a.tenant).cmp(&(&b.topic, &b.tenant)));
        Ok(seen)
    }

    /// The policies as this node's shards have them; none served here (a
    /// node of a cluster that owns no shard now) cannot say.
    fn table(&self) -> Result<Arc<Table>, Error> {
        self.node.policies().ok_or_else(|| {
            StoreError::LogUnavailable(
                "this node serves no shard now, so it cannot read the dispatch policies; retry, or ask another node"
                    .to_owned(),
            )
            .into()
        })
    }
}

/// The policy a call names: the topic must be valid and granted; without
/// tokens every policy is for every tenant.
fn target(access: &Access, topic: &str, all_tenants: bool) -> Result<PolicyKey, Error> {
    validate_topic_name(topic).map_err(|e| Invalid::new("topic", e.reason))?;
    access.check(topic)?;
    let tenant = if all_tenants { None } else { access.scope().tenant };
    Ok(PolicyKey { tenant, topic: topic.into() })
}

fn validate_rate(rate: Rate) -> Result<(), Invalid> {
    if rate.per_second > MAX_RATE {
        return Err(Invalid::new("per_second", format!("is {}; the most is {MAX_RATE}", rate.per_second)));
    }
    let most = u64::from(rate.per_second) * MAX_BURST_SECONDS;
    if u64::from(rate.burst) > most {
        return Err(Invalid::new(
            "burst",
            format!("is {}; the most is {MAX_BURST_SECONDS} seconds of the rate ({most})", rate.burst),
        ));
    }
    Ok(())
}
