//! The domain: what a scheduled message is, its id, its due time, its states
//! and the limits a message must meet at the door.
//!
//! Plain types only. Nothing here does I/O, so validation and state
//! transitions are unit-tested without RocksDB or Kafka. Knowing whether a
//! topic exists needs the broker's metadata and lives in the service instead.

use std::{fmt, time::Duration};

/// Wall-clock milliseconds since the Unix epoch: the unit of every due time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UnixMillis(pub u64);

impl UnixMillis {
    pub fn saturating_add(self, d: Duration) -> Self {
        UnixMillis(self.0.saturating_add(duration_ms(d)))
    }

    /// How far `self` lies after `earlier`; zero when it does not.
    pub fn since(self, earlier: UnixMillis) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }

    /// RFC 3339 with milliseconds, for people reading logs and the CLI.
    pub fn to_rfc3339(self) -> String {
        let secs = (self.0 / 1000) as i64;
        let nanos = (self.0 % 1000) as u32 * 1_000_000;
        chrono::DateTime::from_timestamp(secs, nanos)
            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
            .unwrap_or_else(|| format!("{}ms", self.0))
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A setting's length of time as a flag takes it, in the one unit that
/// measures it exactly, the largest such: `1098days`, `10m`, `200ms`
/// (never `3years 2days 6h`, which reads back as something else).
pub fn duration_text(d: Duration) -> String {
    const UNITS: [(&str, u128); 7] = [
        ("days", 86_400_000_000_000),
        ("h", 3_600_000_000_000),
        ("m", 60_000_000_000),
        ("s", 1_000_000_000),
        ("ms", 1_000_000),
        ("us", 1_000),
        ("ns", 1),
    ];
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_owned();
    }
    let (unit, size) = UNITS.into_iter().find(|(_, size)| nanos % size == 0).unwrap_or(("ns", 1));
    format!("{}{unit}", nanos / size)
}

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
            return Err(Invalid::new("id", "must not be empty; omit it to let the server assign one"));
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
        let id_at = match key.strip_prefix('\0') {
            None => 0,
            Some(rest) => rest.find('\0')? + 2,
        };
        (id_at < key.len()).then(|| MessageId { key: key.to_owned(), id_at })
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

/// A tenant: whoever owns an id space of their own (see [`MessageId`]).
/// With authentication on, each token belongs to one (its name, unless the
/// tokens file groups several tokens under one tenant).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tenant(std::sync::Arc<str>);

impl Tenant {
    pub const MAX_LEN: usize = 64;

    /// 1 to 64 letters, digits, `.`, `_` or `-`.
    pub fn parse(name: &str) -> Result<Tenant, String> {
        if name.is_empty() || name.len() > Self::MAX_LEN {
            return Err(format!("a tenant name has 1 to {} characters", Self::MAX_LEN));
        }
        if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
            return Err(format!("tenant {name:?} contains {c:?}; use letters, digits, '.', '_' and '-'"));
        }
        Ok(Tenant(name.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// One topic pattern of a grant: an exact name, a prefix ending in `*`, or
/// `*` for every topic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TopicPattern {
    Any,
    Prefix(String),
    Exact(String),
}

impl TopicPattern {
    pub fn parse(pattern: &str) -> Result<TopicPattern, String> {
        let pattern = pattern.trim();
        if pattern == "*" {
            return Ok(TopicPattern::Any);
        }
        match pattern.strip_suffix('*') {
            _ if pattern.is_empty() => Err("an empty topic pattern".into()),
            Some(prefix) if !prefix.contains('*') => Ok(TopicPattern::Prefix(prefix.to_owned())),
            None if !pattern.contains('*') => Ok(TopicPattern::Exact(pattern.to_owned())),
            _ => Err(format!("topic pattern {pattern:?}: `*` may only end a pattern")),
        }
    }

    pub fn matches(&self, topic: &str) -> bool {
        match self {
            TopicPattern::Any => true,
            TopicPattern::Prefix(prefix) => topic.starts_with(prefix.as_str()),
            TopicPattern::Exact(name) => topic == name,
        }
    }
}

/// What one caller may see and change: the id space it works in and the
/// topics it may use. Every read and change of the store goes through one.
///
/// - No tenant (authentication off): every message, by its id in the
///   shared space; new messages go to the shared space.
/// - A tenant: the messages in its own space, plus those of the shared
///   space on topics it covers (messages from before tenants, or scheduled
///   while authentication was off). New messages go to its own space. The
///   messages of other tenants do not exist for it.
///
/// Within what it sees, a message on a topic it does not cover is refused
/// ([`Visibility::Forbidden`]); what it does not see is [`Visibility::Hidden`],
/// answered as if there were no such message.
#[derive(Clone, Debug)]
pub struct Scope {
    /// Who, for errors: the token's name.
    pub name: std::sync::Arc<str>,
    pub tenant: Option<Tenant>,
    /// Empty: every topic.
    topics: std::sync::Arc<[TopicPattern]>,
}

/// Whether a caller may see a message, and act on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Visibility {
    Visible,
    /// In the caller's space, on a topic it does not cover.
    Forbidden,
    /// Not the caller's to know of.
    Hidden,
}

impl Scope {
    /// Everything: authentication is off.
    pub fn everything() -> Scope {
        Scope { name: "".into(), tenant: None, topics: std::sync::Arc::new([]) }
    }

    /// A tenant's scope, limited to `topics` (every topic if they hold `*`).
    pub fn tenant(name: &str, tenant: Tenant, topics: Vec<TopicPattern>) -> Scope {
        let topics = if topics.contains(&TopicPattern::Any) { Vec::new() } else { topics };
        Scope { name: name.into(), tenant: Some(tenant), topics: topics.into() }
    }

    /// No limit at all: no tenant and every topic.
    pub fn is_everything(&self) -> bool {
        self.tenant.is_none() && self.topics.is_empty()
    }

    pub fn covers(&self, topic: &str) -> bool {
        self.topics.is_empty() || self.topics.iter().any(|p| p.matches(topic))
    }

    /// Where a client's id names a message for this caller.
    pub fn id(&self, id: &str) -> Result<MessageId, Invalid> {
        MessageId::parse_in(self.tenant.as_ref(), id)
    }

    /// Where else `id` may name a message this caller sees: the shared
    /// space, for a tenant.
    pub fn fallback(&self, id: &MessageId) -> Option<MessageId> {
        (self.tenant.is_some() && id.tenant().is_some()).then(|| id.shared())
    }

    /// Whether the message `id` on `topic` is this caller's to see.
    pub fn sees(&self, id: &MessageId, topic: &str) -> Visibility {
        let Some(tenant) = &self.tenant else {
            return if self.covers(topic) { Visibility::Visible } else { Visibility::Forbidden };
        };
        match id.tenant() {
            Some(t) if t == tenant.as_str() => {
                if self.covers(topic) {
                    Visibility::Visible
                } else {
                    Visibility::Forbidden
                }
            }
            None if self.covers(topic) => Visibility::Visible,
            _ => Visibility::Hidden,
        }
    }

    /// Whether messages of `space` (a tenant; none for the shared one) may
    /// be visible to this caller at all.
    pub fn sees_space(&self, space: Option<&str>) -> bool {
        match (&self.tenant, space) {
            (None, _) | (Some(_), None) => true,
            (Some(mine), Some(theirs)) => mine.as_str() == theirs,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub key: String,
    pub value: Vec<u8>,
}

/// The Kafka record to produce when due, exactly as the client gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    pub topic: String,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
    pub headers: Vec<Header>,
    pub partition: Option<i32>,
}

/// Prefix of the headers hourglass adds to every record it produces.
pub const RESERVED_HEADER_PREFIX: &str = "hourglass-";
/// Header carrying the message id, so consumers can deduplicate.
pub const ID_HEADER: &str = "hourglass-id";
/// Header carrying the due time in Unix milliseconds (decimal text).
pub const DUE_HEADER: &str = "hourglass-due-ms";
/// Header carrying the tenant whose id space the message is in; absent for
/// the shared space. Two tenants may use the same id: deduplicate on both.
pub const TENANT_HEADER: &str = "hourglass-tenant";

impl Envelope {
    /// Bytes the record carries: key, value and headers.
    pub fn size(&self) -> usize {
        self.key.as_ref().map_or(0, Vec::len) + self.value.len() + self.headers_size()
    }

    fn headers_size(&self) -> usize {
        self.headers.iter().map(|h| h.key.len() + h.value.len()).sum()
    }

    /// Checks everything that can be checked without the broker.
    pub fn validate(&self, limits: &Limits) -> Result<(), Invalid> {
        validate_topic_name(&self.topic)?;
        if self.value.is_empty() {
            return Err(Invalid::new("message.value", "must not be empty"));
        }
        if self.headers.len() > limits.max_headers {
            return Err(Invalid::new(
                "message.headers",
                format!("has {} headers; the limit is {}", self.headers.len(), limits.max_headers),
            ));
        }
        for h in &self.headers {
            if h.key.is_empty() {
                return Err(Invalid::new("message.headers", "a header key must not be empty"));
            }
            if h.key.starts_with(RESERVED_HEADER_PREFIX) {
                return Err(Invalid::new(
                    "message.headers",
                    format!("header {:?} uses the reserved prefix {RESERVED_HEADER_PREFIX:?}", h.key),
                ));
            }
        }
        if self.headers_size() > limits.max_headers_bytes {
            return Err(Invalid::new(
                "message.headers",
                format!(
                    "headers take {} bytes; the limit is {}",
                    self.headers_size(),
                    limits.max_headers_bytes
                ),
            ));
        }
        if self.size() > limits.max_message_bytes {
            return Err(Invalid::new(
                "message",
                format!(
                    "key, value and headers take {} bytes; the limit is {}",
                    self.size(),
                    limits.max_message_bytes
                ),
            ));
        }
        if let Some(p) = self.partition
            && p < 0
        {
            return Err(Invalid::new("message.partition", format!("{p} is negative")));
        }
        Ok(())
    }
}

/// Kafka's own rule for topic names.
pub fn validate_topic_name(topic: &str) -> Result<(), Invalid> {
    const MAX: usize = 249;
    if topic.is_empty() {
        return Err(Invalid::new("message.topic", "must not be empty"));
    }
    if topic.len() > MAX {
        return Err(Invalid::new("message.topic", format!("is longer than {MAX} characters")));
    }
    if topic == "." || topic == ".." {
        return Err(Invalid::new("message.topic", "may not be \".\" or \"..\""));
    }
    if let Some(c) = topic.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        return Err(Invalid::new(
            "message.topic",
            format!("{topic:?} contains {c:?}; Kafka topics use letters, digits, '.', '_' and '-'"),
        ));
    }
    Ok(())
}

/// When to deliver, as the client said it. Kept as given so that a retried
/// request with a relative delay is recognised as the same request minutes
/// later.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DueSpec {
    At(UnixMillis),
    After(Duration),
}

impl DueSpec {
    pub fn resolve(self, now: UnixMillis) -> UnixMillis {
        match self {
            DueSpec::At(t) => t,
            DueSpec::After(d) => now.saturating_add(d),
        }
    }
}

/// What a message must meet to be accepted.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Key, value and headers together.
    pub max_message_bytes: usize,
    pub max_headers: usize,
    pub max_headers_bytes: usize,
    /// How far in the future a due time may lie.
    pub max_delay: Duration,
    /// Items in one `ScheduleBatch` call.
    pub max_batch: usize,
    /// Encoded size of one `ScheduleBatch` request.
    pub max_batch_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_message_bytes: 1024 * 1024,
            max_headers: 64,
            max_headers_bytes: 64 * 1024,
            max_delay: Duration::from_secs(3 * 366 * 24 * 3600),
            max_batch: 10_000,
            max_batch_bytes: 16 << 20,
        }
    }
}

impl Limits {
    /// The largest request of one message the server decodes (`Schedule`,
    /// each request of a `ScheduleStream`, and the small ones): the message
    /// with room for its envelope. Anything larger is refused unread.
    pub fn max_request_bytes(&self) -> usize {
        self.max_message_bytes + 64 * 1024
    }

    /// The largest `ScheduleBatch` request the server decodes; never less
    /// than one message needs.
    pub fn max_batch_request_bytes(&self) -> usize {
        self.max_batch_bytes.max(self.max_request_bytes())
    }

    /// A due time in the past is fine (delivered at once); one beyond
    /// `max_delay` is refused rather than silently clamped.
    pub fn check_due(&self, due: UnixMillis, now: UnixMillis) -> Result<(), Invalid> {
        let latest = now.saturating_add(self.max_delay);
        if due > latest {
            return Err(Invalid::new(
                "due",
                format!(
                    "{} is further ahead than the server's --max-delay of {} allows (the latest due time it \
                     takes now is {}); pick an earlier time, or raise --max-delay",
                    due.to_rfc3339(),
                    duration_text(self.max_delay),
                    latest.to_rfc3339()
                ),
            ));
        }
        Ok(())
    }
}

/// A request field that is wrong, and why, in words a person can act on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field} {reason}")]
pub struct Invalid {
    pub field: &'static str,
    pub reason: String,
}

impl Invalid {
    pub fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Invalid { field, reason: reason.into() }
    }
}

/// Where a delivered record landed, and when the broker acknowledged it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivery {
    pub partition: i32,
    pub offset: i64,
    pub delivered_at: UnixMillis,
}

/// A message's lifecycle:
///
/// ```text
/// Pending ──produce acked──► Delivered
///    │  ╰─tries exhausted──► Failed ──reschedule──► Pending
///    ╰──────cancel────────► Cancelled
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    Pending { attempts: u32, last_error: Option<String> },
    Delivered(Delivery),
    Cancelled { at: UnixMillis },
    Failed { reason: String, attempts: u32, at: UnixMillis },
}

/// What a cancel did, or why it did nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelOutcome {
    Cancelled,
    AlreadyDelivered,
    AlreadyCancelled,
    AlreadyFailed,
    NotFound,
}

/// Why a reschedule was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RescheduleRefusal {
    AlreadyDelivered,
    AlreadyCancelled,
}

impl State {
    pub fn is_pending(&self) -> bool {
        matches!(self, State::Pending { .. })
    }

    /// Whether a cancel may take this message; the outcome to report if not.
    pub fn cancel(&self) -> Result<(), CancelOutcome> {
        match self {
            State::Pending { .. } => Ok(()),
            State::Delivered(_) => Err(CancelOutcome::AlreadyDelivered),
            State::Cancelled { .. } => Err(CancelOutcome::AlreadyCancelled),
            State::Failed { .. } => Err(CancelOutcome::AlreadyFailed),
        }
    }

    /// Whether a reschedule may move this message. A failed message may be
    /// rescheduled: that is how an operator re-drives it.
    pub fn reschedule(&self) -> Result<(), RescheduleRefusal> {
        match self {
            State::Pending { .. } | State::Failed { .. } => Ok(()),
            State::Delivered(_) => Err(RescheduleRefusal::AlreadyDelivered),
            State::Cancelled { .. } => Err(RescheduleRefusal::AlreadyCancelled),
        }
    }
}

/// A message as `Get` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduledMessage {
    pub id: MessageId,
    pub envelope: Envelope,
    pub due: UnixMillis,
    pub scheduled_at: UnixMillis,
    pub state: State,
}

/// The answer to a schedule request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scheduled {
    pub id: MessageId,
    pub due: UnixMillis,
    /// The id was already scheduled by this same request.
    pub duplicate: bool,
}

/// A pending message as a listing shows it: everything but the value and
/// the headers, so a page of them stays small.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingMessage {
    pub id: MessageId,
    pub topic: String,
    pub key: Option<Vec<u8>>,
    pub partition: Option<i32>,
    pub value_bytes: usize,
    /// The due time it was parked with (or rescheduled to).
    pub due: UnixMillis,
    /// When it is produced next: `due`, or its retry time after a failed try.
    pub dispatch_at: UnixMillis,
    pub scheduled_at: UnixMillis,
    pub attempts: u32,
    pub last_error: Option<String>,
}

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
    pub dispatching: u64,
    /// The pending message longest past its dispatch time.
    pub oldest_overdue: Option<PendingMessage>,
    pub store_bytes: u64,
    pub max_pending: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope() -> Envelope {
        Envelope {
            topic: "orders.cancel-v1".into(),
            key: Some(b"order-42".to_vec()),
            value: b"cancel".to_vec(),
            headers: vec![Header { key: "trace".into(), value: b"abc".to_vec() }],
            partition: None,
        }
    }

    #[test]
    fn a_plain_message_is_valid() {
        assert_eq!(envelope().validate(&Limits::default()), Ok(()));
    }

    #[test]
    fn bad_topics_are_refused_with_the_reason() {
        for (topic, needle) in [
            ("", "empty"),
            ("has space", "contains ' '"),
            ("..", "may not"),
            (&"t".repeat(250), "longer than 249"),
        ] {
            let err = validate_topic_name(topic).unwrap_err();
            assert_eq!(err.field, "message.topic");
            assert!(err.reason.contains(needle), "{topic:?}: {err}");
        }
        assert!(validate_topic_name(&"t".repeat(249)).is_ok());
    }

    #[test]
    fn empty_value_is_refused() {
        let mut e = envelope();
        e.value.clear();
        assert_eq!(e.validate(&Limits::default()).unwrap_err().field, "message.value");
    }

    #[test]
    fn oversized_message_is_refused() {
        let limits = Limits { max_message_bytes: 100, ..Limits::default() };
        let mut e = envelope();
        e.value = vec![0; 100];
        let err = e.validate(&limits).unwrap_err();
        assert_eq!(err.field, "message");
        assert!(err.reason.contains("the limit is 100"), "{err}");
        e.value = vec![0; 100 - 8 - 8];
        assert_eq!(e.validate(&limits), Ok(()));
    }

    #[test]
    fn header_limits_apply() {
        let limits = Limits { max_headers: 2, max_headers_bytes: 10, ..Limits::default() };
        let mut e = envelope();
        e.headers = vec![Header { key: "k".into(), value: vec![] }; 3];
        assert!(e.validate(&limits).unwrap_err().reason.contains("3 headers"));
        e.headers = vec![Header { key: "k".into(), value: vec![0; 10] }];
        assert!(e.validate(&limits).unwrap_err().reason.contains("11 bytes"));
        e.headers = vec![Header { key: "".into(), value: vec![] }];
        assert!(e.validate(&limits).unwrap_err().reason.contains("empty"));
        e.headers = vec![Header { key: ID_HEADER.into(), value: vec![] }];
        assert!(e.validate(&limits).unwrap_err().reason.contains("reserved"));
    }

    #[test]
    fn negative_partition_is_refused() {
        let mut e = envelope();
        e.partition = Some(-1);
        assert_eq!(e.validate(&Limits::default()).unwrap_err().field, "message.partition");
    }

    #[test]
    fn ids_are_printable_and_bounded() {
        assert!(MessageId::parse("order-42:cancel").is_ok());
        assert!(MessageId::parse("").is_err());
        assert!(MessageId::parse("with space").is_err());
        assert!(MessageId::parse("tab\t").is_err());
        assert!(MessageId::parse("é").is_err());
        assert!(MessageId::parse(&"x".repeat(128)).is_ok());
        assert!(MessageId::parse(&"x".repeat(129)).is_err());
    }

    #[test]
    fn generated_ids_are_unique_and_time_ordered() {
        let mut g = ulid::Generator::new();
        let ids: Vec<_> = (0..1000).map(|_| MessageId::generate(&mut g, None)).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted, ids);
        assert!(ids.iter().all(|id| MessageId::parse(id.as_str()).is_ok()));
    }

    fn tenant(name: &str) -> Tenant {
        Tenant::parse(name).unwrap()
    }

    #[test]
    fn each_tenant_has_an_id_space_of_its_own() {
        let (a, b) = (tenant("orders"), tenant("billing"));
        let shared = MessageId::parse("order-1").unwrap();
        let in_a = MessageId::parse_in(Some(&a), "order-1").unwrap();
        let in_b = MessageId::parse_in(Some(&b), "order-1").unwrap();
        assert!(shared != in_a && in_a != in_b, "one id, three messages");
        for id in [&shared, &in_a, &in_b] {
            assert_eq!(id.as_str(), "order-1");
            assert_eq!(id.to_string(), "order-1", "clients see their own id");
            assert_eq!(MessageId::from_stored(id.as_bytes()).as_ref(), Some(id), "round trip");
        }
        assert_eq!((shared.tenant(), in_a.tenant()), (None, Some("orders")));
        assert_eq!(in_a.qualified(), "orders/order-1");
        assert_eq!(in_a.shared(), shared);
        assert!(
            !shared.as_bytes().contains(&0) && in_a.as_bytes()[0] == 0,
            "a stored shared id is the id itself, as stores from before tenants hold it"
        );
        let generated = MessageId::generate(&mut ulid::Generator::new(), Some(&b));
        assert_eq!(generated.tenant(), Some("billing"));
        assert_eq!(MessageId::from_stored(b"\0no-end"), None);
        assert_eq!(MessageId::from_stored(b"\0t\0"), None, "an id is never empty");
    }

    #[test]
    fn tenant_names_are_checked() {
        assert!(Tenant::parse("orders-eu.1_a").is_ok());
        for bad in ["", "has space", "a/b", "nul\0", &"t".repeat(65)] {
            assert!(Tenant::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_scope_sees_its_space_and_the_shared_one_on_its_topics() {
        let scope = Scope::tenant(
            "orders-service",
            tenant("orders"),
            vec![TopicPattern::parse("orders.*").unwrap(), TopicPattern::parse("audit").unwrap()],
        );
        let mine = scope.id("x").unwrap();
        let shared = MessageId::parse("x").unwrap();
        let theirs = MessageId::parse_in(Some(&tenant("billing")), "x").unwrap();
        assert_eq!(mine.tenant(), Some("orders"));
        assert_eq!(scope.fallback(&mine), Some(shared.clone()));
        assert_eq!(scope.sees(&mine, "orders.paid"), Visibility::Visible);
        assert_eq!(scope.sees(&mine, "payments"), Visibility::Forbidden, "its own, on a topic it lost");
        assert_eq!(scope.sees(&shared, "audit"), Visibility::Visible);
        assert_eq!(scope.sees(&shared, "payments"), Visibility::Hidden, "shared, not its topic");
        assert_eq!(
            scope.sees(&theirs, "orders.paid"),
            Visibility::Hidden,
            "another tenant's, even on its topic"
        );
        assert!(
            scope.sees_space(None) && scope.sees_space(Some("orders")) && !scope.sees_space(Some("billing"))
        );

        let everything = Scope::everything();
        assert!(everything.is_everything());
        assert_eq!(everything.fallback(&shared), None);
        for id in [&mine, &shared, &theirs] {
            assert_eq!(everything.sees(id, "payments"), Visibility::Visible);
        }
        let wildcard = Scope::tenant("ops", tenant("ops"), vec![TopicPattern::Any]);
        assert!(wildcard.covers("anything") && !wildcard.is_everything(), "a tenant is never everything");
    }

    #[test]
    fn due_resolution_and_max_delay() {
        let now = UnixMillis(1_000_000);
        assert_eq!(DueSpec::After(Duration::from_millis(1500)).resolve(now), UnixMillis(1_001_500));
        assert_eq!(DueSpec::At(UnixMillis(5)).resolve(now), UnixMillis(5));
        let limits = Limits { max_delay: Duration::from_secs(10), ..Limits::default() };
        assert!(limits.check_due(UnixMillis(5), now).is_ok(), "past is delivered at once");
        assert!(limits.check_due(UnixMillis(1_010_000), now).is_ok());
        let err = limits.check_due(UnixMillis(1_010_001), now).unwrap_err();
        assert!(err.reason.contains("--max-delay"), "{err}");
    }

    #[test]
    fn cancel_transitions() {
        let delivered = State::Delivered(Delivery { partition: 0, offset: 1, delivered_at: UnixMillis(1) });
        assert_eq!(State::Pending { attempts: 2, last_error: None }.cancel(), Ok(()));
        assert_eq!(delivered.cancel(), Err(CancelOutcome::AlreadyDelivered));
        assert_eq!(State::Cancelled { at: UnixMillis(1) }.cancel(), Err(CancelOutcome::AlreadyCancelled));
        let failed = State::Failed { reason: "x".into(), attempts: 5, at: UnixMillis(1) };
        assert_eq!(failed.cancel(), Err(CancelOutcome::AlreadyFailed));
    }

    #[test]
    fn reschedule_transitions() {
        let delivered = State::Delivered(Delivery { partition: 0, offset: 1, delivered_at: UnixMillis(1) });
        assert_eq!(State::Pending { attempts: 0, last_error: None }.reschedule(), Ok(()));
        let failed = State::Failed { reason: "x".into(), attempts: 5, at: UnixMillis(1) };
        assert_eq!(failed.reschedule(), Ok(()), "a failed message can be re-driven");
        assert_eq!(delivered.reschedule(), Err(RescheduleRefusal::AlreadyDelivered));
        assert_eq!(
            State::Cancelled { at: UnixMillis(1) }.reschedule(),
            Err(RescheduleRefusal::AlreadyCancelled)
        );
    }

    #[test]
    fn rfc3339_has_milliseconds() {
        assert_eq!(UnixMillis(1_700_000_000_123).to_rfc3339(), "2023-11-14T22:13:20.123Z");
    }

    #[test]
    fn page_tokens_round_trip() {
        for (at, seq) in [(0, 0), (1_700_000_000_123, 42), (u64::MAX, u64::MAX)] {
            for shard in [0, 1, 255, u32::MAX] {
                let token = PageToken { dispatch_at: UnixMillis(at), shard, seq };
                assert_eq!(PageToken::decode(&token.encode()), Ok(token));
            }
        }
        let one_shard = PageToken { dispatch_at: UnixMillis(0xfeed), shard: 0, seq: 0xbeef };
        assert_eq!(
            one_shard.encode(),
            "01000000000000feed000000000000beef",
            "as every earlier release wrote it"
        );
    }

    proptest::proptest! {
        #[test]
        fn page_tokens_round_trip_through_text(at: u64, shard: u32, seq: u64) {
            let token = PageToken { dispatch_at: UnixMillis(at), shard, seq };
            proptest::prop_assert_eq!(PageToken::decode(&token.encode()), Ok(token));
        }

        #[test]
        fn page_tokens_refuse_any_other_text(text in "0[12][0-9a-f]{32,40}|[0-9a-f]{0,44}|.{0,44}") {
            let ok = PageToken::decode(&text);
            proptest::prop_assert!(ok.is_err() || ok.map(|t| t.encode()) == Ok(text.clone()));
        }
    }

    #[test]
    fn bad_page_tokens_are_refused_by_name() {
        let good = PageToken { dispatch_at: UnixMillis(0xfeed), shard: 0, seq: 0xbeef }.encode();
        let v2 = PageToken { dispatch_at: UnixMillis(0xfeed), shard: 3, seq: 0xbeef }.encode();
        let v2_as_v1 = format!("01{}", &v2[2..]);
        let wrong_version = format!("02{}", &good[2..]);
        let non_hex = format!("zz{}", &good[2..]);
        let multibyte = format!("é{}", &good[2..]);
        let upper = good.to_uppercase();
        for token in [
            "",
            "abc",
            &good[..32],
            &wrong_version,
            &non_hex,
            &multibyte,
            &upper,
            &format!("{good}00"),
            &v2_as_v1,
        ] {
            assert_eq!(PageToken::decode(token).unwrap_err().field, "page_token", "{token:?}");
        }
    }

    #[test]
    fn list_queries_are_checked() {
        let q = |from: Option<u64>, to: Option<u64>, page_size| ListQuery {
            from: from.map(UnixMillis),
            to: to.map(UnixMillis),
            page_size,
            ..ListQuery::default()
        };
        assert_eq!(q(None, None, 0).validate(), Ok(ListQuery::DEFAULT_PAGE_SIZE));
        assert_eq!(q(Some(1), Some(2), 1000).validate(), Ok(1000));
        assert_eq!(q(None, None, 1001).validate().unwrap_err().field, "page_size");
        assert_eq!(q(Some(2), Some(2), 10).validate().unwrap_err().field, "dispatch_to");
        assert_eq!(q(Some(3), Some(2), 10).validate().unwrap_err().field, "dispatch_to");
        let bad_topic = ListQuery { topic: Some("no spaces".into()), ..ListQuery::default() };
        assert_eq!(bad_topic.validate().unwrap_err().field, "topic");
    }
}
