//! The overview, live: server-sent events carrying the overview's body every few seconds.
//! The page's script pauses and resumes them, and polls instead when the stream fails.
//! However many consoles are open, the overview is read once per interval and shared.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use askama::Template;
use axum::extract::State as StateOf;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::stream::{self, Stream};
use serde::Serialize;
use tracing::warn;

use super::render::Frame;
use super::State;
use crate::error::{Error, Result};
use crate::inbox::ConsumerSummary;
use crate::metrics::CONSOLE_READ_ERRORS;
use crate::ops::Overview;

/// How often the overview is sent.
pub(crate) const EVERY: Duration = Duration::from_secs(5);

/// The overview: the outbox's states, its relays, the inbox's consumers.
#[derive(Serialize)]
pub(crate) struct OverviewData {
    pub(crate) outbox: Overview,
    pub(crate) consumers: Vec<ConsumerView>,
}

/// An inbox consumer on the overview: its summary, and its lag when brokers were given.
#[derive(Serialize)]
pub(crate) struct ConsumerView {
    #[serde(flatten)]
    pub(crate) summary: ConsumerSummary,
    pub(crate) lag: Option<super::lag::LagCell>,
}

/// Reads the overview (also for the live stream).
pub(crate) async fn read_overview(state: &State) -> Result<OverviewData> {
    let outbox = state.ops.overview(&state.pool, state.config.count_cap).await?;
    let mut consumers = Vec::new();
    if let Some(any) = state.inbox("") {
        let names = any.consumers().await?;
        let mut lag = state.lag(&names);
        for consumer in names {
            if let Some(admin) = state.inbox(&consumer) {
                let summary = admin.summary(state.config.count_cap).await?;
                consumers.push(ConsumerView { lag: lag.remove(&consumer), summary });
            }
        }
    }
    Ok(OverviewData { outbox, consumers })
}

/// The overview's body alone (the live stream, and `/?fragment=body`).
#[derive(Template)]
#[template(path = "console/overview_body.html")]
pub(crate) struct OverviewBody<'a> {
    pub(crate) frame: &'a Frame,
    pub(crate) data: &'a OverviewData,
}

/// The overview last read for the live streams and the polling fallback (or why it could
/// not be), and when.
#[derive(Default)]
pub(crate) struct Shared(tokio::sync::Mutex<Option<(Instant, Reading)>>);

/// One reading of the overview: its data, or its failure.
pub(crate) type Reading = std::result::Result<Arc<OverviewData>, Arc<Error>>;

/// The overview for a live stream or a poll: the one read less than half an interval ago,
/// or a new one. The first stream that needs a new one reads it while the others wait for
/// it, so that ten open consoles cost the database what one does, failing or not: a failed
/// reading is shared the same way, logged and counted once
/// (`outbox_console_read_errors_total`, stage `live`).
pub(crate) async fn shared_overview(state: &State) -> Reading {
    let mut shared = state.live_overview.0.lock().await;
    if let Some((read_at, reading)) = shared.as_ref() {
        if read_at.elapsed() < EVERY / 2 {
            return reading.clone();
        }
    }
    let reading = match read_overview(state).await {
        Ok(data) => Ok(Arc::new(data)),
        Err(e) => {
            metrics::counter!(CONSOLE_READ_ERRORS, "stage" => "live").increment(1);
            warn!(stage = "console", error = %crate::secrets::redact_urls(&e.to_string()), "live overview failed");
            Err(Arc::new(e))
        }
    };
    *shared = Some((Instant::now(), reading.clone()));
    reading
}

pub(crate) async fn stream(
    StateOf(state): StateOf<Arc<State>>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let frame = Frame::new(&state, "Overview");
    let events = stream::unfold((state, frame, true), |(state, frame, first)| async move {
        if !first {
            tokio::time::sleep(EVERY).await;
        }
        let event = match shared_overview(&state).await {
            Ok(data) => match (OverviewBody { frame: &frame, data: &data }).render() {
                Ok(html) => Event::default().event("overview").data(html),
                Err(e) => {
                    Event::default().event("failed").data(format!("the overview failed to render: {e}"))
                }
            },
            // Logged and counted where it was read.
            Err(_) => Event::default().event("failed").data("the overview failed: see the console's log"),
        };
        Some((Ok(event), (state, frame, false)))
    });
    Sse::new(events).keep_alive(KeepAlive::default())
}
