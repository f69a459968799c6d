//! What this node keeps of the cluster's shards, for operators (the
//! console's cluster page, `Admin/DescribeCluster`): each copy it owns,
//! keeps standby, takes or lets go, how far each is behind its partition
//! of the schedule log, and the node's latest moves.

use std::{collections::VecDeque, sync::Mutex, time::Duration};

use futures_util::future;

use super::{Cluster, Inner, State};
use crate::node::{Move, Picture, Role, ShardCopy};

/// Moves kept.
const KEPT: usize = 50;
/// Longest a look at a partition's end waits for the broker.
const END_WAIT: Duration = Duration::from_secs(2);

/// The node's latest moves, oldest first.
#[derive(Default)]
pub(super) struct Moves(Mutex<VecDeque<Move>>);

impl Inner {
    /// Notes a move of `shard`.
    pub(super) fn moved(&self, shard: usize, what: &'static str) {
        let mut moves = self.moves.0.lock().unwrap_or_else(|e| e.into_inner());
        if moves.len() == KEPT {
            moves.pop_front();
        }
        moves.push_back(Move { at: self.shards.clock.now(), shard: shard as u32, what });
    }
}

impl Cluster {
    pub async fn picture(&self) -> Picture {
        let inner = &self.inner;
        let mut copies = Vec::new();
        let mut readers = Vec::new();
        for (shard, slot) in inner.slots.iter().enumerate() {
            let copy = |role, store: Option<&crate::store::Store>| ShardCopy {
                shard: shard as u32,
                role,
                pending: store.map_or(0, |s| s.pending()),
                applied: store.map(|s| s.log_next()),
                log_end: None,
            };
            let state = slot.state.borrow().clone();
            match state {
                State::Owned(owned) => {
                    copies.push(copy(Role::Owner, Some(&owned.view.store)));
                    readers.push(Some(std::sync::Arc::clone(&owned.view.reader)));
                }
                State::Taking => {
                    copies.push(copy(Role::Taking, None));
                    readers.push(None);
                }
                State::LettingGo => {
                    copies.push(copy(Role::LettingGo, None));
                    readers.push(None);
                }
                State::Unknown | State::Elsewhere => {
                    let standby = slot.standby.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(view) = standby.as_ref() {
                        copies.push(copy(Role::Standby, Some(&view.store)));
                        readers.push(Some(std::sync::Arc::clone(&view.reader)));
                    }
                }
            }
        }
        // Each end is a broker round trip: looked up together, off the
        // runtime's threads.
        let ends = future::join_all(readers.into_iter().map(|reader| async move {
            let reader = reader?;
            tokio::task::spawn_blocking(move || reader.end(END_WAIT).ok()).await.ok().flatten()
        }))
        .await;
        copies.iter_mut().zip(ends).for_each(|(copy, end)| copy.log_end = end);
        let moves = inner.moves.0.lock().unwrap_or_else(|e| e.into_inner()).iter().rev().cloned().collect();
        Picture {
            as_of: inner.shards.clock.now(),
            cluster: true,
            shards: inner.slots.len() as u32,
            addr: inner.routes.addr().to_owned(),
            copies,
            moves,
        }
    }
}
