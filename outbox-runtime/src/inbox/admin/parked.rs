//! Parked messages of one consumer, for operators and the console: a page at a time,
//! one in full (never its payload), and grouped by cause.

use serde::Serialize;
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, FromRow as _, Row as _};
use uuid::Uuid;

use super::browse::validate_page;
use super::InboxAdmin;
use crate::action::{cause_sql, rfc3339};
use crate::error::{Error, Result};

/// Which parked messages a page lists.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ParkedQuery {
    /// Only messages of this status: `parked`, `held`, `retried`, `discarded`, or `open`
    /// (parked or held). All when `None`.
    pub status: Option<String>,
    /// Only messages read from this topic.
    pub topic: Option<String>,
    /// Only messages of this event type.
    pub event_type: Option<String>,
    /// Only this event.
    pub event_id: Option<Uuid>,
    /// Only messages of this Kafka record key (its bytes).
    pub record_key: Option<Vec<u8>>,
    /// The page after the one whose last message had this id.
    pub before: Option<i64>,
    /// Messages per page, 1 to [`MAX_PAGE`](crate::action::MAX_PAGE).
    pub limit: u32,
}

impl Default for ParkedQuery {
    fn default() -> Self {
        ParkedQuery {
            status: None,
            topic: None,
            event_type: None,
            event_id: None,
            record_key: None,
            before: None,
            limit: 50,
        }
    }
}

impl ParkedQuery {
    /// Only messages of `status` (`parked`, `held`, `retried`, `discarded`, `open`).
    #[must_use]
    pub fn status(mut self, status: impl Into<String>) -> Self {
        self.status = Some(status.into());
        self
    }

    /// Only messages read from `topic`.
    #[must_use]
    pub fn topic(mut self, topic: impl Into<String>) -> Self {
        self.topic = Some(topic.into());
        self
    }

    /// Only messages whose Kafka record key is `key` (bytes: a key need not be UTF-8).
    #[must_use]
    pub fn record_key(mut self, key: impl Into<Vec<u8>>) -> Self {
        self.record_key = Some(key.into());
        self
    }

    /// Only messages of type `event_type`.
    #[must_use]
    pub fn event_type(mut self, event_type: impl Into<String>) -> Self {
        self.event_type = Some(event_type.into());
        self
    }

    /// Only messages of event `event_id`.
    #[must_use]
    pub fn event_id(mut self, event_id: Uuid) -> Self {
        self.event_id = Some(event_id);
        self
    }

    /// The page after the one whose last message had id `id`.
    #[must_use]
    pub fn before(mut self, id: impl Into<Option<i64>>) -> Self {
        self.before = id.into();
        self
    }

    /// Messages per page.
    #[must_use]
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = limit;
        self
    }
}

/// A parked message as a list shows it (never its payload).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ParkedSummary {
    /// Its id in the parked table: the page cursor, and what `retry`/`discard` take.
    pub id: i64,
    /// `parked`, `held`, `retried` or `discarded`.
    pub status: String,
    /// An operator asked for a retry the consumer has not carried out yet.
    pub retry_requested: bool,
    /// Why it is parked (or held).
    pub reason: String,
    /// Where it was read.
    pub topic: String,
    /// Kafka partition.
    pub kafka_partition: i32,
    /// Kafka offset.
    pub kafka_offset: i64,
    /// The record key: its text, or `0x` and hex when it is not UTF-8.
    pub record_key: Option<String>,
    /// Its event id, when readable.
    pub event_id: Option<Uuid>,
    /// Its type, when readable.
    pub event_type: Option<String>,
    /// Its schema version, when readable.
    pub schema_version: Option<i32>,
    /// When it was parked (RFC 3339, UTC).
    pub parked_at: String,
    /// When it was retried or discarded.
    pub resolved_at: Option<String>,
    /// Its payload's size in bytes.
    pub payload_bytes: i32,
}

/// A page of parked messages, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ParkedPage {
    /// The messages.
    pub messages: Vec<ParkedSummary>,
    /// The cursor of the next page ([`ParkedQuery::before`]); `None` on the last page.
    pub next: Option<i64>,
}

/// Parked messages of one cause: topic and reason with the values of one occurrence left out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ParkedGroup {
    /// The topic they were read from.
    pub topic: String,
    /// The reason with quoted text, e-mail addresses, ids, hex and base64 runs and numbers
    /// left out (`<s>`, `<email>`, `<id>`, `<hex>`, `<token>`, `<n>`): the group's key, and what
    /// [`ActionFilter::cause`](crate::action::ActionFilter::cause) takes to act on it.
    pub cause: String,
    /// Their event types, sorted (unreadable ones left out).
    pub event_types: Vec<String>,
    /// How many are parked.
    pub messages: i64,
    /// When the first was parked (RFC 3339, UTC).
    pub first_parked_at: String,
    /// When the last was.
    pub last_parked_at: String,
    /// The oldest one's id.
    pub oldest_id: i64,
    /// The oldest one's reason, in full.
    pub example_reason: String,
    /// Counted over the newest parked messages only ([`InboxAdmin::parked_groups_capped`],
    /// more parked than its cap): the group holds at least `messages`, and its first
    /// parked and oldest are those of the messages counted.
    pub at_least: bool,
}

/// One consumer at a look, from [`InboxAdmin::summary`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ConsumerSummary {
    /// The consumer.
    pub consumer: String,
    /// Messages parked (failed themselves), counted up to the cap.
    pub parked: i64,
    /// Messages held behind a parked one of their key, counted up to the cap.
    pub held: i64,
    /// Parked messages whose retry an operator asked for and the consumer has not carried
    /// out yet.
    pub retry_requested: i64,
    /// Aggregates whose versions skipped ahead (an event never seen between two applied
    /// ones: lost upstream, or on a topic this consumer does not read), counted up to the cap.
    pub version_gaps: i64,
    /// Whether a count stopped at the cap.
    pub at_least: bool,
    /// When it last applied a record (RFC 3339, UTC).
    pub last_applied_at: Option<String>,
    /// Deliveries absorbed as duplicates (the event was recorded before; its handler did not
    /// run), over every topic and partition, since the inbox's tables were created.
    pub duplicates: i64,
    /// When the last duplicate was absorbed (RFC 3339, UTC).
    pub last_duplicate_at: Option<String>,
}

/// The columns of a [`ParkedSummary`] from a parked table aliased `p`.
const PARKED_COLUMNS: &str = "p.id, p.status, p.retry_requested_at IS NOT NULL AS retry_requested, p.reason, p.topic, \
     p.kafka_partition, p.kafka_offset, p.record_key, p.event_id, p.event_type, p.schema_version, PARKED_AT AS parked_at, RESOLVED_AT AS resolved_at, \
     octet_length(p.payload) AS payload_bytes";

impl InboxAdmin {
    /// A page of this consumer's parked messages matching `query`, newest first.
    pub async fn parked_page(&self, query: &ParkedQuery) -> Result<ParkedPage> {
        validate_page("the parked query", query.limit, None, None)?;
        let status = match query.status.as_deref() {
            None => "true",
            Some("open") => "p.status IN ('parked', 'held')",
            Some("parked") => "p.status = 'parked'",
            Some("held") => "p.status = 'held'",
            Some("retried") => "p.status = 'retried'",
            Some("discarded") => "p.status = 'discarded'",
            Some(other) => {
                return Err(Error::Config(format!(
                    "the parked query: status {other:?} is not one of parked, held, open, retried, discarded"
                )))
            }
        };
        self.parked_page_unchecked(query, status).await.map_err(|e| self.names.not_migrated(e))
    }

    async fn parked_page_unchecked(&self, query: &ParkedQuery, status: &str) -> Result<ParkedPage> {
        let mut conditions = vec!["p.consumer = $1".to_owned(), status.to_owned()];
        let mut n = 1;
        for (present, condition) in [
            (query.topic.is_some(), "p.topic = ?"),
            (query.event_type.is_some(), "p.event_type = ?"),
            (query.event_id.is_some(), "p.event_id = ?"),
            (query.record_key.is_some(), "p.record_key = ?"),
            (query.before.is_some(), "p.id < ?"),
        ] {
            if present {
                n += 1;
                conditions.push(condition.replace('?', &format!("${n}")));
            }
        }
        let sql = format!(
            "SELECT {columns} FROM {parked} p WHERE {filter} ORDER BY p.id DESC LIMIT {limit}",
            columns = parked_columns(),
            parked = self.names.parked,
            filter = conditions.join(" AND "),
            limit = query.limit + 1,
        );
        let mut q = sqlx::query_as::<_, ParkedSummary>(AssertSqlSafe(sql)).bind(&self.consumer);
        for text in [&query.topic, &query.event_type].into_iter().flatten() {
            q = q.bind(text);
        }
        if let Some(id) = query.event_id {
            q = q.bind(id);
        }
        if let Some(key) = &query.record_key {
            q = q.bind(key);
        }
        if let Some(id) = query.before {
            q = q.bind(id);
        }
        let mut messages = q.fetch_all(&self.pool).await?;
        let next = if messages.len() > query.limit as usize {
            messages.truncate(query.limit as usize);
            messages.last().map(|m| m.id)
        } else {
            None
        };
        Ok(ParkedPage { messages, next })
    }

    /// Parked message `id` as a list shows it, with its headers as read; `None` when this
    /// consumer has no such message.
    pub async fn parked_message(&self, id: i64) -> Result<Option<(ParkedSummary, serde_json::Value)>> {
        let sql = format!(
            "SELECT {columns}, coalesce(p.raw_headers, p.headers) AS headers FROM {parked} p \
             WHERE p.consumer = $1 AND p.id = $2",
            columns = parked_columns(),
            parked = self.names.parked,
        );
        let row = sqlx::query(AssertSqlSafe(sql))
            .bind(&self.consumer)
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.names.not_migrated(e.into()))?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some((ParkedSummary::from_row(&row)?, row.try_get("headers")?)))
    }

    /// This consumer at a look: its open messages and its aggregates with version gaps,
    /// counted up to `cap` each (index reads only), and when it last applied a record.
    pub async fn summary(&self, cap: u32) -> Result<ConsumerSummary> {
        let parked = &self.names.parked;
        let counted = |status: &str| {
            format!(
                "(SELECT count(*) FROM (SELECT 1 FROM {parked} WHERE consumer = $1 AND status = '{status}' \
                   AND status IN ('parked', 'held') LIMIT $2 + 1) c)"
            )
        };
        let sql = format!(
            "SELECT {parked_n}, {held_n}, \
                    (SELECT count(*) FROM (SELECT 1 FROM {parked} WHERE consumer = $1 AND status IN ('parked', 'held') \
                       AND retry_requested_at IS NOT NULL LIMIT $2 + 1) c), \
                    (SELECT {last} FROM (SELECT max(applied_at) AS at FROM {inbox} WHERE consumer = $1) m), \
                    (SELECT count(*) FROM (SELECT 1 FROM {aggregates} WHERE consumer = $1 AND gaps > 0 LIMIT $2 + 1) c), \
                    (SELECT coalesce(sum(duplicates), 0)::bigint FROM {progress} WHERE consumer = $1), \
                    (SELECT {last_duplicate} FROM (SELECT max(last_duplicate_at) AS at FROM {progress} WHERE consumer = $1) d)",
            parked_n = counted("parked"),
            held_n = counted("held"),
            last = rfc3339("m.at"),
            inbox = self.names.inbox,
            aggregates = self.names.aggregates,
            progress = self.names.progress,
            last_duplicate = rfc3339("d.at"),
        );
        let cap = i64::from(cap.max(1));
        type Row = (i64, i64, i64, Option<String>, i64, i64, Option<String>);
        let (parked, held, requested, last, gaps, duplicates, last_duplicate): Row =
            sqlx::query_as(AssertSqlSafe(sql))
                .bind(&self.consumer)
                .bind(cap)
                .fetch_one(&self.pool)
                .await
                .map_err(|e| self.names.not_migrated(e.into()))?;
        Ok(ConsumerSummary {
            consumer: self.consumer.clone(),
            parked: parked.min(cap),
            held: held.min(cap),
            retry_requested: requested.min(cap),
            version_gaps: gaps.min(cap),
            at_least: parked > cap || held > cap || requested > cap || gaps > cap,
            last_applied_at: last,
            duplicates,
            last_duplicate_at: last_duplicate,
        })
    }

    /// This consumer's parked messages (not those held behind them) grouped by topic and
    /// cause, the largest group first.
    pub async fn parked_groups(&self) -> Result<Vec<ParkedGroup>> {
        self.parked_groups_under(None).await
    }

    /// [`InboxAdmin::parked_groups`] over the consumer's newest parked messages, `cap` (at
    /// least 1) and one more, which says whether there are more: what a consumer that parks
    /// messages by the hundred thousand costs to look at is bounded (a cause is worked out
    /// of each reason; they are found through the index of inbox migration 8, past no other
    /// consumer's message). With more parked than `cap`, every group says
    /// [`ParkedGroup::at_least`]; acting on a group still acts on all its messages.
    pub async fn parked_groups_capped(&self, cap: u32) -> Result<Vec<ParkedGroup>> {
        self.parked_groups_under(Some(cap.max(1))).await
    }

    async fn parked_groups_under(&self, cap: Option<u32>) -> Result<Vec<ParkedGroup>> {
        // One more than the cap: whether there were more.
        let limit =
            cap.map_or(String::new(), |cap| format!("ORDER BY p.id DESC LIMIT {}", u64::from(cap) + 1));
        let sql = format!(
            "SELECT g.topic, g.cause, g.event_types, g.messages, {first}, {last}, g.oldest, \
                    (SELECT x.reason FROM {parked} x WHERE x.id = g.oldest), sum(g.messages) OVER ()::bigint \
             FROM (SELECT p.topic, {cause} AS cause, \
                          array_remove(array_agg(DISTINCT p.event_type ORDER BY p.event_type), NULL) AS event_types, \
                          count(*) AS messages, min(p.parked_at) AS first_at, max(p.parked_at) AS last_at, \
                          min(p.id) AS oldest \
                   FROM (SELECT p.id, p.topic, p.event_type, p.reason, p.parked_at FROM {parked} p \
                         WHERE p.consumer = $1 AND p.status = 'parked' {limit}) p \
                   GROUP BY 1, 2) g \
             ORDER BY g.messages DESC, g.topic, g.cause",
            first = rfc3339("g.first_at"),
            last = rfc3339("g.last_at"),
            cause = cause_sql("p.reason"),
            parked = self.names.parked,
        );
        type Row = (String, String, Vec<String>, i64, String, String, i64, String, i64);
        let rows: Vec<Row> = sqlx::query_as(AssertSqlSafe(sql))
            .bind(&self.consumer)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.names.not_migrated(e.into()))?;
        Ok(rows
            .into_iter()
            .map(|r| ParkedGroup {
                topic: r.0,
                cause: r.1,
                event_types: r.2,
                messages: r.3,
                first_parked_at: r.4,
                last_parked_at: r.5,
                oldest_id: r.6,
                example_reason: r.7,
                at_least: cap.is_some_and(|cap| r.8 > i64::from(cap)),
            })
            .collect())
    }
}

/// [`PARKED_COLUMNS`] with its times filled in.
fn parked_columns() -> String {
    PARKED_COLUMNS
        .replace("PARKED_AT", &rfc3339("p.parked_at"))
        .replace("RESOLVED_AT", &rfc3339("p.resolved_at"))
}

/// A record key as text: itself when it is UTF-8, else `0x` and its bytes in hex.
pub(crate) fn key_text(key: &[u8]) -> String {
    match std::str::from_utf8(key) {
        Ok(text) => text.to_owned(),
        Err(_) => format!("0x{}", key.iter().map(|b| format!("{b:02x}")).collect::<String>()),
    }
}

impl sqlx::FromRow<'_, PgRow> for ParkedSummary {
    fn from_row(r: &PgRow) -> sqlx::Result<Self> {
        let key: Option<Vec<u8>> = r.try_get("record_key")?;
        Ok(ParkedSummary {
            id: r.try_get("id")?,
            status: r.try_get("status")?,
            retry_requested: r.try_get("retry_requested")?,
            reason: r.try_get("reason")?,
            topic: r.try_get("topic")?,
            kafka_partition: r.try_get("kafka_partition")?,
            kafka_offset: r.try_get("kafka_offset")?,
            record_key: key.as_deref().map(key_text),
            event_id: r.try_get("event_id")?,
            event_type: r.try_get("event_type")?,
            schema_version: r.try_get("schema_version")?,
            parked_at: r.try_get("parked_at")?,
            resolved_at: r.try_get("resolved_at")?,
            payload_bytes: r.try_get("payload_bytes")?,
        })
    }
}
