//! The overview, live: server-sent events carrying the overview's body every few seconds.
//! The page's script pauses and resumes them, and polls instead when the stream fails.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use askama::Template;
use axum::extract::State as StateOf;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::stream::{self, Stream};
use tracing::warn;

use super::pages::{read_overview, OverviewData};
use super::render::Frame;
use super::State;

/// How often the overview is sent.
pub(crate) const EVERY: Duration = Duration::from_secs(5);

/// The overview's body alone (the live stream, and `/?fragment=body`).
#[derive(Template)]
#[template(path = "console/overview_body.html")]
pub(crate) struct OverviewBody<'a> {
    pub(crate) frame: &'a Frame,
    pub(crate) data: &'a OverviewData,
}

pub(crate) async fn stream(
    StateOf(state): StateOf<Arc<State>>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let frame = Frame::new(&state, "Overview");
    let events = stream::unfold((state, frame, true), |(state, frame, first)| async move {
        if !first {
            tokio::time::sleep(EVERY).await;
        }
        let event = match read_overview(&state).await {
            Ok(data) => match (OverviewBody { frame: &frame, data: &data }).render() {
                Ok(html) => Event::default().event("overview").data(html),
                Err(e) => {
                    Event::default().event("failed").data(format!("the overview failed to render: {e}"))
                }
            },
            Err(e) => {
                warn!(stage = "console", error = %crate::secrets::redact_urls(&e.to_string()), "live overview failed");
                Event::default().event("failed").data("the overview failed: see the console's log")
            }
        };
        Some((Ok(event), (state, frame, false)))
    });
    Sse::new(events).keep_alive(KeepAlive::default())
}
