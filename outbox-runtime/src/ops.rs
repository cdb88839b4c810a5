//! Operating an outbox: its status, failed events, retry and discard. The `outbox` command
//! line (feature `cli`) is a thin layer over these.

use serde::Serialize;
use sqlx::{AssertSqlSafe, PgPool};
use uuid::Uuid;

use crate::error::Result;
use crate::outbox::Outbox;

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
    /// Pending events that already failed at least once (retrying).
    pub retrying: i64,
}

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

impl Outbox {
    /// Counts and the age of the oldest unpublished event.
    pub async fn status(&self, pool: &PgPool) -> Result<Status> {
        let sql = format!(
            "SELECT count(*) FILTER (WHERE status = 'pending'), count(*) FILTER (WHERE status = 'failed'), \
                    count(*) FILTER (WHERE status = 'published'), count(*) FILTER (WHERE status = 'discarded'), \
                    EXTRACT(EPOCH FROM now() - min(created_at) FILTER (WHERE status IN ('pending', 'failed')))::float8, \
                    count(*) FILTER (WHERE status = 'pending' AND attempts > 0) \
             FROM {}",
            self.names().outbox
        );
        let (pending, failed, published, discarded, oldest, retrying): (
            i64,
            i64,
            i64,
            i64,
            Option<f64>,
            i64,
        ) = sqlx::query_as(AssertSqlSafe(sql)).fetch_one(pool).await?;
        Ok(Status { pending, failed, published, discarded, oldest_unpublished_age_seconds: oldest, retrying })
    }

    /// Failed events, oldest first, with how many later events each holds back.
    pub async fn failed(&self, pool: &PgPool) -> Result<Vec<FailedEvent>> {
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

    /// Puts failed events back up for publication (due at once). Returns how many.
    pub async fn retry(&self, pool: &PgPool, target: &RetryTarget) -> Result<u64> {
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
        let sql = format!(
            "UPDATE {} SET status = 'discarded', last_error = 'discarded: ' || $2 \
             WHERE event_id = $1 AND status IN ('failed', 'pending')",
            self.names().outbox
        );
        let done = sqlx::query(AssertSqlSafe(sql)).bind(event_id).bind(reason).execute(pool).await?;
        Ok(done.rows_affected() == 1)
    }
}
