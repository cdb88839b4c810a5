//! Deleting a consumer's expired dedup rows, in batches ([invariant 10](crate::guarantees#i10)).

use std::time::Duration;

use sqlx::{AssertSqlSafe, PgPool};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::partitions::{self, Layout, PartitionReport};
use super::Inbox;
use crate::error::Result;

impl Inbox {
    /// Deletes inbox rows applied more than `older_than` ago, `batch_size` per statement.
    /// A batch size of 0 or over 100,000 is an [`Error::Config`](crate::Error::Config).
    pub async fn delete_applied(&self, older_than: Duration, batch_size: u32) -> Result<u64> {
        crate::cleanup::check_batch_size("batch_size", batch_size)?;
        // Partitioned: time partitions are dropped whole (`maintain_partitions`); only the
        // legacy, foreign and default ones are cleaned row by row.
        let tables = match partitions::layout(&self.pool, &self.names).await? {
            Layout::Plain => vec![self.names.inbox.clone()],
            Layout::Partitioned => partitions::deleted_from(&self.pool, &self.names).await?,
        };
        let mut total = 0;
        for table in tables {
            total +=
                delete_applied(&self.pool, &table, &self.config.consumer, older_than, batch_size).await?;
        }
        Ok(total)
    }

    /// One maintenance round of a partitioned dedup table: registers this consumer's dedup
    /// retention, creates the partitions ahead, moves rows of a new partition's span out of
    /// the default one, and drops every partition whose rows are past the retention of
    /// each consumer that has rows in it. `None` when the table is not partitioned. A
    /// running consumer does this every [`InboxConfig::cleanup_interval`](super::InboxConfig::cleanup_interval).
    pub async fn maintain_partitions(&self) -> Result<Option<PartitionReport>> {
        partitions::maintain::round(
            &self.pool,
            &self.names,
            &self.config.consumer,
            self.config.dedup_retention,
        )
        .await
        .map_err(|e| self.names.not_migrated(e))
    }
}

/// Deletes `consumer`'s inbox rows applied more than `older_than` ago, `batch_size` per
/// statement, from `inbox` (the table, or one partition: a row's `ctid` is its place in one
/// relation only). Only its own: consumers sharing the table keep theirs as long as they
/// choose ([invariant 10](crate::guarantees#i10)).
async fn delete_applied(
    pool: &PgPool,
    inbox: &str,
    consumer: &str,
    older_than: Duration,
    batch_size: u32,
) -> Result<u64> {
    let sql = format!(
        "DELETE FROM {inbox} WHERE ctid IN (SELECT ctid FROM {inbox} \
         WHERE consumer = $3 AND applied_at < now() - $1 * interval '1 millisecond' LIMIT $2)"
    );
    let mut total = 0;
    loop {
        let deleted = sqlx::query(AssertSqlSafe(sql.as_str()))
            .bind(i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX))
            .bind(i64::from(batch_size))
            .bind(consumer)
            .execute(pool)
            .await?
            .rows_affected();
        total += deleted;
        if deleted < u64::from(batch_size) {
            return Ok(total);
        }
    }
}

/// Maintains a partitioned dedup table at once and every `cleanup_interval`, then deletes
/// this consumer's expired dedup rows (with a retention).
pub(super) async fn cleanup_loop(inbox: Inbox, shutdown: CancellationToken) {
    let mut first = true;
    loop {
        if !first {
            tokio::select! {
                () = tokio::time::sleep(inbox.config.cleanup_interval) => {}
                () = shutdown.cancelled() => return,
            }
        }
        match inbox.maintain_partitions().await {
            Ok(Some(report)) if report.skipped => {
                debug!(consumer = %inbox.config.consumer, stage = "partitions", "another consumer maintains the partitions");
            }
            Ok(_) => {}
            Err(error) => {
                failed(&inbox, "partitions");
                warn!(consumer = %inbox.config.consumer, stage = "partitions", %error,
                      "maintaining the dedup table's partitions failed; trying again next round");
            }
        }
        if let (Some(retention), false) = (inbox.config.dedup_retention, first) {
            if let Err(error) = inbox.delete_applied(retention, inbox.config.cleanup_batch).await {
                failed(&inbox, "cleanup");
                warn!(consumer = %inbox.config.consumer, stage = "cleanup", %error,
                      "inbox cleanup failed; trying again next round");
            }
        }
        first = false;
    }
}

/// Counts a failed maintenance `stage` of this consumer.
fn failed(inbox: &Inbox, stage: &'static str) {
    metrics::counter!(crate::metrics::INBOX_MAINTENANCE_ERRORS,
                      "consumer" => inbox.config.consumer.clone(), "stage" => stage)
    .increment(1);
}
