//! What a node watches in the background for the shards it owns: the
//! standby copies it keeps (as the routing topic says), and the owned
//! shards' health and claims. Takes and lets go of no shard the group
//! gives: that is the group's to say ([`super`]); one held without the
//! group (taken over from a gone owner, [`super::takeover`], or taken back
//! by the group) is let go here once another node says it owns it.

use std::{
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{Inner, LOOK_EVERY, State};
use crate::{metrics, store::StoreHealth};

/// Keeps standby copies of the shards this node stands by for (by the
/// routing topic, `--standby-replicas` nodes after each owner): opens and
/// follows those it should keep, closes those it no longer should.
/// Checked when the routing topic changes, and every few seconds.
pub(super) async fn keep_standbys(inner: Arc<Inner>, stop: CancellationToken) {
    const EVERY: Duration = Duration::from_secs(5);
    // Per shard: copies that stopped here, and when the last did. A copy
    // that keeps stopping (damage its files still hold) is opened again
    // after longer and longer waits.
    let mut stops: Vec<(u32, Option<Instant>)> = vec![(0, None); inner.slots.len()];
    loop {
        let wanted = inner.routes.standby_for(inner.config.standby_replicas);
        for (shard, slot) in inner.slots.iter().enumerate() {
            // A move under way decides; the next look sees its outcome.
            let Ok(_moving) = slot.moving.try_lock() else {
                continue;
            };
            // A copy whose store stopped (damage found, or its writer gone)
            // applies nothing more: it is closed, and opened again below,
            // from the log offset it recorded.
            let stopped = slot
                .standby
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take_if(|view| view.stopped().is_some());
            if let Some(view) = stopped {
                let (count, last) = &mut stops[shard];
                // Counted afresh after an hour without one.
                *count = if last.is_some_and(|at| at.elapsed() < STOPS_FORGOTTEN) { *count + 1 } else { 1 };
                *last = Some(Instant::now());
                tracing::error!(
                    shard,
                    damage = view.stopped().unwrap_or_default(),
                    reopen_in = ?reopen_after(*count),
                    "a standby copy of the shard stopped; it is opened again"
                );
                view.close().await;
                metrics::STANDBYS.dec();
                metrics::STANDBYS_STOPPED.inc();
                inner.moved(shard, "standby stopped");
            }
            let elsewhere = matches!(&*slot.state.borrow(), State::Elsewhere);
            // A released shard's first standby keeps its copy until the
            // shard has a new owner: it may take the shard over.
            let keep = elsewhere && (wanted.contains(&(shard as u32)) || inner.watched.watches(shard));
            let kept = slot.standby.lock().unwrap_or_else(|e| e.into_inner()).is_some();
            let waiting = matches!(stops[shard], (count, Some(at)) if at.elapsed() < reopen_after(count));
            if keep && !kept && !waiting {
                match inner.view(shard).await {
                    Ok(view) => {
                        *slot.standby.lock().unwrap_or_else(|e| e.into_inner()) = Some(view);
                        metrics::STANDBYS.inc();
                        inner.moved(shard, "standby kept");
                        tracing::info!(shard, "keeping a standby copy of the shard");
                    }
                    Err(e) => tracing::warn!(shard, error = %e, "opening a standby copy of the shard failed"),
                }
            } else if !keep && kept {
                let view = slot.standby.lock().unwrap_or_else(|e| e.into_inner()).take();
                if let Some(view) = view {
                    view.close().await;
                    metrics::STANDBYS.dec();
                    inner.moved(shard, "standby dropped");
                    tracing::info!(shard, "no longer keeping a standby copy of the shard");
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = inner.routes.changed() => {}
            _ = tokio::time::sleep(EVERY) => {}
        }
    }
    for slot in &inner.slots {
        let view = slot.standby.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(view) = view {
            view.close().await;
            metrics::STANDBYS.dec();
        }
    }
}

/// After this long without a copy of a shard stopping, its stops are
/// counted afresh.
const STOPS_FORGOTTEN: Duration = Duration::from_secs(3_600);

/// How long a standby copy that stopped `count` times in a row waits to
/// be opened again: none the first time (the next look, within 5 s), then
/// twice as long each time from 10 s, at most 10 minutes.
fn reopen_after(count: u32) -> Duration {
    match count {
        0 | 1 => Duration::ZERO,
        n => Duration::from_secs(5u64 << (n - 1).min(7)).min(Duration::from_secs(600)),
    }
}

/// Mirrors the owned shards' health into `health`, and damage in any of
/// them into `damaged`, until `stop`.
pub(super) async fn watch_owned(
    inner: Arc<Inner>,
    health: watch::Sender<StoreHealth>,
    damaged: CancellationToken,
    stop: CancellationToken,
) {
    // Per shard: since when the log has named another owner of a shard the
    // group gives this node, and when this node last said in the routing
    // topic that it owns one.
    let mut fenced_since: Vec<Option<Instant>> = vec![None; inner.slots.len()];
    let mut said_at: Vec<Option<Instant>> = vec![None; inner.slots.len()];
    let session = inner.config.group.session_timeout;
    loop {
        let now = inner.health();
        health.send_if_modified(|h| std::mem::replace(h, now.clone()) != now);
        let mut damage = false;
        for (shard, ((slot, since), said)) in
            inner.slots.iter().zip(&mut fenced_since).zip(&mut said_at).enumerate()
        {
            let State::Owned(owned) = &*slot.state.borrow() else {
                (*since, *said) = (None, None);
                continue;
            };
            damage |= owned.store().damaged().is_cancelled();
            // Held without the group: kept until another node claims it
            // or says it owns it (the group gave it to that node). Not said
            // again: a node the group gives it to, which claimed it before
            // this one, finds this one silent and claims it back.
            if !slot.given.load(Ordering::Acquire) {
                let log_owner = owned.store().log_owner();
                let claimed = log_owner != owned.me && log_owner != 0;
                if claimed || inner.routes.named_other_since(shard as u32, owned.me, owned.since) {
                    let (inner, owned) = (Arc::clone(&inner), Arc::clone(owned));
                    tokio::spawn(async move { inner.let_go_held(shard, &owned).await });
                }
                (*since, *said) = (None, None);
                continue;
            }
            match owned.store().log_owner() {
                owner if owner == owned.me => {
                    *since = None;
                    // Said again every third of a session timeout: a node
                    // that stops saying it (it died) is known to be gone.
                    if said.is_none_or(|at| at.elapsed() >= session / 3) {
                        inner.routes.publish(shard as u32, false);
                        *said = Some(Instant::now());
                    }
                }
                // Released by a node that claimed it after this one: the
                // group still says it is this node's.
                0 => owned.reclaim(),
                owner => {
                    // Another writer's claim of a shard the group has not
                    // taken from this node (not yet, or the group moved on
                    // without it). A live claimant says it owns the shard
                    // in the routing topic every third of a session
                    // timeout; one that has not for a session timeout
                    // died, or never took it (a copy of an old claim
                    // appended again: its seal still verifies). Past a
                    // session timeout of that (the longest the group takes
                    // to tell a member it lost a shard), with this node's
                    // lease held all along, it claims the shard back.
                    let at = *since.get_or_insert_with(Instant::now);
                    if !inner.lease.holds() {
                        *since = None;
                    } else if at.elapsed() >= session
                        && !inner.routes.names_lately(shard as u32, owner, session)
                    {
                        tracing::warn!(
                            partition = owned.partition,
                            claimed_by = owner,
                            "the schedule log names another owner of a shard the group still gives this \
                             node, which has not said it owns it for a session timeout: claiming it back"
                        );
                        metrics::CLUSTER_RECLAIMS.inc();
                        owned.reclaim();
                        *since = None;
                    }
                }
            }
        }
        if damage {
            damaged.cancel();
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(LOOK_EVERY) => {}
        }
    }
}
