//! Deleting published rows after a retention period, in small batches (invariant 10): each
//! batch is its own short transaction, so cleanup never holds locks or bloats for long.

use std::time::Duration;

use sqlx::{AssertSqlSafe, PgPool};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::error::Result;
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

    /// Rows deleted per transaction. Default: 1,000.
    #[must_use]
    pub fn batch_size(mut self, rows: u32) -> Self {
        self.batch_size = rows.max(1);
        self
    }

    /// Time between cleanup rounds. Default: 60 s.
    #[must_use]
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    pub(crate) async fn run(self, pool: PgPool, outbox: Outbox, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                () = tokio::time::sleep(self.interval) => {}
                () = shutdown.cancelled() => return,
            }
            match outbox.delete_published(&pool, self.retention, self.batch_size, &shutdown).await {
                Ok(0) => {}
                Ok(deleted) => debug!(deleted, stage = "cleanup", "deleted published events past retention"),
                Err(error) => warn!(stage = "cleanup", %error, "cleanup failed; trying again next round"),
            }
        }
    }
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
    /// first, in one short statement. Returns how many were deleted.
    pub async fn delete_published_batch(
        &self,
        pool: &PgPool,
        older_than: Duration,
        batch_size: u32,
    ) -> Result<u64> {
        let sql = format!(
            "DELETE FROM {t} WHERE id IN ( \
               SELECT id FROM {t} WHERE status = 'published' \
                 AND published_at < now() - $1 * interval '1 millisecond' \
               ORDER BY id LIMIT $2)",
            t = self.names().outbox
        );
        let older_ms = i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX);
        Ok(sqlx::query(AssertSqlSafe(sql))
            .bind(older_ms)
            .bind(i64::from(batch_size))
            .execute(pool)
            .await?
            .rows_affected())
    }
}
