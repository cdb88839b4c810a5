//! What a list of outbox events asks for ([`EventQuery`]) and the states it names
//! ([`EventState`]).

use std::str::FromStr;
use std::time::SystemTime;

use serde::Serialize;
use uuid::Uuid;

use crate::error::{Error, Result};

pub use crate::action::MAX_PAGE;

/// The state of an outbox event, as the console and [`EventQuery`] name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EventState {
    /// Waiting for its first attempt (or put up again by `retry` or `replay`).
    Pending,
    /// Pending, waiting for a retry after a failed attempt.
    Retrying,
    /// Quarantined after a permanent error; holds its aggregate's later events back.
    Failed,
    /// Acknowledged by Kafka.
    Published,
    /// Discarded by an operator: never published.
    Discarded,
}

impl EventState {
    /// Every state, in the order an event moves through them.
    pub const ALL: [EventState; 5] = [
        EventState::Pending,
        EventState::Retrying,
        EventState::Failed,
        EventState::Published,
        EventState::Discarded,
    ];

    /// Its name: `pending`, `retrying`, `failed`, `published`, `discarded`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventState::Pending => "pending",
            EventState::Retrying => "retrying",
            EventState::Failed => "failed",
            EventState::Published => "published",
            EventState::Discarded => "discarded",
        }
    }

    /// The SQL condition on the outbox's columns, each the predicate of an index.
    pub(crate) fn condition(self) -> &'static str {
        match self {
            EventState::Pending => "status = 'pending' AND next_attempt_at = '-infinity'",
            EventState::Retrying => "status = 'pending' AND next_attempt_at > '-infinity'",
            EventState::Failed => "status = 'failed'",
            EventState::Published => "status = 'published'",
            EventState::Discarded => "status = 'discarded'",
        }
    }
}

impl std::fmt::Display for EventState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EventState {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        EventState::ALL.into_iter().find(|state| state.as_str() == s).ok_or_else(|| {
            Error::Config(format!(
                "event state {s:?}: not one of pending, retrying, failed, published, discarded"
            ))
        })
    }
}

/// Which events a page lists: every criterion given must hold. Build it with the setters:
/// `EventQuery::default().state(EventState::Failed).event_type("order.placed")`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EventQuery {
    /// Only events in this state.
    pub state: Option<EventState>,
    /// Only this event.
    pub event_id: Option<Uuid>,
    /// Only events of this aggregate id: the Kafka key the relay writes.
    pub aggregate_id: Option<String>,
    /// Only events of this aggregate type (with `aggregate_id`).
    pub aggregate_type: Option<String>,
    /// Only events of this type.
    pub event_type: Option<String>,
    /// Only events for this topic.
    pub topic: Option<String>,
    /// Appended at or after this time. A list with a time window is ordered by the time of
    /// append, then id.
    pub since: Option<SystemTime>,
    /// Appended before this time.
    pub until: Option<SystemTime>,
    /// The page after the one that ended with this event (its row id): events with a lower
    /// id, or, in a list with a time window, appended earlier (or at the same time with a
    /// lower id).
    pub before: Option<i64>,
    /// Events per page, 1 to [`MAX_PAGE`].
    pub limit: u32,
}

impl Default for EventQuery {
    fn default() -> Self {
        EventQuery {
            state: None,
            event_id: None,
            aggregate_id: None,
            aggregate_type: None,
            event_type: None,
            topic: None,
            since: None,
            until: None,
            before: None,
            limit: 50,
        }
    }
}

impl EventQuery {
    /// Only events in `state`.
    #[must_use]
    pub fn state(mut self, state: EventState) -> Self {
        self.state = Some(state);
        self
    }

    /// Only the event `event_id`.
    #[must_use]
    pub fn event_id(mut self, event_id: Uuid) -> Self {
        self.event_id = Some(event_id);
        self
    }

    /// Only events of aggregate id `id` (the Kafka key).
    #[must_use]
    pub fn aggregate_id(mut self, id: impl Into<String>) -> Self {
        self.aggregate_id = Some(id.into());
        self
    }

    /// Only events of aggregate type `aggregate_type`.
    #[must_use]
    pub fn aggregate_type(mut self, aggregate_type: impl Into<String>) -> Self {
        self.aggregate_type = Some(aggregate_type.into());
        self
    }

    /// Only events of type `event_type`.
    #[must_use]
    pub fn event_type(mut self, event_type: impl Into<String>) -> Self {
        self.event_type = Some(event_type.into());
        self
    }

    /// Only events for `topic`.
    #[must_use]
    pub fn topic(mut self, topic: impl Into<String>) -> Self {
        self.topic = Some(topic.into());
        self
    }

    /// Appended at or after `time`.
    #[must_use]
    pub fn since(mut self, time: impl Into<Option<SystemTime>>) -> Self {
        self.since = time.into();
        self
    }

    /// Appended before `time`.
    #[must_use]
    pub fn until(mut self, time: impl Into<Option<SystemTime>>) -> Self {
        self.until = time.into();
        self
    }

    /// The page after the one whose last event had id `id` ([`EventPage::next`](super::EventPage::next)).
    #[must_use]
    pub fn before(mut self, id: impl Into<Option<i64>>) -> Self {
        self.before = id.into();
        self
    }

    /// Events per page.
    #[must_use]
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = limit;
        self
    }

    /// Whether the list is ordered by time: it has a time window.
    pub(crate) fn by_time(&self) -> bool {
        self.since.is_some() || self.until.is_some()
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let empty = |what: &str| Err(Error::Config(format!("the event query: {what} is empty")));
        for (what, value) in [
            ("the aggregate id", &self.aggregate_id),
            ("the aggregate type", &self.aggregate_type),
            ("the event type", &self.event_type),
            ("the topic", &self.topic),
        ] {
            if value.as_deref().is_some_and(str::is_empty) {
                return empty(what);
            }
        }
        if self.aggregate_type.is_some() && self.aggregate_id.is_none() {
            return Err(Error::Config(
                "the event query: an aggregate type without an aggregate id".to_owned(),
            ));
        }
        if !(1..=MAX_PAGE).contains(&self.limit) {
            return Err(Error::Config(format!(
                "the event query: limit {} is not between 1 and {MAX_PAGE}",
                self.limit
            )));
        }
        if let (Some(since), Some(until)) = (self.since, self.until) {
            if until <= since {
                return Err(Error::Config("the event query: until is not after since".to_owned()));
            }
        }
        Ok(())
    }
}
