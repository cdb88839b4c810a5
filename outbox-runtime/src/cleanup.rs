//! Deleting published rows after a retention period, in small batches ([invariant 10](crate::guarantees#i10)): each
//! batch is its own short transaction, so cleanup never holds locks or bloats for long.

use std::time::Duration;

use sqlx::{AssertSqlSafe, PgPool};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::error::{Error, Result};
use crate::outbox::Outbox;

/// When and how the relay deletes published rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cleanup {
    retention: Duration,
    batch_size: u32,
    interval: Duration,
}

impl Default for Cleanup {
    /// Keep published rows 7 days (for replays and diagnosis), delete 1,000 per batch,
    /// look every minute.
    fn default() -> Self {
        Cleanup {
            retention: Duration::from_secs(7 * 24 * 3600),
            batch_size: 1000,
            interval: Duration::from_secs(60),
        }
    }
}

impl Cleanup {
    /// How long published rows are kept. Default: 7 days.
    #[must_use]
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// Rows deleted per transaction, 1 to 100,000. Default: 1,000.
    #[must_use]
    pub fn batch_size(mut self, rows: u32) -> Self {
        self.batch_size = rows;
        self
    }

    /// Time between cleanup rounds, at least 1 s. Default: 60 s.
    #[must_use]
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// See [`Cleanup::retention`].
    pub fn get_retention(&self) -> Duration {
        self.retention
    }
    /// See [`Cleanup::batch_size`].
    pub fn get_batch_size(&self) -> u32 {
        self.batch_size
    }
    /// See [`Cleanup::interval`].
    pub fn get_interval(&self) -> Duration {
        self.interval
    }

    /// Refuses a batch size of 0 (nothing would ever be deleted) or over 100,000 (one
    /// transaction would hold that many row locks) and an interval under 1 s (a busy
    /// loop); checked when the relay that runs it is built.
    pub(crate) fn validate(&self) -> Result<()> {
        check_batch_size("cleanup batch_size", self.batch_size)?;
        if self.interval < Duration::from_secs(1) {
            return Err(Error::Config(format!(
                "cleanup interval ({:?}) must be at least 1 s",
                self.interval
            )));
        }
        Ok(())
    }

    pub(crate) async fn run(self, pool: PgPool, outbox: Outbox, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                () = tokio::time::sleep(self.interval) => {}
                () = shutdown.cancelled() => return,
            }
            match self.delete(&pool, &outbox, &shutdown).await {
                Ok(0) => {}
                Ok(deleted) => debug!(deleted, stage = "cleanup", "deleted published events past retention"),
                Err(error) => {
                    metrics::counter!(crate::metrics::OUTBOX_CLEANUP_ERRORS).increment(1);
                    warn!(stage = "cleanup", %error, "cleanup failed; trying again next round");
                }
            }
        }
    }
}

impl Cleanup {
    /// One round: the published rows past retention deleted, from the whole table, or for a
    /// partitioned one from the partitions whose rows do not leave whole
    /// ([`deleted_by_cleanup`](crate::partition::maintain::deleted_by_cleanup)), through
    /// the partitioned table: a role granted the outbox table, not each partition, cleans.
    async fn delete(&self, pool: &PgPool, outbox: &Outbox, stop: &CancellationToken) -> Result<u64> {
        let names = outbox.names();
        if !crate::partition::is_partitioned(pool, names).await? {
            return outbox.delete_published(pool, self.retention, self.batch_size, stop).await;
        }
        let scope = crate::partition::maintain::deleted_by_cleanup(
            &mut *pool.acquire().await?,
            names,
            self.retention,
        )
        .await?;
        let sql = delete_batch_sql(&names.outbox, &names.cleaned, Deletable::Published, &scope);
        let mut total = 0;
        while !stop.is_cancelled() {
            let deleted = outbox.delete_with(pool, sql.clone(), self.retention, self.batch_size).await?;
            total += deleted;
            if deleted < u64::from(self.batch_size) {
                break;
            }
        }
        Ok(total)
    }
}

/// Refuses a deletion batch of 0 rows (a loop deleting 0 per round never ends) or over
/// 100,000 (one transaction holding that many row locks), naming `what`.
pub(crate) fn check_batch_size(what: &str, rows: u32) -> Result<()> {
    if rows == 0 || rows > 100_000 {
        return Err(Error::Config(format!("{what} must be 1 to 100000, not {rows}")));
    }
    Ok(())
}

/// Which rows a deletion takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Deletable {
    /// Published more than the given time ago (cleanup).
    Published,
    /// Published, or discarded by an operator, more than the given time ago (purge).
    PublishedOrDiscarded,
}

/// One batch: the oldest matching rows of those `scope` (a predicate, `true` for all)
/// takes, deleted and counted into `<table>_cleaned` per event type, status and hour of
/// creation, in one statement.
pub(crate) fn delete_batch_sql(outbox: &str, cleaned: &str, which: Deletable, scope: &str) -> String {
    let filter = match which {
        Deletable::Published => {
            "status = 'published' AND published_at < now() - $1 * interval '1 millisecond'"
        }
        Deletable::PublishedOrDiscarded => {
            "((status = 'published' AND published_at < now() - $1 * interval '1 millisecond') \
              OR (status = 'discarded' AND created_at < now() - $1 * interval '1 millisecond'))"
        }
    };
    format!(
        "WITH deleted AS ( \
           DELETE FROM {outbox} WHERE {scope} AND id IN \
             (SELECT id FROM {outbox} WHERE {scope} AND {filter} ORDER BY id LIMIT $2) \
           RETURNING event_type, status, date_trunc('hour', created_at AT TIME ZONE 'UTC') AS hour), \
         tally AS ( \
           INSERT INTO {cleaned} AS c (event_type, status, hour, events) \
           SELECT event_type, status, hour, count(*) FROM deleted GROUP BY 1, 2, 3 \
           ON CONFLICT (event_type, status, hour) DO UPDATE SET events = c.events + excluded.events) \
         SELECT count(*) FROM deleted"
    )
}

impl Outbox {
    /// Deletes rows published more than `older_than` ago, `batch_size` per transaction,
    /// until none is left or `stop` is cancelled. Returns how many were deleted.
    pub async fn delete_published(
        &self,
        pool: &PgPool,
        older_than: Duration,
        batch_size: u32,
        stop: &CancellationToken,
    ) -> Result<u64> {
        check_batch_size("batch_size", batch_size)?;
        let mut total = 0;
        while !stop.is_cancelled() {
            let deleted = self.delete_published_batch(pool, older_than, batch_size).await?;
            total += deleted;
            if deleted < u64::from(batch_size) {
                break;
            }
        }
        Ok(total)
    }

    /// Deletes at most `batch_size` rows published more than `older_than` ago, oldest
    /// first, in one short statement. Returns how many were deleted. What is deleted is
    /// counted in `<table>_cleaned`, for `reconcile` and `replay`.
    pub async fn delete_published_batch(
        &self,
        pool: &PgPool,
        older_than: Duration,
        batch_size: u32,
    ) -> Result<u64> {
        self.delete_batch(pool, Deletable::Published, older_than, batch_size).await
    }

    pub(crate) async fn delete_batch(
        &self,
        pool: &PgPool,
        which: Deletable,
        older_than: Duration,
        batch_size: u32,
    ) -> Result<u64> {
        let names = self.names();
        let sql = delete_batch_sql(&names.outbox, &names.cleaned, which, "true");
        self.delete_with(pool, sql, older_than, batch_size).await
    }

    /// Runs one deletion batch statement of [`delete_batch_sql`].
    async fn delete_with(
        &self,
        pool: &PgPool,
        sql: String,
        older_than: Duration,
        batch_size: u32,
    ) -> Result<u64> {
        let older_ms = i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX);
        // Under the partitions' maintenance lock, taken before the DELETE's snapshot: a
        // partition counted into the tally and dropped meanwhile is gone when this batch
        // looks, and one this batch deletes from is counted without those rows; never
        // counted twice.
        let mut tx = pool.begin().await?;
        sqlx::query(crate::partition::MAINTENANCE_LOCK).bind(&self.names().outbox).execute(&mut *tx).await?;
        let deleted: i64 = sqlx::query_scalar(AssertSqlSafe(sql))
            .bind(older_ms)
            .bind(i64::from(batch_size))
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(u64::try_from(deleted).unwrap_or(0))
    }
}
