//! Purge: delete what is done with (published or discarded events past an age), in
//! batches, counted for `reconcile`.

use std::time::Duration;

use sqlx::PgPool;

use super::Ops;
use crate::cleanup::{check_batch_size, Deletable};
use crate::error::Result;

impl Ops {
    /// Deletes published events published more than `older_than` ago and discarded events
    /// created more than `older_than` ago, never pending or failed ones; `batch_size` per
    /// transaction. `progress` is called after each batch with the running total.
    /// Returns how many were deleted. What is deleted is counted for `reconcile`.
    pub async fn purge(
        &self,
        pool: &PgPool,
        older_than: Duration,
        batch_size: u32,
        progress: impl FnMut(u64),
    ) -> Result<u64> {
        self.purge_unchecked(pool, older_than, batch_size, progress)
            .await
            .map_err(|e| self.names().not_migrated(e))
    }

    async fn purge_unchecked(
        &self,
        pool: &PgPool,
        older_than: Duration,
        batch_size: u32,
        mut progress: impl FnMut(u64),
    ) -> Result<u64> {
        check_batch_size("batch_size", batch_size)?;
        let mut total = 0;
        loop {
            let deleted = self
                .outbox
                .delete_batch(pool, Deletable::PublishedOrDiscarded, older_than, batch_size)
                .await?;
            total += deleted;
            progress(total);
            if deleted < u64::from(batch_size) {
                return Ok(total);
            }
        }
    }
}
