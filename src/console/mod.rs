//! The operator console: web pages served by hourglass itself on their own
//! address (`--console-listen`; off unless set), built from the same calls
//! the gRPC API serves ([`Scheduler`]: in cluster mode the router, so any
//! node shows the whole cluster), with the caller's grant.
//!
//! - [`session`]: sign-in with a token of `--auth-tokens`, a session
//!   cookie, and a CSRF token that every action checks;
//! - [`overview`]: counts, this node's recent deliveries ([`pulse`]), and
//!   what comes due (`Forecast`);
//! - [`find`]: pending messages by label, topic and time; a message by id,
//!   its record, and cancel, reschedule and re-drive;
//! - [`series`] and [`policies`]: recurring schedules, and each topic's
//!   pause, rate limit, deadline and dead-letter topic, seen and changed;
//! - [`cluster`]: the nodes, the shards each owns and keeps standby, how
//!   far each copy is behind the log, the latest moves;
//! - [`html`]: the pages' markup, where everything a message holds is
//!   escaped;
//! - [`serve`]: the listener: connections bounded in number, per peer
//!   and in time, and HTTPS with the gRPC port's certificate when it has
//!   one;
//! - [`limit`]: how often the sign-in form may be tried.
//!
//! The pages carry no script: the Content-Security-Policy every answer
//! sends allows none, so markup in a message's content cannot run even if
//! it slipped through the escaping. Actions are POSTed forms; one that
//! comes from another site (its `Origin` or `Sec-Fetch-Site` says so) or
//! without the session's CSRF token is refused. Without tokens, only a
//! request from a loopback address that names a loopback host is served
//! ([`guard`]).
//!
//! A client cannot hold the console by sending slowly: a request's body
//! must arrive whole (at most [`MAX_FORM_BYTES`]) within
//! `--console-request-timeout`, and only then, for a signed-in request,
//! is one of the [`MAX_PAGES`] permits taken; a request without a
//! session (a redirect, the sign-in form) is cheap and takes none.

mod cluster;
mod find;
mod html;
mod limit;
mod overview;
mod policies;
mod pulse;
mod recent;
mod series;
mod serve;
mod session;

use std::{net::SocketAddr, sync::Arc, time::Instant};

use axum::{
    Form, Router,
    body::Body,
    extract::{ConnectInfo, Query, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Redirect, Response},
    routing::{get, post},
};
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub(crate) use self::serve::Limits;
use self::{
    find::{Act, FindQuery},
    html::{esc, page},
    limit::Attempts,
    overview::OverviewQuery,
    pulse::Pulse,
    session::{Sessions, SignInRefused, Signed},
};
use crate::{
    admin::PolicyService,
    auth::Authenticator,
    clock::Clock,
    scheduler::{Call, Scheduler, SeriesCalls},
};

/// Signed-in requests served at once; more are answered 503 at once.
const MAX_PAGES: usize = 16;

/// The largest request body taken: the console's forms are a few short
/// fields; larger is answered 413 before it is read.
pub(crate) const MAX_FORM_BYTES: usize = 16 * 1024;

/// How long a page's calls may take before the page says so.
const CALL_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// The calls the console is made of: those the gRPC services serve.
pub(crate) struct Calls {
    pub scheduler: Arc<dyn Scheduler>,
    pub series: Arc<dyn SeriesCalls>,
    pub policies: Arc<PolicyService>,
}

/// What the console answers from.
pub(crate) struct Console {
    scheduler: Arc<dyn Scheduler>,
    series: Arc<dyn SeriesCalls>,
    policies: Arc<PolicyService>,
    sessions: Sessions,
    pulse: Pulse,
    /// The overview's slow counts, shown again while fresh.
    recent: recent::Recent,
    clock: Arc<dyn Clock>,
    /// Requests served at once: each makes the calls its page shows.
    busy: Arc<tokio::sync::Semaphore>,
    /// The gRPC port's certificate, when it speaks TLS: the console does too.
    tls: Option<crate::tls::LiveTls>,
    limits: Limits,
    /// Sign-in attempts lately, to slow down guessing.
    attempts: Attempts,
}

impl Console {
    pub(crate) fn new(
        calls: Calls,
        auth: Authenticator,
        clock: Arc<dyn Clock>,
        tls: Option<crate::tls::LiveTls>,
        limits: Limits,
    ) -> Console {
        let Calls { scheduler, series, policies } = calls;
        Console {
            scheduler,
            series,
            policies,
            sessions: Sessions::new(auth, tls.is_some()),
            pulse: Pulse::default(),
            recent: recent::Recent::default(),
            clock,
            busy: Arc::new(tokio::sync::Semaphore::new(MAX_PAGES)),
            tls,
            limits,
            attempts: Attempts::new(Instant::now()),
        }
    }

    /// Serves the console on `listener` until `stop`.
    pub(crate) async fn serve(self: Arc<Self>, listener: TcpListener, stop: CancellationToken) {
        let pulse = tokio::spawn({
            let console = Arc::clone(&self);
            let stop = stop.clone();
            async move { console.pulse.run(stop).await }
        });
        let app = Router::new()
            .route("/", get(overview))
            .route("/messages", get(messages))
            .route("/message", get(message))
            .route("/message/{action}", post(act))
            .route("/series", get(series_page).post(series_change))
            .route("/policies", get(policies_page).post(policies_change))
            .route("/cluster", get(cluster_page))
            .route("/sign-in", get(sign_in_page).post(sign_in))
            .route("/sign-out", post(sign_out))
            .route("/console.css", get(style))
            .fallback(|| async { (StatusCode::NOT_FOUND, "no such page") })
            .layer(axum::middleware::from_fn_with_state(Arc::clone(&self), guard))
            .layer(axum::middleware::map_response(headers))
            .with_state(Arc::clone(&self));
        serve::serve(listener, self.tls.clone(), app, self.limits, stop).await;
        let _ = pulse.await;
    }

    fn call(&self, signed: &Signed) -> Call {
        Call {
            access: signed.access.clone(),
            forwarded: false,
            deadline: Some(tokio::time::Instant::now() + CALL_DEADLINE),
        }
    }

    /// The signed-in person, or the answer that sends them to sign in.
    fn signed(&self, headers: &HeaderMap) -> Result<Signed, Refusal> {
        self.sessions.find(headers).ok_or(Refusal::SignIn)
    }

    /// The signed-in person, for an action: refused when it comes from
    /// another site or without the session's CSRF token.
    fn acting(&self, headers: &HeaderMap, csrf: &str) -> Result<Signed, Refusal> {
        if from_elsewhere(headers) {
            return Err(Refusal::Forbidden("This action came from another site, and was refused."));
        }
        let signed = self.signed(headers)?;
        if !signed.csrf_matches(csrf) {
            return Err(Refusal::Forbidden(
                "This form has expired or did not come from the console: load the page again.",
            ));
        }
        Ok(signed)
    }

    fn page(&self, title: &str, signed: &Signed, body: &str) -> Response {
        let who = if self.sessions.needs_token() { signed.access.name() } else { "" };
        html_response(page(title, Some(who), &signed.csrf, body))
    }
}

/// Why a request is not served.
enum Refusal {
    /// No session: off to sign in.
    SignIn,
    Forbidden(&'static str),
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Refusal::SignIn => Redirect::to("/sign-in").into_response(),
            Refusal::Forbidden(why) => forbidden(why),
        }
    }
}

fn forbidden(why: &str) -> Response {
    (
        StatusCode::FORBIDDEN,
        html_response(page("Refused", None, "", &format!("<p class=\"error\">{}</p>", esc(why)))),
    )
        .into_response()
}

fn html_response(body: String) -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response()
}

/// In front of every page: without tokens, only a request from a loopback
/// address to a loopback name is served (a site whose name a DNS rebinding
/// points at 127.0.0.1 would otherwise drive the console from a browser on
/// this machine, and a console reached some other way, through a local
/// forward say, would serve anyone); a request with two session cookies is
/// refused; the body is read whole, bounded in size and time; and then at
/// most [`MAX_PAGES`] signed-in requests are served at once.
async fn guard(
    State(console): State<Arc<Console>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let peer = request.extensions().get::<ConnectInfo<SocketAddr>>().map(|ConnectInfo(peer)| *peer);
    let local = peer.is_some_and(|p| p.ip().to_canonical().is_loopback()) && local_host(request.headers());
    if !(console.sessions.needs_token() || local) {
        return forbidden(
            "Without --auth-tokens the console answers only requests from this machine's loopback address that \
             name a loopback host (127.0.0.1, [::1], localhost).",
        );
    }
    if console.sessions.cookies(request.headers()) > 1 {
        return (
            StatusCode::BAD_REQUEST,
            "This request carries two session cookies, one of them not the console's: clear the cookies of \
             this site and sign in again.",
        )
            .into_response();
    }
    let request = match whole(request, console.limits.request_timeout).await {
        Ok(request) => request,
        Err(refused) => return refused,
    };
    // After the body: a client that sends slowly holds no permit meanwhile.
    let _page = match console.sessions.find(request.headers()) {
        None => None,
        Some(_) => match Arc::clone(&console.busy).try_acquire_owned() {
            Ok(page) => Some(page),
            Err(_) => {
                return (StatusCode::SERVICE_UNAVAILABLE, "the console is busy with other pages; try again")
                    .into_response();
            }
        },
    };
    next.run(request).await
}

/// The request with its body read whole: at most [`MAX_FORM_BYTES`], and
/// within `timeout` of its head (which had as long to arrive). Either
/// refusal closes the connection: what is left of the body is not read.
async fn whole(
    request: axum::extract::Request,
    timeout: std::time::Duration,
) -> Result<axum::extract::Request, Response> {
    let closing = |status: StatusCode, why: &'static str| {
        (status, [(header::CONNECTION, HeaderValue::from_static("close"))], why).into_response()
    };
    let too_large = || closing(StatusCode::PAYLOAD_TOO_LARGE, "The console takes forms of at most 16 KiB.");
    let declared = request.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok());
    if declared.and_then(|v| v.parse::<u64>().ok()).is_some_and(|n| n > MAX_FORM_BYTES as u64) {
        return Err(too_large());
    }
    let (parts, body) = request.into_parts();
    match tokio::time::timeout(timeout, axum::body::to_bytes(body, MAX_FORM_BYTES)).await {
        Ok(Ok(bytes)) => Ok(axum::extract::Request::from_parts(parts, Body::from(bytes))),
        // Over the limit (a chunked body), or cut off: the client that cut
        // it off reads no answer.
        Ok(Err(_)) => Err(too_large()),
        Err(_) => Err(closing(StatusCode::REQUEST_TIMEOUT, "The request's body did not arrive in time.")),
    }
}

/// Whether the request names a loopback host: an address, or localhost.
fn local_host(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else { return false };
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Whether a request says it came from a page of another site.
fn from_elsewhere(headers: &HeaderMap) -> bool {
    let value = |name| headers.get(name).and_then(|v: &HeaderValue| v.to_str().ok());
    if value("sec-fetch-site").is_some_and(|site| site != "same-origin" && site != "none") {
        return true;
    }
    match (value("origin"), value("host")) {
        (Some(origin), Some(host)) => origin.split_once("://").is_none_or(|(_, rest)| rest != host),
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// What every answer carries: no script may run, no other site may frame
/// or read the page, nothing is cached.
async fn headers(mut response: Response) -> Response {
    let h = response.headers_mut();
    let set = [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; \
             base-uri 'none'",
        ),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        // Not no-referrer: with it a browser sends `Origin: null` on the
        // console's own forms, which then look like another site's.
        (header::REFERRER_POLICY, "same-origin"),
        (header::CACHE_CONTROL, "no-store"),
    ];
    for (name, value) in set {
        h.insert(name, HeaderValue::from_static(value));
    }
    response
}

async fn style() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8"), (header::CACHE_CONTROL, "max-age=3600")],
        include_str!("console.css"),
    )
        .into_response()
}

async fn overview(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Query(query): Query<OverviewQuery>,
) -> Result<Response, Refusal> {
    let signed = console.signed(&headers)?;
    let now = console.clock.now();
    let body = overview::render(
        overview::Sources {
            scheduler: console.scheduler.as_ref(),
            pulse: &console.pulse,
            recent: &console.recent,
        },
        &console.call(&signed),
        &query,
        now,
    )
    .await
    .unwrap_or_else(html::refused);
    Ok(console.page("Overview", &signed, &body))
}

async fn messages(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Query(query): Query<FindQuery>,
) -> Result<Response, Refusal> {
    let signed = console.signed(&headers)?;
    if !query.id.trim().is_empty() {
        return Ok(Redirect::to(&format!("/message?id={}", html::Query(query.id.trim()))).into_response());
    }
    let body = find::render(console.scheduler.as_ref(), &console.call(&signed), &query)
        .await
        .unwrap_or_else(html::refused);
    Ok(console.page("Find messages", &signed, &body))
}

#[derive(Deserialize)]
struct MessageQuery {
    id: String,
    /// Its tenant, for an operator's look at another tenant's message.
    #[serde(default)]
    tenant: String,
    #[serde(default)]
    view: String,
}

async fn message(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Query(query): Query<MessageQuery>,
) -> Result<Response, Refusal> {
    let signed = console.signed(&headers)?;
    let call = console.call(&signed);
    let named = (query.tenant.as_str(), query.id.as_str());
    let body =
        find::message(console.scheduler.as_ref(), &call, named, &signed.csrf, query.view == "hex").await;
    Ok(console.page(&format!("Message {}", query.id), &signed, &body))
}

/// Cancel or reschedule (`/message/cancel`, `/message/reschedule`): the
/// outcome, above the message as it is now.
async fn act(
    State(console): State<Arc<Console>>,
    axum::extract::Path(action): axum::extract::Path<String>,
    headers: HeaderMap,
    Form(form): Form<Act>,
) -> Result<Response, Refusal> {
    let signed = console.acting(&headers, &form.csrf)?;
    let (scheduler, call) = (console.scheduler.as_ref(), console.call(&signed));
    let outcome = match action.as_str() {
        "cancel" => find::cancel(scheduler, &call, &form.tenant, &form.id).await,
        "reschedule" => find::reschedule(scheduler, &call, &form.tenant, &form.id, &form.at).await,
        _ => return Ok((StatusCode::NOT_FOUND, "no such page").into_response()),
    };
    let body = find::message(scheduler, &call, (&form.tenant, &form.id), &signed.csrf, false).await;
    Ok(console.page(&format!("Message {}", form.id), &signed, &(outcome + &body)))
}

async fn series_page(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Query(query): Query<series::SeriesQuery>,
) -> Result<Response, Refusal> {
    let signed = console.signed(&headers)?;
    let body = series::render(console.series.as_ref(), &console.call(&signed), &query, &signed.csrf).await;
    Ok(console.page("Series", &signed, &body))
}

async fn series_change(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Form(form): Form<series::SeriesForm>,
) -> Result<Response, Refusal> {
    let signed = console.acting(&headers, &form.csrf)?;
    let call = console.call(&signed);
    let outcome = series::apply(console.series.as_ref(), &call, &form).await;
    let body = series::render(console.series.as_ref(), &call, &Default::default(), &signed.csrf).await;
    Ok(console.page("Series", &signed, &(outcome + &body)))
}

async fn policies_page(State(console): State<Arc<Console>>, headers: HeaderMap) -> Result<Response, Refusal> {
    let signed = console.signed(&headers)?;
    let body = policies::render(&console.policies, &signed.access, &signed.csrf);
    Ok(console.page("Dispatch policies", &signed, &body))
}

async fn policies_change(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Form(form): Form<policies::PolicyForm>,
) -> Result<Response, Refusal> {
    let signed = console.acting(&headers, &form.csrf)?;
    let outcome = policies::apply(&console.policies, &signed.access, &form).await;
    let body = policies::render(&console.policies, &signed.access, &signed.csrf);
    Ok(console.page("Dispatch policies", &signed, &(outcome + &body)))
}

async fn cluster_page(State(console): State<Arc<Console>>, headers: HeaderMap) -> Result<Response, Refusal> {
    let signed = console.signed(&headers)?;
    let body = cluster::render(console.scheduler.as_ref(), &console.call(&signed)).await;
    Ok(console.page("Cluster", &signed, &body))
}

async fn sign_in_page(State(console): State<Arc<Console>>, headers: HeaderMap) -> Response {
    if console.sessions.find(&headers).is_some() {
        return Redirect::to("/").into_response();
    }
    if !console.sessions.needs_token() {
        // Nothing to ask: a session, for its CSRF token.
        return signed_in(&console, "");
    }
    sign_in_form("")
}

fn sign_in_form(error: &str) -> Response {
    let error = if error.is_empty() {
        String::new()
    } else {
        format!("<p class=\"error\" id=\"refused\">{}</p>", esc(error))
    };
    html_response(page(
        "Sign in",
        None,
        "",
        &format!(
            "{error}<form class=\"sign-in\" method=\"post\" action=\"/sign-in\">\
             <label>Token <input type=\"password\" name=\"token\" autocomplete=\"current-password\" autofocus></label>\
             <button id=\"sign-in\">Sign in</button></form>\
             <p class=\"hint\">A token of the server's tokens file (--auth-tokens): you see and act on what it \
             covers, as its API calls would.</p>"
        ),
    ))
}

#[derive(Deserialize)]
struct SignIn {
    #[serde(default)]
    token: String,
}

async fn sign_in(
    State(console): State<Arc<Console>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Form(form): Form<SignIn>,
) -> Response {
    if from_elsewhere(&headers) {
        return forbidden("This sign-in came from another site, and was refused.");
    }
    if console.sessions.needs_token()
        && let Err(wait) = console.attempts.begin(serve::peer_key(peer.ip()), Instant::now())
    {
        let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        let form = sign_in_form(&format!("Too many sign-ins; try again in {seconds} s."));
        return (StatusCode::TOO_MANY_REQUESTS, [(header::RETRY_AFTER, seconds.to_string())], form)
            .into_response();
    }
    signed_in(&console, &form.token)
}

fn signed_in(console: &Console, token: &str) -> Response {
    match console.sessions.sign_in(token) {
        Ok(cookie) => {
            let mut response = Redirect::to("/").into_response();
            response.headers_mut().insert(header::SET_COOKIE, cookie);
            response
        }
        Err(refused @ SignInRefused::Full) => {
            (StatusCode::SERVICE_UNAVAILABLE, sign_in_form(&refused.to_string())).into_response()
        }
        Err(refused) => {
            console.attempts.failed(Instant::now());
            (StatusCode::UNAUTHORIZED, sign_in_form(&refused.to_string())).into_response()
        }
    }
}

#[derive(Deserialize)]
struct SignOut {
    #[serde(default)]
    csrf: String,
}

async fn sign_out(
    State(console): State<Arc<Console>>,
    headers: HeaderMap,
    Form(form): Form<SignOut>,
) -> Result<Response, Refusal> {
    console.acting(&headers, &form.csrf)?;
    let mut response = Redirect::to("/sign-in").into_response();
    response.headers_mut().insert(header::SET_COOKIE, console.sessions.sign_out(&headers));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_names_are_local() {
        let host = |h: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::HOST, HeaderValue::from_static(h));
            local_host(&headers)
        };
        for local in ["127.0.0.1:9470", "127.0.0.1", "localhost:9470", "[::1]:9470", "127.1.2.3:80"] {
            assert!(host(local), "{local}");
        }
        for other in ["evil.example:9470", "10.0.0.1:9470", "[::2]:1", "localhost.evil.example"] {
            assert!(!host(other), "{other}");
        }
        assert!(!local_host(&HeaderMap::new()), "no Host");
    }

    #[test]
    fn an_action_from_another_site_is_told_apart() {
        let with = |pairs: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            pairs.iter().for_each(|(k, v)| {
                h.insert(*k, HeaderValue::from_static(v));
            });
            from_elsewhere(&h)
        };
        assert!(!with(&[]));
        assert!(!with(&[("origin", "http://127.0.0.1:9465"), ("host", "127.0.0.1:9465")]));
        assert!(!with(&[("sec-fetch-site", "same-origin")]));
        assert!(with(&[("origin", "https://evil.example"), ("host", "127.0.0.1:9465")]));
        assert!(with(&[("origin", "null"), ("host", "127.0.0.1:9465")]));
        assert!(with(&[("sec-fetch-site", "cross-site")]));
        assert!(with(&[("sec-fetch-site", "same-site")]));
    }
}
