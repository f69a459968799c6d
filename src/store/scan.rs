//! The dispatcher's reads: what is due, claimed and read in one go, either
//! by walking the due index from where the dispatcher left off
//! ([`Store::take_due`]) or for a list of entries it must look at again
//! ([`Store::take_listed`]: those added behind its position, those the
//! writer held, those it put off). Both run on a blocking thread.
//!
//! Every entry is either handed back ready, or named for what kept it: the
//! writer held it, it went stale, it could not be read. Nothing fallible
//! runs between taking claims and handing them on, so no claim is lost.

use rocksdb::{Direction, IteratorMode, ReadOptions};

use super::{
    Store, StoreError,
    claims::{Claim, Claims},
    options::cf,
    read,
    schema::{self, DispatchKey, MessageRecord, Settlement},
    view,
};
use crate::message::{MessageId, UnixMillis};

/// A message the dispatcher claimed and may produce now.
#[derive(Debug)]
pub(crate) struct Ready {
    pub id: MessageId,
    pub key: DispatchKey,
    pub record: MessageRecord,
    /// Its tries so far.
    pub tries: Tries,
}

/// What the retry policy needs of a message's past: its tries so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tries {
    pub attempts: u32,
    /// Tries the broker refused for this message itself (not outages).
    pub rejections: u32,
    /// When the broker first refused it; none if it never did.
    pub first_refused_at: Option<UnixMillis>,
}

impl Tries {
    fn of(settlement: Option<&Settlement>) -> Tries {
        settlement.map_or_else(Tries::default, |s| Tries {
            attempts: s.attempts,
            rejections: s.rejections,
            first_refused_at: (s.first_refused_at_ms > 0).then_some(UnixMillis(s.first_refused_at_ms)),
        })
    }
}

/// What one look at the due index found.
#[derive(Debug, Default)]
pub(crate) struct DueBatch {
    pub ready: Vec<Ready>,
    /// Where the next look starts.
    pub next_from: DispatchKey,
    /// More is due now than `limit` allowed.
    pub more: bool,
    /// When nothing more is due now: when the next message is.
    pub next_dispatch_at: Option<UnixMillis>,
    /// Claimed, then found stale (settled or moved meanwhile): give back.
    pub stale: Vec<MessageId>,
    /// Held by the writer: look again once its commit is in.
    pub contended: Vec<(DispatchKey, MessageId)>,
    /// Claimed and not readable: give back, and look again later.
    pub unreadable: Vec<(DispatchKey, MessageId, StoreError)>,
}

impl Store {
    /// Claims what is due at `now`, starting at `from`, at most `limit`
    /// entries, reading each one's record.
    pub(crate) async fn take_due(
        &self,
        from: DispatchKey,
        now: UnixMillis,
        limit: usize,
    ) -> Result<DueBatch, StoreError> {
        self.blocking(move |s| s.take_due_now(from, now, limit)).await
    }

    /// Claims and reads the given entries, which are due.
    pub(crate) async fn take_listed(
        &self,
        entries: Vec<(DispatchKey, MessageId)>,
    ) -> Result<DueBatch, StoreError> {
        self.blocking(move |s| Ok(s.claim_and_read(entries))).await
    }

    /// [`Store::take_due`] on this thread.
    pub(super) fn take_due_now(
        &self,
        from: DispatchKey,
        now: UnixMillis,
        limit: usize,
    ) -> Result<DueBatch, StoreError> {
        let db = &self.inner.db;
        let due_cf = cf(db, schema::CF_DUE);
        let upper = DispatchKey::after(now);
        // Before the read: an entry committed below `upper` from here on is
        // handed over by the writer if this read misses it.
        self.inner.wake.reading_up_to(upper);
        let mut opts = ReadOptions::default();
        // Bounds keep the seek clear of the tombstones that settled messages
        // leave behind the dispatcher's position.
        opts.set_iterate_lower_bound(from.encode());
        opts.set_iterate_upper_bound(upper.encode());
        let mut entries: Vec<(DispatchKey, MessageId)> = Vec::new();
        let (mut next_from, mut more) = (from, false);
        let start = from.encode();
        for item in db.iterator_cf_opt(due_cf, opts, IteratorMode::From(&start, Direction::Forward)) {
            if entries.len() >= limit {
                more = true;
                break;
            }
            let (k, v) = item?;
            let key = DispatchKey::decode(&k).ok_or_else(|| StoreError::Corrupt(format!("due key {k:?}")))?;
            let id = MessageId::from_stored(&v)
                .ok_or_else(|| StoreError::Corrupt(format!("due entry {key:?} names no id")))?;
            next_from = key.successor();
            entries.push((key, id));
        }
        let next_dispatch_at = if more {
            None
        } else {
            let mut opts = ReadOptions::default();
            opts.set_iterate_lower_bound(upper.encode());
            let next = db
                .iterator_cf_opt(due_cf, opts, IteratorMode::From(&upper.encode(), Direction::Forward))
                .next();
            next.transpose()?.and_then(|(k, _)| DispatchKey::decode(&k)).map(|k| k.at)
        };
        let mut batch = self.claim_and_read(entries);
        batch.next_from = next_from;
        batch.more = more;
        batch.next_dispatch_at = next_dispatch_at;
        Ok(batch)
    }

    pub(super) fn claim_and_read(&self, entries: Vec<(DispatchKey, MessageId)>) -> DueBatch {
        let db = &self.inner.db;
        let mut batch = DueBatch::default();
        let claims = self.inner.claims.claim_for_dispatch_all(entries.iter().map(|(_, id)| id));
        let mut taken = Vec::with_capacity(entries.len());
        for (entry, claim) in entries.into_iter().zip(claims) {
            match claim {
                Claim::Taken => taken.push(entry),
                // What the writer holds is being cancelled or moved; its
                // commit decides, then the entry is looked at again.
                Claim::Writer => batch.contended.push(entry),
                // Being produced already.
                Claim::Ours => {}
            }
        }
        let guard = ClaimGuard { claims: &self.inner.claims, ids: taken.iter().map(|(_, id)| id).collect() };
        let records = db.batched_multi_get_cf(
            cf(db, schema::CF_MESSAGES),
            taken.iter().map(|(_, id)| id.as_bytes()),
            false,
        );
        let settlement_keys: Vec<Vec<u8>> = taken.iter().map(|(_, id)| schema::settlement_key(id)).collect();
        let settlements = db.batched_multi_get_cf(cf(db, schema::CF_CHECKPOINT), &settlement_keys, false);
        for (((key, id), record), settlement) in taken.iter().zip(records).zip(settlements) {
            let read = if crate::failpoint::fires("store-read-io") {
                Err(StoreError::Io(format!("fail point store-read-io on {}", id.qualified())))
            } else {
                ready(id, *key, record, settlement)
            };
            match read {
                Ok(Some(ready)) => batch.ready.push(ready),
                Ok(None) => batch.stale.push(id.clone()),
                Err(e) => {
                    if let StoreError::Corrupt(detail) = &e {
                        self.report_damage(detail);
                    }
                    batch.unreadable.push((*key, id.clone(), e));
                }
            }
        }
        guard.disarm();
        batch
    }
}

/// Gives claims back if reading panics before they are handed on. Only a
/// bug gets here; a request parked on one of them is answered when its wait
/// runs out.
struct ClaimGuard<'a> {
    claims: &'a Claims,
    ids: Vec<&'a MessageId>,
}

impl ClaimGuard<'_> {
    fn disarm(mut self) {
        self.ids.clear();
    }
}

impl Drop for ClaimGuard<'_> {
    fn drop(&mut self) {
        for id in &self.ids {
            self.claims.release(id);
        }
    }
}

type Read<'a> = Result<Option<rocksdb::DBPinnableSlice<'a>>, rocksdb::Error>;

/// The message under `key` from its read record and settlement, if it is
/// still pending there.
fn ready(
    id: &MessageId,
    key: DispatchKey,
    record: Read<'_>,
    settlement: Read<'_>,
) -> Result<Option<Ready>, StoreError> {
    let Some(bytes) = record? else {
        return Ok(None);
    };
    let (record, settlement) = read::decode_stored(id, &bytes, settlement?.as_deref())?;
    if settlement.as_ref().is_some_and(Settlement::is_settled)
        || view::dispatch_key(&record, settlement.as_ref()) != key
    {
        return Ok(None);
    }
    Ok(Some(Ready { id: id.clone(), key, record, tries: Tries::of(settlement.as_ref()) }))
}
