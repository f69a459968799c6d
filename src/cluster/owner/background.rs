//! What a node watches in the background for the shards it owns: the
//! standby copies it keeps (as the routing topic says), and the owned
//! shards' health and claims. Must not take or let go of a shard: that is
//! the group's to say ([`super`]).

use std::{
    sync::Arc,
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
    loop {
        let wanted = inner.routes.standby_for(inner.config.standby_replicas);
        for (shard, slot) in inner.slots.iter().enumerate() {
            // A move under way decides; the next look sees its outcome.
            let Ok(_moving) = slot.moving.try_lock() else {
                continue;
            };
            let elsewhere = matches!(&*slot.state.borrow(), State::Elsewhere);
            let keep = elsewhere && wanted.contains(&(shard as u32));
            let kept = slot.standby.lock().unwrap_or_else(|e| e.into_inner()).is_some();
            if keep && !kept {
                match inner.view(shard).await {
                    Ok(view) => {
                        *slot.standby.lock().unwrap_or_else(|e| e.into_inner()) = Some(view);
                        metrics::STANDBYS.inc();
                        tracing::info!(shard, "keeping a standby copy of the shard");
                    }
                    Err(e) => tracing::warn!(shard, error = %e, "opening a standby copy of the shard failed"),
                }
            } else if !keep && kept {
                let view = slot.standby.lock().unwrap_or_else(|e| e.into_inner()).take();
                if let Some(view) = view {
                    view.close().await;
                    metrics::STANDBYS.dec();
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

/// Mirrors the owned shards' health into `health`, and damage in any of
/// them into `damaged`, until `stop`.
pub(super) async fn watch_owned(
    inner: Arc<Inner>,
    health: watch::Sender<StoreHealth>,
    damaged: CancellationToken,
    stop: CancellationToken,
) {
    // Per shard: since when the log has named another owner of a shard the
    // group gives this node.
    let mut fenced_since: Vec<Option<Instant>> = vec![None; inner.slots.len()];
    loop {
        let now = inner.health();
        health.send_if_modified(|h| std::mem::replace(h, now.clone()) != now);
        let mut damage = false;
        for (shard, (slot, since)) in inner.slots.iter().zip(&mut fenced_since).enumerate() {
            let State::Owned(owned) = &*slot.state.borrow() else {
                *since = None;
                continue;
            };
            damage |= owned.store().damaged().is_cancelled();
            match owned.store().log_owner() {
                owner if owner == owned.me => *since = None,
                // Released by a node that claimed it after this one: the
                // group still says it is this node's.
                0 => owned.reclaim(),
                owner => {
                    // Another writer's claim of a shard the group has not
                    // taken from this node (not yet, or the group moved on
                    // without it), and which the claimant has not
                    // published as its own in the routing topic, as every
                    // node taking a shard does: a copy of an old claim
                    // appended again (its seal still verifies). Past a
                    // session timeout (the longest the group takes to
                    // tell a member it lost a shard) of that, with this
                    // node's lease held all along, it claims the shard
                    // back.
                    let at = *since.get_or_insert_with(Instant::now);
                    if !inner.lease.holds() || inner.routes.names(shard as u32, owner) {
                        *since = None;
                    } else if at.elapsed() >= inner.config.group.session_timeout {
                        tracing::warn!(
                            partition = owned.partition,
                            claimed_by = owner,
                            "the schedule log names another owner of a shard the group still gives this \
                             node (an old claim appended again?): claiming it back"
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
