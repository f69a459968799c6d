//! Cluster mode: a shard's dispatcher produces only while the node's lease
//! holds (see [`super::lease`]) and the log says this node incarnation owns
//! the shard.

use std::sync::Arc;

use super::lease::Lease;
use crate::{dispatcher::Gate, store::Store};

/// The gate of a shard this node claimed in the schedule log.
pub(crate) struct LeaseGate {
    lease: Arc<Lease>,
    store: Store,
    /// This node incarnation.
    owner: u64,
}

impl LeaseGate {
    pub(crate) fn new(lease: Arc<Lease>, store: Store, owner: u64) -> Self {
        LeaseGate { lease, store, owner }
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
}
