//! Answers: a page as HTML (its template) or as JSON (its data), and errors the same way.

use std::time::SystemTime;

use askama::Template;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Json, Response};
use serde::Serialize;
use tracing::warn;

use super::State;
use crate::error::Error;
use crate::secrets::redact_urls;

/// What every page's frame needs.
#[derive(Debug, Clone)]
pub(crate) struct Frame {
    pub(crate) title: String,
    pub(crate) read_only: bool,
    pub(crate) csrf: String,
    pub(crate) inbox: bool,
}

impl Frame {
    pub(crate) fn new(state: &State, title: impl Into<String>) -> Frame {
        Frame {
            title: title.into(),
            read_only: state.config.read_only,
            csrf: state.csrf.clone(),
            inbox: state.config.inbox.is_some(),
        }
    }
}

/// Whether the answer is JSON: `?format=json`, or an `Accept` that prefers it.
pub(crate) fn wants_json(headers: &HeaderMap, format: Option<&str>) -> bool {
    if let Some(format) = format {
        return format == "json";
    }
    headers
        .get(header::ACCEPT)
        .and_then(|a| a.to_str().ok())
        .is_some_and(|a| a.starts_with("application/json"))
}

/// `data` as JSON, or `html` rendered.
pub(crate) fn page<T: Template, J: Serialize>(json: bool, data: J, html: impl FnOnce(J) -> T) -> Response {
    if json {
        return Json(data).into_response();
    }
    match html(data).render() {
        Ok(text) => Html(text).into_response(),
        Err(e) => {
            warn!(stage = "console", error = %e, "console page failed to render");
            (StatusCode::INTERNAL_SERVER_ERROR, "the page failed to render: see the console's log")
                .into_response()
        }
    }
}

#[derive(Template)]
#[template(path = "console/error.html")]
struct ErrorPage<'a> {
    frame: Frame,
    message: &'a str,
}

#[derive(Serialize)]
struct ErrorJson<'a> {
    error: &'a str,
}

/// An error page (or JSON `{"error": …}`) with `status` and `message`.
pub(crate) fn error(state: &State, json: bool, status: StatusCode, message: &str) -> Response {
    let mut response = page(json, ErrorJson { error: message }, |_| ErrorPage {
        frame: Frame::new(state, format!("{}", status.as_u16())),
        message,
    });
    *response.status_mut() = status;
    response
}

/// A library error as an answer: bad input 400, not found 404, a conflict 409, anything
/// else 500 with its message (database URLs' passwords left out: never a secret).
pub(crate) fn failure(state: &State, json: bool, e: &Error) -> Response {
    let status = match e {
        Error::Config(_) | Error::InvalidIdentifier { .. } => StatusCode::BAD_REQUEST,
        Error::NotFound(_) => StatusCode::NOT_FOUND,
        Error::Conflict(_) => StatusCode::CONFLICT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let message = redact_urls(&e.to_string()).into_owned();
    if status == StatusCode::INTERNAL_SERVER_ERROR {
        warn!(stage = "console", error = %message, "console request failed");
    }
    error(state, json, status, &message)
}

/// An RFC 3339 time from a form or query (`2026-12-06T10:00:00Z`), or the error naming it.
pub(crate) fn time(name: &str, value: Option<&str>) -> Result<Option<SystemTime>, Error> {
    match value.map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(None),
        // A browser's datetime-local field leaves the seconds out.
        Some(v) if v.len() == 16 => time(name, Some(&format!("{v}:00"))),
        Some(v) => humantime::parse_rfc3339_weak(v)
            .map(Some)
            .map_err(|e| Error::Config(format!("{name} {v:?}: not an RFC 3339 time ({e})"))),
    }
}

/// `value` unless empty or blank.
pub(crate) fn given(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

/// `path` with the query `pairs` (those with a value), percent-encoded.
pub(crate) fn link(path: &str, pairs: &[(&str, Option<String>)]) -> String {
    let query: Vec<String> = pairs
        .iter()
        .filter_map(|(k, v)| {
            v.as_ref().filter(|v| !v.is_empty()).map(|v| format!("{k}={}", super::security::url_encode(v)))
        })
        .collect();
    if query.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", query.join("&"))
    }
}
