//! What a node owns in cluster mode: the shards the consumer group gives
//! it, each taken and let go as the group says.
//!
//! - **Taking** a shard: open its store (or create it, empty), apply the
//!   partition from the offset the store recorded to the end the partition
//!   has now, and only then start its dispatcher and answer its requests.
//!   A store that was lost is rebuilt from the start of the partition.
//! - **Letting go** (the group holds the rebalance meanwhile): stop the
//!   dispatcher, which hands its last settles to the log; wait until they
//!   are in and applied; stop applying and close the store, kept on disk
//!   for a later take.
//! - **Handing over** ([`handover`]): a shard the group takes back from a
//!   live node is held, dispatching, until its next owner says it owns it,
//!   and released for that node to claim with nothing in doubt.
//! - **The lease.** Dispatchers produce only while the node's lease holds:
//!   it is renewed every 100 ms by a thread that also notices when the
//!   process did not run (SIGSTOP, a paused VM): then nothing is produced
//!   until two thirds of the session timeout have passed, long enough for
//!   the group to tell the node it lost its shards if it did.
//!
//! Requests for a shard being taken or let go wait for it (bounded); those
//! for a shard another node owns are refused with UNAVAILABLE.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use futures_util::future;
use tokio::sync::{mpsc, watch};
use tokio_util::{sync::CancellationToken, task::TaskTracker};

mod background;
mod handover;
mod owned;
mod picture;
mod takeover;

use background::{keep_standbys, watch_owned};
pub(crate) use owned::Owned;
use owned::owner_record;

use super::{
    ClusterConfig, ClusterError,
    applier::{self, View},
    front::Front,
    gate::LeaseGate,
    kafka::{GroupMember, LogConsumer, LogProducer, Moved, ensure_log_topic},
    lease::{self, Lease},
    recorder::LogRecorder,
    retention::LogRetention,
    routes::Routes,
    waiters::Waiters,
};
use crate::{
    clock::Clock,
    cluster::log::record,
    dispatcher::CLAIM_GRACE,
    kafka::Producer,
    metrics,
    shard::{Seams, Shard, ShardConfig, producer_failed, producer_of},
    store::{Durability, ShardOf, StoreError, StoreHealth},
};

/// Longest a request waits for its shard to be taken or let go.
const MOVE_WAIT: Duration = Duration::from_secs(5);
/// Longest each step of letting go waits: the last settles into the log,
/// and the log applied to its end.
const LET_GO_WAIT: Duration = Duration::from_secs(10);
/// How long a failed take waits before it tries again.
const RETAKE_AFTER: Duration = Duration::from_secs(5);

/// How long a take that failed `failed` times in a row waits before the
/// next: [`RETAKE_AFTER`], twice as long after each further failure, at
/// most 5 minutes (a copy that stops at a record this build cannot read
/// stops there every time).
fn retake_after(failed: u32) -> Duration {
    RETAKE_AFTER.saturating_mul(1 << failed.saturating_sub(1).min(6)).min(Duration::from_secs(300))
}
/// How often the health of the owned shards is looked at.
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// The node's shards in cluster mode.
pub struct Cluster {
    inner: Arc<Inner>,
    member: Mutex<Option<GroupMember>>,
    lease_keeper: Mutex<Option<std::thread::JoinHandle<()>>>,
    health: watch::Receiver<StoreHealth>,
    damaged: CancellationToken,
    stop: CancellationToken,
    /// Stops the lease thread.
    stopping: Arc<AtomicBool>,
    tasks: TaskTracker,
}

/// How each shard is built and where it lives.
pub struct Shards {
    /// What each shard is built from; path, shard and cap are set per
    /// shard.
    pub config: ShardConfig,
    /// Where each partition's store lives, by partition.
    pub paths: Vec<PathBuf>,
    /// Each store's backlog cap.
    pub max_pending: Option<u64>,
    pub producer: Arc<Producer>,
    pub clock: Arc<dyn Clock>,
}

struct Inner {
    config: ClusterConfig,
    shards: Shards,
    log: Arc<LogProducer>,
    /// What every shard and standby copy reads its partition with.
    readers: Arc<LogConsumer>,
    routes: Arc<Routes>,
    waiters: Arc<Waiters>,
    lease: Arc<Lease>,
    slots: Vec<Slot>,
    /// The group has answered since the node joined.
    joined: AtomicBool,
    /// Every shard of the first assignment was taken.
    ready: AtomicBool,
    /// Why a shard this node was given could not be taken, by partition.
    failures: Mutex<BTreeMap<usize, String>>,
    /// The latest moves, for operators.
    moves: picture::Moves,
    /// The owners this node stands by first for, to take over once gone.
    watched: takeover::Watched,
    /// Producers made for shards whose owners are stopping.
    ahead: takeover::Ahead,
}

struct Slot {
    state: watch::Sender<State>,
    /// Taking, letting go, and starting or stopping a standby, one at a
    /// time.
    moving: tokio::sync::Mutex<()>,
    /// The store kept up to date while another node owns the shard, ready
    /// to be taken over.
    standby: Mutex<Option<View>>,
    /// Cancels a take under way.
    taking: Mutex<CancellationToken>,
    /// The group's latest assignment gives this node the shard. Owned
    /// without it: held, taken over from a gone owner or taken back by the
    /// group, until another node says it owns it.
    given: AtomicBool,
    /// The take under way asked the node holding the shard to let go of it,
    /// or claimed it (see [`Inner::commit_take`]): taken back by the group
    /// meanwhile, it is taken all the same, and held, or no one would
    /// dispatch it.
    committed: AtomicBool,
}

#[derive(Clone)]
enum State {
    /// The group has not said yet.
    Unknown,
    Elsewhere,
    Taking,
    Owned(Arc<Owned>),
    LettingGo,
}

/// Where a request for a shard is served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    Here,
    /// By the node answering at this address.
    There(String),
}

impl Cluster {
    /// Creates or checks the schedule log, joins the group, and takes
    /// whatever shards it gives this node (in the background; health says
    /// NOT_SERVING until the first ones are taken).
    pub async fn start(config: &ClusterConfig, shards: Shards) -> Result<Cluster, ClusterError> {
        let ensured = ensure_log_topic(&config.kafka, &config.log, config.admin_timeout).await?;
        tracing::info!(topic = %config.log.name, partitions = config.log.partitions, ?ensured, "the schedule log");
        let log = LogProducer::new(&config.kafka, &config.log.name, &config.key)
            .map_err(|e| ClusterError::Log(format!("creating its producer: {e}")))?;
        let readers = LogConsumer::new(&config.kafka, &config.log.name, &config.key)
            .map_err(|e| ClusterError::Log(format!("creating its consumer: {e}")))?;
        let (stop, damaged, tasks) = (CancellationToken::new(), CancellationToken::new(), TaskTracker::new());
        let waiters = Arc::new(Waiters::new());
        let routes =
            Routes::start(config, waiters.me(), Arc::clone(&shards.clock), &tasks, stop.clone()).await?;
        let slots = (0..config.log.partitions)
            .map(|_| Slot {
                state: watch::channel(State::Unknown).0,
                moving: tokio::sync::Mutex::new(()),
                standby: Mutex::new(None),
                taking: Mutex::new(CancellationToken::new()),
                given: AtomicBool::new(false),
                committed: AtomicBool::new(false),
            })
            .collect();
        let inner = Arc::new(Inner {
            config: config.clone(),
            shards,
            log: Arc::new(log),
            readers,
            routes,
            waiters,
            lease: Arc::new(Lease::new()),
            slots,
            joined: AtomicBool::new(false),
            ready: AtomicBool::new(false),
            failures: Mutex::new(BTreeMap::new()),
            moves: Default::default(),
            watched: Default::default(),
            ahead: Default::default(),
        });
        let stopping = Arc::new(AtomicBool::new(false));
        let lease_keeper = {
            let (lease, confirm_after, stopping) =
                (Arc::clone(&inner.lease), config.group.confirm_after(), Arc::clone(&stopping));
            std::thread::Builder::new()
                .name("hourglass-lease".into())
                .spawn(move || lease::keep(&lease, confirm_after, &stopping))
                .map_err(|e| ClusterError::Group(format!("starting the lease thread: {e}")))?
        };
        let (health_tx, health) = watch::channel(StoreHealth::Joining(format!(
            "joining the consumer group {} to take shards of {}",
            config.group.id, config.log.name
        )));
        let (moves_tx, moves) = mpsc::unbounded_channel();
        tasks.spawn(follow(Arc::clone(&inner), moves, tasks.clone()));
        tasks.spawn(watch_owned(Arc::clone(&inner), health_tx, damaged.clone(), stop.clone()));
        tasks.spawn(keep_standbys(Arc::clone(&inner), stop.clone()));
        tasks.spawn(takeover::watch_owners(Arc::clone(&inner), tasks.clone(), stop.clone()));
        let member = GroupMember::join(&config.kafka, &config.group, moves_tx).map_err(|e| {
            ClusterError::Group(format!("joining the consumer group {}: {e}", config.group.id))
        })?;
        Ok(Cluster {
            inner,
            member: Mutex::new(Some(member)),
            lease_keeper: Mutex::new(Some(lease_keeper)),
            health,
            damaged,
            stop,
            stopping,
            tasks,
        })
    }

    /// The cluster's key (`--cluster-key-file`).
    pub fn key(&self) -> &crate::cluster::ClusterKey {
        &self.inner.config.key
    }

    /// The schedule log's producer.
    pub(crate) fn log(&self) -> &Arc<LogProducer> {
        &self.inner.log
    }

    /// This node incarnation: the records it writes carry it.
    pub(crate) fn me(&self) -> u64 {
        self.inner.waiters.me()
    }

    /// The schedule log's partitions: the shard count.
    pub fn partitions(&self) -> u32 {
        self.inner.slots.len() as u32
    }

    /// `shard`, once this node owns it (waiting a bounded time while it
    /// moves).
    pub async fn owner_of(&self, shard: usize) -> Result<Arc<Owned>, StoreError> {
        let mut state = self.inner.slots[shard].state.subscribe();
        let settled = tokio::time::timeout(
            MOVE_WAIT,
            state.wait_for(|s| matches!(s, State::Owned(_) | State::Elsewhere)),
        )
        .await;
        match settled {
            Ok(Ok(state)) => match &*state {
                State::Owned(owned) => Ok(Arc::clone(owned)),
                _ => Err(StoreError::NotOwner(shard as u32)),
            },
            _ => Err(moving(shard)),
        }
    }

    /// Where requests for `shard` are served: here once this node owns it,
    /// or by the node the routing topic names (waiting a bounded time while
    /// the shard moves, or until the topic names its new owner).
    pub async fn place(&self, shard: usize) -> Result<Place, StoreError> {
        let deadline = tokio::time::Instant::now() + MOVE_WAIT;
        let mut state = self.inner.slots[shard].state.subscribe();
        let owned = match tokio::time::timeout_at(
            deadline,
            state.wait_for(|s| matches!(s, State::Owned(_) | State::Elsewhere)),
        )
        .await
        {
            Ok(Ok(state)) => matches!(&*state, State::Owned(_)),
            _ => return Err(moving(shard)),
        };
        if owned {
            return Ok(Place::Here);
        }
        let routes = &self.inner.routes;
        let peer = match routes.peer_of(shard as u32) {
            Some(peer) => Some(peer),
            None => routes.await_peer(shard as u32, None, deadline).await,
        };
        peer.map(Place::There).ok_or_else(|| moving(shard))
    }

    /// Where requests for `shard` go now that the node at `refused` did not
    /// take one (it no longer owns the shard, or cannot be reached): here
    /// once this node takes it, or the next owner the routing topic names.
    pub async fn moved(&self, shard: usize, refused: &str) -> Result<Place, StoreError> {
        let deadline = tokio::time::Instant::now() + MOVE_WAIT;
        let mut state = self.inner.slots[shard].state.subscribe();
        tokio::select! {
            owned = state.wait_for(|s| matches!(s, State::Owned(_))) => match owned {
                Ok(_) => Ok(Place::Here),
                Err(_) => Err(moving(shard)),
            },
            peer = self.inner.routes.await_peer(shard as u32, Some(refused), deadline) => {
                peer.map(Place::There).ok_or_else(|| moving(shard))
            }
        }
    }

    /// Waits until this node owns `shard` (however long that takes); the
    /// token is cancelled once it no longer owns it as it does now (it let
    /// go of it, or took it again since), or by whoever holds it.
    pub async fn owned_while(&self, shard: usize) -> CancellationToken {
        let mut state = self.inner.slots[shard].state.subscribe();
        let owned = match state.wait_for(|s| matches!(s, State::Owned(_))).await.as_deref() {
            Ok(State::Owned(owned)) => Some(Arc::downgrade(owned)),
            _ => None,
        };
        // The slots live as long as the cluster: never none.
        let Some(owned) = owned else { return std::future::pending().await };
        let gone = CancellationToken::new();
        let watching = gone.clone();
        tokio::spawn(async move {
            let same =
                |s: &State| matches!(s, State::Owned(now) if std::ptr::eq(Arc::as_ptr(now), owned.as_ptr()));
            tokio::select! {
                _ = state.wait_for(|s| !same(s)) => {}
                _ = watching.cancelled() => {}
            }
            watching.cancel();
        });
        gone
    }

    /// Whether this node owns `shard` now.
    pub fn owns(&self, shard: usize) -> bool {
        matches!(&*self.inner.slots[shard].state.borrow(), State::Owned(_))
    }

    /// The other nodes that own shards, by the routing topic.
    pub fn peers(&self) -> Vec<String> {
        self.inner.routes.peers()
    }

    /// The shards this node owns now, with their numbers.
    pub fn owned(&self) -> Vec<(u32, Arc<Owned>)> {
        (0..)
            .zip(&self.inner.slots)
            .filter_map(|(shard, slot)| match &*slot.state.borrow() {
                State::Owned(owned) => Some((shard, Arc::clone(owned))),
                _ => None,
            })
            .collect()
    }

    /// Whether every owned shard takes new messages, and whether the node
    /// has taken its first shards.
    pub fn health(&self) -> watch::Receiver<StoreHealth> {
        self.health.clone()
    }

    /// Cancelled once damage is found in an owned shard's store.
    pub fn damaged(&self) -> CancellationToken {
        self.damaged.clone()
    }

    /// Says in the routing topic that this node is stopping (waiting up to
    /// a second to read that back), so that each shard's first standby
    /// takes it as soon as this node releases it.
    pub async fn stopping(&self) {
        let owned: Vec<u32> = self.owned().into_iter().map(|(shard, _)| shard).collect();
        self.inner.routes.leave(&owned, Duration::from_secs(1)).await;
    }

    /// Leaves the group: every shard is let go as in a move (dispatching
    /// stopped, deliveries recorded, stores closed), and the group gives
    /// them to other nodes at once.
    pub async fn shutdown(&self) {
        let member = self.member.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut member) = member {
            // Leaving revokes everything; `follow` lets go meanwhile.
            let _ = tokio::task::spawn_blocking(move || member.leave()).await;
        }
        // What the group never took back (it did not answer) goes now.
        let all = (0..self.inner.slots.len()).map(|shard| self.inner.let_go(shard));
        future::join_all(all).await;
        self.stop.cancel();
        self.tasks.close();
        self.tasks.wait().await;
        self.stopping.store(true, Ordering::Release);
        let keeper = self.lease_keeper.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(keeper) = keeper {
            let _ = tokio::task::spawn_blocking(move || keeper.join()).await;
        }
    }
}

impl Inner {
    /// Takes `shard`: opens its store, applies the log to its end, starts
    /// dispatching. Tried again while it fails, until cancelled; a takeover
    /// (the group has not given it) only once.
    async fn take(self: Arc<Self>, shard: usize, cancel: CancellationToken) {
        let slot = &self.slots[shard];
        let _moving = slot.moving.lock().await;
        if cancel.is_cancelled() || matches!(&*slot.state.borrow(), State::Owned(_)) {
            return;
        }
        slot.state.send_replace(State::Taking);
        let takeover = !slot.given.load(Ordering::Acquire);
        let mut standby = slot.standby.lock().unwrap_or_else(|e| e.into_inner()).take();
        if standby.is_some() {
            metrics::STANDBYS.dec();
        }
        let mut failed = 0u32;
        loop {
            let opened = self.open(shard, standby.take(), &cancel).await;
            slot.committed.store(false, Ordering::Release);
            match opened {
                Ok(Some(owned)) => {
                    self.failures().remove(&shard);
                    slot.state.send_replace(State::Owned(Arc::new(owned)));
                    let given = slot.given.load(Ordering::Acquire);
                    self.routes.own(shard as u32, !given);
                    metrics::SHARDS_OWNED.inc();
                    let how = if takeover { "taken over" } else { "taken" };
                    metrics::SHARD_MOVES.with_label_values(&[how]).inc();
                    self.moved(shard, how);
                    return;
                }
                Ok(None) => {
                    tracing::info!(shard, "the take of the shard was called off: the group took it back");
                    break;
                }
                Err(e) if !slot.given.load(Ordering::Acquire) => {
                    // A takeover is not tried again: the group decides.
                    tracing::warn!(shard, error = %e, "taking over a shard failed; leaving it to the group");
                    self.moved(shard, "take failed");
                    break;
                }
                Err(e) => {
                    failed = failed.saturating_add(1);
                    let again = retake_after(failed);
                    tracing::error!(shard, error = %e, again_in = ?again, "taking a shard failed");
                    self.moved(shard, "take failed");
                    self.failures().insert(shard, format!("taking shard {shard} failed: {e}"));
                }
            }
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(retake_after(failed)) => {}
            }
        }
        self.failures().remove(&shard);
        slot.state.send_replace(State::Elsewhere);
    }

    /// The store of `shard`, opened (empty if there is none) and following
    /// its partition of the log from where it applied to.
    async fn view(&self, shard: usize) -> Result<View, StoreError> {
        View::open(&self.shard_config(shard).store, &self.readers, Arc::clone(&self.waiters)).await
    }

    /// What `shard` is built from: its store's path, number and cap. The
    /// store is a view of the log, which holds every change with acks=all:
    /// it writes no WAL (after a crash it applies again from the offset it
    /// recorded, flushed with the data: [`Durability::Replayed`]).
    fn shard_config(&self, shard: usize) -> ShardConfig {
        let mut config = self.shards.config.clone();
        config.store.path = self.shards.paths[shard].clone();
        config.store.shard = ShardOf { shard: shard as u32, shards: self.slots.len() as u32 };
        config.store.max_pending = self.shards.max_pending;
        config.store.durability = Durability::Replayed;
        config
    }

    /// The shard, applied to the log's end and dispatching; `None` if
    /// cancelled first. A standby's view of it is taken over as it is.
    async fn open(
        &self,
        shard: usize,
        standby: Option<View>,
        cancel: &CancellationToken,
    ) -> Result<Option<Owned>, StoreError> {
        let partition = shard as i32;
        // Another node that says it owns the shard after this is let have
        // it, should this node hold it (see `handover`).
        let since = Instant::now();
        let ahead =
            self.ahead.take(shard).map(Ok).or_else(|| self.shards.producer.ahead_for_shard(shard as u32));
        let view = match standby {
            // Stopped since it was last looked at: opened again, it goes
            // on from the log offset it recorded.
            Some(view) if let Some(damage) = view.stopped() => {
                tracing::error!(shard, damage, "the standby copy of the shard stopped: opening it again");
                metrics::STANDBYS_STOPPED.inc();
                view.close().await;
                self.view(shard).await?
            }
            Some(view) if !view.stale().await => view,
            Some(view) => {
                // Kept open, it stopped following the log long ago: opened
                // again, it is rebuilt from the log (and counted there).
                tracing::warn!(
                    shard,
                    applied_to = view.store.log_next(),
                    last_applied_at = view.store.log_time().0,
                    "the standby copy of the shard fell further behind the schedule log than Kafka keeps \
                     tombstones: rebuilding it from the log rather than taking it over"
                );
                view.close().await;
                self.view(shard).await?
            }
            None => self.view(shard).await?,
        };
        let from = view.store.log_next();
        let Some(end) = view.end(cancel).await else {
            view.close().await;
            return Ok(None);
        };
        let abandon = async |view: View, outcome| {
            view.close().await;
            outcome
        };
        let started = Instant::now();
        if !applier::taking_applied_to(shard, &view.applied, end, cancel).await {
            // The copy stopped (a record it cannot read, damage): the take
            // fails, saying why, and is tried again; else it was called off.
            let outcome = match view.stopped() {
                Some(why) => Err(StoreError::LogUnavailable(why)),
                None => Ok(None),
            };
            return abandon(view, outcome).await;
        }
        if from < end {
            tracing::info!(shard, from, end, elapsed = ?started.elapsed(), "applied the schedule log");
        }
        let applied_at = Instant::now();
        // Released by the end read (the applier may have applied past it,
        // release and all: then the end is read again).
        let released_by_end = view.store.log_owner() == 0 && view.store.log_next() <= end;
        let mut end = end;
        // Asked, or released meanwhile (its holder let go as it was about
        // to be asked): the release, and what came before it, applied
        // before the claim, so that a claim right after a clean release is
        // clean.
        if self.ask_holder(shard, &view, cancel).await || (view.store.log_owner() == 0 && !released_by_end) {
            let Some(now) = view.end(cancel).await else {
                return abandon(view, Ok(None)).await;
            };
            if !applier::taking_applied_to(shard, &view.applied, now, cancel).await {
                return abandon(view, Ok(None)).await;
            }
            end = now;
        }
        let released_clean = view.released_clean();
        let asked_at = Instant::now();
        // The claim: from this record on, only this node dispatches the
        // shard; a node that still thinks it owns it stops when it applies
        // it. Until the grace after it is over, requests wait and the
        // dispatcher reads the topics back: what that node produced before
        // it applied the claim is found there, not produced again.
        let me = self.waiters.me();
        let claim = owner_record(me, self.shards.clock.as_ref(), false, false);
        let key = record::owner_key();
        if !self.commit_take(shard, cancel) {
            return abandon(view, Ok(None)).await;
        }
        let claimed = tokio::select! {
            _ = cancel.cancelled() => return abandon(view, Ok(None)).await,
            claimed = view.append(&self.log, &key, claim) => claimed,
        };
        let offset = match claimed {
            Ok(offset) => offset,
            Err(e) => {
                let e = StoreError::LogUnavailable(format!("claiming the shard in the schedule log: {e}"));
                return abandon(view, Err(e)).await;
            }
        };
        if !applier::taking_applied_to(shard, &view.applied, offset + 1, cancel).await {
            return abandon(view, Ok(None)).await;
        }
        // Claimed right after a clean release (no record between): the last
        // owner left nothing in doubt, and no other node claimed it since;
        // nothing to search for, no grace to wait.
        let clean = released_clean && offset == end;
        let claimed_at = tokio::time::Instant::now();
        let claim_took = claimed_at.into_std() - asked_at;
        let recorder = Arc::new(LogRecorder::new(
            Arc::clone(&self.log),
            partition,
            Arc::clone(&self.waiters),
            view.stop.clone(),
            view.acked.clone(),
        ));
        let store = view.store.clone();
        let front = Front::new(
            store.clone(),
            Arc::clone(&self.log),
            partition,
            Arc::clone(&self.waiters),
            view.acked.clone(),
        );
        let stopped_clean = Arc::new(AtomicBool::new(false));
        let gate =
            LeaseGate::new(Arc::clone(&self.lease), store.clone(), me, clean, Arc::clone(&stopped_clean));
        let seams = Seams {
            recorder: Arc::clone(&recorder) as _,
            gate: Box::new(gate),
            retention: Arc::new(LogRetention { recorder: Arc::clone(&recorder), owner: me }),
        };
        let producer = match ahead {
            Some(made) => made.map_err(producer_failed),
            None => producer_of(&store, &self.shards.producer, true),
        };
        let producer = match producer {
            Ok(producer) => producer,
            Err(e) => return abandon(view, Err(e)).await,
        };
        let shard =
            Shard::start(store, &self.shard_config(shard), producer, Arc::clone(&self.shards.clock), seams);
        let starting = claimed_at.elapsed();
        let owned = Owned {
            partition,
            me,
            log: Arc::clone(&self.log),
            routes: Arc::clone(&self.routes),
            waiters: Arc::clone(&self.waiters),
            clock: Arc::clone(&self.shards.clock),
            claiming: AtomicBool::new(false),
            since,
            stopped_clean,
            shard,
            front,
            recorder,
            view,
        };
        // The dispatcher's search runs meanwhile, and lasts the grace at
        // least.
        let grace = if clean { Duration::ZERO } else { CLAIM_GRACE };
        tokio::select! {
            _ = cancel.cancelled() => {
                owned.let_go().await;
                return Ok(None);
            }
            _ = tokio::time::sleep_until(claimed_at + grace) => {}
        }
        tracing::info!(
            partition,
            took = ?since.elapsed(),
            applying = ?(applied_at - since),
            asking = ?(asked_at - applied_at),
            claiming = ?claim_took,
            starting = ?starting,
            ?grace,
            "took the shard: dispatching"
        );
        Ok(Some(owned))
    }

    /// Lets go of `shard` if this node owns it, or stops taking it.
    async fn let_go(&self, shard: usize) {
        let slot = &self.slots[shard];
        slot.taking.lock().unwrap_or_else(|e| e.into_inner()).cancel();
        let _moving = slot.moving.lock().await;
        if let State::Owned(owned) = slot.state.send_replace(State::LettingGo) {
            owned.let_go().await;
            metrics::SHARDS_OWNED.dec();
            metrics::SHARD_MOVES.with_label_values(&["let go"]).inc();
            self.moved(shard, "let go");
            tracing::info!(shard, "let go of the shard");
        }
        self.failures().remove(&shard);
        slot.state.send_replace(State::Elsewhere);
    }

    fn failures(&self) -> std::sync::MutexGuard<'_, BTreeMap<usize, String>> {
        self.failures.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The node's health: not serving until the group has answered and the
    /// first shards are taken; then the worst of the owned stores' and of
    /// the takes that fail.
    fn health(&self) -> StoreHealth {
        if !self.joined.load(Ordering::Acquire) {
            return StoreHealth::Joining(format!(
                "joining the consumer group {} to take shards of {}",
                self.config.group.id, self.config.log.name
            ));
        }
        if let Some(reason) = self.failures().values().next() {
            return StoreHealth::Failing(reason.clone());
        }
        let mut worst = StoreHealth::Ok;
        let mut taking = Vec::new();
        for (shard, slot) in self.slots.iter().enumerate() {
            match &*slot.state.borrow() {
                State::Owned(owned) => match owned.store().health().borrow().clone() {
                    StoreHealth::Ok => {}
                    StoreHealth::AtCapacity if worst == StoreHealth::Ok => worst = StoreHealth::AtCapacity,
                    StoreHealth::AtCapacity => {}
                    other => return other,
                },
                State::Taking => taking.push(shard),
                _ => {}
            }
        }
        if !self.ready.load(Ordering::Acquire) {
            if !taking.is_empty() {
                return StoreHealth::Joining(format!("restoring shards {taking:?} from the schedule log"));
            }
            self.ready.store(true, Ordering::Release);
        }
        worst
    }
}

/// A shard that did not settle with an owner in time.
fn moving(shard: usize) -> StoreError {
    StoreError::LogUnavailable(format!(
        "shard {shard} is moving between nodes and no node took it within {MOVE_WAIT:?}; retry with the same id"
    ))
}

/// Follows the group's moves: takes what it gives (each shard on its own),
/// lets go of what it takes back before the rebalance goes on.
async fn follow(inner: Arc<Inner>, mut moves: mpsc::UnboundedReceiver<Moved>, tasks: TaskTracker) {
    while let Some(moved) = moves.recv().await {
        match moved {
            Moved::Assigned(partitions) => {
                let given: Vec<usize> = partitions.iter().filter_map(|p| usize::try_from(*p).ok()).collect();
                for shard in given.iter().filter(|s| **s < inner.slots.len()) {
                    inner.slots[*shard].given.store(true, Ordering::Release);
                }
                for (shard, slot) in inner.slots.iter().enumerate() {
                    if !given.contains(&shard) {
                        slot.state.send_if_modified(|s| {
                            let unknown = matches!(s, State::Unknown);
                            if unknown {
                                *s = State::Elsewhere;
                            }
                            unknown
                        });
                    }
                }
                // A completed rebalance left these with this node: if the
                // log names another owner (the group gave the shard to two
                // nodes for a while), this node claims it again.
                for slot in inner.slots.iter().filter(|s| s.given.load(Ordering::Acquire)) {
                    if let State::Owned(owned) = &*slot.state.borrow()
                        && owned.fenced()
                    {
                        owned.reclaim();
                    }
                }
                for shard in given.into_iter().filter(|s| *s < inner.slots.len()) {
                    // Given again without having been taken back (a broker
                    // that repeats an assignment), or while held: kept as
                    // it is, no longer held.
                    if matches!(&*inner.slots[shard].state.borrow(), State::Owned(_) | State::Taking) {
                        if inner.routes.holds(shard as u32) {
                            inner.routes.own(shard as u32, false);
                        }
                        continue;
                    }
                    let cancel = CancellationToken::new();
                    *inner.slots[shard].taking.lock().unwrap_or_else(|e| e.into_inner()) = cancel.clone();
                    tasks.spawn(Arc::clone(&inner).take(shard, cancel));
                }
                inner.joined.store(true, Ordering::Release);
            }
            Moved::Revoked { partitions, lost, done } => {
                if lost {
                    tracing::warn!(
                        ?partitions,
                        "the group gave this node's shards away (its session ran out); other nodes may \
                         dispatch them already"
                    );
                }
                let letting_go = partitions
                    .iter()
                    .filter_map(|p| usize::try_from(*p).ok())
                    .filter(|s| *s < inner.slots.len())
                    .filter(|shard| {
                        inner.slots[*shard].given.store(false, Ordering::Release);
                        !inner.holds_on(*shard, lost)
                    })
                    .map(|shard| inner.let_go(shard));
                future::join_all(letting_go).await;
                let _ = done.send(());
            }
        }
    }
}
