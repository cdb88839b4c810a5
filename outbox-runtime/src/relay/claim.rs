//! Reading due events of held partitions, and recording what happened to them, fenced by
//! the lease tokens.

use std::time::Duration;

use sqlx::postgres::PgRow;
use sqlx::{FromRow, PgPool, Row as _, SqlStr};
use uuid::Uuid;

use crate::error::Result;
use crate::table::{sql, Names};

/// One outbox row as the relay publishes it.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) id: i64,
    pub(crate) event_id: Uuid,
    pub(crate) aggregate_type: String,
    pub(crate) aggregate_id: String,
    pub(crate) aggregate_version: Option<i64>,
    pub(crate) event_type: String,
    pub(crate) schema_version: i32,
    pub(crate) topic: String,
    pub(crate) payload: String,
    pub(crate) headers: String,
    /// `created_at` as RFC 3339 UTC, for `ce_time`.
    pub(crate) created_at: String,
    pub(crate) attempts: i32,
    pub(crate) work_partition: i32,
}

impl FromRow<'_, PgRow> for Row {
    fn from_row(r: &PgRow) -> sqlx::Result<Self> {
        Ok(Row {
            id: r.try_get("id")?,
            event_id: r.try_get("event_id")?,
            aggregate_type: r.try_get("aggregate_type")?,
            aggregate_id: r.try_get("aggregate_id")?,
            aggregate_version: r.try_get("aggregate_version")?,
            event_type: r.try_get("event_type")?,
            schema_version: r.try_get("schema_version")?,
            topic: r.try_get("topic")?,
            payload: r.try_get("payload")?,
            headers: r.try_get("headers")?,
            created_at: r.try_get("created_at")?,
            attempts: r.try_get("attempts")?,
            work_partition: r.try_get("work_partition")?,
        })
    }
}

/// Where Kafka put a published record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placement {
    pub(crate) partition: i32,
    pub(crate) offset: i64,
}

#[derive(Debug)]
pub(crate) struct Statements {
    claim: SqlStr,
    published: SqlStr,
    retry: SqlStr,
    failed: SqlStr,
}

/// Rows are marked only while this relay holds the row's partition with the same token.
/// The lease row is locked `FOR SHARE` until the mark commits: a takeover (an `UPDATE` of
/// that row, or the acquire's `FOR UPDATE SKIP LOCKED`) cannot commit in between, even when
/// the mark waits on a row lock after its snapshot saw the old token.
const FENCE: &str = "EXISTS (SELECT 1 FROM {leases} l \
                     JOIN unnest($F1::int[], $F2::bigint[]) AS mine(p, tok) \
                       ON l.work_partition = mine.p AND l.token = mine.tok \
                     WHERE l.work_partition = o.work_partition AND l.owner = $F0 FOR SHARE OF l)";

fn fence(names: &Names, first: usize) -> String {
    FENCE
        .replace("{leases}", &names.leases)
        .replace("$F0", &format!("${first}"))
        .replace("$F1", &format!("${}", first + 1))
        .replace("$F2", &format!("${}", first + 2))
}

impl Statements {
    pub(crate) fn new(names: &Names) -> Self {
        let outbox = &names.outbox;
        Statements {
            // Due pending rows of held partitions, oldest first, skipping every aggregate
            // whose earlier event is failed or waiting for its retry: per-aggregate order.
            // An earlier due row has a lower id, so it is in the batch whenever a later one is.
            // The first blocker condition is the predicate of the `blocked` index, which
            // keeps the check O(blocked rows) whatever the backlog.
            claim: sql(format!(
                "SELECT o.id, o.event_id, o.aggregate_type, o.aggregate_id, o.aggregate_version, \
                        o.event_type, o.schema_version, o.topic, o.payload::text AS payload, \
                        o.headers::text AS headers, \
                        to_char(o.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') AS created_at, \
                        o.attempts, o.work_partition \
                 FROM {outbox} o \
                 WHERE o.status = 'pending' AND o.work_partition = ANY($1) AND o.next_attempt_at <= now() \
                   AND o.id <> ALL($3) \
                   AND NOT EXISTS ( \
                     SELECT 1 FROM {outbox} p \
                     WHERE p.aggregate_type = o.aggregate_type AND p.aggregate_id = o.aggregate_id \
                       AND p.id < o.id \
                       AND (p.status = 'failed' OR (p.status = 'pending' AND p.next_attempt_at > '-infinity')) \
                       AND (p.status = 'failed' OR p.next_attempt_at > now())) \
                 ORDER BY o.id LIMIT $2"
            )),
            published: sql(format!(
                "UPDATE {outbox} o SET status = 'published', published_at = now(), attempts = o.attempts + 1, \
                        last_error = NULL, kafka_partition = d.kp, kafka_offset = d.ko \
                 FROM unnest($1::bigint[], $2::int[], $3::bigint[]) AS d(id, kp, ko) \
                 WHERE o.id = d.id AND o.status = 'pending' AND {} \
                 RETURNING EXTRACT(EPOCH FROM o.published_at - o.created_at)::float8, o.attempts",
                fence(names, 4)
            )),
            retry: sql(format!(
                "UPDATE {outbox} o SET attempts = o.attempts + 1, last_error = d.err, \
                        next_attempt_at = now() + d.delay_ms * interval '1 millisecond' \
                 FROM unnest($1::bigint[], $2::bigint[], $3::text[]) AS d(id, delay_ms, err) \
                 WHERE o.id = d.id AND o.status = 'pending' AND {}",
                fence(names, 4)
            )),
            failed: sql(format!(
                "UPDATE {outbox} o SET status = 'failed', attempts = o.attempts + 1, last_error = d.err \
                 FROM unnest($1::bigint[], $2::text[]) AS d(id, err) \
                 WHERE o.id = d.id AND o.status = 'pending' AND {}",
                fence(names, 3)
            )),
        }
    }

    /// The claim statement, for plan checks.
    #[cfg(test)]
    pub(crate) fn claim_sql(&self) -> &str {
        self.claim.as_str()
    }

    /// Due rows of `partitions`, at most `limit`, leaving out `marking` (published rows
    /// whose mark is still being written).
    pub(crate) async fn claim(
        &self,
        pool: &PgPool,
        partitions: &[i32],
        limit: i64,
        marking: &[i64],
    ) -> Result<Vec<Row>> {
        Ok(sqlx::query_as(self.claim.clone())
            .bind(partitions)
            .bind(limit)
            .bind(marking)
            .fetch_all(pool)
            .await?)
    }
}

/// Binds the fence as the last three parameters of a mark and runs it.
trait Fenced {
    async fn fenced(self, fence: &Fence, pool: &PgPool) -> Result<u64>;
}

impl Fenced for sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments> {
    async fn fenced(self, fence: &Fence, pool: &PgPool) -> Result<u64> {
        let done =
            self.bind(fence.relay_id).bind(&fence.partitions).bind(&fence.tokens).execute(pool).await?;
        Ok(done.rows_affected())
    }
}

/// The fencing credentials of a mark.
#[derive(Debug, Clone)]
pub(crate) struct Fence {
    pub(crate) relay_id: Uuid,
    pub(crate) partitions: Vec<i32>,
    pub(crate) tokens: Vec<i64>,
}

/// What to record after one batch.
#[derive(Debug, Default)]
pub(crate) struct Marks {
    pub(crate) published: Vec<(i64, Placement)>,
    /// (row id, delay before the next attempt, reason)
    pub(crate) retry: Vec<(i64, Duration, String)>,
    pub(crate) failed: Vec<(i64, String)>,
}

/// Rows actually marked; fewer than asked means leases were lost on the way.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Marked {
    pub(crate) published: u64,
    pub(crate) retry: u64,
    pub(crate) failed: u64,
}

impl Statements {
    pub(crate) async fn mark(&self, pool: &PgPool, marks: &Marks, fence: &Fence) -> Result<Marked> {
        let mut marked = Marked::default();
        if !marks.published.is_empty() {
            let ids: Vec<i64> = marks.published.iter().map(|(id, _)| *id).collect();
            let parts: Vec<i32> = marks.published.iter().map(|(_, p)| p.partition).collect();
            let offsets: Vec<i64> = marks.published.iter().map(|(_, p)| p.offset).collect();
            let latencies: Vec<(f64, i32)> = sqlx::query_as(self.published.clone())
                .bind(ids)
                .bind(parts)
                .bind(offsets)
                .bind(fence.relay_id)
                .bind(&fence.partitions)
                .bind(&fence.tokens)
                .fetch_all(pool)
                .await?;
            for (seconds, attempts) in &latencies {
                metrics::histogram!(crate::metrics::CREATED_TO_PUBLISHED).record(*seconds);
                metrics::histogram!(crate::metrics::ATTEMPTS).record(f64::from(*attempts));
            }
            // Sent before without a recorded ack (a retry after an error or a timeout), or
            // replayed: consumers may see these twice and absorb them.
            let again = latencies.iter().filter(|(_, attempts)| *attempts > 1).count() as u64;
            metrics::counter!(crate::metrics::REPUBLISHED).increment(again);
            marked.published = latencies.len() as u64;
        }
        if !marks.retry.is_empty() {
            let ids: Vec<i64> = marks.retry.iter().map(|(id, _, _)| *id).collect();
            let delays: Vec<i64> = marks
                .retry
                .iter()
                .map(|(_, d, _)| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
                .collect();
            let errors: Vec<String> = marks.retry.iter().map(|(_, _, e)| e.clone()).collect();
            marked.retry = sqlx::query(self.retry.clone())
                .bind(ids)
                .bind(delays)
                .bind(errors)
                .fenced(fence, pool)
                .await?;
        }
        if !marks.failed.is_empty() {
            let ids: Vec<i64> = marks.failed.iter().map(|(id, _)| *id).collect();
            let errors: Vec<String> = marks.failed.iter().map(|(_, e)| e.clone()).collect();
            marked.failed =
                sqlx::query(self.failed.clone()).bind(ids).bind(errors).fenced(fence, pool).await?;
        }
        Ok(marked)
    }
}
