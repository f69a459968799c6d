//! The dispatcher's reads: what is due, claimed and read in one go, either
//! by walking the due index from where the dispatcher left off
//! ([`Store::take_due`]) or for a list of entries it must look at again
//! ([`Store::take_listed`]: those added behind its position, those the
//! writer held, those it put off). Both run on a blocking thread.
//!
//! Every entry is either handed back ready, or named for what kept it: the
//! writer held it, it went stale, it could not be read. Nothing fallible
//! runs between taking claims and handing them on, so no claim is lost.

use std::{collections::HashSet, sync::Arc};

use rocksdb::{DB, ReadOptions};

use super::{
    Store, StoreError,
    claims::{Claim, Claims, Watched},
    options::cf,
    read,
    runs::Seek,
    schema::{self, DispatchKey, DueEntry, DueValue, MessageRecord, Settlement, TriesRecord},
    view,
};
use crate::{
    command::{DueBatch, Ready, Tries},
    message::{MessageId, UnixMillis},
    policy::PolicyKey,
};

impl Tries {
    pub(crate) fn of(settlement: Option<&Settlement>) -> Tries {
        Tries::from_record(settlement.map(TriesRecord::of).as_ref())
    }

    fn from_record(tries: Option<&TriesRecord>) -> Tries {
        tries.map_or_else(Tries::default, |t| Tries {
            attempts: t.attempts,
            rejections: t.rejections,
            first_refused_at: (t.first_refused_at_ms > 0).then_some(UnixMillis(t.first_refused_at_ms)),
            recorded: true,
        })
    }
}

/// What a walk of the due index takes: everything but the entries of the
/// lanes a dispatch policy holds back (stepped over unclaimed, the lowest
/// of each reported), or one lane's entries only. A lane is a topic's due
/// entries, of one tenant or of every tenant.
#[derive(Clone, Copy)]
pub(crate) enum Take<'a> {
    AllBut(&'a [PolicyKey]),
    Lane(&'a PolicyKey),
}

impl Take<'_> {
    /// The most entries one walk steps over: a held lane's millions are
    /// walked past a bounded stretch at a time.
    fn examine(self) -> usize {
        match self {
            Take::AllBut([]) => usize::MAX,
            Take::AllBut(_) => 64 * 1024,
            Take::Lane(_) => 16 * 1024,
        }
    }
}

/// Whether a found entry is of `lane`: its topic, and its tenant's if the
/// lane names one. A legacy entry, whose topic is not in the entry, is
/// taken: the dispatcher holds it again if its topic waits.
fn of_lane(lane: &PolicyKey, found: &Found) -> bool {
    let Source::Inline(entry) = &found.source else { return true };
    let topic_matches = entry.record.as_ref().is_some_and(|r| *r.topic == *lane.topic);
    topic_matches && lane.tenant.as_ref().is_none_or(|t| found.id.tenant() == Some(t.as_str()))
}

/// A due entry as found, before its claim.
struct Found {
    key: DispatchKey,
    id: MessageId,
    source: Source,
}

/// Where a found entry's message is read from once it is claimed.
enum Source {
    /// Read whole with the entry; claimed, it only needs to be still there.
    Inline(Box<DueEntry>),
    /// A legacy entry: its record and settlement, by id.
    Legacy,
    /// Not read yet: the entry itself, after the claim.
    Unread,
}

impl Store {
    /// Claims what is due at `now`, starting at `from`, at most `limit`
    /// entries, reading each one's record.
    #[cfg(test)]
    pub(crate) async fn take_due(
        &self,
        from: DispatchKey,
        now: UnixMillis,
        limit: usize,
    ) -> Result<DueBatch, StoreError> {
        self.take_due_but(from, now, limit, Arc::from([])).await
    }

    /// [`Store::take_due`], stepping over the entries of the lanes `held`
    /// unclaimed (see [`DueBatch::held_back`]).
    pub(crate) async fn take_due_but(
        &self,
        from: DispatchKey,
        now: UnixMillis,
        limit: usize,
        held: Arc<[PolicyKey]>,
    ) -> Result<DueBatch, StoreError> {
        self.blocking(move |s| s.take_due_now(from, now, limit, &held)).await
    }

    /// Claims and reads the given entries, which are due.
    pub(crate) async fn take_listed(
        &self,
        entries: Vec<(DispatchKey, MessageId)>,
    ) -> Result<DueBatch, StoreError> {
        self.blocking(move |s| Ok(s.take_listed_now(entries))).await
    }

    /// [`Store::take_listed`] on this thread: each entry is read after it is
    /// claimed, so what is read stays as it is.
    pub(super) fn take_listed_now(&self, entries: Vec<(DispatchKey, MessageId)>) -> DueBatch {
        let found = entries.into_iter().map(|(key, id)| Found { key, id, source: Source::Unread });
        let mut batch = self.claim_and_read(found.collect(), None);
        self.drop_delivered(&mut batch);
        batch
    }

    /// Moves what the delivery logs list out of `batch.ready`, to give
    /// back as stale: an entry listed before (put off with its topic, say)
    /// may have been delivered at its first try since, by a walk of its
    /// topic's lane; its entry stays in the index as its record.
    fn drop_delivered(&self, batch: &mut DueBatch) {
        let Some(lowest) = batch.ready.iter().map(|r| r.key).min() else { return };
        let mut ready = std::mem::take(&mut batch.ready);
        ready.sort_by_key(|r| r.key);
        let logged = read::Logged::from(&self.inner.db, lowest, None).and_then(|mut logged| {
            ready.iter().map(|r| logged.contains(r.key)).collect::<Result<Vec<bool>, _>>()
        });
        match logged {
            Ok(logged) => {
                for (r, delivered) in ready.into_iter().zip(logged) {
                    if delivered {
                        batch.stale.push(r.id);
                    } else {
                        batch.ready.push(r);
                    }
                }
            }
            // Looked at again shortly, as an entry that could not be read.
            Err(e) => batch.unreadable.extend(ready.into_iter().map(|r| (r.key, r.id, e.clone()))),
        }
    }

    /// [`Store::take_due`] on this thread. One pass over the due index reads
    /// the entries whole; once they are claimed, a second pass over the same
    /// keys (values untouched) drops any that a commit removed in between.
    pub(super) fn take_due_now(
        &self,
        from: DispatchKey,
        now: UnixMillis,
        limit: usize,
        held: &[PolicyKey],
    ) -> Result<DueBatch, StoreError> {
        let upper = DispatchKey::after(now);
        // Before the read: an entry committed below `upper` from here on is
        // handed over by the writer if this read misses it.
        self.inner.wake.reading_up_to(upper);
        self.walk_due(from, upper, limit, Take::AllBut(held))
    }

    /// Claims what is due of one lane: its entries from `from` up to
    /// `until` (the dispatcher's position, which the writer already hands
    /// over behind), at most `limit` of them, stepping over a bounded
    /// stretch of other lanes' entries.
    pub(crate) async fn take_lane(
        &self,
        lane: PolicyKey,
        from: DispatchKey,
        until: DispatchKey,
        limit: usize,
    ) -> Result<DueBatch, StoreError> {
        self.blocking(move |s| s.walk_due(from, until, limit, Take::Lane(&lane))).await
    }

    /// Walks the due index from `from` to `upper`, claiming and reading
    /// what it takes.
    fn walk_due(
        &self,
        from: DispatchKey,
        upper: DispatchKey,
        limit: usize,
        take: Take<'_>,
    ) -> Result<DueBatch, StoreError> {
        let db = &self.inner.db;
        let due_cf = cf(db, schema::CF_DUE);
        let walk = self.inner.claims.watch(from);
        let mut opts = ReadOptions::default();
        // Bounds keep the seek clear of the tombstones that settled messages
        // leave behind the dispatcher's position.
        opts.set_iterate_lower_bound(from.encode());
        opts.set_iterate_upper_bound(upper.encode());
        let mut found: Vec<Found> = Vec::new();
        let (mut next_from, mut more) = (from, false);
        let start = from.encode();
        // What was delivered at its first try stays in the index as its
        // message's record; the walk steps over it.
        let mut logged = read::Logged::from(db, from, None)?;
        let mut held_back: Vec<(PolicyKey, DispatchKey)> = Vec::new();
        let mut stepped_over = 0;
        // Where one topic's entries lie in a row, a walk seeks past them
        // rather than step over each one. Taken after the walk told the
        // writer how far it reads (see [`super::runs`]).
        let mut runs = match take {
            Take::AllBut([]) => Seek::new(Vec::new()),
            Take::AllBut(_) | Take::Lane(_) => {
                Seek::new(self.inner.wake.runs().within(from, upper, self.inner.wake.low_water()))
            }
        };
        // Read in place: an entry stepped over is neither copied nor decoded.
        let mut items = db.raw_iterator_cf_opt(due_cf, opts);
        items.seek(start);
        let mut examined = 0;
        let mut skip_to = None;
        while let (Some(k), Some(v)) = (items.key(), items.value()) {
            if found.len() >= limit || examined >= take.examine() {
                more = true;
                break;
            }
            examined += 1;
            let key = DispatchKey::decode(k).ok_or_else(|| StoreError::Corrupt(format!("due key {k:?}")))?;
            next_from = key.successor();
            let entry = 'entry: {
                if logged.contains(key)? {
                    // Past others' runs a lane's walk goes on, delivered or not.
                    if let Take::Lane(lane) = take {
                        skip_to = runs.past_others(key, lane);
                    }
                    break 'entry None;
                }
                // A held lane's entry is stepped over without decoding it.
                if let Take::AllBut(held) = take
                    && !held.is_empty()
                    && let Some((id, topic)) = schema::peek_due_entry(v)
                    && let Some(lane) = held.iter().find(|lane| lane.holds_raw(id, topic))
                {
                    // Keys ascend: the first met of a lane is its lowest.
                    if !held_back.iter().any(|(l, _)| l == lane) {
                        held_back.push((lane.clone(), key));
                    }
                    stepped_over += 1;
                    // A run of a lane that holds it (a tenant's, or the
                    // topic's for every tenant) is passed in one seek.
                    skip_to = held
                        .iter()
                        .filter(|lane| lane.holds_raw(id, topic))
                        .find_map(|lane| runs.past_lane(key, lane));
                    break 'entry None;
                }
                // A lane's walk decodes its own entries only.
                if let Take::Lane(lane) = take
                    && let Some((id, topic)) = schema::peek_due_entry(v)
                    && !lane.holds_raw(id, topic)
                {
                    skip_to = runs.past_others(key, lane);
                    break 'entry None;
                }
                let entry = decode_found(key, v)?;
                match take {
                    Take::Lane(lane) if !of_lane(lane, &entry) => None,
                    Take::AllBut(_) | Take::Lane(_) => Some(entry),
                }
            };
            found.extend(entry);
            match skip_to.take() {
                Some(past) => {
                    next_from = past.min(upper);
                    items.seek(next_from.encode());
                }
                None => items.next(),
            }
        }
        items.status()?;
        let (next_dispatch_at, next_topic) = if more || matches!(take, Take::Lane(_)) {
            (None, None)
        } else {
            let mut opts = ReadOptions::default();
            opts.set_iterate_lower_bound(upper.encode());
            let mut next = db.raw_iterator_cf_opt(due_cf, opts);
            next.seek(upper.encode());
            next.status()?;
            let at = next.key().and_then(DispatchKey::decode).map(|k| k.at);
            let topic =
                next.value().and_then(schema::peek_due_entry).and_then(|(_, t)| std::str::from_utf8(t).ok());
            (at, topic.map(Box::from))
        };
        let mut batch = self.claim_and_read(found, Some(walk));
        batch.next_from = next_from;
        batch.more = more;
        batch.next_dispatch_at = next_dispatch_at;
        batch.next_topic = next_topic;
        batch.held_back = held_back;
        batch.stepped_over = stepped_over;
        Ok(batch)
    }

    /// Claims the found entries and reads the messages of those it got, in
    /// the order found. Nothing fallible runs between taking the claims and
    /// handing each one on (ready, stale or unreadable). Entries read whole
    /// by a `walk` are checked again only if the walk was disturbed.
    fn claim_and_read(&self, found: Vec<Found>, walk: Option<Watched<'_>>) -> DueBatch {
        let db = &self.inner.db;
        let mut batch = DueBatch { ready: Vec::with_capacity(found.len()), ..DueBatch::default() };
        let ids = found.iter().map(|f| &f.id);
        let (claims, undisturbed) = match walk {
            Some(walk) => walk.claim_all(ids),
            None => (self.inner.claims.claim_for_dispatch_all(ids), false),
        };
        let mut ids = Vec::with_capacity(found.len());
        let mut keys = Vec::with_capacity(found.len());
        let mut sources = Vec::with_capacity(found.len());
        for (f, claim) in found.into_iter().zip(claims) {
            match claim {
                Claim::Taken => {
                    ids.push(f.id);
                    keys.push(f.key);
                    sources.push(f.source);
                }
                // What the writer holds is being cancelled or moved; its
                // commit decides, then the entry is looked at again.
                Claim::Writer => batch.contended.push((f.key, f.id)),
                // Being produced already.
                Claim::Ours => {}
            }
        }
        let guard = ClaimGuard { claims: &self.inner.claims, ids };
        let gone = gone_since_read(db, &keys, &sources, undisturbed);
        let unread: Vec<[u8; schema::DUE_KEY_LEN]> = keys
            .iter()
            .zip(&sources)
            .filter(|(_, source)| matches!(source, Source::Unread))
            .map(|(key, _)| key.encode())
            .collect();
        let mut unread_values = db.batched_multi_get_cf(cf(db, schema::CF_DUE), &unread, false).into_iter();

        // First what the entries themselves tell; legacy entries wait for
        // one batched read of their records and settlements.
        let mut reads: Vec<Option<Result<Option<Message>, StoreError>>> = Vec::with_capacity(keys.len());
        let mut legacy = Vec::new();
        for (i, (source, (key, id))) in sources.into_iter().zip(keys.iter().zip(&guard.ids)).enumerate() {
            let value = matches!(source, Source::Unread)
                .then(|| unread_values.next().expect("one value per unread entry"));
            let read = match (&gone, source) {
                (Err(e), _) => Some(Err(e.clone())),
                (Ok(gone), _) if gone.contains(key) => Some(Ok(None)),
                (Ok(_), Source::Inline(entry)) => Some(Ok(Some(inline_message(*entry)))),
                (Ok(_), Source::Legacy) => None,
                (Ok(_), Source::Unread) => match value.expect("read above") {
                    Err(e) => Some(Err(e.into())),
                    Ok(None) => Some(Ok(None)),
                    Ok(Some(bytes)) => match schema::decode_due_value(&bytes) {
                        Some(DueValue::Entry(entry)) if entry.id == id.as_bytes() => {
                            Some(Ok(Some(inline_message(*entry))))
                        }
                        Some(DueValue::Legacy(found)) if found == *id => None,
                        Some(_) => Some(Ok(None)),
                        None => Some(Err(StoreError::Corrupt(format!("due entry {key:?} is unreadable")))),
                    },
                },
            };
            if read.is_none() {
                legacy.push(i);
            }
            reads.push(read);
        }
        if !legacy.is_empty() {
            let legacy_ids: Vec<&MessageId> = legacy.iter().map(|&i| &guard.ids[i]).collect();
            let records = db.batched_multi_get_cf(
                cf(db, schema::CF_MESSAGES),
                legacy_ids.iter().map(|id| id.as_bytes()),
                false,
            );
            let settlement_keys: Vec<Vec<u8>> =
                legacy_ids.iter().map(|id| schema::settlement_key(id)).collect();
            let settlements = db.batched_multi_get_cf(cf(db, schema::CF_CHECKPOINT), &settlement_keys, false);
            for ((&i, record), settlement) in legacy.iter().zip(records).zip(settlements) {
                reads[i] = Some(legacy_message(&guard.ids[i], keys[i], record, settlement));
            }
        }

        for ((id, key), read) in guard.disarm().into_iter().zip(keys).zip(reads) {
            let read = if crate::failpoint::fires("store-read-io") {
                Err(StoreError::Io(format!("fail point store-read-io on {}", id.qualified())))
            } else {
                read.expect("every entry read")
            };
            // A message whose body was dropped as delivered would go out
            // empty: its store is damaged, and stops.
            let read = read.and_then(|found| match found {
                Some((record, _)) if record.body_dropped() => Err(StoreError::Corrupt(format!(
                    "the due entry {key:?} of {} is pending, but its key, value and headers were dropped as \
                     delivered",
                    id.qualified()
                ))),
                other => Ok(other),
            });
            match read {
                Ok(Some((record, tries))) => batch.ready.push(Ready {
                    id,
                    key,
                    due: record.due(),
                    envelope: record.into_envelope(),
                    tries,
                }),
                Ok(None) => batch.stale.push(id),
                Err(e) => {
                    if let StoreError::Corrupt(detail) = &e {
                        self.report_damage(detail);
                    }
                    batch.unreadable.push((key, id, e));
                }
            }
        }
        batch
    }
}

/// A claimed message as read: its record and its tries so far.
type Message = (MessageRecord, Tries);

fn decode_found(key: DispatchKey, value: &[u8]) -> Result<Found, StoreError> {
    match schema::decode_due_value(value) {
        Some(DueValue::Entry(mut entry)) => {
            // The entry's own copy of the id becomes the id.
            let id = MessageId::from_stored_vec(std::mem::take(&mut entry.id))
                .ok_or_else(|| StoreError::Corrupt(format!("due entry {key:?} names no id")))?;
            Ok(Found { key, id, source: Source::Inline(entry) })
        }
        Some(DueValue::Legacy(id)) => Ok(Found { key, id, source: Source::Legacy }),
        None => Err(StoreError::Corrupt(format!("due entry {key:?} is unreadable"))),
    }
}

/// Which of `keys` (in ascending order) the due index holds now: one pass
/// over their range, reading keys only.
fn keys_present(db: &DB, keys: &[DispatchKey]) -> Result<HashSet<DispatchKey>, rocksdb::Error> {
    let (Some(first), Some(last)) = (keys.first(), keys.last()) else {
        return Ok(HashSet::new());
    };
    let wanted: HashSet<DispatchKey> = keys.iter().copied().collect();
    let mut opts = ReadOptions::default();
    opts.set_iterate_lower_bound(first.encode());
    opts.set_iterate_upper_bound(last.successor().encode());
    let mut it = db.raw_iterator_cf_opt(cf(db, schema::CF_DUE), opts);
    it.seek(first.encode());
    let mut present = HashSet::with_capacity(keys.len());
    while let Some(k) = it.key() {
        if let Some(key) = DispatchKey::decode(k).filter(|key| wanted.contains(key)) {
            present.insert(key);
        }
        it.next();
    }
    it.status()?;
    Ok(present)
}

/// Which claimed entries are no longer pending where they were read: gone
/// from the index (cancelled, moved), or delivered and given back in
/// between (their entries stay, and a delivery log lists them). Entries
/// read whole by an undisturbed walk need no look: the walk skipped what
/// was logged, and nothing could have removed them since.
fn gone_since_read(
    db: &DB,
    keys: &[DispatchKey],
    sources: &[Source],
    undisturbed: bool,
) -> Result<HashSet<DispatchKey>, StoreError> {
    let inline = |source: &Source| matches!(source, Source::Inline(_));
    let mut gone = HashSet::new();
    if !undisturbed {
        let read: Vec<DispatchKey> =
            keys.iter().zip(sources).filter(|(_, s)| inline(s)).map(|(key, _)| *key).collect();
        let present = keys_present(db, &read)?;
        gone.extend(read.into_iter().filter(|key| !present.contains(key)));
    }
    let mut checked: Vec<DispatchKey> =
        keys.iter().zip(sources).filter(|(_, s)| !undisturbed || !inline(s)).map(|(key, _)| *key).collect();
    checked.sort_unstable();
    gone.extend(logged_among(db, &checked)?);
    Ok(gone)
}

/// Which of `keys` (in ascending order) a delivery log lists.
fn logged_among(db: &DB, keys: &[DispatchKey]) -> Result<HashSet<DispatchKey>, StoreError> {
    let Some(first) = keys.first() else {
        return Ok(HashSet::new());
    };
    let mut logged = read::Logged::from(db, *first, None)?;
    let mut out = HashSet::new();
    for key in keys {
        if logged.contains(*key)? {
            out.insert(*key);
        }
    }
    Ok(out)
}

/// The message a due entry holds, moved out of it.
fn inline_message(entry: DueEntry) -> Message {
    let tries = Tries::from_record(entry.tries.as_ref());
    (entry.record.expect("a decoded due entry holds its record"), tries)
}

/// Gives claims back if reading panics before they are handed on. Only a
/// bug gets here; a request parked on one of them is answered when its wait
/// runs out.
struct ClaimGuard<'a> {
    claims: &'a Claims,
    ids: Vec<MessageId>,
}

impl ClaimGuard<'_> {
    /// The claimed ids, handed on.
    fn disarm(mut self) -> Vec<MessageId> {
        std::mem::take(&mut self.ids)
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

/// The message a legacy entry under `key` names, from its record and
/// settlement, if it is still pending there.
fn legacy_message(
    id: &MessageId,
    key: DispatchKey,
    record: Read<'_>,
    settlement: Read<'_>,
) -> Result<Option<Message>, StoreError> {
    let Some(bytes) = record? else {
        return Ok(None);
    };
    let (record, settlement) = read::decode_stored(id, &bytes, settlement?.as_deref())?;
    if settlement.as_ref().is_some_and(Settlement::is_settled)
        || view::dispatch_key(&record, settlement.as_ref()) != key
    {
        return Ok(None);
    }
    Ok(Some((record, Tries::of(settlement.as_ref()))))
}
