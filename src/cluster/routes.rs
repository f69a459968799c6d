//! Where each shard's owner answers: the routing topic (see
//! [`crate::cluster::log::route`]), followed by every node and written by each
//! node for the shards it takes and lets go of, and again every third of a
//! session timeout for those it owns: a claimant no longer heard from is
//! gone (see [`Routes::names_lately`]).
//!
//! What a node says of a shard is written until it is: a write that fails
//! (the broker away longer than the producer waits) is tried again, unless
//! the node has said something newer of the shard meanwhile, which is
//! written instead. Otherwise a takeover during a producer hiccup would
//! leave the topic naming the old owner, and every other node unable to
//! reach the shard until it moved again.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use futures_util::future::{self, BoxFuture};
use rdkafka::error::KafkaError;
use tokio::sync::{Notify, watch};
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use super::{
    ClusterConfig, ClusterError,
    kafka::{LogProducer, LogReader, LogTopic, ensure_log_topic},
};
use crate::{
    clock::Clock,
    cluster::log::route::{self, Route, Table},
    metrics,
};

/// How long to wait before reading the topic again after a failure.
const BACKOFF: Duration = Duration::from_secs(1);

/// A say of a shard's owner, as read.
#[derive(Clone, Copy)]
struct Said {
    by: u64,
    at: Instant,
    leaving: bool,
}

pub(crate) struct Routes {
    table: watch::Sender<Table>,
    /// Per shard, the last node incarnation that said it owns the shard,
    /// and when this node read it: an owner says so again every so often
    /// (see [`Routes::publish`]), so a claimant that stopped saying it is
    /// gone. Whether it said it is stopping too.
    said: Mutex<BTreeMap<u32, Said>>,
    /// What this node said of each shard and has not written yet.
    unwritten: Arc<Unwritten>,
    /// This node incarnation, and where it answers.
    me: u64,
    addr: String,
    clock: Arc<dyn Clock>,
    /// This node is stopping (see [`Routes::leave`]).
    leaving: AtomicBool,
    /// The shards this node holds without the group giving them (see
    /// [`Routes::own`]).
    held: Mutex<BTreeSet<u32>>,
}

/// Routes said and not yet written, the latest per shard, each with the
/// number of the saying (a later one replaces it).
#[derive(Default)]
struct Unwritten {
    routes: Mutex<BTreeMap<u32, (u64, Route)>>,
    said: Notify,
}

impl Unwritten {
    fn say(&self, shard: u32, route: Route) {
        let mut routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        let number = routes.values().map(|(n, _)| *n).max().unwrap_or(0) + 1;
        routes.insert(shard, (number, route));
        drop(routes);
        self.said.notify_one();
    }

    fn pending(&self) -> Vec<(u32, u64, Route)> {
        let routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        routes.iter().map(|(shard, (n, route))| (*shard, *n, route.clone())).collect()
    }

    /// `shard`'s route of saying `number` is written: done, unless a later
    /// one was said meanwhile.
    fn written(&self, shard: u32, number: u64) {
        let mut routes = self.routes.lock().unwrap_or_else(|e| e.into_inner());
        if routes.get(&shard).is_some_and(|(n, _)| *n == number) {
            routes.remove(&shard);
        }
    }
}

/// Where routes are written: the routing topic, or a test's stand-in.
trait RouteLog: Send + Sync + 'static {
    fn write(&self, shard: u32, route: &Route) -> BoxFuture<'static, Result<(), KafkaError>>;
}

impl RouteLog for LogProducer {
    fn write(&self, shard: u32, route: &Route) -> BoxFuture<'static, Result<(), KafkaError>> {
        let written = self.enqueue(0, &route::key(shard), Some(&prost::Message::encode_to_vec(route)));
        Box::pin(async move { written.await.map(|_| ()) })
    }
}

/// Writes what `unwritten` holds until `stop`: each shard's latest route,
/// all at once, the failed ones again after `backoff`.
async fn keep_writing(
    unwritten: Arc<Unwritten>,
    log: impl RouteLog,
    backoff: Duration,
    stop: CancellationToken,
) {
    loop {
        let pending = unwritten.pending();
        if pending.is_empty() {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = unwritten.said.notified() => continue,
            }
        }
        let writes = pending.iter().map(|(shard, number, route)| {
            let written = log.write(*shard, route);
            async move { (*shard, *number, route.released, written.await) }
        });
        let mut failed = false;
        for (shard, number, released, written) in future::join_all(writes).await {
            match written {
                Ok(()) => unwritten.written(shard, number),
                Err(e) => {
                    failed = true;
                    tracing::warn!(shard, released, error = %e, "writing the shard's owner to the routing topic failed; trying again");
                }
            }
        }
        if failed {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
        }
    }
}

impl Routes {
    /// Creates or checks the routing topic and follows it until `stop`.
    pub(crate) async fn start(
        config: &ClusterConfig,
        me: u64,
        clock: Arc<dyn Clock>,
        tasks: &TaskTracker,
        stop: CancellationToken,
    ) -> Result<Arc<Routes>, ClusterError> {
        let topic = LogTopic {
            name: route::topic_of(&config.log.name),
            partitions: 1,
            replication: config.log.replication,
        };
        ensure_log_topic(&config.kafka, &topic, config.admin_timeout).await?;
        let log = LogProducer::new(&config.kafka, &topic.name, &config.key)
            .map_err(|e| ClusterError::Log(format!("creating the producer of {}: {e}", topic.name)))?;
        let reader = LogReader::new(&config.kafka, &topic.name, &config.key, 0, 0)
            .map_err(|e| ClusterError::Log(format!("reading {}: {e}", topic.name)))?;
        let routes = Arc::new(Routes {
            table: watch::channel(Table::new(config.log.partitions as u32)).0,
            said: Mutex::default(),
            unwritten: Arc::default(),
            me,
            addr: config.advertise.clone(),
            clock,
            leaving: AtomicBool::new(false),
            held: Mutex::default(),
        });
        tasks.spawn(keep_writing(Arc::clone(&routes.unwritten), log, BACKOFF, stop.clone()));
        tasks.spawn(follow(Arc::clone(&routes), reader, stop));
        Ok(routes)
    }

    /// Says that this node owns `shard` now, or (`released`) no longer.
    /// Written in the background, again until it is (or something newer
    /// is said of the shard); meanwhile a request routed by an old record
    /// is refused by the node it reaches and sent again.
    pub(crate) fn publish(&self, shard: u32, released: bool) {
        let held = {
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            if released {
                held.remove(&shard);
            }
            held.contains(&shard)
        };
        let route = Route {
            writer: self.me,
            addr: self.addr.clone(),
            at_ms: self.clock.now().0,
            released,
            leaving: self.leaving.load(Ordering::Acquire),
            held,
        };
        self.unwritten.say(shard, route);
    }

    /// Whether this node said it is stopping (see [`Routes::leave`]).
    pub(crate) fn leaving(&self) -> bool {
        self.leaving.load(Ordering::Acquire)
    }

    /// Whether this node says it holds `shard` (see [`Routes::own`]).
    pub(crate) fn holds(&self, shard: u32) -> bool {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).contains(&shard)
    }

    /// Says that this node owns `shard` now, `held` without the group
    /// giving it (in every route it says of it until it says otherwise).
    pub(crate) fn own(&self, shard: u32, held: bool) {
        let mut holding = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if held {
            holding.insert(shard);
        } else {
            holding.remove(&shard);
        }
        drop(holding);
        self.publish(shard, false);
    }

    /// Says that this node is stopping, for each of `owned` (and in every
    /// route it says from now on), and waits up to `within` until it
    /// reads that back: the nodes standing by for its shards then take
    /// each as it lets go of it, not when it stops answering.
    pub(crate) async fn leave(&self, owned: &[u32], within: Duration) {
        self.leaving.store(true, Ordering::Release);
        for shard in owned {
            self.publish(*shard, false);
        }
        let me = self.me;
        let mut table = self.table.subscribe();
        let said = table
            .wait_for(|t| owned.iter().all(|s| t.route_of(*s).is_none_or(|r| r.writer != me || r.leaving)));
        let _ = tokio::time::timeout(within, said).await;
    }

    /// Whether the topic names the node incarnation `writer` the owner of
    /// `shard`, and this node read it say so within `within`.
    pub(crate) fn names_lately(&self, shard: u32, writer: u64, within: Duration) -> bool {
        let said = self.said.lock().unwrap_or_else(|e| e.into_inner()).get(&shard).copied();
        self.table.borrow().writer_of(shard) == Some(writer)
            && said.is_some_and(|s| s.by == writer && s.at.elapsed() < within)
    }

    /// What the topic last said of the owner of `shard`, if it names one.
    pub(crate) fn owner_of(&self, shard: u32) -> Option<Route> {
        self.table.borrow().route_of(shard).cloned()
    }

    /// Whether this node read another node incarnation than `me` say it
    /// owns `shard` after `since`. A node that says so as it stops (its
    /// last says, read late) takes nothing: it does not count.
    pub(crate) fn named_other_since(&self, shard: u32, me: u64, since: Instant) -> bool {
        let said = self.said.lock().unwrap_or_else(|e| e.into_inner()).get(&shard).copied();
        said.is_some_and(|s| s.by != me && s.at > since && !s.leaving)
    }

    /// Takes in what the topic said of each shard's owner, read now.
    fn read(&self, says: Vec<(u32, Route)>) {
        self.table.send_modify(|table| {
            let mut said = self.said.lock().unwrap_or_else(|e| e.into_inner());
            for (shard, route) in says {
                let (by, leaving) = (route.writer, route.leaving);
                if table.apply(shard, route) {
                    said.insert(shard, Said { by, at: Instant::now(), leaving });
                }
            }
        });
    }

    /// Where this node answers.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    /// Where the owner of `shard` answers, by the topic, if another node.
    pub(crate) fn peer_of(&self, shard: u32) -> Option<String> {
        self.table.borrow().addr_of(shard).filter(|addr| *addr != self.addr).map(str::to_owned)
    }

    /// Waits, up to `deadline`, for the topic to name another node than
    /// `not` as the owner of `shard`.
    pub(crate) async fn await_peer(
        &self,
        shard: u32,
        not: Option<&str>,
        deadline: tokio::time::Instant,
    ) -> Option<String> {
        let mut table = self.table.subscribe();
        let named = tokio::time::timeout_at(
            deadline,
            table.wait_for(|t| t.addr_of(shard).is_some_and(|a| a != self.addr && Some(a) != not)),
        )
        .await;
        match named {
            Ok(Ok(t)) => t.addr_of(shard).map(str::to_owned),
            _ => None,
        }
    }

    /// What the topic says of `writer` as the owner of `shard`, once it
    /// says `writer` holds it without the group (waited for up to
    /// `deadline`: a node says it owns a shard a moment after it claimed
    /// it, and that it holds it a moment after the group took it back).
    pub(crate) async fn held_by(
        &self,
        shard: u32,
        writer: u64,
        deadline: tokio::time::Instant,
    ) -> Option<Route> {
        let mut table = self.table.subscribe();
        let held =
            |t: &Table| t.writer_of(shard) == Some(writer) && t.route_of(shard).is_some_and(|r| r.held);
        match tokio::time::timeout_at(deadline, table.wait_for(held)).await {
            Ok(Ok(t)) => t.route_of(shard).cloned(),
            _ => None,
        }
    }

    /// The shards this node keeps a standby copy of (see
    /// [`Table::standby_for`]).
    pub(crate) fn standby_for(&self, replicas: usize) -> Vec<u32> {
        self.table.borrow().standby_for(&self.addr, replicas)
    }

    /// Waits until the topic changes.
    pub(crate) async fn changed(&self) {
        let _ = self.table.subscribe().changed().await;
    }

    /// Every other node the topic names as an owner.
    pub(crate) fn peers(&self) -> Vec<String> {
        self.table.borrow().addrs().into_iter().filter(|a| *a != self.addr).collect()
    }
}

async fn follow(routes: Arc<Routes>, reader: LogReader, stop: CancellationToken) {
    loop {
        let read = tokio::select! {
            _ = stop.cancelled() => return,
            read = reader.next_with(256, |m, sealed| {
                use rdkafka::Message as _;
                (m.offset(), route::read(m.key(), m.payload(), sealed))
            }) => read,
        };
        match read {
            Ok(records) => {
                let mut says = Vec::with_capacity(records.len());
                for (offset, record) in records {
                    match record {
                        Ok(Some(say)) => says.push(say),
                        Ok(None) => {}
                        Err(route::Forged) => {
                            metrics::FORGED.with_label_values(&["routing"]).inc();
                            tracing::warn!(
                                offset,
                                "refused a record of the routing topic without the cluster's seal: no node of \
                                 this cluster wrote it (check who may write the routing topic, and that every \
                                 node has the same --cluster-key-file)"
                            );
                        }
                    }
                }
                routes.read(says);
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading the routing topic failed; trying again shortly");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(BACKOFF) => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// Fails the first `failures` writes, and keeps what it wrote.
    #[derive(Clone, Default)]
    struct Flaky {
        failures: Arc<AtomicUsize>,
        written: Arc<Mutex<Vec<(u32, bool)>>>,
    }

    impl RouteLog for Flaky {
        fn write(&self, shard: u32, route: &Route) -> BoxFuture<'static, Result<(), KafkaError>> {
            let (failures, written, released) =
                (Arc::clone(&self.failures), Arc::clone(&self.written), route.released);
            Box::pin(async move {
                if failures.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
                    return Err(KafkaError::MessageProduction(
                        rdkafka::types::RDKafkaErrorCode::BrokerTransportFailure,
                    ));
                }
                written.lock().unwrap().push((shard, released));
                Ok(())
            })
        }
    }

    const PAUSE: Duration = Duration::from_millis(10);

    fn route(released: bool) -> Route {
        Route { writer: 1, addr: "http://a:1".into(), at_ms: 0, released, ..Route::default() }
    }

    /// A writer whose first `failures` writes fail, writing until `stop`.
    fn writing(failures: usize) -> (Arc<Unwritten>, Flaky, CancellationToken, tokio::task::JoinHandle<()>) {
        let (unwritten, log, stop) =
            (Arc::new(Unwritten::default()), Flaky::default(), CancellationToken::new());
        log.failures.store(failures, Ordering::SeqCst);
        let task = tokio::spawn(keep_writing(Arc::clone(&unwritten), log.clone(), PAUSE, stop.clone()));
        (unwritten, log, stop, task)
    }

    /// This node incarnation (1, at `http://a:1`) reading nothing: the test
    /// says what the topic says.
    fn reading_nothing() -> Routes {
        Routes {
            table: watch::channel(Table::new(4)).0,
            said: Mutex::default(),
            unwritten: Arc::default(),
            me: 1,
            addr: "http://a:1".into(),
            clock: Arc::new(crate::clock::SystemClock),
            leaving: AtomicBool::new(false),
            held: Mutex::default(),
        }
    }

    #[tokio::test]
    async fn an_owner_the_group_gave_the_shard_to_is_waited_for_until_it_says_it_holds_it() {
        let routes = Arc::new(reading_nothing());
        let by =
            |writer, held| Route { writer, addr: format!("http://n{writer}:1"), held, ..Route::default() };
        routes.table.send_modify(|t| {
            t.apply(3, by(2, false));
        });
        let within = |wait: Duration| tokio::time::Instant::now() + wait;
        assert_eq!(routes.held_by(3, 2, within(PAUSE * 5)).await, None, "never said held: not asked");
        let waiting = {
            let routes = Arc::clone(&routes);
            tokio::spawn(async move { routes.held_by(3, 2, within(Duration::from_secs(30))).await })
        };
        tokio::time::sleep(PAUSE * 5).await;
        assert!(!waiting.is_finished(), "given, not held: waited for");
        routes.table.send_modify(|t| {
            t.apply(3, by(2, true));
        });
        assert_eq!(waiting.await.unwrap(), Some(by(2, true)), "held once the group took it back");
        routes.table.send_modify(|t| {
            t.apply(3, by(4, true));
        });
        assert_eq!(routes.held_by(3, 2, within(PAUSE * 5)).await, None, "another node holds it now");
    }

    #[test]
    fn a_stopping_node_saying_it_owns_a_shard_names_no_other_owner() {
        let routes = reading_nothing();
        let by = |writer, leaving| Route {
            writer,
            addr: format!("http://n{writer}:1"),
            leaving,
            ..Route::default()
        };
        let since = Instant::now();
        routes.read(vec![(3, by(2, true))]);
        assert!(!routes.named_other_since(3, 1, since), "a stopping owner's late say: it takes nothing");
        assert!(routes.names_lately(3, 2, Duration::from_secs(1)), "yet it is not silent");
        routes.read(vec![(3, by(4, false))]);
        assert!(routes.named_other_since(3, 1, since), "a node that owns it now");
        assert!(!routes.named_other_since(3, 4, since), "not another than itself");
        routes.read(vec![(3, by(2, true))]);
        assert_eq!(
            routes.owner_of(3).map(|r| r.writer),
            Some(4),
            "the stopping node's late word names no one"
        );
        assert!(routes.named_other_since(3, 1, since) && !routes.names_lately(3, 2, Duration::from_secs(1)));
    }

    #[tokio::test]
    async fn a_failed_route_write_is_tried_again_until_written() {
        let (unwritten, log, stop, writing) = writing(3);
        unwritten.say(7, route(false));
        tokio::time::sleep(PAUSE * 20).await;
        assert_eq!(*log.written.lock().unwrap(), [(7, false)], "written once, after three failures");
        assert!(unwritten.pending().is_empty());
        stop.cancel();
        writing.await.unwrap();
    }

    #[tokio::test]
    async fn a_route_said_later_replaces_one_not_yet_written() {
        let (unwritten, log, stop, writing) = writing(1);
        unwritten.say(2, route(false));
        tokio::task::yield_now().await;
        // The claim failed; before it is tried again, the node lets go.
        unwritten.say(2, route(true));
        unwritten.say(3, route(false));
        tokio::time::sleep(PAUSE * 20).await;
        let mut written = log.written.lock().unwrap().clone();
        written.sort();
        assert_eq!(written, [(2, true), (3, false)], "the release, never the old claim after it");
        stop.cancel();
        writing.await.unwrap();
    }
}
