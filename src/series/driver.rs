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
//! The policy decides what hourglass could not park in time: occurrences
//! that fell while it was down (or its store refused writes). While Kafka
//! is unreachable, occurrences are parked on time and wait for Kafka as any
//! parked message does: each is delivered when it is back.

use std::{sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

use super::{
    book::{Change, wake_of},
    record::SeriesRecord,
    spec::{Spec, occurrence_id},
};
use crate::{
    Error,
    message::{DueSpec, Envelope, Header, MessageId, OnConflict, Scope, Tenant, UnixMillis},
    metrics,
    store::{NewId, NewMessage, StoreError},
};

/// Header carrying the series id on each occurrence's record.
pub const SERIES_HEADER: &str = "hourglass-series";
/// Header carrying the occurrence's time before jitter, in Unix ms.
pub const OCCURRENCE_HEADER: &str = "hourglass-occurrence-ms";
/// Series taken in one batch, at most.
const BATCH: usize = 512;
/// The longest the driver sleeps: a wall clock step is noticed within it.
const MAX_SLEEP: Duration = Duration::from_secs(1);
/// Occurrences a series remembers as parked, at most.
const MAX_PARKED: usize = 16;

/// Runs the driver until `stop`.
pub async fn run(series: Arc<super::Series>, stop: CancellationToken) {
    loop {
        let next = match drive(&series).await {
            Ok(next) => next,
            Err(e) => {
                tracing::warn!(error = %e, "the series driver could not park occurrences; trying again");
                None
            }
        };
        let sleep = next.map_or(MAX_SLEEP, |at| series.clock.until(at).min(MAX_SLEEP));
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = series.wake.notified() => {}
            _ = tokio::time::sleep(sleep) => {}
        }
    }
}

/// Parks what is due now, a batch at a time; the next wake after it.
async fn drive(series: &super::Series) -> Result<Option<UnixMillis>, Error> {
    loop {
        let now = series.clock.now();
        let (due, next) = series.book.waking(now, BATCH).await?;
        if due.is_empty() {
            return Ok(next);
        }
        let taken = due.len();
        // Every wake taken is moved on, unless a call held its series:
        // those are taken again at the next wake, a second later at most.
        if drive_batch(series, due, now).await? == taken {
            return Ok(None);
        }
    }
}

/// One series' step: its record after the decision, and what to park.
struct Step {
    id: MessageId,
    spec: Spec,
    record: SeriesRecord,
}

/// Takes the series `due` (each with the wake it was found at); returns
/// how many a call held (left for later).
async fn drive_batch(
    series: &super::Series,
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
    for (found_at, id) in due {
        if held.contains(&book.stripe(&id)) {
            busy += 1;
            continue;
        }
        let Some(record) = book.load(&id).await? else {
            // Deleted: a wake left behind goes.
            changes.push(Change { id, record: None, old_wake: Some(found_at), wake: None });
            continue;
        };
        let spec = record.spec().map_err(|e| {
            StoreError::Corrupt(format!("series {}: {}: {}", id.qualified(), e.field, e.reason))
        })?;
        let mut step = Step { id, spec, record };
        let fires = decide(&mut step, now);
        changes.push(Change {
            id: step.id.clone(),
            record: Some(step.record.clone()),
            old_wake: Some(found_at),
            wake: wake_of(&step.id, &step.record, &step.spec),
        });
        if fires {
            steps.push(step);
        }
    }
    // The decision first: a crash after it parks the same again.
    book.save(changes).await?;
    park(series, &mut steps, now).await?;
    let confirmed = steps
        .into_iter()
        .map(|step| {
            let wake = wake_of(&step.id, &step.record, &step.spec);
            Change { id: step.id, record: Some(step.record), old_wake: wake, wake }
        })
        .collect();
    book.save(confirmed).await?;
    drop(guards);
    Ok(busy)
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
    if record.paused || wake_of(&step.id, record, &step.spec).is_some_and(|wake| wake > now) {
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
    record.next_ms = next.map(|t| t.0);
    record.firing = fire.into_iter().map(|t| t.0).collect();
    true
}

/// Parks the occurrences each step is firing, and moves them to its
/// parked ones.
async fn park(series: &super::Series, steps: &mut [Step], now: UnixMillis) -> Result<(), Error> {
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
                id: NewId::Client(occurrence_id(&step.id, nominal)),
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
        return Ok(());
    }
    let answers = node.schedule_batch(msgs).await?;
    let mut failed = None;
    for ((i, nominal), answer) in owners.into_iter().zip(answers) {
        let step = &mut steps[i];
        match answer {
            Ok(_) => {
                metrics::SERIES_OCCURRENCES.with_label_values(&["parked"]).inc();
                step.record.parked.push(nominal.0);
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
        let parked = &mut step.record.parked;
        if parked.len() > MAX_PARKED {
            parked.drain(..parked.len() - MAX_PARKED);
        }
    }
    forget_settled(series, steps).await;
    Ok(())
}

/// Drops from each step's parked occurrences those settled by now (all
/// but the newest, which was just parked).
async fn forget_settled(series: &super::Series, steps: &mut [Step]) {
    let node = series.book.node();
    for step in steps.iter_mut() {
        let scope = space_of(&step.id);
        let newest = step.record.parked.last().copied();
        let mut kept = Vec::with_capacity(step.record.parked.len());
        for at in std::mem::take(&mut step.record.parked) {
            if Some(at) == newest {
                kept.push(at);
                continue;
            }
            let id = occurrence_id(&step.id, UnixMillis(at));
            match node.get(scope.clone(), id).await {
                Ok(Some(m)) if !m.state.is_pending() => {}
                Ok(None) => {}
                _ => kept.push(at),
            }
        }
        step.record.parked = kept;
    }
}

/// The record an occurrence produces: the template, with the series id and
/// the occurrence's time in headers.
pub fn occurrence(template: &Envelope, series: &MessageId, nominal: UnixMillis) -> Envelope {
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
pub fn space_of(id: &MessageId) -> Scope {
    Scope::space(id.tenant().map(|t| Tenant::parse(t).expect("a stored tenant is valid")))
}
