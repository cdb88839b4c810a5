//! One outbox event in full, its payload on request, and failed events grouped by cause.

use serde::Serialize;
use sqlx::{AssertSqlSafe, PgPool};
use uuid::Uuid;

use super::browse::{EventSummary, AGGREGATE, SUMMARY_COLUMNS};
use super::Ops;
use crate::action::{audit_page, cause_sql, rfc3339, AuditPage};
use crate::error::Result;

/// Events of its aggregate shown on each side of an event.
pub const NEIGHBOURS: i64 = 5;

/// An event in full, for operators: all but its payload ([`Ops::event_payload`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct EventDetail {
    /// What a list shows of it.
    #[serde(flatten)]
    pub summary: EventSummary,
    /// Its headers as appended (Kafka headers besides the CloudEvents ones).
    pub headers: serde_json::Value,
    /// When it failed, if it did (events failed before the outbox kept the time: none).
    pub failed_at: Option<String>,
    /// Its payload's size in bytes.
    pub payload_bytes: i64,
    /// Later events of its aggregate waiting behind it (when it is failed or retrying,
    /// they are held back).
    pub behind: i64,
    /// Up to [`NEIGHBOURS`] events of its aggregate on each side, in id order; `None` when
    /// the browse index by aggregate is missing.
    pub neighbours: Option<Vec<EventSummary>>,
}

/// An event's payload, as appended: the JSON text, byte for byte (big integers exact).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Payload {
    /// The text, cut at a character boundary when longer than asked.
    pub text: String,
    /// The whole payload's size in bytes.
    pub bytes: i64,
    /// Whether `text` is cut.
    pub truncated: bool,
}

/// Failed events of one cause: topic and reason with the values of one occurrence left out.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct FailureGroup {
    /// The topic of its events.
    pub topic: String,
    /// The reason with quoted text, e-mail addresses, ids, hex and base64 runs and numbers
    /// left out (`<s>`, `<email>`, `<id>`, `<hex>`, `<token>`, `<n>`): the group's key, and what
    /// [`ActionFilter::cause`](crate::action::ActionFilter::cause) takes to act on it.
    pub cause: String,
    /// Its events' types, sorted.
    pub event_types: Vec<String>,
    /// How many failed events it holds.
    pub events: i64,
    /// When its first event failed (RFC 3339, UTC; its creation for events failed before the
    /// outbox kept the time of failure).
    pub first_failed_at: String,
    /// When its last event failed.
    pub last_failed_at: String,
    /// Its oldest event.
    pub oldest_event_id: Uuid,
    /// That event's reason, in full.
    pub example_reason: String,
    /// Counted over the newest failed events only ([`Ops::failure_groups_capped`], more
    /// failed than its cap): the group holds at least `events`, and its first failure and
    /// oldest event are those of the events counted.
    pub at_least: bool,
}

impl Ops {
    /// Event `event_id` in full (never its payload), with its aggregate's neighbours;
    /// `None` when the outbox has no such event (any more).
    pub async fn event(&self, pool: &PgPool, event_id: Uuid) -> Result<Option<EventDetail>> {
        self.event_unchecked(pool, event_id).await.map_err(|e| self.names().not_migrated(e))
    }

    async fn event_unchecked(&self, pool: &PgPool, event_id: Uuid) -> Result<Option<EventDetail>> {
        let t = &self.names().outbox;
        let summary: Option<EventSummary> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT {SUMMARY_COLUMNS} FROM {t} o WHERE o.event_id = $1"
        )))
        .bind(event_id)
        .fetch_optional(pool)
        .await?;
        let Some(summary) = summary else { return Ok(None) };
        let (headers, failed_at, payload_bytes, behind): (serde_json::Value, Option<String>, i64, i64) =
            sqlx::query_as(AssertSqlSafe(format!(
                "SELECT o.headers, {failed}, octet_length(o.payload::text)::bigint, \
                        (SELECT count(*) FROM {t} h WHERE h.aggregate_type = o.aggregate_type \
                           AND h.aggregate_id = o.aggregate_id AND h.status IN ('pending', 'failed') AND h.id > o.id) \
                 FROM {t} o WHERE o.id = $1",
                failed = rfc3339("o.failed_at"),
            )))
            .bind(summary.id)
            .fetch_one(pool)
            .await?;
        let indexed = !self.missing_browse_indexes(pool).await?.iter().any(|m| m.ends_with(AGGREGATE));
        let neighbours = if indexed {
            let mut rows: Vec<EventSummary> = sqlx::query_as(AssertSqlSafe(format!(
                "(SELECT {SUMMARY_COLUMNS} FROM {t} o WHERE o.aggregate_id = $1 AND o.aggregate_type = $2 AND o.id < $3 \
                  ORDER BY o.id DESC LIMIT {NEIGHBOURS}) \
                 UNION ALL \
                 (SELECT {SUMMARY_COLUMNS} FROM {t} o WHERE o.aggregate_id = $1 AND o.aggregate_type = $2 AND o.id > $3 \
                  ORDER BY o.id LIMIT {NEIGHBOURS})"
            )))
            .bind(&summary.aggregate_id)
            .bind(&summary.aggregate_type)
            .bind(summary.id)
            .fetch_all(pool)
            .await?;
            rows.sort_by_key(|e| e.id);
            Some(rows)
        } else {
            None
        };
        Ok(Some(EventDetail { summary, headers, failed_at, payload_bytes, behind, neighbours }))
    }

    /// Event `event_id`'s payload as appended, at most `max_bytes` of it (cut at a
    /// character boundary); `None` when the outbox has no such event.
    pub async fn event_payload(
        &self,
        pool: &PgPool,
        event_id: Uuid,
        max_bytes: usize,
    ) -> Result<Option<Payload>> {
        self.event_payload_unchecked(pool, event_id, max_bytes)
            .await
            .map_err(|e| self.names().not_migrated(e))
    }

    async fn event_payload_unchecked(
        &self,
        pool: &PgPool,
        event_id: Uuid,
        max_bytes: usize,
    ) -> Result<Option<Payload>> {
        // A character is at least one byte: read no more characters than could be kept.
        let chars = i32::try_from(max_bytes).unwrap_or(i32::MAX);
        let row: Option<(String, i64)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT left(payload::text, $2), octet_length(payload::text)::bigint FROM {} WHERE event_id = $1",
            self.names().outbox
        )))
        .bind(event_id)
        .bind(chars)
        .fetch_optional(pool)
        .await?;
        Ok(row.map(|(mut text, bytes)| {
            if text.len() > max_bytes {
                let mut end = max_bytes;
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                text.truncate(end);
            }
            let truncated = i64::try_from(text.len()).unwrap_or(i64::MAX) < bytes;
            Payload { text, bytes, truncated }
        }))
    }

    /// Failed events grouped by topic and cause, the largest group first. Reads every
    /// failed event; [`Ops::failure_groups_capped`] reads the newest ones only.
    pub async fn failure_groups(&self, pool: &PgPool) -> Result<Vec<FailureGroup>> {
        self.failure_groups_unchecked(pool, None).await.map_err(|e| self.names().not_migrated(e))
    }

    /// [`Ops::failure_groups`] over the newest failed events, `cap` (at least 1) and one
    /// more, which says whether there are more: what an incident that fails events by the
    /// hundred thousand costs to look at is bounded (a cause is worked out of each reason).
    /// With more failed than `cap`, every group says [`FailureGroup::at_least`]; acting on a
    /// group still acts on all its events.
    pub async fn failure_groups_capped(&self, pool: &PgPool, cap: u32) -> Result<Vec<FailureGroup>> {
        self.failure_groups_unchecked(pool, Some(cap.max(1))).await.map_err(|e| self.names().not_migrated(e))
    }

    async fn failure_groups_unchecked(&self, pool: &PgPool, cap: Option<u32>) -> Result<Vec<FailureGroup>> {
        let cause = cause_sql("o.last_error");
        let time = "coalesce(o.failed_at, o.created_at)";
        // One more than the cap: whether there were more.
        let limit =
            cap.map_or(String::new(), |cap| format!("ORDER BY f.id DESC LIMIT {}", u64::from(cap) + 1));
        let sql = format!(
            "SELECT g.topic, g.cause, g.event_types, g.events, {first}, {last}, \
                    (SELECT x.event_id FROM {t} x WHERE x.id = g.oldest), \
                    (SELECT coalesce(x.last_error, '') FROM {t} x WHERE x.id = g.oldest), \
                    sum(g.events) OVER ()::bigint \
             FROM (SELECT o.topic, {cause} AS cause, array_agg(DISTINCT o.event_type ORDER BY o.event_type) AS event_types, \
                          count(*) AS events, min({time}) AS first_at, max({time}) AS last_at, min(o.id) AS oldest \
                   FROM (SELECT f.id, f.topic, f.event_type, f.last_error, f.failed_at, f.created_at \
                         FROM {t} f WHERE f.status = 'failed' {limit}) o \
                   GROUP BY 1, 2) g \
             ORDER BY g.events DESC, g.topic, g.cause",
            t = self.names().outbox,
            first = rfc3339("g.first_at"),
            last = rfc3339("g.last_at"),
        );
        type Row = (String, String, Vec<String>, i64, String, String, Uuid, String, i64);
        let rows: Vec<Row> = sqlx::query_as(AssertSqlSafe(sql)).fetch_all(pool).await?;
        let at_least = |counted: i64| cap.is_some_and(|cap| counted > i64::from(cap));
        Ok(rows
            .into_iter()
            .map(|r| FailureGroup {
                topic: r.0,
                cause: r.1,
                event_types: r.2,
                events: r.3,
                first_failed_at: r.4,
                last_failed_at: r.5,
                oldest_event_id: r.6,
                example_reason: r.7,
                at_least: at_least(r.8),
            })
            .collect())
    }

    /// A page of the audit of operators' actions on this outbox, newest first: entries
    /// below id `before`, at most `limit` (1 to [`MAX_PAGE`](super::MAX_PAGE)).
    pub async fn audit(&self, pool: &PgPool, before: Option<i64>, limit: u32) -> Result<AuditPage> {
        audit_page(pool, &self.names().audit, None, before, limit)
            .await
            .map_err(|e| self.names().not_migrated(e))
    }
}
