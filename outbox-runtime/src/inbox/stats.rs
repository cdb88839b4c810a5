//! [`InboxStats`]: one consumer's counters, and the metrics each outcome counts in.

use std::sync::atomic::{AtomicU64, Ordering};

use super::store::Outcome;

/// Counters of one inbox consumer, readable while it runs.
#[derive(Debug, Default)]
pub struct InboxStats {
    applied: AtomicU64,
    duplicates: AtomicU64,
    stale: AtomicU64,
    parked: AtomicU64,
    held: AtomicU64,
    ignored: AtomicU64,
    gaps: AtomicU64,
    retries: AtomicU64,
}

impl InboxStats {
    /// Effects applied, by the consumer or by an operator's release (`retry_parked`, a
    /// requested retry): every outcome of a release is counted as the consumer counts it.
    pub fn applied(&self) -> u64 {
        self.applied.load(Ordering::Relaxed)
    }
    /// Deliveries of an event already applied, absorbed.
    pub fn duplicates(&self) -> u64 {
        self.duplicates.load(Ordering::Relaxed)
    }
    /// Events older than the aggregate's last applied version, absorbed.
    pub fn stale(&self) -> u64 {
        self.stale.load(Ordering::Relaxed)
    }
    /// Messages parked with a reason.
    pub fn parked(&self) -> u64 {
        self.parked.load(Ordering::Relaxed)
    }
    /// Messages held behind a parked one of their key.
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }
    /// Events of ignored types skipped on purpose.
    pub fn ignored(&self) -> u64 {
        self.ignored.load(Ordering::Relaxed)
    }
    /// Aggregate versions skipped (seen as gaps).
    pub fn gaps(&self) -> u64 {
        self.gaps.load(Ordering::Relaxed)
    }
    /// Transient failures retried.
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    pub(super) fn record(&self, consumer: &str, outcome: &Outcome) {
        let name = match outcome {
            Outcome::Applied { .. } => "applied",
            Outcome::Duplicate => "duplicate",
            Outcome::Stale => "stale",
            Outcome::Parked(_) => "parked",
            Outcome::Held => "held",
            Outcome::Ignored => "ignored",
            Outcome::RetryLater(_) => "retry",
        };
        metrics::counter!(crate::metrics::INBOX_MESSAGES, "consumer" => consumer.to_owned(), "outcome" => name).increment(1);
        if let Outcome::Applied { gap } = outcome {
            if *gap > 0 {
                metrics::counter!(crate::metrics::INBOX_GAPS, "consumer" => consumer.to_owned())
                    .increment(gap.unsigned_abs());
            }
        }
        let counter = match outcome {
            Outcome::Applied { gap } => {
                self.gaps.fetch_add(gap.unsigned_abs(), Ordering::Relaxed);
                &self.applied
            }
            Outcome::Duplicate => &self.duplicates,
            Outcome::Stale => &self.stale,
            Outcome::Parked(_) => &self.parked,
            Outcome::Held => &self.held,
            Outcome::Ignored => &self.ignored,
            Outcome::RetryLater(_) => &self.retries,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}
