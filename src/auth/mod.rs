//! Token authentication (`--auth-tokens FILE`): who is calling, and which
//! topics they may schedule to.
//!
//! The tokens file is TOML, one `[[token]]` table per caller:
//!
//! ```toml
//! [[token]]
//! name = "orders-service"   # shown in logs and errors, never the token
//! sha256 = "…64 hex digits…" # printf %s "$TOKEN" | sha256sum
//! topics = ["orders.*", "audit"]
//! tenant = "orders"          # optional; the name by default
//!
//! [[token]]
//! name = "ops"
//! token = "plaintext is accepted too"
//! topics = ["*"]
//! admin = "all"             # optional: may set dispatch policies (see below)
//! ```
//!
//! `admin` lets a token call the `Admin` service (pause, resume and rate
//! limit topics): `"tenant"` for its own tenant's messages, `"all"` for
//! every tenant's too; either only on the topics it is granted. Without
//! it, a token cannot change a policy. An `"all"` token is an operator: it
//! also sees every tenant's messages and series on its topics (`List`,
//! `Stats` with the server's own figures, `Forecast`, the console), and
//! may name another tenant's message or series by its tenant to act on
//! it; its own new messages still go to its own tenant's space.
//!
//! A topic pattern is an exact name, a prefix ending in `*` (`orders.*`
//! matches `orders.created`), or `*` for every topic. Each token belongs to
//! a tenant, whose messages live in an id space of their own (see
//! [`crate::message::Scope`]); tokens that share a tenant (an old and a new
//! token during a rotation, say) share its messages.
//!
//! Callers send `authorization: Bearer <token>`. Only SHA-256 digests are
//! kept in memory; a presented token is hashed and compared with every
//! digest in constant time. Tokens are never logged.
//!
//! In cluster mode a call one node passes on to another carries no token:
//! the node that took it vouches for it ([`Vouches`]), naming the grant it
//! found, and the node that serves it uses its own grant of that name.
//!
//! This module decides who the caller is ([`Authenticator`], a tonic
//! interceptor) and what a grant allows ([`Access`]). Every call but health
//! carries an [`Access`], also when authentication is off; a call that
//! reaches the service without one is refused, never let through. The
//! service takes the caller's access in every method and the store applies
//! its [`Scope`] in the same step as the read or change it limits.

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
};

use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use tonic::{Request, Status, metadata::MetadataMap};

use crate::{
    Error,
    message::{Scope, Tenant, TopicPattern},
    metrics,
    watched::Watched,
};

/// What is wrong with a tokens file, or a token a client would send. Names
/// the file and the entry, never a token.
#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    #[error("--auth-tokens {}: cannot read it: {source}", path.display())]
    Unreadable { path: PathBuf, source: std::io::Error },
    #[error("--auth-tokens {}: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
    #[error("--token must be printable ASCII")]
    NotAscii,
}

/// What one token may do: use the topics its patterns match, in its
/// tenant's id space.
#[derive(Debug)]
pub struct Grant {
    /// The token's name from the file, for logs and errors.
    pub name: String,
    scope: Scope,
    digest: [u8; 32],
    admin: Option<AdminScope>,
}

/// Whose dispatch policies a token may set (`admin` in the tokens file).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdminScope {
    /// Its own tenant's.
    Tenant,
    /// Every tenant's too.
    All,
}

impl Grant {
    pub fn allows(&self, topic: &str) -> bool {
        self.scope.covers(topic)
    }

    pub fn tenant(&self) -> &str {
        self.scope.tenant.as_ref().map_or("", Tenant::as_str)
    }
}

/// The tokens in use, swapped whole by a reload.
type Live = Arc<RwLock<Arc<Tokens>>>;

/// What the caller of one request may do: everything when authentication is
/// off, otherwise what its token is granted.
#[derive(Clone)]
pub enum Access {
    Open,
    Granted {
        grant: Arc<Grant>,
        /// The tokens in use, to look the token up again (see [`Access::current`]).
        live: Live,
    },
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Access::Open => f.write_str("Open"),
            Access::Granted { grant, .. } => write!(f, "Granted({:?})", grant.name),
        }
    }
}

impl Access {
    /// The access the [`Authenticator`] attached to the request. A request
    /// without one never passed the check (a service wired without the
    /// interceptor): it is refused, not let in.
    pub fn of<T>(request: &Request<T>) -> Result<Access, Error> {
        request.extensions().get::<Access>().cloned().ok_or_else(|| {
            tracing::error!("a call reached the service without an access check; refused");
            Error::Unchecked
        })
    }

    /// What the caller sees and may change in the store: an operator's
    /// (`admin = "all"`) spans every tenant's messages on its topics.
    pub fn scope(&self) -> Scope {
        match self {
            Access::Open => Scope::everything(),
            Access::Granted { grant, .. } if grant.admin == Some(AdminScope::All) => {
                grant.scope.clone().across_tenants()
            }
            Access::Granted { grant, .. } => grant.scope.clone(),
        }
    }

    /// The message `id` of `tenant`'s space (empty: the caller's own) in
    /// the caller's scope; naming another tenant needs an operator
    /// ([`Error::NotOperator`]).
    pub fn id_of(&self, tenant: &str, id: &str) -> Result<crate::message::MessageId, Error> {
        let scope = self.scope();
        if !tenant.is_empty()
            && tenant != crate::message::SHARED_SPACE
            && !scope.sees_every_space()
            && scope.tenant.as_ref().is_none_or(|own| own.as_str() != tenant)
        {
            return Err(Error::NotOperator { token: self.name().to_owned() });
        }
        Ok(scope.id_of(tenant, id)?)
    }

    /// Whether the caller sees and acts across tenants: every caller with
    /// authentication off, else a token with `admin = "all"`.
    pub fn is_operator(&self) -> bool {
        matches!(self.admin(), Ok(AdminScope::All))
    }

    /// `Ok` when the caller may use `topic`, else [`Error::Forbidden`].
    pub fn check(&self, topic: &str) -> Result<(), Error> {
        match self {
            Access::Open => Ok(()),
            Access::Granted { grant, .. } if grant.allows(topic) => Ok(()),
            Access::Granted { grant, .. } => {
                Err(Error::Forbidden { token: grant.name.clone(), topic: topic.to_owned() })
            }
        }
    }

    /// Whose dispatch policies the caller may set: everything with
    /// authentication off; else what its token's `admin` says, or
    /// [`Error::NotAdmin`].
    pub fn admin(&self) -> Result<AdminScope, Error> {
        match self {
            Access::Open => Ok(AdminScope::All),
            Access::Granted { grant, .. } => {
                grant.admin.ok_or_else(|| Error::NotAdmin { token: grant.name.clone() })
            }
        }
    }

    /// The caller's name for the record of a change: its token's, or none.
    pub fn name(&self) -> &str {
        match self {
            Access::Open => "",
            Access::Granted { grant, .. } => &grant.name,
        }
    }

    /// The caller's access as the tokens in use now say: a long call (a
    /// stream) asks again before each piece of work, so that a token
    /// revoked or narrowed by a reload stops working at once.
    pub fn current(&self) -> Result<Access, Error> {
        let Access::Granted { grant, live } = self else { return Ok(Access::Open) };
        let tokens = Arc::clone(&live.read().unwrap_or_else(|poisoned| poisoned.into_inner()));
        match tokens.find_digest(&grant.digest) {
            Some(now) if Arc::ptr_eq(&now, grant) => Ok(self.clone()),
            Some(now) => Ok(Access::Granted { grant: now, live: Arc::clone(live) }),
            None => Err(Error::Revoked { token: grant.name.clone() }),
        }
    }
}

/// The tokens of one file, by digest.
#[derive(Debug)]
pub struct Tokens {
    entries: Vec<([u8; 32], Arc<Grant>)>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default)]
    token: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    token: Option<String>,
    sha256: Option<String>,
    topics: Vec<String>,
    tenant: Option<String>,
    admin: Option<String>,
}

fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

fn parse_hex_digest(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (byte, pair) in out.iter_mut().zip(hex.as_bytes().chunks(2)) {
        *byte = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(out)
}

/// Equal in time independent of where the digests differ.
fn same_digest(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

impl Tokens {
    /// Reads and checks a tokens file. Errors name the file and the entry,
    /// never a token (a TOML syntax error is reported by line only, as the
    /// line may hold one).
    pub fn load(path: &Path) -> Result<Tokens, TokensError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| TokensError::Unreadable { path: path.to_owned(), source })?;
        Tokens::parse(&text)
            .map_err(|reason| TokensError::Invalid { path: path.to_owned(), reason: reason.0 })
    }

    fn parse(text: &str) -> Result<Tokens, Unreadable> {
        let file: TokensFile = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| text[..s.start.min(text.len())].lines().count().max(1));
            Unreadable(match line {
                Some(line) => format!("not valid TOML near line {line}"),
                None => "not valid TOML".to_owned(),
            })
        })?;
        if file.token.is_empty() {
            return Err(Unreadable("no [[token]] entries; without tokens no call would be let in".into()));
        }
        let mut names = HashSet::new();
        let mut entries: Vec<([u8; 32], Arc<Grant>)> = Vec::new();
        for entry in file.token {
            let name = entry.name;
            let fail = |m: &str| Err(Unreadable(format!("token {name:?}: {m}")));
            if name.trim().is_empty() {
                return Err(Unreadable("a token has an empty name".into()));
            }
            if !names.insert(name.clone()) {
                return fail("the name is used twice");
            }
            let hash = match (entry.token, entry.sha256) {
                (Some(token), None) if !token.is_empty() => digest(token.as_bytes()),
                (Some(_), None) => return fail("the token is empty"),
                (None, Some(hex)) => match parse_hex_digest(&hex) {
                    Some(hash) => hash,
                    None => return fail("sha256 must be 64 hex digits"),
                },
                _ => return fail("give exactly one of `token` and `sha256`"),
            };
            if entries.iter().any(|(h, _)| same_digest(h, &hash)) {
                return fail("the same token is listed under another name too");
            }
            if entry.topics.is_empty() {
                return fail("no topics; use [\"*\"] for every topic");
            }
            let topics = entry.topics.iter().map(|t| TopicPattern::parse(t)).collect::<Result<_, _>>();
            let topics = match topics {
                Ok(topics) => topics,
                Err(e) => return fail(&e.0),
            };
            let tenant = match Tenant::parse(entry.tenant.as_deref().unwrap_or(&name)) {
                Ok(tenant) => tenant,
                Err(e) if entry.tenant.is_none() => {
                    return fail(&format!("{e}; name its tenant with `tenant = \"...\"`"));
                }
                Err(e) => return fail(&e.0),
            };
            let admin = match entry.admin.as_deref() {
                None => None,
                Some("tenant") => Some(AdminScope::Tenant),
                Some("all") => Some(AdminScope::All),
                Some(other) => {
                    return fail(&format!(
                        "admin = {other:?}; use \"tenant\" (its own tenant's policies) or \"all\""
                    ));
                }
            };
            let scope = Scope::tenant(&name, tenant, topics);
            entries.push((hash, Arc::new(Grant { name, scope, digest: hash, admin })));
        }
        Ok(Tokens { entries })
    }

    /// The grant named `name`.
    /// Whether any token of `tenant` covers `topic`.
    fn tenant_covers(&self, tenant: &str, topic: &str) -> bool {
        self.entries.iter().any(|(_, grant)| grant.tenant() == tenant && grant.allows(topic))
    }

    fn find_named(&self, name: &str) -> Option<Arc<Grant>> {
        self.entries.iter().find(|(_, grant)| grant.name == name).map(|(_, grant)| Arc::clone(grant))
    }

    /// The grant of `token`, comparing its digest with every entry.
    fn find(&self, token: &str) -> Option<Arc<Grant>> {
        self.find_digest(&digest(token.as_bytes()))
    }

    fn find_digest(&self, hash: &[u8; 32]) -> Option<Arc<Grant>> {
        let mut found = None;
        for (entry, grant) in &self.entries {
            if same_digest(entry, hash) {
                found = Some(Arc::clone(grant));
            }
        }
        found
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// What a call another node passes on says of its caller.
#[derive(Debug, PartialEq, Eq)]
pub enum Vouch {
    /// No node passed it on: the caller's own token decides.
    None,
    /// A node of the cluster passed it on, having found the caller's grant
    /// of this name (none: it lets every call in).
    For(Option<String>),
    /// It says it was passed on, but no node of the cluster vouches for
    /// it: why, for the caller.
    Refused(String),
}

/// Tells whether another node of the cluster vouches for a call (cluster
/// mode's forwarding; see `crate::cluster`).
pub trait Vouches: Send + Sync {
    fn vouch(&self, metadata: &MetadataMap) -> Vouch;
}

/// The token check in front of the Scheduler and reflection services: a
/// tonic interceptor that refuses a call without a valid bearer token
/// (UNAUTHENTICATED) and attaches the token's [`Access`] to the rest.
/// Disabled (lets every call through) when no tokens file is configured.
/// In cluster mode a call another node vouches for gets the grant it names
/// instead.
#[derive(Clone, Default)]
pub struct Authenticator {
    tokens: Option<(PathBuf, Live)>,
    vouches: Option<Arc<dyn Vouches>>,
}

impl Authenticator {
    /// Lets every call in.
    pub fn disabled() -> Authenticator {
        Authenticator::default()
    }

    pub fn load(path: &Path) -> Result<Authenticator, TokensError> {
        let tokens = Tokens::load(path)?;
        Ok(Authenticator {
            tokens: Some((path.to_owned(), Arc::new(RwLock::new(Arc::new(tokens))))),
            vouches: None,
        })
    }

    /// Also lets in the calls other nodes vouch for, as `vouches` says.
    pub fn vouched_by(self, vouches: Arc<dyn Vouches>) -> Authenticator {
        Authenticator { vouches: Some(vouches), ..self }
    }

    pub fn is_enabled(&self) -> bool {
        self.tokens.is_some()
    }

    /// Reads the tokens file again; on an error the tokens in use stay.
    /// Returns how many tokens are in use now.
    pub fn reload(&self) -> Result<usize, TokensError> {
        let Some((path, current)) = &self.tokens else { return Ok(0) };
        let tokens = Tokens::load(path)?;
        let count = tokens.len();
        *current.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(tokens);
        Ok(count)
    }

    /// The caller's access, from its `authorization: Bearer` header, or
    /// from the grant another node vouches for.
    pub fn authenticate(&self, metadata: &MetadataMap) -> Result<Access, Error> {
        match self.vouches.as_ref().map_or(Vouch::None, |v| v.vouch(metadata)) {
            Vouch::None => {}
            Vouch::For(name) => return self.vouched(name),
            Vouch::Refused(why) => {
                metrics::AUTH_REFUSED.with_label_values(&["unvouched"]).inc();
                return Err(Error::Unvouched(why));
            }
        }
        if self.tokens.is_none() {
            return Ok(Access::Open);
        }
        let token = bearer(metadata).ok_or_else(|| {
            metrics::AUTH_REFUSED.with_label_values(&["missing"]).inc();
            Error::NoToken
        })?;
        self.token(token)
    }

    /// The access `token` is granted (everything with authentication off):
    /// what a person signing in to the console presents.
    pub fn token(&self, token: &str) -> Result<Access, Error> {
        let Some((_, live)) = &self.tokens else { return Ok(Access::Open) };
        let tokens = Arc::clone(&live.read().unwrap_or_else(|poisoned| poisoned.into_inner()));
        match tokens.find(token) {
            Some(grant) => Ok(Access::Granted { grant, live: Arc::clone(live) }),
            None => {
                metrics::AUTH_REFUSED.with_label_values(&["invalid"]).inc();
                Err(Error::BadToken)
            }
        }
    }
}

/// Why a tokens file does not read: what is wrong, where.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Unreadable(String);

/// Why a Kafka-native ingress topic's grant cannot be found.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NoGrant(pub String);

impl Authenticator {
    /// The access of the grant named `name` in the tokens in use (none:
    /// every topic, with authentication off): what a Kafka-native schedule
    /// of an ingress topic mapped to it gets. Why not, for the log.
    pub fn named(&self, name: Option<&str>) -> Result<Access, NoGrant> {
        let Some((path, live)) = &self.tokens else {
            return match name {
                None => Ok(Access::Open),
                Some(name) => Err(NoGrant(format!(
                    "names the grant {name:?}, but there is no tokens file (--auth-tokens) to find it in"
                ))),
            };
        };
        let Some(name) = name else {
            return Err(NoGrant(format!(
                "names no grant, and with --auth-tokens every caller needs one: map the topic to an entry of {} \
                 (--ingress TOPIC=NAME)",
                path.display()
            )));
        };
        let tokens = Arc::clone(&live.read().unwrap_or_else(|poisoned| poisoned.into_inner()));
        match tokens.find_named(name) {
            Some(grant) => Ok(Access::Granted { grant, live: Arc::clone(live) }),
            None => Err(NoGrant(format!("names the grant {name:?}, which {} does not list", path.display()))),
        }
    }

    /// The access of a call another node vouches for, by the grant it
    /// names: this node's grant of that name.
    fn vouched(&self, name: Option<String>) -> Result<Access, Error> {
        let Some((_, live)) = &self.tokens else { return Ok(Access::Open) };
        let tokens = Arc::clone(&live.read().unwrap_or_else(|poisoned| poisoned.into_inner()));
        let unknown = |why: String| {
            metrics::AUTH_REFUSED.with_label_values(&["unvouched"]).inc();
            Err(Error::Unvouched(why))
        };
        match name {
            Some(name) => match tokens.find_named(&name) {
                Some(grant) => Ok(Access::Granted { grant, live: Arc::clone(live) }),
                None => unknown(format!(
                    "the node that passed the call on found the token {name:?}, which this node's tokens file \
                     does not list: give every node the same --auth-tokens"
                )),
            },
            None => unknown(
                "the node that passed the call on lets every call in, and this one needs a token: give every \
                 node the same --auth-tokens"
                    .to_owned(),
            ),
        }
    }
}

impl tonic::service::Interceptor for Authenticator {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let access = self.authenticate(request.metadata()).map_err(Status::from)?;
        // Open too: the service refuses a call that carries no access.
        request.extensions_mut().insert(access);
        Ok(request)
    }
}

fn bearer(metadata: &MetadataMap) -> Option<&str> {
    let value = metadata.get("authorization")?.to_str().ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The client's side: sends `authorization: Bearer <token>` with every call.
#[derive(Clone)]
pub struct Bearer(Option<tonic::metadata::AsciiMetadataValue>);

impl Bearer {
    /// Without a token, calls go out without the header.
    pub fn new(token: Option<&str>) -> Result<Bearer, TokensError> {
        let value = token
            .map(|t| {
                let mut value: tonic::metadata::AsciiMetadataValue =
                    format!("Bearer {}", t.trim()).parse().map_err(|_| TokensError::NotAscii)?;
                value.set_sensitive(true);
                Ok(value)
            })
            .transpose()?;
        Ok(Bearer(value))
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = &self.0 {
            request.metadata_mut().insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// What the tokens in use grant a tenant now: asked by what acts for a
/// tenant long after its call (a series' driver), so that a grant
/// narrowed by a reload holds there too.
pub trait Grants: Send + Sync {
    /// Whether some token of `tenant` (none: the shared space, which no
    /// grant owns) may use `topic` now.
    fn covers(&self, tenant: Option<&str>, topic: &str) -> bool;
}

impl Grants for Authenticator {
    fn covers(&self, tenant: Option<&str>, topic: &str) -> bool {
        let (Some((_, live)), Some(tenant)) = (&self.tokens, tenant) else { return true };
        live.read().unwrap_or_else(|poisoned| poisoned.into_inner()).tenant_covers(tenant, topic)
    }
}

/// Takes SIGHUP from the process from now on, so that its default action,
/// ending the process, never runs: call it first thing at start-up.
pub fn hangups() -> Option<tokio::signal::unix::Signal> {
    use tokio::signal::unix::{SignalKind, signal};
    let hangups = signal(SignalKind::hangup()).ok();
    if hangups.is_none() {
        tracing::warn!("cannot listen for SIGHUP; the tokens file is read at start-up only");
    }
    hangups
}

/// The tokens file (if any) as it is now, for [`keep_tokens_current`]:
/// taken before it is loaded.
pub(crate) fn watch(path: Option<&Path>) -> Watched {
    Watched::new(path.into_iter().map(Path::to_owned).collect())
}

async fn hangup(hangups: &mut Option<tokio::signal::unix::Signal>) {
    match hangups {
        Some(signal) => {
            signal.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// Keeps the tokens in use equal to the tokens file's: it is read again on
/// SIGHUP, and whenever its contents change (looked at every two seconds),
/// so a Kubernetes Secret mounted as a volume, which is updated in place
/// with no signal, takes effect by itself. A file that does not parse
/// leaves the tokens in use as they are, and says so once per change.
/// Without a tokens file SIGHUP is only logged: its default action, ending
/// the process, is never what the sender meant.
///
/// `file` is [`watch`]'s, made before the tokens were loaded.
pub(crate) async fn keep_tokens_current(
    auth: Authenticator,
    mut file: Watched,
    mut hangups: Option<tokio::signal::unix::Signal>,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut every = crate::watched::every();
    loop {
        let why = tokio::select! {
            _ = stop.cancelled() => return,
            _ = hangup(&mut hangups) => {
                // What this reload reads is seen: the next look does not
                // load it again.
                file.changed();
                "SIGHUP"
            }
            _ = every.tick(), if auth.is_enabled() => match file.changed() {
                true => "the tokens file changed",
                false => continue,
            },
        };
        match auth.reload() {
            Ok(_) if !auth.is_enabled() => {
                tracing::info!("{why}: nothing to reload (no --auth-tokens); going on")
            }
            Ok(count) => tracing::info!(count, "{why}: tokens file reloaded"),
            Err(e) => {
                if matches!(e, TokensError::Unreadable { .. }) {
                    // Gone for a moment (being replaced): read it again.
                    file.forget();
                }
                tracing::error!(error = %e, "{why}: tokens file not reloaded; the tokens in use stay")
            }
        }
    }
}

#[cfg(test)]
mod tests;
