//! How often tokens may be tried at the sign-in form: a few attempts per
//! peer ([`SIGN_INS_PER_PEER`], then one per [`PEER_REFILL`]), and a few
//! failed attempts across all peers ([`FAILURES`], then one per
//! [`FAILURE_REFILL`]), so that guessing a token from many addresses is as
//! slow as from one. Both are token buckets over a time the caller gives,
//! so tests need no clock. This decides; it does not answer (the sign-in
//! handler turns a wait into `429` and `Retry-After`).

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::Mutex,
    time::{Duration, Instant},
};

/// Sign-in attempts one peer may make at once; then one per [`PEER_REFILL`].
pub(super) const SIGN_INS_PER_PEER: u32 = 10;
pub(super) const PEER_REFILL: Duration = Duration::from_secs(6);
/// Failed sign-ins across all peers at once; then one per [`FAILURE_REFILL`].
pub(super) const FAILURES: u32 = 60;
pub(super) const FAILURE_REFILL: Duration = Duration::from_secs(1);
/// Peers remembered at most: past it, those whose bucket is full again are
/// forgotten, and if none is, a new peer waits like an exhausted one.
const MAX_PEERS: usize = 10_000;

/// A bucket of `size` attempts that gains one every `refill`.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    /// When the bucket will be full again; at or before now, it is full.
    full_at: Instant,
}

impl Bucket {
    fn full(now: Instant) -> Bucket {
        Bucket { full_at: now }
    }

    /// Takes one attempt, or says how long until there is one.
    fn take(&mut self, size: u32, refill: Duration, now: Instant) -> Result<(), Duration> {
        let full_at = self.full_at.max(now) + refill;
        let room = refill * size;
        match (full_at - now).checked_sub(room) {
            Some(wait) if !wait.is_zero() => Err(wait),
            _ => {
                self.full_at = full_at;
                Ok(())
            }
        }
    }

    /// How long until an attempt could be taken (zero: now).
    fn wait(&self, size: u32, refill: Duration, now: Instant) -> Duration {
        let mut copy = *self;
        copy.take(size, refill, now).err().unwrap_or_default()
    }

    fn is_full(&self, now: Instant) -> bool {
        self.full_at <= now
    }
}

/// The sign-in attempts made lately.
pub(super) struct Attempts {
    peers: Mutex<HashMap<IpAddr, Bucket>>,
    failures: Mutex<Bucket>,
}

impl Attempts {
    pub(super) fn new(now: Instant) -> Attempts {
        Attempts { peers: Mutex::new(HashMap::new()), failures: Mutex::new(Bucket::full(now)) }
    }

    /// An attempt from `peer` (a [`super::serve::peer_key`]): allowed, or
    /// how long to wait. Counts against the peer whether it succeeds or not;
    /// refused while failures overall are exhausted.
    pub(super) fn begin(&self, peer: IpAddr, now: Instant) -> Result<(), Duration> {
        let failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let wait = failures.wait(FAILURES, FAILURE_REFILL, now);
        drop(failures);
        if !wait.is_zero() {
            return Err(wait);
        }
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        if peers.len() >= MAX_PEERS && !peers.contains_key(&peer) {
            peers.retain(|_, bucket| !bucket.is_full(now));
            if peers.len() >= MAX_PEERS {
                return Err(PEER_REFILL);
            }
        }
        peers.entry(peer).or_insert_with(|| Bucket::full(now)).take(SIGN_INS_PER_PEER, PEER_REFILL, now)
    }

    /// An attempt failed (a token not valid, too short).
    pub(super) fn failed(&self, now: Instant) {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        // Already exhausted (attempts that began together): it stays so.
        let _ = failures.take(FAILURES, FAILURE_REFILL, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_peer_has_a_few_attempts_then_one_per_refill() {
        let t0 = Instant::now();
        let attempts = Attempts::new(t0);
        for _ in 0..SIGN_INS_PER_PEER {
            attempts.begin(ip("10.0.0.1"), t0).unwrap();
        }
        assert_eq!(attempts.begin(ip("10.0.0.1"), t0), Err(PEER_REFILL));
        assert_eq!(attempts.begin(ip("10.0.0.1"), t0 + PEER_REFILL / 2), Err(PEER_REFILL / 2));
        assert!(attempts.begin(ip("10.0.0.2"), t0).is_ok(), "another peer has its own");
        attempts.begin(ip("10.0.0.1"), t0 + PEER_REFILL).unwrap();
        assert!(attempts.begin(ip("10.0.0.1"), t0 + PEER_REFILL).is_err(), "one per refill");
        for _ in 0..SIGN_INS_PER_PEER {
            attempts.begin(ip("10.0.0.1"), t0 + PEER_REFILL * 100).unwrap();
        }
    }

    #[test]
    fn failures_from_many_peers_stop_every_attempt_for_a_while() {
        let t0 = Instant::now();
        let attempts = Attempts::new(t0);
        for i in 0..FAILURES {
            let peer = ip(&format!("10.0.{}.{}", i / 200, i % 200));
            attempts.begin(peer, t0).unwrap();
            attempts.failed(t0);
        }
        assert_eq!(attempts.begin(ip("10.9.9.9"), t0), Err(FAILURE_REFILL), "a fresh peer too");
        attempts.begin(ip("10.9.9.9"), t0 + FAILURE_REFILL).unwrap();
    }
}
