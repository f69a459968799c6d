//! What lets the dispatcher produce: nothing stands in a standalone
//! store's way ([`AlwaysOpen`]); in cluster mode, the node's lease and the
//! log's owner of the shard do.

/// Whether a shard's dispatcher may produce now, and how it came by the
/// shard.
pub(crate) trait Gate: Send + Sync {
    /// Whether it may produce now.
    fn open(&self) -> bool;

    /// Whether the shard is this node's by a claim in the log, which
    /// another node may take over (cluster mode), rather than this
    /// process's alone. Then a transactional producer that stops before it
    /// is ready is tried again while the gate is open, rather than stopping
    /// the node, and what the shard's last dispatcher may have produced
    /// without recording it is searched for as after a claim, rather than
    /// as after an unclean stop.
    fn claimed(&self) -> bool;

    /// Cluster mode: the shard's last owner released it with nothing in
    /// doubt, just before this node claimed it; then nothing is searched
    /// for on the topics. Said once: asked again (the shard taken back
    /// after a fence), false.
    fn released_clean(&self) -> bool {
        false
    }

    /// The dispatcher stopped; `clean`: nothing it produced is in doubt
    /// (every produce answered, every outcome handed to the recorder).
    fn stopped(&self, _clean: bool) {}
}

/// Standalone: the store is this process's alone, and nothing keeps its
/// dispatcher from producing.
pub(crate) struct AlwaysOpen;

impl Gate for AlwaysOpen {
    fn open(&self) -> bool {
        true
    }

    fn claimed(&self) -> bool {
        false
    }
}
