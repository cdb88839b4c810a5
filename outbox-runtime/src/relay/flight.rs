//! Events in flight: claimed by a relay (or streamed to the change-data-capture relay) and
//! not yet recorded. A claim writes nothing to the rows (the leases of whole work
//! partitions are what keeps two relays apart), so the database cannot count them; each
//! relay counts its own, per topic, and reports them in its row of the relays table, where
//! [`Ops::overview`](crate::ops::Ops::overview) reads them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use sqlx::{PgPool, SqlStr};
use tracing::{debug, info, warn};
use uuid::Uuid;

use super::RelayStats;
use crate::table::{sql, Names};

/// How often a relay reports what it has in flight, at most.
pub(crate) const REPORT_EVERY: Duration = Duration::from_secs(2);

/// How many report intervals a report stands: a relay that stops reporting (it died) no
/// longer counts after that.
const REPORTS_VALID: u32 = 3;

/// The per-topic counts of the events in flight, shared by a relay's batches.
#[derive(Debug, Default)]
pub(crate) struct Counts(Mutex<BTreeMap<String, u64>>);

impl Counts {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, u64>> {
        // A count is never left half-changed: the data of a poisoned lock is whole.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The counts now, topics with none left out.
    pub(crate) fn by_topic(&self) -> BTreeMap<String, u64> {
        self.lock().clone()
    }
}

/// Events counted in flight until this is dropped: a batch's rows until their marks are
/// written, a streamed event until it is published and marked, failed or handed over.
#[derive(Debug)]
pub(crate) struct Flight {
    stats: Arc<RelayStats>,
    topics: BTreeMap<String, u64>,
}

impl Flight {
    /// Counts one event per topic given.
    pub(crate) fn new<'a>(stats: &Arc<RelayStats>, topics: impl IntoIterator<Item = &'a str>) -> Self {
        let mut counts: BTreeMap<String, u64> = BTreeMap::new();
        for topic in topics {
            match counts.get_mut(topic) {
                Some(n) => *n += 1,
                None => {
                    counts.insert(topic.to_owned(), 1);
                }
            }
        }
        let mut all = stats.in_flight.lock();
        for (topic, n) in &counts {
            match all.get_mut(topic) {
                Some(total) => *total += n,
                None => {
                    all.insert(topic.clone(), *n);
                }
            }
        }
        drop(all);
        Flight { stats: stats.clone(), topics: counts }
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        let mut all = self.stats.in_flight.lock();
        for (topic, n) in &self.topics {
            if let Some(total) = all.get_mut(topic) {
                *total = total.saturating_sub(*n);
                if *total == 0 {
                    all.remove(topic);
                }
            }
        }
    }
}

/// Writes a relay's events in flight into its row of the relays table.
#[derive(Debug)]
pub(crate) struct Reporter {
    relay_id: Uuid,
    stats: Arc<RelayStats>,
    statement: SqlStr,
    every: Duration,
    /// What the row holds, as last written (`None`: unknown, or the row was not there).
    written: Option<BTreeMap<String, u64>>,
    failing: bool,
}

impl Reporter {
    pub(crate) fn new(names: &Names, relay_id: Uuid, stats: Arc<RelayStats>, every: Duration) -> Self {
        let statement = sql(format!(
            "UPDATE {relays} SET in_flight = $2::jsonb, \
                    in_flight_until = CASE WHEN $3 THEN NULL ELSE now() + make_interval(secs => $4) END \
             WHERE relay_id = $1",
            relays = names.relays,
        ));
        Reporter { relay_id, stats, statement, every, written: None, failing: false }
    }

    /// How often it reports.
    pub(crate) fn every(&self) -> Duration {
        self.every
    }

    /// Reports the counts now. Nothing in flight, and nothing written before, writes
    /// nothing: an idle relay costs no write. A report with events in flight is written
    /// every time, since it stands only a few intervals.
    pub(crate) async fn report(&mut self, pool: &PgPool) {
        let now = self.stats.in_flight.by_topic();
        let total: u64 = now.values().sum();
        metrics::gauge!(crate::metrics::RELAY_IN_FLIGHT).set(total as f64);
        if now.is_empty() && self.written.as_ref().is_some_and(BTreeMap::is_empty) {
            return;
        }
        let json = serde_json::to_string(&now).unwrap_or_else(|_| "{}".to_owned());
        let valid = self.every.as_secs_f64() * f64::from(REPORTS_VALID);
        let result = sqlx::query(self.statement.clone())
            .bind(self.relay_id)
            .bind(json)
            .bind(now.is_empty())
            .bind(valid)
            .execute(pool)
            .await;
        match result {
            Ok(done) => {
                if std::mem::take(&mut self.failing) {
                    info!(relay_id = %self.relay_id, stage = "report", "reporting events in flight again");
                }
                // No row yet (before the relay's first heartbeat): written next time.
                self.written = (done.rows_affected() == 1).then_some(now);
            }
            Err(error) => {
                metrics::counter!(crate::metrics::RELAY_REPORT_ERRORS).increment(1);
                if std::mem::replace(&mut self.failing, true) {
                    debug!(relay_id = %self.relay_id, stage = "report", %error, "cannot report events in flight");
                } else {
                    warn!(relay_id = %self.relay_id, stage = "report", %error,
                          "cannot report events in flight; the overview shows none for this relay until it can");
                }
                self.written = None;
            }
        }
    }
}
