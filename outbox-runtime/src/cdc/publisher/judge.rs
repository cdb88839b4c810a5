//! Judging one chain's delivery reports, and the bounded retries of the publisher's
//! database writes.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use super::{Chain, Ended, Publisher, Waiting, TRANSIENT_WARN_EVERY, WRITE_ATTEMPTS};
use crate::backoff;
use crate::cdc::marks::Settled;
use crate::relay::publish::Sent;
use crate::relay::topics::MISSING_CODE;

impl Publisher {
    /// Records one chain's outcome: the acknowledged prefix to mark published; the first
    /// row not acknowledged and the rest of the chain back in memory for a retry, or
    /// failed and handed over behind it.
    pub(super) fn judge(
        &mut self,
        chain: Chain,
        sent: Vec<Sent>,
        published: &mut Vec<super::Acked>,
        settled: &mut Settled,
        done_now: &mut Vec<u64>,
    ) {
        let mut rows = chain.rows.into_iter().zip(chain.meta);
        let mut sent = sent.into_iter();
        let (mut row, meta, outcome) = loop {
            let Some((row, meta)) = rows.next() else { return };
            match sent.next() {
                Some(Sent::Acked(placement)) => {
                    published.push((row.id, placement, row.attempts + 1, meta.seq, meta.flight))
                }
                Some(outcome) => break (row, meta, outcome),
                // Never expected (a chain's outcomes end at its first row not acknowledged):
                // sent again, not lost.
                None => {
                    break (
                        row,
                        meta,
                        Sent::Transient { reason: "not sent".to_owned(), code: "unsent".to_owned() },
                    )
                }
            }
        };
        let attempt = row.attempts + 1;
        let (retry_in, failed) = match outcome {
            // Not reached: the loop above takes every acknowledgement.
            Sent::Acked(_) => (Duration::ZERO, None),
            Sent::Held { reason, retry_in } => {
                metrics::counter!(crate::metrics::PUBLISH_ERRORS, "kind" => "held", "code" => MISSING_CODE)
                    .increment(1);
                debug!(event_id = %row.event_id, aggregate_id = %row.aggregate_id, r#type = %row.event_type,
                       attempt = row.attempts, stage = "publish", %reason, retry_in = ?retry_in, "held back: topic missing");
                (retry_in, None)
            }
            Sent::Transient { reason, .. }
                if self.config.max_attempts.is_some_and(|max| attempt.unsigned_abs() >= max) =>
            {
                warn!(event_id = %row.event_id, aggregate_id = %row.aggregate_id, r#type = %row.event_type,
                      attempt, stage = "publish", %reason, "event failed: attempts exhausted");
                metrics::counter!(crate::metrics::PUBLISH_ERRORS, "kind" => "exhausted", "code" => "max_attempts").increment(1);
                (Duration::ZERO, Some(format!("gave up after {attempt} attempts: {reason}")))
            }
            Sent::Transient { reason, code } => {
                if matches!(code.as_str(), "UnknownTopic" | "UnknownTopicOrPartition" | "UnknownPartition") {
                    self.topics.suspect(&row.topic);
                }
                metrics::counter!(crate::metrics::PUBLISH_ERRORS, "kind" => "transient", "code" => code)
                    .increment(1);
                self.stats.retried.fetch_add(1, Ordering::Relaxed);
                row.attempts = attempt;
                let delay =
                    backoff::delay(self.config.backoff_base, self.config.backoff_max, attempt.unsigned_abs());
                if self.transient_warned.is_none_or(|t| t.elapsed() >= TRANSIENT_WARN_EVERY) {
                    self.transient_warned = Some(Instant::now());
                    warn!(event_id = %row.event_id, aggregate_id = %row.aggregate_id, r#type = %row.event_type,
                          attempt, stage = "publish", topic = %row.topic, %reason, retry_in = ?delay,
                          suppressed = std::mem::take(&mut self.transient_suppressed),
                          "transient publish failure; retrying, the slot's position waits (one warning every 10 s)");
                } else {
                    self.transient_suppressed += 1;
                    debug!(event_id = %row.event_id, aggregate_id = %row.aggregate_id, r#type = %row.event_type,
                           attempt, stage = "publish", %reason, retry_in = ?delay, "transient publish failure");
                }
                (delay, None)
            }
            Sent::Permanent { reason, code } => {
                metrics::counter!(crate::metrics::PUBLISH_ERRORS, "kind" => "permanent", "code" => code)
                    .increment(1);
                warn!(event_id = %row.event_id, aggregate_id = %row.aggregate_id, r#type = %row.event_type,
                      attempt, stage = "publish", %reason, "event failed permanently; its aggregate is held back");
                (Duration::ZERO, Some(reason))
            }
        };
        match failed {
            Some(reason) => {
                settled.failed.push((row.id, attempt, reason));
                done_now.push(meta.seq);
                for (row, meta) in rows {
                    settled.handed.push(row.id);
                    done_now.push(meta.seq);
                }
            }
            None => {
                let mut queue = VecDeque::from([(row, meta)]);
                queue.extend(rows);
                self.waiting
                    .insert(chain.key, Waiting { due: tokio::time::Instant::now() + retry_in, rows: queue });
            }
        }
    }
}

/// Whether the database is gone (the connection lost, the server shutting down or
/// refusing connections; not a pool busy with the relay's other work): retrying in place
/// would keep the stream open, and a walsender waiting for its client's confirmation holds
/// PostgreSQL's shutdown; the session ends and connects again with backoff instead.
fn unavailable(error: &crate::Error) -> bool {
    matches!(error, crate::Error::Database(error) if crate::error::server_gone(error))
}

/// Runs `write` until it succeeds, at most [`WRITE_ATTEMPTS`] times with backoff, each
/// failure logged; then the session ends. A database that is gone ends it at once.
pub(super) async fn retried<T, F, Fut>(what: &str, mut write: F) -> std::result::Result<T, Ended>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = crate::Result<T>>,
{
    let mut attempt = 0;
    loop {
        attempt += 1;
        match write().await {
            Ok(value) => return Ok(value),
            Err(error) if attempt >= WRITE_ATTEMPTS || unavailable(&error) => {
                return Err(Ended::Transient(format!("{what} failed {attempt} times, last: {error}")))
            }
            Err(error) => {
                let delay = backoff::delay(Duration::from_millis(100), Duration::from_secs(5), attempt);
                warn!(stage = "mark", attempt, retry_in = ?delay, %error, "{what} failed; trying again");
                tokio::time::sleep(delay).await;
            }
        }
    }
}
