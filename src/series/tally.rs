//! How many series each tenant has, as this node last counted them, kept
//! up by the creates and deletes it serves: so that a create checks the
//! tenant's bound (--series-max-per-tenant) without reading every one of
//! its series each time, and creates are written side by side (one
//! commit for many) rather than one after another.
//!
//! A create takes its place before it writes ([`Tally::reserve`]) and
//! gives it back if the write fails, so two creates at once cannot both
//! take a tenant's last place. A count is read from the store again when
//! it is older than [`RECOUNT_EVERY`] (in a cluster, other nodes write
//! series into shards this node serves), when the shards this node serves
//! changed, and, at most every [`RECOUNT_FULL`], when it says the tenant is
//! full (a series deleted elsewhere frees a place): a tenant at its bound
//! costs one count a second, not one per refused call. The caller counts
//! with no create or delete of its own in flight (see
//! [`Series`](super::Series)'s `making`).

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use crate::message::Tenant;

/// A count is read again once this old.
const RECOUNT_EVERY: Duration = Duration::from_secs(10);

/// A count that says the tenant is full is read again once this old.
const RECOUNT_FULL: Duration = Duration::from_secs(1);

/// What [`Tally::reserve`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Reserve {
    /// A place is taken: give it back with [`Tally::removed`] if the
    /// series is not made.
    Taken,
    /// The tenant has as many as it may.
    Full,
    /// The count is to be read again first.
    Unknown,
}

#[derive(Default)]
pub(super) struct Tally {
    known: Mutex<HashMap<Option<Tenant>, Known>>,
}

struct Known {
    count: usize,
    at: Instant,
    /// The shards counted.
    shards: Vec<u32>,
}

impl Tally {
    /// Takes a place for a new series of `tenant` over `shards` against a
    /// bound of `share`, as it stands `now`.
    pub(super) fn reserve(
        &self,
        tenant: Option<&Tenant>,
        shards: &[u32],
        share: usize,
        now: Instant,
    ) -> Reserve {
        let mut known = self.lock();
        let Some(k) = known.get_mut(&tenant.cloned()) else { return Reserve::Unknown };
        let age = now.saturating_duration_since(k.at);
        if k.shards != shards || age >= RECOUNT_EVERY {
            return Reserve::Unknown;
        }
        if k.count < share {
            k.count += 1;
            Reserve::Taken
        } else if age < RECOUNT_FULL {
            Reserve::Full
        } else {
            Reserve::Unknown
        }
    }

    /// `tenant` has `count` series over `shards`, counted `at`; then as
    /// [`Tally::reserve`] against `share`: whether a place is taken.
    pub(super) fn counted(
        &self,
        tenant: Option<&Tenant>,
        shards: Vec<u32>,
        count: usize,
        share: usize,
        at: Instant,
    ) -> bool {
        let taken = count < share;
        self.lock().insert(tenant.cloned(), Known { count: count + usize::from(taken), at, shards });
        taken
    }

    /// A series of `tenant` was deleted, or a place taken was not used.
    pub(super) fn removed(&self, tenant: Option<&Tenant>) {
        if let Some(k) = self.lock().get_mut(&tenant.cloned()) {
            k.count = k.count.saturating_sub(1);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Option<Tenant>, Known>> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_taken_up_to_the_bound_and_the_count_read_again_when_stale_full_or_moved() {
        let tally = Tally::default();
        let acme = Tenant::parse("acme").unwrap();
        let t = Some(&acme);
        let t0 = Instant::now();
        assert_eq!(tally.reserve(t, &[0], 10, t0), Reserve::Unknown, "never counted");
        assert!(tally.counted(t, vec![0], 7, 10, t0), "counted, and a place taken");
        assert_eq!(tally.reserve(t, &[0], 10, t0), Reserve::Taken);
        assert_eq!(tally.reserve(None, &[0], 10, t0), Reserve::Unknown, "each tenant apart");
        assert_eq!(tally.reserve(t, &[0, 1], 10, t0), Reserve::Unknown, "the shards served changed");
        assert_eq!(tally.reserve(t, &[0], 10, t0), Reserve::Taken, "the last place");
        assert_eq!(tally.reserve(t, &[0], 10, t0), Reserve::Full, "full: refused for a second");
        assert_eq!(tally.reserve(t, &[0], 10, t0 + RECOUNT_FULL), Reserve::Unknown, "then counted again");
        tally.removed(t);
        assert_eq!(tally.reserve(t, &[0], 10, t0 + RECOUNT_FULL), Reserve::Taken, "a place given back");
        assert_eq!(tally.reserve(t, &[0], 10, t0 + RECOUNT_EVERY), Reserve::Unknown, "stale");
        assert!(!tally.counted(t, vec![0], 10, 10, t0 + RECOUNT_EVERY), "counted full");
        assert_eq!(tally.reserve(t, &[0], 10, t0 + RECOUNT_EVERY), Reserve::Full);
    }
}
