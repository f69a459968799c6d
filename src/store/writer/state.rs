//! The writer thread's state: the [`Writer`] and its parts, what it shares
//! with the store's handle and the dispatcher, how it commits, and whether
//! the backlog is at its cap.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::{
        Arc,
        atomic::{AtomicI64, AtomicU64},
    },
    time::Instant,
};

use rocksdb::DB;
use tokio::sync::mpsc;

use super::{ops::Op, park::Parking};
use crate::{
    command::InDoubt,
    message::MessageId,
    metrics::ShardMetrics,
    store::{
        claims::{Claims, Wake},
        health::{HealthBoard, StoreHealth},
        options::{Durability, ShardOf},
        schema::{Counts, CountsKey, DispatchKey, Meta},
    },
};

/// What the writer shares with the store's handle and the dispatcher.
pub(crate) struct Shared {
    pub db: Arc<DB>,
    pub claims: Arc<Claims>,
    pub wake: Arc<Wake>,
    pub pending: Arc<AtomicU64>,
    pub log_next: Arc<AtomicI64>,
    pub log_owner: Arc<AtomicU64>,
    /// The log's time (Unix ms) of the last record of the nodes applied.
    pub log_time: Arc<AtomicU64>,
    pub health: Arc<HealthBoard>,
    pub metrics: ShardMetrics,
    /// Cluster mode: holds whose caller went away before logging.
    pub dropped_holds: Arc<std::sync::Mutex<Vec<MessageId>>>,
    /// The dispatch policies: sent each commit that changed them.
    pub policies: Arc<tokio::sync::watch::Sender<Arc<crate::policy::Table>>>,
}

/// How the writer commits.
pub(crate) struct WriterConfig {
    /// How a commit is written, and when it is safe.
    pub durability: Durability,
    /// Most messages pending at once.
    pub max_pending: Option<u64>,
    /// Most ops (a batch counts per message) in one commit.
    pub max_round: usize,
    /// Recorded in a store that has no shard recorded yet.
    pub shard: ShardOf,
    /// A message delivered other than at its first try in order keeps
    /// its key, value and headers (see `store::shed`).
    pub keep_delivered_bodies: bool,
}

pub(crate) struct Writer {
    pub(super) shared: Shared,
    pub(super) config: WriterConfig,
    pub(super) meta: Meta,
    /// Every counts entry, as committed.
    pub(super) counts: foldhash::HashMap<CountsKey, Counts>,
    pub(super) rx: mpsc::Receiver<Op>,
    pub(super) in_doubt: Option<InDoubt>,
    /// Requests waiting for the dispatcher to settle a message they touch.
    pub(super) parking: Parking,
    /// Requests to run first in the next round.
    pub(super) again: VecDeque<Op>,
    pub(super) commits: Commits,
    /// The last dispatch key of the newest chunk logged: a first-try
    /// delivery above it joins a chunk, one at or below it (it came back
    /// out of order) is settled on its own, so chunks never overlap.
    pub(super) chunk_high: Option<DispatchKey>,
    /// Entries handed to the dispatcher as added behind where it reads,
    /// by hand-over number, until a floor it sent counts them.
    pub(super) handed: VecDeque<(u64, DispatchKey)>,
    /// Produces reported in doubt at shutdown.
    pub(super) unresolved: usize,
    /// Where no record of this store lies before, per target partition.
    pub(super) marks: Marks,
    /// Cluster mode: messages held for a change, or changed while the
    /// dispatcher held them.
    pub(super) replica: ReplicaHolds,
    pub(super) closing_since: Option<Instant>,
}

/// How the writer's commits stand.
#[derive(Default)]
pub(super) struct Commits {
    /// Commits that failed in a row.
    pub(super) failed: u32,
    /// A store with no WAL ([`Durability::Replayed`]): since when it holds
    /// commits only in memory.
    pub(super) unwritten_since: Option<Instant>,
}

/// Where no record of this store lies before, per target partition: see
/// [`schema::mark_key`](crate::store::schema::mark_key). Raised by each
/// delivery, in the commit that records it.
#[derive(Default)]
pub(super) struct Marks {
    pub(super) set: foldhash::HashMap<(Arc<str>, i32), i64>,
    /// While a search for what an unclean stop left in doubt runs beside
    /// the dispatcher: the marks it gave meanwhile.
    pub(super) held: Option<HeldMarks>,
}

/// Marks given while a search for what an unclean stop left in doubt runs
/// beside the dispatcher, written when the doubt ends. Written at once, a
/// mark raised by a delivery made during the search would, after a second
/// unclean stop, start the next search past records of the first that
/// the first search had not yet found: they would be produced again. A
/// partition's first mark waits too (its topic's records of the stopped
/// process may lie before it). At most one of each per target partition.
#[derive(Default)]
pub(super) struct HeldMarks {
    /// Where partitions without a mark ended before their first produce.
    pub(super) first: HashMap<(Arc<str>, i32), i64>,
    /// Past the deliveries recorded meanwhile.
    pub(super) raised: HashMap<(Arc<str>, i32), i64>,
}

/// A replica of a log (cluster mode): the messages changes wait on.
#[derive(Default)]
pub(super) struct ReplicaHolds {
    /// Cluster mode: messages held by a decided change until its record
    /// is applied.
    pub(super) holds: HashSet<MessageId>,
    /// Cluster mode: messages a record changed while the dispatcher held
    /// them; their settles are checked against the store.
    pub(super) touched_while_claimed: HashSet<MessageId>,
}

impl Writer {
    pub(super) fn at_capacity(&self, pending: u64) -> bool {
        self.config.max_pending.is_some_and(|cap| pending >= cap)
    }

    /// Reports whether the backlog cap is reached, after a commit succeeded.
    pub(super) fn report_capacity(&self) {
        let pending = self.meta.pending;
        self.shared.health.set_writes(if self.at_capacity(pending) {
            StoreHealth::AtCapacity
        } else {
            StoreHealth::Ok
        });
    }
}
