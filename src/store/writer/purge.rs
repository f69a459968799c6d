//! Forgetting settled messages whose retention ran out; in cluster mode,
//! holding them instead until the log's tombstones for them are applied.

use super::{round::Round, state::Writer};
use crate::{
    message::{MessageId, UnixMillis},
    store::{StoreError, options::cf, read, schema},
};

impl Writer {
    /// Forgets settled messages whose retention ran out, as found by the
    /// caller in the retention index.
    pub(super) fn purge(
        &mut self,
        r: &mut Round,
        candidates: Vec<(Vec<u8>, UnixMillis, MessageId)>,
        logs: Vec<read::ExpiredLog>,
    ) -> Result<Vec<MessageId>, StoreError> {
        let checkpoint = cf(&self.shared.db, schema::CF_CHECKPOINT);
        let mut purged = Vec::new();
        let due = cf(&self.shared.db, schema::CF_DUE);
        for log in logs {
            r.batch.delete_cf(checkpoint, &log.key);
            // Below the floor nothing is pending: the chunk's range holds
            // its delivered entries and nothing else.
            let whole_range = log.last < r.meta.floor();
            if whole_range {
                r.batch.delete_range_cf(due, log.first.encode(), log.last.successor().encode());
            }
            for (id, key) in log.lines {
                if !whole_range {
                    r.delete_due(key);
                }
                // Delivered is final, but the id may have been purged and
                // taken again by a newer message since: that one stays.
                if self.seq_of(r, &id)? == Some(key.seq) {
                    r.batch.delete_cf(cf(&self.shared.db, schema::CF_MESSAGES), id.as_bytes());
                    r.overlay.insert(id.clone(), None);
                    purged.push(id);
                }
            }
        }
        for (key, at, id) in candidates {
            r.batch.delete_cf(checkpoint, &key);
            if self.settled_at(r, &id)? == Some(at) {
                r.batch.delete_cf(cf(&self.shared.db, schema::CF_MESSAGES), id.as_bytes());
                r.delete_settlement(&id);
                r.overlay.insert(id.clone(), None);
                purged.push(id);
            }
        }
        r.effects.purged += purged.len() as u64;
        Ok(purged)
    }

    /// When `id` was settled, if it is: a retention index entry of another
    /// time is stale (the message was re-armed, or the id taken again).
    fn settled_at(&self, r: &Round, id: &MessageId) -> Result<Option<UnixMillis>, StoreError> {
        Ok(self.load(r, id)?.and_then(|s| s.settlement.and_then(|s| s.settled_at())))
    }

    /// Cluster mode: a purge forgets nothing itself. What it would forget
    /// is forgotten by applying the tombstones the shard's owner appends
    /// to the log, on every node that follows the shard, so that a store
    /// rebuilt from the log never holds less than the log says. Here the
    /// ids are chosen and held until then (a change to one waits); index
    /// entries nothing is left of go now.
    pub(super) fn hold_expired(
        &mut self,
        r: &mut Round,
        candidates: Vec<(Vec<u8>, UnixMillis, MessageId)>,
        logs: Vec<read::ExpiredLog>,
    ) -> Result<Vec<MessageId>, StoreError> {
        let checkpoint = cf(&self.shared.db, schema::CF_CHECKPOINT);
        let mut chosen = Vec::new();
        for log in logs {
            let mut live = false;
            for (id, key) in log.lines {
                if self.seq_of(r, &id)? == Some(key.seq) {
                    live = true;
                    if self.replica.holds.insert(id.clone()) {
                        chosen.push(id);
                    }
                }
            }
            if !live {
                r.batch.delete_cf(checkpoint, &log.key);
            }
        }
        for (key, at, id) in candidates {
            if self.settled_at(r, &id)? != Some(at) {
                r.batch.delete_cf(checkpoint, &key);
            } else if self.replica.holds.insert(id.clone()) {
                chosen.push(id);
            }
        }
        r.replica.holding.extend(chosen.iter().cloned());
        Ok(chosen)
    }
}
