//! Operating an outbox: its status and forecast, failed events, retry, discard, replay,
//! purge, reconcile and the gauges, on the handle [`Outbox::ops`] gives (as
//! [`Inbox::admin`](crate::inbox::Inbox::admin) does for an inbox). The `outbox` command
//! line (feature `cli`) is a thin layer over these.

use std::time::Duration;

use serde::Serialize;
use sqlx::{AssertSqlSafe, PgPool};
use uuid::Uuid;

use crate::capacity::seconds_to_full;
use crate::error::Result;
use crate::outbox::Outbox;

mod browse;
mod bulk;
mod deprecated;
mod detail;
mod gauges;
mod overview;
mod partition;
mod purge;
mod query;
mod reconcile;
mod replay;

pub use crate::action::{ActionFilter, ActionReport, AuditEntry, AuditPage};
pub use browse::{EventPage, EventQuery, EventState, EventSummary, MAX_PAGE};
pub use detail::{EventDetail, FailureGroup, Payload, NEIGHBOURS};
pub use gauges::Gauges;
pub use overview::{Capped, InFlight, Overview, RelayLeases, StateCount};
pub use partition::{KeptPartition, PartitionReport};
pub use reconcile::{InboxSide, Reconciliation, ReconciliationRow};
pub use replay::{ReplayFilter, ReplayReport};

/// The state of an outbox at one moment.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Status {
    /// Events waiting to be published.
    pub pending: i64,
    /// Events quarantined after a permanent error.
    pub failed: i64,
    /// Published events still in the table (not yet cleaned up).
    pub published: i64,
    /// Events an operator discarded.
    pub discarded: i64,
    /// Age in seconds of the oldest event not yet published (pending or failed): the
    /// headline figure. `None` when there is none.
    pub oldest_unpublished_age_seconds: Option<f64>,
    /// Pending events waiting for a retry after a failed attempt (see
    /// [`Ops::retrying`]). Replayed events and failed events put back by `retry` are
    /// plain pending until an attempt fails.
    pub retrying: i64,
    /// Over the last `window_seconds`: events appended per second.
    pub appended_per_second: f64,
    /// Over the last `window_seconds`: events published per second.
    pub published_per_second: f64,
    /// The window the rates are measured over.
    pub window_seconds: f64,
    /// The outbox table's size with its indexes and TOAST, in bytes (all its partitions').
    pub table_bytes: i64,
    /// Dead tuples in the outbox table, as `pg_stat_user_tables` counts them (vacuum's backlog).
    pub dead_tuples: i64,
    /// Fill level and forecast, when a capacity is configured.
    pub capacity: Option<CapacityStatus>,
}

/// The fill level against the configured [`Capacity`](crate::Capacity), and when it is full.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct CapacityStatus {
    /// `rows` (unpublished events) or `bytes` (table size).
    pub unit: &'static str,
    /// The configured capacity.
    pub limit: u64,
    /// The fill level now.
    pub used: u64,
    /// `used / limit`.
    pub used_ratio: f64,
    /// The share from which non-critical appends are refused.
    pub refuse_non_critical_at: f64,
    /// Net growth in units per second over the window: appended minus published, in
    /// bytes at the table's mean bytes per row for a bytes capacity.
    pub growth_per_second: f64,
    /// Seconds until full at that growth; `None` when the level is not growing, 0 when full.
    pub seconds_to_full: Option<f64>,
}

/// The window `status` measures rates over by default.
pub const DEFAULT_RATE_WINDOW: Duration = Duration::from_secs(300);

/// A failed event, for operators (never its payload).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct FailedEvent {
    /// Its id.
    pub event_id: Uuid,
    /// Its type.
    pub event_type: String,
    /// Its aggregate.
    pub aggregate_type: String,
    /// Its aggregate's id.
    pub aggregate_id: String,
    /// Attempts made.
    pub attempts: i32,
    /// Why it failed.
    pub last_error: Option<String>,
    /// Later events of its aggregate held back behind it.
    pub held_back: i64,
}

/// A pending event waiting for its next attempt after a failed one, for operators (never
/// its payload).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct RetryingEvent {
    /// Its id.
    pub event_id: Uuid,
    /// Its type.
    pub event_type: String,
    /// Its aggregate.
    pub aggregate_type: String,
    /// Its aggregate's id.
    pub aggregate_id: String,
    /// The topic it goes to.
    pub topic: String,
    /// Attempts made.
    pub attempts: i32,
    /// When it is tried again (RFC 3339, UTC).
    pub next_attempt_at: String,
    /// Seconds until then; 0 or less when it is due (the next batch takes it).
    pub next_attempt_in_seconds: f64,
    /// What the last attempt ran into.
    pub last_error: Option<String>,
}

impl sqlx::FromRow<'_, sqlx::postgres::PgRow> for RetryingEvent {
    fn from_row(r: &sqlx::postgres::PgRow) -> sqlx::Result<Self> {
        use sqlx::Row as _;
        Ok(RetryingEvent {
            event_id: r.try_get("event_id")?,
            event_type: r.try_get("event_type")?,
            aggregate_type: r.try_get("aggregate_type")?,
            aggregate_id: r.try_get("aggregate_id")?,
            topic: r.try_get("topic")?,
            attempts: r.try_get("attempts")?,
            next_attempt_at: r.try_get("next_attempt_at")?,
            next_attempt_in_seconds: r.try_get("next_attempt_in_seconds")?,
            last_error: r.try_get("last_error")?,
        })
    }
}

/// Events waiting for a retry: how many in all, and the oldest of them.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Retrying {
    /// How many pending events wait for a retry in all.
    pub total: i64,
    /// The oldest of them (by append order), at most the limit asked for.
    pub events: Vec<RetryingEvent>,
}

/// Which failed events to retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetryTarget {
    /// One event.
    Event(Uuid),
    /// Every failed event of one aggregate id.
    Aggregate(String),
    /// Every failed event.
    AllFailed,
}

/// The operator side of one outbox (see the [module documentation](self)); from
/// [`Outbox::ops`]. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Ops {
    outbox: Outbox,
}

impl Outbox {
    /// The operator side of this outbox: status, failed and retrying events, retry,
    /// discard, replay, purge, reconcile, gauges.
    ///
    /// Each call takes the pool it works on, where [`Inbox::admin`](crate::inbox::Inbox::admin)
    /// keeps its inbox's: an `Outbox` holds no pool (an append runs on the caller's
    /// transaction, and one `Outbox` value may serve the databases of several shards),
    /// while an `Inbox` consumes on the pool it was built with. Without an `Inbox` at hand,
    /// [`InboxAdmin::new`](crate::inbox::InboxAdmin::new) takes a pool as well.
    pub fn ops(&self) -> Ops {
        Ops { outbox: self.clone() }
    }
}

impl Ops {
    /// The outbox operated.
    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    fn names(&self) -> &crate::table::Names {
        self.outbox.names()
    }

    fn config(&self) -> &crate::outbox::OutboxConfig {
        self.outbox.config()
    }
}

impl Ops {
    /// Checks that this outbox's tables exist: [`Error::NotMigrated`](crate::Error::NotMigrated)
    /// naming the first missing one otherwise (its migrations have not run, or the schema
    /// or table name is not the one they ran with).
    pub async fn check_migrated(&self, pool: &PgPool) -> Result<()> {
        self.outbox.check_migrated(pool).await
    }

    /// Counts, the age of the oldest unpublished event, rates over the last 5 minutes,
    /// table size and the capacity forecast.
    pub async fn status(&self, pool: &PgPool) -> Result<Status> {
        self.status_over(pool, DEFAULT_RATE_WINDOW).await
    }

    /// [`Ops::status`] with rates measured over `window`.
    pub async fn status_over(&self, pool: &PgPool, window: Duration) -> Result<Status> {
        self.status_over_unchecked(pool, window).await.map_err(|e| self.names().not_migrated(e))
    }

    async fn status_over_unchecked(&self, pool: &PgPool, window: Duration) -> Result<Status> {
        let names = self.names();
        let sql = format!(
            "SELECT count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'failed'), \
                    count(*) FILTER (WHERE status = 'published'), count(*) FILTER (WHERE status = 'discarded'), \
                    EXTRACT(EPOCH FROM now() - min(created_at) FILTER (WHERE status IN ('pending', 'failed')))::float8, \
                    count(*) FILTER (WHERE status = 'pending' AND next_attempt_at > '-infinity'), \
                    (SELECT count(*) FROM {t} WHERE created_at >= now() - $1 * interval '1 second'), \
                    (SELECT count(*) FROM {t} WHERE published_at >= now() - $1 * interval '1 second'), \
                    (SELECT coalesce(sum(pg_total_relation_size(relid)), 0)::bigint FROM (SELECT $2::regclass AS relid UNION SELECT relid FROM pg_partition_tree($2::regclass)) AS t), \
                    (SELECT coalesce(sum(n_dead_tup), 0)::bigint FROM pg_stat_user_tables \
                      WHERE relid IN (SELECT $2::regclass UNION SELECT relid FROM pg_partition_tree($2::regclass))), \
                    (SELECT coalesce(sum(n_live_tup), 0)::bigint FROM pg_stat_user_tables \
                      WHERE relid IN (SELECT $2::regclass UNION SELECT relid FROM pg_partition_tree($2::regclass))) \
             FROM {t}",
            t = names.outbox
        );
        type Row = (i64, i64, i64, i64, Option<f64>, i64, i64, i64, i64, i64, i64);
        let window_seconds = window.as_secs_f64().max(1.0);
        let (
            pending,
            failed,
            published,
            discarded,
            oldest,
            retrying,
            appended_n,
            published_n,
            bytes,
            dead,
            live,
        ): Row = sqlx::query_as(AssertSqlSafe(sql))
            .bind(window_seconds)
            .bind(&names.outbox)
            .fetch_one(pool)
            .await?;
        #[allow(clippy::cast_precision_loss)]
        let (appended_per_second, published_per_second) =
            (appended_n as f64 / window_seconds, published_n as f64 / window_seconds);
        let used = match self.config().capacity {
            Some(crate::Capacity::Bytes(_)) => bytes,
            _ => pending + failed,
        };
        let capacity = self.capacity_status(used, bytes, live, appended_per_second - published_per_second);
        Ok(Status {
            pending,
            failed,
            published,
            discarded,
            oldest_unpublished_age_seconds: oldest,
            retrying,
            appended_per_second,
            published_per_second,
            window_seconds,
            table_bytes: bytes,
            dead_tuples: dead,
            capacity,
        })
    }

    /// The fill level and forecast for `used` (unpublished rows, or the table's bytes) at a
    /// net growth of `rows_per_second`, when a capacity is configured.
    pub(crate) fn capacity_status(
        &self,
        used: i64,
        table_bytes: i64,
        live_rows: i64,
        rows_per_second: f64,
    ) -> Option<CapacityStatus> {
        let capacity = self.config().capacity?;
        let used = u64::try_from(used).unwrap_or(0);
        #[allow(clippy::cast_precision_loss)]
        let growth_per_second = match capacity {
            crate::Capacity::Rows(_) => rows_per_second,
            crate::Capacity::Bytes(_) => rows_per_second * (table_bytes as f64 / live_rows.max(1) as f64),
        };
        #[allow(clippy::cast_precision_loss)]
        Some(CapacityStatus {
            unit: capacity.unit(),
            limit: capacity.limit(),
            used,
            used_ratio: used as f64 / capacity.limit() as f64,
            refuse_non_critical_at: self.config().refuse_non_critical_at,
            growth_per_second,
            seconds_to_full: seconds_to_full(used, capacity.limit(), growth_per_second),
        })
    }

    /// Failed events, oldest first, with how many later events each holds back.
    pub async fn failed(&self, pool: &PgPool) -> Result<Vec<FailedEvent>> {
        self.failed_unchecked(pool).await.map_err(|e| self.names().not_migrated(e))
    }

    async fn failed_unchecked(&self, pool: &PgPool) -> Result<Vec<FailedEvent>> {
        let t = &self.names().outbox;
        let sql = format!(
            "SELECT f.event_id, f.event_type, f.aggregate_type, f.aggregate_id, f.attempts, f.last_error, \
                    (SELECT count(*) FROM {t} h WHERE h.aggregate_type = f.aggregate_type \
                       AND h.aggregate_id = f.aggregate_id AND h.status = 'pending' AND h.id > f.id) \
             FROM {t} f WHERE f.status = 'failed' ORDER BY f.id"
        );
        type Row = (Uuid, String, String, String, i32, Option<String>, i64);
        let rows: Vec<Row> = sqlx::query_as(AssertSqlSafe(sql)).fetch_all(pool).await?;
        Ok(rows
            .into_iter()
            .map(|(event_id, event_type, aggregate_type, aggregate_id, attempts, last_error, held_back)| {
                FailedEvent {
                    event_id,
                    event_type,
                    aggregate_type,
                    aggregate_id,
                    attempts,
                    last_error,
                    held_back,
                }
            })
            .collect())
    }

    /// Pending events waiting for a retry after a failed attempt (broker down, a topic
    /// missing, a timeout), oldest first, at most `limit` of them, with their attempts,
    /// next attempt and last error; and how many there are in all.
    pub async fn retrying(&self, pool: &PgPool, limit: u32) -> Result<Retrying> {
        self.retrying_unchecked(pool, limit).await.map_err(|e| self.names().not_migrated(e))
    }

    async fn retrying_unchecked(&self, pool: &PgPool, limit: u32) -> Result<Retrying> {
        let t = &self.names().outbox;
        // Exactly the pending half of the `blocked` index's predicate, so both use it.
        let waiting = "status = 'pending' AND next_attempt_at > '-infinity'";
        let total: i64 =
            sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM {t} WHERE {waiting}")))
                .fetch_one(pool)
                .await?;
        let sql = format!(
            "SELECT event_id, event_type, aggregate_type, aggregate_id, topic, attempts, \
                    to_char(next_attempt_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') AS next_attempt_at, \
                    EXTRACT(EPOCH FROM next_attempt_at - now())::float8 AS next_attempt_in_seconds, last_error \
             FROM {t} WHERE {waiting} ORDER BY id LIMIT $1"
        );
        let events = sqlx::query_as(AssertSqlSafe(sql)).bind(i64::from(limit)).fetch_all(pool).await?;
        Ok(Retrying { total, events })
    }

    /// Puts failed events back up for publication (due at once). Returns how many.
    pub async fn retry(&self, pool: &PgPool, target: &RetryTarget) -> Result<u64> {
        self.retry_unchecked(pool, target).await.map_err(|e| self.names().not_migrated(e))
    }

    async fn retry_unchecked(&self, pool: &PgPool, target: &RetryTarget) -> Result<u64> {
        let t = &self.names().outbox;
        let set = "status = 'pending', next_attempt_at = '-infinity'";
        let query = match target {
            RetryTarget::Event(id) => sqlx::query(AssertSqlSafe(format!(
                "UPDATE {t} SET {set} WHERE status = 'failed' AND event_id = $1"
            )))
            .bind(*id),
            RetryTarget::Aggregate(aggregate_id) => sqlx::query(AssertSqlSafe(format!(
                "UPDATE {t} SET {set} WHERE status = 'failed' AND aggregate_id = $1"
            )))
            .bind(aggregate_id.clone()),
            RetryTarget::AllFailed => {
                sqlx::query(AssertSqlSafe(format!("UPDATE {t} SET {set} WHERE status = 'failed'")))
            }
        };
        Ok(query.execute(pool).await?.rows_affected())
    }

    /// Discards a failed or pending event: it will never be published, and the events of
    /// its aggregate behind it flow again. Returns whether an event was discarded.
    pub async fn discard(&self, pool: &PgPool, event_id: Uuid, reason: &str) -> Result<bool> {
        self.discard_one(pool, event_id, reason).await.map_err(|e| self.names().not_migrated(e))
    }

    /// The discard of one failed or pending event, on `executor` (a pool, or the
    /// transaction that records it); whether there was one.
    pub(crate) async fn discard_one<'e>(
        &self,
        executor: impl sqlx::PgExecutor<'e>,
        event_id: Uuid,
        reason: &str,
    ) -> Result<bool> {
        let sql = format!(
            "UPDATE {} SET status = 'discarded', last_error = 'discarded: ' || $2 \
             WHERE event_id = $1 AND status IN ('failed', 'pending')",
            self.names().outbox
        );
        let done = sqlx::query(AssertSqlSafe(sql)).bind(event_id).bind(reason).execute(executor).await?;
        Ok(done.rows_affected() == 1)
    }
}
