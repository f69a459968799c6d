//! The forecast read: pending messages per topic and interval of a window,
//! counted from the due index as `List` walks it (delivered entries that
//! wait for their retention skipped, and only what the caller sees).

use rocksdb::{DB, Direction, IteratorMode, ReadOptions};

use super::{Logged, corrupt, visible_at};
use crate::{
    message::{Forecast, MessageId, Scope, Visibility, Window},
    store::{
        Store, StoreError,
        options::cf,
        schema::{self, DispatchKey, peek_due_entry},
    },
};

/// Due entries one forecast looks at per store, at most: past this the
/// count stops and says where (about a second's walk on one core).
pub const FORECAST_EXAMINE: usize = 2_000_000;

impl Store {
    /// The pending messages of `topic` (or all) that `scope` sees, per
    /// interval of `window`, from one snapshot.
    pub async fn forecast(
        &self,
        scope: Scope,
        window: Window,
        topic: Option<String>,
        examine: usize,
    ) -> Result<Forecast, StoreError> {
        let from = DispatchKey { at: window.from, seq: 0 }.max(self.inner.wake.low_water());
        self.blocking(move |s| forecast(&s.inner.db, &scope, window, from, topic.as_deref(), examine)).await
    }
}

pub(crate) fn forecast(
    db: &DB,
    scope: &Scope,
    window: Window,
    from: DispatchKey,
    topic: Option<&str>,
    examine: usize,
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
    for (examined, item) in db
        .iterator_cf_opt(cf(db, schema::CF_DUE), opts, IteratorMode::From(&start, Direction::Forward))
        .enumerate()
    {
        let (k, v) = item?;
        let key = DispatchKey::decode(&k).ok_or_else(|| corrupt(format!("due key {k:?}")))?;
        if examined >= examine {
            forecast.stop_at(Some(key.at));
            break;
        }
        if logged.contains(key)? {
            continue;
        }
        match peek_due_entry(&v) {
            Some((id, entry_topic)) => {
                let id = MessageId::from_stored(id)
                    .ok_or_else(|| corrupt(format!("due entry {key:?} names no id")))?;
                let entry_topic = std::str::from_utf8(entry_topic)
                    .map_err(|_| corrupt(format!("due entry {key:?}'s topic")))?;
                if topic.is_none_or(|t| t == entry_topic)
                    && scope.sees(&id, entry_topic) == Visibility::Visible
                {
                    forecast.add(entry_topic, key.at);
                }
            }
            // An entry written before 0.2: read as `List` reads it.
            None => {
                if let (_, Some(m)) = visible_at(db, &snapshot, scope, &k, &v)?
                    && topic.is_none_or(|t| t == m.topic)
                {
                    forecast.add(&m.topic, key.at);
                }
            }
        }
    }
    Ok(forecast)
}
