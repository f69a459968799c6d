//! Before the dispatcher produces: its producer made ready (and, once
//! another node's fenced it, taken back), the topics read back for what
//! the shard's last dispatcher produced unrecorded, and what was found
//! recorded as delivered (or dead-lettered). Standalone, after an unclean
//! stop, that search runs beside the dispatcher (see
//! [`doubt`](super::doubt)): what is not in doubt goes out meanwhile.

use std::{sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

use super::{Dispatcher, GATE_RECHECK, Stamp, dead_letter, doubt::Searched, reconcile};
use crate::{
    command::{DispatchKey, InDoubt, Outcome},
    kafka::landed,
    message::{MessageId, PendingMessage},
};

/// How long the log must have named this node the shard's owner again,
/// after another node's producer fenced this one's, before it takes the
/// transactional id back: what the other node produced meanwhile reaches
/// the log first (as a node taking a shard waits after its claim).
const RETAKE_GRACE: Duration = Duration::from_millis(500);
/// Longest pause between tries of a cluster shard's transactional producer
/// that stopped before it was ready.
const PRODUCER_RETRY_MAX: Duration = Duration::from_secs(30);

impl Dispatcher {
    /// Before the first produce: with transactional delivery, waits until
    /// the shard's earlier producers are fenced and their open transactions
    /// resolved; then finds on their topics what the last dispatcher of
    /// the shard may have produced without recording it (after an unclean
    /// stop, what it had read of what was due; after a move, whatever was
    /// due before this one took over), and records it. Standalone, that
    /// search runs beside the dispatcher, and ends in [`Self::end_search`].
    /// False if stopped first.
    pub(super) async fn start_producing(&mut self, stop: &CancellationToken) -> bool {
        // What is in doubt is known now; until the search for it is over, a
        // change to one of those messages is answered "dispatching" (retry),
        // not with an outcome the search could still contradict. A node
        // taking a shard says so before its grace ends and it answers
        // requests; a store opened after an unclean stop knew it at open.
        let search = if self.gate.claimed() {
            if self.gate.released_clean() {
                reconcile::after_clean_release()
            } else {
                reconcile::after_claim(self.clock.now())
            }
        } else {
            reconcile::after_restart(&self.store, self.doubt.in_flight_at, self.clock.now())
        };
        if self.gate.claimed()
            && let Err(e) = self.store.doubt(search.0).await
        {
            tracing::warn!(error = %e, "marking the messages in doubt failed");
        }
        let mut failed: u32 = 0;
        loop {
            let why = tokio::select! {
                _ = stop.cancelled() => return false,
                ready = self.producer.ready() => match ready {
                    Ok(()) => break,
                    Err(why) => why,
                },
            };
            if !self.gate.claimed() {
                // Standalone (the shard is this process's alone): its
                // failure stops the node.
                tracing::error!(
                    reason = %why,
                    "the shard's transactional producer stopped before it was ready; dispatching nothing"
                );
                stop.cancelled().await;
                return false;
            }
            // Cluster mode: fenced while starting (another node took the
            // shard), or failed (the broker refuses the id, or has no
            // transactions); try again while this node owns the shard, less
            // often as the failures go on.
            failed += 1;
            let pause =
                self.config.max_sleep.saturating_mul(1 << (failed - 1).min(5)).min(PRODUCER_RETRY_MAX);
            if failed < 3 {
                tracing::warn!(reason = %why, ?pause, "the shard's transactional producer stopped before it was ready; trying again");
            } else {
                tracing::error!(
                    reason = %why,
                    failed,
                    ?pause,
                    "the shard's transactional producer keeps stopping before it is ready: the shard dispatches nothing; trying again"
                );
            }
            tokio::select! {
                _ = stop.cancelled() => return false,
                _ = tokio::time::sleep(pause) => {}
            }
            while !self.gate.open() {
                tokio::select! {
                    _ = stop.cancelled() => return false,
                    _ = tokio::time::sleep(GATE_RECHECK) => {}
                }
            }
            match self.producer.renew() {
                Ok(producer) => self.producer = producer,
                Err(e) => {
                    tracing::error!(error = %e, "starting a new transactional producer for the shard failed")
                }
            }
        }
        // Walks start from the floor: until a floor sent says otherwise,
        // what paused topics held below the bound recorded may be produced.
        while let Err(e) = self.store.producing_from(DispatchKey::MIN).await {
            tracing::warn!(error = %e, "recording where produces may start failed; trying again");
            tokio::select! {
                _ = stop.cancelled() => return false,
                _ = tokio::time::sleep(self.config.max_sleep) => {}
            }
        }
        if !self.gate.claimed() && self.doubt.searching() {
            // Started over (its producer was fenced): the search goes on.
            return true;
        }
        if let (false, Some(window)) = (self.gate.claimed(), search.0) {
            // Standalone, after an unclean stop: what is not in doubt goes
            // out while the search runs. Floors and marks wait for it.
            match self.store.search_beside(window).await {
                Ok(()) => {
                    let from = self.scan.from.min(window.from);
                    self.search_beside(window, search.1, from, stop);
                    return true;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "searching beside the dispatcher failed; searching first")
                }
            }
        }
        let route = self.dead_letter_route();
        match reconcile::landed(&self.store, &self.producer, search, route, stop).await {
            Some(found) => {
                self.searched(found).await;
                true
            }
            None => false,
        }
    }

    /// Where a message in doubt may have gone instead of its topic: its
    /// dead-letter topic, as its own setting, the policies and the server
    /// say now.
    fn dead_letter_route(&self) -> impl Fn(&PendingMessage) -> Option<Arc<str>> + Send + 'static {
        let (table, server) = (self.policies.table(), self.config.dead_letter_topic.clone());
        let reserved = self.config.reserved.clone();
        move |m: &PendingMessage| {
            let policy = table.dead_letter_topic(m.id.tenant(), &m.topic);
            dead_letter::route(m.dead_letter_topic.as_deref(), policy, server.as_ref(), &m.topic, &reserved)
        }
    }

    /// Starts the search for `window` beside the dispatcher: until it ends,
    /// the walk starts at the window's end, and floors sent hold at `from`
    /// (where the walk stood), so that after another unclean stop the next
    /// search still covers what this one looks for.
    fn search_beside(
        &mut self,
        window: InDoubt,
        late: landed::Late,
        from: DispatchKey,
        stop: &CancellationToken,
    ) {
        let (store, producer, stop) = (self.store.clone(), Arc::clone(&self.producer), stop.clone());
        let route = self.dead_letter_route();
        let task = tokio::spawn(async move {
            reconcile::landed(&store, &producer, (Some(window), late), route, &stop).await
        });
        self.doubt.search_beside(task, window, from);
    }

    /// The search beside the dispatcher ended: what it found is recorded,
    /// the doubt ends and the walk goes over what was in doubt. False if it
    /// was stopped.
    pub(super) async fn end_search(&mut self, ended: Searched, stop: &CancellationToken) -> bool {
        let Some(search) = self.doubt.take_search() else { return true };
        match ended {
            Ok(Some(found)) => {
                // First, so that floors sent from here on hold where the
                // walk stood until it has gone over what was in doubt.
                self.scan.rescan(Some(search.from));
                self.searched(found).await;
                true
            }
            Ok(None) => false,
            Err(e) => {
                // Nothing it found is known: it runs again.
                tracing::error!(error = %e, "the search for messages in doubt panicked; searching again");
                let late = landed::Late { quiet: reconcile::LATE_APPENDS, last: std::time::Instant::now() };
                self.search_beside(search.window, late, search.from, stop);
                true
            }
        }
    }

    /// Cluster mode, transactional delivery: another node's producer took
    /// this shard's transactional id (the group gave it the shard) and the
    /// records this one held went back to the store. If the log names this
    /// node the owner again (it claimed the shard back), it starts over as
    /// a node taking the shard does: once the log has named it for
    /// [`RETAKE_GRACE`], a new producer fences the other's, and the topics
    /// are read back for what that one committed, before anything is
    /// produced. False if stopped first.
    pub(super) async fn take_back(&mut self, stop: &CancellationToken) -> bool {
        tracing::warn!(
            "the shard's transactional producer was fenced by another node's; waiting to own the shard again"
        );
        // Another node may deliver or dead-letter them meanwhile.
        self.return_letters();
        self.flush_settles(true).await;
        let _ = self.recorder.flushed().await;
        let mut owned_since: Option<tokio::time::Instant> = None;
        loop {
            if !self.gate.open() {
                owned_since = None;
            } else if owned_since.get_or_insert_with(tokio::time::Instant::now).elapsed() >= RETAKE_GRACE
                && self.sent.is_empty()
            {
                break;
            }
            tokio::select! {
                _ = stop.cancelled() => return false,
                Some(report) = self.reports.rx.recv() => self.on_report(report, Stamp::now(&*self.clock)),
                _ = tokio::time::sleep(GATE_RECHECK) => {}
            }
            self.flush_settles(false).await;
        }
        // What reports gave up on meanwhile, too.
        self.return_letters();
        match self.producer.renew() {
            Ok(producer) => self.producer = producer,
            Err(e) => {
                tracing::error!(error = %e, "starting a new transactional producer for the shard failed; trying again");
                return tokio::select! {
                    _ = stop.cancelled() => false,
                    _ = tokio::time::sleep(self.config.max_sleep) => true,
                };
            }
        }
        self.fenced = false;
        tracing::info!(
            "the log names this node the shard's owner again: dispatching with a new transactional producer"
        );
        self.start_producing(stop).await
    }

    /// The search is over: records what it found, and ends the doubt (a
    /// change to a message that was in doubt is answered again; the marks
    /// that waited are written).
    async fn searched(&mut self, found: Vec<reconcile::Found>) {
        self.settle_found(found).await;
        self.doubt.resolved();
        // Found and recorded, or not on its topic: the search can
        // contradict no answer any more.
        if let Err(e) = self.store.doubt(None).await {
            tracing::warn!(error = %e, "ending the doubt over the messages searched failed");
        }
    }

    /// Records the messages the reconciliation found on their topics as
    /// delivered (or dead-lettered, found on their dead-letter topics),
    /// and waits until that is durable, before anything is produced: a
    /// later delivery may raise a mark past them. One held by a change in
    /// progress is settled when it is next claimed, if its due entry is
    /// still the one found.
    async fn settle_found(&mut self, found: Vec<reconcile::Found>) {
        if found.is_empty() {
            return;
        }
        let mut at: foldhash::HashMap<MessageId, (DispatchKey, Outcome)> =
            found.into_iter().map(|f| (f.id, (f.key, f.outcome))).collect();
        let entries = at.iter().map(|(id, (key, _))| (*key, id.clone())).collect();
        let batch = match self.store.take_listed(entries).await {
            Ok(batch) => batch,
            Err(e) => {
                tracing::warn!(error = %e, "claiming the messages found on their topics failed; they are settled when next claimed");
                self.doubt.landed = at;
                return;
            }
        };
        let now = self.clock.now();
        let mut release = batch.stale;
        release.extend(batch.unreadable.into_iter().map(|(_, id, _)| id));
        for ready in batch.ready {
            match at.remove(&ready.id) {
                Some((key, outcome)) if key == ready.key => {
                    let topic: Arc<str> = ready.envelope.topic.as_str().into();
                    self.settling.untried(ready, topic, now, outcome);
                }
                _ => release.push(ready.id),
            }
        }
        if let Err(e) = self.store.release(release).await {
            tracing::warn!(error = %e, "returning claims failed");
        }
        self.doubt.landed = at;
        self.flush_settles(false).await;
        if let Err(e) = self.recorder.flushed().await {
            tracing::warn!(error = %e, "recording the messages found on their topics failed");
        }
    }
}
