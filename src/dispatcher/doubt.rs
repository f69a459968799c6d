//! What bounds the doubt an unclean stop leaves, and the search for it.
//!
//! A crash between a produce and its record leaves the message *in doubt*:
//! it may be on its topic. Two things bound what a restart must look for:
//! the topics' marks (where their partitions ended before the first
//! produce) and the dispatch [`Horizon`] (nothing at or past it was
//! produced). Standalone, the search for what the last unclean stop left
//! in doubt runs beside the dispatcher ([`Search`]): until it ends, the
//! walk and the lanes start past what it looks for ([`Doubt::walk_from`]),
//! and floors hold where the walk stood ([`Doubt::floor_held`]), so that
//! a second crash mid-search skips nothing.

use std::{sync::Arc, time::Duration};

use tokio::task::{JoinError, JoinHandle};

use super::{Recorder, pulse::Pulse, reconcile};
use crate::{
    command::{DispatchKey, DueBatch, InDoubt, Outcome},
    message::{MessageId, UnixMillis},
    metrics,
    store::StoreError,
};

/// How far past what it is about to produce the dispatcher records its
/// horizon once it has caught up: a commit per this much of due time at
/// most, and what is in doubt after an unclean stop is what was due up to
/// this much later.
const HORIZON_AHEAD: Duration = Duration::from_secs(5);

/// The horizon to record before producing up to `last`: [`HORIZON_AHEAD`]
/// past its time once nothing more is due (`caught_up`); in a backlog,
/// just past it, so that an unclean stop in the middle of a backlog leaves
/// in doubt only what was read of it (a chunk ahead of what went out), not
/// all that was due by then. One commit per chunk of a backlog.
fn horizon_past(last: DispatchKey, caught_up: bool) -> DispatchKey {
    let next = last.successor();
    if caught_up { next.max(DispatchKey::after(last.at.saturating_add(HORIZON_AHEAD))) } else { next }
}

/// What bounds the doubt an unclean stop leaves (the marks, the horizon),
/// and what the search for it found.
pub(super) struct Doubt {
    /// Messages found on their topic (or dead-letter topic) by the
    /// reconciliation that could not be claimed then: recorded as found
    /// when claimed from the same due entry, not produced again.
    pub(super) landed: foldhash::HashMap<MessageId, (DispatchKey, Outcome)>,
    /// Topics whose partitions the store has marks for.
    pub(super) marked: foldhash::HashSet<Arc<str>>,
    pub(super) horizon: Horizon,
    /// The search for what the last unclean stop left in doubt, while it
    /// runs beside the dispatcher.
    search: Option<Search>,
    /// When the process before this one last had produces unanswered, if
    /// the store says.
    pub(super) in_flight_at: Option<UnixMillis>,
    /// When this one last had.
    pub(super) pulse: Pulse,
}

/// A search for what an unclean stop left in doubt, running beside the
/// dispatcher (standalone).
pub(super) struct Search {
    task: JoinHandle<Option<Vec<reconcile::Found>>>,
    /// What it looks for: the walk starts at its end meanwhile.
    pub(super) window: InDoubt,
    /// Where the walk stood when it began: floors sent hold here until it
    /// ends, and the walk goes on from here once it has.
    pub(super) from: DispatchKey,
}

/// What the search found, or `None` if it was stopped; an error if it
/// panicked.
pub(super) type Searched = Result<Option<Vec<reconcile::Found>>, JoinError>;

impl Doubt {
    /// The doubt of a store opened with `horizon` recorded, `in_doubt` if
    /// an unclean stop left some; recorded through `recorder`.
    pub(super) fn new(
        recorder: Arc<dyn Recorder>,
        horizon: DispatchKey,
        in_doubt: bool,
        in_flight_at: Option<UnixMillis>,
        pulse: Pulse,
    ) -> Self {
        Doubt {
            landed: foldhash::HashMap::default(),
            marked: foldhash::HashSet::default(),
            horizon: Horizon {
                recorder,
                recorded: horizon,
                recording: None,
                produced_below: DispatchKey::MIN,
                keep_above: if in_doubt { horizon } else { DispatchKey::MIN },
            },
            search: None,
            in_flight_at,
            pulse,
        }
    }

    /// Whether a search runs beside the dispatcher.
    pub(super) fn searching(&self) -> bool {
        self.search.is_some()
    }

    /// Where a walk from `from` (the due index's, or a lane's) may start:
    /// while a search runs, past what it looks for. The walk goes over
    /// that once the search ends.
    pub(super) fn walk_from(&self, from: DispatchKey) -> DispatchKey {
        self.search.as_ref().map_or(from, |s| from.max(s.window.below))
    }

    /// Where floors sent hold while a search runs, so that after another
    /// unclean stop the next search still covers what this one looks for.
    pub(super) fn floor_held(&self) -> Option<DispatchKey> {
        self.search.as_ref().map(|s| s.from)
    }

    /// Starts following a search for `window` running as `task`, begun
    /// with the walk at `from`.
    pub(super) fn search_beside(
        &mut self,
        task: JoinHandle<Option<Vec<reconcile::Found>>>,
        window: InDoubt,
        from: DispatchKey,
    ) {
        metrics::RECONCILE_BESIDE.inc();
        self.search = Some(Search { task, window, from });
    }

    /// The end of the search, if one runs; else never.
    pub(super) async fn search_ended(&mut self) -> Searched {
        match &mut self.search {
            Some(search) => (&mut search.task).await,
            None => std::future::pending().await,
        }
    }

    /// The search that ended, no longer followed.
    pub(super) fn take_search(&mut self) -> Option<Search> {
        let search = self.search.take();
        if search.is_some() {
            metrics::RECONCILE_BESIDE.dec();
        }
        search
    }

    /// Stops the search (the shard stops): what it looked for stays in
    /// doubt.
    pub(super) async fn stop_search(&mut self) {
        if let Some(search) = self.take_search() {
            search.task.abort();
            let _ = search.task.await;
        }
    }

    /// What was in doubt is resolved: what was not found was not produced,
    /// so the horizon may come down.
    pub(super) fn resolved(&mut self) {
        self.horizon.keep_above = DispatchKey::MIN;
    }
}

/// The dispatch horizon: nothing from it on is produced until the recorder
/// has recorded a later one, so that after an unclean stop only what lies
/// below it is in doubt. (Standalone, the store records it; the log needs
/// none, and its recorder answers at once.)
pub(super) struct Horizon {
    recorder: Arc<dyn Recorder>,
    recorded: DispatchKey,
    /// A horizon being recorded, for a chunk read ahead or ahead of a
    /// steady stream; it counts once it has landed.
    recording: Option<Recording>,
    /// Everything handed to the producer lies below this.
    produced_below: DispatchKey,
    /// While what an unclean stop left in doubt is unresolved: the horizon
    /// it left, below which the horizon is not brought.
    keep_above: DispatchKey,
}

/// A horizon being recorded off the dispatcher's task.
pub(super) struct Recording {
    until: DispatchKey,
    task: JoinHandle<Result<(), StoreError>>,
}

/// What a read ahead needs to record the horizon past the chunk it claims,
/// off the dispatcher's task.
pub(super) struct Ahead {
    recorder: Arc<dyn Recorder>,
    recorded: DispatchKey,
}

impl Ahead {
    /// Starts recording the horizon past what `batch` claimed, if it
    /// reaches the horizon recorded when the read began.
    pub(super) fn past(self, batch: &DueBatch) -> Option<Recording> {
        let last = batch.ready.iter().map(|r| r.key).max().filter(|last| *last >= self.recorded)?;
        Some(Recording::start(self.recorder, horizon_past(last, !batch.more)))
    }
}

impl Recording {
    /// Records `until` as the horizon, off the dispatcher's task.
    fn start(recorder: Arc<dyn Recorder>, until: DispatchKey) -> Recording {
        Recording { until, task: tokio::spawn(async move { recorder.extend_horizon(until).await }) }
    }
}

impl Horizon {
    /// For a read ahead: see [`Ahead::past`].
    pub(super) fn ahead(&self) -> Ahead {
        Ahead { recorder: Arc::clone(&self.recorder), recorded: self.recorded }
    }

    /// The record a read ahead started, awaited before anything past the
    /// horizon is produced.
    pub(super) fn recording(&mut self, recording: Option<Recording>) {
        if recording.is_some() {
            self.recording = recording;
        }
    }

    /// `key` was handed to the producer (or queued to a dead-letter topic).
    pub(super) fn produced(&mut self, key: DispatchKey) {
        self.produced_below = self.produced_below.max(key.successor());
    }

    /// Before producing what was read up to `last`: records the horizon
    /// just past it, unless it is recorded that far.
    pub(super) async fn before_producing(&mut self, last: DispatchKey) {
        self.extend(last.successor(), horizon_past(last, false)).await;
    }

    /// While it sleeps until `due`: records a horizon [`HORIZON_AHEAD`]
    /// past it, so that what is due then goes out on waking without a
    /// commit. (A backlog found there brings it down again: see
    /// [`Self::down_to`].)
    ///
    /// Once less than half of [`HORIZON_AHEAD`] is left, the next one is
    /// recorded in the background: a steady stream then never waits for a
    /// commit when its messages reach the horizon (it did every
    /// [`HORIZON_AHEAD`], for as long as the writer's round took).
    pub(super) async fn extend_asleep(&mut self, due: UnixMillis) {
        if self.recording.as_ref().is_some_and(|r| r.task.is_finished()) {
            self.recorded().await;
        }
        let due = DispatchKey { at: due, seq: u64::MAX };
        let until = horizon_past(due, true);
        if due.successor() > self.recorded {
            return self.extend(due.successor(), until).await;
        }
        let half = DispatchKey::after(due.at.saturating_add(HORIZON_AHEAD / 2));
        if self.recording.is_none() && self.recorded < half {
            self.recording = Some(Recording::start(Arc::clone(&self.recorder), until));
        }
    }

    /// A backlog was found: brings the horizon down to `until` (past the
    /// chunk just read), if it was recorded further ahead while nothing
    /// was due, so that a crash in the backlog leaves in doubt what was
    /// read of it, not all of it. Never below what was handed to the
    /// producer, nor below `queued` (letters on their way to a dead-letter
    /// topic); nor, while what an earlier unclean stop left in doubt is
    /// unresolved, below the horizon it left.
    pub(super) async fn down_to(&mut self, until: DispatchKey, queued: impl Iterator<Item = DispatchKey>) {
        let until = queued
            .map(DispatchKey::successor)
            .fold(until.max(self.produced_below).max(self.keep_above), DispatchKey::max);
        if until >= self.recorded {
            return;
        }
        // What is being recorded lands first, not after it.
        self.recorded().await;
        match self.recorder.lower_horizon(until).await {
            Ok(()) => self.recorded = until,
            Err(e) => tracing::warn!(error = %e, "bringing the dispatch horizon down failed"),
        }
    }

    /// Records a horizon at `until` before anything at or past the
    /// recorded one, below `needed`, is produced.
    async fn extend(&mut self, needed: DispatchKey, until: DispatchKey) {
        if needed <= self.recorded {
            return;
        }
        self.recorded().await;
        if needed <= self.recorded {
            return;
        }
        match self.recorder.extend_horizon(until).await {
            Ok(()) => self.recorded = self.recorded.max(until),
            // Produced anyway: after a crash, what went out past the
            // recorded horizon is produced again, never lost.
            Err(e) => tracing::warn!(error = %e, "recording the dispatch horizon failed"),
        }
    }

    /// Waits for the horizon being recorded, if any.
    async fn recorded(&mut self) {
        let Some(Recording { until, task }) = self.recording.take() else { return };
        match task.await {
            Ok(Ok(())) => self.recorded = self.recorded.max(until),
            // Recorded again before anything past the horizon is produced.
            Ok(Err(e)) => tracing::warn!(error = %e, "recording the dispatch horizon failed"),
            Err(e) => tracing::warn!(error = %e, "recording the dispatch horizon failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(at: u64, seq: u64) -> DispatchKey {
        DispatchKey { at: UnixMillis(at), seq }
    }

    #[test]
    fn a_backlog_records_just_past_its_chunk_and_a_caught_up_walk_records_ahead() {
        assert_eq!(horizon_past(key(1_000, 7), false), key(1_000, 7).successor());
        assert_eq!(horizon_past(key(1_000, 7), true), key(1_000 + HORIZON_AHEAD.as_millis() as u64 + 1, 0));
        // A key at the end of its millisecond.
        assert_eq!(horizon_past(key(1_000, u64::MAX), false), key(1_001, 0));
    }

    /// Records horizons only when the test lets it, and keeps what it
    /// recorded.
    struct Gated {
        open: tokio::sync::Semaphore,
        recorded: std::sync::Mutex<Vec<DispatchKey>>,
    }

    #[tonic::async_trait]
    impl Recorder for Gated {
        async fn record(&self, _: Vec<crate::command::Settle>, _: Option<crate::store::Floor>) {}
        async fn flushed(&self) -> Result<(), StoreError> {
            Ok(())
        }
        async fn mark(&self, _: Arc<str>, _: Vec<(i32, i64)>) -> Result<(), StoreError> {
            Ok(())
        }
        async fn extend_horizon(&self, until: DispatchKey) -> Result<(), StoreError> {
            self.open.acquire().await.expect("open").forget();
            self.recorded.lock().unwrap().push(until);
            Ok(())
        }
        async fn lower_horizon(&self, _: DispatchKey) -> Result<(), StoreError> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_steady_stream_has_its_next_horizon_recorded_before_it_reaches_it() {
        let gated = Arc::new(Gated { open: tokio::sync::Semaphore::new(0), recorded: Default::default() });
        let ahead = HORIZON_AHEAD.as_millis() as u64;
        let mut horizon = Horizon {
            recorder: Arc::clone(&gated) as Arc<dyn Recorder>,
            recorded: key(10_000 + ahead, 0),
            recording: None,
            produced_below: DispatchKey::MIN,
            keep_above: DispatchKey::MIN,
        };
        async fn asleep(h: &mut Horizon, at: u64) {
            tokio::time::timeout(Duration::from_secs(5), h.extend_asleep(UnixMillis(at)))
                .await
                .expect("extending while asleep waits for no commit")
        }
        // More than half the horizon left: nothing to record.
        asleep(&mut horizon, 10_000).await;
        assert!(horizon.recording.is_none());
        // Less than half left: the next is recorded in the background, and
        // counts only once it has landed.
        let at = 10_000 + ahead / 2 + 1;
        asleep(&mut horizon, at).await;
        assert!(horizon.recording.is_some());
        asleep(&mut horizon, at + 1).await;
        assert_eq!(horizon.recorded, key(10_000 + ahead, 0), "not landed yet");
        gated.open.add_permits(1);
        while !horizon.recording.as_ref().is_some_and(|r| r.task.is_finished()) {
            tokio::task::yield_now().await;
        }
        asleep(&mut horizon, at + 2).await;
        assert_eq!(*gated.recorded.lock().unwrap(), [horizon_past(key(at, u64::MAX), true)]);
        assert_eq!(horizon.recorded, horizon_past(key(at, u64::MAX), true));
        assert!(horizon.recording.is_none(), "one recording at a time, none needed now");
    }
}
