//! The guard every request passes: its `Host`, the token, read-only mode and cross-site
//! checks on writes, a time limit, and the security headers on every response. The CSRF
//! token of a write is checked by its handler, which reads the form.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, Request, State as StateOf};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use subtle::ConstantTimeEq as _;
use tracing::info;

use super::State;

/// The cookie the login URL sets: the token itself, HTTP only, same site strict.
pub(crate) const COOKIE: &str = "outbox_console";

/// No inline script or style, nothing from anywhere but the console itself, no framing.
pub(crate) const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
     connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// A request's time limit (the live stream excepted).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) async fn guard(StateOf(state): StateOf<Arc<State>>, request: Request, next: Next) -> Response {
    let path = request.uri().path().to_owned();
    let method = request.method().clone();
    if let Some(refusal) = refusal(&state, &method, &path, request.headers()) {
        info!(%method, path = %path, stage = "console", reason = refusal.1, "console request refused");
        let mut response = (refusal.0, refusal.1).into_response();
        secure(response.headers_mut());
        return response;
    }
    let started = std::time::Instant::now();
    let mut response = if path == "/live" {
        next.run(request).await
    } else {
        match tokio::time::timeout(REQUEST_TIMEOUT, next.run(request)).await {
            Ok(response) => response,
            Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "the request took longer than 30 s").into_response(),
        }
    };
    secure(response.headers_mut());
    // The time the request took in the console (the database's included), for a
    // browser's developer tools and `cargo xtask bench`.
    let timing = format!("app;dur={:.3}", started.elapsed().as_secs_f64() * 1000.0);
    if let Ok(value) = HeaderValue::from_str(&timing) {
        response.headers_mut().insert("server-timing", value);
    }
    response
}

/// Why a request is refused, if it is.
fn refusal(
    state: &State,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
) -> Option<(StatusCode, &'static str)> {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
    match &state.config.token {
        // Without a token only loopback is bound: a page of another site reaching it by
        // rebinding its own name to 127.0.0.1 sends its own name as the host.
        None if !state.hosts.iter().any(|h| h.eq_ignore_ascii_case(host)) => {
            return Some((StatusCode::MISDIRECTED_REQUEST, "this console does not answer to that host name"));
        }
        Some(token) if path != "/login" && !presented(headers, token) => {
            return Some((
                StatusCode::UNAUTHORIZED,
                "this console needs its token: open the login URL it printed at start",
            ));
        }
        _ => {}
    }
    if method == Method::GET || method == Method::HEAD {
        return None;
    }
    if state.config.read_only {
        return Some((StatusCode::FORBIDDEN, "this console is read-only: it changes nothing"));
    }
    // The browser's own word, when it gives it, decides: under the pages' `no-referrer`
    // policy a same-origin form is sent with `Origin: null`. Without it, the origin must be
    // this console's.
    match headers.get("sec-fetch-site").and_then(|h| h.to_str().ok()) {
        Some("same-origin") => None,
        Some(_) => Some((StatusCode::FORBIDDEN, "a write from another site is refused")),
        None => {
            let origin = headers.get(header::ORIGIN).and_then(|h| h.to_str().ok());
            let ours = |o: &str| o == format!("http://{host}") || o == format!("https://{host}");
            origin
                .is_some_and(|o| !ours(o))
                .then_some((StatusCode::FORBIDDEN, "a write from another origin is refused"))
        }
    }
}

/// Whether the request carries `token`: in the console's cookie or as a bearer token.
fn presented(headers: &HeaderMap, token: &str) -> bool {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "));
    let cookies = headers.get_all(header::COOKIE).iter().filter_map(|h| h.to_str().ok());
    let from_cookie = cookies
        .flat_map(|h| h.split(';'))
        .filter_map(|c| c.trim().strip_prefix(COOKIE).and_then(|c| c.strip_prefix('=')));
    bearer.into_iter().chain(from_cookie).any(|given| same(given, token))
}

/// Compared in constant time (for equal lengths).
pub(crate) fn same(given: &str, secret: &str) -> bool {
    given.as_bytes().ct_eq(secret.as_bytes()).into()
}

fn secure(headers: &mut HeaderMap) {
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
}

#[derive(serde::Deserialize)]
pub(crate) struct Login {
    token: String,
}

/// `GET /login?token=…`: sets the cookie and leaves for the overview, so that the token
/// is gone from the address bar.
pub(crate) async fn login(StateOf(state): StateOf<Arc<State>>, Query(login): Query<Login>) -> Response {
    let Some(token) = &state.config.token else { return Redirect::to("/").into_response() };
    if !same(&login.token, token) {
        info!(stage = "console", "console login refused: wrong token");
        return (StatusCode::UNAUTHORIZED, "wrong token").into_response();
    }
    let cookie = format!("{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/");
    let mut response = Redirect::to("/").into_response();
    match HeaderValue::from_str(&cookie) {
        Ok(value) => {
            response.headers_mut().insert(header::SET_COOKIE, value);
            response
        }
        Err(_) => (StatusCode::BAD_REQUEST, "the token cannot be a cookie").into_response(),
    }
}

/// `text` percent-encoded for a URL's query.
pub(crate) fn url_encode(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string()
}
