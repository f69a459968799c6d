//! What retention purges: settled messages past their time, and delivery
//! logs whose every line is gone.

use super::*;

/// Settled messages whose retention ran out before `before`, read from the
/// retention index at `from` (where the last purge stopped, past the
/// tombstones it left): (retention key, settled at, id), at most `limit`.
pub(crate) fn purge_candidates(
    db: &DB,
    from: &[u8],
    before: UnixMillis,
    limit: usize,
) -> Result<Vec<(Vec<u8>, UnixMillis, MessageId)>, StoreError> {
    let (_, upper) = schema::retention_range_before(before);
    let mut opts = ReadOptions::default();
    opts.set_iterate_lower_bound(from.to_vec());
    opts.set_iterate_upper_bound(upper);
    let checkpoint = cf(db, schema::CF_CHECKPOINT);
    let mut out = Vec::new();
    for item in db.iterator_cf_opt(checkpoint, opts, IteratorMode::From(from, Direction::Forward)).take(limit)
    {
        let (key, _) = item?;
        let (at, id) = schema::decode_retention_key(&key)
            .ok_or_else(|| corrupt(format!("retention index key {key:?}")))?;
        out.push((key.to_vec(), at, id));
    }
    Ok(out)
}

/// Cluster mode: the log keys of chunk records of the schedule log that
/// sort below `before` and whose messages are all forgotten, oldest
/// first, among `limit` entries of that time read from `from` (empty: the
/// first); and where the next look starts (past them, or the first again
/// once it read to the end). A chunk one of whose messages is still here
/// (delivered late, or still retrying) waits: its record is what says the
/// message was delivered; the next look goes on past it.
pub(crate) fn expired_log_chunks(
    db: &DB,
    from: &[u8],
    before: Vec<u8>,
    limit: usize,
) -> Result<(Vec<Vec<u8>>, Vec<u8>), StoreError> {
    let lower = schema::log_chunk_key(&[]);
    let from = if from.is_empty() { lower.clone() } else { from.to_vec() };
    let upper = schema::log_chunk_key(&before);
    let mut opts = ReadOptions::default();
    opts.set_iterate_lower_bound(lower);
    opts.set_iterate_upper_bound(upper);
    let (checkpoint, messages) = (cf(db, schema::CF_CHECKPOINT), cf(db, schema::CF_MESSAGES));
    let (mut out, mut looked_at, mut next) = (Vec::new(), 0, Vec::new());
    for item in
        db.iterator_cf_opt(checkpoint, opts, IteratorMode::From(&from, Direction::Forward)).take(limit)
    {
        let (key, value) = item?;
        looked_at += 1;
        if looked_at == limit {
            next = schema::retention_successor(&key);
        }
        let chunk = schema::decode_log_chunk_key(&key)
            .ok_or_else(|| corrupt(format!("log chunk index key {key:?}")))?;
        let ids = schema::decode::<schema::LogChunk>(&value)
            .map_err(|e| corrupt(format!("log chunk index entry {key:?}: {e}")))?
            .ids;
        let mut forgotten = true;
        for id in &ids {
            if db.get_pinned_cf(messages, id)?.is_some() {
                forgotten = false;
                break;
            }
        }
        if forgotten {
            out.push(chunk.to_vec());
        }
    }
    Ok((out, next))
}

/// A delivery log whose retention ran out: its key, the range of due keys
/// it spans, and the id and due key of each of its lines.
#[derive(Debug)]
pub(crate) struct ExpiredLog {
    pub key: Vec<u8>,
    pub first: DispatchKey,
    pub last: DispatchKey,
    pub lines: Vec<(MessageId, DispatchKey)>,
}

/// Delivery logs whose every line was delivered before `before`, read from
/// `from` (where the last purge stopped), whole logs until `limit` lines;
/// and where the next purge starts.
/// Logs lie in dispatch order and each line was delivered after it was
/// dispatched, so none from `before` on qualifies; one delivered late
/// (after an outage) holds the cursor until it does.
pub(crate) fn purge_logs(
    db: &DB,
    from: &[u8],
    before: UnixMillis,
    limit: usize,
) -> Result<(Vec<ExpiredLog>, Vec<u8>), StoreError> {
    let mut opts = ReadOptions::default();
    opts.set_iterate_lower_bound(from.to_vec());
    opts.set_iterate_upper_bound(schema::delivery_log_key(DispatchKey { at: before, seq: 0 }));
    let (mut out, mut next, mut lines) = (Vec::new(), from.to_vec(), 0);
    for item in
        db.iterator_cf_opt(cf(db, schema::CF_CHECKPOINT), opts, IteratorMode::From(from, Direction::Forward))
    {
        if lines >= limit {
            break;
        }
        let (key, value) = item?;
        let log = schema::decode::<DeliveryLog>(&value)
            .map_err(|e| corrupt(format!("delivery log {key:?}: {e}")))?;
        if log.delivered_until() >= before {
            break;
        }
        let ids = log
            .lines
            .iter()
            .map(|l| {
                MessageId::from_stored(&l.id)
                    .map(|id| (id, DispatchKey { at: UnixMillis(l.at_ms), seq: l.seq }))
                    .ok_or_else(|| corrupt(format!("delivery log {key:?} names no id")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let first = schema::decode_delivery_log_key(&key)
            .ok_or_else(|| corrupt(format!("delivery log key {key:?}")))?;
        let last = log.last_key().ok_or_else(|| corrupt(format!("delivery log {key:?} has no last key")))?;
        lines += ids.len();
        next = schema::retention_successor(&key);
        out.push(ExpiredLog { key: key.to_vec(), first, last, lines: ids });
    }
    Ok((out, next))
}

/// The last dispatch key of the newest chunk logged, if any.
pub(crate) fn last_logged_key(db: &DB) -> Result<Option<DispatchKey>, StoreError> {
    let (lower, upper) = schema::delivery_logs_range();
    let mut opts = ReadOptions::default();
    opts.set_iterate_lower_bound(lower);
    opts.set_iterate_upper_bound(upper);
    let mut it = db.raw_iterator_cf_opt(cf(db, schema::CF_CHECKPOINT), opts);
    it.seek_to_last();
    let Some(v) = it.value() else {
        it.status()?;
        return Ok(None);
    };
    let log = schema::decode::<DeliveryLog>(v).map_err(|e| corrupt(format!("newest delivery log: {e}")))?;
    log.last_key().map(Some).ok_or_else(|| corrupt("newest delivery log has no last key"))
}
