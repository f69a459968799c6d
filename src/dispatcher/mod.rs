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
//! the store's schema); what is held back for order is bounded in
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
//! so that no cancel of them is answered `CANCELLED`. In cluster mode the
//! shard's own producer then drops them, so that none is sent after the
//! shard's next owner looked for it on its topic.
//!
//! After a stop that was not clean, it first reads the target topics back
//! for what it may have produced without recording it ([`reconcile`]):
//! what it finds there is recorded as delivered instead of produced again.
//! Before its first produce to a topic, it marks where the topic's
//! partitions end, which bounds that read.
//!
//! While the store cannot record deliveries (disk full) it produces nothing.
//!
//! What it settles, the marks and the dispatch horizon go through its
//! [`Recorder`]: the store itself standalone ([`StoreRecorder`]), the
//! schedule log in cluster mode. It produces only while its [`Gate`] is
//! open: always standalone ([`AlwaysOpen`]); in cluster mode, while the
//! node's lease holds and the log names this node the shard's owner.
//!
//! Here are the dispatcher, its parts and its loop; beside them, where it
//! reads ([`read_ahead`]), what it does with what it read ([`produce`]),
//! the topics it holds back ([`topics`]), what became of its produces
//! ([`settle`], in send order by [`sent`]), and what it does before it
//! produces ([`start`], [`reconcile`]) and what bounds the doubt an
//! unclean stop leaves ([`doubt`]).

use std::{sync::Arc, time::Duration};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{
    clock::Clock,
    command::DispatchKey,
    command::{DueBatch, Handed, Outcome, Ready, Settle},
    kafka::{DeliveryReport, Producer},
    message::{MessageId, UnixMillis},
    metrics,
    store::{Store, StoreError},
};

mod config;
mod dead_letter;
mod doubt;
mod gate;
mod handle;
mod policy;
mod produce;
mod pulse;
mod read_ahead;
mod reconcile;
mod recorder;
mod sent;
mod settle;
mod start;
mod topics;

pub(crate) use config::DispatcherConfig;
use doubt::Doubt;
pub(crate) use gate::{AlwaysOpen, Gate};
use pulse::Pulse;
pub(crate) use reconcile::CLAIM_GRACE;
pub(crate) use recorder::{Recorder, StoreRecorder};
use sent::Sent;

/// How often the dispatcher tells readers where live entries start.
const PUBLISH_EVERY: Duration = Duration::from_millis(200);

/// Longest a first-try delivery is held back to be settled in dispatch
/// order: a slow produce below it does not hold its claim longer.
const HOLD_FOR: Duration = Duration::from_millis(100);

/// Answered first-try deliveries go to the store at most once per this
/// much time: a steady stream is settled in a commit per interval (each an
/// fsync with `--durability sync`), not in one per batch of answers, which
/// cost 1,600 commits a second at 20,000 msg/s. A crash loses at most what
/// gathered; that is in doubt, and found on its topic, like any delivery
/// not yet recorded.
const GATHER: Duration = Duration::from_millis(5);

/// How often a dispatcher whose gate is shut (in cluster mode: the lease
/// ran out, or the log names another owner) looks whether it opened again.
const GATE_RECHECK: Duration = Duration::from_millis(50);

/// Both clocks, read once for many records of a batch: in a drain, two
/// reads of the clock per produce and as many per report were a seventh
/// of the dispatcher's own work.
#[derive(Clone, Copy)]
struct Stamp {
    at: tokio::time::Instant,
    wall: UnixMillis,
}

impl Stamp {
    /// Records handled between two reads of the clocks: a few dozen
    /// microseconds of work, well inside the millisecond times are kept in.
    const FOR_RECORDS: u32 = 64;

    fn now(clock: &dyn Clock) -> Stamp {
        Stamp { at: tokio::time::Instant::now(), wall: clock.now() }
    }
}

/// The clocks for one batch of records, read again every
/// [`Stamp::FOR_RECORDS`].
struct Stamps {
    stamp: Stamp,
    left: u32,
}

impl Stamps {
    fn new(clock: &dyn Clock) -> Stamps {
        Stamps { stamp: Stamp::now(clock), left: Stamp::FOR_RECORDS }
    }

    fn next(&mut self, clock: &dyn Clock) -> Stamp {
        if self.left == 0 {
            *self = Stamps::new(clock);
        }
        self.left -= 1;
        self.stamp
    }
}

/// A read of the due index under way, from `from`: what it claimed, and
/// the horizon it recorded for it.
struct Reading {
    from: DispatchKey,
    task: tokio::task::JoinHandle<Result<(DueBatch, Option<doubt::Recording>), StoreError>>,
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

pub(crate) struct Dispatcher {
    store: Store,
    /// Where settles go: the store, or in cluster mode the schedule log.
    recorder: Arc<dyn Recorder>,
    /// Produces only while it is open: always, standalone; in cluster mode,
    /// while the node's lease holds and the log says this node incarnation
    /// owns the shard.
    gate: Box<dyn Gate>,
    producer: Arc<Producer>,
    clock: Arc<dyn Clock>,
    config: DispatcherConfig,
    /// What the producer has, by token.
    sent: Sent,
    reports: Reports,
    topics: Topics,
    scan: Scan,
    ahead: ReadAhead,
    settling: Settling,
    doubt: Doubt,
    /// Cluster mode, transactional delivery: another node's producer
    /// fenced this shard's; nothing is produced until `take_back`.
    fenced: bool,
    /// The dispatch policies, and the lanes they hold back.
    policies: policy::Policies,
}

/// Where the producer sends its delivery reports, and where they are read.
struct Reports {
    tx: mpsc::UnboundedSender<DeliveryReport>,
    rx: mpsc::UnboundedReceiver<DeliveryReport>,
    /// Where each delivery's time went, observed per report and published
    /// once per batch of reports (see [`Stages::publish`]).
    stages: Stages,
}

/// The stage histograms of deliveries, gathered on the dispatcher's task.
struct Stages {
    wait: prometheus::local::LocalHistogram,
    broker: prometheus::local::LocalHistogram,
    report: prometheus::local::LocalHistogram,
}

impl Stages {
    fn new() -> Self {
        Stages {
            wait: metrics::STAGE_WAIT.local(),
            broker: metrics::STAGE_BROKER.local(),
            report: metrics::STAGE_REPORT.local(),
        }
    }

    /// Publishes what was observed since the last time.
    fn publish(&self) {
        self.wait.flush();
        self.broker.flush();
        self.report.flush();
    }
}

/// What the dispatcher knows of the topics it holds back or produces to.
struct Topics {
    states: foldhash::HashMap<Arc<str>, TopicState>,
    /// Entries put off, in all topics together.
    deferred_total: usize,
}

/// Where the walk of the due index stands, and the entries looked at again
/// apart from it.
struct Scan {
    /// Entries to look at again: added behind the scan, held by the writer,
    /// or released by a topic that is no longer held.
    recheck: Vec<(DispatchKey, MessageId)>,
    /// Entries that could not be read, and when to try again.
    unreadable: Vec<(DispatchKey, MessageId)>,
    unreadable_retry: UnixMillis,
    /// Rescan from here: more was handed over or put off than is kept.
    /// Within the range of a read under way, it waits for the read to
    /// land (the read moves the scan on past it).
    rescan_from: Option<DispatchKey>,
    /// Everything in the due CF below this is settled, in flight, read
    /// ahead, or in one of the lists above.
    from: DispatchKey,
}

impl Scan {
    /// Looks at the due index again from `from` (if any) on the next read.
    fn rescan(&mut self, from: Option<DispatchKey>) {
        if let Some(from) = from {
            self.rescan_from = Some(self.rescan_from.map_or(from, |r| r.min(from)));
        }
    }
}

/// What was read ahead of what is produced.
struct ReadAhead {
    /// The next chunk, being read while this one is produced.
    reading: Option<Reading>,
    /// Read and claimed, in due order, waiting for in-flight room; since
    /// when; and what the read it came from said of what follows it.
    ready: Vec<Ready>,
    since: Option<tokio::time::Instant>,
    after: Next,
    /// The topic of the next message due after what was read, if it is
    /// not marked yet (see [`Dispatcher::mark_ahead`]).
    next_topic: Option<Box<str>>,
    /// The lowest entry read ahead and given back while the next read was
    /// under way: that read, if it started above, goes back too.
    given_back: Option<DispatchKey>,
}

/// Outcomes on their way to the recorder, and when the store was last
/// told where live entries start.
struct Settling {
    /// Outcomes not yet handed to the store; sent together.
    settles: Vec<Settle>,
    /// Claims to give back with them: records refused with their topic.
    releasing: Vec<MessageId>,
    /// When the low water mark was last published.
    published: tokio::time::Instant,
    /// When a floor last went to the store without settles.
    floor_sent: tokio::time::Instant,
    /// Messages given up on, on their way to their dead-letter topics.
    letters: Vec<dead_letter::Letter>,
}

impl Settling {
    /// Settles a message that was not produced (found on its topic after
    /// an unclean stop, expired, or failed with its topic).
    fn untried(&mut self, ready: Ready, topic: Arc<str>, now: UnixMillis, outcome: Outcome) {
        self.settles.push(Settle {
            id: ready.id,
            key: ready.key,
            due: ready.due,
            topic,
            tries: ready.tries,
            at: now,
            outcome,
            handed: Handed::Alone,
        });
    }
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
    /// A dispatcher of `store` that records through `recorder` and produces
    /// while `gate` is open.
    pub(crate) fn new(
        store: Store,
        producer: Arc<Producer>,
        clock: Arc<dyn Clock>,
        config: DispatcherConfig,
        recorder: Arc<dyn Recorder>,
        gate: Box<dyn Gate>,
    ) -> Self {
        let (reports_tx, reports) = mpsc::unbounded_channel();
        // Nothing below the store's floor is pending: what lies there is
        // settled, or delivered and kept until retention.
        let scan_from = store.wake().floor_recorded();
        let (in_flight_at, pulse) = (Pulse::last(store.path()), Pulse::start(store.path()));
        let in_doubt = store.in_doubt_window().is_some();
        let doubt = Doubt::new(Arc::clone(&recorder), store.horizon_at_open(), in_doubt, in_flight_at, pulse);
        let policies = policy::Policies::new(store.policies());
        Dispatcher {
            store,
            recorder,
            gate,
            producer,
            clock,
            config,
            sent: Sent::default(),
            reports: Reports { tx: reports_tx, rx: reports, stages: Stages::new() },
            topics: Topics { states: foldhash::HashMap::default(), deferred_total: 0 },
            scan: Scan {
                recheck: Vec::new(),
                unreadable: Vec::new(),
                unreadable_retry: UnixMillis(0),
                rescan_from: None,
                from: scan_from,
            },
            ahead: ReadAhead {
                reading: None,
                ready: Vec::new(),
                since: None,
                after: Next::Now,
                next_topic: None,
                given_back: None,
            },
            settling: Settling {
                settles: Vec::new(),
                releasing: Vec::new(),
                published: tokio::time::Instant::now() - PUBLISH_EVERY,
                floor_sent: tokio::time::Instant::now(),
                letters: Vec::new(),
            },
            doubt,
            fenced: false,
            policies,
        }
    }

    pub(crate) async fn run(mut self, stop: CancellationToken) {
        if !self.start_producing(&stop).await {
            return self.drain(false).await;
        }
        // Whether what the shard's last dispatcher left in doubt is
        // resolved: not while fenced, until taken back and searched.
        let mut resolved = true;
        loop {
            if self.fenced {
                resolved = false;
                if !self.take_back(&stop).await {
                    break;
                }
                resolved = !self.fenced;
            }
            metrics::DISPATCH_WAKEUPS.inc();
            // What the reports gave up on goes to dead-letter topics.
            self.send_dead_letters().await;
            // One commit for every outcome gathered since the last look.
            self.flush_settles(false).await;
            self.find_stalls();
            let next = if self.fenced { Next::Idle } else { self.dispatch_due().await };
            // Asleep until the next due time, only what is due sooner wakes
            // it: not every commit of a message due later.
            let next = match next {
                Next::At(due) if !self.store.wake().sleep_until(DispatchKey { at: due, seq: 0 }) => Next::Now,
                Next::At(due) => Next::At(due),
                other => {
                    self.store.wake().wake_for_all();
                    other
                }
            };
            if let Next::At(due) = next {
                self.mark_ahead(due).await;
                // Recorded while it sleeps, not when it wakes to produce.
                self.doubt.horizon.extend_asleep(due).await;
            }
            self.publish();
            let mut sleep = match next {
                Next::At(due) => self.clock.until(due).min(self.config.max_sleep),
                Next::Idle | Next::Full | Next::Commits => self.config.max_sleep,
                Next::Now => Duration::ZERO,
            };
            if !self.sent.is_empty() {
                // After a kill, the search for what went out unrecorded
                // waits as long after this as requests may still land.
                self.doubt.pulse.beat(self.clock.now());
                sleep = sleep.min(pulse::EVERY);
            }
            // Deliveries gathering to be settled in order go to the store
            // within GATHER; what was settled without a produce (expired,
            // failed with its topic) within HOLD_FOR.
            let sleep = if self.sent.has_answered() {
                sleep.min(GATHER)
            } else if !self.settling.settles.is_empty() {
                sleep.min(HOLD_FOR)
            } else {
                sleep
            };
            tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                ended = self.doubt.search_ended() => {
                    if !self.end_search(ended, &stop).await {
                        break;
                    }
                }
                Some(report) = self.reports.rx.recv() => {
                    let mut stamps = Stamps::new(&*self.clock);
                    self.on_report(report, stamps.next(&*self.clock));
                    while let Ok(report) = self.reports.rx.try_recv() {
                        self.on_report(report, stamps.next(&*self.clock));
                    }
                    self.reports.stages.publish();
                }
                _ = self.store.wake().notified(), if !matches!(next, Next::Full) => {}
                _ = self.policies.changed() => {}
                _ = tokio::time::sleep(sleep) => {}
            }
        }
        self.drain(resolved).await;
    }

    /// Shutdown: produce nothing new, wait (up to the grace period) for what
    /// is in flight, and settle it. Records still unanswered then are in
    /// doubt: they may yet reach Kafka. The store keeps their claims and
    /// answers requests about them UNAVAILABLE, never CANCELLED; after a
    /// restart they are produced again. The gate is told whether it stopped
    /// with nothing in doubt: `resolved` (what it started with was searched
    /// for), no search left running, every produce answered.
    async fn drain(mut self, resolved: bool) {
        let resolved = resolved && !self.doubt.searching();
        self.doubt.stop_search().await;
        // What was read and not produced goes back.
        if let Some(reading) = self.ahead.reading.take()
            && let Ok(Ok((batch, _))) = reading.task.await
        {
            self.ahead.ready.extend(batch.ready);
            self.settling.releasing.extend(batch.stale);
            self.settling.releasing.extend(batch.unreadable.into_iter().map(|(_, id, _)| id));
        }
        self.give_back_ahead(true).await;
        let deadline = deadline_after(self.config.shutdown_grace);
        while !self.sent.is_empty() {
            match tokio::time::timeout_at(deadline, self.reports.rx.recv()).await {
                Ok(Some(report)) => self.on_report(report, Stamp::now(&*self.clock)),
                Ok(None) | Err(_) => break,
            }
        }
        self.return_letters();
        self.flush_settles(true).await;
        if !self.sent.is_empty() {
            tracing::warn!(
                unacknowledged = self.sent.len(),
                "shutdown grace ran out; Kafka has not answered these produces: they stay pending, \
                 in doubt, and are produced again after restart"
            );
            // In cluster mode, none of them may be sent after the shard's
            // next owner has searched its topics for them.
            self.producer.let_go();
        }
        let clean = resolved && self.sent.is_empty();
        let ids = self.sent.take_all().into_iter().map(|f| f.id).collect();
        if let Err(e) = self.store.in_doubt(ids).await {
            tracing::error!(error = %e, "reporting produces in doubt at shutdown failed");
        }
        self.gate.stopped(clean);
        self.store.metrics().in_flight.set(0);
        self.store.metrics().held_stalled.set(0);
        self.store.metrics().held_refused.set(0);
        self.store.held().clear();
        // A shard's own producer ends here, which waits for its thread.
        let Dispatcher { producer, .. } = self;
        let _ = tokio::task::spawn_blocking(move || drop(producer)).await;
    }
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
    fn a_huge_grace_does_not_overflow_the_timer() {
        let deadline = deadline_after(Duration::MAX);
        assert!(deadline > tokio::time::Instant::now());
        let soon = deadline_after(Duration::from_millis(5));
        assert!(soon <= tokio::time::Instant::now() + Duration::from_millis(5));
    }
}
