//! The console's pages: each reads the operator API, and answers its data as JSON or its
//! template as HTML. Filters live in the URL, so every list is a link to keep.

use std::sync::Arc;

use askama::Template;
use axum::extract::{Path, Query, State as StateOf};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse as _, Response};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::live::{read_overview, OverviewData};
use super::render::{self, failure, given, link, page, time, wants_json, Frame};
use super::State;
use crate::action::AuditPage;
use crate::error::{Error, Result};
use crate::inbox::ParkedGroup;
use crate::ops::{EventDetail, EventPage, EventQuery, EventState, FailureGroup, Payload};

/// The query of every page: its filters, the page cursor, the format.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Params {
    pub(super) format: Option<String>,
    pub(super) state: Option<String>,
    pub(super) status: Option<String>,
    pub(super) outcome: Option<String>,
    pub(super) event_id: Option<String>,
    pub(super) aggregate_id: Option<String>,
    pub(super) aggregate_type: Option<String>,
    pub(super) event_type: Option<String>,
    pub(super) topic: Option<String>,
    pub(super) since: Option<String>,
    pub(super) until: Option<String>,
    pub(super) before: Option<String>,
    pub(super) limit: Option<u32>,
    pub(super) consumer: Option<String>,
    /// A Kafka record key (`0x…` for bytes that are not UTF-8).
    pub(super) key: Option<String>,
    /// `body`: the overview's body alone, for the live page's polling.
    pub(super) fragment: Option<String>,
}

impl Params {
    pub(super) fn json(&self, headers: &HeaderMap) -> bool {
        wants_json(headers, self.format.as_deref())
    }

    pub(super) fn event_id(&self) -> Result<Option<Uuid>> {
        given(&self.event_id)
            .map(|id| id.parse().map_err(|_| Error::Config(format!("event id {id:?}: not a UUID"))))
            .transpose()
    }

    pub(super) fn before_id(&self) -> Result<Option<i64>> {
        given(&self.before)
            .map(|b| b.parse().map_err(|_| Error::Config(format!("page cursor {b:?}: not a row id"))))
            .transpose()
    }

    /// The link to the same list from `before` on.
    pub(super) fn next(&self, path: &str, before: Option<String>) -> Option<String> {
        let keep = |v: &Option<String>| given(v).map(str::to_owned);
        before.map(|before| {
            link(
                path,
                &[
                    ("state", keep(&self.state)),
                    ("status", keep(&self.status)),
                    ("outcome", keep(&self.outcome)),
                    ("event_id", keep(&self.event_id)),
                    ("aggregate_id", keep(&self.aggregate_id)),
                    ("aggregate_type", keep(&self.aggregate_type)),
                    ("event_type", keep(&self.event_type)),
                    ("key", keep(&self.key)),
                    ("topic", keep(&self.topic)),
                    ("since", keep(&self.since)),
                    ("until", keep(&self.until)),
                    ("limit", self.limit.map(|l| l.to_string())),
                    ("before", Some(before)),
                ],
            )
        })
    }
}

#[derive(Template)]
#[template(path = "console/overview.html")]
pub(crate) struct OverviewHtml {
    pub(crate) frame: Frame,
    pub(crate) data: OverviewData,
}

pub(crate) async fn overview(
    StateOf(state): StateOf<Arc<State>>,
    headers: HeaderMap,
    Query(params): Query<Params>,
) -> Response {
    let json = params.json(&headers);
    // The polling fallback of a live page shares the streams' overview; a page load reads
    // its own.
    if !json && params.fragment.as_deref() == Some("body") {
        return match super::live::shared_overview(&state).await {
            Ok(data) => {
                let frame = Frame::new(&state, "Overview");
                match (super::live::OverviewBody { frame: &frame, data: &data }).render() {
                    Ok(html) => axum::response::Html(html).into_response(),
                    Err(e) => render::error(&state, false, StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
                }
            }
            Err(e) => failure(&state, false, &e),
        };
    }
    match read_overview(&state).await {
        Ok(data) => page(json, data, |data| OverviewHtml { frame: Frame::new(&state, "Overview"), data }),
        Err(e) => failure(&state, json, &e),
    }
}

#[derive(Serialize)]
pub(crate) struct EventsData {
    page: EventPage,
    next: Option<String>,
}

#[derive(Template)]
#[template(path = "console/events.html")]
struct EventsHtml {
    frame: Frame,
    data: EventsData,
    params: Params,
    states: [EventState; 5],
    /// The replay form's key.
    key: String,
}

fn event_query(params: &Params) -> Result<EventQuery> {
    let mut query = EventQuery::default().limit(params.limit.unwrap_or(50));
    if let Some(state) = given(&params.state) {
        query = query.state(state.parse()?);
    }
    if let Some(id) = params.event_id()? {
        query = query.event_id(id);
    }
    if let Some(id) = given(&params.aggregate_id) {
        query = query.aggregate_id(id);
    }
    if let Some(t) = given(&params.aggregate_type) {
        query = query.aggregate_type(t);
    }
    if let Some(t) = given(&params.event_type) {
        query = query.event_type(t);
    }
    if let Some(t) = given(&params.topic) {
        query = query.topic(t);
    }
    Ok(query
        .since(time("since", params.since.as_deref())?)
        .until(time("until", params.until.as_deref())?)
        .before(params.before_id()?))
}

pub(crate) async fn events(
    StateOf(state): StateOf<Arc<State>>,
    headers: HeaderMap,
    Query(params): Query<Params>,
) -> Response {
    let json = params.json(&headers);
    let read = async {
        let query = event_query(&params)?;
        state.ops.events(&state.pool, &query).await
    };
    match read.await {
        Ok(page_) => {
            let next = params.next("/events", page_.next.map(|n| n.to_string()));
            let data = EventsData { page: page_, next };
            page(json, data, |data| EventsHtml {
                frame: Frame::new(&state, "Events"),
                data,
                params,
                states: EventState::ALL,
                key: super::random_secret(),
            })
        }
        Err(e) => failure(&state, json, &e),
    }
}

#[derive(Serialize)]
pub(crate) struct EventData {
    event: EventDetail,
    /// The payload, when the console shows payloads (redacted, cut).
    payload: Option<Payload>,
}

#[derive(Template)]
#[template(path = "console/event.html")]
struct EventHtml {
    frame: Frame,
    data: EventData,
    headers: String,
    key: String,
}

pub(crate) async fn event(
    StateOf(state): StateOf<Arc<State>>,
    headers: HeaderMap,
    Path(event_id): Path<String>,
    Query(params): Query<Params>,
) -> Response {
    let json = params.json(&headers);
    let read = async {
        let id: Uuid =
            event_id.parse().map_err(|_| Error::Config(format!("event id {event_id:?}: not a UUID")))?;
        let Some(event) = state.ops.event(&state.pool, id).await? else {
            return Err(Error::NotFound(format!(
                "no event {id} in the outbox (published and cleaned up, or never appended)"
            )));
        };
        let payload = if state.config.show_payloads {
            let mut payload = state.ops.event_payload(&state.pool, id, state.config.payload_limit).await?;
            if let (Some(payload), Some(redactor)) = (payload.as_mut(), &state.config.redactor) {
                payload.text = redactor(&event.summary.event_type, &payload.text);
            }
            payload
        } else {
            None
        };
        Ok(EventData { event, payload })
    };
    match read.await {
        Ok(data) => {
            let headers = serde_json::to_string_pretty(&data.event.headers).unwrap_or_default();
            page(json, data, |data| EventHtml {
                frame: Frame::new(&state, format!("Event {event_id}")),
                data,
                headers,
                key: super::random_secret(),
            })
        }
        Err(e) => failure(&state, json, &e),
    }
}

#[derive(Serialize)]
pub(crate) struct FailuresData {
    outbox: Vec<FailureGroup>,
    inbox: Vec<ConsumerGroups>,
}

#[derive(Serialize)]
struct ConsumerGroups {
    pub(super) consumer: String,
    groups: Vec<ParkedGroup>,
}

#[derive(Template)]
#[template(path = "console/failures.html")]
struct FailuresHtml {
    frame: Frame,
    data: FailuresData,
    key: String,
}

pub(crate) async fn failures(
    StateOf(state): StateOf<Arc<State>>,
    headers: HeaderMap,
    Query(params): Query<Params>,
) -> Response {
    let json = params.json(&headers);
    let read = async {
        let outbox = state.ops.failure_groups_capped(&state.pool, state.config.count_cap).await?;
        let mut inbox = Vec::new();
        if let Some(any) = state.inbox("") {
            for consumer in any.consumers().await? {
                if let Some(admin) = state.inbox(&consumer) {
                    let groups = admin.parked_groups_capped(state.config.count_cap).await?;
                    if !groups.is_empty() {
                        inbox.push(ConsumerGroups { consumer, groups });
                    }
                }
            }
        }
        Ok::<_, Error>(FailuresData { outbox, inbox })
    };
    match read.await {
        Ok(data) => page(json, data, |data| FailuresHtml {
            frame: Frame::new(&state, "Failures"),
            data,
            key: super::random_secret(),
        }),
        Err(e) => failure(&state, json, &e),
    }
}

#[derive(Serialize)]
pub(crate) struct AuditData {
    pub(super) consumer: Option<String>,
    page: AuditPage,
    next: Option<String>,
}

#[derive(Template)]
#[template(path = "console/audit.html")]
struct AuditHtml {
    frame: Frame,
    data: AuditData,
}

pub(crate) async fn audit(
    StateOf(state): StateOf<Arc<State>>,
    headers: HeaderMap,
    Query(params): Query<Params>,
) -> Response {
    let json = params.json(&headers);
    let consumer = given(&params.consumer).map(str::to_owned);
    let read = async {
        let limit = params.limit.unwrap_or(50);
        match &consumer {
            Some(consumer) => state.inbox_admin(consumer)?.audit(params.before_id()?, limit).await,
            None => state.ops.audit(&state.pool, params.before_id()?, limit).await,
        }
    };
    match read.await {
        Ok(page_) => {
            let next = page_.next.map(|before| {
                link("/audit", &[("consumer", consumer.clone()), ("before", Some(before.to_string()))])
            });
            let data = AuditData { consumer, page: page_, next };
            page(json, data, |data| AuditHtml { frame: Frame::new(&state, "Audit"), data })
        }
        Err(e) => failure(&state, json, &e),
    }
}

pub(crate) async fn not_found(
    StateOf(state): StateOf<Arc<State>>,
    headers: HeaderMap,
    Query(params): Query<Params>,
) -> Response {
    render::error(&state, params.json(&headers), StatusCode::NOT_FOUND, "no such page")
}
