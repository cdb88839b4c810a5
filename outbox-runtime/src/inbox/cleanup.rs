//! Deleting a consumer's expired dedup rows, in batches ([invariant 10](crate::guarantees#i10)).

use std::time::Duration;

use sqlx::{AssertSqlSafe, PgPool};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::Inbox;
use crate::error::Result;

impl Inbox {
    /// Deletes inbox rows applied more than `older_than` ago, `batch_size` per statement.
    /// A batch size of 0 or over 100,000 is an [`Error::Config`](crate::Error::Config).
    pub async fn delete_applied(&self, older_than: Duration, batch_size: u32) -> Result<u64> {
        crate::cleanup::check_batch_size("batch_size", batch_size)?;
        delete_applied(&self.pool, &self.names.inbox, &self.config.consumer, older_than, batch_size).await
    }
}

/// Deletes `consumer`'s inbox rows applied more than `older_than` ago, `batch_size` per
/// statement. Only its own: consumers sharing the table keep theirs as long as they choose
/// ([invariant 10](crate::guarantees#i10)).
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

/// Deletes this consumer's expired dedup rows every `cleanup_interval`.
pub(super) async fn cleanup_loop(inbox: Inbox, retention: Duration, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(inbox.config.cleanup_interval) => {}
            () = shutdown.cancelled() => return,
        }
        if let Err(error) = inbox.delete_applied(retention, inbox.config.cleanup_batch).await {
            warn!(consumer = %inbox.config.consumer, stage = "cleanup", %error,
                  "inbox cleanup failed; trying again next round");
        }
    }
}
