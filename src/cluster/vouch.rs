//! Calls passed between the nodes of a cluster. The node a caller reaches
//! checks the caller's token; if another node serves the call, it passes
//! the call on without the token, naming the grant it found, and vouches
//! for it with the cluster key. The node that serves it checks the vouch
//! and uses its own grant of that name (every node has the same tokens
//! file). So a caller's token never leaves the node it called, and no one
//! without the cluster key can pass a call off as another node's.
//!
//! ```text
//! hourglass-forwarded   1: served here or refused, never passed on again
//! hourglass-grant-bin   the caller's grant's name (absent: the node lets every call in)
//! hourglass-vouch-at    when the vouch was made, Unix milliseconds
//! hourglass-vouch-bin   a tag with the cluster key over the grant and the time
//! ```
//!
//! A vouch more than [`VOUCH_WITHIN`] from the serving node's clock is
//! refused, which bounds how long one seen on the wire (a cluster without
//! TLS) can be used again.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tonic::metadata::{AsciiMetadataValue, BinaryMetadataValue, MetadataMap};

use super::log::seal::ClusterKey;
use crate::{
    auth::{Access, Vouch, Vouches},
    scheduler::{Call, FORWARDED},
};

const GRANT: &str = "hourglass-grant-bin";
const VOUCH_AT: &str = "hourglass-vouch-at";
const VOUCH: &str = "hourglass-vouch-bin";
/// The purpose of a vouch's tag (see [`ClusterKey::tag`]).
const PURPOSE: &str = "forward";

/// How far a vouch's time may be from the serving node's clock: the
/// nodes' clocks may differ by this much.
pub(super) const VOUCH_WITHIN: Duration = Duration::from_secs(300);

/// Makes and checks vouches with the cluster key.
pub struct Voucher {
    key: ClusterKey,
}

impl Voucher {
    pub fn new(key: ClusterKey) -> Voucher {
        Voucher { key }
    }

    /// `message` as `call` passes it on to another node: vouched for, with
    /// the caller's grant, and given what is left of the caller's deadline
    /// (at most `timeout`).
    pub fn request<T>(&self, call: &Call, message: T, timeout: Duration) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        let left = call.deadline.map(|d| d.saturating_duration_since(tokio::time::Instant::now()));
        request.set_timeout(left.map_or(timeout, |left| left.min(timeout)));
        let grant = match &call.access {
            Access::Open => None,
            Access::Granted { grant, .. } => Some(grant.name.as_str()),
        };
        self.vouch_for(grant, request.metadata_mut());
        request
    }

    /// Marks `metadata` as that of a call this node passes on for the
    /// caller whose grant is `grant` (none: every call is let in here).
    pub fn vouch_for(&self, grant: Option<&str>, metadata: &mut MetadataMap) {
        self.vouch_at(grant, now_ms(), metadata);
    }

    fn vouch_at(&self, grant: Option<&str>, at: u64, metadata: &mut MetadataMap) {
        let at = at.to_string();
        let tag = self.key.tag(PURPOSE, &[grant.map(str::as_bytes), Some(at.as_bytes())]);
        metadata.insert(FORWARDED, AsciiMetadataValue::from_static("1"));
        if let Some(grant) = grant {
            metadata.insert_bin(GRANT, BinaryMetadataValue::from_bytes(grant.as_bytes()));
        }
        metadata.insert(VOUCH_AT, AsciiMetadataValue::try_from(at.as_str()).expect("digits are ASCII"));
        metadata.insert_bin(VOUCH, BinaryMetadataValue::from_bytes(&tag));
    }

    fn check(&self, metadata: &MetadataMap, now: u64) -> Vouch {
        if !metadata.contains_key(FORWARDED) {
            return Vouch::None;
        }
        let refused = |why: &str| Vouch::Refused(why.to_owned());
        let (Some(at), Some(tag)) = (metadata.get(VOUCH_AT), metadata.get_bin(VOUCH)) else {
            return refused("it carries no vouch of a node of this cluster");
        };
        let (Ok(at_text), Ok(tag)) = (at.to_str(), tag.to_bytes()) else {
            return refused("its vouch does not read");
        };
        let grant = match metadata.get_bin(GRANT).map(|g| g.to_bytes()) {
            None => None,
            Some(Ok(bytes)) => match String::from_utf8(bytes.to_vec()) {
                Ok(name) => Some(name),
                Err(_) => return refused("its vouch does not read"),
            },
            Some(Err(_)) => return refused("its vouch does not read"),
        };
        if !self.key.verifies_tag(
            PURPOSE,
            &[grant.as_deref().map(str::as_bytes), Some(at_text.as_bytes())],
            &tag,
        ) {
            return refused(
                "its vouch is not one of a node of this cluster (or the nodes' --cluster-key-file differ)",
            );
        }
        let Ok(at) = at_text.parse::<u64>() else { return refused("its vouch does not read") };
        if now.abs_diff(at) > VOUCH_WITHIN.as_millis() as u64 {
            return refused("its vouch is too old, or this node's clock is far from the other's");
        }
        Vouch::For(grant)
    }
}

impl Vouches for Voucher {
    fn vouch(&self, metadata: &MetadataMap) -> Vouch {
        self.check(metadata, now_ms())
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn voucher(secret: &str) -> Voucher {
        Voucher::new(ClusterKey::new(secret.as_bytes()).unwrap())
    }

    const SECRET: &str = "0123456789abcdef0123456789abcdef";
    const NOW: u64 = 1_800_000_000_000;

    fn vouched(grant: Option<&str>, at: u64) -> MetadataMap {
        let mut metadata = MetadataMap::new();
        voucher(SECRET).vouch_at(grant, at, &mut metadata);
        metadata
    }

    #[test]
    fn a_vouch_names_the_grant_and_carries_no_token() {
        let metadata = vouched(Some("orders-service"), NOW);
        assert!(metadata.get("authorization").is_none());
        assert_eq!(voucher(SECRET).check(&metadata, NOW + 1_000), Vouch::For(Some("orders-service".into())));
        assert_eq!(voucher(SECRET).check(&vouched(None, NOW), NOW), Vouch::For(None), "authentication off");
        assert_eq!(voucher(SECRET).check(&MetadataMap::new(), NOW), Vouch::None, "not passed on");
    }

    #[test]
    fn a_vouch_from_elsewhere_is_refused() {
        let refused =
            |metadata: &MetadataMap| matches!(voucher(SECRET).check(metadata, NOW), Vouch::Refused(_));
        let mut marked = MetadataMap::new();
        marked.insert(FORWARDED, AsciiMetadataValue::from_static("1"));
        assert!(refused(&marked), "marked as passed on, with no vouch");
        let mut other = MetadataMap::new();
        voucher("fedcba9876543210fedcba9876543210").vouch_at(Some("ops"), NOW, &mut other);
        assert!(refused(&other), "another cluster's key");
        let mut changed = vouched(Some("orders-service"), NOW);
        changed.insert_bin(GRANT, BinaryMetadataValue::from_bytes(b"ops"));
        assert!(refused(&changed), "the grant changed after the vouch");
        let mut unvouched = vouched(Some("orders-service"), NOW);
        unvouched.remove_bin(GRANT);
        assert!(refused(&unvouched), "the grant dropped: not open access");
        let late = NOW - VOUCH_WITHIN.as_millis() as u64 - 1;
        assert!(refused(&vouched(Some("orders-service"), late)), "too old");
    }
}
