//! What a node watches in the background for the shards it owns: the
//! standby copies it keeps (as the routing topic says), and the owned
//! shards' health and claims. Must not take or let go of a shard: that is
//! the group's to say ([`super`]).

use std::{sync::Arc, time::Duration};

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
    loop {
        let now = inner.health();
        health.send_if_modified(|h| std::mem::replace(h, now.clone()) != now);
        let mut damage = false;
        for slot in &inner.slots {
            if let State::Owned(owned) = &*slot.state.borrow() {
                damage |= owned.store().damaged().is_cancelled();
                // Released by a node that claimed it after this one: the
                // group still says it is this node's.
                if owned.store().log_owner() == 0 {
                    owned.reclaim();
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
