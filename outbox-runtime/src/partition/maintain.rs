//! One maintenance round of a partitioned outbox: create the partitions ahead, move
//! appends on to the next partition once the current one spans its time, drop the
//! partitions whose events are all done and past retention.
//!
//! Every change runs in a short transaction of its own under a transaction-scoped advisory
//! lock of the table (relays sharing it take turns; one that finds the lock taken leaves
//! the change to the other) and a lock timeout of 2 s, so that it never waits long for a
//! lock while appends queue behind it; what it could not do waits for the next round.

use std::time::Duration;

use serde::Serialize;
use sqlx::{AssertSqlSafe, PgConnection, PgPool, Postgres, Transaction};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::convert::create_partition_sql;
use super::{execute, is_partitioned, partition_name, relation, SPAN_BITS};
use crate::error::Result;
use crate::table::Names;

/// What one maintenance round did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct PartitionReport {
    /// Partitions created ahead, by name.
    pub created: Vec<String>,
    /// The partition appends were moved on to, when the current one had spanned its time.
    pub moved_to: Option<String>,
    /// Partitions dropped: every event in them was done and past retention.
    pub dropped: Vec<String>,
    /// Partitions past retention that were kept, and why.
    pub kept: Vec<KeptPartition>,
    /// Partitions after the round (the legacy one included, the default one not).
    pub partitions: usize,
    /// Another relay's round held the table's maintenance lock: creating partitions and
    /// moving on were left to it (the drops went on).
    pub skipped: bool,
}

/// A partition past retention that a round kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct KeptPartition {
    /// Its name.
    pub partition: String,
    /// Why: `holds pending or failed events` (never dropped while it does), or `busy` (its
    /// lock was not granted within the timeout: the next round tries again).
    pub reason: String,
}

/// A partition: `Some(k)` for partition `k`, `None` for the legacy one.
#[derive(Debug, Clone)]
struct Part {
    name: String,
    k: Option<i64>,
}

/// Runs rounds every `interval` until `shutdown`, for a relay of a partitioned outbox.
pub(crate) async fn run(
    pool: PgPool,
    names: Names,
    retention: Option<Duration>,
    interval: Duration,
    shutdown: CancellationToken,
) {
    loop {
        match round(&pool, &names, retention).await {
            Ok(Some(report)) => debug!(table = %names.outbox, stage = "partitions",
                                       created = report.created.len(), dropped = report.dropped.len(),
                                       kept = report.kept.len(), "partition maintenance round"),
            Ok(None) => {}
            Err(error) => {
                metrics::counter!(crate::metrics::OUTBOX_PARTITION_ERRORS).increment(1);
                warn!(table = %names.outbox, stage = "partitions", %error,
                      "partition maintenance failed; trying again next round");
            }
        }
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

/// One round; `None` when the table is not partitioned.
pub(crate) async fn round(
    pool: &PgPool,
    names: &Names,
    retention: Option<Duration>,
) -> Result<Option<PartitionReport>> {
    if !is_partitioned(pool, names).await? {
        return Ok(None);
    }
    let mut report = PartitionReport::default();
    let current = match locked(pool, names).await? {
        Some(mut tx) => {
            let current = move_on(&mut tx, names, &mut report).await?;
            tx.commit().await?;
            Some(current)
        }
        None => {
            report.skipped = true;
            None
        }
    };
    let mut conn = pool.acquire().await?;
    let parts = partitions(&mut conn, names).await?;
    let current = match current {
        Some(current) => current,
        None => current_partition(&mut conn, names).await?,
    };
    drop(conn);
    if let Some(retention) = retention {
        let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        for part in parts.iter().filter(|p| p.k.is_none_or(|k| k < current)) {
            match drop_if_done(pool, names, part, retention_ms).await? {
                Verdict::Young => {}
                Verdict::Dropped => {
                    info!(table = %names.outbox, partition = %part.name, stage = "partitions",
                          "dropped a partition of the outbox: every event in it was done and past retention");
                    report.dropped.push(part.name.clone());
                }
                Verdict::Kept(reason) => {
                    warn!(table = %names.outbox, partition = %part.name, reason, stage = "partitions",
                          "a partition of the outbox past retention is kept");
                    report
                        .kept
                        .push(KeptPartition { partition: part.name.clone(), reason: reason.to_owned() });
                }
            }
        }
    }
    // `parts` was read after the partitions were created.
    report.partitions = parts.len() - report.dropped.len();
    #[allow(clippy::cast_precision_loss)]
    {
        metrics::gauge!(crate::metrics::OUTBOX_PARTITIONS).set(report.partitions as f64);
        metrics::gauge!(crate::metrics::OUTBOX_PARTITIONS_OVERDUE)
            .set(report.kept.iter().filter(|k| k.reason != "busy").count() as f64);
    }
    Ok(Some(report))
}

/// Starts a transaction holding the table's maintenance lock, or `None` when another
/// round holds it.
async fn locked(pool: &PgPool, names: &Names) -> Result<Option<Transaction<'static, Postgres>>> {
    let mut tx = pool.begin().await?;
    let got: bool = sqlx::query_scalar(
        "SELECT pg_try_advisory_xact_lock(hashtextextended('outbox partitions ' || $1, 0))",
    )
    .bind(&names.outbox)
    .fetch_one(&mut *tx)
    .await?;
    if !got {
        return Ok(None);
    }
    execute(&mut tx, "SET LOCAL lock_timeout = '2s'".to_owned()).await?;
    Ok(Some(tx))
}

/// The table's partitions but the default one, by name.
async fn partitions(conn: &mut PgConnection, names: &Names) -> Result<Vec<Part>> {
    let rows: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
         WHERE i.inhparent = $1::regclass ORDER BY 1",
    )
    .bind(&names.outbox)
    .fetch_all(conn)
    .await?;
    let prefix = format!("{}_p", names.table);
    let legacy = format!("{}_legacy", names.table);
    Ok(rows
        .into_iter()
        .filter_map(|name| {
            let k = name.strip_prefix(&prefix).and_then(|k| k.parse::<i64>().ok());
            (k.is_some() || name == legacy).then_some(Part { name, k })
        })
        .collect())
}

/// The id the next append takes, from the table's identity sequence: its last value, or
/// that value itself while `is_called` is false (just set, no id taken since).
async fn next_id(conn: &mut PgConnection, names: &Names) -> Result<i64> {
    let sequence: String = sqlx::query_scalar("SELECT pg_get_serial_sequence($1, 'id')")
        .bind(&names.outbox)
        .fetch_one(&mut *conn)
        .await?;
    let (last, called): (i64, bool) =
        sqlx::query_as(AssertSqlSafe(format!("SELECT last_value, is_called FROM {sequence}")))
            .fetch_one(conn)
            .await?;
    Ok(if called { last.saturating_add(1) } else { last })
}

/// Which rows of a partitioned outbox the cleanup deletes one by one, as a predicate on
/// `id` (constants, so that the planner prunes the other partitions): the legacy
/// partition's and the default one's, and the current partition's and those ahead when its
/// first event was appended more than `retention` ago, so that some may be past it: a
/// retention shorter than the span, or appends that stay in one partition because the
/// rounds cannot move them on (a relay that is not the table's owner). The partitions
/// before the current one leave whole, by the rounds' drops. Read with what such a relay
/// may read: the catalog and the outbox table.
pub(crate) async fn deleted_by_cleanup(
    conn: &mut PgConnection,
    names: &Names,
    retention: Duration,
) -> Result<String> {
    let numbered: Vec<i64> = partitions(conn, names).await?.into_iter().filter_map(|part| part.k).collect();
    let (Some(lowest), Some(highest)) = (numbered.iter().min(), numbered.iter().max()) else {
        return Ok("true".to_owned());
    };
    let mut from = (highest + 1).saturating_mul(1 << SPAN_BITS);
    let newest: Option<i64> =
        sqlx::query_scalar(AssertSqlSafe(format!("SELECT max(id) FROM {}", names.outbox)))
            .fetch_one(&mut *conn)
            .await?;
    if let Some(newest) = newest {
        let current = (newest >> SPAN_BITS) << SPAN_BITS;
        let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        let old: Option<bool> = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT created_at < now() - $1 * interval '1 millisecond' FROM {} WHERE id >= $2 ORDER BY id LIMIT 1",
            names.outbox
        )))
        .bind(retention_ms)
        .bind(current)
        .fetch_optional(&mut *conn)
        .await?;
        if old == Some(true) {
            from = from.min(current);
        }
    }
    Ok(format!("(id < {} OR id >= {from})", lowest << SPAN_BITS))
}

/// The partition the next append goes to.
async fn current_partition(conn: &mut PgConnection, names: &Names) -> Result<i64> {
    Ok(next_id(conn, names).await? >> SPAN_BITS)
}

/// Under the maintenance lock: moves appends on to the next partition when the current
/// one's first event is older than the span, and creates the partitions missing from the
/// current one to `ahead` past it. Returns the current partition.
async fn move_on(tx: &mut PgConnection, names: &Names, report: &mut PartitionReport) -> Result<i64> {
    let (span_s, ahead): (i64, i32) = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT span_seconds, ahead FROM {}",
        relation(names, "_partitioning")
    )))
    .fetch_one(&mut *tx)
    .await?;
    let parts = partitions(tx, names).await?;
    let mut current = current_partition(tx, names).await?;
    let exists = |k: i64| parts.iter().any(|p| p.k == Some(k));
    let full = if exists(current) {
        let part = format!("\"{}\".\"{}\"", names.schema, partition_name(names, current));
        sqlx::query_scalar::<_, bool>(AssertSqlSafe(format!(
            "SELECT created_at < now() - $1 * interval '1 second' FROM {part} ORDER BY id LIMIT 1"
        )))
        .bind(span_s)
        .fetch_optional(&mut *tx)
        .await?
        .unwrap_or(false)
    } else {
        false
    };
    if full {
        current += 1;
    }
    for k in current..=current.saturating_add(i64::from(ahead)) {
        if !exists(k) {
            execute(tx, create_partition_sql(names, k)).await?;
            report.created.push(partition_name(names, k));
        }
    }
    if full {
        // Only forward: the next id is in the partition before (ids handed out meanwhile
        // too: it holds 2^40), so the new first id is above every id given out.
        let first = current << SPAN_BITS;
        if next_id(tx, names).await? < first {
            sqlx::query("SELECT setval(pg_get_serial_sequence($1, 'id'), $2, false)")
                .bind(&names.outbox)
                .bind(first)
                .execute(&mut *tx)
                .await?;
        }
        report.moved_to = Some(partition_name(names, current));
        info!(table = %names.outbox, partition = %partition_name(names, current), stage = "partitions",
              "appends moved on to the next partition of the outbox");
    }
    Ok(current)
}

enum Verdict {
    /// Its newest event is within retention (or it is the current one).
    Young,
    Dropped,
    Kept(&'static str),
}

/// Drops `part` when every event in it is done, its newest was appended more than
/// `retention_ms` ago and none was published within it, its rows counted into the cleaned
/// tally in the same transaction, under the maintenance lock that cleanup and purge
/// batches take too (no row counted twice).
/// Open rows are looked for again after the detach, under its lock: an operator's
/// `retry` or `replay` that committed before is seen, one after waits and finds no row.
async fn drop_if_done(pool: &PgPool, names: &Names, part: &Part, retention_ms: i64) -> Result<Verdict> {
    let table = format!("\"{}\".\"{}\"", names.schema, part.name);
    let young: Option<bool> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT created_at >= now() - $1 * interval '1 millisecond' FROM {table} ORDER BY id DESC LIMIT 1"
    )))
    .bind(retention_ms)
    .fetch_optional(pool)
    .await?;
    if young == Some(true) {
        return Ok(Verdict::Young);
    }
    let open = format!("SELECT EXISTS (SELECT 1 FROM {table} WHERE status IN ('pending', 'failed'))");
    if sqlx::query_scalar::<_, bool>(AssertSqlSafe(open.clone())).fetch_one(pool).await? {
        return Ok(Verdict::Kept("holds pending or failed events"));
    }
    // Published within retention (after an outage as long, or replayed): kept as long as
    // the cleanup would keep it.
    let recent: bool = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT EXISTS (SELECT 1 FROM {table} WHERE published_at >= now() - $1 * interval '1 millisecond')"
    )))
    .bind(retention_ms)
    .fetch_one(pool)
    .await?;
    if recent {
        return Ok(Verdict::Young);
    }
    let Some(mut tx) = locked(pool, names).await? else { return Ok(Verdict::Kept("busy")) };
    // Counted before the detach: the detach locks the outbox table (appends wait) until
    // this transaction ends, so no scan runs under that lock.
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {cleaned} AS c (event_type, status, hour, events) \
         SELECT event_type, status, date_trunc('hour', created_at AT TIME ZONE 'UTC'), count(*) FROM {table} \
         GROUP BY 1, 2, 3 \
         ON CONFLICT (event_type, status, hour) DO UPDATE SET events = c.events + excluded.events",
        cleaned = names.cleaned
    )))
    .execute(&mut *tx)
    .await?;
    let detach = format!("ALTER TABLE {} DETACH PARTITION {table}", names.outbox);
    if let Err(error) = execute(&mut tx, detach).await {
        if lock_timeout(&error) {
            return Ok(Verdict::Kept("busy"));
        }
        return Err(error);
    }
    if sqlx::query_scalar::<_, bool>(AssertSqlSafe(open)).fetch_one(&mut *tx).await? {
        return Ok(Verdict::Kept("holds pending or failed events"));
    }
    execute(&mut tx, format!("DROP TABLE {table}")).await?;
    tx.commit().await?;
    Ok(Verdict::Dropped)
}

/// Whether `error` is a lock timeout (SQLSTATE 55P03).
fn lock_timeout(error: &crate::Error) -> bool {
    matches!(error, crate::Error::Database(e)
        if e.as_database_error().and_then(|d| d.code()).is_some_and(|c| c == "55P03"))
}
