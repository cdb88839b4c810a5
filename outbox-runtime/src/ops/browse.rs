//! Browsing an outbox, for operators and the console: events a page at a time by state and
//! filter, one event in full, its payload on request, failed events grouped by cause.
//!
//! Pages are keyset pages on the id, newest first: a page starts below the last id of the
//! one before ([`EventPage::next`]), so page 1,000 costs what page 1 does, and an event
//! appended meanwhile never shifts a page. Each filter is served by an index: the event id
//! by its unique index, the states by their partial indexes, the aggregate (the Kafka key)
//! and the event type by the browse indexes ([`Ops::create_browse_indexes`]). A filter
//! whose index is missing is refused ([`Error::Config`] naming it) rather than scanning a
//! table of millions of rows on every request.

use std::str::FromStr;
use std::time::SystemTime;

use serde::Serialize;
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, PgPool, Row as _};
use uuid::Uuid;

use super::Ops;
use crate::action::epoch_seconds;
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
    /// Appended at or after this time.
    pub since: Option<SystemTime>,
    /// Appended before this time.
    pub until: Option<SystemTime>,
    /// The page after the one that ended here: events with a lower id.
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

    /// The page after the one whose last event had id `id` ([`EventPage::next`]).
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

    fn validate(&self) -> Result<()> {
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

/// An event as a list shows it (never its payload).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct EventSummary {
    /// Its row id: the order of appends, and the page cursor.
    pub id: i64,
    /// Its id.
    pub event_id: Uuid,
    /// Its type.
    pub event_type: String,
    /// The version of its type's schema.
    pub schema_version: i32,
    /// Its aggregate.
    pub aggregate_type: String,
    /// Its aggregate's id: the Kafka key.
    pub aggregate_id: String,
    /// Its place in its aggregate's sequence, when it has one.
    pub aggregate_version: Option<i64>,
    /// The topic it goes to.
    pub topic: String,
    /// Its state.
    pub state: EventState,
    /// Attempts made to publish it.
    pub attempts: i32,
    /// When it was appended (RFC 3339, UTC).
    pub created_at: String,
    /// When Kafka acknowledged it.
    pub published_at: Option<String>,
    /// When it is tried again, if it waits for a retry.
    pub next_attempt_at: Option<String>,
    /// What its last attempt ran into, or why it was discarded.
    pub last_error: Option<String>,
    /// The Kafka partition it was written to.
    pub kafka_partition: Option<i32>,
    /// Its offset there.
    pub kafka_offset: Option<i64>,
}

/// A page of events, newest first.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct EventPage {
    /// The events.
    pub events: Vec<EventSummary>,
    /// The cursor of the next page ([`EventQuery::before`]); `None` on the last page.
    pub next: Option<i64>,
}

/// The columns of an [`EventSummary`], from an outbox aliased `o`.
pub(crate) const SUMMARY_COLUMNS: &str = "o.id, o.event_id, o.event_type, o.schema_version, o.aggregate_type, \
     o.aggregate_id, o.aggregate_version, o.topic, o.status, o.next_attempt_at > '-infinity' AS waiting, o.attempts, \
     to_char(o.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') AS created_at, \
     to_char(o.published_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') AS published_at, \
     CASE WHEN o.status = 'pending' AND o.next_attempt_at > '-infinity' \
          THEN to_char(o.next_attempt_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') END AS next_attempt_at, \
     o.last_error, o.kafka_partition, o.kafka_offset";

impl sqlx::FromRow<'_, PgRow> for EventSummary {
    fn from_row(r: &PgRow) -> sqlx::Result<Self> {
        let status: String = r.try_get("status")?;
        let waiting: bool = r.try_get("waiting")?;
        let state = match status.as_str() {
            "pending" if waiting => EventState::Retrying,
            "pending" => EventState::Pending,
            "failed" => EventState::Failed,
            "published" => EventState::Published,
            "discarded" => EventState::Discarded,
            other => {
                return Err(sqlx::Error::ColumnDecode {
                    index: "status".to_owned(),
                    source: format!("an outbox status this version does not know: {other:?}").into(),
                })
            }
        };
        Ok(EventSummary {
            id: r.try_get("id")?,
            event_id: r.try_get("event_id")?,
            event_type: r.try_get("event_type")?,
            schema_version: r.try_get("schema_version")?,
            aggregate_type: r.try_get("aggregate_type")?,
            aggregate_id: r.try_get("aggregate_id")?,
            aggregate_version: r.try_get("aggregate_version")?,
            topic: r.try_get("topic")?,
            state,
            attempts: r.try_get("attempts")?,
            created_at: r.try_get("created_at")?,
            published_at: r.try_get("published_at")?,
            next_attempt_at: r.try_get("next_attempt_at")?,
            last_error: r.try_get("last_error")?,
            kafka_partition: r.try_get("kafka_partition")?,
            kafka_offset: r.try_get("kafka_offset")?,
        })
    }
}

/// One bind of a query built from the conditions present.
enum Bind {
    Text(String),
    Uuid(Uuid),
    Seconds(f64),
    Id(i64),
}

impl Ops {
    /// A page of events matching `query`, newest first. Refuses a query whose filter needs
    /// a browse index that is missing ([`Ops::create_browse_indexes`]).
    pub async fn events(&self, pool: &PgPool, query: &EventQuery) -> Result<EventPage> {
        query.validate()?;
        if query.event_id.is_none() {
            let missing = self.missing_browse_indexes(pool).await?;
            let needs = |suffix: &str| missing.iter().any(|m| m.ends_with(suffix));
            let refuse = |what: &str, suffix: &str| {
                Err(Error::Config(format!(
                    "listing events by {what} needs the index {}_{suffix}, missing: create the browse indexes \
                     (Ops::create_browse_indexes)",
                    self.names().table
                )))
            };
            if query.aggregate_id.is_some() && needs(AGGREGATE) {
                return refuse("aggregate id", AGGREGATE);
            }
            if query.aggregate_id.is_none() && query.event_type.is_some() && needs(TYPE) {
                return refuse("event type", TYPE);
            }
            match query.state {
                Some(EventState::Retrying) if needs(RETRYING) => return refuse("state retrying", RETRYING),
                Some(EventState::Discarded) if needs(DISCARDED) => {
                    return refuse("state discarded", DISCARDED)
                }
                _ => {}
            }
        }
        self.events_unchecked(pool, query).await.map_err(|e| self.names().not_migrated(e))
    }

    async fn events_unchecked(&self, pool: &PgPool, query: &EventQuery) -> Result<EventPage> {
        let mut conditions: Vec<String> = Vec::new();
        if let Some(state) = query.state {
            conditions.push(
                state
                    .condition()
                    .replace("status", "o.status")
                    .replace("next_attempt_at", "o.next_attempt_at"),
            );
        }
        let mut binds: Vec<Bind> = Vec::new();
        let mut add = |condition: &str, bind: Bind, binds: &mut Vec<Bind>| {
            binds.push(bind);
            conditions.push(condition.replace('?', &format!("${}", binds.len())));
        };
        if let Some(id) = query.event_id {
            add("o.event_id = ?", Bind::Uuid(id), &mut binds);
        }
        if let Some(id) = &query.aggregate_id {
            add("o.aggregate_id = ?", Bind::Text(id.clone()), &mut binds);
        }
        if let Some(t) = &query.aggregate_type {
            add("o.aggregate_type = ?", Bind::Text(t.clone()), &mut binds);
        }
        if let Some(t) = &query.event_type {
            add("o.event_type = ?", Bind::Text(t.clone()), &mut binds);
        }
        if let Some(t) = &query.topic {
            add("o.topic = ?", Bind::Text(t.clone()), &mut binds);
        }
        if let Some(t) = query.since {
            add("o.created_at >= to_timestamp(?)", Bind::Seconds(epoch_seconds(t)), &mut binds);
        }
        if let Some(t) = query.until {
            add("o.created_at < to_timestamp(?)", Bind::Seconds(epoch_seconds(t)), &mut binds);
        }
        if let Some(id) = query.before {
            add("o.id < ?", Bind::Id(id), &mut binds);
        }
        let filter = if conditions.is_empty() { "true".to_owned() } else { conditions.join(" AND ") };
        // One more than the page: whether there is a next one.
        let sql = format!(
            "SELECT {SUMMARY_COLUMNS} FROM {t} o WHERE {filter} ORDER BY o.id DESC LIMIT {limit}",
            t = self.names().outbox,
            limit = query.limit + 1
        );
        let mut q = sqlx::query_as::<_, EventSummary>(AssertSqlSafe(sql));
        for bind in binds {
            q = match bind {
                Bind::Text(v) => q.bind(v),
                Bind::Uuid(v) => q.bind(v),
                Bind::Seconds(v) => q.bind(v),
                Bind::Id(v) => q.bind(v),
            };
        }
        let mut events = q.fetch_all(pool).await?;
        let next = if events.len() > query.limit as usize {
            events.truncate(query.limit as usize);
            events.last().map(|e| e.id)
        } else {
            None
        };
        Ok(EventPage { events, next })
    }

    /// The browse indexes this outbox lacks (their names), empty when it has them all.
    pub async fn missing_browse_indexes(&self, pool: &PgPool) -> Result<Vec<String>> {
        crate::browse_index::missing(pool, &self.indexed(), &BROWSE_INDEXES).await
    }

    /// Creates the indexes that browsing by aggregate, event type and the retrying and
    /// discarded states needs, without blocking appends (`CREATE INDEX CONCURRENTLY`, on
    /// each partition of a partitioned outbox, then attached). Idempotent: an index already
    /// there is kept, an invalid one (an earlier build interrupted) built again. Returns
    /// the names of the indexes it built.
    ///
    /// Not part of the migrations: two of them (aggregate and event type) take an entry
    /// for every append, a cost an outbox nobody browses need not pay.
    pub async fn create_browse_indexes(&self, pool: &PgPool) -> Result<Vec<String>> {
        crate::browse_index::create(pool, &self.indexed(), &BROWSE_INDEXES)
            .await
            .map_err(|e| self.names().not_migrated(e))
    }

    fn indexed(&self) -> crate::browse_index::Indexed<'_> {
        let names = self.names();
        crate::browse_index::Indexed { schema: &names.schema, name: &names.table, qualified: &names.outbox }
    }
}

/// Index suffixes (`<table>_<suffix>`, at most 63 bytes with a 48-byte table name): by
/// aggregate, by type, retrying by id, discarded by id.
pub(crate) const AGGREGATE: &str = "browse_agg";
pub(crate) const TYPE: &str = "browse_type";
pub(crate) const RETRYING: &str = "browse_retry";
pub(crate) const DISCARDED: &str = "browse_disc";

/// The browse indexes: name suffix, a partition's index suffix (`<table>_p<6 digits>_<it>`
/// fits in 63 bytes), columns and predicate.
pub(crate) const BROWSE_INDEXES: [crate::browse_index::IndexSpec; 4] = [
    (AGGREGATE, "bagg", "(aggregate_id, id)"),
    (TYPE, "btyp", "(event_type, id)"),
    (RETRYING, "bret", "(id) WHERE status = 'pending' AND next_attempt_at > '-infinity'"),
    (DISCARDED, "bdis", "(id) WHERE status = 'discarded'"),
];
