//! Where series are kept: each in the store of its id's shard, with a wake
//! entry for when it next parks an occurrence; and the locks that keep one
//! series' changes in order (a call and the driver never change the same
//! series at once).

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures_util::future;
use tokio::sync::{Mutex, MutexGuard};

use super::{record::SeriesRecord, spec::Spec};
use crate::{
    Error,
    command::{Place, Row, RowValue, Table},
    message::{MessageId, Tenant, UnixMillis, murmur2},
    node::Node,
    store::{Reader, StoreError},
};

/// Locks, each shared by the series whose ids hash to it.
const STRIPES: usize = 4096;
/// How long before its due time an occurrence is parked, at most: time for
/// its write, however busy the store, so that it is never late for want of
/// being parked.
pub(crate) const LEAD: Duration = Duration::from_secs(2);

/// What a change does to a series' record.
pub(crate) enum Record {
    Put(Box<SeriesRecord>),
    Delete,
    /// Left as it is (only its wake moves).
    Keep,
}

pub(crate) struct Book {
    node: Arc<Node>,
    stripes: Vec<Mutex<()>>,
    /// By shard, no wake lies below this (Unix ms): where the driver's
    /// walks of the shard's wake index start, past the tombstones of the
    /// wakes taken before. A walk raises it to the earliest wake it found;
    /// every write of a wake lowers it to that wake. A shard that comes to
    /// this node (in a cluster) has none: it brings wakes written
    /// elsewhere, so its walks start at the beginning.
    floors: std::sync::Mutex<HashMap<u32, Arc<AtomicU64>>>,
}

/// One series' change: its record after it, and its wake before and
/// after.
pub(crate) struct Change {
    pub id: MessageId,
    pub record: Record,
    pub old_wake: Option<UnixMillis>,
    pub wake: Option<UnixMillis>,
}

impl Book {
    pub(crate) fn new(node: Arc<Node>) -> Book {
        Book {
            node,
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            floors: std::sync::Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn node(&self) -> &Arc<Node> {
        &self.node
    }

    pub(crate) fn stripe(&self, id: &MessageId) -> usize {
        (murmur2(id.as_bytes()) as u32 as usize) % STRIPES
    }

    /// Waits for series `id`'s lock.
    pub(crate) async fn lock(&self, id: &MessageId) -> MutexGuard<'_, ()> {
        self.stripes[self.stripe(id)].lock().await
    }

    /// A stripe's lock, unless a call holds it now.
    pub(crate) fn try_lock_stripe(&self, stripe: usize) -> Option<MutexGuard<'_, ()>> {
        self.stripes[stripe].try_lock().ok()
    }

    pub(crate) async fn load(&self, id: &MessageId) -> Result<Option<SeriesRecord>, Error> {
        let store = self.node.reader_of(id).await?;
        let Some(bytes) = store.row(Table::Series, id.as_bytes().to_vec()).await? else { return Ok(None) };
        let record = SeriesRecord::from_bytes(&bytes)
            .map_err(|e| StoreError::Corrupt(format!("series {}: {e}", id.qualified())))?;
        Ok(Some(record))
    }

    /// The series `ids`, in order, each shard's read at once; a record
    /// that does not decode is an error of its own, not of the others.
    pub(crate) async fn load_many(
        &self,
        ids: &[MessageId],
    ) -> Result<Vec<Option<Result<SeriesRecord, prost::DecodeError>>>, Error> {
        let mut by_shard: HashMap<usize, Vec<usize>> = HashMap::new();
        for (i, id) in ids.iter().enumerate() {
            by_shard.entry(self.node.shard_of(id)).or_default().push(i);
        }
        let reads = by_shard.into_values().map(|slots| async move {
            let store = self.node.reader_of(&ids[slots[0]]).await?;
            let keys = slots.iter().map(|i| ids[*i].as_bytes().to_vec()).collect();
            let found = store.rows(Table::Series, keys).await?;
            Ok::<_, Error>(slots.into_iter().zip(found).collect::<Vec<_>>())
        });
        let mut out: Vec<Option<Result<SeriesRecord, prost::DecodeError>>> =
            (0..ids.len()).map(|_| None).collect();
        for part in future::try_join_all(reads).await? {
            for (i, bytes) in part {
                out[i] = bytes.map(|b| SeriesRecord::from_bytes(&b));
            }
        }
        Ok(out)
    }

    /// Writes `changes`, each shard's in one commit; returns once all are
    /// durable.
    pub(crate) async fn save(&self, changes: Vec<Change>) -> Result<(), Error> {
        let mut by_shard: HashMap<usize, Vec<Row>> = HashMap::new();
        for c in changes {
            by_shard.entry(self.node.shard_of(&c.id)).or_default().push(Row {
                table: Table::Series,
                value: match &c.record {
                    Record::Put(record) => RowValue::Put(record.to_bytes()),
                    Record::Delete => RowValue::Delete,
                    Record::Keep => RowValue::Keep,
                },
                key: c.id.as_bytes().to_vec(),
                old_wake: c.old_wake,
                wake: c.wake,
            });
        }
        let lowered =
            by_shard.iter().map(|(shard, writes)| (*shard, writes.iter().filter_map(|w| w.wake).min()));
        let lowered: Vec<_> = lowered.collect();
        let writes =
            by_shard.into_iter().map(|(shard, rows)| self.node.write_rows(Place::Shard(shard), rows));
        let written = future::try_join_all(writes).await;
        // Even if a write failed: one of them may have been made.
        for (shard, lowest) in lowered {
            if let Some(lowest) = lowest {
                self.floor(shard as u32).fetch_min(lowest.0, Ordering::AcqRel);
            }
        }
        written?;
        Ok(())
    }

    /// The floor of `shard`'s wakes.
    fn floor(&self, shard: u32) -> Arc<AtomicU64> {
        let mut floors = self.floors.lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(floors.entry(shard).or_default())
    }

    /// The stores of the shards this node serves now, with their numbers;
    /// the floors of those it no longer serves are forgotten (one that
    /// comes back starts over).
    pub(crate) fn shards(&self) -> Vec<(u32, Reader)> {
        let stores = self.node.readers();
        let mut floors = self.floors.lock().unwrap_or_else(|e| e.into_inner());
        floors.retain(|shard, _| stores.iter().any(|(n, _)| n == shard));
        stores
    }

    /// Up to `limit` series of shard `shard` (its store `store`) waking at
    /// or before `until`; and the earliest wake after those, if any.
    pub(crate) async fn waking(
        &self,
        shard: u32,
        store: &Reader,
        until: UnixMillis,
        limit: usize,
    ) -> Result<(Vec<(UnixMillis, MessageId)>, Option<UnixMillis>), Error> {
        let floor = self.floor(shard);
        let at = floor.load(Ordering::Acquire);
        let (due, next) = store.waking(Table::Series, UnixMillis(at), until, limit).await?;
        let due =
            due.into_iter().map(|(at, key)| Ok((at, series_id(&key)?))).collect::<Result<Vec<_>, Error>>()?;
        // Raised, unless a write lowered it meanwhile (then it stays).
        let lowest = due.iter().map(|(at, _)| *at).min().unwrap_or(until);
        let _ = floor.compare_exchange(at, lowest.0.max(at), Ordering::AcqRel, Ordering::Acquire);
        Ok((due, next))
    }

    /// How many series `tenant`'s space (the shared one for none) has in
    /// the shards this node serves, counted up to `up_to`.
    pub(crate) async fn count(&self, tenant: Option<&Tenant>, up_to: usize) -> Result<usize, Error> {
        const PAGE: usize = 1000;
        let space = space_prefix(tenant);
        let mut counted = 0;
        for (_, store) in self.node.readers() {
            let mut after = None;
            while counted < up_to {
                let asked = PAGE.min(up_to - counted);
                let page =
                    store.row_page(Table::Series, space.clone(), after, asked, tenant.is_none()).await?;
                counted += page.len();
                if page.len() < asked {
                    break;
                }
                after = page.last().map(|(key, _)| key.clone());
            }
        }
        Ok(counted)
    }

    /// Up to `limit` series of `tenant`'s space (the shared one for none)
    /// after `after`, in id order across shards; a record that does not
    /// decode comes as its error.
    pub(crate) async fn page(
        &self,
        tenant: Option<&Tenant>,
        after: Option<MessageId>,
        limit: usize,
    ) -> Result<Vec<(MessageId, Result<SeriesRecord, prost::DecodeError>)>, Error> {
        self.page_of(space_prefix(tenant), tenant.is_none(), after, limit).await
    }

    /// Up to `limit` series of every space after `after`, in stored order
    /// across shards: an operator's listing.
    pub(crate) async fn page_all(
        &self,
        after: Option<MessageId>,
        limit: usize,
    ) -> Result<Vec<(MessageId, Result<SeriesRecord, prost::DecodeError>)>, Error> {
        self.page_of(Vec::new(), false, after, limit).await
    }

    async fn page_of(
        &self,
        space: Vec<u8>,
        shared: bool,
        after: Option<MessageId>,
        limit: usize,
    ) -> Result<Vec<(MessageId, Result<SeriesRecord, prost::DecodeError>)>, Error> {
        let stores = self.node.readers();
        let after = after.map(|id| id.as_bytes().to_vec());
        let reads = stores
            .iter()
            .map(|(_, store)| store.row_page(Table::Series, space.clone(), after.clone(), limit, shared));
        let mut all = Vec::new();
        for page in future::try_join_all(reads).await? {
            for (key, bytes) in page {
                let record = SeriesRecord::from_bytes(&bytes);
                all.push((series_id(&key)?, record));
            }
        }
        all.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        all.truncate(limit);
        Ok(all)
    }
}

/// The stored prefix of `tenant`'s space: `\0 tenant \0`; none for the
/// shared space.
fn space_prefix(tenant: Option<&Tenant>) -> Vec<u8> {
    match tenant {
        Some(t) => format!("\0{}\0", t.as_str()).into_bytes(),
        None => Vec::new(),
    }
}

/// When the driver next looks at a series: when it parks its next
/// occurrence ([`park_at`]), or, if earlier, when the oldest occurrence it
/// parked and has not seen settled would be missed (`missed.after` past
/// its time): then the downtime policy decides whether it still goes out
/// when Kafka can take it.
pub(crate) fn wake_of(id: &MessageId, record: &SeriesRecord, spec: &Spec) -> Option<UnixMillis> {
    let missed_after = spec.missed_after.as_millis() as u64;
    let watch = record.parked.iter().min().map(|at| {
        let due = spec.rule.due(id.as_str(), UnixMillis(*at));
        UnixMillis(due.0.saturating_add(missed_after))
    });
    match (park_at(id, record, spec), watch) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// When a series next parks an occurrence: [`LEAD`] before the next
/// occurrence is due (less when occurrences come closer together than
/// twice that, so that no more than one is parked ahead); none when it is
/// paused or over.
pub(crate) fn park_at(id: &MessageId, record: &SeriesRecord, spec: &Spec) -> Option<UnixMillis> {
    if record.paused {
        return None;
    }
    let nominal = UnixMillis(record.next_ms?);
    let due = spec.rule.due(id.as_str(), nominal);
    let gap = spec
        .rule
        .every
        .next_after(nominal)
        .map_or(LEAD * 2, |after| Duration::from_millis(after.0.saturating_sub(nominal.0)));
    let lead = LEAD.min(gap / 2);
    Some(UnixMillis(due.0.saturating_sub(lead.as_millis() as u64)))
}

/// The series id a row key of the series table holds.
fn series_id(key: &[u8]) -> Result<MessageId, Error> {
    MessageId::from_stored(key)
        .ok_or_else(|| StoreError::Corrupt(format!("undecodable series key {key:?}")).into())
}
