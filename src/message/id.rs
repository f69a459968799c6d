//! Message ids: what a client chose or the server generated, in the id
//! space of a tenant or the shared one.

use super::{Invalid, Tenant};
use std::fmt;

/// A message's identity: the id a client chose (its idempotency key) or the
/// server generated, in the id space it belongs to.
///
/// Each tenant (see [`Tenant`]) has an id space of its own, so the same id
/// chosen by two tenants names two messages. Messages scheduled without a
/// tenant (authentication off, or by a release from before tenants) live in
/// the shared space. The stored form is the id alone in the shared space,
/// and `\0 tenant \0 id` in a tenant's: client ids are printable ASCII, so
/// the two can never collide.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId {
    key: String,
    /// Where the client's id starts in `key`.
    id_at: usize,
}

impl MessageId {
    pub const MAX_LEN: usize = 128;

    /// Accepts a client-chosen id in the shared space: 1 to 128 printable
    /// ASCII characters, no spaces, so ids are safe in logs, terminals and
    /// URLs.
    pub fn parse(id: &str) -> Result<Self, Invalid> {
        Self::parse_in(None, id)
    }

    /// A client-chosen id in `tenant`'s space (the shared one for none).
    pub fn parse_in(tenant: Option<&Tenant>, id: &str) -> Result<Self, Invalid> {
        if id.is_empty() {
            return Err(Invalid::new(
                "id",
                "must not be empty (a Schedule without one gets one from the server)",
            ));
        }
        if id.len() > Self::MAX_LEN {
            return Err(Invalid::new(
                "id",
                format!("is {} bytes long; the limit is {}", id.len(), Self::MAX_LEN),
            ));
        }
        if let Some(c) = id.chars().find(|c| !c.is_ascii_graphic()) {
            return Err(Invalid::new("id", format!("contains {c:?}; use printable ASCII without spaces")));
        }
        Ok(Self::in_space(tenant, id))
    }

    fn in_space(tenant: Option<&Tenant>, id: &str) -> Self {
        match tenant {
            None => MessageId { key: id.to_owned(), id_at: 0 },
            Some(t) => {
                let key = format!("\0{}\0{id}", t.as_str());
                MessageId { id_at: t.as_str().len() + 2, key }
            }
        }
    }

    /// A new unique id that sorts by creation time (a ULID), in `tenant`'s
    /// space.
    pub fn generate(generator: &mut ulid::Generator, tenant: Option<&Tenant>) -> Self {
        let ulid = generator.generate().unwrap_or_else(|_| ulid::Ulid::new());
        Self::in_space(tenant, &ulid.to_string())
    }

    /// An id read back from the store, where it was validated on the way in.
    pub(crate) fn from_stored(bytes: &[u8]) -> Option<Self> {
        let key = std::str::from_utf8(bytes).ok()?;
        Self::id_at(key).map(|id_at| MessageId { key: key.to_owned(), id_at })
    }

    /// [`Self::from_stored`], keeping the buffer it was decoded into.
    pub(crate) fn from_stored_vec(bytes: Vec<u8>) -> Option<Self> {
        let key = String::from_utf8(bytes).ok()?;
        Self::id_at(&key).map(|id_at| MessageId { key, id_at })
    }

    /// Whether `bytes` are an id's stored form, without making the id.
    pub(crate) fn is_stored_form(bytes: &[u8]) -> bool {
        std::str::from_utf8(bytes).ok().and_then(Self::id_at).is_some()
    }

    /// Where the client's id starts in a stored key, if it is one.
    fn id_at(key: &str) -> Option<usize> {
        let id_at = match key.strip_prefix('\0') {
            None => 0,
            Some(rest) => rest.find('\0')? + 2,
        };
        (id_at < key.len()).then_some(id_at)
    }

    /// The id as the client knows it, without its space.
    pub fn as_str(&self) -> &str {
        &self.key[self.id_at..]
    }

    /// The tenant whose space the id is in; none for the shared space.
    pub fn tenant(&self) -> Option<&str> {
        (self.id_at > 0).then(|| &self.key[1..self.id_at - 1])
    }

    /// The same id in the shared space.
    pub fn shared(&self) -> MessageId {
        Self::in_space(None, self.as_str())
    }

    /// The stored form: what the store keys the message by.
    pub fn as_bytes(&self) -> &[u8] {
        self.key.as_bytes()
    }

    /// `tenant/id` for logs; the bare id in the shared space.
    pub fn qualified(&self) -> String {
        match self.tenant() {
            Some(t) => format!("{t}/{}", self.as_str()),
            None => self.as_str().to_owned(),
        }
    }
}

/// The client's id; see [`MessageId::qualified`] for logs.
impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether `id` has the form of a series occurrence's id: `<series>@<ms>`
/// or `<series>@<ms>.<n>` (a series id has no `@`; `ms` and `n` are
/// digits). The form is the series driver's: a client may not schedule a
/// message under it, or it could take an occurrence's id before the
/// occurrence is parked, and its record would go out instead.
pub fn occurrence_form(id: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let Some((series, at)) = id.split_once('@') else { return false };
    let at = at.split_once('.').map_or(at, |(ms, n)| if digits(n) { ms } else { "" });
    !series.is_empty() && digits(at)
}

/// The shard an id belongs to among `shards`: Kafka's Java client's rule
/// for keys, `toPositive(murmur2(key)) % n`, over the id's text.
pub fn shard_of(id: &MessageId, shards: u32) -> u32 {
    (murmur2(id.as_str().as_bytes()) as u32 & 0x7fff_ffff) % shards.max(1)
}

/// MurmurHash2 as Kafka's Java client computes it (seed `0x9747b28c`,
/// little-endian words).
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h = SEED ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M) ^ k;
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        for (i, byte) in tail.iter().enumerate().rev() {
            h ^= u32::from(*byte) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}
