//! The dispatcher: wakes when the earliest message is due, produces it to its
//! topic, and settles the outcome in the store.
//!
//! It has no polling interval. It sleeps until the earliest due time it knows
//! of (read from the head of the due CF), and the writer wakes it when a
//! commit adds anything. Sleeping is on tokio's monotonic timer, capped at
//! `max_sleep`; on waking it reads the wall clock again and takes only what
//! is due by then, so it never delivers early, and a wall-clock step is
//! noticed within `max_sleep`.
//!
//! At most `max_in_flight` messages are between "claimed" and "settled" at
//! Kafka, and at most twice that are produced and not yet recorded in the
//! store (a commit that fails keeps its settles counted until it succeeds).
//! Messages go to the producer in due order, so each partition receives them
//! in due order (the producer is idempotent). A delivery report becomes one
//! [`Settle`] the writer commits atomically: delete from the due CF, record
//! partition and offset in the checkpoint CF, advance the counters.
//!
//! Reports come back per partition, interleaved. First-try deliveries are
//! handed to the store in the order sent (dispatch order), once everything
//! sent before them is answered ([`sent`]), so that each commit logs them
//! as one chunk whose range no later chunk overlaps (see
//! [`crate::store::schema`]); what is held back for order is bounded in
//! count and time, and a delivery that still comes back behind a logged
//! chunk is settled on its own.
//!
//! Where it reads: it walks the due index forward from where it left off,
//! one chunk ahead of what it produces: the next chunk is read and claimed
//! while this one is produced and while reports are awaited, and waits
//! (bounded in time) for in-flight room.
//! What lands behind that position (a past-due schedule, a reschedule to
//! now), what the writer held when it looked, what it could not read and
//! what it put off are looked at again entry by entry, never by walking back
//! over the tombstones of what was settled since.
//!
//! A record handed to the producer is never produced again while this
//! process runs: librdkafka retries it itself, under the same idempotent
//! sequence, for as long as it takes (no local timeout). So one topic that
//! stops answering must not hold everything else:
//!
//! - **Stalled topic.** A produce Kafka has not answered for `stall_after`
//!   stalls its topic: the record keeps its claim but gives its in-flight
//!   slot back, and the topic's other due messages are put off (left in the
//!   store, their place remembered) until the stalled records are answered.
//! - **Refused topic.** A topic the broker refuses (deleted, not
//!   authorised) is held: its messages are put off, and one probe record
//!   tries it again after a growing backoff. Its messages fail only once it
//!   has refused for `fail_after` *and* at least `max_attempts` probes; a
//!   glitch shorter than that fails nothing.
//! - **Refused message.** A record the broker refuses for itself (too large)
//!   is retried with backoff and failed on the same rule, counted per
//!   message.
//!
//! At shutdown it waits for what is in flight (up to the grace period) and
//! settles it; records still unanswered are *in doubt*: the store is told,
//! so that no cancel of them is answered `CANCELLED`.
//!
//! After a stop that was not clean, it first reads the target topics back
//! for what it may have produced without recording it ([`reconcile`]):
//! what it finds there is recorded as delivered instead of produced again.
//! Before its first produce to a topic, it marks where the topic's
//! partitions end, which bounds that read.
//!
//! While the store cannot record deliveries (disk full) it produces nothing.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{
    clock::Clock,
    kafka::{DeliveryReport, Fault, Outgoing, ProduceError, Producer},
    message::{DUE_HEADER, ID_HEADER, MessageId, TENANT_HEADER, UnixMillis},
    metrics,
    store::{
        DueBatch, Floor, HeldTopics, Outcome, Ready, Settle, Store, StoreError, Tries, schema::DispatchKey,
    },
};

mod lease;
mod reconcile;
mod sent;

pub use lease::Lease;
pub(crate) use reconcile::CLAIM_GRACE;
use sent::{InFlight, Sent};

#[derive(Clone, Debug)]
pub struct DispatcherConfig {
    /// Messages produced and not yet acknowledged, at most (stalled ones
    /// aside).
    pub max_in_flight: usize,
    /// Refusals before a message (or the messages of a refused topic) may be
    /// failed.
    pub max_attempts: u32,
    /// How long refusals must have gone on before a message may be failed.
    pub fail_after: Duration,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// Longest sleep before reading the wall clock again.
    pub max_sleep: Duration,
    /// How long shutdown waits for in-flight produces to be acknowledged.
    pub shutdown_grace: Duration,
    /// A produce unanswered for this long stalls its topic.
    pub stall_after: Duration,
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        DispatcherConfig {
            max_in_flight: 10_000,
            max_attempts: 5,
            fail_after: Duration::from_secs(10 * 60),
            backoff_initial: Duration::from_millis(200),
            backoff_max: Duration::from_secs(30),
            max_sleep: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(10),
            stall_after: Duration::from_secs(10),
        }
    }
}

impl DispatcherConfig {
    /// Wait before try number `attempts + 1`: exponential, capped.
    pub fn backoff(&self, attempts: u32) -> Duration {
        let factor = 1u32.checked_shl(attempts.min(20)).unwrap_or(u32::MAX);
        self.backoff_initial.saturating_mul(factor).min(self.backoff_max)
    }

    /// Whether refusals that began at `since`, `tries` of them by now, are
    /// enough to give up.
    fn gives_up(&self, since: UnixMillis, tries: u32, now: UnixMillis) -> bool {
        tries >= self.max_attempts && now.since(since) >= self.fail_after
    }

    /// What a produce error means for a message with `prev` tries behind
    /// it, when the fault is the message's own or an outage. (A refused
    /// topic is handled for the whole topic.)
    fn outcome_of_error(&self, error: ProduceError, prev: &Tries, now: UnixMillis) -> Outcome {
        let refused = error.fault == Fault::MessageRefused;
        if refused {
            let since = prev.first_refused_at.unwrap_or(now);
            if self.gives_up(since, prev.rejections.saturating_add(1), now) {
                return Outcome::Failed { error: error.reason, tried: true };
            }
        }
        Outcome::Retry {
            retry_at: now.saturating_add(self.backoff(prev.attempts)),
            error: error.reason,
            refused,
        }
    }
}

/// Messages read from the store in one go; the next chunk is read while
/// this one is produced.
const READ_CHUNK: usize = 2048;

/// Entries put off (for held topics) that are remembered one by one, at
/// most; past it the dispatcher rescans the due index from the lowest.
const DEFER_CAP: usize = 100_000;

/// How often the dispatcher tells readers where live entries start.
const PUBLISH_EVERY: Duration = Duration::from_millis(200);

/// Longest a first-try delivery is held back to be settled in dispatch
/// order: a slow produce below it does not hold its claim longer.
const HOLD_FOR: Duration = Duration::from_millis(100);

/// How often a dispatcher whose lease ran out looks whether it holds again.
const LEASE_RECHECK: Duration = Duration::from_millis(50);
/// How long the log must have named this node the shard's owner again,
/// after another node's producer fenced this one's, before it takes the
/// transactional id back: what the other node produced meanwhile reaches
/// the log first (as a node taking a shard waits after its claim).
const RETAKE_GRACE: Duration = Duration::from_millis(500);
/// Longest pause between tries of a cluster shard's transactional producer
/// that stopped before it was ready.
const PRODUCER_RETRY_MAX: Duration = Duration::from_secs(30);
/// How far past what it is about to produce the dispatcher records its
/// horizon: a commit per this much of due time at most, and what is in
/// doubt after an unclean stop is what was due up to this much later.
const HORIZON_AHEAD: Duration = Duration::from_secs(5);

/// A read of the due index under way, from `from`.
struct Reading {
    from: DispatchKey,
    task: tokio::task::JoinHandle<Result<DueBatch, StoreError>>,
}

/// What the dispatcher knows of one topic it is holding back or producing to.
#[derive(Default)]
struct TopicState {
    in_flight: usize,
    /// In-flight records unanswered for longer than `stall_after`.
    stalled: usize,
    refusal: Option<Refusal>,
    /// Due entries put off while the topic is held.
    deferred: Vec<(DispatchKey, MessageId)>,
}

/// A topic the broker refuses.
struct Refusal {
    since: UnixMillis,
    /// Probes refused so far (the first refusal counts as one).
    tries: u32,
    error: String,
    /// When the next probe may go.
    probe_at: UnixMillis,
    probing: bool,
}

impl TopicState {
    /// Whether the topic's messages wait now: its records stalled, or it is
    /// refused and no probe is due.
    fn held(&self, now: UnixMillis) -> bool {
        self.stalled > 0 || self.refusal.as_ref().is_some_and(|r| r.probing || now < r.probe_at)
    }

    fn is_idle(&self) -> bool {
        self.in_flight == 0 && self.refusal.is_none() && self.deferred.is_empty()
    }
}

/// Where a cluster shard's dispatcher records its settles instead of the
/// store: the schedule log, applied to the store from there.
pub(crate) trait Recorder: Send + Sync {
    fn record(
        &self,
        settles: Vec<Settle>,
        floor: Option<Floor>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>>;

    /// Appends a tombstone under each key, in order, once retention has
    /// ended for what it names; returns once all are in the log, with the
    /// offset of the last.
    fn tombstone(
        &self,
        keys: Vec<Vec<u8>>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<i64, String>> + Send + '_>>;

    /// Waits until every settle recorded so far is in the log.
    fn flushed(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>>;

    /// Records where `topic`'s partitions end (see [`Store::mark`]);
    /// returns once it is in the log.
    fn mark(
        &self,
        topic: Arc<str>,
        ends: Vec<(i32, i64)>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send + '_>>;
}

pub struct Dispatcher {
    store: Store,
    /// Cluster mode: where settles go.
    recorder: Option<Arc<dyn Recorder>>,
    /// Cluster mode: produces only while the node's lease holds and the
    /// log says this node incarnation owns the shard.
    lease: Option<(Arc<Lease>, u64)>,
    producer: Arc<Producer>,
    clock: Arc<dyn Clock>,
    config: DispatcherConfig,
    /// What the producer has, by token.
    sent: Sent,
    topics: HashMap<Arc<str>, TopicState>,
    deferred_total: usize,
    reports_tx: mpsc::UnboundedSender<DeliveryReport>,
    reports: mpsc::UnboundedReceiver<DeliveryReport>,
    /// Outcomes not yet handed to the store; sent together.
    settling: Vec<Settle>,
    /// Claims to give back with them: records refused with their topic.
    releasing: Vec<MessageId>,
    /// Entries to look at again: added behind the scan, held by the writer,
    /// or released by a topic that is no longer held.
    recheck: Vec<(DispatchKey, MessageId)>,
    /// Entries that could not be read, and when to try again.
    unreadable: Vec<(DispatchKey, MessageId)>,
    unreadable_retry: UnixMillis,
    /// Rescan from here: more was handed over or put off than is kept.
    rescan_from: Option<DispatchKey>,
    /// Everything in the due CF below this is settled, in flight, read
    /// ahead, or in one of the lists above.
    scan_from: DispatchKey,
    /// The next chunk, being read while this one is produced.
    reading: Option<Reading>,
    /// Read and claimed, in due order, waiting for in-flight room; since
    /// when; and what the read it came from said of what follows it.
    ahead: Vec<Ready>,
    ahead_since: Option<tokio::time::Instant>,
    after_ahead: Next,
    /// When the low water mark was last published.
    published: tokio::time::Instant,
    /// When a floor last went to the store without settles.
    floor_sent: tokio::time::Instant,
    /// Messages found on their topic by the reconciliation that could not
    /// be claimed then: recorded as delivered (partition, offset) when
    /// claimed from the same due entry, not produced again.
    landed: HashMap<MessageId, (DispatchKey, i32, i64)>,
    /// Topics whose partitions the store has marks for.
    marked: HashSet<Arc<str>>,
    /// Standalone: nothing due after this is produced until the store has
    /// recorded a later horizon, so that after an unclean stop only what
    /// was due by then is in doubt.
    horizon: UnixMillis,
    /// Cluster mode, transactional delivery: another node's producer
    /// fenced this shard's; nothing is produced until `take_back`.
    fenced: bool,
}

/// What becomes of one due message.
enum Decision {
    Produce { probe: bool },
    Defer,
    Fail(String),
}

/// What to do after a look at the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    /// More is due right now.
    Now,
    /// Sleep until this time (or a wake-up, or a report).
    At(UnixMillis),
    /// Nothing parked: wait for a wake-up or a report.
    Idle,
    /// In-flight limit reached: wait for reports.
    Full,
    /// Everything produced and not recorded fills the window: wait for
    /// the writer's commits (or reports).
    Commits,
}

impl Dispatcher {
    pub fn new(
        store: Store,
        producer: Arc<Producer>,
        clock: Arc<dyn Clock>,
        config: DispatcherConfig,
    ) -> Self {
        let (reports_tx, reports) = mpsc::unbounded_channel();
        // Nothing below the store's floor is pending: what lies there is
        // settled, or delivered and kept until retention.
        let scan_from = store.wake().floor_recorded();
        let horizon = store.horizon_at_open();
        Dispatcher {
            store,
            recorder: None,
            lease: None,
            producer,
            clock,
            config,
            sent: Sent::default(),
            topics: HashMap::new(),
            deferred_total: 0,
            reports_tx,
            reports,
            settling: Vec::new(),
            releasing: Vec::new(),
            recheck: Vec::new(),
            unreadable: Vec::new(),
            unreadable_retry: UnixMillis(0),
            rescan_from: None,
            scan_from,
            reading: None,
            ahead: Vec::new(),
            ahead_since: None,
            after_ahead: Next::Now,
            published: tokio::time::Instant::now() - PUBLISH_EVERY,
            floor_sent: tokio::time::Instant::now(),
            landed: HashMap::new(),
            marked: HashSet::new(),
            horizon,
            fenced: false,
        }
    }

    /// Records settles through `recorder` rather than in the store.
    pub(crate) fn recording_to(mut self, recorder: Arc<dyn Recorder>) -> Self {
        self.recorder = Some(recorder);
        self
    }

    /// Produces only while `lease` holds and the store's log owner is
    /// `owner` (this node incarnation).
    pub(crate) fn leased(mut self, lease: Arc<Lease>, owner: u64) -> Self {
        self.lease = Some((lease, owner));
        self
    }

    /// Whether the lease or another owner forbids producing now.
    fn unleased(&self) -> bool {
        self.lease.as_ref().is_some_and(|(lease, owner)| !lease.holds() || self.store.log_owner() != *owner)
    }

    pub async fn run(mut self, stop: CancellationToken) {
        if !self.start_producing(&stop).await {
            return self.drain().await;
        }
        loop {
            if self.fenced && !self.take_back(&stop).await {
                break;
            }
            metrics::DISPATCH_WAKEUPS.inc();
            // One commit for every outcome gathered since the last look.
            self.flush_settles(false).await;
            self.find_stalls();
            let next = if self.fenced { Next::Idle } else { self.dispatch_due().await };
            if let Next::At(due) = next {
                // Recorded while it sleeps, not when it wakes to produce.
                self.extend_horizon(due).await;
            }
            self.publish();
            let sleep = match next {
                Next::At(due) => self.clock.until(due).min(self.config.max_sleep),
                Next::Idle | Next::Full | Next::Commits => self.config.max_sleep,
                Next::Now => Duration::ZERO,
            };
            // What waits to be settled in order waits no longer than this.
            let sleep = if self.sent.has_answered() { sleep.min(HOLD_FOR) } else { sleep };
            tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                Some(report) = self.reports.recv() => {
                    self.on_report(report);
                    while let Ok(report) = self.reports.try_recv() {
                        self.on_report(report);
                    }
                }
                _ = self.store.wake().notified(), if !matches!(next, Next::Full) => {}
                _ = tokio::time::sleep(sleep) => {}
            }
        }
        self.drain().await;
    }

    /// Before the first produce: with transactional delivery, waits until
    /// the shard's earlier producers are fenced and their open transactions
    /// resolved; then finds on their topics what the last dispatcher of
    /// the shard may have produced without recording it (after an unclean
    /// stop, whatever was due; after a move, whatever was due before this
    /// one took over), and records it. False if stopped first.
    async fn start_producing(&mut self, stop: &CancellationToken) -> bool {
        let mut failed: u32 = 0;
        loop {
            let why = tokio::select! {
                _ = stop.cancelled() => return false,
                ready = self.producer.ready() => match ready {
                    Ok(()) => break,
                    Err(why) => why,
                },
            };
            if self.lease.is_none() {
                // Standalone: its failure stops the node.
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
            while self.unleased() {
                tokio::select! {
                    _ = stop.cancelled() => return false,
                    _ = tokio::time::sleep(LEASE_RECHECK) => {}
                }
            }
            match self.producer.renew() {
                Ok(producer) => self.producer = producer,
                Err(e) => {
                    tracing::error!(error = %e, "starting a new transactional producer for the shard failed")
                }
            }
        }
        let search = match self.lease {
            None => reconcile::after_restart(&self.store),
            Some(_) => reconcile::after_claim(self.clock.now()),
        };
        match reconcile::landed(&self.store, &self.producer, search, stop).await {
            Some(found) => {
                self.settle_found(found).await;
                true
            }
            None => false,
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
    async fn take_back(&mut self, stop: &CancellationToken) -> bool {
        tracing::warn!(
            "the shard's transactional producer was fenced by another node's; waiting to own the shard again"
        );
        self.flush_settles(true).await;
        if let Some(recorder) = &self.recorder {
            recorder.flushed().await;
        }
        let mut owned_since: Option<tokio::time::Instant> = None;
        loop {
            if self.unleased() {
                owned_since = None;
            } else if owned_since.get_or_insert_with(tokio::time::Instant::now).elapsed() >= RETAKE_GRACE
                && self.sent.is_empty()
            {
                break;
            }
            tokio::select! {
                _ = stop.cancelled() => return false,
                Some(report) = self.reports.recv() => self.on_report(report),
                _ = tokio::time::sleep(LEASE_RECHECK) => {}
            }
            self.flush_settles(false).await;
        }
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

    /// In-flight slots taken: records Kafka is answering in time.
    fn active(&self) -> usize {
        self.sent.waiting()
    }

    /// Claims and produces whatever is due now, as far as in-flight room
    /// allows.
    async fn dispatch_due(&mut self) -> Next {
        let now = self.clock.now();
        self.give_back_ahead(false).await;
        if self.store.writes_failing() {
            // What would be produced could not be recorded: a restart would
            // produce it again. Wait for the store.
            return Next::At(now.saturating_add(self.config.max_sleep));
        }
        if self.unleased() {
            // Another node may own the shard by now: wait for the group to
            // confirm this one (or for good, if the log names another).
            return Next::At(now.saturating_add(LEASE_RECHECK));
        }
        let late = self.store.wake().take();
        self.recheck.extend(late.entries);
        self.rescan(late.rescan_from);
        if let Some(from) = self.rescan_from.take() {
            self.scan_from = self.scan_from.min(from);
        }
        self.release_unheld(now);
        if now >= self.unreadable_retry {
            self.recheck.append(&mut self.unreadable);
        }
        // Stalled records keep their claims but not their slots. Twice the
        // limit bounds everything produced and not recorded yet: memory when
        // everything stalls, and what a restart produces again when commits
        // fail before the store reports it.
        let slots = self.config.max_in_flight.saturating_sub(self.active());
        let window = 2 * self.config.max_in_flight;
        let committing = self.store.wake().unrecorded();
        let unrecorded = self.sent.unhanded() + self.settling.len() + committing;
        let mut room = slots.min(window.saturating_sub(unrecorded));
        if room == 0 {
            if slots == 0 || committing == 0 {
                return Next::Full;
            }
            // Waiting on the writer rather than on Kafka: its next commit
            // of settles wakes this loop (unless one just came).
            return if self.store.wake().await_commits() < committing { Next::Now } else { Next::Commits };
        }

        // Entries to look at again first: they are due, and behind the scan.
        // Those found held by the writer again wait for the next look.
        let mut recheck = std::mem::take(&mut self.recheck);
        while !recheck.is_empty() && room > 0 {
            let take = recheck.len().min(room).min(READ_CHUNK);
            let entries: Vec<_> = recheck.drain(..take).collect();
            let batch = match self.store.take_listed(entries).await {
                Ok(batch) => batch,
                Err(e) => {
                    self.read_failed(&e);
                    return Next::At(now.saturating_add(self.config.max_sleep));
                }
            };
            room = room.saturating_sub(batch.ready.len());
            self.handle(batch, now).await;
        }
        self.recheck.append(&mut recheck);
        if room == 0 {
            return Next::Full;
        }

        // Then the due index, in chunks, the next one read while this one
        // is produced and while reports are awaited.
        let mut next = Next::Now;
        loop {
            if !self.ahead.is_empty() {
                if self.unleased() {
                    return Next::At(now.saturating_add(LEASE_RECHECK));
                }
                let take = room.min(self.ahead.len());
                room -= take;
                let ready: Vec<Ready> = self.ahead.drain(..take).collect();
                self.handle(DueBatch { ready, ..DueBatch::default() }, now).await;
                if !self.ahead.is_empty() {
                    return Next::Full;
                }
                self.ahead_since = None;
                next = self.after_ahead;
            }
            if next != Next::Now {
                break;
            }
            if room == 0 {
                return Next::Full;
            }
            let reading = match self.reading.take() {
                Some(reading) => reading,
                None => self.start_read(now),
            };
            let from = reading.from;
            let mut batch = match reading.task.await {
                Ok(Ok(batch)) => batch,
                Ok(Err(e)) => {
                    self.read_failed(&e);
                    return Next::At(now.saturating_add(self.config.max_sleep));
                }
                Err(e) => {
                    tracing::error!(error = %e, "the due-message reader panicked; retrying shortly");
                    return Next::At(now.saturating_add(self.config.max_sleep));
                }
            };
            // A rescan asked for meanwhile starts lower than this read did.
            if self.scan_from >= from {
                self.scan_from = batch.next_from;
            }
            self.after_ahead = match (batch.more, batch.next_dispatch_at) {
                (true, _) => Next::Now,
                (false, Some(due)) => Next::At(due),
                (false, None) => Next::Idle,
            };
            next = self.after_ahead;
            if batch.more {
                self.reading = Some(self.start_read(now));
            }
            self.ahead = std::mem::take(&mut batch.ready);
            self.ahead_since = Some(tokio::time::Instant::now());
            // What it found and cannot produce is dealt with now.
            self.handle(batch, now).await;
        }
        self.store.metrics().in_flight.set(self.sent.len() as i64);
        self.sooner(next)
    }

    /// Gives back what was read ahead and has waited for room too long
    /// (everything in flight stalled, or the store failing): its claims
    /// would hold cancels. At shutdown (`all`) it goes back at once.
    async fn give_back_ahead(&mut self, all: bool) {
        let waited = self.ahead_since.is_some_and(|since| since.elapsed() >= HOLD_FOR);
        if self.ahead.is_empty() || !(all || waited) {
            return;
        }
        self.ahead_since = None;
        self.after_ahead = Next::Now;
        let ahead = std::mem::take(&mut self.ahead);
        self.rescan(ahead.first().map(|r| r.key));
        let ids = ahead.into_iter().map(|r| r.id).collect();
        if let Err(e) = self.store.release(ids).await {
            tracing::warn!(error = %e, "returning claims failed");
        }
    }

    /// `next`, or earlier if a probe or a read is due to be tried again.
    fn sooner(&self, next: Next) -> Next {
        let probe = self
            .topics
            .values()
            .filter_map(|t| t.refusal.as_ref().filter(|r| !r.probing && !t.deferred.is_empty()))
            .map(|r| r.probe_at)
            .min();
        let unreadable = (!self.unreadable.is_empty()).then_some(self.unreadable_retry);
        match (next, probe.into_iter().chain(unreadable).min()) {
            (Next::Now | Next::Full | Next::Commits, _) => next,
            (Next::At(t), Some(other)) => Next::At(t.min(other)),
            (Next::Idle, Some(other)) => Next::At(other),
            (next, None) => next,
        }
    }

    /// Starts reading (and claiming) the next chunk of messages due at
    /// `now`, from where the scan stands.
    fn start_read(&self, now: UnixMillis) -> Reading {
        let store = self.store.clone();
        let (from, limit) = (self.scan_from, READ_CHUNK.min(self.config.max_in_flight.max(1)));
        Reading { from, task: tokio::spawn(async move { store.take_due(from, now, limit).await }) }
    }

    fn read_failed(&mut self, e: &StoreError) {
        tracing::error!(error = %e, "reading due messages failed; retrying shortly");
        if let StoreError::Corrupt(detail) = e {
            self.store.report_damage(detail);
        }
        self.store.report_reads(Some(format!("reading due messages failed: {e}")));
    }

    /// Produces what a look found ready, puts off what its topic's state
    /// holds back, and keeps track of the rest.
    async fn handle(&mut self, batch: DueBatch, now: UnixMillis) {
        let mut release = batch.stale;
        self.recheck.extend(batch.contended);
        if batch.unreadable.is_empty() {
            if self.unreadable.is_empty() {
                self.store.report_reads(None);
            }
        } else {
            for (key, id, e) in batch.unreadable {
                tracing::error!(id = %id.qualified(), error = %e, "reading a due message failed; trying it again shortly");
                self.store.report_reads(Some(format!("reading message {} failed: {e}", id.qualified())));
                release.push(id.clone());
                self.unreadable.push((key, id));
            }
            self.unreadable_retry = now.saturating_add(self.config.max_sleep);
        }
        for ready in &batch.ready {
            if !self.marked.contains(ready.record.topic.as_str()) {
                self.mark(ready.record.topic.as_str().into()).await;
            }
        }
        if let Some(latest) = batch.ready.iter().map(|r| r.key.at).max() {
            self.extend_horizon(latest).await;
        }
        for ready in batch.ready {
            // One allocation per topic, not per message.
            let topic = match self.topics.get_key_value(ready.record.topic.as_str()) {
                Some((known, _)) => Arc::clone(known),
                None => ready.record.topic.as_str().into(),
            };
            if let Some((key, partition, offset)) = self.landed.remove(&ready.id)
                && key == ready.key
            {
                // It reached Kafka before the unclean stop.
                self.settle_untried(ready, topic, now, Outcome::Delivered { partition, offset });
                continue;
            }
            match self.decide(&topic, now) {
                Decision::Produce { probe } => self.produce(ready, topic, probe),
                Decision::Defer => {
                    self.defer(topic, ready.key, ready.id.clone());
                    release.push(ready.id);
                }
                Decision::Fail(error) => {
                    // The topic has refused long enough: its messages fail
                    // with its reason, without a try of their own.
                    self.settle_untried(ready, topic, now, Outcome::Failed { error, tried: false });
                }
            }
        }
        if let Err(e) = self.store.release(release).await {
            tracing::warn!(error = %e, "returning claims failed");
        }
    }

    /// Records the messages the reconciliation found on their topics as
    /// delivered, and waits until that is durable, before anything is
    /// produced: a later delivery may raise a mark past them. One held by
    /// a change in progress is settled when it is next claimed, if its due
    /// entry is still the one found.
    async fn settle_found(&mut self, found: Vec<reconcile::Found>) {
        if found.is_empty() {
            return;
        }
        let mut at: HashMap<MessageId, (DispatchKey, i32, i64)> =
            found.into_iter().map(|f| (f.id, (f.key, f.partition, f.offset))).collect();
        let entries = at.iter().map(|(id, (key, _, _))| (*key, id.clone())).collect();
        let batch = match self.store.take_listed(entries).await {
            Ok(batch) => batch,
            Err(e) => {
                tracing::warn!(error = %e, "claiming the messages found on their topics failed; they are settled when next claimed");
                self.landed = at;
                return;
            }
        };
        let now = self.clock.now();
        let mut release = batch.stale;
        release.extend(batch.unreadable.into_iter().map(|(_, id, _)| id));
        for ready in batch.ready {
            match at.remove(&ready.id) {
                Some((key, partition, offset)) if key == ready.key => {
                    let topic: Arc<str> = ready.record.topic.as_str().into();
                    self.settle_untried(ready, topic, now, Outcome::Delivered { partition, offset });
                }
                _ => release.push(ready.id),
            }
        }
        if let Err(e) = self.store.release(release).await {
            tracing::warn!(error = %e, "returning claims failed");
        }
        self.landed = at;
        self.flush_settles(false).await;
        let recorded = match &self.recorder {
            Some(recorder) => {
                recorder.flushed().await;
                Ok(())
            }
            None => self.store.probe().await,
        };
        if let Err(e) = recorded {
            tracing::warn!(error = %e, "recording the messages found on their topics failed");
        }
    }

    /// Standalone: records, before anything due after the horizon is
    /// produced, a horizon [`HORIZON_AHEAD`] past `due`. One commit per
    /// step, not per message.
    async fn extend_horizon(&mut self, due: UnixMillis) {
        if self.recorder.is_some() || due <= self.horizon {
            return;
        }
        let until = due.saturating_add(HORIZON_AHEAD);
        match self.store.extend_horizon(until).await {
            Ok(()) => self.horizon = until,
            // Produced anyway: after a crash, what went out past the
            // recorded horizon is produced again, never lost.
            Err(e) => tracing::warn!(error = %e, "recording the dispatch horizon failed"),
        }
    }

    /// Before the first produce of this store to `topic`: marks where its
    /// partitions end, unless they have marks, so that a search for what
    /// an unclean stop left unrecorded starts there (see [`reconcile`]).
    /// A topic the broker does not describe now is not marked; its
    /// partitions are then searched from their start.
    async fn mark(&mut self, topic: Arc<str>) {
        self.marked.insert(Arc::clone(&topic));
        match self.store.marks_of(&topic).await {
            Ok(marks) if !marks.is_empty() => return,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(topic = %topic, error = %e, "reading a topic's marks failed");
                return;
            }
        }
        let producer = Arc::clone(&self.producer);
        let asking = Arc::clone(&topic);
        let ends = tokio::task::spawn_blocking(move || producer.ends(&asking, Duration::from_secs(5))).await;
        let marked = match ends {
            Ok(Ok(ends)) if !ends.is_empty() => match &self.recorder {
                Some(recorder) => recorder.mark(Arc::clone(&topic), ends).await,
                None => self.store.mark(Arc::clone(&topic), ends).await.map_err(|e| e.to_string()),
            },
            Ok(Ok(_)) => Err("the broker does not know the topic".to_owned()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = marked {
            tracing::debug!(
                topic = %topic,
                error = %e,
                "marking where a topic's partitions end failed: after an unclean stop, they are read back from their start"
            );
        }
    }

    /// What to do with a due message of `topic`, now.
    fn decide(&mut self, topic: &Arc<str>, now: UnixMillis) -> Decision {
        let config = &self.config;
        let state = self.topics.entry(Arc::clone(topic)).or_default();
        if state.held(now) {
            return match &state.refusal {
                Some(r) if config.gives_up(r.since, r.tries, now) => {
                    Decision::Fail(refusal_reason(&r.error, r, now))
                }
                _ => Decision::Defer,
            };
        }
        let probe = state.refusal.as_mut().map(|r| r.probing = true).is_some();
        Decision::Produce { probe }
    }

    /// Settles a message that was not produced (its topic gave up).
    fn settle_untried(&mut self, ready: Ready, topic: Arc<str>, now: UnixMillis, outcome: Outcome) {
        self.settling.push(Settle {
            id: ready.id,
            key: ready.key,
            due: ready.record.due(),
            topic,
            tries: ready.tries,
            at: now,
            outcome,
            in_order: false,
        });
    }

    /// Remembers a due entry of a held topic, to look at again when the
    /// topic is no longer held.
    fn defer(&mut self, topic: Arc<str>, key: DispatchKey, id: MessageId) {
        if self.deferred_total >= DEFER_CAP {
            self.rescan(Some(key));
            return;
        }
        self.deferred_total += 1;
        self.topics.entry(topic).or_default().deferred.push((key, id));
    }

    fn rescan(&mut self, from: Option<DispatchKey>) {
        if let Some(from) = from {
            self.rescan_from = Some(self.rescan_from.map_or(from, |r| r.min(from)));
        }
    }

    /// Hands the put-off entries of topics no longer held (or due for a
    /// probe, or failing) back for a look, and forgets idle topics.
    fn release_unheld(&mut self, now: UnixMillis) {
        let mut released = 0;
        for state in self.topics.values_mut() {
            let giving_up =
                state.refusal.as_ref().is_some_and(|r| self.config.gives_up(r.since, r.tries, now));
            if !state.deferred.is_empty() && (!state.held(now) || giving_up) {
                released += state.deferred.len();
                self.recheck.append(&mut state.deferred);
            }
        }
        self.deferred_total -= released;
        // A refused topic that gave up and has nothing left waits for
        // nothing: a message that comes later gets a fresh try.
        for (topic, state) in &mut self.topics {
            let gave_up = state.refusal.as_ref().is_some_and(|r| self.config.gives_up(r.since, r.tries, now));
            if gave_up && state.deferred.is_empty() && state.in_flight == 0 {
                state.refusal = None;
                note_held(self.store.held(), topic, state, self.config.stall_after);
            }
        }
        self.topics.retain(|_, t| !t.is_idle());
    }

    fn produce(&mut self, ready: Ready, topic: Arc<str>, probe: bool) {
        let record = &ready.record;
        let due = record.due_ms.to_string();
        let mut headers: Vec<(&str, &[u8])> =
            record.headers.iter().map(|h| (h.key.as_str(), h.value.as_slice())).collect();
        headers.push((ID_HEADER, ready.id.as_str().as_bytes()));
        headers.push((DUE_HEADER, due.as_bytes()));
        if let Some(tenant) = ready.id.tenant() {
            headers.push((TENANT_HEADER, tenant.as_bytes()));
        }
        let outgoing = Outgoing {
            topic: &record.topic,
            key: record.key.as_deref(),
            value: &record.value,
            headers,
            partition: record.partition,
        };
        let token = self.sent.next_token();
        let queued = self.producer.send(outgoing, token, &self.reports_tx);
        let due = record.due();
        self.sent.push(InFlight {
            id: ready.id,
            key: ready.key,
            due,
            topic: Arc::clone(&topic),
            tries: ready.tries,
            probe,
            sent_at: tokio::time::Instant::now(),
        });
        self.topics.entry(topic).or_default().in_flight += 1;
        if let Err(error) = queued {
            // Refused before it was queued: the same as a failed report.
            self.on_report(DeliveryReport { token, result: Err(error) });
        }
    }

    /// Marks records Kafka has not answered for `stall_after` as stalled:
    /// their topics are held and their slots freed. (Answered records are
    /// dropped from the front of the send order as they are met, so it
    /// stays about as long as what is in flight.)
    fn find_stalls(&mut self) {
        for sent in self.sent.find_stalls(self.config.stall_after) {
            let state = self.topics.entry(Arc::clone(&sent.topic)).or_default();
            state.stalled += 1;
            if state.stalled == 1 {
                note_held(self.store.held(), &sent.topic, state, self.config.stall_after);
                tracing::warn!(
                    topic = %sent.topic,
                    waited = ?self.config.stall_after,
                    "Kafka has not answered a produce to this topic; its messages wait, the others go on"
                );
            }
        }
        let metrics = self.store.metrics();
        metrics.held_stalled.set(self.topics.values().filter(|t| t.stalled > 0).count() as i64);
        metrics.held_refused.set(self.topics.values().filter(|t| t.refusal.is_some()).count() as i64);
    }

    /// Tells readers of the due index where live entries start; at most
    /// every [`PUBLISH_EVERY`], as it looks at everything in flight.
    fn publish(&mut self) {
        if self.published.elapsed() < PUBLISH_EVERY {
            return;
        }
        self.published = tokio::time::Instant::now();
        let lowest = self.settling.iter().map(|s| s.key).fold(self.lowest_held(), DispatchKey::min);
        self.store.wake().set_low_water(lowest);
    }

    /// The lowest due entry that may be pending: one not yet handed to the
    /// store settled, one put off or to look at again, or where the scan
    /// goes on. (Outcomes gathered in `settling` are not counted.)
    fn lowest_held(&self) -> DispatchKey {
        self.sent
            .unsettled_keys()
            .chain(self.recheck.iter().map(|(k, _)| *k))
            .chain(self.unreadable.iter().map(|(k, _)| *k))
            .chain(self.topics.values().flat_map(|t| t.deferred.iter().map(|(k, _)| *k)))
            .chain(self.rescan_from)
            .chain(self.ahead.iter().map(|r| r.key))
            .fold(self.scan_from, DispatchKey::min)
    }

    /// Hands the gathered outcomes to the store as one commit: first-try
    /// deliveries once everything sent before them is answered (all of
    /// them when `all`, or when they have waited long or are many).
    async fn flush_settles(&mut self, all: bool) {
        let in_order = self.sent.flush(all, HOLD_FOR, self.config.max_in_flight);
        let mut settles = std::mem::take(&mut self.settling);
        settles.extend(in_order);
        // Once these are recorded, nothing below the floor is pending. It
        // needs only be fresh enough for a restart to start near the end,
        // and finding it looks at everything held: at most every
        // PUBLISH_EVERY.
        let floor = (all || self.floor_sent.elapsed() >= PUBLISH_EVERY).then(|| {
            self.floor_sent = tokio::time::Instant::now();
            self.store.wake().floor(self.lowest_held())
        });
        if let Some(recorder) = &self.recorder {
            recorder.record(settles, floor).await;
        } else if let Err(e) = self.store.settle(settles, floor).await {
            tracing::error!(error = %e, "settling deliveries failed; they will be produced again after restart");
        }
        if let Err(e) = self.store.release(std::mem::take(&mut self.releasing)).await {
            tracing::warn!(error = %e, "returning claims failed");
        }
    }

    fn on_report(&mut self, report: DeliveryReport) {
        let Some((sent, stalled)) = self.sent.take(report.token) else {
            return;
        };
        self.store.metrics().in_flight.set(self.sent.len() as i64);
        let now = self.clock.now();
        let state = self.topics.entry(Arc::clone(&sent.topic)).or_default();
        state.in_flight -= 1;
        if stalled {
            state.stalled -= 1;
            if state.stalled == 0 {
                note_held(self.store.held(), &sent.topic, state, self.config.stall_after);
                tracing::info!(topic = %sent.topic, "Kafka answers produces to this topic again");
            }
        }
        let outcome = match report.result {
            Ok((partition, offset)) => {
                crate::failpoint::hit("dispatch-before-settle");
                if let Some(refusal) = state.refusal.take() {
                    note_held(self.store.held(), &sent.topic, state, self.config.stall_after);
                    tracing::info!(
                        topic = %sent.topic,
                        refused_for = ?now.since(refusal.since),
                        "the topic takes records again"
                    );
                }
                Outcome::Delivered { partition, offset }
            }
            Err(error) if error.fault == Fault::Fenced => {
                // Another producer took the shard's transactional id: the
                // record was not delivered (its transaction is aborted),
                // and the message is not this dispatcher's to settle. It
                // goes back to the store untouched; see `take_back`.
                tracing::debug!(id = %sent.id.qualified(), error = %error.reason, "produce fenced");
                self.fenced = true;
                self.rescan(Some(sent.key));
                self.releasing.push(sent.id);
                return;
            }
            Err(error) => {
                let kind = match error.fault {
                    Fault::Outage => "outage",
                    Fault::TopicRefused | Fault::MessageRefused | Fault::Fenced => "rejected",
                };
                metrics::PRODUCE_ERRORS.with_label_values(&[kind]).inc();
                tracing::warn!(
                    id = %sent.id.qualified(),
                    topic = %sent.topic,
                    kind,
                    error = %error.reason,
                    "produce failed"
                );
                if error.fault != Fault::TopicRefused {
                    self.config.outcome_of_error(error, &sent.tries, now)
                } else if let Some(outcome) = {
                    let outcome = topic_refused(&self.config, state, &sent, error, now);
                    note_held(self.store.held(), &sent.topic, state, self.config.stall_after);
                    outcome
                } {
                    outcome
                } else {
                    // Not produced: it waits with its topic.
                    self.defer(Arc::clone(&sent.topic), sent.key, sent.id.clone());
                    self.releasing.push(sent.id);
                    return;
                }
            }
        };
        let settle = Settle {
            id: sent.id,
            key: sent.key,
            due: sent.due,
            topic: sent.topic,
            tries: sent.tries,
            at: now,
            outcome,
            in_order: false,
        };
        if matches!(settle.outcome, Outcome::Delivered { .. }) && !settle.tries.recorded {
            if let Some(settle) = self.sent.answer(report.token, settle) {
                self.settling.push(settle);
            }
        } else {
            self.settling.push(settle);
        }
    }

    /// Shutdown: produce nothing new, wait (up to the grace period) for what
    /// is in flight, and settle it. Records still unanswered then are in
    /// doubt: they may yet reach Kafka. The store keeps their claims and
    /// answers requests about them UNAVAILABLE, never CANCELLED; after a
    /// restart they are produced again.
    async fn drain(mut self) {
        // What was read and not produced goes back.
        if let Some(reading) = self.reading.take()
            && let Ok(Ok(batch)) = reading.task.await
        {
            self.ahead.extend(batch.ready);
            self.releasing.extend(batch.stale);
            self.releasing.extend(batch.unreadable.into_iter().map(|(_, id, _)| id));
        }
        self.give_back_ahead(true).await;
        let deadline = deadline_after(self.config.shutdown_grace);
        while !self.sent.is_empty() {
            match tokio::time::timeout_at(deadline, self.reports.recv()).await {
                Ok(Some(report)) => self.on_report(report),
                Ok(None) | Err(_) => break,
            }
        }
        self.flush_settles(true).await;
        if !self.sent.is_empty() {
            tracing::warn!(
                unacknowledged = self.sent.len(),
                "shutdown grace ran out; Kafka has not answered these produces: they stay pending, \
                 in doubt, and are produced again after restart"
            );
        }
        let ids = self.sent.take_all().into_iter().map(|f| f.id).collect();
        if let Err(e) = self.store.in_doubt(ids).await {
            tracing::error!(error = %e, "reporting produces in doubt at shutdown failed");
        }
        self.store.metrics().in_flight.set(0);
        self.store.metrics().held_stalled.set(0);
        self.store.metrics().held_refused.set(0);
        self.store.held().clear();
    }
}

/// Records a refusal of `sent`'s topic in its `state`; returns the
/// message's outcome if the topic has refused long enough to give up, else
/// none (it waits with its topic).
fn topic_refused(
    config: &DispatcherConfig,
    state: &mut TopicState,
    sent: &InFlight,
    error: ProduceError,
    now: UnixMillis,
) -> Option<Outcome> {
    let refusal = state.refusal.get_or_insert_with(|| {
        tracing::warn!(topic = %sent.topic, error = %error.reason, "the broker refuses this topic; holding its messages");
        Refusal { since: now, tries: 0, error: String::new(), probe_at: now, probing: false }
    });
    // Many records may be refused at once; one try counts per probe.
    if sent.probe || refusal.tries == 0 {
        refusal.tries = refusal.tries.saturating_add(1);
        refusal.probe_at = now.saturating_add(config.backoff(refusal.tries.saturating_sub(1)));
        refusal.probing = false;
    }
    refusal.error = error.reason;
    config
        .gives_up(refusal.since, refusal.tries, now)
        .then(|| Outcome::Failed { error: refusal_reason(&refusal.error, refusal, now), tried: true })
}

/// Tells the store why `topic`'s messages wait, as `state` has it now (a
/// refusal, else a stall), or that they do not: what `Get`, `List` and
/// `Stats` show on its pending messages.
fn note_held(held: &HeldTopics, topic: &Arc<str>, state: &TopicState, stall_after: Duration) {
    match (&state.refusal, state.stalled) {
        (Some(r), _) => held.hold(
            topic,
            format!(
                "waiting: the broker refuses topic {topic:?} (since {}, {} tries; it is tried again with \
                 backoff, and its messages fail once it has refused for --fail-after and \
                 --max-delivery-attempts tries): {}",
                r.since.to_rfc3339(),
                r.tries,
                r.error
            ),
        ),
        (None, 0) => held.release(topic),
        (None, _) => held.hold(
            topic,
            format!(
                "waiting: Kafka has not answered a produce to topic {topic:?} for {}",
                crate::message::duration_text(stall_after)
            ),
        ),
    }
}

/// Why the messages of a refused topic failed.
fn refusal_reason(error: &str, refusal: &Refusal, now: UnixMillis) -> String {
    format!(
        "{error} (the topic refused every try for {}, {} tries)",
        humantime::format_duration(now.since(refusal.since)),
        refusal.tries
    )
}

/// `grace` from now, or as far as the timer reaches.
fn deadline_after(grace: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(grace).unwrap_or_else(|| now + Duration::from_secs(86_400 * 365))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let c = DispatcherConfig {
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(1),
            ..DispatcherConfig::default()
        };
        assert_eq!(c.backoff(0), Duration::from_millis(100));
        assert_eq!(c.backoff(1), Duration::from_millis(200));
        assert_eq!(c.backoff(3), Duration::from_millis(800));
        assert_eq!(c.backoff(4), Duration::from_secs(1));
        assert_eq!(c.backoff(u32::MAX), Duration::from_secs(1));
    }

    fn tried(attempts: u32, rejections: u32, first_refused_at_ms: u64) -> Tries {
        let first_refused_at = (first_refused_at_ms > 0).then_some(UnixMillis(first_refused_at_ms));
        Tries { attempts, rejections, first_refused_at, recorded: attempts > 0 }
    }

    #[test]
    fn a_refused_message_fails_only_after_enough_tries_and_enough_time() {
        let c = DispatcherConfig {
            max_attempts: 3,
            fail_after: Duration::from_secs(60),
            ..DispatcherConfig::default()
        };
        let too_large = || ProduceError { fault: Fault::MessageRefused, reason: "too large".into() };
        let outage = ProduceError { fault: Fault::Outage, reason: "queue full".into() };
        let at = |ms| UnixMillis(ms);
        assert!(matches!(
            c.outcome_of_error(outage, &tried(500, 2, 1), at(1_000_000)),
            Outcome::Retry { refused: false, .. }
        ));
        // Enough tries, not enough time: the glitch fails nothing.
        assert!(matches!(
            c.outcome_of_error(too_large(), &tried(9, 9, 1_000), at(30_000)),
            Outcome::Retry { refused: true, .. }
        ));
        // Enough time, not enough tries.
        assert!(matches!(
            c.outcome_of_error(too_large(), &tried(1, 1, 1_000), at(1_000_000)),
            Outcome::Retry { refused: true, .. }
        ));
        // The first refusal starts the clock.
        assert!(matches!(
            c.outcome_of_error(too_large(), &tried(5, 5, 0), at(1_000_000)),
            Outcome::Retry { refused: true, .. }
        ));
        match c.outcome_of_error(too_large(), &tried(2, 2, 1_000), at(61_000)) {
            Outcome::Failed { error, tried } => assert!(tried && error == "too large"),
            other => panic!("the third refusal a minute on must fail the message, got {other:?}"),
        }
    }

    #[test]
    fn counters_at_their_limits_neither_wrap_nor_panic() {
        let c = DispatcherConfig { max_attempts: u32::MAX, ..DispatcherConfig::default() };
        let too_large = || ProduceError { fault: Fault::MessageRefused, reason: "too large".into() };
        let worn = tried(u32::MAX, u32::MAX, 1);
        match c.outcome_of_error(too_large(), &worn, UnixMillis(u64::MAX)) {
            Outcome::Failed { .. } => {}
            other => panic!("a message refused u32::MAX times for ages is failed, not retried: {other:?}"),
        }
        let retry = c.outcome_of_error(
            ProduceError { fault: Fault::Outage, reason: "x".into() },
            &worn,
            UnixMillis(u64::MAX - 1),
        );
        assert!(matches!(retry, Outcome::Retry { retry_at: UnixMillis(u64::MAX), .. }), "{retry:?}");
        assert!(c.gives_up(UnixMillis(0), u32::MAX, UnixMillis(u64::MAX)));
        assert!(!c.gives_up(UnixMillis(u64::MAX), u32::MAX, UnixMillis(0)), "a clock behind counts no time");
    }

    #[test]
    fn a_huge_grace_does_not_overflow_the_timer() {
        let deadline = deadline_after(Duration::MAX);
        assert!(deadline > tokio::time::Instant::now());
        let soon = deadline_after(Duration::from_millis(5));
        assert!(soon <= tokio::time::Instant::now() + Duration::from_millis(5));
    }
}
