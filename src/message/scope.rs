//! Tenants, topic grants and what one caller may see and change.

use super::{Invalid, MessageId};

/// A tenant: whoever owns an id space of their own (see [`MessageId`]).
/// With authentication on, each token belongs to one (its name, unless the
/// tokens file groups several tokens under one tenant).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tenant(std::sync::Arc<str>);

/// Looked up by name in a map of tenants (hashes and compares as its
/// name does).
impl std::borrow::Borrow<str> for Tenant {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl Tenant {
    pub const MAX_LEN: usize = 64;

    /// 1 to 64 letters, digits, `.`, `_` or `-`.
    pub fn parse(name: &str) -> Result<Tenant, BadName> {
        if name.is_empty() || name.len() > Self::MAX_LEN {
            return Err(BadName(format!("a tenant name has 1 to {} characters", Self::MAX_LEN)));
        }
        if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
            return Err(BadName(format!(
                "tenant {name:?} contains {c:?}; use letters, digits, '.', '_' and '-'"
            )));
        }
        Ok(Tenant(name.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Why a tenant's name or a topic pattern is refused, in words a person
/// can act on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadName(pub String);

/// How a call names the shared space (messages and series from without
/// tokens) in a `tenant` field, where empty means the caller's own: no
/// tenant's name has a `~`.
pub const SHARED_SPACE: &str = "~shared";

/// One topic pattern of a grant: an exact name, a prefix ending in `*`, or
/// `*` for every topic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TopicPattern {
    Any,
    Prefix(String),
    Exact(String),
}

impl TopicPattern {
    pub fn parse(pattern: &str) -> Result<TopicPattern, BadName> {
        let pattern = pattern.trim();
        if pattern == "*" {
            return Ok(TopicPattern::Any);
        }
        match pattern.strip_suffix('*') {
            _ if pattern.is_empty() => Err(BadName("an empty topic pattern".into())),
            Some(prefix) if !prefix.contains('*') => Ok(TopicPattern::Prefix(prefix.to_owned())),
            None if !pattern.contains('*') => Ok(TopicPattern::Exact(pattern.to_owned())),
            _ => Err(BadName(format!("topic pattern {pattern:?}: `*` may only end a pattern"))),
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
/// - An operator (a token with `admin = "all"`): a tenant whose new
///   messages go to its own space, and who sees every space's messages on
///   the topics it covers, and may name another tenant's message by its
///   tenant ([`Scope::id_of`]).
///
/// Within what it sees, a message on a topic it does not cover is refused
/// ([`Visibility::Forbidden`]); what it does not see is [`Visibility::Hidden`],
/// answered as if there were no such message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope {
    /// Who, for errors: the token's name.
    pub name: std::sync::Arc<str>,
    pub tenant: Option<Tenant>,
    /// Empty: every topic.
    topics: std::sync::Arc<[TopicPattern]>,
    /// Sees every tenant's messages, not only its own space's.
    every_space: bool,
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
        Scope { name: "".into(), tenant: None, topics: std::sync::Arc::new([]), every_space: true }
    }

    /// A whole id space (a tenant's, or the shared one for none), every
    /// topic: what hourglass acts in for a series of that space, whose
    /// topic was checked against its creator's grant.
    pub fn space(tenant: Option<Tenant>) -> Scope {
        let every_space = tenant.is_none();
        Scope { name: "series".into(), tenant, topics: std::sync::Arc::new([]), every_space }
    }

    /// A tenant's scope, limited to `topics` (every topic if they hold `*`).
    pub fn tenant(name: &str, tenant: Tenant, topics: Vec<TopicPattern>) -> Scope {
        let topics = if topics.contains(&TopicPattern::Any) { Vec::new() } else { topics };
        Scope { name: name.into(), tenant: Some(tenant), topics: topics.into(), every_space: false }
    }

    /// The same caller as an operator: it sees every tenant's messages on
    /// its topics (its own new messages still go to its own space).
    pub fn across_tenants(self) -> Scope {
        Scope { every_space: true, ..self }
    }

    /// Whether it sees every tenant's messages.
    pub fn sees_every_space(&self) -> bool {
        self.every_space
    }

    /// No limit at all: every space and every topic.
    pub fn is_everything(&self) -> bool {
        self.every_space && self.topics.is_empty()
    }

    pub fn covers(&self, topic: &str) -> bool {
        self.topics.is_empty() || self.topics.iter().any(|p| p.matches(topic))
    }

    /// Where a client's id names a message for this caller.
    pub fn id(&self, id: &str) -> Result<MessageId, Invalid> {
        MessageId::parse_in(self.tenant.as_ref(), id)
    }

    /// Where `id` of `tenant`'s space names a message for this caller: its
    /// own space for an empty or its own tenant; the shared space for
    /// [`SHARED_SPACE`]; another tenant's only for a caller that sees every
    /// space (an operator).
    pub fn id_of(&self, tenant: &str, id: &str) -> Result<MessageId, Invalid> {
        if tenant.is_empty() || self.tenant.as_ref().is_some_and(|t| t.as_str() == tenant) {
            return self.id(id);
        }
        if tenant == SHARED_SPACE {
            // What it may see of the shared space is as ever.
            return MessageId::parse_in(None, id);
        }
        if !self.every_space {
            return Err(Invalid::new(
                "tenant",
                format!(
                    "names tenant {tenant:?}; only an operator token (admin = \"all\") may name another tenant's \
                     message: leave it empty for your own"
                ),
            ));
        }
        let tenant = Tenant::parse(tenant).map_err(|reason| Invalid::new("tenant", reason.0))?;
        MessageId::parse_in(Some(&tenant), id)
    }

    /// Where a client's id names a new message for this caller: as
    /// [`id`](Self::id), but never in the form of a series occurrence's id
    /// ([`occurrence_form`](super::occurrence_form)), which only the series
    /// driver parks.
    pub fn new_id(&self, id: &str) -> Result<MessageId, Invalid> {
        let id = self.id(id)?;
        if super::occurrence_form(id.as_str()) {
            return Err(Invalid::new(
                "id",
                format!(
                    "{:?} has the form <series>@<time in ms>, kept for the occurrences of series; pick \
                     an id that does not end in '@' and digits",
                    id.as_str()
                ),
            ));
        }
        Ok(id)
    }

    /// Where else `id` may name a message this caller sees: the shared
    /// space, for a tenant's id in its own space (never for another
    /// tenant's id an operator named).
    pub fn fallback(&self, id: &MessageId) -> Option<MessageId> {
        let own = self.tenant.as_ref().is_some_and(|t| id.tenant() == Some(t.as_str()));
        own.then(|| id.shared())
    }

    /// Whether the message `id` on `topic` is this caller's to see.
    pub fn sees(&self, id: &MessageId, topic: &str) -> Visibility {
        let Some(tenant) = self.tenant.as_ref().filter(|_| !self.every_space) else {
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
            _ if self.every_space => true,
            (None, _) | (Some(_), None) => true,
            (Some(mine), Some(theirs)) => mine.as_str() == theirs,
        }
    }
}
