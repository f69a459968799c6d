//! The store's writes without the store: RocksDB taking new messages in
//! batches, in the store's layout (each message whole in its due entry, a
//! locator under its id, and the counters once per batch), with none of
//! the writer's checks, per-tenant counts or threads. What the bench
//! measures hourglass's ingest against.

use rocksdb::{DB, WriteBatch, WriteOptions};

use super::{
    StoreError,
    options::{StoreConfig, cf, open_db},
    schema::{self, DispatchKey, MessageRecord, Meta},
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
        let mut options = WriteOptions::default();
        options.set_sync(config.durability == super::Durability::Sync);
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
}
