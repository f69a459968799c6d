//! Listings: where a page goes on, what to list, pages merged across
//! shards, and the counts of `Stats`.

use super::{Invalid, PendingMessage, Selector, UnixMillis, validate_topic_name};

/// Where a listing goes on: the position of the first message not yet
/// looked at, in the order listings follow (dispatch time, then shard, then
/// acceptance). Opaque to clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PageToken {
    pub dispatch_at: UnixMillis,
    /// Which of the node's shards; 0 on a node of one.
    pub shard: u32,
    pub seq: u64,
}

impl PageToken {
    /// Hex of version 1, the time and the sequence (big-endian): what a
    /// node of one shard issues, as every earlier release did.
    const V1: u8 = 1;
    /// Hex of version 2, the time, the shard and the sequence.
    const V2: u8 = 2;

    pub fn encode(self) -> String {
        let mut bytes = Vec::with_capacity(21);
        if self.shard == 0 {
            bytes.push(Self::V1);
            bytes.extend_from_slice(&self.dispatch_at.0.to_be_bytes());
        } else {
            bytes.push(Self::V2);
            bytes.extend_from_slice(&self.dispatch_at.0.to_be_bytes());
            bytes.extend_from_slice(&self.shard.to_be_bytes());
        }
        bytes.extend_from_slice(&self.seq.to_be_bytes());
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn decode(token: &str) -> Result<PageToken, Invalid> {
        let bad = || {
            Invalid::new(
                "page_token",
                "is not a token this server issued; pass next_page_token unchanged, or leave it empty for \
                 the first page",
            )
        };
        // Only what `encode` writes: 34 (version 1) or 42 (version 2)
        // lowercase hex digits.
        if !matches!(token.len(), 34 | 42) || !token.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(bad());
        }
        let bytes = (0..token.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&token[i..i + 2], 16))
            .collect::<Result<Vec<u8>, _>>()
            .map_err(|_| bad())?;
        let u64_at =
            |at: usize| bytes.get(at..at + 8).and_then(|b| b.try_into().ok()).map(u64::from_be_bytes);
        let (shard, seq_at) = match (bytes[0], bytes.len()) {
            (Self::V1, 17) => (0, 9),
            (Self::V2, 21) => {
                let shard = bytes[9..13].try_into().map(u32::from_be_bytes).map_err(|_| bad())?;
                // Shard 0 is written as version 1.
                (if shard == 0 { return Err(bad()) } else { shard }, 13)
            }
            _ => return Err(bad()),
        };
        Ok(PageToken {
            dispatch_at: UnixMillis(u64_at(1).ok_or_else(bad)?),
            shard,
            seq: u64_at(seq_at).ok_or_else(bad)?,
        })
    }
}

/// Which pending messages to list, and where to go on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListQuery {
    pub topic: Option<String>,
    /// Dispatch time at or after this.
    pub from: Option<UnixMillis>,
    /// Dispatch time before this.
    pub to: Option<UnixMillis>,
    /// 0: the default.
    pub page_size: u32,
    pub page_token: Option<PageToken>,
    /// Only messages whose labels match (empty: all).
    pub selector: Selector,
}

impl ListQuery {
    pub const DEFAULT_PAGE_SIZE: usize = 100;
    pub const MAX_PAGE_SIZE: usize = 1000;

    /// Checks the query; returns the page size to use.
    pub fn validate(&self) -> Result<usize, Invalid> {
        if let Some(topic) = &self.topic {
            validate_topic_name(topic).map_err(|e| Invalid::new("topic", e.reason))?;
        }
        if let (Some(from), Some(to)) = (self.from, self.to)
            && to <= from
        {
            return Err(Invalid::new(
                "dispatch_to",
                format!("{} is not after dispatch_from {}", to.to_rfc3339(), from.to_rfc3339()),
            ));
        }
        match self.page_size as usize {
            0 => Ok(Self::DEFAULT_PAGE_SIZE),
            n if n > Self::MAX_PAGE_SIZE => {
                Err(Invalid::new("page_size", format!("is {n}; the most is {}", Self::MAX_PAGE_SIZE)))
            }
            n => Ok(n),
        }
    }
}

/// One page of a listing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PendingPage {
    pub messages: Vec<PendingMessage>,
    /// Where each message is in the listing's order (for merging pages of
    /// several nodes).
    pub positions: Vec<PageToken>,
    /// Where the next page starts; none when the listing is complete.
    pub next: Option<PageToken>,
}

/// Pages read from several places (shards, nodes) as one, in position
/// order: what every place read (each up to where its own page stopped,
/// its `next`), at most `limit` messages and about `max_key_bytes` of
/// keys. Returns the messages with their positions, and where the next
/// page starts.
#[allow(clippy::type_complexity)]
pub fn merge_pages<M>(
    pages: Vec<(Vec<(PageToken, M)>, Option<PageToken>)>,
    limit: usize,
    max_key_bytes: usize,
    key_bytes_of: impl Fn(&M) -> usize,
) -> (Vec<(PageToken, M)>, Option<PageToken>) {
    // Everything before the first place a page stopped was read by all.
    let read_to = pages.iter().filter_map(|(_, next)| *next).min();
    let mut all: Vec<(PageToken, M)> = pages
        .into_iter()
        .flat_map(|(messages, _)| messages)
        .filter(|(at, _)| read_to.is_none_or(|end| *at < end))
        .collect();
    all.sort_by_key(|(at, _)| *at);
    let mut key_bytes = 0;
    let mut out = Vec::with_capacity(all.len().min(limit));
    for (at, message) in all {
        if out.len() >= limit || key_bytes >= max_key_bytes {
            return (out, Some(at));
        }
        key_bytes += key_bytes_of(&message);
        out.push((at, message));
    }
    (out, read_to)
}

/// What `Stats` reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stats {
    pub as_of: UnixMillis,
    pub pending: u64,
    /// Since the store was created, purged messages included.
    pub delivered: u64,
    pub cancelled: u64,
    pub failed: u64,
    pub expired: u64,
    pub dead_lettered: u64,
    pub dispatching: u64,
    /// The pending message longest past its dispatch time.
    pub oldest_overdue: Option<PendingMessage>,
    pub store_bytes: u64,
    pub max_pending: Option<u64>,
    /// Topics a dispatch policy holds back now.
    pub held_back: Vec<HeldBack>,
}

/// A topic (for every tenant, or one) whose due messages a dispatch policy
/// holds back: since when, and the earliest due among them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldBack {
    pub topic: String,
    /// None: the topic's policy for every tenant.
    pub tenant: Option<super::Tenant>,
    pub paused: bool,
    pub since: UnixMillis,
    pub oldest_due: UnixMillis,
}

impl HeldBack {
    /// Adds what another shard holds of the same lane.
    pub fn merge(all: &mut Vec<HeldBack>, more: impl IntoIterator<Item = HeldBack>) {
        for held in more {
            match all.iter_mut().find(|h| h.topic == held.topic && h.tenant == held.tenant) {
                Some(h) => {
                    h.paused |= held.paused;
                    h.since = h.since.min(held.since);
                    h.oldest_due = h.oldest_due.min(held.oldest_due);
                }
                None => all.push(held),
            }
        }
        all.sort_by(|a, b| (&a.topic, &a.tenant).cmp(&(&b.topic, &b.tenant)));
    }
}
