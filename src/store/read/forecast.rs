//! The forecast read: pending messages per topic and interval of a window,
//! counted from the due index as `List` walks it (delivered entries that
//! wait for their retention skipped, and only what the caller sees).
//!
//! The due index holds every tenant's entries, and an answer must not
//! depend on what the caller does not see: the walk's bound counts only
//! entries the caller may know of, so where a cut falls is the caller's
//! own information. Entries it does not see are passed over within a time
//! budget; past it, a walk that passed any is refused rather than cut
//! (where it got to in that time would tell how many it passed), unless
//! the caller sees every space. A walk that passed none is cut at the
//! caller's own entry, as at the bound.

use std::time::{Duration, Instant};

use rocksdb::{DB, Direction, IteratorMode, ReadOptions};

use super::{Logged, Reader, corrupt, visible_at};
use crate::{
    message::{Forecast, MessageId, Scope, Visibility, Window},
    store::{
        StoreError,
        options::cf,
        schema::{self, DispatchKey, peek_due_entry},
    },
};

/// Due entries the caller may know of that one forecast counts per store,
/// at most: past this the count stops and says where (about a second's
/// walk on one core).
pub const FORECAST_EXAMINE: usize = 2_000_000;

/// The longest one forecast walks one store, entries the caller does not
/// see included: about the walk of [`FORECAST_EXAMINE`] entries.
pub(crate) const FORECAST_BUDGET: Duration = Duration::from_secs(2);

/// Entries walked between two looks at the clock.
pub(crate) const CLOCK_EVERY: usize = 1024;

impl Reader {
    /// The pending messages of `topic` (or all) that `scope` sees, per
    /// interval of `window`, from one snapshot.
    pub async fn forecast(
        &self,
        scope: Scope,
        window: Window,
        topic: Option<String>,
        examine: usize,
    ) -> Result<Forecast, StoreError> {
        let from = DispatchKey { at: window.from, seq: 0 }.max(self.store.inner.wake.low_water());
        let walk = Walk { examine, budget: FORECAST_BUDGET };
        self.store
            .browsing(move |s| forecast(&s.inner.db, &scope, window, from, topic.as_deref(), walk))
            .await
    }
}

/// How far one forecast walks a store.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Walk {
    /// Entries the caller may know of, counted at most.
    pub examine: usize,
    /// Time spent walking, at most.
    pub budget: Duration,
}

pub(crate) fn forecast(
    db: &DB,
    scope: &Scope,
    window: Window,
    from: DispatchKey,
    topic: Option<&str>,
    walk: Walk,
) -> Result<Forecast, StoreError> {
    let snapshot = db.snapshot();
    let mut opts = ReadOptions::default();
    opts.set_snapshot(&snapshot);
    // A walk over much of the backlog: kept out of the block cache the
    // dispatcher reads from.
    opts.fill_cache(false);
    opts.set_iterate_upper_bound(DispatchKey { at: window.to, seq: 0 }.encode());
    let start = from.encode();
    let mut logged = Logged::from(db, from, Some(&snapshot))?;
    let mut forecast = Forecast::new(window);
    let started = Instant::now();
    let (mut known, mut passed_hidden) = (0, false);
    for (walked, item) in db
        .iterator_cf_opt(cf(db, schema::CF_DUE), opts, IteratorMode::From(&start, Direction::Forward))
        .enumerate()
    {
        let (k, v) = item?;
        let key = DispatchKey::decode(&k).ok_or_else(|| corrupt(format!("due key {k:?}")))?;
        if walked % CLOCK_EVERY == CLOCK_EVERY - 1 && started.elapsed() >= walk.budget {
            // Out of time: everything before `key` was walked. Where that
            // is may be told to a caller that sees every space, or one
            // whose walk passed only its own entries and stops at one.
            let told = scope.sees_every_space()
                || (!passed_hidden && seen(db, &snapshot, scope, &k, &v, key)?.is_some());
            if !told {
                return Err(StoreError::WalkTooLong { seconds: walk.budget.as_secs().max(1) });
            }
            forecast.stop_at(Some(key.at));
            break;
        }
        if logged.contains(key)? {
            // Delivered, waiting for its retention: not counted, but
            // passed.
            if !passed_hidden
                && !scope.sees_every_space()
                && seen(db, &snapshot, scope, &k, &v, key)?.is_none()
            {
                passed_hidden = true;
            }
            continue;
        }
        let Some((entry_topic, visibility)) = seen(db, &snapshot, scope, &k, &v, key)? else {
            passed_hidden = true;
            continue;
        };
        if known >= walk.examine {
            forecast.stop_at(Some(key.at));
            break;
        }
        known += 1;
        if visibility == Visibility::Visible && topic.is_none_or(|t| t == entry_topic) {
            forecast.add(&entry_topic, key.at);
        }
    }
    Ok(forecast)
}

/// A due entry's topic and how the caller sees it; none if the caller may
/// not know of it.
fn seen(
    db: &DB,
    snapshot: &rocksdb::Snapshot<'_>,
    scope: &Scope,
    k: &[u8],
    v: &[u8],
    key: DispatchKey,
) -> Result<Option<(String, Visibility)>, StoreError> {
    match peek_due_entry(v) {
        Some((id, entry_topic)) => {
            let id = MessageId::from_stored(id)
                .ok_or_else(|| corrupt(format!("due entry {key:?} names no id")))?;
            let entry_topic = std::str::from_utf8(entry_topic)
                .map_err(|_| corrupt(format!("due entry {key:?}'s topic")))?;
            Ok(match scope.sees(&id, entry_topic) {
                Visibility::Hidden => None,
                visibility => Some((entry_topic.to_owned(), visibility)),
            })
        }
        // An entry written before 0.2: read as `List` reads it.
        None => Ok(visible_at(db, snapshot, scope, k, v)?.1.map(|m| (m.topic, Visibility::Visible))),
    }
}
