//! [`Relay::run`]: the loop that maintains leases, claims due rows and hands them to a
//! batch, backing off as a whole when the database or the broker fails.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::cursor::FreshCursor;
use super::flight::{Reporter, REPORT_EVERY};
use super::listen::listen;
use super::{ClaimMode, Relay};
use crate::backoff;
use crate::error::Result;
use crate::outbox::Outbox;
use crate::secrets::redact_urls;

/// How often a relay without cleanup runs a partitioned outbox's maintenance (moving on
/// and creating partitions ahead; no drops without a retention).
const PARTITION_ROUNDS: Duration = Duration::from_secs(60);

/// How long shutdown waits for the background tasks (listener, cleanup, gauges) to stop.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(30);

impl Relay {
    /// Runs until `shutdown` is cancelled, then finishes the batch in flight (bounded by
    /// the message timeout), gives its leases back and returns.
    ///
    /// # Errors
    /// [`Error::NotMigrated`](crate::Error::NotMigrated) at once when the outbox's tables are
    /// missing, [`Error::MigrationsBehind`](crate::Error::MigrationsBehind) when they are
    /// older than this library (run the migrations first: a relay of a newer version would
    /// fail to record what it does). A database that does not answer at
    /// start is waited for like any later outage.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<()> {
        match self.outbox.check_migrated_for_relay(&self.pool, self.config.cleanup.is_some()).await {
            Err(error @ (crate::Error::NotMigrated { .. } | crate::Error::MigrationsBehind { .. })) => {
                return Err(error)
            }
            Err(error) => {
                warn!(relay_id = %self.id(), %error, "cannot check the outbox's migrations; going on")
            }
            Ok(()) => {}
        }
        let tracker = self.tasks.clone();
        // A partitioned outbox: claims and marks bounded to the partitions that can hold
        // their rows.
        match crate::partition::is_partitioned(&self.pool, self.outbox.names()).await {
            Ok(true) => self.sql = Arc::new(self.sql.on_partitions(self.outbox.names())),
            Ok(_) => {}
            Err(error) => warn!(relay_id = %self.id(), %error,
                                "cannot tell whether the outbox is partitioned; claiming as from a plain table"),
        }
        // The partitions' maintenance, with drops when the cleanup has a retention. Every
        // relay runs it, whatever the layout at its start: a round does nothing on a plain
        // table, and a relay started before a conversion maintains the partitions after it.
        let cleanup = self.config.cleanup.as_ref();
        tracker.spawn(crate::partition::maintain::run(
            self.pool.clone(),
            self.outbox.names().clone(),
            cleanup.map(crate::relay::Cleanup::get_retention),
            cleanup.map_or(PARTITION_ROUNDS, crate::relay::Cleanup::get_interval),
            shutdown.clone(),
        ));
        let wake = Arc::new(Notify::new());
        if self.listen {
            tracker.spawn(listen(
                self.pool.clone(),
                self.outbox.names().channel.clone(),
                wake.clone(),
                shutdown.clone(),
            ));
        }
        if let Some(cleanup) = self.config.cleanup.clone() {
            tracker.spawn(cleanup.run(self.pool.clone(), self.outbox.clone(), shutdown.clone()));
        }
        let renew_every = self.config.lease_ttl / 3;
        // The outbox's gauges are read on a task of their own: their queries never delay a
        // claim (they showed in the p99 of created-to-published latency).
        let reporter =
            Reporter::new(self.outbox.names(), self.id(), self.stats.clone(), REPORT_EVERY.min(renew_every));
        tracker.spawn(record_gauges(
            self.pool.clone(),
            self.outbox.clone(),
            renew_every,
            reporter,
            shutdown.clone(),
        ));
        tracker.close();
        info!(relay_id = %self.id(), brokers = %redact_urls(&self.config.brokers), "relay started");

        match self.config.claim_mode {
            ClaimMode::Lease => self.leased(&shutdown, &wake).await,
            ClaimMode::HoldLocks => self.holding_locks(&shutdown, &wake).await,
        }

        self.finish_marking().await;
        if let Err(error) = self.leases.release_all(&self.pool).await {
            warn!(relay_id = %self.id(), stage = "shutdown", %error, "could not release leases; they expire by themselves");
        }
        if tokio::time::timeout(SHUTDOWN_WAIT, tracker.wait()).await.is_err() {
            warn!(relay_id = %self.id(), stage = "shutdown", tasks = tracker.len(), waited = ?SHUTDOWN_WAIT,
                  "background tasks still running at shutdown; returning without them");
        }
        info!(relay_id = %self.id(), published = self.stats.published(), "relay stopped");
        Ok(())
    }

    /// The loop of [`ClaimMode::Lease`]: maintains the leases, claims due rows of the held
    /// partitions and hands them to a batch, until `shutdown`.
    async fn leased(&mut self, shutdown: &CancellationToken, wake: &Notify) {
        let renew_every = self.config.lease_ttl / 3;
        // A batch may start only while its leases have this much time left.
        let margin = self.config.message_timeout + Duration::from_secs(1);
        let mut next_maintain = Instant::now();
        let mut idle_failures: u32 = 0;
        // The walk of fresh rows goes on from where the last claim left it while rows held
        // back fill its window (see `FreshCursor`); from the start when the partitions change.
        let mut cursor = FreshCursor::default();
        let mut cursor_partitions: Vec<i32> = Vec::new();
        while !shutdown.is_cancelled() {
            if Instant::now() >= next_maintain {
                next_maintain = Instant::now() + renew_every;
                // Marks are written under the leases they were fenced with: finish them first.
                self.finish_marking().await;
                metrics::gauge!(crate::metrics::MISSING_TOPICS).set(self.topics.missing() as f64);
                match self.leases.maintain(&self.pool).await {
                    Ok(changes) if changes != Default::default() => info!(
                        relay_id = %self.id(), held = self.leases.held_count(), acquired = ?changes.acquired,
                        released = ?changes.released, lost = ?changes.lost, "work partition leases changed"
                    ),
                    Ok(_) => {}
                    Err(error) => {
                        warn!(relay_id = %self.id(), stage = "lease", %error, "lease maintenance failed");
                        next_maintain = Instant::now() + Duration::from_secs(1);
                    }
                }
            }
            let mark_failures = self.mark_failures.load(Ordering::Relaxed);
            if mark_failures > 0 {
                // The last marks failed: their rows are still pending and would be claimed and
                // sent again at once. Wait first, longer each time.
                self.finish_marking().await;
                self.pause(
                    backoff::delay(self.config.backoff_base, self.config.backoff_max, mark_failures),
                    shutdown,
                )
                .await;
                if shutdown.is_cancelled() {
                    break;
                }
            }
            let partitions = self.leases.partitions(margin);
            if partitions != cursor_partitions {
                cursor = FreshCursor::default();
                cursor_partitions.clone_from(&partitions);
            }
            if cursor.from > 0 {
                // Walking on, a row of the last batch still being marked would count as open
                // before the cursor and hold its aggregate back: the marks first.
                self.finish_marking().await;
            }
            let rows = if partitions.is_empty() {
                Vec::new()
            } else {
                let marking = self.marking.as_ref().map_or(&[][..], |(ids, _)| ids.as_slice());
                let was = cursor;
                let claimed = self
                    .sql
                    .claim_from(
                        &self.pool,
                        &partitions,
                        i64::from(self.config.batch_size),
                        marking,
                        &mut cursor,
                    )
                    .await;
                if claimed.is_ok() && cursor.advancing {
                    metrics::counter!(crate::metrics::CLAIM_WINDOWS_PASSED).increment(1);
                    if was.from == 0 {
                        info!(relay_id = %self.id(), stage = "claim", from = cursor.from,
                              "events held back behind earlier events of their aggregates fill the claim's window: \
                               claims walk on past them, a window at a time, to the end and from the start again");
                    }
                }
                match claimed {
                    Ok(rows) => rows,
                    Err(error) => {
                        warn!(relay_id = %self.id(), stage = "claim", %error, "reading due events failed");
                        idle_failures += 1;
                        self.pause(
                            backoff::delay(self.config.backoff_base, self.config.backoff_max, idle_failures),
                            shutdown,
                        )
                        .await;
                        continue;
                    }
                }
            };
            if rows.is_empty() {
                if self.marking.is_some() {
                    // Nothing new: wait for the last mark instead of polling past it.
                    self.finish_marking().await;
                    continue;
                }
                if cursor.advancing {
                    // A window full of rows held back: the walk goes on at once, up to the
                    // end of the index (then from the start, after the poll interval).
                    continue;
                }
                let until_maintain = next_maintain.saturating_duration_since(Instant::now());
                tokio::select! {
                    () = wake.notified() => {}
                    () = tokio::time::sleep(self.config.poll_interval.min(until_maintain)) => {}
                    () = shutdown.cancelled() => {}
                }
                continue;
            }
            let outcome = self.process(rows, margin).await;
            if outcome.rows > 0 && outcome.acked == 0 && outcome.transient > 0 {
                // The whole batch failed transiently (broker down?): back off as a whole
                // instead of walking the backlog attempt by attempt.
                idle_failures += 1;
                self.pause(
                    backoff::delay(self.config.backoff_base, self.config.backoff_max, idle_failures),
                    shutdown,
                )
                .await;
            } else {
                idle_failures = 0;
            }
        }
    }

    pub(super) async fn pause(&self, delay: Duration, shutdown: &CancellationToken) {
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown.cancelled() => {}
        }
    }
}

/// Sets the outbox's and the pool's gauges every `every`, and reports the relay's events
/// in flight more often, until shutdown.
async fn record_gauges(
    pool: PgPool,
    outbox: Outbox,
    every: Duration,
    mut reporter: Reporter,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(reporter.every());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut next_gauges = Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => return,
        }
        reporter.report(&pool).await;
        if Instant::now() < next_gauges {
            continue;
        }
        next_gauges = Instant::now() + every;
        crate::metrics::record_pool(&pool);
        if let Err(error) = outbox.ops().record_gauges(&pool).await {
            debug!(stage = "metrics", %error, "could not read the outbox status");
        }
    }
}
