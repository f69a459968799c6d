//! A shard's series, kept in its store beside its messages: each series
//! under its id, and a wake index of when each next parks an occurrence
//! (see [`schema`]). What a series holds is the series room's
//! ([`crate::series`]): the store keeps its bytes, writes them in the
//! writer's next commit (durable as messages are), and reads them back.

use rocksdb::{Direction, IteratorMode, ReadOptions};

use super::{Store, StoreError, options::cf, read, schema, writer::Op};
use crate::message::{MessageId, UnixMillis};

/// One change of one series: its new bytes, and its wake moved from
/// `old_wake` to `wake`.
#[derive(Clone, Debug)]
pub struct SeriesWrite {
    pub id: MessageId,
    pub record: SeriesBytes,
    pub old_wake: Option<UnixMillis>,
    pub wake: Option<UnixMillis>,
}

/// What a write does to a series' bytes.
#[derive(Clone, Debug)]
pub enum SeriesBytes {
    Put(Vec<u8>),
    Delete,
    Keep,
}

impl Store {
    /// Which of the messages `ids` are settled (delivered, failed, expired
    /// or cancelled) or gone, from one snapshot; a pending one is false.
    /// For the series driver, which forgets the occurrences it parked once
    /// they are settled: one read for a batch, the delivery logs walked
    /// once in key order.
    pub async fn settled_among(&self, ids: Vec<MessageId>) -> Result<Vec<bool>, StoreError> {
        self.blocking(move |s| settled_among(&s.inner.db, &ids)).await
    }

    /// Writes `writes` in one commit; returns once it is durable.
    pub async fn write_series(&self, writes: Vec<SeriesWrite>) -> Result<(), StoreError> {
        if writes.is_empty() {
            return Ok(());
        }
        self.call(|reply| Op::Series { writes, reply }).await
    }

    /// The bytes of series `id`, if there is one.
    pub async fn series(&self, id: MessageId) -> Result<Option<Vec<u8>>, StoreError> {
        self.blocking(move |s| {
            let db = &s.inner.db;
            Ok(db.get_cf(cf(db, schema::CF_CHECKPOINT), schema::series_key(&id))?)
        })
        .await
    }

    /// The bytes of each of the series `ids`, in order, in one read.
    pub async fn series_many(&self, ids: Vec<MessageId>) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        self.blocking(move |s| {
            let db = &s.inner.db;
            let checkpoint = cf(db, schema::CF_CHECKPOINT);
            let keys: Vec<_> = ids.iter().map(|id| (checkpoint, schema::series_key(id))).collect();
            db.multi_get_cf(keys).into_iter().map(|r| r.map_err(StoreError::from)).collect()
        })
        .await
    }

    /// Up to `limit` series of the space `space` (its stored prefix: a
    /// tenant's `\0 tenant \0`), in id order, after `after`; `shared`: of
    /// the shared space, whose ids never start with `\0`.
    pub async fn series_page(
        &self,
        space: Vec<u8>,
        after: Option<MessageId>,
        limit: usize,
        shared: bool,
    ) -> Result<Vec<(MessageId, Vec<u8>)>, StoreError> {
        self.blocking(move |s| {
            let db = &s.inner.db;
            let prefix = schema::series_prefix(&space);
            let start = match &after {
                Some(id) => {
                    let mut k = schema::series_key(id);
                    k.push(0);
                    k
                }
                // Past every tenant's series (their ids start with 0).
                None if shared => schema::series_prefix(&[1]),
                None => prefix.clone(),
            };
            let mut page = Vec::new();
            let iter = db.iterator_cf_opt(
                cf(db, schema::CF_CHECKPOINT),
                ReadOptions::default(),
                IteratorMode::From(&start, Direction::Forward),
            );
            for item in iter {
                let (key, value) = item?;
                if !key.starts_with(&prefix) || page.len() >= limit {
                    break;
                }
                if shared && key.get(1) == Some(&0) {
                    continue;
                }
                let id = schema::decode_series_key(&key)
                    .ok_or_else(|| StoreError::Corrupt(format!("undecodable series key {key:?}")))?;
                page.push((id, value.into_vec()));
            }
            Ok(page)
        })
        .await
    }

    /// Up to `limit` series whose wake is at or before `until` (none is
    /// below `from`), earliest first; and the earliest wake after them, if
    /// any.
    pub async fn series_waking(
        &self,
        from: UnixMillis,
        until: UnixMillis,
        limit: usize,
    ) -> Result<(Vec<(UnixMillis, MessageId)>, Option<UnixMillis>), StoreError> {
        self.blocking(move |s| {
            let db = &s.inner.db;
            let prefix = schema::series_wake_start();
            let start = schema::series_wake_bound(UnixMillis(from.0.saturating_sub(1)));
            let bound = schema::series_wake_bound(until);
            let mut opts = ReadOptions::default();
            // Past the index: a walk ends there, not at the next key.
            opts.set_iterate_upper_bound(schema::series_wake_end());
            let mut due = Vec::new();
            let iter = db.iterator_cf_opt(
                cf(db, schema::CF_CHECKPOINT),
                opts,
                IteratorMode::From(&start, Direction::Forward),
            );
            for item in iter {
                let (key, _) = item?;
                if !key.starts_with(&prefix) {
                    return Ok((due, None));
                }
                let (at, id) = schema::decode_series_wake_key(&key)
                    .ok_or_else(|| StoreError::Corrupt(format!("undecodable series wake key {key:?}")))?;
                if *key >= *bound || due.len() >= limit {
                    return Ok((due, Some(at)));
                }
                due.push((at, id));
            }
            Ok((due, None))
        })
        .await
    }
}

/// See [`Store::settled_among`].
pub(crate) fn settled_among(db: &rocksdb::DB, ids: &[MessageId]) -> Result<Vec<bool>, StoreError> {
    let snapshot = db.snapshot();
    let opts = read::at(Some(&snapshot));
    let records = db.batched_multi_get_cf_opt(
        cf(db, schema::CF_MESSAGES),
        ids.iter().map(|id| id.as_bytes()),
        false,
        &opts,
    );
    let settlement_keys: Vec<Vec<u8>> = ids.iter().map(schema::settlement_key).collect();
    let settlements =
        db.batched_multi_get_cf_opt(cf(db, schema::CF_CHECKPOINT), &settlement_keys, false, &opts);
    let mut settled = vec![true; ids.len()];
    // Those with no settlement entry: pending, unless a delivery log lists
    // them as delivered at the first try.
    let mut unsettled = Vec::new();
    for (i, (record, settlement)) in records.into_iter().zip(settlements).enumerate() {
        let Some(record) = record? else { continue };
        let settlement = settlement?;
        let (record, settlement) = read::decode_stored(&ids[i], &record, settlement.as_deref())?;
        match settlement {
            Some(s) => settled[i] = s.kind() != schema::SettlementKind::Retrying,
            None => unsettled.push((super::view::dispatch_key(&record, None), i)),
        }
    }
    unsettled.sort_unstable();
    if let Some((from, _)) = unsettled.first() {
        let mut logged = read::Logged::from(db, *from, Some(&snapshot))?;
        for (key, i) in unsettled {
            settled[i] = logged.contains(key)?;
        }
    }
    Ok(settled)
}
