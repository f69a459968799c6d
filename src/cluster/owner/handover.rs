//! Handing a shard over between live nodes. With the `cooperative-sticky`
//! assignor the group takes a shard back from a node in one rebalance and
//! gives it to its next owner only in the next (a moment later on Apache
//! Kafka, 2-3 s later on Tansu 0.6): let go at once, the shard would have
//! no dispatcher in between. So the node **holds** it:
//!
//! - taken back by the group ([`Inner::holds_on`]), a shard this node
//!   dispatches under its lease is kept, dispatching, and said `held` in
//!   the routing topic; so is one taken over from a gone owner
//!   ([`super::takeover`]) until the group decides;
//! - its next owner, once it has applied the partition to its end, asks
//!   ([`Inner::ask_holder`]): says in the routing topic that it owns the
//!   shard, and waits a moment for the holder's release;
//! - the holder lets go at that word ([`Inner::let_go_held`], from
//!   [`super::background::watch_owned`]), cleanly: the next owner's claim
//!   comes right after a clean release, with nothing to search for.
//!
//! A holder that does not answer in time is fenced by the claim, as in any
//! move; a node whose session ran out, or that is stopping, lets go at
//! once. A take that claimed or asked ([`Inner::commit_take`]) and is
//! taken back by the group meanwhile is completed and held: the last owner
//! no longer dispatches the shard.

use std::{
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use tokio_util::sync::CancellationToken;

use super::{Inner, Owned, State};
use crate::{cluster::applier::View, metrics};

/// Longest a take waits for the node holding the shard to let go of it
/// before claiming it anyway.
const HANDOVER_WAIT: Duration = Duration::from_secs(2);

impl Inner {
    /// Asks the node that holds `shard` without the group giving it (the
    /// log names it, the routing topic says it holds it, or says so within
    /// [`HANDOVER_WAIT`]) to hand it over: says that this node owns it, and
    /// waits up to [`HANDOVER_WAIT`] for the holder's release to be applied
    /// to `view`, so that this node's claim comes right after a clean
    /// release rather than fence a dispatcher mid-flight. Whether it asked.
    /// A takeover asks no one: its owner is gone.
    ///
    /// An owner the routing topic says the group gave the shard to is
    /// waited for too, dispatching meanwhile: Tansu 0.6 gives a shard to a
    /// second member for a while as members rejoin, and then takes it back
    /// from one of the two (from this node, which calls the take off; or
    /// from that owner, which then holds it and hands it over). Claimed
    /// over at once, it would be fenced mid-flight and claim the shard
    /// back, each claim with its search and grace. An owner that hung
    /// (the group gave the shard away from it) is claimed over at once
    /// once it has been silent for two thirds of a session timeout
    /// ([`Inner::silent`]); one that hung more lately costs the wait.
    pub(super) async fn ask_holder(&self, shard: usize, view: &View, cancel: &CancellationToken) -> bool {
        if !self.slots[shard].given.load(Ordering::Acquire) {
            return false;
        }
        let holder = view.store.log_owner();
        if holder == 0 || holder == self.waiters.me() || self.silent(shard as u32, holder) {
            return false;
        }
        let started = Instant::now();
        // A node that has just taken the shard over says it holds it a
        // moment after its claim, one the group took it back from a moment
        // after that; one that does not say so within the wait is claimed
        // over. One that lets go meanwhile (its release applied to the
        // view) is waited for no longer: the claim follows its release.
        let mut applied = view.applied.clone();
        let route = tokio::select! {
            _ = cancel.cancelled() => return false,
            _ = applied.wait_for(|_| view.store.log_owner() != holder) => return false,
            route = self.routes.held_by(shard as u32, holder, (started + HANDOVER_WAIT).into()) => route,
        };
        if route.is_none_or(|route| route.addr == self.routes.addr()) {
            return false;
        }
        if !self.commit_take(shard, cancel) {
            return false;
        }
        self.routes.own(shard as u32, false);
        let mut applied = view.applied.clone();
        let released = applied.wait_for(|_| view.store.log_owner() != holder);
        tokio::select! {
            _ = cancel.cancelled() => {}
            waited = tokio::time::timeout(HANDOVER_WAIT, released) => match waited {
                Ok(Ok(_)) => tracing::info!(shard, elapsed = ?started.elapsed(), "the node that held the shard handed it over"),
                // The copy stopped applying: the take fails at its claim.
                Ok(Err(_)) => {}
                Err(_) => tracing::warn!(
                    shard,
                    waited = ?HANDOVER_WAIT,
                    "the node that holds the shard did not let go of it: claiming it, which stops that node"
                ),
            },
        }
        true
    }

    /// Whether the routing topic names `holder` the owner of `shard`, given
    /// it by the group, and `holder` has not said so again lately: an
    /// owner says it every third of a session timeout, so one silent for
    /// two thirds of it hung, and is claimed over without a wait.
    fn silent(&self, shard: u32, holder: u64) -> bool {
        let lately = self.config.group.session_timeout * 2 / 3;
        self.routes.owner_of(shard).is_some_and(|r| r.writer == holder && !r.held)
            && !self.routes.names_lately(shard, holder, lately)
    }

    /// Lets go of `shard` if this node still holds it as `owned`, without
    /// the group giving it: another node said it owns it.
    pub(super) async fn let_go_held(&self, shard: usize, owned: &Arc<Owned>) {
        let slot = &self.slots[shard];
        let _moving = slot.moving.lock().await;
        let still = matches!(&*slot.state.borrow(), State::Owned(now) if Arc::ptr_eq(now, owned));
        if !still || slot.given.load(Ordering::Acquire) {
            return;
        }
        // Asked, not fenced: the next owner claims it right after this
        // release.
        let how = if owned.fenced() { "let go" } else { "handed over" };
        slot.state.send_replace(State::LettingGo);
        owned.let_go().await;
        metrics::SHARDS_OWNED.dec();
        metrics::SHARD_MOVES.with_label_values(&[how]).inc();
        self.moved(shard, how);
        tracing::info!(shard, how, "let go of the shard held: the group gave it to another node");
        slot.state.send_replace(State::Elsewhere);
    }

    /// Commits the take of `shard` under way, before it asks a holder or
    /// claims: one the group takes back from then on is completed and held
    /// ([`Inner::holds_on`]), since the holder let go or the claim fenced
    /// the last owner. False if the take was called off already.
    pub(super) fn commit_take(&self, shard: usize, cancel: &CancellationToken) -> bool {
        // Under the lock the group's taking back looks at it with.
        let _taking = self.slots[shard].taking.lock().unwrap_or_else(|e| e.into_inner());
        if cancel.is_cancelled() {
            return false;
        }
        self.slots[shard].committed.store(true, Ordering::Release);
        true
    }

    /// The group took `shard` back: whether this node holds it until its
    /// next owner says it owns it (it dispatches it under its lease, or its
    /// take is committed: [`Inner::commit_take`]); if not, it lets go of it
    /// at once, as when the group gave it away already (`lost`) and when
    /// this node is stopping.
    pub(super) fn holds_on(&self, shard: usize, lost: bool) -> bool {
        let slot = &self.slots[shard];
        if lost || !self.lease.holds() || self.routes.leaving() {
            return false;
        }
        let (owned, taking) = match &*slot.state.borrow() {
            State::Owned(owned) => (!owned.fenced(), false),
            State::Taking => (false, true),
            _ => (false, false),
        };
        if taking {
            // Under the lock a take commits with: one committed is taken,
            // one that is not is called off.
            let take = slot.taking.lock().unwrap_or_else(|e| e.into_inner());
            if slot.committed.load(Ordering::Acquire) {
                tracing::info!(
                    shard,
                    "the group took back a shard this node has claimed or asked for: taking it all the same, \
                     and holding it until its next owner says it owns it"
                );
                return true;
            }
            take.cancel();
        }
        if owned {
            tracing::info!(
                shard,
                "the group took the shard back: dispatching it until its next owner says it owns it"
            );
            self.routes.own(shard as u32, true);
        }
        owned
    }
}
