//! Browsing one consumer's inbox, for operators and the console: the records it applied a
//! page at a time, its parked messages a page at a time, and parked messages grouped by
//! cause.
//!
//! Applied records are paged newest first on `(applied_at, event_id)`, served by the
//! inbox's `(consumer, applied_at)` index: page 1,000 costs what page 1 does. An event id
//! is found by the primary key. By aggregate id or event type, a page needs the inbox's
//! browse indexes ([`InboxAdmin::create_browse_indexes`]), refused by name without them.
//! Parked messages are paged on their id.

use std::fmt;
use std::str::FromStr;
use std::time::SystemTime;

use serde::Serialize;
use sqlx::AssertSqlSafe;
use uuid::Uuid;

use super::InboxAdmin;
use crate::action::MAX_PAGE;
use crate::action::{at_micros, audit_page, epoch_micros, rfc3339, AuditPage};
use crate::browse_index::{IndexSpec, Indexed};
use crate::error::{Error, Result};

/// Which applied records a page lists: every criterion given must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AppliedQuery {
    /// Only records of this outcome: `applied`, `stale` or `discarded`.
    pub outcome: Option<String>,
    /// Only this event.
    pub event_id: Option<Uuid>,
    /// Only events of this aggregate id (our records' Kafka key).
    pub aggregate_id: Option<String>,
    /// Only events of this type.
    pub event_type: Option<String>,
    /// Applied at or after this time.
    pub since: Option<SystemTime>,
    /// Applied before this time.
    pub until: Option<SystemTime>,
    /// The page after the one that ended here ([`AppliedPage::next`]).
    pub before: Option<AppliedCursor>,
    /// Records per page, 1 to [`MAX_PAGE`].
    pub limit: u32,
}

impl Default for AppliedQuery {
    fn default() -> Self {
        AppliedQuery {
            outcome: None,
            event_id: None,
            aggregate_id: None,
            event_type: None,
            since: None,
            until: None,
            before: None,
            limit: 50,
        }
    }
}

impl AppliedQuery {
    /// Only records of `outcome` (`applied`, `stale`, `discarded`).
    #[must_use]
    pub fn outcome(mut self, outcome: impl Into<String>) -> Self {
        self.outcome = Some(outcome.into());
        self
    }

    /// Only the record of event `event_id`.
    #[must_use]
    pub fn event_id(mut self, event_id: Uuid) -> Self {
        self.event_id = Some(event_id);
        self
    }

    /// Only events of aggregate id `id` (needs the browse indexes).
    #[must_use]
    pub fn aggregate_id(mut self, id: impl Into<String>) -> Self {
        self.aggregate_id = Some(id.into());
        self
    }

    /// Only events of type `event_type` (needs the browse indexes).
    #[must_use]
    pub fn event_type(mut self, event_type: impl Into<String>) -> Self {
        self.event_type = Some(event_type.into());
        self
    }

    /// Applied at or after `time`.
    #[must_use]
    pub fn since(mut self, time: impl Into<Option<SystemTime>>) -> Self {
        self.since = time.into();
        self
    }

    /// Applied before `time`.
    #[must_use]
    pub fn until(mut self, time: impl Into<Option<SystemTime>>) -> Self {
        self.until = time.into();
        self
    }

    /// The page after the one that ended at `cursor`.
    #[must_use]
    pub fn before(mut self, cursor: impl Into<Option<AppliedCursor>>) -> Self {
        self.before = cursor.into();
        self
    }

    /// Records per page.
    #[must_use]
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = limit;
        self
    }

    fn validate(&self) -> Result<()> {
        if let Some(outcome) = &self.outcome {
            if !OUTCOMES.contains(&outcome.as_str()) {
                return Err(Error::Config(format!(
                    "the applied query: outcome {outcome:?} is not one of applied, stale, discarded"
                )));
            }
        }
        validate_page("the applied query", self.limit, self.since, self.until)
    }
}

/// An inbox record's outcomes.
const OUTCOMES: [&str; 3] = ["applied", "stale", "discarded"];

/// The inbox's browse indexes (`<table>_<suffix>`): each consumer's records by aggregate id
/// and by event type, newest first. Not in the migrations: each costs every applied record
/// an index entry.
pub(crate) const INBOX_BROWSE_INDEXES: [IndexSpec; 2] = [
    ("browse_agg", "bagg", "(consumer, aggregate_id, applied_at, event_id)"),
    ("browse_type", "btyp", "(consumer, event_type, applied_at, event_id)"),
];

pub(super) fn validate_page(
    what: &str,
    limit: u32,
    since: Option<SystemTime>,
    until: Option<SystemTime>,
) -> Result<()> {
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(Error::Config(format!("{what}: limit {limit} is not between 1 and {MAX_PAGE}")));
    }
    if let (Some(since), Some(until)) = (since, until) {
        if until <= since {
            return Err(Error::Config(format!("{what}: until is not after since")));
        }
    }
    Ok(())
}

/// Where a page of applied records ended: the last record's time (microseconds since the
/// Unix epoch) and event id. Written `<microseconds>~<event id>` in a URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AppliedCursor {
    /// When the last record was applied, in microseconds since the Unix epoch.
    pub applied_at_micros: i64,
    /// Its event id.
    pub event_id: Uuid,
}

impl fmt::Display for AppliedCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}~{}", self.applied_at_micros, self.event_id)
    }
}

impl FromStr for AppliedCursor {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::Config(format!("applied-records cursor {s:?}: not <microseconds>~<event id>"));
        let (micros, id) = s.split_once('~').ok_or_else(bad)?;
        Ok(AppliedCursor {
            applied_at_micros: micros.parse().map_err(|_| bad())?,
            event_id: id.parse().map_err(|_| bad())?,
        })
    }
}

impl Serialize for AppliedCursor {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A record of an event this consumer took: applied, stale (older than its aggregate's
/// last applied version) or discarded by an operator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct AppliedRecord {
    /// The event's id.
    pub event_id: Uuid,
    /// Its type.
    pub event_type: String,
    /// Its schema version.
    pub schema_version: i32,
    /// Its aggregate, when the record carried one.
    pub aggregate_type: Option<String>,
    /// Its aggregate's id.
    pub aggregate_id: Option<String>,
    /// Its place in its aggregate's sequence.
    pub aggregate_version: Option<i64>,
    /// Where it was read.
    pub topic: String,
    /// Kafka partition.
    pub kafka_partition: i32,
    /// Kafka offset.
    pub kafka_offset: i64,
    /// `applied`, `stale` or `discarded`.
    pub outcome: String,
    /// When (RFC 3339, UTC).
    pub applied_at: String,
    #[serde(skip)]
    applied_at_micros: i64,
}

impl sqlx::FromRow<'_, sqlx::postgres::PgRow> for AppliedRecord {
    fn from_row(r: &sqlx::postgres::PgRow) -> sqlx::Result<Self> {
        use sqlx::Row as _;
        Ok(AppliedRecord {
            event_id: r.try_get("event_id")?,
            event_type: r.try_get("event_type")?,
            schema_version: r.try_get("schema_version")?,
            aggregate_type: r.try_get("aggregate_type")?,
            aggregate_id: r.try_get("aggregate_id")?,
            aggregate_version: r.try_get("aggregate_version")?,
            topic: r.try_get("topic")?,
            kafka_partition: r.try_get("kafka_partition")?,
            kafka_offset: r.try_get("kafka_offset")?,
            outcome: r.try_get("outcome")?,
            applied_at: r.try_get("applied_at")?,
            applied_at_micros: r.try_get("applied_at_micros")?,
        })
    }
}

/// A page of applied records, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct AppliedPage {
    /// The records.
    pub records: Vec<AppliedRecord>,
    /// The cursor of the next page ([`AppliedQuery::before`]); `None` on the last page.
    pub next: Option<AppliedCursor>,
}

impl InboxAdmin {
    /// A page of this consumer's applied (and stale and discarded) records matching
    /// `query`, newest first.
    /// By aggregate id or event type it needs the browse indexes
    /// ([`InboxAdmin::create_browse_indexes`]): without them it is refused, naming the
    /// index, rather than reading the whole table.
    pub async fn applied(&self, query: &AppliedQuery) -> Result<AppliedPage> {
        query.validate()?;
        // The catalog is read only for the lists that need an index (not on every page).
        if query.event_id.is_none() && (query.aggregate_id.is_some() || query.event_type.is_some()) {
            let missing = self.missing_browse_indexes().await?;
            let refuse = |what: &str, suffix: &str| {
                let index = format!("{}_{suffix}", self.names.table);
                if missing.contains(&index) {
                    return Err(Error::Config(format!(
                        "listing a consumer's records by {what} needs the index {index}, missing: create the \
                         inbox's browse indexes (InboxAdmin::create_browse_indexes, or outbox browse-indexes \
                         --inbox-table {})",
                        self.names.table
                    )));
                }
                Ok(())
            };
            if query.aggregate_id.is_some() {
                refuse("aggregate id", INBOX_BROWSE_INDEXES[0].0)?;
            } else if query.event_type.is_some() {
                refuse("event type", INBOX_BROWSE_INDEXES[1].0)?;
            }
        }
        self.applied_unchecked(query).await.map_err(|e| self.names.not_migrated(e))
    }

    /// The inbox's browse indexes it lacks (their names), empty when it has them all.
    pub async fn missing_browse_indexes(&self) -> Result<Vec<String>> {
        crate::browse_index::missing(&self.pool, &self.indexed(), &INBOX_BROWSE_INDEXES)
            .await
            .map_err(|e| self.names.not_migrated(e))
    }

    /// Creates the indexes that listing records by aggregate id and by event type needs,
    /// without blocking the consumers (`CREATE INDEX CONCURRENTLY`, on each partition of
    /// the dedup table, then attached). For every consumer of the inbox: the consumer of
    /// this admin does not matter. Idempotent; returns the names of the indexes it built.
    pub async fn create_browse_indexes(&self) -> Result<Vec<String>> {
        crate::browse_index::create(&self.pool, &self.indexed(), &INBOX_BROWSE_INDEXES)
            .await
            .map_err(|e| self.names.not_migrated(e))
    }

    fn indexed(&self) -> Indexed<'_> {
        Indexed { schema: &self.names.schema, name: &self.names.table, qualified: &self.names.inbox }
    }

    async fn applied_unchecked(&self, query: &AppliedQuery) -> Result<AppliedPage> {
        let mut conditions = vec!["i.consumer = $1".to_owned()];
        let mut n = 1;
        let mut next = |condition: &str| {
            n += 1;
            conditions.push(condition.replace('?', &format!("${n}")));
        };
        if query.event_id.is_some() {
            next("i.event_id = ?");
        }
        if query.outcome.is_some() {
            next("i.outcome = ?");
        }
        if query.aggregate_id.is_some() {
            next("i.aggregate_id = ?");
        }
        if query.event_type.is_some() {
            next("i.event_type = ?");
        }
        if query.since.is_some() {
            next(&format!("i.applied_at >= {}", at_micros("?")));
        }
        if query.until.is_some() {
            next(&format!("i.applied_at < {}", at_micros("?")));
        }
        if query.before.is_some() {
            // Exact to the microsecond: an integer count of microseconds, no float seconds.
            n += 2;
            let at = at_micros(&format!("${}", n - 1));
            conditions.push(format!("(i.applied_at, i.event_id) < ({at}, ${n})"));
        }
        let sql = format!(
            "SELECT i.event_id, i.event_type, i.schema_version, i.aggregate_type, i.aggregate_id, i.aggregate_version, \
                    i.topic, i.kafka_partition, i.kafka_offset, i.outcome, {at} AS applied_at, \
                    (extract(epoch FROM i.applied_at) * 1000000)::bigint AS applied_at_micros \
             FROM {inbox} i WHERE {filter} ORDER BY i.applied_at DESC, i.event_id DESC LIMIT {limit}",
            at = rfc3339("i.applied_at"),
            inbox = self.names.inbox,
            filter = conditions.join(" AND "),
            limit = query.limit + 1,
        );
        let mut q = sqlx::query_as::<_, AppliedRecord>(AssertSqlSafe(sql)).bind(&self.consumer);
        if let Some(id) = query.event_id {
            q = q.bind(id);
        }
        for text in [&query.outcome, &query.aggregate_id, &query.event_type].into_iter().flatten() {
            q = q.bind(text);
        }
        for time in [query.since, query.until].into_iter().flatten() {
            q = q.bind(epoch_micros(time));
        }
        if let Some(cursor) = query.before {
            q = q.bind(cursor.applied_at_micros).bind(cursor.event_id);
        }
        let mut records = q.fetch_all(&self.pool).await?;
        let next = if records.len() > query.limit as usize {
            records.truncate(query.limit as usize);
            records
                .last()
                .map(|r| AppliedCursor { applied_at_micros: r.applied_at_micros, event_id: r.event_id })
        } else {
            None
        };
        Ok(AppliedPage { records, next })
    }

    /// A page of the audit of operators' actions on this consumer's parked messages,
    /// newest first: entries below id `before`, at most `limit` (1 to [`MAX_PAGE`]).
    pub async fn audit(&self, before: Option<i64>, limit: u32) -> Result<AuditPage> {
        audit_page(&self.pool, &self.names.audit, Some(&self.consumer), before, limit)
            .await
            .map_err(|e| self.names.not_migrated(e))
    }
}
