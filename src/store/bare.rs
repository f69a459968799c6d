//! The store's work without the store: RocksDB taking new messages in
//! batches, in the store's layout (each message whole in its due entry, a
//! locator under its id, and the counters once per batch), and a drain's
//! pass over them (the due index read whole in chunks, the first-try
//! deliveries logged in batches), with none of the writer's checks,
//! claims, per-tenant counts or threads. What the bench measures
//! hourglass's ingest and drain against.

use rocksdb::{DB, ReadOptions, WriteBatch, WriteOptions};

use super::{
    StoreError,
    options::{StoreConfig, cf, open_db},
    schema::{self, DeliveryLine, DeliveryLog, DispatchKey, DueValue, MessageRecord, Meta},
};
use crate::message::{DueSpec, Envelope, MessageId, UnixMillis};

/// A store's RocksDB opened for bare writes.
pub struct BareWrites {
    db: DB,
    options: WriteOptions,
    meta: Meta,
    ids: ulid::Generator,
}

impl BareWrites {
    /// Opens (or creates) the store at `config.dir`, its writes synced to
    /// disk when `config.durability` says so.
    pub fn open(config: &StoreConfig) -> Result<BareWrites, StoreError> {
        let db = open_db(config)?;
        let options = config.durability.write_options();
        Ok(BareWrites { db, options, meta: Meta::default(), ids: ulid::Generator::new() })
    }

    /// Parks `envelopes`, due at `due`, as one atomic batch.
    pub fn park(
        &mut self,
        envelopes: impl IntoIterator<Item = Envelope>,
        due: UnixMillis,
        now: UnixMillis,
    ) -> Result<(), StoreError> {
        let (messages, due_cf, checkpoint) = (
            cf(&self.db, schema::CF_MESSAGES),
            cf(&self.db, schema::CF_DUE),
            cf(&self.db, schema::CF_CHECKPOINT),
        );
        let mut batch = WriteBatch::default();
        for envelope in envelopes {
            let id = MessageId::generate(&mut self.ids, None);
            let seq = self.meta.next_seq;
            self.meta.next_seq += 1;
            let mut record = MessageRecord::new(envelope, DueSpec::At(due), due, seq, now);
            record.entry_at_ms = Some(due.0);
            batch.put_cf(messages, id.as_bytes(), schema::encode(&record.locator()));
            let entry = schema::encode_due_parts(id.as_bytes(), &record, None);
            batch.put_cf(due_cf, DispatchKey { at: due, seq }.encode(), entry);
            self.meta.pending += 1;
        }
        batch.put_cf(checkpoint, schema::meta_key(), schema::encode(&self.meta));
        Ok(self.db.write_opt(batch, &self.options)?)
    }

    /// A drain's pass over everything due at `now`, as the dispatcher reads
    /// it and the writer records it, without their logic: the due index
    /// read from its start in chunks of `read` entries, each entry decoded
    /// whole, and its first-try delivery logged `settle` at a time (one
    /// delivery log and the counters, one atomic batch). Returns how many
    /// messages it passed over.
    pub fn deliver_due(&mut self, now: UnixMillis, read: usize, settle: usize) -> Result<usize, StoreError> {
        let BareWrites { db, options, meta, .. } = self;
        let due_cf = cf(db, schema::CF_DUE);
        let upper = DispatchKey::after(now).encode();
        let (mut from, mut passed, mut lines) = (DispatchKey::MIN, 0, Vec::with_capacity(settle));
        loop {
            let mut opts = ReadOptions::default();
            opts.set_iterate_lower_bound(from.encode());
            opts.set_iterate_upper_bound(upper);
            let mut chunk = 0;
            let mut items = db.raw_iterator_cf_opt(due_cf, opts);
            items.seek(from.encode());
            while let (Some(k), Some(v)) = (items.key(), items.value()) {
                let key =
                    DispatchKey::decode(k).ok_or_else(|| StoreError::Corrupt(format!("due key {k:?}")))?;
                let Some(DueValue::Entry(entry)) = schema::decode_due_value(v) else {
                    return Err(StoreError::Corrupt(format!("due entry at {k:?}")));
                };
                lines.push(DeliveryLine {
                    id: entry.id,
                    at_ms: key.at.0,
                    seq: key.seq,
                    partition: 0,
                    offset: passed as i64,
                    delivered_at_ms: now.0,
                });
                passed += 1;
                from = key.successor();
                if lines.len() >= settle {
                    log_delivered(db, options, meta, &mut lines)?;
                }
                chunk += 1;
                if chunk >= read {
                    break;
                }
                items.next();
            }
            items.status()?;
            if chunk < read {
                break;
            }
        }
        if !lines.is_empty() {
            log_delivered(db, options, meta, &mut lines)?;
        }
        Ok(passed)
    }
}

/// Logs `lines` as delivered, with the counters, as one atomic batch.
fn log_delivered(
    db: &DB,
    options: &WriteOptions,
    meta: &mut Meta,
    lines: &mut Vec<DeliveryLine>,
) -> Result<(), StoreError> {
    let key = |l: &DeliveryLine| DispatchKey { at: UnixMillis(l.at_ms), seq: l.seq };
    let (first, last) = (key(&lines[0]), key(&lines[lines.len() - 1]));
    meta.pending = meta.pending.saturating_sub(lines.len() as u64);
    meta.delivered_total += lines.len() as u64;
    let log = DeliveryLog { last: last.encode().to_vec(), lines: std::mem::take(lines) };
    let mut batch = WriteBatch::default();
    let checkpoint = cf(db, schema::CF_CHECKPOINT);
    batch.put_cf(checkpoint, schema::delivery_log_key(first), schema::encode(&log));
    batch.put_cf(checkpoint, schema::meta_key(), schema::encode(meta));
    Ok(db.write_opt(batch, options)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rocksdb::IteratorMode;

    use crate::store::Durability;

    fn envelope(i: usize) -> Envelope {
        Envelope { topic: "t".into(), value: i.to_le_bytes().to_vec(), ..Envelope::default() }
    }

    #[test]
    fn a_drain_pass_goes_over_what_is_due_once_in_chunks_and_leaves_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = StoreConfig::new(dir.path());
        config.durability = Durability::Buffered;
        let mut bare = BareWrites::open(&config).unwrap();
        let now = UnixMillis(1_000_000);
        bare.park((0..5_000).map(envelope), UnixMillis(999_000), now).unwrap();
        bare.park((0..700).map(envelope), UnixMillis(2_000_000), now).unwrap();
        // Chunks that do not divide the count, and settles that do not
        // divide the chunks.
        assert_eq!(bare.deliver_due(now, 2048, 999).unwrap(), 5_000);
        assert_eq!(bare.meta.delivered_total, 5_000);
        let logs = bare
            .db
            .iterator_cf(cf(&bare.db, schema::CF_CHECKPOINT), IteratorMode::Start)
            .filter(|item| item.as_ref().is_ok_and(|(k, _)| schema::decode_delivery_log_key(k).is_some()))
            .count();
        assert_eq!(logs, 5_000usize.div_ceil(999));
        assert_eq!(bare.deliver_due(UnixMillis(2_000_000), 4096, 4096).unwrap(), 5_700);
    }
}
