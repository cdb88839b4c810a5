//! The outbox's gauges, read from its partial indexes and PostgreSQL's statistics views,
//! and set as metrics (names in [`crate::metrics`]).

use serde::Serialize;
use sqlx::{AssertSqlSafe, PgPool};

use super::Ops;
use super::{CapacityStatus, DEFAULT_RATE_WINDOW};
use crate::error::Result;

/// What [`Ops::record_gauges`](super::Ops::record_gauges) read: the outbox's state from its partial indexes, its
/// time indexes and PostgreSQL's statistics views, never from a count over the whole table
/// (every relay reads it at every lease renewal, and the table holds every retained
/// published event).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Gauges {
    /// Events waiting to be published.
    pub pending: i64,
    /// Pending events waiting for a retry after a failed attempt.
    pub retrying: i64,
    /// Events quarantined after a permanent error.
    pub failed: i64,
    /// Age in seconds of the oldest event not yet published (the oldest pending one by
    /// append order, or the oldest failed one); `None` when there is none.
    pub oldest_unpublished_age_seconds: Option<f64>,
    /// Over the last 5 minutes: events appended per second.
    pub appended_per_second: f64,
    /// Over the last 5 minutes: events published per second.
    pub published_per_second: f64,
    /// The outbox table's size with its indexes and TOAST, in bytes.
    pub table_bytes: i64,
    /// Dead tuples in the outbox table (`pg_stat_user_tables`; of a partitioned one, all
    /// its partitions').
    pub dead_tuples: i64,
    /// Seconds since the outbox table was last vacuumed, by hand or by autovacuum (a
    /// partitioned one: its partition vacuumed last); `None` when it never was.
    pub seconds_since_vacuum: Option<f64>,
    /// Seconds since its statistics were last gathered (`ANALYZE` or autoanalyze); `None`
    /// when they never were.
    pub seconds_since_analyze: Option<f64>,
    /// Rows inserted, updated or deleted since then (`n_mod_since_analyze`).
    pub modified_since_analyze: i64,
    /// Fill level and forecast, when a capacity is configured.
    pub capacity: Option<CapacityStatus>,
}

/// Planner settings for the gauges' reading, local to its transaction: no sequential scan
/// of the outbox, whatever its statistics say (an un-analysed table can look empty).
const GAUGES_PLAN: &str = "SELECT set_config('enable_seqscan', 'off', true)";

impl Ops {
    /// Reads the outbox's [`Gauges`] and sets the gauge metrics from them. Relays call
    /// this at every lease renewal; call it yourself to export the gauges from another
    /// process. Its cost grows with the unpublished events and the events of the last
    /// 5 minutes, not with the table.
    pub async fn record_gauges(&self, pool: &PgPool) -> Result<Gauges> {
        self.record_gauges_unchecked(pool).await.map_err(|e| self.names().not_migrated(e))
    }

    async fn record_gauges_unchecked(&self, pool: &PgPool) -> Result<Gauges> {
        let t = &self.names().outbox;
        let window = DEFAULT_RATE_WINDOW.as_secs_f64();
        // Pending rows are fresh or waiting for a retry, each half counted on its own index
        // (`fresh`, `due`); the oldest is the first fresh row or the first touched one.
        let touched = crate::migrate::TOUCHED;
        let sql = format!(
            "SELECT (SELECT count(*) FROM {t} WHERE status = 'pending' AND next_attempt_at = '-infinity') \
                      + (SELECT count(*) FROM {t} WHERE status = 'pending' AND next_attempt_at > '-infinity'), \
                    (SELECT count(*) FROM {t} WHERE status = 'pending' AND next_attempt_at > '-infinity'), \
                    (SELECT count(*) FROM {t} WHERE status = 'failed'), \
                    EXTRACT(EPOCH FROM now() - LEAST( \
                      (SELECT created_at FROM {t} WHERE status = 'pending' AND next_attempt_at = '-infinity' \
                       ORDER BY id LIMIT 1), \
                      (SELECT created_at FROM {t} WHERE status = 'pending' AND {touched} ORDER BY id LIMIT 1), \
                      (SELECT min(created_at) FROM {t} WHERE status = 'failed')))::float8, \
                    (SELECT count(*) FROM {t} WHERE created_at >= now() - $1 * interval '1 second'), \
                    (SELECT count(*) FROM {t} WHERE published_at >= now() - $1 * interval '1 second'), \
                    (SELECT coalesce(sum(pg_total_relation_size(relid)), 0)::bigint FROM (SELECT $2::regclass AS relid UNION SELECT relid FROM pg_partition_tree($2::regclass)) AS t), \
                    coalesce(s.n_dead_tup, 0), coalesce(s.n_live_tup, 0), \
                    EXTRACT(EPOCH FROM now() - s.vacuumed)::float8, \
                    EXTRACT(EPOCH FROM now() - s.analyzed)::float8, \
                    coalesce(s.n_mod_since_analyze, 0) \
             FROM (SELECT sum(n_dead_tup)::bigint AS n_dead_tup, sum(n_live_tup)::bigint AS n_live_tup, \
                          max(GREATEST(last_vacuum, last_autovacuum)) AS vacuumed, \
                          max(GREATEST(last_analyze, last_autoanalyze)) AS analyzed, \
                          sum(n_mod_since_analyze)::bigint AS n_mod_since_analyze \
                   FROM pg_stat_user_tables \
                   WHERE relid IN (SELECT $2::regclass UNION SELECT relid FROM pg_partition_tree($2::regclass))) AS s"
        );
        type Row = (i64, i64, i64, Option<f64>, i64, i64, i64, i64, i64, Option<f64>, Option<f64>, i64);
        let mut tx = pool.begin().await?;
        sqlx::query(GAUGES_PLAN).execute(&mut *tx).await?;
        let row: Row = sqlx::query_as(AssertSqlSafe(sql)).bind(window).bind(t).fetch_one(&mut *tx).await?;
        tx.commit().await?;
        let (
            pending,
            retrying,
            failed,
            oldest,
            appended,
            published,
            bytes,
            dead,
            live,
            vacuum,
            analyze,
            modified,
        ) = row;
        #[allow(clippy::cast_precision_loss)]
        let (appended_per_second, published_per_second) =
            (appended as f64 / window, published as f64 / window);
        let gauges = Gauges {
            pending,
            retrying,
            failed,
            oldest_unpublished_age_seconds: oldest,
            appended_per_second,
            published_per_second,
            table_bytes: bytes,
            dead_tuples: dead,
            seconds_since_vacuum: vacuum,
            seconds_since_analyze: analyze,
            modified_since_analyze: modified,
            capacity: self.capacity_status(
                pending + failed,
                bytes,
                live,
                appended_per_second - published_per_second,
            ),
        };
        #[allow(clippy::cast_precision_loss)]
        {
            metrics::gauge!("outbox_pending").set(gauges.pending as f64);
            metrics::gauge!("outbox_retrying").set(gauges.retrying as f64);
            metrics::gauge!("outbox_failed").set(gauges.failed as f64);
            metrics::gauge!("outbox_table_bytes").set(gauges.table_bytes as f64);
            metrics::gauge!("outbox_dead_tuples").set(gauges.dead_tuples as f64);
            metrics::gauge!("outbox_modified_since_analyze").set(gauges.modified_since_analyze as f64);
        }
        // Never vacuumed or analysed reads as +Inf, so that an alert on the lag fires.
        metrics::gauge!("outbox_seconds_since_vacuum")
            .set(gauges.seconds_since_vacuum.unwrap_or(f64::INFINITY));
        metrics::gauge!("outbox_seconds_since_analyze")
            .set(gauges.seconds_since_analyze.unwrap_or(f64::INFINITY));
        metrics::gauge!("outbox_oldest_unpublished_age_seconds")
            .set(gauges.oldest_unpublished_age_seconds.unwrap_or(0.0));
        metrics::gauge!("outbox_appended_per_second").set(gauges.appended_per_second);
        metrics::gauge!("outbox_published_per_second").set(gauges.published_per_second);
        if let Some(capacity) = &gauges.capacity {
            metrics::gauge!("outbox_capacity_used_ratio").set(capacity.used_ratio);
            metrics::gauge!("outbox_capacity_seconds_to_full")
                .set(capacity.seconds_to_full.unwrap_or(f64::INFINITY));
        }
        Ok(gauges)
    }
}
