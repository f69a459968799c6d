//! The `Admin` calls: dispatch policies (see [`crate::policy`]), who may
//! change which, what a valid change is, and the change written to every
//! shard through the node. Reads answer from the table the node's stores
//! keep. Served by the gRPC adapter `api::admin`.

use std::{sync::Arc, time::Duration};

use tokio::sync::Mutex;

use crate::{
    Error, audit,
    auth::{Access, AdminScope},
    clock::Clock,
    command::{Place, Row, Table as Rows},
    kafka::TopicCatalog,
    message::{
        Invalid, ReservedTopics, Tenant, duration_ms, validate_dead_letter_topic, validate_topic_name,
    },
    node::Node,
    policy::{MAX_RATE, PolicyKey, Rate, Table, TopicPolicy},
    store::StoreError,
};

/// The most topic-wide policies (every tenant's messages to a topic) a
/// server keeps. Each tenant's own are counted apart, against
/// [`PolicyLimits::per_tenant`], so that no tenant can use up the room an
/// operator's pause needs.
pub(crate) const MAX_POLICIES: usize = 10_000;

/// What the policy calls may hold and name.
#[derive(Clone, Debug)]
pub struct PolicyLimits {
    /// Policies of its own one tenant may keep (`--max-policies-per-tenant`).
    pub per_tenant: usize,
    /// Topics hourglass writes itself: never a dead-letter topic.
    pub reserved: ReservedTopics,
    /// Whether a change that changes nothing may be left unwritten: true
    /// standalone. In a cluster every change is written, since this node's
    /// table may not have applied the latest change from the log yet, and
    /// the later change must be the one every copy keeps.
    pub skip_no_ops: bool,
}

impl Default for PolicyLimits {
    fn default() -> Self {
        PolicyLimits { per_tenant: 1000, reserved: ReservedTopics::default(), skip_no_ops: true }
    }
}

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
    /// A policy is kept only for a topic the brokers know.
    catalog: Arc<TopicCatalog>,
    clock: Arc<dyn Clock>,
    limits: PolicyLimits,
    /// One change at a time on this node: each reads the policy it changes.
    writing: Mutex<()>,
}

impl PolicyService {
    pub fn new(
        node: Arc<Node>,
        catalog: Arc<TopicCatalog>,
        clock: Arc<dyn Clock>,
        limits: PolicyLimits,
    ) -> PolicyService {
        PolicyService { node, catalog, clock, limits, writing: Mutex::new(()) }
    }

    /// Changes the policy of `topic` (for every tenant, or the caller's
    /// own), once the caller may; returns it as written. Recorded in the
    /// audit trail.
    pub async fn change(
        &self,
        access: &Access,
        topic: &str,
        whose: &Whose,
        change: Change,
    ) -> Result<(PolicyKey, TopicPolicy), Error> {
        let (verb, what) = (change.verb(), format!("topic={topic} whose={whose} change={change:?}"));
        let result = self.make(access, topic, whose, change).await;
        match &result {
            Ok(_) => audit::record(access, verb, &what, Ok("changed")),
            Err(e) => audit::record(access, verb, &what, Err(e)),
        }
        result
    }

    async fn make(
        &self,
        access: &Access,
        topic: &str,
        whose: &Whose,
        change: Change,
    ) -> Result<(PolicyKey, TopicPolicy), Error> {
        let key = target(access, topic, whose)?;
        let scope = access.admin()?;
        if key.tenant.is_none() && scope != AdminScope::All {
            return Err(Error::NotAdminOfAll { token: access.name().to_owned() });
        }
        match &change {
            Change::Limit(Some(rate)) => validate_rate(*rate)?,
            Change::DeadLetterTopic(Some(to)) => {
                validate_dead_letter_topic(topic, to)
                    .map_err(|e| Invalid::new("dead_letter_topic", e.reason))?;
                self.limits.reserved.check("dead_letter_topic", to)?;
                // Its messages are produced there: the caller must be
                // granted it as it is granted the topic.
                access.check(to)?;
            }
            _ => {}
        }
        if !change.removes() || !self.limits.skip_no_ops {
            // A policy (or, in a cluster, a removal's record) of a topic no
            // broker knows would take room for nothing (a made-up name).
            self.catalog.partitions(topic).await?;
        }
        let _one = self.writing.lock().await;
        let table = self.table()?;
        let current = table.get(&key).cloned();
        if current.is_none() && change.removes() && self.limits.skip_no_ops {
            // Nothing to remove: nothing is written, and no record of a
            // removal is kept.
            return Ok((key, TopicPolicy::default()));
        }
        if current.is_none() && !change.removes() {
            self.check_room(&table, &key)?;
        }
        let mut policy = current.clone().unwrap_or_default();
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
        if self.limits.skip_no_ops && current.is_some_and(|before| same_rules(&before, &policy)) {
            // Says what it said: nothing to write.
            return Ok((key, policy));
        }
        // Later than the change it replaces, whatever the clocks say: in a
        // cluster the later change of a policy is the one every copy keeps.
        let last = table.last_change(&key).map_or(0, |p| p.updated_ms);
        policy.updated_ms = now.0.max(last.saturating_add(1));
        policy.updated_by = access.name().to_owned();
        // An operator's change of another's policy: who made it is the
        // operators' to know.
        policy.by_operator = access.is_operator() && key.tenant != access.scope().tenant;
        let row = Row::put(Rows::Policy, key.encode(), prost::Message::encode_to_vec(&policy));
        self.node.write_rows(Place::Everywhere, vec![row]).await?;
        Ok((key, policy))
    }

    /// Refuses a new policy for `key` when its owner's room is full: the
    /// tenant's own ([`PolicyLimits::per_tenant`]), or the topic-wide ones
    /// ([`MAX_POLICIES`]).
    fn check_room(&self, table: &Table, key: &PolicyKey) -> Result<(), Error> {
        let (most, whose, flag) = match &key.tenant {
            Some(t) => {
                (self.limits.per_tenant, format!("tenant {:?}", t.as_str()), " (--max-policies-per-tenant)")
            }
            None => (MAX_POLICIES, "every tenant".to_owned(), ""),
        };
        if table.count_of(key.tenant.as_ref()) >= most {
            return Err(Error::TooManyPolicies { whose, most, flag });
        }
        Ok(())
    }

    /// The policy of `topic` for every tenant, or the caller's own (an
    /// empty one if there is none). Reading needs the topic's grant only.
    pub fn get(
        &self,
        access: &Access,
        topic: &str,
        whose: &Whose,
    ) -> Result<(PolicyKey, TopicPolicy), Error> {
        let key = target(access, topic, whose)?;
        let policy = self.table()?.get(&key).cloned().unwrap_or_default();
        Ok((key.clone(), shown(access, &key, policy)))
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
            .map(|(key, policy)| (key.clone(), shown(access, key, policy.clone())))
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

/// `policy` as `access` may see it: who set a topic-wide policy, or an
/// operator's change of a tenant's own (an operator's token name), is the
/// operators' to know, not a tenant's.
fn shown(access: &Access, key: &PolicyKey, mut policy: TopicPolicy) -> TopicPolicy {
    if (key.tenant.is_none() || policy.by_operator) && !access.is_operator() {
        policy.updated_by.clear();
    }
    policy
}

/// Whether two policies say the same (when and by whom they were set
/// aside).
fn same_rules(a: &TopicPolicy, b: &TopicPolicy) -> bool {
    let rules = |p: &TopicPolicy| TopicPolicy {
        updated_ms: 0,
        updated_by: String::new(),
        by_operator: false,
        ..p.clone()
    };
    rules(a) == rules(b)
}

impl Change {
    /// Its verb in the audit trail: the Admin call's.
    fn verb(&self) -> &'static str {
        match self {
            Change::Pause => "PauseTopic",
            Change::Resume => "ResumeTopic",
            Change::Limit(_) => "SetRateLimit",
            Change::MaxLateness(_) => "SetMaxLateness",
            Change::DeadLetterTopic(_) => "SetDeadLetterTopic",
        }
    }

    /// Whether it only takes something away: on no policy, a no-op.
    fn removes(&self) -> bool {
        matches!(
            self,
            Change::Resume | Change::Limit(None) | Change::MaxLateness(None) | Change::DeadLetterTopic(None)
        )
    }
}

/// Whose policy of a topic a call names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Whose {
    /// Every tenant's messages to the topic.
    AllTenants,
    /// The calling tenant's (with authentication off, every tenant's).
    Caller,
    /// A tenant's own, named: another tenant's needs an operator.
    Tenant(String),
}

impl Whose {
    /// As a request says it: `all_tenants`, else `tenant` (empty: the
    /// caller's own).
    pub fn of(all_tenants: bool, tenant: String) -> Whose {
        match (all_tenants, tenant.is_empty()) {
            (true, _) => Whose::AllTenants,
            (false, true) => Whose::Caller,
            (false, false) => Whose::Tenant(tenant),
        }
    }
}

impl std::fmt::Display for Whose {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Whose::AllTenants => f.write_str("all_tenants"),
            Whose::Caller => f.write_str("own"),
            Whose::Tenant(t) => write!(f, "tenant:{t}"),
        }
    }
}

/// The policy a call names: the topic must be valid and granted; without
/// tokens a policy is for every tenant unless it names one; another
/// tenant's own policy is an operator's to name.
fn target(access: &Access, topic: &str, whose: &Whose) -> Result<PolicyKey, Error> {
    validate_topic_name(topic).map_err(|e| Invalid::new("topic", e.reason))?;
    access.check(topic)?;
    let own = access.scope().tenant;
    let tenant = match whose {
        Whose::AllTenants => None,
        Whose::Caller => own,
        Whose::Tenant(t) if own.as_ref().is_some_and(|own| own.as_str() == t) => own,
        Whose::Tenant(_) if !access.is_operator() => {
            return Err(Error::NotOperator { token: access.name().to_owned() });
        }
        Whose::Tenant(t) => Some(Tenant::parse(t).map_err(|reason| Invalid::new("tenant", reason.0))?),
    };
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
