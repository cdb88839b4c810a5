//! One maintenance round of a partitioned dedup table: register this consumer's retention,
//! create the partitions ahead, drop those every consumer is done with.
//!
//! Every change runs in a short transaction of its own under a transaction-scoped advisory
//! lock of the table (consumers sharing it take turns; one that finds the lock taken
//! leaves the round to the other) and a lock timeout, so that it never waits long for a
//! lock while inserts queue behind it; what it could not do waits for the next round.

use std::time::Duration;

use serde::Serialize;
use sqlx::{AssertSqlSafe, PgConnection, PgPool};
use tracing::{debug, info, warn};

use super::{execute, layout, millis, relation, Layout};
use crate::error::Result;
use crate::inbox::names::InboxNames;

/// Partitions created in one round at most (a span of one second and a long pause).
const MAX_CREATED: usize = 100;

/// What one maintenance round did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct PartitionReport {
    /// Partitions created ahead, by name.
    pub created: Vec<String>,
    /// Rows moved into them from the default partition.
    pub moved: u64,
    /// Partitions dropped: every consumer with rows in them was past its retention.
    pub dropped: Vec<String>,
    /// Partitions whose span ended more than this consumer's retention ago (and the legacy
    /// one) that were kept for another consumer, and why.
    pub kept: Vec<KeptPartition>,
    /// Time partitions after the round.
    pub partitions: usize,
    /// Another consumer's round held the table's maintenance lock: creating partitions was
    /// left to it (the drops went on).
    pub skipped: bool,
}

/// A partition past the retention of the consumer that ran the round, kept for another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct KeptPartition {
    /// Its name.
    pub partition: String,
    /// The first consumer (by name) that holds it.
    pub consumer: String,
    /// Why: `within retention`, `retention unknown` (the consumer never ran a maintenance
    /// round: a consumer of an older version), `kept for ever` (its retention is `None`).
    pub reason: String,
}

/// A partition and its bounds (`None`: MINVALUE, or the default partition).
#[derive(Debug, Clone)]
struct Part {
    name: String,
    lo: Option<i64>,
    hi: Option<i64>,
}

impl Part {
    fn is_time(&self) -> bool {
        self.lo.is_some_and(|lo| lo >= 0)
    }
}

/// `FOR VALUES FROM ('1') TO ('2')` → `(Some(1), Some(2))`; MINVALUE and DEFAULT → `None`.
fn bounds(expr: &str) -> (Option<i64>, Option<i64>) {
    let value = |after: &str| {
        let rest = &expr[expr.find(after)? + after.len()..];
        let inner = rest.strip_prefix('(')?.split(')').next()?;
        inner.trim_matches('\'').parse::<i64>().ok()
    };
    (value("FROM "), value("TO "))
}

/// One round; `None` when the table is not partitioned.
pub(crate) async fn round(
    pool: &PgPool,
    names: &InboxNames,
    consumer: &str,
    retention: Option<Duration>,
) -> Result<Option<PartitionReport>> {
    if layout(pool, names).await? == Layout::Plain {
        return Ok(None);
    }
    let consumers = relation(names, "_consumers");
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {consumers} (consumer, dedup_retention, seen_at) \
         VALUES ($1, $2 * interval '1 millisecond', now()) \
         ON CONFLICT (consumer) DO UPDATE SET dedup_retention = excluded.dedup_retention, seen_at = excluded.seen_at"
    )))
    .bind(consumer)
    .bind(retention.map(millis))
    .execute(pool)
    .await?;
    let mut report = PartitionReport::default();
    // Another consumer creating partitions leaves creation to it; the drops go on (each
    // takes the lock of its own).
    report.skipped = !create_ahead(pool, names, &mut report).await?;
    let mut conn = pool.acquire().await?;
    let (parts, now_ms) = partitions(&mut conn, names).await?;
    drop(conn);
    // A partition is looked at once its span ended more than this consumer's retention
    // ago: a consumer that lags behind still finds the partitions of the spans it reads.
    let Some(retention) = retention else { return Ok(Some(gauges(consumer, report, &parts))) };
    let legacy = format!("{}_legacy", names.table);
    let due = |p: &&Part| {
        (p.is_time() && p.hi.is_some_and(|hi| hi.saturating_add(millis(retention)) <= now_ms))
            || p.name == legacy
    };
    for part in parts.iter().filter(due) {
        match drop_if_done(pool, names, part).await? {
            Verdict::Empty => {}
            Verdict::Busy => {
                debug!(consumer, partition = %part.name, stage = "partitions",
                       "a due partition of the dedup table could not be locked; next round");
            }
            Verdict::Dropped => {
                info!(consumer, partition = %part.name, stage = "partitions",
                      "dropped a partition of the dedup table: every consumer is past its retention");
                report.dropped.push(part.name.clone());
            }
            Verdict::Kept(holder, reason) => {
                if part.is_time() {
                    warn!(consumer, partition = %part.name, holder = %holder, reason = %reason, stage = "partitions",
                          "a partition of the dedup table past this consumer's retention is kept for another consumer");
                }
                report.kept.push(KeptPartition { partition: part.name.clone(), consumer: holder, reason });
            }
        }
    }
    Ok(Some(gauges(consumer, report, &parts)))
}

/// Sets the round's gauges; the report with its count of time partitions.
fn gauges(consumer: &str, mut report: PartitionReport, parts: &[Part]) -> PartitionReport {
    report.partitions =
        parts.iter().filter(|p| p.is_time()).count() + report.created.len() - report.dropped.len();
    // The legacy partition is not a time partition: cleaned by DELETE meanwhile.
    let overdue =
        report.kept.iter().filter(|k| parts.iter().any(|p| p.name == k.partition && p.is_time())).count();
    #[allow(clippy::cast_precision_loss)]
    {
        metrics::gauge!(crate::metrics::INBOX_PARTITIONS, "consumer" => consumer.to_owned())
            .set(report.partitions as f64);
        metrics::gauge!(crate::metrics::INBOX_PARTITIONS_OVERDUE, "consumer" => consumer.to_owned())
            .set(overdue as f64);
    }
    report
}

/// The table's partitions and the database's clock in milliseconds.
async fn partitions(conn: &mut PgConnection, names: &InboxNames) -> Result<(Vec<Part>, i64)> {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT c.relname::text, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i \
         JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = $1::regclass ORDER BY 1",
    )
    .bind(&names.inbox)
    .fetch_all(&mut *conn)
    .await?;
    let now_ms: i64 = sqlx::query_scalar("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint")
        .fetch_one(conn)
        .await?;
    let parts = rows
        .into_iter()
        .map(|(name, expr)| {
            let (lo, hi) = bounds(&expr);
            Part { name, lo, hi }
        })
        .collect();
    Ok((parts, now_ms))
}

/// Starts a transaction holding the table's maintenance lock, or `None` when another
/// round holds it.
async fn locked(
    pool: &PgPool,
    names: &InboxNames,
) -> Result<Option<sqlx::Transaction<'static, sqlx::Postgres>>> {
    let mut tx = pool.begin().await?;
    let got: bool = sqlx::query_scalar(
        "SELECT pg_try_advisory_xact_lock(hashtextextended('outbox inbox partitions ' || $1, 0))",
    )
    .bind(&names.inbox)
    .fetch_one(&mut *tx)
    .await?;
    if !got {
        return Ok(None);
    }
    execute(&mut tx, "SET LOCAL lock_timeout = '2s'".to_owned()).await?;
    Ok(Some(tx))
}

/// Creates the partitions missing from the start of the current span to `ahead` spans
/// past now, each in a transaction of its own. `false` when another round held the lock.
pub(super) async fn create_ahead(
    pool: &PgPool,
    names: &InboxNames,
    report: &mut PartitionReport,
) -> Result<bool> {
    let partitioning = relation(names, "_partitioning");
    loop {
        let Some(mut tx) = locked(pool, names).await? else { return Ok(false) };
        let (span_s, ahead): (i64, i32) =
            sqlx::query_as(AssertSqlSafe(format!("SELECT span_seconds, ahead FROM {partitioning}")))
                .fetch_one(&mut *tx)
                .await?;
        let (parts, now_ms) = partitions(&mut tx, names).await?;
        let span = span_s.saturating_mul(1000);
        let Some((lo, hi)) = next_missing(&parts, now_ms, span, ahead) else { return Ok(true) };
        if report.created.len() >= MAX_CREATED {
            warn!(table = %names.inbox, stage = "partitions", created = report.created.len(),
                  "created the most partitions one round creates; the rest next round");
            return Ok(true);
        }
        let name: String = sqlx::query_scalar(
            "SELECT $1 || '_p' || to_char(to_timestamp($2 / 1000.0) AT TIME ZONE 'UTC', 'YYMMDD_HH24MISS')",
        )
        .bind(&names.table)
        .bind(lo)
        .fetch_one(&mut *tx)
        .await?;
        let part = format!("\"{}\".\"{name}\"", names.schema);
        let (inbox, default) = (&names.inbox, relation(names, "_default"));
        execute(
            &mut tx,
            format!("CREATE TABLE {part} (LIKE {inbox} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"),
        )
        .await?;
        // Rows of this span that arrived while it had no partition: moved. Inserts into
        // the default partition wait from here to the commit (the attach locks it anyway),
        // so none of this span can arrive between the move and the attach.
        execute(&mut tx, format!("LOCK TABLE {default} IN SHARE ROW EXCLUSIVE MODE")).await?;
        let moved = sqlx::query(AssertSqlSafe(format!(
            "WITH moved AS (DELETE FROM {default} WHERE bucket >= {lo} AND bucket < {hi} RETURNING *) \
             INSERT INTO {part} SELECT * FROM moved"
        )))
        .execute(&mut *tx)
        .await?
        .rows_affected();
        execute(
            &mut tx,
            format!(
                "ALTER TABLE {part} ADD CONSTRAINT \"{table}_range\" CHECK (bucket >= {lo} AND bucket < {hi}); \
                 ALTER TABLE {inbox} ATTACH PARTITION {part} FOR VALUES FROM ({lo}) TO ({hi}); \
                 ALTER TABLE {part} DROP CONSTRAINT \"{table}_range\"",
                table = names.table
            ),
        )
        .await?;
        tx.commit().await?;
        debug!(table = %inbox, partition = %name, moved, stage = "partitions", "created a partition of the dedup table");
        report.created.push(name);
        report.moved += moved;
    }
}

/// The first span from the start of the current one to `ahead` spans past now that no
/// partition covers: `[lo, hi)`, cut short where an existing partition starts.
fn next_missing(parts: &[Part], now_ms: i64, span: i64, ahead: i32) -> Option<(i64, i64)> {
    let end = now_ms.saturating_add(span.saturating_mul(i64::from(ahead)));
    let mut cursor = now_ms.div_euclid(span) * span;
    let ranges: Vec<(i64, i64)> =
        parts.iter().filter(|p| p.is_time()).filter_map(|p| Some((p.lo?, p.hi?))).collect();
    while cursor < end {
        if let Some(&(_, hi)) = ranges.iter().find(|(lo, hi)| *lo <= cursor && cursor < *hi) {
            cursor = hi;
            continue;
        }
        let next_start = ranges.iter().map(|&(lo, _)| lo).filter(|&lo| lo > cursor).min().unwrap_or(i64::MAX);
        let boundary = (cursor.div_euclid(span) + 1) * span;
        return Some((cursor, boundary.min(next_start)));
    }
    None
}

/// Which consumer keeps `part` and why; none when it can go. Reads the partition's key
/// from one consumer to the next and each one's latest application, so it costs a few
/// probes per consumer, not a scan.
fn holders_sql(part: &str, consumers: &str) -> String {
    format!(
        "WITH RECURSIVE c(consumer) AS (SELECT min(consumer) FROM {part} UNION ALL \
           SELECT (SELECT min(consumer) FROM {part} WHERE consumer > c.consumer) FROM c WHERE c.consumer IS NOT NULL) \
         SELECT c.consumer, CASE WHEN r.consumer IS NULL THEN 'retention unknown' \
                                 WHEN r.dedup_retention IS NULL THEN 'kept for ever' \
                                 ELSE 'within retention' END \
         FROM c LEFT JOIN {consumers} r ON r.consumer = c.consumer \
         WHERE c.consumer IS NOT NULL AND (r.consumer IS NULL OR r.dedup_retention IS NULL \
           OR (SELECT max(applied_at) FROM {part} p WHERE p.consumer = c.consumer) >= now() - r.dedup_retention) \
         ORDER BY 1 LIMIT 1"
    )
}

/// Drops `part` if no consumer keeps it: checked, then checked again once it is detached
/// (under the lock that keeps inserts out), so that a row inserted in between keeps it.
/// The legacy partition is only dropped with rows, and an empty one takes its place.
async fn drop_if_done(pool: &PgPool, names: &InboxNames, part: &Part) -> Result<Verdict> {
    let rel = format!("\"{}\".\"{}\"", names.schema, part.name);
    let legacy = !part.is_time();
    if legacy {
        let rows: bool = sqlx::query_scalar(AssertSqlSafe(format!("SELECT EXISTS (SELECT 1 FROM {rel})")))
            .fetch_one(pool)
            .await?;
        if !rows {
            return Ok(Verdict::Empty);
        }
    }
    let check = holders_sql(&rel, &relation(names, "_consumers"));
    let holder: Option<(String, String)> =
        sqlx::query_as(AssertSqlSafe(check.clone())).fetch_optional(pool).await?;
    if let Some((holder, reason)) = holder {
        return Ok(Verdict::Kept(holder, reason));
    }
    let Some(mut tx) = locked(pool, names).await? else { return Ok(Verdict::Busy) };
    // Inserts queue behind the detach while it waits for its lock: a second at most, then
    // the partition waits for the next round and the round goes on.
    if let Err(error) = execute(&mut tx, format!("ALTER TABLE {} DETACH PARTITION {rel}", names.inbox)).await
    {
        if lock_timeout(&error) {
            return Ok(Verdict::Busy);
        }
        return Err(error);
    }
    let holder: Option<(String, String)> =
        sqlx::query_as(AssertSqlSafe(check)).fetch_optional(&mut *tx).await?;
    if let Some((holder, reason)) = holder {
        tx.rollback().await?;
        return Ok(Verdict::Kept(holder, reason));
    }
    execute(&mut tx, format!("DROP TABLE {rel}")).await?;
    if legacy {
        execute(&mut tx, super::legacy_sql(names)).await?;
    }
    tx.commit().await?;
    Ok(Verdict::Dropped)
}

/// What became of a partition a round looked at.
enum Verdict {
    Dropped,
    /// By this consumer, for this reason.
    Kept(String, String),
    /// The legacy partition, empty: nothing to drop.
    Empty,
    /// Another round holds the table's maintenance lock, or the detach's lock timed out:
    /// looked at again next round.
    Busy,
}

/// Whether `error` is PostgreSQL's lock timeout (55P03).
fn lock_timeout(error: &crate::Error) -> bool {
    matches!(error, crate::Error::Database(e) if e.as_database_error().and_then(|d| d.code()).as_deref() == Some("55P03"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(lo: i64, hi: i64) -> Part {
        Part { name: format!("p{lo}"), lo: Some(lo), hi: Some(hi) }
    }

    #[test]
    fn bounds_are_read_from_the_catalogs_text() {
        assert_eq!(bounds("FOR VALUES FROM ('1000') TO ('2000')"), (Some(1000), Some(2000)));
        assert_eq!(bounds("FOR VALUES FROM (MINVALUE) TO ('-1')"), (None, Some(-1)));
        assert_eq!(bounds("FOR VALUES FROM ('-1') TO ('0')"), (Some(-1), Some(0)));
        assert_eq!(bounds("DEFAULT"), (None, None));
    }

    #[test]
    fn missing_spans_start_at_the_current_one_and_skip_existing_ones() {
        let day = 86_400_000;
        let now = 10 * day + 5;
        assert_eq!(next_missing(&[], now, day, 3), Some((10 * day, 11 * day)));
        let some = [part(10 * day, 11 * day), part(11 * day, 12 * day)];
        assert_eq!(next_missing(&some, now, day, 3), Some((12 * day, 13 * day)));
        let all = [
            part(10 * day, 11 * day),
            part(11 * day, 12 * day),
            part(12 * day, 13 * day),
            part(13 * day, 14 * day),
        ];
        assert_eq!(next_missing(&all, now, day, 3), None);
        // Another span before: the new one stops where an existing one starts.
        let odd = [part(10 * day + day / 2, 12 * day)];
        assert_eq!(next_missing(&odd, now, day, 1), Some((10 * day, 10 * day + day / 2)));
        // Foreign and legacy partitions are not time partitions.
        let other = [
            Part { name: "f".into(), lo: Some(-1), hi: Some(0) },
            Part { name: "l".into(), lo: None, hi: Some(-1) },
        ];
        assert_eq!(next_missing(&other, now, day, 1), Some((10 * day, 11 * day)));
    }
}
