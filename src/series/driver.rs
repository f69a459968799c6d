//! The driver: parks each series' next occurrence shortly before it is due
//! ([`LEAD`](super::book::LEAD)), as an ordinary message, and moves the
//! series on.
//!
//! It sleeps until the earliest wake in the shards' wake indexes (or until
//! a call changes a series), then takes the series that are due, a batch at
//! a time, each under its lock. For each it decides what to park: the next
//! occurrence; or, when it comes to it more than the series' `missed.after`
//! late (hourglass was down, or Kafka was), what the series' downtime
//! policy fires of the occurrences missed. It writes that decision to the
//! series first (`firing`), then parks the occurrences, then records them
//! as parked. A crash between the steps parks the same occurrences again
//! when the driver starts: the same ids and content, so a retry, answered
//! as a duplicate and never delivered twice.
//!
//! The policy decides what was missed. An occurrence hourglass could not
//! park in time (it was down, or its store refused writes) is decided on
//! when the driver comes to it. One parked on time that Kafka could not
//! take (down, or refusing) is looked at again once it is `missed.after`
//! past its time: if it is still pending, the policy keeps it to go out
//! when Kafka can take it (the latest one, or the latest `at_most`) or
//! cancels it, and a cancelled one counts as skipped.

use std::{sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

use super::{
    book::{Change, Record, park_at, wake_of},
    record::SeriesRecord,
    spec::{Spec, occurrence_id},
};
use crate::{
    Error,
    command::{Intent, NewId, NewMessage},
    message::{CancelOutcome, DueSpec, Envelope, Header, MessageId, OnConflict, Scope, Tenant, UnixMillis},
    metrics,
    store::{Reader, StoreError},
};

/// Header carrying the series id on each occurrence's record.
pub(crate) const SERIES_HEADER: &str = "hourglass-series";
/// Header carrying the occurrence's time before jitter, in Unix ms.
pub(crate) const OCCURRENCE_HEADER: &str = "hourglass-occurrence-ms";
/// Series taken in one batch, at most.
const BATCH: usize = 512;
/// The longest the driver sleeps: a wall clock step is noticed within it.
const MAX_SLEEP: Duration = Duration::from_secs(1);
/// Occurrences a series keeps parked and waiting to be judged, at most:
/// all that `missed.after` lets wait at once
/// ([`MAX_WAITING`](super::spec::MAX_WAITING)), and room for the jitter.
const MAX_PARKED: usize = super::spec::MAX_WAITING as usize + 24;
/// Cancels of missed occurrences under way at once.
const CANCELS_AT_ONCE: usize = 32;
/// How long the driver waits for a missed occurrence's cancel: longer
/// only for one the dispatcher has handed to Kafka's client.
const CANCEL_WAIT: Duration = Duration::from_millis(500);

/// Runs the driver until `stop`.
pub(crate) async fn run(series: Arc<super::Series>, stop: CancellationToken) {
    loop {
        let next = drive(&series, &stop).await;
        let sleep = next.map_or(MAX_SLEEP, |at| series.clock.until(at).min(MAX_SLEEP));
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = series.wake.notified() => {}
            _ = tokio::time::sleep(sleep) => {}
        }
    }
}

/// Parks what is due now, a batch of each shard in turn, until nothing is
/// due or `stop` (a busy driver always finds more due); the next wake
/// after it. A shard whose store or log fails is tried again at the next
/// wake; the others go on.
async fn drive(series: &super::Series, stop: &CancellationToken) -> Option<UnixMillis> {
    loop {
        let (mut next, mut more) = (None, false);
        for (shard, store) in series.book.shards() {
            if stop.is_cancelled() {
                return None;
            }
            let now = series.clock.now();
            let driven = async {
                let (due, after) = series.book.waking(shard, &store, now, BATCH).await?;
                if due.is_empty() {
                    return Ok((after, false));
                }
                let taken = due.len();
                // Every wake taken is moved on, unless a call held its
                // series: those are taken again at the next wake, a second
                // later at most.
                Ok::<_, Error>((None, drive_batch(series, &store, due, now).await? < taken))
            };
            match driven.await {
                Ok((after, again)) => {
                    next = earliest(next, after);
                    more |= again;
                }
                // A shard moving to or from this node (in a cluster).
                Err(Error::Store(e @ StoreError::NotOwner(_))) => {
                    tracing::debug!(shard, error = %e, "the series driver skipped a shard it does not own")
                }
                Err(e) => {
                    tracing::warn!(shard, error = %e, "the series driver could not park occurrences; trying again")
                }
            }
        }
        if !more {
            return next;
        }
    }
}

fn earliest(a: Option<UnixMillis>, b: Option<UnixMillis>) -> Option<UnixMillis> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// One series' step: its record after the decision, and what to park.
struct Step {
    id: MessageId,
    spec: Spec,
    record: SeriesRecord,
    /// Whether it parks occurrences in this batch.
    fires: bool,
    /// The wake its decision was written with; whether the record changed
    /// after it (and is written again).
    written_wake: Option<UnixMillis>,
    changed: bool,
}

impl Step {
    fn new(id: MessageId, spec: Spec, record: SeriesRecord) -> Step {
        Step { id, spec, record, fires: false, written_wake: None, changed: false }
    }

    /// When the occurrence of nominal time `at` is due (with its jitter).
    fn due(&self, at: u64) -> UnixMillis {
        self.spec.rule.due(self.id.as_str(), UnixMillis(at))
    }
}

/// Takes the series `due` (each with the wake it was found at) of the
/// shard whose store is `store`; returns how many a call held (left for
/// later).
async fn drive_batch(
    series: &super::Series,
    store: &Reader,
    due: Vec<(UnixMillis, MessageId)>,
    now: UnixMillis,
) -> Result<usize, Error> {
    let book = &series.book;
    let mut stripes: Vec<usize> = due.iter().map(|(_, id)| book.stripe(id)).collect();
    stripes.sort_unstable();
    stripes.dedup();
    let mut guards = Vec::with_capacity(stripes.len());
    let mut held = Vec::new();
    for stripe in stripes {
        match book.try_lock_stripe(stripe) {
            Some(guard) => guards.push(guard),
            None => held.push(stripe),
        }
    }
    let mut busy = 0;
    let mut steps = Vec::new();
    let mut changes = Vec::new();
    let (mut ids, mut found) = (Vec::with_capacity(due.len()), Vec::with_capacity(due.len()));
    for (found_at, id) in due {
        if held.contains(&book.stripe(&id)) {
            busy += 1;
        } else {
            ids.push(id);
            found.push(found_at);
        }
    }
    let records = book.load_many(&ids).await?;
    for ((id, found_at), record) in ids.into_iter().zip(found).zip(records) {
        let record = match record {
            Some(Ok(record)) => record,
            // Deleted: a wake left behind goes.
            None => {
                changes.push(Change { id, record: Record::Delete, old_wake: Some(found_at), wake: None });
                continue;
            }
            Some(Err(e)) => {
                unreadable(&id, &e.to_string());
                changes.push(Change { id, record: Record::Keep, old_wake: Some(found_at), wake: None });
                continue;
            }
        };
        let spec = match record.spec() {
            Ok(spec) => spec,
            Err(e) => {
                unreadable(&id, &format!("{}: {}", e.field, e.reason));
                changes.push(Change { id, record: Record::Keep, old_wake: Some(found_at), wake: None });
                continue;
            }
        };
        let mut step = Step::new(id, spec, record);
        if stop_if_not_granted(series, &mut step, now) {
            // What it parked (and what a crash left it about to park) would
            // go to the topic its tenant lost: cancelled, as a pause does.
            if let Err(e) = series.cancel_parked(&step.id, &mut step.record).await {
                tracing::warn!(series = %step.id.qualified(), error = %e, "cancelling the occurrences of a series paused for its grant failed; those already parked may still go out");
            }
            step.record.firing.clear();
        }
        step.fires = decide(&mut step, now);
        // While its decision is not parked, the series stays due: a crash
        // or a failed park is taken up again at once, not a period later.
        step.written_wake =
            if step.fires { Some(found_at) } else { wake_of(&step.id, &step.record, &step.spec) };
        changes.push(Change {
            id: step.id.clone(),
            record: Record::Put(Box::new(step.record.clone())),
            old_wake: Some(found_at),
            wake: step.written_wake,
        });
        steps.push(step);
    }
    // The decision first: a crash after it parks the same again.
    book.save(changes).await?;
    let fresh = park(series, &mut steps, now).await?;
    review(series, store, &mut steps, &fresh, now).await;
    let confirmed = steps
        .into_iter()
        .filter(|step| step.fires || step.changed)
        .map(|step| {
            let wake = wake_of(&step.id, &step.record, &step.spec);
            Change {
                id: step.id,
                record: Record::Put(Box::new(step.record)),
                old_wake: step.written_wake,
                wake,
            }
        })
        .collect();
    book.save(confirmed).await?;
    drop(guards);
    Ok(busy)
}

/// Pauses a series whose tenant's tokens no longer cover its topic (the
/// tokens file was narrowed since it was made), saying why: it parks
/// nothing more there. Its tenant can delete it, and resume it once its
/// grant covers the topic again.
fn stop_if_not_granted(series: &super::Series, step: &mut Step, now: UnixMillis) -> bool {
    let template = &step.spec.template;
    // Its topic, and the dead-letter topic its occurrences name, if any.
    let lost = std::iter::once(&template.topic)
        .chain(&template.dead_letter_topic)
        .find(|topic| !series.grants.covers(step.id.tenant(), topic));
    let Some(topic) = lost.filter(|_| !step.record.paused) else { return false };
    tracing::warn!(
        series = %step.id.qualified(),
        %topic,
        "a series' tenant is no longer granted its topic: the series is paused"
    );
    metrics::SERIES_OCCURRENCES.with_label_values(&["ungranted"]).inc();
    step.record.paused = true;
    step.record.updated_ms = now.0;
    step.record.paused_reason = format!(
        "paused by hourglass: the tokens of tenant {:?} no longer cover topic {topic:?}",
        step.id.tenant().unwrap_or_default()
    );
    true
}

/// A series whose record does not read (written by a newer build, or
/// damaged): said, and left alone, without a wake; the others go on.
fn unreadable(id: &MessageId, why: &str) {
    metrics::SERIES_OCCURRENCES.with_label_values(&["unreadable"]).inc();
    tracing::error!(
        series = %id.qualified(),
        error = why,
        "a series' record does not read: it parks nothing until it is updated or deleted"
    );
}

/// Decides what series `step` parks at `now`: its next occurrence, or what
/// its policy fires of those it missed. False when nothing is due yet.
fn decide(step: &mut Step, now: UnixMillis) -> bool {
    let record = &mut step.record;
    if !record.firing.is_empty() {
        // Left by a crash between the decision and the parking.
        return true;
    }
    let Some(nominal) = record.next_ms.map(UnixMillis) else { return false };
    if record.paused || park_at(&step.id, record, &step.spec).is_some_and(|wake| wake > now) {
        return false;
    }
    let rule = &step.spec.rule;
    let due = rule.due(step.id.as_str(), nominal);
    let (fire, skipped, next) = if now.0 > due.0.saturating_add(step.spec.missed_after.as_millis() as u64) {
        let caught = rule.catch_up(nominal, now, record.made(), step.spec.missed);
        (caught.fire, caught.skipped, caught.next)
    } else {
        (vec![nominal], 0, rule.next_after(nominal, record.made() + 1))
    };
    metrics::SERIES_OCCURRENCES.with_label_values(&["skipped"]).inc_by(skipped);
    record.fired += fire.len() as u64;
    record.skipped += skipped;
    if let Some(last) = fire.last() {
        record.last_parked_ms = record.last_parked_ms.max(last.0);
    }
    record.next_ms = next.map(|t| t.0);
    record.firing = fire.into_iter().map(|t| t.0).collect();
    true
}

/// Parks the occurrences each step is firing, and moves them to its
/// parked ones; returns them, (step, nominal time), as parked just now.
async fn park(
    series: &super::Series,
    steps: &mut [Step],
    now: UnixMillis,
) -> Result<Vec<(usize, u64)>, Error> {
    let node = series.book.node();
    let mut msgs = Vec::new();
    let mut owners = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let scope = space_of(&step.id);
        for at in &step.record.firing {
            let nominal = UnixMillis(*at);
            let due = step.spec.rule.due(step.id.as_str(), nominal);
            metrics::SERIES_PARK_LEAD.observe(due.0.saturating_sub(now.0) as f64 / 1000.0);
            msgs.push(NewMessage {
                id: NewId::Client(occurrence_id(&step.id, nominal, series.shards())),
                scope: scope.clone(),
                envelope: occurrence(&step.spec.template, &step.id, nominal),
                requested: DueSpec::At(due),
                due,
                now,
                on_conflict: OnConflict::Reject,
            });
            owners.push((i, nominal));
        }
    }
    if msgs.is_empty() {
        return Ok(Vec::new());
    }
    let answers = node.schedule_batch(msgs).await?;
    let mut failed = None;
    let mut fresh = Vec::new();
    for ((i, nominal), answer) in owners.into_iter().zip(answers) {
        let step = &mut steps[i];
        match answer {
            Ok(_) => {
                metrics::SERIES_OCCURRENCES.with_label_values(&["parked"]).inc();
                step.record.parked.push(nominal.0);
                fresh.push((i, nominal.0));
            }
            Err(StoreError::IdConflict(_)) => {
                metrics::SERIES_OCCURRENCES.with_label_values(&["taken"]).inc();
                tracing::warn!(
                    series = %step.id.qualified(),
                    occurrence = nominal.0,
                    "another message holds the id of a series' occurrence; the occurrence is left out"
                );
            }
            Err(e) => failed = Some(e),
        }
    }
    if let Some(e) = failed {
        // Its decision stays: the next try parks the same occurrences.
        return Err(e.into());
    }
    for step in steps.iter_mut() {
        step.record.firing.clear();
        make_room(&mut step.record);
    }
    Ok(fresh)
}

/// Keeps a series' parked occurrences within [`MAX_PARKED`] without losing
/// sight of any: past it (only when their states could not be read for a
/// long while, as `missed.after` bounds how many wait at once), the oldest
/// are judged missed now, and the downtime policy keeps or cancels them as
/// any missed one. Forgotten instead, they would stay pending past a
/// Pause or a Delete.
fn make_room(record: &mut SeriesRecord) {
    if record.parked.len() > MAX_PARKED {
        record.parked.sort_unstable();
        let over = record.parked.len() - MAX_PARKED;
        record.late.extend(record.parked.drain(..over));
    }
}

/// Looks at the occurrences each series parked before (not those parked
/// just now, `fresh`, nor any not due yet), read at once from `store`, the
/// steps' shard's, where their occurrences are. Those settled are
/// forgotten. One still pending `missed.after` past its time was missed:
/// Kafka could not take it (down, or refusing). The downtime policy says
/// which of the missed stay, to go out when Kafka can take them: none
/// (skip), the latest (fire one) or the latest `at_most` (fire each); the
/// others are cancelled and count as skipped. A read or a cancel that
/// fails is tried again at the series' next wake.
async fn review(
    series: &super::Series,
    store: &Reader,
    steps: &mut [Step],
    fresh: &[(usize, u64)],
    now: UnixMillis,
) {
    let fresh: std::collections::HashSet<(usize, u64)> = fresh.iter().copied().collect();
    let fresh = &fresh;
    let looked: Vec<(usize, u64)> = steps
        .iter()
        .enumerate()
        .flat_map(|(i, step)| {
            let record = &step.record;
            record
                .parked
                .iter()
                .chain(&record.late)
                .filter(move |at| step.due(**at) <= now && !fresh.contains(&(i, **at)))
                .map(move |at| (i, *at))
        })
        .collect();
    if !looked.is_empty() {
        let ids = looked.iter().map(|(i, at)| occurrence_id(&steps[*i].id, UnixMillis(*at), series.shards()));
        match store.settled_among(ids.collect()).await {
            Ok(settled) => {
                for ((i, at), settled) in looked.into_iter().zip(settled) {
                    let step = &mut steps[i];
                    let missed =
                        step.due(at).0.saturating_add(step.spec.missed_after.as_millis() as u64) <= now.0;
                    let record = &mut step.record;
                    if settled {
                        record.parked.retain(|p| *p != at);
                        record.late.retain(|p| *p != at);
                        step.changed = true;
                    } else if missed && record.parked.contains(&at) {
                        record.parked.retain(|p| *p != at);
                        record.late.push(at);
                        step.changed = true;
                    }
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "the series driver could not read its parked occurrences' states")
            }
        }
    }
    for step in steps.iter_mut() {
        let keep = step.spec.missed.keeps();
        if step.record.late.len() > keep {
            step.record.late.sort_unstable();
            let over = step.record.late.len() - keep;
            let dropped: Vec<u64> = step.record.late.drain(..over).collect();
            let failed = cancel_missed(series, step, dropped, now).await;
            step.record.late.splice(0..0, failed);
            step.changed = true;
        }
    }
}

/// Cancels the missed occurrences `at` of `step`'s series; those cancelled
/// count as skipped, not fired. One the dispatcher handed to Kafka's
/// client before its topic stalled cannot be taken back: its cancel waits
/// for its delivery, so the driver does not wait for it, and it goes out
/// when Kafka is back. Returns those a cancel failed for.
async fn cancel_missed(series: &super::Series, step: &mut Step, at: Vec<u64>, now: UnixMillis) -> Vec<u64> {
    use futures_util::{StreamExt as _, stream};
    let node = series.book.node();
    let scope = space_of(&step.id);
    let outcomes: Vec<(u64, Option<Result<CancelOutcome, Error>>)> = stream::iter(at)
        .map(|at| {
            let id = occurrence_id(&step.id, UnixMillis(at), series.shards());
            let intent = Intent::Cancel { scope: scope.clone(), id, now, only: None };
            let cancel = async { Ok(node.change(intent).await?.cancelled()?) };
            async move { (at, tokio::time::timeout(CANCEL_WAIT, cancel).await.ok()) }
        })
        .buffered(CANCELS_AT_ONCE)
        .collect()
        .await;
    let mut failed = Vec::new();
    for (at, outcome) in outcomes {
        match outcome {
            Some(Ok(CancelOutcome::Cancelled)) => {
                metrics::SERIES_OCCURRENCES.with_label_values(&["skipped"]).inc();
                step.record.fired = step.record.fired.saturating_sub(1);
                step.record.skipped += 1;
            }
            // Delivered after all, or settled otherwise: nothing to undo.
            Some(Ok(_)) => {}
            // In Kafka's client: it goes out when Kafka is back.
            None | Some(Err(Error::Store(StoreError::Dispatching(_)))) => {
                tracing::debug!(series = %step.id.qualified(), occurrence = at, "a missed occurrence is with Kafka's client already");
            }
            Some(Err(e)) => {
                tracing::warn!(
                    series = %step.id.qualified(),
                    occurrence = at,
                    error = %e,
                    "could not cancel a missed occurrence; trying again"
                );
                failed.push(at);
            }
        }
    }
    failed
}

/// The record an occurrence produces: the template, with the series id and
/// the occurrence's time in headers.
pub(crate) fn occurrence(template: &Envelope, series: &MessageId, nominal: UnixMillis) -> Envelope {
    let mut envelope = template.clone();
    envelope
        .headers
        .push(Header { key: SERIES_HEADER.to_owned(), value: series.as_str().as_bytes().to_vec() });
    envelope
        .headers
        .push(Header { key: OCCURRENCE_HEADER.to_owned(), value: nominal.0.to_string().into_bytes() });
    envelope
}

/// The whole id space of series `id`: where its occurrences live.
pub(crate) fn space_of(id: &MessageId) -> Scope {
    Scope::space(id.tenant().map(|t| Tenant::parse(t).expect("a stored tenant is valid")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto;

    const MIN: u64 = 60_000;

    /// A series every minute from `anchor`, its next occurrence `next`.
    fn step(anchor: u64, next: u64, policy: proto::MissedPolicy) -> Step {
        let spec = proto::SeriesSpec {
            template: Some(proto::Message { topic: "t".into(), value: b"v".to_vec(), ..Default::default() }),
            every: Some(proto::series_spec::Every::Interval(prost_types::Duration { seconds: 60, nanos: 0 })),
            missed: Some(proto::Missed { policy: policy.into(), at_most: 3, after: None }),
            ..Default::default()
        };
        let record =
            SeriesRecord { spec: Some(spec), anchor_ms: anchor, next_ms: Some(next), ..Default::default() };
        let id = MessageId::parse("s").unwrap();
        Step::new(id, record.spec().unwrap(), record)
    }

    #[test]
    fn an_occurrence_is_parked_from_its_lead_on_and_the_next_follows() {
        let mut s = step(0, 10 * MIN, proto::MissedPolicy::FireOne);
        assert!(!decide(&mut s, UnixMillis(10 * MIN - 3_000)), "not yet: three seconds ahead");
        assert!(decide(&mut s, UnixMillis(10 * MIN - 2_000)));
        assert_eq!(
            (s.record.firing.clone(), s.record.next_ms, s.record.fired),
            (vec![10 * MIN], Some(11 * MIN), 1)
        );
        assert_eq!(wake_of(&s.id, &s.record, &s.spec), Some(UnixMillis(11 * MIN - 2_000)));
    }

    /// An occurrence parked and not seen settled brings the series' wake
    /// forward to when it would be missed, `missed.after` (60 s here)
    /// past its time, unless parking the next comes first.
    #[test]
    fn a_parked_occurrence_is_looked_at_again_once_it_would_be_missed() {
        let mut s = step(0, 11 * MIN, proto::MissedPolicy::FireOne);
        s.record.parked = vec![10 * MIN];
        assert_eq!(wake_of(&s.id, &s.record, &s.spec), Some(UnixMillis(11 * MIN - 2_000)), "the next first");
        s.record.next_ms = Some(20 * MIN);
        assert_eq!(wake_of(&s.id, &s.record, &s.spec), Some(UnixMillis(11 * MIN)));
        s.record.parked.clear();
        assert_eq!(wake_of(&s.id, &s.record, &s.spec), Some(UnixMillis(20 * MIN - 2_000)));
    }

    #[test]
    fn late_within_missed_after_still_fires_each_in_turn() {
        let mut s = step(0, 10 * MIN, proto::MissedPolicy::Skip);
        assert!(decide(&mut s, UnixMillis(10 * MIN + 59_000)));
        assert_eq!((s.record.firing.clone(), s.record.skipped), (vec![10 * MIN], 0));
    }

    #[test]
    fn missed_occurrences_fire_by_the_policy() {
        let now = UnixMillis(15 * MIN + 30_000);
        for (policy, fired, skipped) in [
            (proto::MissedPolicy::Skip, vec![], 6),
            (proto::MissedPolicy::FireOne, vec![15 * MIN], 5),
            (proto::MissedPolicy::FireEach, vec![13 * MIN, 14 * MIN, 15 * MIN], 3),
        ] {
            let mut s = step(0, 10 * MIN, policy);
            assert!(decide(&mut s, now));
            assert_eq!(s.record.firing, fired, "{policy:?}");
            assert_eq!(s.record.skipped, skipped, "{policy:?}");
            assert_eq!(s.record.next_ms, Some(16 * MIN), "{policy:?}");
        }
    }

    #[test]
    fn a_decision_left_by_a_crash_is_parked_again_as_it_was() {
        let mut s = step(0, 11 * MIN, proto::MissedPolicy::FireOne);
        s.record.firing = vec![10 * MIN];
        assert!(decide(&mut s, UnixMillis(30 * MIN)));
        assert_eq!((s.record.firing.clone(), s.record.next_ms), (vec![10 * MIN], Some(11 * MIN)));
    }

    /// However many occurrences wait (more than `missed.after` lets wait
    /// at once, after their states could not be read for a while), none
    /// is forgotten: the oldest are judged missed and kept as late, so a
    /// Pause or a Delete still cancels each.
    #[test]
    fn no_parked_occurrence_is_forgotten_however_many_wait() {
        let mut s = step(0, 2_000 * MIN, proto::MissedPolicy::FireEach);
        s.record.parked = (0..1_100).map(|k| k * MIN).collect();
        make_room(&mut s.record);
        assert_eq!(s.record.parked.len(), MAX_PARKED);
        let mut pending: Vec<u64> = s.record.pending().copied().collect();
        pending.sort_unstable();
        assert_eq!(pending, (0..1_100).map(|k| k * MIN).collect::<Vec<_>>(), "every one still in view");
        assert_eq!(s.record.late, (0..(1_100 - MAX_PARKED) as u64).map(|k| k * MIN).collect::<Vec<_>>());
    }

    #[test]
    fn a_paused_or_finished_series_parks_nothing() {
        let mut s = step(0, 10 * MIN, proto::MissedPolicy::FireOne);
        s.record.paused = true;
        assert!(!decide(&mut s, UnixMillis(10 * MIN)));
        assert_eq!(wake_of(&s.id, &s.record, &s.spec), None);
        let mut s = step(0, 10 * MIN, proto::MissedPolicy::FireOne);
        s.record.next_ms = None;
        assert!(!decide(&mut s, UnixMillis(10 * MIN)));
    }

    #[test]
    fn the_lead_is_at_most_half_the_gap_to_the_next_occurrence() {
        let spec = proto::SeriesSpec {
            template: Some(proto::Message { topic: "t".into(), value: b"v".to_vec(), ..Default::default() }),
            every: Some(proto::series_spec::Every::Interval(prost_types::Duration { seconds: 1, nanos: 0 })),
            ..Default::default()
        };
        let record = SeriesRecord { spec: Some(spec), next_ms: Some(5_000), ..Default::default() };
        let id = MessageId::parse("s").unwrap();
        let wake = wake_of(&id, &record, &record.spec().unwrap());
        assert_eq!(wake, Some(UnixMillis(4_500)));
    }

    #[test]
    fn an_occurrence_carries_its_series_and_time_in_headers() {
        let template = Envelope { topic: "t".into(), value: b"v".to_vec(), ..Default::default() };
        let id = MessageId::parse("daily").unwrap();
        let e = occurrence(&template, &id, UnixMillis(1_700_000_000_000));
        let headers: Vec<_> = e.headers.iter().map(|h| (h.key.as_str(), h.value.as_slice())).collect();
        assert_eq!(headers, [(SERIES_HEADER, &b"daily"[..]), (OCCURRENCE_HEADER, &b"1700000000000"[..])]);
        assert_eq!(occurrence_id(&id, UnixMillis(5), 1).as_str(), "daily@5");
    }

    /// A series' occurrences are in its shard, whatever the shard count:
    /// its owner parks and cancels them itself. Each id is the plain one
    /// where it already hashes there, and always the same.
    #[test]
    fn occurrences_take_ids_in_their_series_shard() {
        use crate::message::{Tenant, shard_of};
        let tenant = Tenant::parse("acme").unwrap();
        for shards in [1, 3, 12, 64, 256] {
            for series in ["daily", "order-42-reminder"] {
                let id = super::super::spec::series_id(Some(&tenant), series).unwrap();
                let mut plain = 0;
                for at in (0..200).map(|i| 1_700_000_000_000 + i * 60_000) {
                    let occurrence = occurrence_id(&id, UnixMillis(at), shards);
                    assert_eq!(shard_of(&occurrence, shards), shard_of(&id, shards), "{occurrence:?}");
                    assert_eq!(occurrence.tenant(), Some("acme"));
                    assert_eq!(occurrence, occurrence_id(&id, UnixMillis(at), shards), "stable");
                    let text = occurrence.as_str();
                    let base = format!("{series}@{at}");
                    match text.strip_prefix(&base) {
                        Some("") => plain += 1,
                        Some(rest) => {
                            assert!(rest.strip_prefix('.').is_some_and(|n| n.parse::<u32>().is_ok()))
                        }
                        None => panic!("{text} is not of {base}"),
                    }
                }
                // About one in `shards` hashes home as it is.
                assert!(shards > 1 || plain == 200, "{shards}: {plain}");
            }
        }
    }
}
