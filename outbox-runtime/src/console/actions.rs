//! The console's writes: retry and discard, outbox and inbox, by id or by filter, and the
//! outbox's replay (by event id, type, aggregate, time). A form
//! without `confirm=yes` is a dry run that shows the count and the confirm form; a confirmed
//! one runs the library's action (bounded transactions, exactly the rows matching when it
//! starts, one audit row) once per form: a second submit of the same form (its `key`)
//! shows the first one's result and changes nothing.

use std::sync::Arc;

use askama::Template;
use axum::extract::{Path, State as StateOf};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{post, MethodRouter};
use axum::Form;
use serde::{Deserialize, Serialize};
use tracing::info;

use super::render::{self, failure, given, page, time, wants_json, Frame};
use super::security::same;
use super::{State, WriteRoute};
use crate::action::{ActionFilter, ActionReport};
use crate::error::{Error, Result};
use crate::ops::{ReplayFilter, ReplayReport};

/// What an action did: its report, and a replay's own counts.
pub(crate) type Outcome = (ActionReport, Option<ReplayReport>);

/// The fields of an action's form.
#[derive(Debug, Default, Deserialize, Serialize, Clone)]
pub(crate) struct ActionForm {
    #[serde(default, skip_serializing)]
    csrf: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    confirm: Option<String>,
    #[serde(default, skip_serializing)]
    format: Option<String>,
    event_id: Option<String>,
    parked_id: Option<String>,
    event_type: Option<String>,
    aggregate_id: Option<String>,
    topic: Option<String>,
    cause: Option<String>,
    reason_contains: Option<String>,
    since: Option<String>,
    until: Option<String>,
    /// Why, for a discard.
    reason: Option<String>,
}

impl ActionForm {
    fn filter(&self) -> Result<ActionFilter> {
        let mut filter = ActionFilter::default()
            .since(time("since", self.since.as_deref())?)
            .until(time("until", self.until.as_deref())?);
        if let Some(id) = given(&self.event_id) {
            filter = filter
                .event_id(id.parse().map_err(|_| Error::Config(format!("event id {id:?}: not a UUID")))?);
        }
        if let Some(id) = given(&self.parked_id) {
            filter = filter.parked_id(
                id.parse().map_err(|_| Error::Config(format!("parked message id {id:?}: not a number")))?,
            );
        }
        if let Some(t) = given(&self.event_type) {
            filter = filter.event_type(t);
        }
        if let Some(t) = given(&self.topic) {
            filter = filter.topic(t);
        }
        if let Some(c) = self.cause.as_deref().filter(|c| !c.is_empty()) {
            // Exactly as the group gave it: a cause may end in a space.
            filter = filter.cause(c);
        }
        if let Some(t) = given(&self.reason_contains) {
            filter = filter.reason_contains(t);
        }
        Ok(filter)
    }

    fn replay_filter(&self) -> Result<ReplayFilter> {
        let event_id = given(&self.event_id)
            .map(|id| id.parse().map_err(|_| Error::Config(format!("event id {id:?}: not a UUID"))))
            .transpose()?;
        let filter = ReplayFilter {
            event_type: given(&self.event_type).map(str::to_owned),
            aggregate_id: given(&self.aggregate_id).map(str::to_owned),
            since: time("since", self.since.as_deref())?,
            until: time("until", self.until.as_deref())?,
            event_id,
        };
        if filter == ReplayFilter::default() {
            // As the CLI: a replay of everything is not a button.
            return Err(Error::Config(
                "a replay needs a filter: an event id, an event type, an aggregate id or a time".to_owned(),
            ));
        }
        Ok(filter)
    }
}

/// What an action page shows.
#[derive(Serialize)]
pub(crate) struct ActionData {
    /// `outbox` or the consumer's name.
    target: String,
    action: &'static str,
    /// The form as sent (the confirm form sends it again).
    form: ActionForm,
    report: ActionReport,
    /// A replay's counts (published, not yet published, discarded, cleaned up).
    replay: Option<ReplayReport>,
    /// A second submit of a form already carried out: `report` is the first one's.
    repeated: bool,
}

#[derive(Template)]
#[template(path = "console/action.html")]
struct ActionHtml {
    frame: Frame,
    data: ActionData,
    path: String,
}

/// The handler of a write route.
pub(crate) fn route(kind: WriteRoute) -> MethodRouter<Arc<State>> {
    match kind {
        WriteRoute::OutboxRetry => post(|s, h, f| outbox(s, h, f, "retry")),
        WriteRoute::OutboxDiscard => post(|s, h, f| outbox(s, h, f, "discard")),
        WriteRoute::OutboxReplay => post(|s, h, f| outbox(s, h, f, "replay")),
        WriteRoute::InboxRetry => post(|s, h, p, f| inbox(s, h, p, f, "retry")),
        WriteRoute::InboxDiscard => post(|s, h, p, f| inbox(s, h, p, f, "discard")),
    }
}

async fn outbox(
    StateOf(state): StateOf<Arc<State>>,
    headers: HeaderMap,
    Form(form): Form<ActionForm>,
    action: &'static str,
) -> Response {
    let path = format!("/actions/outbox/{action}");
    act(&state, &headers, form, "outbox".to_owned(), action, path).await
}

async fn inbox(
    StateOf(state): StateOf<Arc<State>>,
    headers: HeaderMap,
    Path(consumer): Path<String>,
    Form(form): Form<ActionForm>,
    action: &'static str,
) -> Response {
    let path = format!("/actions/inbox/{}/{action}", super::security::url_encode(&consumer));
    act(&state, &headers, form, consumer, action, path).await
}

async fn act(
    state: &State,
    headers: &HeaderMap,
    form: ActionForm,
    target: String,
    action: &'static str,
    path: String,
) -> Response {
    let json = wants_json(headers, form.format.as_deref());
    if !same(&form.csrf, &state.csrf) {
        info!(stage = "console", action, "console action refused: CSRF token missing or wrong");
        return render::error(
            state,
            json,
            StatusCode::FORBIDDEN,
            "the form's CSRF token is missing or wrong: reload the page",
        );
    }
    let confirmed = form.confirm.as_deref() == Some("yes");
    if confirmed && form.key.is_empty() {
        return render::error(
            state,
            json,
            StatusCode::BAD_REQUEST,
            "a confirmed action needs its form's key",
        );
    }
    // A page's forms share its key (an event's retry and discard): an action is its route
    // and its form's key, so that another action of the same page is not taken for a repeat.
    let claim = format!("{path} {}", form.key);
    if confirmed {
        match state.claim(&claim) {
            Ok(()) => {}
            Err(Some(first)) => {
                let (report, replay) = (*first).clone();
                let data = ActionData { target, action, form, report, replay, repeated: true };
                return page(json, data, |data| ActionHtml {
                    frame: Frame::new(state, "Action"),
                    data,
                    path,
                });
            }
            Err(None) => {
                return render::error(
                    state,
                    json,
                    StatusCode::CONFLICT,
                    "this form's action is running: wait for it",
                );
            }
        }
    }
    let result = run(state, &form, &target, action, !confirmed).await;
    if confirmed {
        state.finish(&claim, result.as_ref().ok());
    }
    match result {
        Ok((report, replay)) => {
            if confirmed {
                info!(stage = "console", action, target = %target, matched = report.matched, applied = report.applied,
                      audit_id = ?report.audit_id, "console action carried out");
            }
            let data = ActionData { target, action, form, report, replay, repeated: false };
            page(json, data, |data| ActionHtml { frame: Frame::new(state, "Action"), data, path })
        }
        Err(e) => failure(state, json, &e),
    }
}

async fn run(state: &State, form: &ActionForm, target: &str, action: &str, dry_run: bool) -> Result<Outcome> {
    let actor = &state.config.actor;
    if action == "replay" {
        let replay = state.ops.replay_by(&state.pool, &form.replay_filter()?, actor, dry_run).await?;
        let report = ActionReport {
            action: "replay",
            dry_run,
            matched: replay.replayable,
            applied: replay.replayed,
            skipped: if dry_run { 0 } else { replay.replayable.saturating_sub(replay.replayed) },
            first: Vec::new(),
            audit_id: replay.audit_id,
        };
        return Ok((report, Some(replay)));
    }
    let filter = form.filter()?;
    let reason = || {
        given(&form.reason)
            .ok_or_else(|| Error::Config("a discard needs a reason (the reason field is empty)".to_owned()))
    };
    if target == "outbox" {
        return match action {
            "retry" => state.ops.retry_failed(&state.pool, &filter, actor, dry_run).await,
            _ => state.ops.discard_failed(&state.pool, &filter, reason()?, actor, dry_run).await,
        }
        .map(|report| (report, None));
    }
    let admin = state.inbox(target).ok_or_else(|| {
        Error::NotFound("this console shows no inbox: start it with --inbox-table".to_owned())
    })?;
    match action {
        "retry" => admin.retry_matching(&filter, actor, dry_run).await,
        _ => admin.discard_matching(&filter, reason()?, actor, dry_run).await,
    }
    .map(|report| (report, None))
}
