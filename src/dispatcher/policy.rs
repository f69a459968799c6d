//! The dispatch policies applied (see [`crate::policy`]): a paused topic's
//! messages wait, and a rate-limited topic's come out at the limit, in due
//! order, while every other topic goes on.
//!
//! A message a policy holds back is not remembered one by one: its claim
//! goes back, and its **lane** (the policy's topic, for its tenant or for
//! every tenant) remembers the lowest due entry it holds, its cursor. The
//! walk of the due index goes on past it. When the lane may go again (the
//! topic resumed, its bucket refilled) the dispatcher walks the index from
//! the lane's cursor up to its own position, taking that lane's entries
//! only ([`Store::take_lane`](crate::store::Store)), as many as the bucket
//! allows. A paused topic with millions parked costs a walk past them, and
//! memory for one key. While a lane has a cursor, a later message of it
//! waits behind it even when tokens are there, so each lane goes out in
//! due order.

use std::{collections::HashMap, sync::Arc, time::Duration};

use tokio::{sync::watch, time::Instant};

use super::{Dispatcher, Next};
use crate::{
    command::DispatchKey,
    message::{HeldBack, UnixMillis},
    metrics,
    policy::{Bucket, PolicyKey, Table},
};

/// The most of a lane taken in one walk.
const LANE_CHUNK: usize = 2048;

/// Why a lane's messages wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Why {
    Paused,
    Limited,
}

impl Why {
    fn label(self) -> &'static str {
        match self {
            Why::Paused => "paused",
            Why::Limited => "rate_limit",
        }
    }
}

/// What the dispatcher keeps of the policies: the table, a bucket per rate
/// limit, and the lanes held back.
pub(super) struct Policies {
    watch: watch::Receiver<Arc<Table>>,
    table: Arc<Table>,
    buckets: foldhash::HashMap<PolicyKey, Bucket>,
    lanes: foldhash::HashMap<PolicyKey, LaneState>,
    /// The (topic, tenant) labels of the paused-since gauge this set.
    paused_labels: Vec<[String; 2]>,
    /// Lanes were shown held back at the last look.
    shown: bool,
}

/// A lane with messages held back.
struct LaneState {
    /// The lowest due entry of the lane that may be pending and is not
    /// anywhere else the dispatcher looks; none while it is walked.
    cursor: Option<DispatchKey>,
    /// When it was first held, this time: a message produced from it was
    /// late by the policy from then (or from its due time, if later).
    since: UnixMillis,
    why: Why,
    /// Its last walk failed: not walked again before this.
    retry_at: Option<Instant>,
    /// Its cursor was in every floor sent since the store last recorded
    /// that the lane may be produced from it: false once a floor left it
    /// out (it was paused), and then the store is told before its walk.
    covered: bool,
}

/// A lane that may go now, and how much of it.
pub(super) struct Runnable {
    pub key: PolicyKey,
    pub from: DispatchKey,
    pub budget: usize,
    /// The store must record that the lane may be produced from `from`
    /// before it is walked.
    pub uncovered: bool,
}

impl Policies {
    pub(super) fn new(mut watch: watch::Receiver<Arc<Table>>) -> Policies {
        let table = Arc::clone(&watch.borrow_and_update());
        let mut policies = Policies {
            watch,
            table,
            buckets: foldhash::HashMap::default(),
            lanes: foldhash::HashMap::default(),
            paused_labels: Vec::new(),
            shown: false,
        };
        policies.refreshed(Instant::now());
        policies
    }

    /// Resolves when the table changes, with the change taken in.
    /// (Cancel-safe: nothing is awaited after the change is seen.)
    pub(super) async fn changed(&mut self) {
        if self.watch.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
        self.table = Arc::clone(&self.watch.borrow_and_update());
        self.refreshed(Instant::now());
    }

    /// Takes a changed table in.
    pub(super) fn refresh(&mut self) {
        if self.watch.has_changed().unwrap_or(false) {
            self.table = Arc::clone(&self.watch.borrow_and_update());
            self.refreshed(Instant::now());
        }
    }

    fn refreshed(&mut self, now: Instant) {
        let table = &self.table;
        self.buckets.retain(|key, _| table.get(key).and_then(|p| p.rate()).is_some());
        for (key, policy) in table.iter() {
            if let (Some(rate), Some(bucket)) = (policy.rate(), self.buckets.get_mut(key))
                && bucket.rate() != rate
            {
                bucket.set_rate(rate, now);
            }
        }
        let paused = table.iter().filter(|(_, p)| p.paused()).count();
        metrics::TOPIC_POLICIES.with_label_values(&["paused"]).set(paused as i64);
        let limited = table.iter().filter(|(_, p)| p.rate().is_some()).count();
        metrics::TOPIC_POLICIES.with_label_values(&["rate_limited"]).set(limited as i64);
        let since: HashMap<[String; 2], i64> = table
            .iter()
            .filter_map(|(key, p)| {
                let tenant = key.tenant.as_ref().map_or("", |t| t.as_str());
                Some(([key.topic.to_string(), tenant.to_owned()], (p.paused_at()?.0 / 1000) as i64))
            })
            .collect();
        for gone in self.paused_labels.iter().filter(|l| !since.contains_key(*l)) {
            let _ = metrics::TOPIC_PAUSED_SINCE.remove_label_values(&[&gone[0], &gone[1]]);
        }
        for (labels, at) in &since {
            metrics::TOPIC_PAUSED_SINCE.with_label_values(&[&labels[0], &labels[1]]).set(*at);
        }
        self.paused_labels = since.into_keys().collect();
    }

    /// Whether a message of `tenant` to `topic`, at `key`, waits for a
    /// policy: the lane that holds it, and why. Takes no token.
    pub(super) fn holds(
        &mut self,
        tenant: Option<&str>,
        topic: &str,
        key: DispatchKey,
    ) -> Option<(PolicyKey, Why)> {
        if self.table.is_empty() && self.lanes.is_empty() {
            return None;
        }
        let now = Instant::now();
        for (lane, policy) in self.table.applying(tenant, topic).into_iter().flatten() {
            if policy.paused() {
                return Some((lane.clone(), Why::Paused));
            }
            if let Some(state) = self.lanes.get(lane)
                && state.cursor.is_some_and(|cursor| cursor < key)
            {
                // Behind what its lane holds: in due order.
                return Some((lane.clone(), state.why));
            }
            if let Some(rate) = policy.rate() {
                let bucket = self.buckets.entry(lane.clone()).or_insert_with(|| Bucket::new(rate, now));
                if bucket.available(now) == 0 {
                    return Some((lane.clone(), Why::Limited));
                }
            }
        }
        // A lane whose policy was removed still goes out in order.
        if self.lanes.is_empty() {
            return None;
        }
        lane_keys(tenant, topic).into_iter().flatten().find_map(|lane| {
            let state = self.lanes.get(&lane)?;
            state.cursor.is_some_and(|cursor| cursor < key).then_some((lane, state.why))
        })
    }

    /// The deadline past their due time of a message of `tenant` to
    /// `topic` that names none.
    pub(super) fn max_lateness(&self, tenant: Option<&str>, topic: &str) -> Option<Duration> {
        if self.table.is_empty() {
            return None;
        }
        self.table.max_lateness(tenant, topic)
    }

    /// The policies as they stand now.
    pub(super) fn table(&self) -> Arc<Table> {
        Arc::clone(&self.table)
    }

    /// Where a message of `tenant` to `topic` that names none goes when it
    /// fails or expires, by policy.
    pub(super) fn dead_letter_topic(&self, tenant: Option<&str>, topic: &str) -> Option<&str> {
        if self.table.is_empty() {
            return None;
        }
        self.table.dead_letter_topic(tenant, topic)
    }

    /// A message of `tenant` to `topic` goes now: one token of each limit.
    pub(super) fn take(&mut self, tenant: Option<&str>, topic: &str) {
        if self.buckets.is_empty() {
            return;
        }
        let now = Instant::now();
        for (lane, _) in self.table.applying(tenant, topic).into_iter().flatten() {
            if let Some(bucket) = self.buckets.get_mut(lane) {
                bucket.take(now);
            }
        }
    }

    /// `lane` holds the message at `key` back, for `why`.
    pub(super) fn hold(&mut self, lane: PolicyKey, why: Why, key: DispatchKey, now: UnixMillis) {
        let state = self.lanes.entry(lane).or_insert(LaneState {
            cursor: None,
            since: now,
            why,
            retry_at: None,
            covered: true,
        });
        state.cursor = Some(state.cursor.map_or(key, |c| c.min(key)));
        state.why = why;
    }

    /// The lanes holding messages back now: a walk of the due index steps
    /// over their entries, which their lanes take in turn.
    pub(super) fn held_lanes(&self) -> Arc<[PolicyKey]> {
        self.lanes.iter().filter(|(_, l)| l.cursor.is_some()).map(|(k, _)| k.clone()).collect()
    }

    /// A walk of the due index stepped over `lane`'s entries from `lowest`
    /// on: its lane takes them (again, if it was done meanwhile).
    pub(super) fn stepped_over(&mut self, lane: PolicyKey, lowest: DispatchKey, now: UnixMillis) {
        let why = match self.table.get(&lane) {
            Some(p) if p.paused() => Why::Paused,
            _ => self.lanes.get(&lane).map_or(Why::Limited, |l| l.why),
        };
        self.hold(lane, why, lowest, now);
    }

    /// The lanes that may go now, each with how many it may take (taking
    /// their cursors: each is walked now, and holds again what waits).
    /// A lane whose topic waits for its own reasons (`topic_held`:
    /// stalled, refused) or whose last walk failed a moment ago waits too.
    pub(super) fn runnable(&mut self, topic_held: impl Fn(&str) -> bool) -> Vec<Runnable> {
        let now = Instant::now();
        let mut runnable = Vec::new();
        for (key, state) in &mut self.lanes {
            let Some(from) = state.cursor else { continue };
            let policy = self.table.get(key);
            if policy.is_some_and(|p| p.paused())
                || topic_held(&key.topic)
                || state.retry_at.is_some_and(|at| now < at)
            {
                continue;
            }
            let budget = match (policy.and_then(|p| p.rate()), self.buckets.get_mut(key)) {
                (Some(_), Some(bucket)) => bucket.available(now) as usize,
                _ => usize::MAX,
            };
            if budget > 0 {
                state.cursor = None;
                runnable.push(Runnable {
                    key: key.clone(),
                    from,
                    budget: budget.min(LANE_CHUNK),
                    uncovered: !state.covered,
                });
            }
        }
        runnable
    }

    /// A walk of `lane` stopped short at `next` (more of it may follow).
    pub(super) fn walked(&mut self, lane: &PolicyKey, next: Option<DispatchKey>) {
        if let Some(state) = self.lanes.get_mut(lane) {
            state.retry_at = None;
            if let Some(next) = next {
                state.cursor = Some(state.cursor.map_or(next, |c| c.min(next)));
            }
            if state.cursor.is_none() {
                self.lanes.remove(lane);
            }
        }
    }

    /// How long a message due at `due` of (`tenant`, `topic`) waited for a
    /// policy, if its lane held it: observed when it is produced.
    pub(super) fn observe_produced(
        &self,
        tenant: Option<&str>,
        topic: &str,
        due: UnixMillis,
        now: UnixMillis,
    ) {
        if self.lanes.is_empty() {
            return;
        }
        for lane in lane_keys(tenant, topic).into_iter().flatten() {
            if let Some(state) = self.lanes.get(&lane) {
                let waited = now.since(state.since.max(due));
                metrics::POLICY_DELAY.with_label_values(&[state.why.label()]).observe(waited.as_secs_f64());
                return;
            }
        }
    }

    /// What the lanes hold back now, for `Get`, `List` and `Stats`; none
    /// when nothing was held at the last call either.
    pub(super) fn held_back(&mut self) -> Option<Vec<HeldBack>> {
        if self.lanes.is_empty() && !self.shown {
            return None;
        }
        self.shown = !self.lanes.is_empty();
        Some(
            self.lanes
                .iter()
                .filter_map(|(key, state)| {
                    Some(HeldBack {
                        topic: key.topic.to_string(),
                        tenant: key.tenant.clone(),
                        // As its policy says now: a limited lane paused since.
                        paused: self.table.get(key).map_or(state.why == Why::Paused, |p| p.paused()),
                        since: state.since,
                        oldest_due: state.cursor?.at,
                    })
                })
                .collect(),
        )
    }

    /// The lowest entry a lane holds, for the floor.
    pub(super) fn lowest(&self) -> Option<DispatchKey> {
        self.lanes.values().filter_map(|l| l.cursor).min()
    }

    /// The lowest entry a lane that is not paused holds: what a paused
    /// topic holds cannot be produced while it is, so after an unclean
    /// stop it is not in doubt (with millions paused, a restart would
    /// otherwise read them all).
    pub(super) fn lowest_producible(&self) -> Option<DispatchKey> {
        self.lanes.iter().filter(|(key, _)| !self.paused(key)).filter_map(|(_, l)| l.cursor).min()
    }

    /// A floor left the paused lanes out (see [`Self::lowest_producible`]).
    pub(super) fn left_out_paused(&mut self) {
        let table = &self.table;
        for (_, lane) in self.lanes.iter_mut().filter(|(key, _)| table.get(key).is_some_and(|p| p.paused())) {
            lane.covered = false;
        }
    }

    /// The store recorded that `lane` may be produced from its cursor on.
    pub(super) fn covered(&mut self, lane: &PolicyKey) {
        if let Some(state) = self.lanes.get_mut(lane) {
            state.covered = true;
        }
    }

    fn paused(&self, key: &PolicyKey) -> bool {
        self.table.get(key).is_some_and(|p| p.paused())
    }

    /// When the next limited lane may go (none: no lane waits for tokens).
    /// A lane without a limit that is not paused goes on at once (its walk
    /// stopped short); one whose walk failed, once it may try again.
    pub(super) fn next_refill(&mut self, topic_held: impl Fn(&str) -> bool) -> Option<Duration> {
        let now = Instant::now();
        let table = &self.table;
        let buckets = &mut self.buckets;
        self.lanes
            .iter()
            .filter(|(key, state)| {
                state.cursor.is_some()
                    && !table.get(key).is_some_and(|p| p.paused())
                    && !topic_held(&key.topic)
            })
            .map(|(key, state)| {
                let refill = buckets.get_mut(key).map_or(Duration::ZERO, |b| b.ready_in(now));
                let retry = state.retry_at.map_or(Duration::ZERO, |at| at.saturating_duration_since(now));
                refill.max(retry)
            })
            .min()
    }

    /// A walk of `lane` failed: it waits `for_` before it is tried again.
    pub(super) fn failed(&mut self, lane: &PolicyKey, from: DispatchKey, for_: Duration) {
        self.walked(lane, Some(from));
        if let Some(state) = self.lanes.get_mut(lane) {
            state.retry_at = Some(Instant::now() + for_);
        }
    }
}

/// The lanes a message of `tenant` to `topic` can be held in: the
/// topic-wide one and its tenant's.
fn lane_keys(tenant: Option<&str>, topic: &str) -> [Option<PolicyKey>; 2] {
    let own = tenant.and_then(|t| crate::message::Tenant::parse(t).ok());
    [Some(PolicyKey::topic_wide(topic)), own.map(|t| PolicyKey { tenant: Some(t), topic: topic.into() })]
}

impl Dispatcher {
    /// Walks each lane that may go now, and produces what it may of it.
    /// Returns how many were produced.
    pub(super) async fn run_lanes(&mut self, now: UnixMillis, room: usize) -> usize {
        self.policies.refresh();
        let mut produced = 0;
        let states = &self.topics.states;
        let runnable = self.policies.runnable(|topic| states.get(topic).is_some_and(|t| t.held(now)));
        for lane in runnable {
            let budget = lane.budget.min(room.saturating_sub(produced));
            // In cluster mode the lease may have lapsed during the last walk.
            if budget == 0 || !self.gate.open() {
                self.policies.walked(&lane.key, Some(lane.from));
                continue;
            }
            if lane.uncovered {
                if let Err(e) = self.store.producing_from(lane.from).await {
                    tracing::warn!(lane = %lane.key.describe(), error = %e, "recording that a resumed topic's messages go out failed; trying again shortly");
                    self.policies.failed(&lane.key, lane.from, self.config.max_sleep);
                    continue;
                }
                self.policies.covered(&lane.key);
            }
            // While a search for what an unclean stop left in doubt runs,
            // what lies below its window waits for it (a lane's cursor may
            // lie there, set by a message handed over); the walk brings it
            // back once the search ends.
            let from = self.doubt.walk_from(lane.from);
            match self.store.take_lane(lane.key.clone(), from, self.scan.from, budget).await {
                Ok(batch) => {
                    let next = batch.more.then_some(batch.next_from);
                    produced += self.handle(batch, now).await;
                    self.policies.walked(&lane.key, next);
                }
                Err(e) => {
                    tracing::warn!(lane = %lane.key.describe(), error = %e, "reading a held topic's messages failed; trying again shortly");
                    self.store.due_read_failed(&e);
                    self.policies.failed(&lane.key, lane.from, self.config.max_sleep);
                }
            }
        }
        produced
    }

    /// `next`, or sooner if a rate-limited lane may go before then.
    pub(super) fn sooner_for_lanes(&mut self, next: Next) -> Next {
        let now = self.clock.now();
        let states = &self.topics.states;
        let Some(wait) = self.policies.next_refill(|topic| states.get(topic).is_some_and(|t| t.held(now)))
        else {
            return next;
        };
        let at = self.clock.now().saturating_add(wait.max(Duration::from_millis(1)));
        match next {
            Next::Now | Next::Full | Next::Commits => next,
            Next::At(t) => Next::At(t.min(at)),
            Next::Idle => Next::At(at),
        }
    }
}
