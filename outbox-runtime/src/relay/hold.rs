//! [`ClaimMode::HoldLocks`](super::ClaimMode::HoldLocks): the first of the design's relay
//! models. One transaction per batch locks the free work partitions and the due rows, sends
//! them, marks them and commits; the locks are the only guard, so there are no leases to
//! renew and a relay that dies (its connection closed) releases everything at once.
//!
//! Per-aggregate order: an aggregate's rows are in one partition, and one transaction at a
//! time holds a partition. A relay whose transaction the server ends under it (its
//! connection lost, `idle_in_transaction_session_timeout`) may still have records in flight
//! when the next transaction sends the same rows again: every sender sends an aggregate's
//! rows in order from its first unmarked one, so the first appearance of each event in the
//! topic still follows the aggregate's order, and the copies are duplicates the inbox
//! absorbs.

use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{info_span, warn, Instrument};

use super::batch::{account, BatchOutcome};
use super::Relay;
use crate::backoff;
use crate::error::Result;

/// How much longer than the message timeout the server lets a batch's transaction sit idle
/// before it ends the session (and so releases its locks): the send itself is bounded by
/// the message timeout, and the topic check before it by half of it.
const IDLE_SLACK: Duration = Duration::from_secs(10);

impl Relay {
    /// The loop of [`ClaimMode::HoldLocks`](super::ClaimMode::HoldLocks), until `shutdown`.
    pub(super) async fn holding_locks(&mut self, shutdown: &CancellationToken, wake: &Notify) {
        let mut failures: u32 = 0;
        // Every partition until the first heartbeat says how many relays share them.
        let mut share = usize::MAX;
        let mut next_share = Instant::now();
        let share_every = self.config.lease_ttl / 3;
        while !shutdown.is_cancelled() {
            if Instant::now() >= next_share {
                next_share = Instant::now() + share_every;
                self.announce(&mut share).await;
            }
            let delay = match self.locked_batch(share).await {
                Ok(None) => {
                    failures = 0;
                    let until_share = next_share.saturating_duration_since(Instant::now());
                    tokio::select! {
                        () = wake.notified() => {}
                        () = tokio::time::sleep(self.config.poll_interval.min(until_share)) => {}
                        () = shutdown.cancelled() => {}
                    }
                    continue;
                }
                Ok(Some(outcome)) if outcome.rows > 0 && outcome.acked == 0 && outcome.transient > 0 => {
                    // The whole batch failed transiently (broker down?): back off as a whole.
                    failures += 1;
                    backoff::delay(self.config.backoff_base, self.config.backoff_max, failures)
                }
                Ok(Some(_)) => {
                    failures = 0;
                    continue;
                }
                Err(error) => {
                    failures += 1;
                    let delay = backoff::delay(self.config.backoff_base, self.config.backoff_max, failures);
                    warn!(relay_id = %self.id(), stage = "claim", %error, failures, retry_in = ?delay,
                          "a batch holding its locks failed; its rows stay pending and are published again");
                    delay
                }
            };
            // The heartbeat goes on through a long backoff: a relay that other relays took
            // for dead would have them take its share of the partitions, then give it back.
            let resume = Instant::now() + delay;
            while !shutdown.is_cancelled() && Instant::now() < resume {
                self.pause(resume.min(next_share).saturating_duration_since(Instant::now()), shutdown).await;
                if Instant::now() >= next_share {
                    next_share = Instant::now() + share_every;
                    self.announce(&mut share).await;
                }
            }
        }
    }

    /// Renews this relay's heartbeat and reads its fair share of the partitions into
    /// `share`, which stays as it was when the database cannot be reached.
    async fn announce(&mut self, share: &mut usize) {
        match self.leases.share(&self.pool).await {
            Ok(now) => *share = now,
            Err(error) => {
                warn!(relay_id = %self.id(), stage = "lease", %error, "cannot announce this relay; keeping its share")
            }
        }
    }

    /// One batch in one transaction, on at most `share` partitions. `None` when there was
    /// nothing to send (no free partition or no due row).
    async fn locked_batch(&mut self, share: usize) -> Result<Option<BatchOutcome>> {
        let mut tx = self.pool.begin().await?;
        let timeout = |d: Duration| format!("{}ms", d.as_millis());
        // A relay that stops answering (frozen, partitioned away) must not hold its locks
        // for ever: the server ends its session past the longest a batch can take.
        sqlx::query(
            "SELECT set_config('idle_in_transaction_session_timeout', $1, true), \
                    set_config('lock_timeout', $2, true)",
        )
        .bind(timeout(self.config.message_timeout * 3 / 2 + IDLE_SLACK))
        .bind(timeout(self.config.message_timeout))
        .execute(&mut *tx)
        .await?;
        let (partitions, rows) =
            self.sql.claim_locked(&mut tx, share, i64::from(self.config.batch_size)).await?;
        if rows.is_empty() {
            tx.commit().await?;
            return Ok(None);
        }
        let span = info_span!("relay_batch", relay_id = %self.id(), rows = rows.len(), mode = "hold_locks");
        // In flight from the claim until the transaction that marks them ends.
        let _flight = super::flight::Flight::new(&self.stats, rows.iter().map(|r| r.topic.as_str()));
        async {
            let started = Instant::now();
            let (outcome, marks) = self.send(rows, None).await;
            let marked = self.sql.mark_locked(&mut tx, &marks, &partitions).await;
            let committed = match marked {
                Ok(marked) => tx.commit().await.map(|()| marked).map_err(Into::into),
                Err(error) => Err(error),
            };
            match committed {
                Ok(marked) => account(&self.stats, self.id(), &marks, marked),
                Err(error) => {
                    // Sent but not recorded: published again by the next transaction to
                    // hold these partitions, a duplicate, never a loss.
                    warn!(relay_id = %self.id(), stage = "mark", %error, published = marks.published.len(),
                          "marking the batch failed; its rows will be published again");
                    self.renew_producer_if_fatal();
                    return Err(error);
                }
            }
            self.renew_producer_if_fatal();
            // In this mode a batch's time is also how long its locks and connection were held.
            metrics::histogram!(crate::metrics::BATCH_SECONDS).record(started.elapsed().as_secs_f64());
            Ok(Some(outcome))
        }
        .instrument(span)
        .await
    }
}
