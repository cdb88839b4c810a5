//! Browsing an outbox, for operators and the console: events a page at a time by state and
//! filter, one event in full, its payload on request, failed events grouped by cause.
//!
//! Pages are keyset pages, newest first: by id, or, for a list with a time window, by the
//! time of append then id. A page starts after the last event of the one before
//! ([`EventPage::next`]), so page 1,000 costs what page 1 does, and an event appended
//! meanwhile never shifts a page. Each filter is served by an index: the event id by its
//! unique index, the states by their partial indexes, the aggregate (the Kafka key), the
//! event type and the time window by the browse indexes ([`Ops::create_browse_indexes`]).
//! A filter whose index is missing is refused ([`Error::Config`] naming it) rather than
//! scanning a table of millions of rows on every request.

use serde::Serialize;
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, PgPool, Row as _};
use uuid::Uuid;

use super::Ops;
use crate::action::{at_micros, epoch_micros};
use crate::error::{Error, Result};

pub use super::query::{EventQuery, EventState, MAX_PAGE};

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

/// A page of events, newest first: by id, or, when the query has a time window
/// ([`EventQuery::since`], [`EventQuery::until`]), by the time of append then id (a
/// transaction that began earlier can commit an event with a later id).
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
    Micros(i64),
    Id(i64),
}

impl Ops {
    /// A page of events matching `query`, newest first ([`EventPage`]). Refuses a query
    /// whose filter needs a browse index that is missing ([`Ops::create_browse_indexes`]),
    /// and a time-window page whose cursor's event is gone (deleted by cleanup since the
    /// page before: its time is what the page would start after), naming it.
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
            if query.by_time() && needs(TIME) {
                return refuse("time", TIME);
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
            add(&format!("o.created_at >= {}", at_micros("?")), Bind::Micros(epoch_micros(t)), &mut binds);
        }
        if let Some(t) = query.until {
            add(&format!("o.created_at < {}", at_micros("?")), Bind::Micros(epoch_micros(t)), &mut binds);
        }
        let t = &self.names().outbox;
        if let Some(id) = query.before {
            if query.by_time() {
                // After the cursor's event in (time, id): its time is read by its id, once,
                // as a parameter of the index scan (both `?` are the one bind).
                let at = format!("(SELECT c.created_at FROM {t} c WHERE c.id = ?)");
                add(&format!("(o.created_at, o.id) < ({at}, ?)"), Bind::Id(id), &mut binds);
            } else {
                add("o.id < ?", Bind::Id(id), &mut binds);
            }
        }
        let filter = if conditions.is_empty() { "true".to_owned() } else { conditions.join(" AND ") };
        let order = if query.by_time() { "o.created_at DESC, o.id DESC" } else { "o.id DESC" };
        // One more than the page: whether there is a next one.
        let sql = format!(
            "SELECT {SUMMARY_COLUMNS} FROM {t} o WHERE {filter} ORDER BY {order} LIMIT {limit}",
            limit = query.limit + 1
        );
        let mut q = sqlx::query_as::<_, EventSummary>(AssertSqlSafe(sql));
        for bind in binds {
            q = match bind {
                Bind::Text(v) => q.bind(v),
                Bind::Uuid(v) => q.bind(v),
                Bind::Micros(v) => q.bind(v),
                Bind::Id(v) => q.bind(v),
            };
        }
        let mut events = q.fetch_all(pool).await?;
        if let (true, true, Some(id)) = (events.is_empty(), query.by_time(), query.before) {
            let there: bool =
                sqlx::query_scalar(AssertSqlSafe(format!("SELECT EXISTS (SELECT FROM {t} WHERE id = $1)")))
                    .bind(id)
                    .fetch_one(pool)
                    .await?;
            if !there {
                return Err(Error::Config(format!(
                    "the page cursor {id}: that event is gone (cleaned up since the page before), and a list \
                     by time goes on from its time: start again from the first page"
                )));
            }
        }
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

    /// Creates the indexes that browsing by aggregate, event type, time window and the
    /// retrying and discarded states needs, and the one that keeps the published list (and
    /// the overview's count of it) from reading the unpublished events newer than its page,
    /// without blocking appends (`CREATE INDEX CONCURRENTLY`, on each partition of a
    /// partitioned outbox, then attached). Idempotent: an index already there is kept, an
    /// invalid one (an earlier build interrupted) built again. Returns the names of the
    /// indexes it built.
    ///
    /// Not part of the migrations: three of them (aggregate, event type and time) take an
    /// entry for every append, and the published one for every event published, a cost an
    /// outbox nobody browses need not pay.
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
/// aggregate, by type, retrying by id, discarded by id, by time, published by id.
pub(crate) const AGGREGATE: &str = "browse_agg";
pub(crate) const TYPE: &str = "browse_type";
pub(crate) const TIME: &str = "browse_time";
pub(crate) const PUBLISHED: &str = "browse_pub";
pub(crate) const RETRYING: &str = "browse_retry";
pub(crate) const DISCARDED: &str = "browse_disc";

/// The browse indexes: name suffix, a partition's index suffix (`<table>_p<6 digits>_<it>`
/// fits in 63 bytes), columns and predicate.
///
/// The published one is not required: without it a published list (and the overview's
/// capped count of published events) walks the primary key down past the newest
/// unpublished events, as many as a broker outage leaves.
pub(crate) const BROWSE_INDEXES: [crate::browse_index::IndexSpec; 6] = [
    (AGGREGATE, "bagg", "(aggregate_id, id)"),
    (TYPE, "btyp", "(event_type, id)"),
    (RETRYING, "bret", "(id) WHERE status = 'pending' AND next_attempt_at > '-infinity'"),
    (DISCARDED, "bdis", "(id) WHERE status = 'discarded'"),
    (TIME, "btim", "(created_at, id)"),
    (PUBLISHED, "bpub", "(id) WHERE status = 'published'"),
];
