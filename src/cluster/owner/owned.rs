//! A shard this node owns: its dispatcher and the store it dispatches
//! from, the front that answers its requests, and its claim in the log
//! (taken back, or let go).

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use super::LET_GO_WAIT;
use crate::{
    clock::Clock,
    cluster::{
        applier::{self, View},
        front::Front,
        kafka::LogProducer,
        log::record::{self, Change, LogRecord},
        recorder::LogRecorder,
        routes::Routes,
        waiters::Waiters,
    },
    shard::Shard,
    store::Store,
};

/// A shard this node owns.
pub struct Owned {
    pub(super) partition: i32,
    /// This node incarnation.
    pub(super) me: u64,
    pub(super) log: Arc<LogProducer>,
    pub(super) routes: Arc<Routes>,
    pub(super) waiters: Arc<Waiters>,
    pub(super) clock: Arc<dyn Clock>,
    /// A claim of the shard is being appended.
    pub(super) claiming: AtomicBool,
    /// When this node took the shard.
    pub(super) since: std::time::Instant,
    /// Set by the dispatcher when it stops with nothing in doubt.
    pub(super) stopped_clean: Arc<AtomicBool>,
    pub(super) shard: Shard,
    pub(super) front: Front,
    pub(super) recorder: Arc<LogRecorder>,
    /// The store following the log; its stop token also stops the
    /// recorder's retries.
    pub(super) view: View,
}

impl Owned {
    pub fn front(&self) -> &Front {
        &self.front
    }

    pub fn store(&self) -> &Store {
        self.shard.store()
    }

    /// Claims the shard again, in the background: the group says this node
    /// owns it, and the log says none (the previous owner let go after this
    /// node's claim) or, after a rebalance, another node.
    pub(super) fn reclaim(self: &Arc<Self>) {
        if self.claiming.swap(true, Ordering::AcqRel) {
            return;
        }
        let owned = Arc::clone(self);
        tokio::spawn(async move {
            let claim = owner_record(owned.me, owned.clock.as_ref(), false, false);
            match owned.view.append(&owned.log, &record::owner_key(), claim).await {
                Ok(_) => {
                    owned.routes.publish(owned.partition as u32, false);
                    tracing::info!(partition = owned.partition, "claimed the shard again in the schedule log")
                }
                Err(e) => {
                    tracing::warn!(partition = owned.partition, error = %e, "claiming the shard again failed")
                }
            }
            owned.claiming.store(false, Ordering::Release);
        });
    }

    /// Whether the log names another owner (or none) of this shard.
    pub(super) fn fenced(&self) -> bool {
        self.store().log_owner() != self.me
    }

    /// Stops dispatching, records what was delivered, and closes the store.
    pub(super) async fn let_go(&self) {
        let partition = self.partition;
        self.shard.stop_tasks().await;
        let flushed = tokio::time::timeout(LET_GO_WAIT, self.recorder.flushed()).await.is_ok();
        if !flushed {
            tracing::error!(
                partition,
                "the last deliveries did not reach the schedule log in time; the next owner sends them again"
            );
        }
        // After the last deliveries: the next owner's claim finds the
        // shard released (a release by a node fenced meanwhile changes
        // nothing), and with nothing in doubt, searches nothing.
        let drained = self.stopped_clean.load(Ordering::Acquire);
        let clean = flushed && drained;
        let (release, key) = (owner_record(self.me, self.clock.as_ref(), true, clean), record::owner_key());
        let released = tokio::time::timeout(LET_GO_WAIT, self.view.append(&self.log, &key, release)).await;
        if !matches!(released, Ok(Ok(_))) {
            tracing::warn!(
                partition,
                "releasing the shard in the schedule log failed; the next owner claims it anyway"
            );
        } else if clean {
            tracing::info!(
                partition,
                "released the shard cleanly: its next owner claims it without a search"
            );
        } else {
            // Why the next owner searches its topics before dispatching.
            tracing::info!(
                partition,
                deliveries_recorded = flushed,
                dispatcher_stopped_clean = drained,
                "released the shard with deliveries in doubt: its next owner searches its topics for them first"
            );
        }
        self.routes.publish(partition as u32, true);
        // Applied to the end, the store is as the log says when this node
        // takes the shard again.
        let ended = tokio::time::timeout(LET_GO_WAIT, async {
            let end = self.view.end(&self.view.stop).await?;
            applier::applied_to(&self.view.applied, end, &self.view.stop).await.then_some(())
        })
        .await;
        if !matches!(ended, Ok(Some(()))) {
            tracing::warn!(partition, "the schedule log was not applied to its end before letting go");
        }
        self.view.close().await;
        // What this node wrote to the partition and did not apply, it
        // never will (a caller still waiting is told so).
        let unapplied = self.waiters.let_go(partition);
        if unapplied > 0 {
            tracing::debug!(partition, unapplied, "forgot the requests whose records were not applied here");
        }
    }
}

/// A claim of a shard by `me`, or its release (`clean`: with nothing in
/// doubt).
pub(super) fn owner_record(me: u64, clock: &dyn Clock, released: bool, clean: bool) -> LogRecord {
    LogRecord {
        writer: me,
        request: 0,
        change: Some(Change::Owner(record::Owner { at_ms: clock.now().0, released, clean })),
    }
}
