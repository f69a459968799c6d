//! The cluster key, and what it authenticates: the seal of each record a
//! node writes to the schedule log or the routing topic, and the vouch on
//! each call one node passes on to another.
//!
//! Every node of a cluster reads the same secret, the cluster key
//! (`--cluster-key-file`). Each record a node writes to either topic
//! carries, in the [`SEAL_HEADER`], an HMAC-SHA256 with that key over the
//! topic, the partition, the key and the value (a tombstone's absence of
//! one included). A record that claims to be hourglass's own and carries
//! no valid seal is refused, counted and logged, whoever could write it:
//! a producer without a Kafka ACL against it, or on a broker that has no
//! ACLs, cannot take a shard, settle a message or route requests.
//!
//! A seal says that a node of the cluster wrote the record, not when: a
//! record the cluster wrote can be written again by whoever may write the
//! topic, and a record under a key the cluster uses makes compaction drop
//! the cluster's own. Only hourglass may write the two topics (the ACLs
//! are in docs/CLUSTER.md); the seal is what holds where that is not so.

use std::{fmt, path::Path};

use ring::hmac;

/// The header of a seal: 32 bytes.
pub const SEAL_HEADER: &str = "hourglass-seal";

/// The fewest bytes a cluster key may have: 32, as `openssl rand -hex 16`
/// prints.
pub const MIN_KEY_BYTES: usize = 32;

/// The cluster's shared secret. `Debug` never shows it.
#[derive(Clone)]
pub struct ClusterKey(hmac::Key);

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error(
        "cluster key file {path}: {reason}; make one with `openssl rand -hex 32 > {path}` and give every \
         node of the cluster the same file"
    )]
    File { path: String, reason: String },
    #[error("holds {bytes} bytes; a cluster key has at least {MIN_KEY_BYTES}")]
    Short { bytes: usize },
}

impl ClusterKey {
    /// The key in the file at `path`: its contents, without the whitespace
    /// around them, at least [`MIN_KEY_BYTES`] long.
    pub fn load(path: &Path) -> Result<ClusterKey, KeyError> {
        let fail = |reason: String| KeyError::File { path: path.display().to_string(), reason };
        let bytes = std::fs::read(path).map_err(|e| fail(format!("cannot be read: {e}")))?;
        ClusterKey::new(bytes.trim_ascii()).map_err(|e| fail(e.to_string()))
    }

    /// A key from the secret itself.
    pub fn new(secret: &[u8]) -> Result<ClusterKey, KeyError> {
        if secret.len() < MIN_KEY_BYTES {
            return Err(KeyError::Short { bytes: secret.len() });
        }
        Ok(ClusterKey(hmac::Key::new(hmac::HMAC_SHA256, secret)))
    }

    /// A key of a secret nobody knows, made afresh: no record's seal
    /// verifies with it.
    pub fn nobodys() -> ClusterKey {
        let random = ring::rand::SystemRandom::new();
        ClusterKey(hmac::Key::generate(hmac::HMAC_SHA256, &random).expect("the system gives random bytes"))
    }

    /// The seal of a record of `topic`.
    pub fn seal(&self, topic: &str, partition: i32, key: Option<&[u8]>, value: Option<&[u8]>) -> Vec<u8> {
        self.partition(topic, partition).seal(key, value)
    }

    /// Whether `seal` is the seal of the record (in constant time).
    pub fn verifies(
        &self,
        topic: &str,
        partition: i32,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        seal: Option<&[u8]>,
    ) -> bool {
        self.partition(topic, partition).verifies(key, value, seal)
    }

    /// What seals the records of one partition: the seal's first parts
    /// taken in once, for a reader or writer of many of its records.
    pub fn partition(&self, topic: &str, partition: i32) -> PartitionSeal {
        let mut context = hmac::Context::with_key(&self.0);
        for part in ["record".as_bytes(), topic.as_bytes(), &partition.to_be_bytes()] {
            take_in(&mut context, Some(part));
        }
        PartitionSeal(context)
    }

    /// The tag of `parts` for `purpose` (each part absent, or of a length,
    /// so that no two lists of parts share a text; the purpose keeps a tag
    /// made for one thing from passing for another).
    pub fn tag(&self, purpose: &str, parts: &[Option<&[u8]>]) -> Vec<u8> {
        let mut context = hmac::Context::with_key(&self.0);
        for part in std::iter::once(Some(purpose.as_bytes())).chain(parts.iter().copied()) {
            take_in(&mut context, part);
        }
        context.sign().as_ref().to_vec()
    }

    /// Whether `tag` is the tag of `parts` for `purpose` (in constant time).
    pub fn verifies_tag(&self, purpose: &str, parts: &[Option<&[u8]>], tag: &[u8]) -> bool {
        same(&self.tag(purpose, parts), tag)
    }
}

/// The seals of the records of one partition of a topic
/// ([`ClusterKey::partition`]): each the same as [`ClusterKey::seal`] makes.
#[derive(Clone)]
pub struct PartitionSeal(hmac::Context);

impl PartitionSeal {
    /// The seal of a record of the partition.
    pub fn seal(&self, key: Option<&[u8]>, value: Option<&[u8]>) -> Vec<u8> {
        let mut context = self.0.clone();
        take_in(&mut context, key);
        take_in(&mut context, value);
        context.sign().as_ref().to_vec()
    }

    /// Whether `seal` is the seal of the record (in constant time).
    pub fn verifies(&self, key: Option<&[u8]>, value: Option<&[u8]>, seal: Option<&[u8]>) -> bool {
        seal.is_some_and(|seal| same(&self.seal(key, value), seal))
    }
}

impl fmt::Debug for PartitionSeal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PartitionSeal([redacted])")
    }
}

/// Takes in one part of a tag: a mark of whether it is there, its length
/// and its bytes, in one update (each costs a copy into the hash's block).
fn take_in(context: &mut hmac::Context, part: Option<&[u8]>) {
    match part {
        None => context.update(&[0]),
        Some(bytes) => {
            let mut head = [1; 9];
            head[1..].copy_from_slice(&(bytes.len() as u64).to_be_bytes());
            context.update(&head);
            context.update(bytes);
        }
    }
}

/// Whether `made` and `given` are the same, every byte compared whichever
/// differs: how long it takes says nothing of how much of a forged tag was
/// right.
fn same(made: &[u8], given: &[u8]) -> bool {
    let differ = made.iter().zip(given).fold(0u8, |differ, (a, b)| differ | (a ^ b));
    std::hint::black_box(differ) == 0 && made.len() == given.len()
}

impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterKey([redacted])")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(secret: &str) -> ClusterKey {
        ClusterKey::new(secret.as_bytes()).unwrap()
    }

    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn a_seal_verifies_only_the_record_it_was_made_for() {
        let k = key(SECRET);
        let seal = k.seal("log", 3, Some(b"id-1"), Some(b"value"));
        assert_eq!(seal.len(), 32);
        assert!(k.verifies("log", 3, Some(b"id-1"), Some(b"value"), Some(&seal)));
        for (topic, partition, id, value) in [
            ("log-owners", 3, Some(&b"id-1"[..]), Some(&b"value"[..])),
            ("log", 4, Some(b"id-1"), Some(b"value")),
            ("log", 3, Some(b"id-2"), Some(b"value")),
            ("log", 3, Some(b"id-1"), Some(b"valuf")),
            ("log", 3, Some(b"id-1"), None),
            ("log", 3, None, Some(b"value")),
        ] {
            assert!(
                !k.verifies(topic, partition, id, value, Some(&seal)),
                "{topic} {partition} {id:?} {value:?}"
            );
        }
        assert!(!k.verifies("log", 3, Some(b"id-1"), Some(b"value"), None), "no seal");
        assert!(!k.verifies("log", 3, Some(b"id-1"), Some(b"value"), Some(&seal[..31])), "a cut seal");
    }

    #[test]
    fn a_partition_s_seals_are_the_key_s() {
        let k = key(SECRET);
        let partition = k.partition("log", 3);
        for (id, value) in
            [(Some(&b"id-1"[..]), Some(&b"value"[..])), (Some(b"id-1"), None), (None, Some(b""))]
        {
            let seal = partition.seal(id, value);
            assert_eq!(seal, k.seal("log", 3, id, value));
            assert!(partition.verifies(id, value, Some(&seal)));
            assert!(!k.partition("log", 4).verifies(id, value, Some(&seal)), "another partition");
            assert!(!k.partition("log-owners", 3).verifies(id, value, Some(&seal)), "another topic");
        }
        assert!(!partition.verifies(Some(b"id-1"), Some(b"value"), None), "no seal");
    }

    #[test]
    fn a_seal_is_the_documented_hmac() {
        // HMAC-SHA256 over each part as 1, its length (8 bytes, big-endian)
        // and its bytes, or 0 for one absent: "record", the topic, the
        // partition (4 bytes, big-endian), the key, the value. Every node
        // of a cluster, whatever its version, must make the same.
        let seal = key(SECRET).seal("log", 3, Some(b"id-1"), Some(b"value"));
        let hex: String = seal.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, "4e8933840cc2d8b4bb49d30a8624a1b4ae23f32eef89d3a8c30083bb1cea5923");
    }

    #[test]
    fn a_tombstone_and_an_empty_value_are_sealed_apart() {
        let k = key(SECRET);
        let tombstone = k.seal("log", 0, Some(b"k"), None);
        assert!(k.verifies("log", 0, Some(b"k"), None, Some(&tombstone)));
        assert!(!k.verifies("log", 0, Some(b"k"), Some(b""), Some(&tombstone)));
        let moved = k.seal("log", 0, Some(b"ab"), Some(b"c"));
        assert!(
            !k.verifies("log", 0, Some(b"a"), Some(b"bc"), Some(&moved)),
            "bytes moved from key to value"
        );
    }

    #[test]
    fn a_tag_is_bound_to_its_purpose_and_parts() {
        let k = key(SECRET);
        let tag = k.tag("vouch", &[Some(b"orders"), Some(b"17")]);
        assert!(k.verifies_tag("vouch", &[Some(b"orders"), Some(b"17")], &tag));
        assert!(!k.verifies_tag("record", &[Some(b"orders"), Some(b"17")], &tag), "another purpose");
        assert!(!k.verifies_tag("vouch", &[Some(b"orders1"), Some(b"7")], &tag), "bytes moved between parts");
        assert!(!k.verifies_tag("vouch", &[None, Some(b"17")], &tag));
    }

    #[test]
    fn another_cluster_s_key_does_not_verify() {
        let seal = key(SECRET).seal("log", 0, Some(b"k"), Some(b"v"));
        let other = key("fedcba9876543210fedcba9876543210");
        assert!(!other.verifies("log", 0, Some(b"k"), Some(b"v"), Some(&seal)));
    }

    #[test]
    fn a_short_or_missing_key_file_is_refused_with_how_to_make_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.key");
        let missing = ClusterKey::load(&path).unwrap_err().to_string();
        assert!(missing.contains("cannot be read") && missing.contains("openssl rand -hex 32"), "{missing}");
        std::fs::write(&path, "short\n").unwrap();
        let short = ClusterKey::load(&path).unwrap_err().to_string();
        assert!(short.contains("holds 5 bytes"), "{short}");
        std::fs::write(&path, format!("  {SECRET}\n")).unwrap();
        let loaded = ClusterKey::load(&path).unwrap();
        let seal = key(SECRET).seal("t", 0, None, None);
        assert!(loaded.verifies("t", 0, None, None, Some(&seal)), "the whitespace around it is not the key");
        assert!(!format!("{loaded:?}").contains(SECRET));
    }
}
