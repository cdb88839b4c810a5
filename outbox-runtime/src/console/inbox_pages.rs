//! The inbox's pages: a consumer's applied records, its parked messages, one in full.

use std::sync::Arc;

use askama::Template;
use axum::extract::{Path, Query, State as StateOf};
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Serialize;

use super::pages::Params;
use super::render::{failure, given, page, time, Frame};
use super::State;
use crate::error::Error;
use crate::inbox::{AppliedCursor, AppliedPage, AppliedQuery, ParkedPage, ParkedQuery, ParkedSummary};

#[derive(Serialize)]
pub(crate) struct AppliedData {
    consumer: String,
    page: AppliedPage,
    next: Option<String>,
}

#[derive(Template)]
#[template(path = "console/applied.html")]
struct AppliedHtml {
    frame: Frame,
    data: AppliedData,
    params: Params,
}

pub(crate) async fn applied(
    StateOf(state): StateOf<Arc<State>>,
    headers: HeaderMap,
    Path(consumer): Path<String>,
    Query(params): Query<Params>,
) -> Response {
    let json = params.json(&headers);
    let read = async {
        let admin = state.inbox_admin(&consumer)?;
        let mut query = AppliedQuery::default()
            .limit(params.limit.unwrap_or(50))
            .since(time("since", params.since.as_deref())?)
            .until(time("until", params.until.as_deref())?);
        if let Some(o) = given(&params.outcome) {
            query = query.outcome(o);
        }
        if let Some(id) = params.event_id()? {
            query = query.event_id(id);
        }
        if let Some(id) = given(&params.aggregate_id) {
            query = query.aggregate_id(id);
        }
        if let Some(t) = given(&params.event_type) {
            query = query.event_type(t);
        }
        if let Some(cursor) = given(&params.before) {
            query = query.before(cursor.parse::<AppliedCursor>()?);
        }
        admin.applied(&query).await
    };
    match read.await {
        Ok(page_) => {
            let path = format!("/inbox/{}", super::security::url_encode(&consumer));
            let next = params.next(&path, page_.next.map(|n| n.to_string()));
            let data = AppliedData { consumer: consumer.clone(), page: page_, next };
            page(json, data, |data| AppliedHtml {
                frame: Frame::new(&state, format!("Inbox {consumer}")),
                data,
                params,
            })
        }
        Err(e) => failure(&state, json, &e),
    }
}

#[derive(Serialize)]
pub(crate) struct ParkedData {
    consumer: String,
    page: ParkedPage,
    next: Option<String>,
}

#[derive(Template)]
#[template(path = "console/parked.html")]
struct ParkedHtml {
    frame: Frame,
    data: ParkedData,
    params: Params,
}

pub(crate) async fn parked(
    StateOf(state): StateOf<Arc<State>>,
    headers: HeaderMap,
    Path(consumer): Path<String>,
    Query(params): Query<Params>,
) -> Response {
    let json = params.json(&headers);
    let read = async {
        let admin = state.inbox_admin(&consumer)?;
        let mut query = ParkedQuery::default().limit(params.limit.unwrap_or(50)).before(params.before_id()?);
        if let Some(s) = given(&params.status) {
            query = query.status(s);
        }
        if let Some(t) = given(&params.topic) {
            query = query.topic(t);
        }
        if let Some(t) = given(&params.event_type) {
            query = query.event_type(t);
        }
        if let Some(id) = params.event_id()? {
            query = query.event_id(id);
        }
        if let Some(key) = given(&params.key) {
            query = query.record_key(key_bytes(key));
        }
        admin.parked_page(&query).await
    };
    match read.await {
        Ok(page_) => {
            let path = format!("/inbox/{}/parked", super::security::url_encode(&consumer));
            let next = params.next(&path, page_.next.map(|n| n.to_string()));
            let data = ParkedData { consumer: consumer.clone(), page: page_, next };
            page(json, data, |data| ParkedHtml {
                frame: Frame::new(&state, format!("Parked, {consumer}")),
                data,
                params,
            })
        }
        Err(e) => failure(&state, json, &e),
    }
}

#[derive(Serialize)]
pub(crate) struct ParkedOneData {
    consumer: String,
    message: ParkedSummary,
    headers: serde_json::Value,
}

#[derive(Template)]
#[template(path = "console/parked_one.html")]
struct ParkedOneHtml {
    frame: Frame,
    data: ParkedOneData,
    headers: String,
    key: String,
}

pub(crate) async fn parked_one(
    StateOf(state): StateOf<Arc<State>>,
    headers: HeaderMap,
    Path((consumer, id)): Path<(String, i64)>,
    Query(params): Query<Params>,
) -> Response {
    let json = params.json(&headers);
    let read = async {
        let admin = state.inbox_admin(&consumer)?;
        let Some((message, headers)) = admin.parked_message(id).await? else {
            return Err(Error::NotFound(format!("no parked message {id} for consumer {consumer}")));
        };
        Ok(ParkedOneData { consumer: consumer.clone(), message, headers })
    };
    match read.await {
        Ok(data) => {
            let headers = serde_json::to_string_pretty(&data.headers).unwrap_or_default();
            page(json, data, |data| ParkedOneHtml {
                frame: Frame::new(&state, format!("Parked message {id}")),
                data,
                headers,
                key: super::random_secret(),
            })
        }
        Err(e) => failure(&state, json, &e),
    }
}

/// A record key as the pages write it: `0x` and an even number of hex digits for bytes that
/// are not UTF-8, else the text itself.
fn key_bytes(key: &str) -> Vec<u8> {
    let hex = key.strip_prefix("0x").filter(|h| h.len() % 2 == 0 && h.bytes().all(|b| b.is_ascii_hexdigit()));
    match hex {
        Some(hex) if !hex.is_empty() => {
            (0..hex.len()).step_by(2).filter_map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok()).collect()
        }
        _ => key.as_bytes().to_vec(),
    }
}
