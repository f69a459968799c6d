//! Who is signed in to the console. A person signs in with a token of
//! `--auth-tokens` (with authentication off, with nothing); the console
//! keeps the token's [`Access`] under a random session id, given to the
//! browser as an `HttpOnly`, `SameSite=Strict` cookie, and looks the grant
//! up again on every request, so that a token revoked by a reload stops
//! working at once. Each session has its own random CSRF token, which
//! every form carries and every action checks.
//!
//! Over TLS the cookie is `__Host-` prefixed (`Secure`, `Path=/`, no
//! `Domain`), so that no other site of the same domain can set one the
//! browser would send here. A request with two session cookies (one set
//! by such a site beside ours) is told apart ([`Sessions::cookies`]) and
//! refused. A token holds at most [`SESSIONS_PER_TOKEN`] sessions: its
//! oldest ends for a new one, never another token's; and a token shorter
//! than [`MIN_TOKEN_CHARS`] is not taken at all.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use axum::http::{HeaderMap, HeaderValue, header};
use ring::rand::{SecureRandom as _, SystemRandom};

use crate::{
    Error,
    auth::{Access, Authenticator},
};

/// The cookie's name over plain HTTP (a loopback console).
const COOKIE: &str = "hourglass_console";
/// The cookie's name over TLS: a browser keeps a `__Host-` cookie only if
/// it is `Secure`, has `Path=/` and no `Domain`, set by this very host.
const HOST_COOKIE: &str = "__Host-hourglass_console";
/// The shortest token the sign-in form takes: shorter ones are guessed too
/// easily for a form anyone who reaches the console may try.
pub(super) const MIN_TOKEN_CHARS: usize = 16;
/// Sessions one token holds at once; a new one ends its oldest.
pub(super) const SESSIONS_PER_TOKEN: usize = 16;
/// A session unused this long is gone.
pub(super) const IDLE: Duration = Duration::from_secs(8 * 3600);
/// A session this old is gone, used or not: sign in again.
const LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// Sessions kept at most; past it a sign-in is refused (ending another
/// token's session for it would let one token sign every other out).
const MAX_SESSIONS: usize = 10_000;

/// A signed-in person: what they may see and do, and their CSRF token.
#[derive(Clone)]
pub(super) struct Signed {
    pub access: Access,
    pub csrf: String,
}

impl Signed {
    /// Whether `offered` (a form's `csrf` field) is this session's token.
    pub(super) fn csrf_matches(&self, offered: &str) -> bool {
        let (a, b) = (self.csrf.as_bytes(), offered.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
    }
}

struct Session {
    signed: Signed,
    seen: Instant,
    created: Instant,
}

impl Session {
    fn over(&self) -> bool {
        self.seen.elapsed() > IDLE || self.created.elapsed() > LIFETIME
    }
}

/// Why a sign-in is refused.
#[derive(Debug, thiserror::Error)]
pub(super) enum SignInRefused {
    #[error("A token is at least {MIN_TOKEN_CHARS} characters long.")]
    TooShort,
    #[error("That token is not valid here.")]
    Invalid(#[source] Error),
    #[error("The console holds as many sessions as it keeps; try again later.")]
    Full,
}

pub(super) struct Sessions {
    auth: Authenticator,
    /// The cookie's name: [`HOST_COOKIE`] over TLS, then sent over TLS only.
    cookie: &'static str,
    live: Mutex<HashMap<String, Session>>,
    random: SystemRandom,
}

impl Sessions {
    pub(super) fn new(auth: Authenticator, secure: bool) -> Sessions {
        let cookie = if secure { HOST_COOKIE } else { COOKIE };
        Sessions { auth, cookie, live: Mutex::new(HashMap::new()), random: SystemRandom::new() }
    }

    /// Whether a person must sign in with a token.
    pub(super) fn needs_token(&self) -> bool {
        self.auth.is_enabled()
    }

    /// The session the request's cookie names, if it is live and its token
    /// still valid (as the tokens in use now grant it).
    pub(super) fn find(&self, headers: &HeaderMap) -> Option<Signed> {
        let id = self.cookie_in(headers)?;
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let session = live.get_mut(id)?;
        if session.over() {
            live.remove(id);
            return None;
        }
        match session.signed.access.current() {
            Ok(access) => {
                session.seen = Instant::now();
                session.signed.access = access;
                Some(session.signed.clone())
            }
            Err(_) => {
                live.remove(id);
                None
            }
        }
    }

    /// Signs in with `token`: the cookie to set, or why not.
    pub(super) fn sign_in(&self, token: &str) -> Result<HeaderValue, SignInRefused> {
        let token = token.trim();
        if self.needs_token() && token.chars().count() < MIN_TOKEN_CHARS {
            return Err(SignInRefused::TooShort);
        }
        let access = self.auth.token(token).map_err(SignInRefused::Invalid)?;
        let (id, csrf) = (self.random_hex(), self.random_hex());
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.retain(|_, s| !s.over());
        // Without tokens every session is the same (open) access's.
        let name = access.name().to_owned();
        let mut own: Vec<_> = live
            .iter()
            .filter(|(_, s)| s.signed.access.name() == name)
            .map(|(id, s)| (s.created, id.clone()))
            .collect();
        if own.len() >= SESSIONS_PER_TOKEN {
            own.sort();
            for (_, id) in &own[..=own.len() - SESSIONS_PER_TOKEN] {
                live.remove(id);
            }
        } else if live.len() >= MAX_SESSIONS {
            return Err(SignInRefused::Full);
        }
        let now = Instant::now();
        live.insert(id.clone(), Session { signed: Signed { access, csrf }, seen: now, created: now });
        Ok(self.cookie_header(&id, IDLE.as_secs()))
    }

    /// Ends the request's session; the cookie that clears it.
    pub(super) fn sign_out(&self, headers: &HeaderMap) -> HeaderValue {
        if let Some(id) = self.cookie_in(headers) {
            self.live.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
        }
        self.cookie_header("", 0)
    }

    fn cookie_header(&self, id: &str, max_age: u64) -> HeaderValue {
        let secure = if self.cookie == HOST_COOKIE { "; Secure" } else { "" };
        HeaderValue::from_str(&format!(
            "{}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}",
            self.cookie
        ))
        .expect("a cookie of hex digits is a valid header")
    }

    /// How many session cookies the request carries: more than one means
    /// another site set one beside ours, and which the browser sent first
    /// is not to be trusted.
    pub(super) fn cookies(&self, headers: &HeaderMap) -> usize {
        pairs(headers).filter(|(name, _)| *name == self.cookie).count()
    }

    /// The session id the request's cookie holds.
    fn cookie_in<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str> {
        pairs(headers)
            .find(|(name, _)| *name == self.cookie)
            .map(|(_, value)| value)
            .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
    }

    fn random_hex(&self) -> String {
        let mut bytes = [0u8; 32];
        self.random.fill(&mut bytes).expect("the system's random source");
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Every cookie of the request, name and value, over all its `Cookie`
/// headers.
fn pairs(headers: &HeaderMap) -> impl Iterator<Item = (&str, &str)> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .map(|(name, value)| (name.trim(), value.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_cookie(value: &HeaderValue) -> HeaderMap {
        let mut headers = HeaderMap::new();
        let pair = value.to_str().unwrap().split(';').next().unwrap().to_owned();
        headers.insert(header::COOKIE, HeaderValue::from_str(&format!("other=1; {pair}")).unwrap());
        headers
    }

    #[test]
    fn a_session_lives_until_signed_out_and_checks_its_csrf_token() {
        let sessions = Sessions::new(Authenticator::disabled(), true);
        let set = sessions.sign_in("").unwrap();
        let text = set.to_str().unwrap();
        assert!(
            text.contains("HttpOnly") && text.contains("SameSite=Strict") && text.contains("Secure"),
            "{text}"
        );
        let headers = with_cookie(&set);
        let signed = sessions.find(&headers).expect("signed in");
        assert!(signed.csrf_matches(&signed.csrf.clone()));
        assert!(!signed.csrf_matches("") && !signed.csrf_matches(&"0".repeat(64)));
        assert!(sessions.find(&HeaderMap::new()).is_none());
        sessions.sign_out(&headers);
        assert!(sessions.find(&headers).is_none(), "signed out");
    }

    fn with_tokens() -> (tempfile::TempDir, Sessions) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        std::fs::write(
            &path,
            "[[token]]\nname = \"a\"\ntoken = \"a-token-0123456789\"\ntopics = [\"*\"]\n\n\
             [[token]]\nname = \"b\"\ntoken = \"b-token-0123456789\"\ntopics = [\"*\"]\n\n\
             [[token]]\nname = \"short\"\ntoken = \"short\"\ntopics = [\"*\"]\n",
        )
        .unwrap();
        let sessions = Sessions::new(Authenticator::load(&path).unwrap(), false);
        (dir, sessions)
    }

    #[test]
    fn a_token_ends_its_own_oldest_session_never_another_tokens() {
        let (_dir, sessions) = with_tokens();
        let b = with_cookie(&sessions.sign_in("b-token-0123456789").unwrap());
        let first = with_cookie(&sessions.sign_in("a-token-0123456789").unwrap());
        let mut a = Vec::new();
        for _ in 0..SESSIONS_PER_TOKEN {
            a.push(with_cookie(&sessions.sign_in("a-token-0123456789").unwrap()));
        }
        assert!(sessions.find(&first).is_none(), "a's oldest ended");
        assert!(a.iter().all(|h| sessions.find(h).is_some()), "a's newest live");
        assert!(sessions.find(&b).is_some(), "b's untouched");
    }

    #[test]
    fn a_short_token_is_not_taken_even_if_the_file_has_it() {
        let (_dir, sessions) = with_tokens();
        assert!(matches!(sessions.sign_in("short"), Err(SignInRefused::TooShort)));
        assert!(matches!(sessions.sign_in("c-token-0123456789"), Err(SignInRefused::Invalid(_))));
    }

    #[test]
    fn the_cookie_is_host_prefixed_over_tls_and_two_are_counted() {
        let sessions = Sessions::new(Authenticator::disabled(), true);
        let set = sessions.sign_in("").unwrap();
        let text = set.to_str().unwrap();
        assert!(text.starts_with("__Host-hourglass_console=") && text.contains("; Path=/;"), "{text}");
        assert!(!text.to_ascii_lowercase().contains("domain"), "{text}");
        let mut headers = with_cookie(&set);
        assert_eq!(sessions.cookies(&headers), 1);
        headers.append(header::COOKIE, HeaderValue::from_static("__Host-hourglass_console=00"));
        assert_eq!(sessions.cookies(&headers), 2);
        let plain = Sessions::new(Authenticator::disabled(), false);
        assert_eq!(plain.cookies(&headers), 0, "over plain HTTP the name is another");
    }
}
