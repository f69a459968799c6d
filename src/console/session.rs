//! Who is signed in to the console. A person signs in with a token of
//! `--auth-tokens` (with authentication off, with nothing); the console
//! keeps the token's [`Access`] under a random session id, given to the
//! browser as an `HttpOnly`, `SameSite=Strict` cookie, and looks the grant
//! up again on every request, so that a token revoked by a reload stops
//! working at once. Each session has its own random CSRF token, which
//! every form carries and every action checks.

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

/// The cookie's name.
const COOKIE: &str = "hourglass_console";
/// A session unused this long is gone.
pub const IDLE: Duration = Duration::from_secs(8 * 3600);
/// A session this old is gone, used or not: sign in again.
const LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// Sessions kept at most; past it the least recently used goes.
const MAX_SESSIONS: usize = 10_000;

/// A signed-in person: what they may see and do, and their CSRF token.
#[derive(Clone)]
pub struct Signed {
    pub access: Access,
    pub csrf: String,
}

impl Signed {
    /// Whether `offered` (a form's `csrf` field) is this session's token.
    pub fn csrf_matches(&self, offered: &str) -> bool {
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

pub struct Sessions {
    auth: Authenticator,
    /// Over TLS: the cookie is sent over TLS only.
    secure: bool,
    live: Mutex<HashMap<String, Session>>,
    random: SystemRandom,
}

impl Sessions {
    pub fn new(auth: Authenticator, secure: bool) -> Sessions {
        Sessions { auth, secure, live: Mutex::new(HashMap::new()), random: SystemRandom::new() }
    }

    /// Whether a person must sign in with a token.
    pub fn needs_token(&self) -> bool {
        self.auth.is_enabled()
    }

    /// The session the request's cookie names, if it is live and its token
    /// still valid (as the tokens in use now grant it).
    pub fn find(&self, headers: &HeaderMap) -> Option<Signed> {
        let id = cookie(headers)?;
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
    pub fn sign_in(&self, token: &str) -> Result<HeaderValue, Error> {
        let access = self.auth.token(token.trim())?;
        let (id, csrf) = (self.random_hex(), self.random_hex());
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.retain(|_, s| !s.over());
        if live.len() >= MAX_SESSIONS
            && let Some(oldest) = live.iter().min_by_key(|(_, s)| s.seen).map(|(id, _)| id.clone())
        {
            live.remove(&oldest);
        }
        let now = Instant::now();
        live.insert(id.clone(), Session { signed: Signed { access, csrf }, seen: now, created: now });
        Ok(self.cookie_header(&id, IDLE.as_secs()))
    }

    /// Ends the request's session; the cookie that clears it.
    pub fn sign_out(&self, headers: &HeaderMap) -> HeaderValue {
        if let Some(id) = cookie(headers) {
            self.live.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
        }
        self.cookie_header("", 0)
    }

    fn cookie_header(&self, id: &str, max_age: u64) -> HeaderValue {
        let secure = if self.secure { "; Secure" } else { "" };
        HeaderValue::from_str(&format!(
            "{COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}"
        ))
        .expect("a cookie of hex digits is a valid header")
    }

    fn random_hex(&self) -> String {
        let mut bytes = [0u8; 32];
        self.random.fill(&mut bytes).expect("the system's random source");
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// The session id the request's cookie holds.
fn cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value)
        .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
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
}
