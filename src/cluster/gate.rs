//! Cluster mode: a shard's dispatcher produces only while the node's lease
//! holds (see [`super::lease`]) and the log says this node incarnation owns
//! the shard.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use super::lease::Lease;
use crate::{dispatcher::Gate, store::Store};

/// The gate of a shard this node claimed in the schedule log.
pub(crate) struct LeaseGate {
    lease: Arc<Lease>,
    store: Store,
    /// This node incarnation.
    owner: u64,
    /// Claimed over a clean release (see [`Gate::released_clean`]); taken
    /// when asked.
    released_clean: AtomicBool,
    /// Set when the dispatcher stops with nothing in doubt.
    stopped_clean: Arc<AtomicBool>,
}

impl LeaseGate {
    pub(crate) fn new(
        lease: Arc<Lease>,
        store: Store,
        owner: u64,
        released_clean: bool,
        stopped_clean: Arc<AtomicBool>,
    ) -> Self {
        LeaseGate { lease, store, owner, released_clean: AtomicBool::new(released_clean), stopped_clean }
    }
}

impl Gate for LeaseGate {
    /// Whether neither the lease nor another owner forbids producing now.
    fn open(&self) -> bool {
        self.lease.holds() && self.store.log_owner() == self.owner
    }

    fn claimed(&self) -> bool {
        true
    }

    fn released_clean(&self) -> bool {
        self.released_clean.swap(false, Ordering::AcqRel)
    }

    fn stopped(&self, clean: bool) {
        self.stopped_clean.store(clean, Ordering::Release);
    }
}
