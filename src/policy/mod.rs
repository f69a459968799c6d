//! Dispatch policy: what an operator or a tenant says of a target topic,
//! apart from any one message. A topic can be **paused** (nothing of it is
//! produced until it is resumed), **rate limited** (messages per second,
//! with a burst) and given a **default deadline** (its messages expire
//! unproduced this long past their due time, unless they say otherwise),
//! for every tenant's messages to it or for one tenant's.
//!
//! A policy is kept in every shard's store (in cluster mode, in every
//! partition of the schedule log), so that each shard's dispatcher reads
//! it from its own store and it outlives restarts and moves. Here are its
//! key and record ([`PolicyKey`], [`TopicPolicy`]), the table a store keeps
//! of them ([`Table`]), and the token bucket a rate limit is kept with
//! ([`Bucket`]); the dispatcher applies them ([`crate::dispatcher`]), and
//! the Admin calls set them ([`crate::admin`]).

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use crate::message::{Tenant, UnixMillis};

mod bucket;

pub(crate) use bucket::Bucket;

/// The most messages per second a limit may name: past it, a limit
/// limits nothing a dispatcher can produce.
pub(crate) const MAX_RATE: u32 = 10_000_000;

/// Whose messages to a topic a policy applies to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PolicyKey {
    /// `None`: every tenant's (a topic-wide policy); else this tenant's.
    pub tenant: Option<Tenant>,
    pub topic: Arc<str>,
}

impl PolicyKey {
    pub fn topic_wide(topic: &str) -> PolicyKey {
        PolicyKey { tenant: None, topic: topic.into() }
    }

    /// Its bytes in a store key: the tenant (empty for every tenant), a
    /// zero byte, the topic. Neither holds a zero byte.
    pub fn encode(&self) -> Vec<u8> {
        let tenant = self.tenant.as_ref().map_or("", Tenant::as_str);
        let mut bytes = Vec::with_capacity(tenant.len() + 1 + self.topic.len());
        bytes.extend_from_slice(tenant.as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(self.topic.as_bytes());
        bytes
    }

    pub fn decode(bytes: &[u8]) -> Option<PolicyKey> {
        let split = bytes.iter().position(|&b| b == 0)?;
        let (tenant, topic) =
            (std::str::from_utf8(&bytes[..split]).ok()?, std::str::from_utf8(&bytes[split + 1..]).ok()?);
        let tenant = if tenant.is_empty() { None } else { Some(Tenant::parse(tenant).ok()?) };
        (!topic.is_empty()).then(|| PolicyKey { tenant, topic: topic.into() })
    }

    /// Whether a message is of this lane, by its id as stored (`\0 tenant
    /// \0 id` in a tenant's space) and its topic's bytes.
    pub fn holds_raw(&self, id: &[u8], topic: &[u8]) -> bool {
        if topic != self.topic.as_bytes() {
            return false;
        }
        let Some(tenant) = &self.tenant else { return true };
        let tenant = tenant.as_str().as_bytes();
        id.len() > tenant.len() + 1
            && id[0] == 0
            && &id[1..=tenant.len()] == tenant
            && id[tenant.len() + 1] == 0
    }

    /// How it reads in logs, errors and the CLI.
    pub fn describe(&self) -> String {
        match &self.tenant {
            None => format!("topic {:?} (every tenant)", &*self.topic),
            Some(t) => format!("topic {:?} of tenant {:?}", &*self.topic, t.as_str()),
        }
    }
}

/// A rate limit: messages per second, and how many may go at once after a
/// quiet spell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    pub per_second: u32,
    pub burst: u32,
}

impl Rate {
    /// The burst when none is named: a tenth of a second's worth, so that a
    /// backlog comes out smoothly.
    pub fn default_burst(per_second: u32) -> u32 {
        (per_second / 10).max(1)
    }
}

/// What is said of one topic (for one tenant or all), as it is kept.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TopicPolicy {
    /// When it was paused (ms since the epoch); 0: not paused.
    #[prost(uint64, tag = "1")]
    pub paused_at_ms: u64,
    /// Messages per second; 0: no limit.
    #[prost(uint32, tag = "2")]
    pub rate_per_second: u32,
    #[prost(uint32, tag = "3")]
    pub rate_burst: u32,
    /// When it was last changed, and by whom (a token's name).
    #[prost(uint64, tag = "4")]
    pub updated_ms: u64,
    #[prost(string, tag = "5")]
    pub updated_by: String,
    /// The deadline past their due time of its messages that name none,
    /// in ms; 0: none.
    #[prost(uint64, tag = "6")]
    pub max_lateness_ms: u64,
    /// Where its messages that name none go when they fail or expire;
    /// empty: the server's default, if any.
    #[prost(string, tag = "7")]
    pub dead_letter_topic: String,
    /// The last change was an operator's (`admin = "all"`) of a policy
    /// not its own tenant's: who made it is shown to operators only.
    #[prost(bool, tag = "8")]
    pub by_operator: bool,
}

impl TopicPolicy {
    pub fn paused(&self) -> bool {
        self.paused_at_ms > 0
    }

    pub fn paused_at(&self) -> Option<UnixMillis> {
        self.paused().then_some(UnixMillis(self.paused_at_ms))
    }

    pub fn rate(&self) -> Option<Rate> {
        (self.rate_per_second > 0).then(|| Rate {
            per_second: self.rate_per_second,
            burst: if self.rate_burst == 0 {
                Rate::default_burst(self.rate_per_second)
            } else {
                self.rate_burst
            },
        })
    }

    pub fn max_lateness(&self) -> Option<Duration> {
        (self.max_lateness_ms > 0).then(|| Duration::from_millis(self.max_lateness_ms))
    }

    pub fn dead_letter_topic(&self) -> Option<&str> {
        (!self.dead_letter_topic.is_empty()).then_some(self.dead_letter_topic.as_str())
    }

    /// Says nothing: it is removed rather than kept.
    pub fn is_empty(&self) -> bool {
        !self.paused()
            && self.rate().is_none()
            && self.max_lateness().is_none()
            && self.dead_letter_topic().is_none()
    }
}

/// Every policy a store holds, by topic; swapped whole on a change.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Table {
    /// By topic, so that a message's look-up is two hash probes however
    /// many policies the table holds.
    topics: foldhash::HashMap<Arc<str>, Lanes>,
    /// Policies removed (their last change says nothing), kept for when:
    /// in cluster mode an earlier change read later must not bring one
    /// back.
    removed: BTreeMap<PolicyKey, TopicPolicy>,
}

/// The policies in force of one topic: the topic-wide one and each
/// tenant's own.
#[derive(Clone, Debug, Default, PartialEq)]
struct Lanes {
    wide: Option<(PolicyKey, TopicPolicy)>,
    tenants: foldhash::HashMap<Tenant, (PolicyKey, TopicPolicy)>,
}

impl Lanes {
    fn is_empty(&self) -> bool {
        self.wide.is_none() && self.tenants.is_empty()
    }
}

impl Table {
    pub fn get(&self, key: &PolicyKey) -> Option<&TopicPolicy> {
        let lanes = self.topics.get(&*key.topic)?;
        let (_, policy) = match &key.tenant {
            None => lanes.wide.as_ref()?,
            Some(t) => lanes.tenants.get(t.as_str())?,
        };
        Some(policy)
    }

    /// Every policy in force, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&PolicyKey, &TopicPolicy)> {
        self.topics
            .values()
            .flat_map(|lanes| lanes.wide.iter().chain(lanes.tenants.values()))
            .map(|(key, policy)| (key, policy))
    }

    pub fn is_empty(&self) -> bool {
        self.topics.is_empty()
    }

    /// How many policies are in force.
    pub fn len(&self) -> usize {
        self.topics.values().map(|l| usize::from(l.wide.is_some()) + l.tenants.len()).sum()
    }

    /// How many of the policies in force are `tenant`'s own (none: the
    /// topic-wide ones).
    pub fn count_of(&self, tenant: Option<&Tenant>) -> usize {
        self.topics
            .values()
            .filter(|lanes| match tenant {
                None => lanes.wide.is_some(),
                Some(t) => lanes.tenants.contains_key(t.as_str()),
            })
            .count()
    }

    /// When the latest change of any policy here was made (0: none).
    pub fn latest_change(&self) -> u64 {
        self.iter().map(|(_, p)| p).chain(self.removed.values()).map(|p| p.updated_ms).max().unwrap_or(0)
    }

    /// The last change of `key`'s policy, in force or removed.
    pub fn last_change(&self, key: &PolicyKey) -> Option<&TopicPolicy> {
        self.get(key).or_else(|| self.removed.get(key))
    }

    /// `key`'s policy becomes `policy` (none, or an empty one: removed).
    pub fn set(&mut self, key: PolicyKey, policy: Option<TopicPolicy>) {
        let lanes = self.topics.entry(Arc::clone(&key.topic)).or_default();
        match &key.tenant {
            None => lanes.wide = None,
            Some(t) => {
                lanes.tenants.remove(t.as_str());
            }
        }
        match policy {
            Some(policy) if !policy.is_empty() => {
                self.removed.remove(&key);
                match key.tenant.clone() {
                    None => lanes.wide = Some((key, policy)),
                    Some(t) => {
                        lanes.tenants.insert(t, (key, policy));
                    }
                }
            }
            removal => {
                if lanes.is_empty() {
                    self.topics.remove(&*key.topic);
                }
                if let Some(removal) = removal {
                    self.removed.insert(key, removal);
                }
            }
        }
    }

    /// The policies that apply to a message of `tenant` to `topic`: the
    /// topic-wide one, then its tenant's.
    pub fn applying(&self, tenant: Option<&str>, topic: &str) -> [Option<(&PolicyKey, &TopicPolicy)>; 2] {
        let Some(lanes) = self.topics.get(topic) else { return [None, None] };
        let own = tenant.and_then(|t| lanes.tenants.get(t));
        [lanes.wide.as_ref().map(|(k, p)| (k, p)), own.map(|(k, p)| (k, p))]
    }

    /// The deadline past their due time of a message of `tenant` to
    /// `topic` that names none: its tenant's policy's, else the topic's.
    pub fn max_lateness(&self, tenant: Option<&str>, topic: &str) -> Option<Duration> {
        let [wide, own] = self.applying(tenant, topic);
        own.and_then(|(_, p)| p.max_lateness()).or_else(|| wide.and_then(|(_, p)| p.max_lateness()))
    }

    /// Where a message of `tenant` to `topic` that names none goes when it
    /// fails or expires: its tenant's policy's topic, else the topic's.
    pub fn dead_letter_topic(&self, tenant: Option<&str>, topic: &str) -> Option<&str> {
        let [wide, own] = self.applying(tenant, topic);
        own.and_then(|(_, p)| p.dead_letter_topic()).or_else(|| wide.and_then(|(_, p)| p.dead_letter_topic()))
    }
}

/// Whether a policy's row (its key and record as stored, see
/// [`PolicyKey::encode`]) reads, within the limits a call may set.
pub(crate) fn row_reads(key: &[u8], bytes: &[u8]) -> bool {
    let record = <TopicPolicy as prost::Message>::decode(bytes);
    PolicyKey::decode(key).is_some() && record.is_ok_and(|p| p.rate_per_second <= MAX_RATE)
}

/// When the change a policy's row holds was made (0: it does not read).
pub(crate) fn changed_at(bytes: &[u8]) -> u64 {
    <TopicPolicy as prost::Message>::decode(bytes).map_or(0, |p| p.updated_ms)
}

/// A policy's row key as a person reads it.
pub(crate) fn describe_row(key: &[u8]) -> String {
    match PolicyKey::decode(key) {
        Some(key) => format!("the policy of {}", key.describe()),
        None => format!("a policy {:?}", String::from_utf8_lossy(key)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(t: &str) -> Option<Tenant> {
        Some(Tenant::parse(t).unwrap())
    }

    #[test]
    fn a_key_reads_back_as_it_was_written() {
        for key in [
            PolicyKey::topic_wide("orders"),
            PolicyKey { tenant: tenant("acme"), topic: "orders.created".into() },
        ] {
            assert_eq!(PolicyKey::decode(&key.encode()), Some(key));
        }
        assert_eq!(PolicyKey::decode(b"no-separator"), None);
        assert_eq!(PolicyKey::decode(b"acme\0"), None, "a key names a topic");
    }

    #[test]
    fn a_lane_holds_its_topics_messages_of_its_tenant_by_their_stored_bytes() {
        let wide = PolicyKey::topic_wide("a");
        let acme = PolicyKey { tenant: tenant("acme"), topic: "a".into() };
        assert!(wide.holds_raw(b"x", b"a") && wide.holds_raw(b"\0acme\0x", b"a"));
        assert!(!wide.holds_raw(b"x", b"ab"));
        assert!(acme.holds_raw(b"\0acme\0x", b"a"));
        assert!(
            !acme.holds_raw(b"x", b"a")
                && !acme.holds_raw(b"\0acmex\0x", b"a")
                && !acme.holds_raw(b"\0acme", b"a")
        );
    }

    #[test]
    fn the_topic_wide_policy_and_the_tenants_own_both_apply() {
        let mut table = Table::default();
        let paused = TopicPolicy { paused_at_ms: 5, ..TopicPolicy::default() };
        let limited = TopicPolicy { rate_per_second: 100, ..TopicPolicy::default() };
        table.set(PolicyKey::topic_wide("a"), Some(paused.clone()));
        table.set(PolicyKey { tenant: tenant("acme"), topic: "a".into() }, Some(limited.clone()));
        let [wide, own] = table.applying(Some("acme"), "a");
        assert_eq!(wide.map(|(_, p)| p), Some(&paused));
        assert_eq!(own.map(|(_, p)| p), Some(&limited));
        let [wide, own] = table.applying(Some("other"), "a");
        assert!(wide.is_some() && own.is_none(), "another tenant's policy is not this one's");
        assert_eq!(table.applying(None, "b"), [None, None]);
        table.set(PolicyKey::topic_wide("a"), Some(TopicPolicy::default()));
        assert!(table.get(&PolicyKey::topic_wide("a")).is_none(), "a policy that says nothing is removed");
    }

    #[test]
    fn a_tenants_default_deadline_wins_over_the_topics() {
        let mut table = Table::default();
        let late = |ms| TopicPolicy { max_lateness_ms: ms, ..TopicPolicy::default() };
        table.set(PolicyKey::topic_wide("a"), Some(late(60_000)));
        table.set(PolicyKey { tenant: tenant("acme"), topic: "a".into() }, Some(late(5_000)));
        assert_eq!(table.max_lateness(Some("acme"), "a"), Some(Duration::from_secs(5)));
        assert_eq!(table.max_lateness(Some("other"), "a"), Some(Duration::from_secs(60)));
        assert_eq!(table.max_lateness(None, "b"), None);
        assert!(table.get(&PolicyKey::topic_wide("a")).is_some(), "a deadline alone is kept");
    }

    #[test]
    fn a_tenants_dead_letter_topic_wins_over_the_topics() {
        let mut table = Table::default();
        let to = |t: &str| TopicPolicy { dead_letter_topic: t.to_owned(), ..TopicPolicy::default() };
        table.set(PolicyKey::topic_wide("a"), Some(to("a.dead")));
        table.set(PolicyKey { tenant: tenant("acme"), topic: "a".into() }, Some(to("acme.dead")));
        assert_eq!(table.dead_letter_topic(Some("acme"), "a"), Some("acme.dead"));
        assert_eq!(table.dead_letter_topic(Some("other"), "a"), Some("a.dead"));
        assert_eq!(table.dead_letter_topic(None, "b"), None);
        assert!(table.get(&PolicyKey::topic_wide("a")).is_some(), "a dead-letter topic alone is kept");
    }

    #[test]
    fn a_limit_without_a_burst_gets_a_tenth_of_a_second() {
        let p = TopicPolicy { rate_per_second: 20_000, ..TopicPolicy::default() };
        assert_eq!(p.rate(), Some(Rate { per_second: 20_000, burst: 2_000 }));
        let p = TopicPolicy { rate_per_second: 3, ..TopicPolicy::default() };
        assert_eq!(p.rate().unwrap().burst, 1);
    }
}
