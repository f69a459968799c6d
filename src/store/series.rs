//! What the series driver asks of a shard's messages: which of the
//! occurrences it parked are settled. (A series itself is a row of the
//! series table, see [`super::rows`].)

use super::{Reader, StoreError, options::cf, read, schema};
use crate::message::MessageId;

impl Reader {
    /// Which of the messages `ids` are settled (delivered, failed, expired
    /// or cancelled) or gone, from one snapshot; a pending one is false.
    /// For the series driver, which forgets the occurrences it parked once
    /// they are settled: one read for a batch, the delivery logs walked
    /// once in key order.
    pub async fn settled_among(&self, ids: Vec<MessageId>) -> Result<Vec<bool>, StoreError> {
        self.store.blocking(move |s| settled_among(&s.inner.db, &ids)).await
    }
}

/// See [`Reader::settled_among`].
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
