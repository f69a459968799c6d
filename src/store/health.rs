//! Whether the store takes new messages, from two sources: the writer's last
//! commit (capacity, failing writes) and the dispatcher's reads (a message
//! that cannot be read). A process reports it as gRPC health, so a load
//! balancer sends traffic elsewhere while the store cannot take it or
//! cannot deliver what it holds.
//!
//! It must not flap: only a commit that wrote something tells whether
//! writes work, and a read failure clears only when a read succeeds.

use std::sync::Mutex;

use prometheus::IntGauge;
use tokio::sync::watch;

/// What the store reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreHealth {
    Ok,
    /// The backlog cap is reached; it clears as messages are delivered.
    AtCapacity,
    /// Writes fail (disk full, I/O error) or a message cannot be read.
    /// Nothing that failed was acknowledged; the store probes until a write
    /// (or the read) succeeds again.
    Failing(String),
    /// Cluster mode: the node has not taken its first shards yet (joining
    /// the group, applying the schedule log).
    Joining(String),
}

/// Both sources, combined into one [`StoreHealth`].
pub(crate) struct HealthBoard {
    tx: watch::Sender<StoreHealth>,
    parts: Mutex<Parts>,
    /// Set to 1 while the store takes new messages, 0 otherwise.
    writable: IntGauge,
}

#[derive(Clone, Debug)]
struct Parts {
    writes: StoreHealth,
    reads: Option<String>,
}

impl HealthBoard {
    pub(super) fn new(writable: IntGauge) -> HealthBoard {
        writable.set(1);
        HealthBoard {
            tx: watch::channel(StoreHealth::Ok).0,
            parts: Mutex::new(Parts { writes: StoreHealth::Ok, reads: None }),
            writable,
        }
    }

    pub(super) fn subscribe(&self) -> watch::Receiver<StoreHealth> {
        self.tx.subscribe()
    }

    fn update(&self, change: impl FnOnce(&mut Parts)) {
        let mut parts = self.parts.lock().unwrap_or_else(|e| e.into_inner());
        change(&mut parts);
        let now = match &parts.reads {
            Some(reason) if !matches!(parts.writes, StoreHealth::Failing(_)) => {
                StoreHealth::Failing(reason.clone())
            }
            _ => parts.writes.clone(),
        };
        self.writable.set(i64::from(now == StoreHealth::Ok));
        self.tx.send_if_modified(|h| std::mem::replace(h, now.clone()) != now);
    }

    /// What the last commit that wrote found.
    pub(super) fn set_writes(&self, health: StoreHealth) {
        self.update(|p| p.writes = health);
    }

    /// A read of a due message failed (`Some`), or succeeded again (`None`).
    pub(super) fn set_reads(&self, failure: Option<String>) {
        self.update(|p| p.reads = failure);
    }

    /// Whether writes fail now: the dispatcher produces nothing while the
    /// store could not record what it produced.
    pub(super) fn writes_failing(&self) -> bool {
        matches!(self.parts.lock().unwrap_or_else(|e| e.into_inner()).writes, StoreHealth::Failing(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_combine_and_clear_on_their_own() {
        let writable = IntGauge::new("writable", "1 while writable").unwrap();
        let board = HealthBoard::new(writable.clone());
        let health = board.subscribe();
        board.set_reads(Some("reading m1 failed".into()));
        assert_eq!(*health.borrow(), StoreHealth::Failing("reading m1 failed".into()));
        assert_eq!(writable.get(), 0);
        board.set_writes(StoreHealth::Ok);
        assert!(
            matches!(*health.borrow(), StoreHealth::Failing(_)),
            "a commit does not clear a read failure"
        );
        board.set_writes(StoreHealth::Failing("disk full".into()));
        assert_eq!(*health.borrow(), StoreHealth::Failing("disk full".into()));
        assert!(board.writes_failing());
        board.set_reads(None);
        board.set_writes(StoreHealth::AtCapacity);
        assert_eq!(*health.borrow(), StoreHealth::AtCapacity);
        assert!(!board.writes_failing());
        board.set_writes(StoreHealth::Ok);
        assert_eq!(writable.get(), 1);
    }
}
