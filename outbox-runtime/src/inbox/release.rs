//! Operators' retries and discards of parked messages: the target and the messages held
//! behind it, applied again in order.

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use std::collections::BTreeMap;

use sqlx::AssertSqlSafe;

use super::message::Incoming;
use super::store::Outcome;
use super::{admin, Bytes, Inbox};
use crate::error::{Error, Result};

/// What an operator's retry or discard did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Released {
    /// Messages of the key applied (or absorbed as duplicates or stale), in order.
    pub applied: usize,
    /// Set when a message of the key was parked (again): the release stops there.
    pub parked_again: Option<String>,
}

impl Inbox {
    /// Carries out the retries operators requested, every `operator_poll_interval`.
    pub(super) async fn operator_requests(self, shutdown: CancellationToken) {
        let admin = self.admin();
        loop {
            tokio::select! {
                () = tokio::time::sleep(self.config.operator_poll_interval) => {}
                () = shutdown.cancelled() => return,
            }
            let requested = match admin.requested().await {
                Ok(ids) => ids,
                Err(error) => {
                    warn!(consumer = %self.config.consumer, stage = "operator", %error, "cannot read retry requests");
                    continue;
                }
            };
            for id in requested {
                match self.release(id, None).await {
                    Ok(released) => {
                        info!(consumer = %self.config.consumer, stage = "operator", parked_id = id,
                                          applied = released.applied, parked_again = ?released.parked_again,
                                          "requested retry carried out")
                    }
                    Err(error) => warn!(consumer = %self.config.consumer, stage = "operator", parked_id = id,
                                        %error, "requested retry failed"),
                }
                if let Err(error) = admin.done(id).await {
                    warn!(consumer = %self.config.consumer, stage = "operator", parked_id = id, %error,
                          "cannot clear the retry request");
                }
            }
        }
    }

    /// Applies parked message `id` again, then the messages held behind it, in order,
    /// stopping at the first that parks again.
    pub async fn retry_parked(&self, id: i64) -> Result<Released> {
        self.release(id, None).await
    }

    /// Marks parked message `id` discarded (it will never apply), then applies the
    /// messages held behind it, in order.
    pub async fn discard_parked(&self, id: i64, reason: &str) -> Result<Released> {
        self.release(id, Some(reason)).await
    }

    async fn release(&self, id: i64, discard: Option<&str>) -> Result<Released> {
        let parked = &self.names.parked;
        // The target must be open and the first open message of its key.
        let target: Option<(String, Option<Bytes>, Option<Bytes>, bool)> =
            sqlx::query_as(AssertSqlSafe(format!(
                "SELECT topic, record_key, hold_key, NOT EXISTS (SELECT 1 FROM {parked} q \
                     WHERE q.consumer = p.consumer AND q.hold_key = p.hold_key \
                     AND q.status IN ('parked', 'held') AND q.id < p.id) \
                 FROM {parked} p WHERE id = $1 AND consumer = $2 AND status IN ('parked', 'held')"
            )))
            .bind(id)
            .bind(&self.config.consumer)
            .fetch_optional(&self.pool)
            .await?;
        let (topic, key, hold_key) = match target {
            None => {
                return Err(Error::NotFound(format!(
                    "no parked message {id} for consumer {}",
                    self.config.consumer
                )))
            }
            Some((_, _, hold_key, false)) => {
                let mut conn = self.pool.acquire().await?;
                let conflict = admin::held_behind(
                    &mut conn,
                    &self.names,
                    &self.config.consumer,
                    hold_key.as_deref(),
                    id,
                )
                .await?;
                // Released between the two reads: the caller may simply try again.
                return Err(conflict.unwrap_or_else(|| {
                    Error::Conflict(format!(
                        "message {id} was held behind an earlier one of its key a moment ago: try again"
                    ))
                }));
            }
            Some((topic, key, hold_key, true)) => (topic, key, hold_key),
        };
        type Row = (
            i64,
            i32,
            i64,
            Option<Vec<u8>>,
            sqlx::types::Json<BTreeMap<String, String>>,
            Vec<u8>,
            bool,
            Option<serde_json::Value>,
        );
        // The next open message of the key, read under the key's lock each time (and the row
        // locked: a message without a key has no key lock, and an operator's discard must
        // wait for this transaction), so that messages arriving during the release are
        // released too, in order.
        let next_open = format!(
            "SELECT id, kafka_partition, kafka_offset, record_key, headers, payload, null_value, raw_headers \
             FROM {parked} WHERE consumer = $1 AND status IN ('parked', 'held') \
             AND (id = $2 OR (hold_key = $3 AND id > $2)) ORDER BY id LIMIT 1 FOR UPDATE"
        );
        let mut released = Released::default();
        loop {
            let mut tx = self.pool.begin().await?;
            self.store.lock(&mut tx, &topic, key.as_deref()).await?;
            let row: Option<Row> = sqlx::query_as(AssertSqlSafe(next_open.as_str()))
                .bind(&self.config.consumer)
                .bind(id)
                .bind(hold_key.as_deref())
                .fetch_optional(&mut *tx)
                .await?;
            let Some((row_id, partition, offset, row_key, headers, payload, null_value, raw_headers)) = row
            else {
                tx.commit().await?;
                return Ok(released);
            };
            if row_id == id {
                if let Some(reason) = discard {
                    admin::discard_row(&mut tx, &self.names, id, reason).await?;
                    tx.commit().await?;
                    continue;
                }
            }
            let incoming = Incoming::from_parked(
                (&topic, partition, offset),
                row_key,
                payload,
                null_value,
                headers.0,
                raw_headers,
            )
            .for_consumer(&self.store.consumer_name);
            let outcome = self
                .store
                .apply(&self.pool, tx, &self.handlers, &incoming, Some((row_id, "retried")))
                .await?;
            // Counted as the consumer counts what it reads: an applied release is applied.
            self.stats.record(&self.config.consumer, &outcome);
            match outcome {
                Outcome::Parked(reason) => {
                    released.parked_again = Some(reason);
                    return Ok(released);
                }
                Outcome::RetryLater(reason) => {
                    released.parked_again = Some(format!("transient failure, try again: {reason}"));
                    return Ok(released);
                }
                _ => released.applied += 1,
            }
        }
    }
}
