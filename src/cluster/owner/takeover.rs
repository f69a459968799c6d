//! Taking over a gone owner's shards before the group does. The group
//! gives a dead member's shards to others only once its session runs out
//! (6 s by default; Kafka's brokers allow no less) and a rebalance
//! completes; a shard's first standby knows sooner, from the owner itself:
//!
//! - an owner that said it is stopping (the routing topic's `leaving`)
//!   **released** the shard in the log: its last deliveries are recorded
//!   (the shard's producer is made as soon as the owner says so:
//!   [`Ahead`]);
//! - an owner that did not say so no longer **listens** at its address: a
//!   connection there, which was accepted before, is refused twice in a
//!   row (the process is gone; a machine that stopped answering at all is
//!   left to the group's session timeout, as are addresses never reached).
//!   Every node the routing topic names is connected to from the moment
//!   it is named, not only once this node stands by for it, so that an
//!   owner killed just after its standby caught up is known to have
//!   listened (`hourglass_cluster_peers_listening` counts them).
//!
//! A release by an owner that is not stopping is the group moving the
//! shard: the group gives it to its next owner soon, and nothing is taken
//! over. A stopping owner no longer listens either while it drains its
//! requests; it is waited for until it releases (or the group decides).
//!
//! The standby then takes the shard as the group would (claims it in the
//! log, which fences anyone still dispatching it, reconciles what may be
//! delivered already, dispatches) and keeps it until the group decides:
//! given to this node, it stays; given to another, whose claim comes
//! later, it is let go ([`super::background::watch_owned`]).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio_util::{sync::CancellationToken, task::TaskTracker};

use super::{Inner, State};
use crate::{kafka::Producer, metrics};

/// How often the first standbys look at what their copies say of their
/// owners (a release), and at most how often they connect to them.
const LOOK_EVERY: Duration = Duration::from_millis(25);
const CONNECT_EVERY: Duration = Duration::from_millis(250);
/// How long a connection to an owner may take before the look gives up
/// (which says nothing of the owner).
const CONNECT_WAIT: Duration = Duration::from_millis(200);
/// Refusals in a row that make an owner gone.
const REFUSALS: u32 = 2;
/// How long a producer made ahead of a takeover waits for it.
const AHEAD_FOR: Duration = Duration::from_secs(10);

/// Per shard: the owner this node is the first standby of, while the log
/// and the routing topic both name it.
#[derive(Default)]
pub(super) struct Watched(Mutex<BTreeMap<usize, Owner>>);

#[derive(Clone, Debug, PartialEq)]
struct Owner {
    writer: u64,
    addr: String,
    /// It said it is stopping.
    leaving: bool,
}

impl Watched {
    /// Whether this node watches the owner of `shard` (its standby copy
    /// is kept until the shard has a new owner, even once released).
    pub(super) fn watches(&self, shard: usize) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).contains_key(&shard)
    }

    fn set(&self, shard: usize, owner: Option<Owner>) {
        let mut watched = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match owner {
            Some(owner) => watched.insert(shard, owner),
            None => watched.remove(&shard),
        };
    }

    fn get(&self, shard: usize) -> Option<Owner> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).get(&shard).cloned()
    }
}

/// Per shard, its own producer, made when its owner said it is stopping:
/// ready by the release (see [`Producer::ahead_for_shard`]). Taken by the
/// take that follows; dropped unused after [`AHEAD_FOR`].
#[derive(Default)]
pub(super) struct Ahead(Mutex<BTreeMap<usize, (Arc<Producer>, std::time::Instant)>>);

impl Ahead {
    /// The producer made ahead for `shard`, if one was.
    pub(super) fn take(&self, shard: usize) -> Option<Arc<Producer>> {
        let made = self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(&shard)?;
        Some(made.0)
    }

    /// Makes `shard`'s producer from `node`'s unless made already.
    fn make(&self, shard: usize, node: &Arc<Producer>) {
        let mut made = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if made.contains_key(&shard) {
            return;
        }
        match node.ahead_for_shard(shard as u32) {
            Some(Ok(producer)) => {
                made.insert(shard, (producer, std::time::Instant::now()));
            }
            // Made when the shard is taken, as without a stopping owner.
            Some(Err(e)) => tracing::debug!(shard, error = %e, "no producer made ahead of the takeover"),
            None => {}
        }
    }

    /// Drops the producers made longer than [`AHEAD_FOR`] ago (on a
    /// thread of its own: librdkafka joins its threads).
    fn forget_old(&self) {
        let mut made = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (old, kept): (Vec<_>, Vec<_>) =
            std::mem::take(&mut *made).into_iter().partition(|(_, (_, at))| at.elapsed() >= AHEAD_FOR);
        *made = kept.into_iter().collect();
        if !old.is_empty() {
            tokio::task::spawn_blocking(move || drop(old));
        }
    }
}

/// Watches the owners of the shards this node is the first standby of,
/// and takes over those gone, until `stop`.
pub(super) async fn watch_owners(inner: Arc<Inner>, tasks: TaskTracker, stop: CancellationToken) {
    if inner.config.standby_replicas == 0 {
        return;
    }
    let mut listening = Listening::default();
    let mut connected_at = std::time::Instant::now();
    loop {
        let first: BTreeSet<u32> = inner.routes.standby_for(1).into_iter().collect();
        let mut gone = BTreeMap::new();
        for (shard, slot) in inner.slots.iter().enumerate() {
            // The standby copy's view of the log: who it says owns the
            // shard. A shard this node owns or moves is not watched.
            let elsewhere = matches!(&*slot.state.borrow(), State::Elsewhere);
            let in_log = match slot.standby.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                Some(view) if elsewhere => Some(view.store.log_owner()),
                _ => None,
            };
            let Some(in_log) = in_log else {
                inner.watched.set(shard, None);
                continue;
            };
            let named = inner.routes.owner_of(shard as u32);
            let watched = inner.watched.get(shard);
            let first = first.contains(&(shard as u32));
            match (named, watched) {
                // The owner as both the routing topic and the log name it.
                (Some(route), _) if first && in_log == route.writer => {
                    let (writer, addr, leaving) = (route.writer, route.addr, route.leaving);
                    inner.watched.set(shard, Some(Owner { writer, addr, leaving }));
                }
                // Still named, with a claim the copy has not applied yet.
                (Some(route), Some(owner)) if first && owner.writer == route.writer => {}
                // Released in the routing topic: the log says it too, or soon.
                (None, Some(_)) => {}
                _ => inner.watched.set(shard, None),
            }
            let Some(owner) = inner.watched.get(shard) else { continue };
            if owner.leaving {
                inner.ahead.make(shard, &inner.shards.producer);
            }
            if in_log == 0 {
                if owner.leaving {
                    gone.insert(shard, "released by its stopping owner");
                }
            } else if in_log != owner.writer {
                inner.watched.set(shard, None);
            }
        }
        // Every other node the routing topic names; one newly named is
        // connected to at once.
        let peers: BTreeSet<String> = inner.routes.peers().into_iter().collect();
        let gone_away = if connected_at.elapsed() >= CONNECT_EVERY || !listening.knows_all(&peers) {
            connected_at = std::time::Instant::now();
            let gone_away = listening.look(peers).await;
            metrics::PEERS_LISTENING.set(listening.accepting as i64);
            gone_away
        } else {
            Vec::new()
        };
        for addr in gone_away {
            for (shard, owner) in inner.watched.0.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                if owner.addr == addr && !owner.leaving {
                    gone.entry(*shard).or_insert("no longer listening");
                }
            }
        }
        inner.ahead.forget_old();
        for (shard, why) in gone {
            // Produced under this node's own lease: one that does not hold
            // (the process stalled) takes nothing.
            if !inner.lease.holds() {
                break;
            }
            inner.watched.set(shard, None);
            tracing::warn!(
                shard,
                why,
                "the shard's owner is gone: its first standby takes the shard over before the group does"
            );
            let cancel = CancellationToken::new();
            *inner.slots[shard].taking.lock().unwrap_or_else(|e| e.into_inner()) = cancel.clone();
            tasks.spawn(Arc::clone(&inner).take(shard, cancel));
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(LOOK_EVERY) => {}
        }
    }
}

/// Which owners' addresses still accept connections.
#[derive(Default)]
struct Listening {
    /// The addresses connected to last.
    looked_at: BTreeSet<String>,
    /// Addresses that accepted a connection, with the refusals since.
    accepted: BTreeMap<String, u32>,
    /// How many accepted the last connection.
    accepting: usize,
}

impl Listening {
    /// Whether each of `addrs` was connected to already.
    fn knows_all(&self, addrs: &BTreeSet<String>) -> bool {
        addrs.is_subset(&self.looked_at)
    }

    /// Connects to each of `addrs` (and forgets the others); returns those
    /// that accepted before and now refused [`REFUSALS`] times in a row.
    async fn look(&mut self, addrs: BTreeSet<String>) -> Vec<String> {
        self.accepted.retain(|addr, _| addrs.contains(addr));
        self.looked_at.clone_from(&addrs);
        let looks = addrs.into_iter().map(|addr| async move {
            // The advertised URL's host and port.
            let authority =
                addr.parse::<tonic::codegen::http::Uri>().ok().and_then(|u| u.into_parts().authority);
            let outcome = match authority {
                Some(at) => {
                    tokio::time::timeout(CONNECT_WAIT, tokio::net::TcpStream::connect(at.as_str())).await
                }
                None => Ok(Err(std::io::ErrorKind::InvalidInput.into())),
            };
            (addr, outcome)
        });
        let mut gone = Vec::new();
        self.accepting = 0;
        for (addr, outcome) in futures_util::future::join_all(looks).await {
            match outcome {
                Ok(Ok(_)) => {
                    self.accepting += 1;
                    self.accepted.insert(addr, 0);
                }
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    if let Some(refused) = self.accepted.get_mut(&addr) {
                        *refused += 1;
                        if *refused >= REFUSALS {
                            gone.push(addr);
                        }
                    }
                }
                // Unreachable, or slow: not evidence of anything.
                _ => {
                    if let Some(refused) = self.accepted.get_mut(&addr) {
                        *refused = 0;
                    }
                }
            }
        }
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_address_that_accepted_and_then_refuses_twice_is_gone() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = format!("http://{}", listener.local_addr().unwrap());
        let mut listening = Listening::default();
        let addrs = || BTreeSet::from([addr.clone()]);
        assert!(listening.look(addrs()).await.is_empty(), "it listens");
        drop(listener);
        assert!(listening.look(addrs()).await.is_empty(), "one refusal is not enough");
        assert_eq!(listening.look(addrs()).await, vec![addr.clone()]);
    }

    #[tokio::test]
    async fn an_address_never_reached_is_not_gone() {
        let addr = {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            format!("http://{}", listener.local_addr().unwrap())
        };
        let mut listening = Listening::default();
        for _ in 0..3 {
            assert!(listening.look(BTreeSet::from([addr.clone()])).await.is_empty());
        }
    }
}
