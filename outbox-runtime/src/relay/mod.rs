//! The relay: publishes outbox rows to Kafka at least once, in order per aggregate.
//!
//! Each relay leases work partitions (aggregates hash into them), reads due rows of its
//! partitions in a short query, publishes them outside any transaction, then marks them,
//! fenced by its lease tokens. An aggregate's events to one topic are handed to the
//! idempotent, gapless producer together and judged in order: the broker persists a
//! partition's records in sequence, and an error that would skip one fails every later one,
//! so no event is acknowledged before an earlier event of its aggregate (an event to another
//! topic waits for the acknowledgements before it). Transient errors back off exponentially with jitter;
//! permanent ones mark the event `failed`, which holds back that aggregate's later events
//! and nothing else. Many relays may run against one database: they share the partitions
//! and take over those of a relay that died when its leases expire.
//!
//! ```no_run
//! # async fn f(pool: sqlx::PgPool) -> outbox_runtime::Result<()> {
//! use outbox_runtime::relay::{Relay, RelayConfig};
//! use tokio_util::sync::CancellationToken;
//!
//! let outbox = outbox_runtime::Outbox::default_ref().clone();
//! let relay = Relay::new(pool, outbox, RelayConfig::new("127.0.0.1:9092"))?;
//! let shutdown = CancellationToken::new();
//! relay.run(shutdown.clone()).await?; // returns after shutdown.cancel(), once in-flight work is done
//! # Ok(()) }
//! ```

mod backoff;
#[doc(hidden)]
pub mod bench;
mod claim;
mod lease;
mod publish;
mod topics;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use rdkafka::producer::{DeliveryFuture, FutureProducer};
use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, info_span, warn, Instrument};
use uuid::Uuid;

use self::claim::{Fence, Marks, Placement, Row, Statements};
use self::lease::Leases;
use self::publish::Sent;
use self::topics::{Topics, Verdict, MISSING_CODE};
use crate::error::{Error, Result};
use crate::kafka_settings::canonical;
use crate::outbox::Outbox;
use crate::secrets::{redact_urls, redacted};

pub(crate) use self::backoff::delay as backoff_delay;
pub use crate::cleanup::Cleanup;

/// How a relay runs. Every setting has a default except the brokers. Its `Debug` redacts
/// secrets among the producer settings.
#[derive(Clone)]
pub struct RelayConfig {
    brokers: String,
    batch_size: u32,
    poll_interval: Duration,
    lease_ttl: Duration,
    message_timeout: Duration,
    backoff_base: Duration,
    backoff_max: Duration,
    max_attempts: Option<u32>,
    missing_topic_timeout: Duration,
    source: String,
    producer: BTreeMap<String, String>,
    cleanup: Option<Cleanup>,
}

impl std::fmt::Debug for RelayConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayConfig")
            .field("brokers", &redact_urls(&self.brokers))
            .field("batch_size", &self.batch_size)
            .field("poll_interval", &self.poll_interval)
            .field("lease_ttl", &self.lease_ttl)
            .field("message_timeout", &self.message_timeout)
            .field("backoff_base", &self.backoff_base)
            .field("backoff_max", &self.backoff_max)
            .field("max_attempts", &self.max_attempts)
            .field("missing_topic_timeout", &self.missing_topic_timeout)
            .field("source", &self.source)
            .field("producer", &redacted(&self.producer))
            .field("cleanup", &self.cleanup)
            .finish()
    }
}

impl RelayConfig {
    /// A relay publishing to `brokers` (Kafka's `bootstrap.servers`), otherwise defaults.
    pub fn new(brokers: impl Into<String>) -> Self {
        RelayConfig {
            brokers: brokers.into(),
            batch_size: 2000,
            poll_interval: Duration::from_secs(1),
            lease_ttl: Duration::from_secs(30),
            message_timeout: Duration::from_secs(10),
            backoff_base: Duration::from_millis(500),
            backoff_max: Duration::from_secs(300),
            max_attempts: None,
            missing_topic_timeout: Duration::from_secs(300),
            source: "/outbox".to_owned(),
            producer: BTreeMap::new(),
            cleanup: Some(Cleanup::default()),
        }
    }

    /// Most rows read and published per batch. Default: 2,000.
    #[must_use]
    pub fn batch_size(mut self, rows: u32) -> Self {
        self.batch_size = rows;
        self
    }

    /// How often to look for work when no NOTIFY arrives (a fallback: appends wake the
    /// relay at commit). Default: 1 s.
    #[must_use]
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// How long a work partition lease lasts without renewal; a relay that dies leaves its
    /// partitions to the others after this long. Renewed every third of it. Must exceed
    /// twice the message timeout. Default: 30 s.
    #[must_use]
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// How long a batch's records may take to be acknowledged. Past it, the relay purges
    /// what the producer still holds (a transient failure, retried with backoff);
    /// librdkafka's own `message.timeout.ms` is set to twice this, as a backstop that never
    /// fires first. Default: 10 s.
    #[must_use]
    pub fn message_timeout(mut self, timeout: Duration) -> Self {
        self.message_timeout = timeout;
        self
    }

    /// First retry delay after a transient failure; it doubles with each attempt, with
    /// jitter, up to [`RelayConfig::backoff_max`]. Default: 500 ms.
    #[must_use]
    pub fn backoff_base(mut self, delay: Duration) -> Self {
        self.backoff_base = delay;
        self
    }

    /// Largest retry delay. Default: 5 min.
    #[must_use]
    pub fn backoff_max(mut self, delay: Duration) -> Self {
        self.backoff_max = delay;
        self
    }

    /// After this many failed attempts a transiently failing event is marked `failed` too.
    /// Default: none (retry until it succeeds; nothing is given up automatically).
    #[must_use]
    pub fn max_attempts(mut self, attempts: Option<u32>) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// How long an event waits for its topic when the cluster says the topic does not
    /// exist. Until then it is not sent (a send could only time out); it stays pending with
    /// a `last_error` naming the topic and is asked about again within 30 s; being held
    /// back is not an attempt. Once the cluster has said "missing" for this long (from the
    /// first such answer this relay got to one this long after it), the event is marked
    /// `failed` with that reason, holding back only its aggregate's later events; `outbox
    /// retry` puts it back once the topic exists. Default: 5 min.
    #[must_use]
    pub fn missing_topic_timeout(mut self, timeout: Duration) -> Self {
        self.missing_topic_timeout = timeout;
        self
    }

    /// The CloudEvents `source` attribute (`ce_source` header). Default: `/outbox`.
    #[must_use]
    pub fn source(mut self, source: impl Into<String>) -> Self {
        self.source = source.into();
        self
    }

    /// A librdkafka producer setting (e.g. `compression.type`, `security.protocol`).
    /// `acks` and `enable.idempotence` are fixed and cannot be set.
    #[must_use]
    pub fn producer_setting(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.producer.insert(key.into(), value.into());
        self
    }

    /// Deleting published rows after a retention period; `None` turns it off.
    /// Default: [`Cleanup::default`].
    #[must_use]
    pub fn cleanup(mut self, cleanup: Option<Cleanup>) -> Self {
        self.cleanup = cleanup;
        self
    }

    /// Checks every setting against the relay's guarantees (invariant 12): a send must end
    /// within its lease, and nothing may weaken acks=all, idempotence or per-partition
    /// order, whatever name or alias sets it.
    fn validate(&self) -> Result<()> {
        if self.batch_size == 0 || self.batch_size > 100_000 {
            return Err(Error::Config(format!("batch_size must be 1 to 100000, not {}", self.batch_size)));
        }
        if self.message_timeout.is_zero() {
            return Err(Error::Config(
                "message_timeout is 0, which librdkafka takes as no timeout: a send could outlive its lease and \
                 another relay publish the same aggregate meanwhile"
                    .into(),
            ));
        }
        if self.max_attempts == Some(0) {
            return Err(Error::Config(
                "max_attempts is Some(0): give at least 1, or None to retry until published".into(),
            ));
        }
        for (key, value) in &self.producer {
            let refused = match canonical(key) {
                "request.required.acks" | "enable.idempotence" | "enable.gapless.guarantee" => {
                    "the relay's guarantees need acks=all, enable.idempotence=true and enable.gapless.guarantee=true"
                }
                "transactional.id" => "the relay publishes with the idempotent producer, not with transactions",
                "message.timeout.ms" => {
                    "set it with RelayConfig::message_timeout, which is checked against the lease: a send must end \
                     within its lease"
                }
                "max.in.flight" if value.trim() != "1" => {
                    "the relay sends an aggregate's events without waiting for each acknowledgement, so it keeps one \
                     produce request in flight per broker: with more, a retried request could be written after a later \
                     one by a broker that does not check the idempotent producer's sequence numbers (librdkafka's mock \
                     cluster does not)"
                }
                _ => continue,
            };
            // No refused setting holds a secret, but its value may be a URL with one.
            let shown = redact_urls(value);
            return Err(Error::Config(format!("producer_setting {key} = {shown:?} is refused: {refused}")));
        }
        if self.lease_ttl <= self.message_timeout * 2 {
            return Err(Error::Config(format!(
                "lease_ttl ({:?}) must exceed twice the message timeout ({:?}): a batch must end within a lease",
                self.lease_ttl, self.message_timeout
            )));
        }
        if self.missing_topic_timeout.is_zero() {
            return Err(Error::Config(
                "missing_topic_timeout is 0: events would be failed the moment their topic is not found"
                    .into(),
            ));
        }
        if self.poll_interval.is_zero() || self.backoff_base.is_zero() || self.backoff_max < self.backoff_base
        {
            return Err(Error::Config(
                "poll_interval and backoff_base must be positive, backoff_max >= backoff_base".into(),
            ));
        }
        Ok(())
    }
}

/// Counters of one relay, readable while it runs.
#[derive(Debug, Default)]
pub struct RelayStats {
    published: AtomicU64,
    retried: AtomicU64,
    failed: AtomicU64,
    fenced: AtomicU64,
    batches: AtomicU64,
    order_gaps: AtomicU64,
}

impl RelayStats {
    /// Events acknowledged by Kafka and marked published.
    pub fn published(&self) -> u64 {
        self.published.load(Ordering::Relaxed)
    }
    /// Transient failures scheduled for retry.
    pub fn retried(&self) -> u64 {
        self.retried.load(Ordering::Relaxed)
    }
    /// Events marked `failed`.
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
    /// Marks refused because the lease had passed to another relay.
    pub fn fenced(&self) -> u64 {
        self.fenced.load(Ordering::Relaxed)
    }
    /// Batches processed.
    pub fn batches(&self) -> u64 {
        self.batches.load(Ordering::Relaxed)
    }
    /// Events the broker acknowledged after an earlier event of their aggregate failed, or
    /// out of partition order (`outbox_relay_order_gaps_total`). Never expected: any is a
    /// bug or a broker that does not keep the idempotent producer's sequence.
    pub fn order_gaps(&self) -> u64 {
        self.order_gaps.load(Ordering::Relaxed)
    }
}

/// A relay process's worker. See the [module documentation](self).
pub struct Relay {
    pool: PgPool,
    outbox: Outbox,
    config: RelayConfig,
    producer: FutureProducer,
    leases: Leases,
    sql: Arc<Statements>,
    /// The ids of the last batch while its mark is written in the background, and the task.
    marking: Option<(Vec<i64>, tokio::task::JoinHandle<()>)>,
    /// Marks that failed in a row (a read-only database after a failover, say): the relay
    /// backs off before claiming again instead of republishing the same batch in a loop.
    mark_failures: Arc<AtomicU32>,
    /// When the last transient publish failure was logged at warn, and how many were
    /// logged at debug since.
    transient_warned: Option<Instant>,
    transient_suppressed: u64,
    /// Which topics exist, as the cluster's metadata last said.
    topics: Topics,
    stats: Arc<RelayStats>,
}

/// The least time between two warnings about transient publish failures.
const TRANSIENT_WARN_EVERY: Duration = Duration::from_secs(10);

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay").field("id", &self.id()).field("config", &self.config).finish_non_exhaustive()
    }
}

/// What one batch came to.
#[derive(Debug, Default)]
struct BatchOutcome {
    rows: usize,
    acked: usize,
    transient: usize,
}

impl Relay {
    /// Builds a relay on `pool` for `outbox`. It uses up to five of the pool's
    /// connections: one to listen for NOTIFY, two for its work (a batch's claim while the
    /// last batch's mark is written), one for cleanup and one for its gauges.
    pub fn new(pool: PgPool, outbox: Outbox, config: RelayConfig) -> Result<Self> {
        config.validate()?;
        let producer = publish::producer(&config.brokers, config.message_timeout, &config.producer)?;
        let names = outbox.names();
        let leases = Leases::new(names, Uuid::new_v4(), config.lease_ttl);
        let sql = Arc::new(Statements::new(names));
        let topics = Topics::new(config.missing_topic_timeout);
        Ok(Relay {
            pool,
            outbox,
            config,
            producer,
            leases,
            sql,
            marking: None,
            mark_failures: Arc::default(),
            transient_warned: None,
            transient_suppressed: 0,
            topics,
            stats: Arc::default(),
        })
    }

    /// The pool it works on.
    #[cfg(feature = "testing")]
    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The outbox it relays.
    #[cfg(feature = "testing")]
    pub(crate) fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// This relay's counters.
    pub fn stats(&self) -> Arc<RelayStats> {
        self.stats.clone()
    }

    /// This relay's id (its lease owner id).
    pub fn id(&self) -> Uuid {
        self.leases.relay_id()
    }

    /// Runs until `shutdown` is cancelled, then finishes the batch in flight (bounded by
    /// the message timeout), gives its leases back and returns.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<()> {
        let tracker = TaskTracker::new();
        let wake = Arc::new(Notify::new());
        tracker.spawn(listen(
            self.pool.clone(),
            self.outbox.names().channel.clone(),
            wake.clone(),
            shutdown.clone(),
        ));
        if let Some(cleanup) = self.config.cleanup.clone() {
            tracker.spawn(cleanup.run(self.pool.clone(), self.outbox.clone(), shutdown.clone()));
        }
        let renew_every = self.config.lease_ttl / 3;
        // The outbox's gauges are read on a task of their own: their queries never delay a
        // claim (they showed in the p99 of created-to-published latency).
        tracker.spawn(record_gauges(self.pool.clone(), self.outbox.clone(), renew_every, shutdown.clone()));
        tracker.close();
        info!(relay_id = %self.id(), brokers = %redact_urls(&self.config.brokers), "relay started");

        // A batch may start only while its leases have this much time left.
        let margin = self.config.message_timeout + Duration::from_secs(1);
        let mut next_maintain = Instant::now();
        let mut idle_failures: u32 = 0;
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
                    &shutdown,
                )
                .await;
                if shutdown.is_cancelled() {
                    break;
                }
            }
            let partitions = self.leases.partitions(margin);
            let rows = if partitions.is_empty() {
                Vec::new()
            } else {
                let marking = self.marking.as_ref().map_or(&[][..], |(ids, _)| ids.as_slice());
                match self
                    .sql
                    .claim(&self.pool, &partitions, i64::from(self.config.batch_size), marking)
                    .await
                {
                    Ok(rows) => rows,
                    Err(error) => {
                        warn!(relay_id = %self.id(), stage = "claim", %error, "reading due events failed");
                        idle_failures += 1;
                        self.pause(
                            backoff::delay(self.config.backoff_base, self.config.backoff_max, idle_failures),
                            &shutdown,
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
                    &shutdown,
                )
                .await;
            } else {
                idle_failures = 0;
            }
        }

        self.finish_marking().await;
        if let Err(error) = self.leases.release_all(&self.pool).await {
            warn!(relay_id = %self.id(), stage = "shutdown", %error, "could not release leases; they expire by themselves");
        }
        tracker.wait().await;
        info!(relay_id = %self.id(), published = self.stats.published(), "relay stopped");
        Ok(())
    }

    /// Waits until the last batch's background mark is written.
    async fn finish_marking(&mut self) {
        if let Some((_, task)) = self.marking.take() {
            if let Err(error) = task.await {
                warn!(relay_id = %self.id(), stage = "mark", %error, "the mark task failed; its rows will be published again");
            }
        }
    }

    async fn pause(&self, delay: Duration, shutdown: &CancellationToken) {
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown.cancelled() => {}
        }
    }

    /// Publishes one batch and records the outcome of every row.
    async fn process(&mut self, rows: Vec<Row>, margin: Duration) -> BatchOutcome {
        let span = info_span!("relay_batch", relay_id = %self.id(), rows = rows.len());
        async {
            let started = Instant::now();
            self.stats.batches.fetch_add(1, Ordering::Relaxed);
            self.topics
                .check(&self.producer, rows.iter().map(|r| r.topic.as_str()), self.config.message_timeout / 2)
                .await;
            metrics::gauge!(crate::metrics::MISSING_TOPICS).set(self.topics.missing() as f64);
            let chains = chains(rows);
            let deadline = tokio::time::Instant::now() + self.config.message_timeout;
            let purged = AtomicBool::new(false);
            let results =
                join_all(chains.iter().map(|chain| self.publish_chain(chain, margin, deadline, &purged))).await;

            let mut outcome = BatchOutcome::default();
            let mut marks = Marks::default();
            for (row, sent) in results.into_iter().flatten() {
                outcome.rows += 1;
                let attempt = row.attempts + 1;
                match sent {
                    Sent::Acked(placement) => {
                        outcome.acked += 1;
                        marks.published.push((row.id, placement));
                    }
                    Sent::Transient { reason, .. } if self.config.max_attempts.is_some_and(|max| attempt.unsigned_abs() >= max) => {
                        warn!(event_id = %row.event_id, aggregate_id = %row.aggregate_id, r#type = %row.event_type,
                              attempt, stage = "publish", %reason, "event failed: attempts exhausted");
                        metrics::counter!(crate::metrics::PUBLISH_ERRORS, "kind" => "exhausted", "code" => "max_attempts").increment(1);
                        marks.failed.push((row.id, format!("gave up after {attempt} attempts: {reason}")));
                    }
                    Sent::Held { reason, retry_in } => {
                        // Not sent, so not an attempt: attempts stay, max_attempts does not
                        // count it, and the batch-wide backoff for a failing broker neither.
                        metrics::counter!(crate::metrics::PUBLISH_ERRORS, "kind" => "held", "code" => MISSING_CODE).increment(1);
                        debug!(event_id = %row.event_id, aggregate_id = %row.aggregate_id, r#type = %row.event_type,
                               attempt = row.attempts, stage = "publish", %reason, retry_in = ?retry_in, "held back: topic missing");
                        marks.retry.push((row.id, retry_in, reason, false));
                    }
                    Sent::Transient { reason, code } => {
                        outcome.transient += 1;
                        if matches!(code.as_str(), "UnknownTopic" | "UnknownTopicOrPartition" | "UnknownPartition") {
                            // The topic may have been deleted: ask the cluster before the next batch.
                            self.topics.suspect(&row.topic);
                        }
                        metrics::counter!(crate::metrics::PUBLISH_ERRORS, "kind" => "transient", "code" => code).increment(1);
                        let delay = backoff::delay(self.config.backoff_base, self.config.backoff_max, attempt.unsigned_abs());
                        // The error alone ("Message timed out") does not say where: name the topic.
                        let named = format!("topic {}", row.topic);
                        let reason = if reason.contains(&named) { reason } else { format!("{reason} ({named})") };
                        if self.transient_warned.is_none_or(|t| t.elapsed() >= TRANSIENT_WARN_EVERY) {
                            self.transient_warned = Some(Instant::now());
                            warn!(event_id = %row.event_id, aggregate_id = %row.aggregate_id, r#type = %row.event_type,
                                  attempt, stage = "publish", %reason, retry_in = ?delay,
                                  suppressed = std::mem::take(&mut self.transient_suppressed),
                                  "transient publish failure; retrying (one warning every 10 s)");
                        } else {
                            self.transient_suppressed += 1;
                            debug!(event_id = %row.event_id, aggregate_id = %row.aggregate_id, r#type = %row.event_type,
                                   attempt, stage = "publish", %reason, retry_in = ?delay, "transient publish failure");
                        }
                        marks.retry.push((row.id, delay, reason, true));
                    }
                    Sent::Permanent { reason, code } => {
                        metrics::counter!(crate::metrics::PUBLISH_ERRORS, "kind" => "permanent", "code" => code).increment(1);
                        warn!(event_id = %row.event_id, aggregate_id = %row.aggregate_id, r#type = %row.event_type,
                              attempt, stage = "publish", %reason, "event failed permanently; its aggregate is held back");
                        marks.failed.push((row.id, reason));
                    }
                }
            }
            let (partitions, tokens) = self.leases.fence();
            let fence = Fence { relay_id: self.id(), partitions, tokens };
            // The previous batch's mark goes first: marks are written in batch order.
            self.finish_marking().await;
            let recorder = Recorder {
                sql: self.sql.clone(),
                pool: self.pool.clone(),
                stats: self.stats.clone(),
                relay_id: self.id(),
                failures: self.mark_failures.clone(),
            };
            if marks.retry.is_empty() && marks.failed.is_empty() {
                // Every row was acknowledged: no later row of these aggregates waits on this
                // mark, so the next batch is claimed (without these rows) and sent while it
                // is written. A crash before it commits republishes them: duplicates only.
                let ids = marks.published.iter().map(|(id, _)| *id).collect();
                let task = tokio::spawn(async move { recorder.record(&marks, &fence).await }.in_current_span());
                self.marking = Some((ids, task));
            } else {
                // A retry or failure mark must be written before the next claim: it is what
                // holds the aggregate's later events back.
                recorder.record(&marks, &fence).await;
            }
            if let Some(reason) = publish::fatal(&self.producer) {
                warn!(relay_id = %self.id(), stage = "publish", %reason, "producer fatal error; creating a new producer");
                match publish::producer(&self.config.brokers, self.config.message_timeout, &self.config.producer) {
                    Ok(producer) => self.producer = producer,
                    Err(error) => warn!(relay_id = %self.id(), %error, "cannot create a producer"),
                }
            }
            metrics::histogram!(crate::metrics::BATCH_SECONDS).record(started.elapsed().as_secs_f64());
            outcome
        }
        .instrument(span)
        .await
    }

    /// Sends one aggregate's rows in order and returns, in order, the outcome of each up to
    /// and including the first that was not acknowledged.
    ///
    /// Consecutive rows to one topic go to one partition (the key is the aggregate id), so
    /// they are handed to the producer together, without waiting for acknowledgements: the
    /// idempotent producer keeps them in order across retries, and the gapless guarantee
    /// turns a broker error that would persist a later one without an earlier one into a
    /// fatal error that fails every later one. Rows to another topic wait until the run
    /// before them is acknowledged. A later row acknowledged after an earlier one failed
    /// would break that; it is counted (`outbox_relay_order_gaps_total`), logged, and left
    /// pending so that it is sent again after the earlier one.
    async fn publish_chain<'r>(
        &self,
        chain: &'r [Row],
        margin: Duration,
        deadline: tokio::time::Instant,
        purged: &AtomicBool,
    ) -> Vec<(&'r Row, Sent)> {
        let mut results = Vec::with_capacity(chain.len());
        let mut rest = chain;
        while let Some(first) = rest.first() {
            let run = rest.iter().take_while(|r| r.topic == first.topic).count();
            let (segment, tail) = rest.split_at(run);
            rest = tail;
            let mut in_flight = Vec::with_capacity(segment.len());
            let mut stop: Option<Option<(&'r Row, Sent)>> = None;
            for row in segment {
                if !self.leases.is_valid(row.work_partition, margin) {
                    stop = Some(None);
                    break;
                }
                let refused = match self.topics.verdict(&row.topic) {
                    Verdict::Send => match publish::enqueue(&self.producer, row, &self.config.source) {
                        Ok(delivery) => {
                            in_flight.push((row, delivery));
                            continue;
                        }
                        Err(sent) => sent,
                    },
                    Verdict::Wait { reason, retry_in } => Sent::Held { reason, retry_in },
                    Verdict::Fail(reason) => Sent::Permanent { reason, code: MISSING_CODE.to_owned() },
                };
                stop = Some(Some((row, refused)));
                break;
            }
            let count = in_flight.len();
            let mut broken: Option<&Row> = None;
            let mut last: Option<Placement> = None;
            for (i, (row, delivery)) in in_flight.into_iter().enumerate() {
                let sent = self.delivered(delivery, deadline, purged).await;
                match (&sent, broken) {
                    (Sent::Acked(placement), None) => {
                        // An offset below 0 is unknown (librdkafka may report a retry the
                        // broker recognised as a duplicate without one): nothing to compare.
                        if last.is_some_and(|l| {
                            l.offset >= 0
                                && placement.offset >= 0
                                && (l.partition != placement.partition || l.offset >= placement.offset)
                        }) {
                            self.order_gap(row, "acknowledged out of partition order", last, *placement);
                        }
                        last = Some(*placement);
                        results.push((row, sent));
                    }
                    (_, None) => {
                        if i + 1 < count {
                            // Keep the rest of this aggregate's run from being sent after it.
                            publish::purge(&self.producer, false).await;
                        }
                        broken = Some(row);
                        results.push((row, sent));
                    }
                    (Sent::Acked(placement), Some(_)) => {
                        self.order_gap(
                            row,
                            "acknowledged after an earlier event of its aggregate failed",
                            last,
                            *placement,
                        );
                    }
                    (_, Some(_)) => {}
                }
            }
            if broken.is_some() {
                return results;
            }
            if let Some(stop) = stop {
                results.extend(stop);
                return results;
            }
        }
        results
    }

    /// Waits for one delivery report until the batch's deadline; past it, purges the
    /// producer once for the whole batch, so that nothing is still sent after the batch
    /// ended and librdkafka's own timeout (a backstop) never fires.
    async fn delivered(
        &self,
        mut delivery: DeliveryFuture,
        deadline: tokio::time::Instant,
        purged: &AtomicBool,
    ) -> Sent {
        match tokio::time::timeout_at(deadline, &mut delivery).await {
            Ok(report) => publish::outcome(report),
            Err(_) => {
                if !purged.swap(true, Ordering::Relaxed) {
                    warn!(relay_id = %self.id(), stage = "publish", timeout = ?self.config.message_timeout,
                          "batch not acknowledged within the message timeout; purging the producer's queue");
                    publish::purge(&self.producer, true).await;
                }
                publish::outcome(delivery.await)
            }
        }
    }

    fn order_gap(&self, row: &Row, what: &str, before: Option<Placement>, placement: Placement) {
        metrics::counter!(crate::metrics::ORDER_GAPS).increment(1);
        self.stats.order_gaps.fetch_add(1, Ordering::Relaxed);
        tracing::error!(event_id = %row.event_id, aggregate_id = %row.aggregate_id, r#type = %row.event_type,
                        attempt = row.attempts + 1, stage = "publish", partition = placement.partition,
                        offset = placement.offset, before = ?before,
                        "per-aggregate order not guaranteed: {what}; the event stays pending and is sent again");
    }
}

/// Writes a batch's marks and counts them.
struct Recorder {
    sql: Arc<Statements>,
    pool: PgPool,
    stats: Arc<RelayStats>,
    relay_id: Uuid,
    /// Consecutive failed marks (reset by one that succeeds).
    failures: Arc<AtomicU32>,
}

impl Recorder {
    async fn record(&self, marks: &Marks, fence: &Fence) {
        match self.sql.mark(&self.pool, marks, fence).await {
            Ok(marked) => {
                self.failures.store(0, Ordering::Relaxed);
                metrics::counter!(crate::metrics::PUBLISHED).increment(marked.published);
                self.stats.published.fetch_add(marked.published, Ordering::Relaxed);
                self.stats.retried.fetch_add(marked.retry, Ordering::Relaxed);
                self.stats.failed.fetch_add(marked.failed, Ordering::Relaxed);
                let asked = (marks.published.len() + marks.retry.len() + marks.failed.len()) as u64;
                let done = marked.published + marked.retry + marked.failed;
                if done < asked {
                    self.stats.fenced.fetch_add(asked - done, Ordering::Relaxed);
                    metrics::counter!(crate::metrics::FENCED).increment(asked - done);
                    warn!(relay_id = %self.relay_id, stage = "mark", unmarked = asked - done,
                          "rows not marked: their partition's lease passed to another relay, which publishes them again");
                }
            }
            Err(error) => {
                // Published but unmarked rows are published again later: a duplicate, never a loss.
                let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
                warn!(relay_id = %self.relay_id, stage = "mark", %error, failures,
                      "marking the batch failed; its rows will be published again after a backoff");
            }
        }
    }
}

/// Groups a batch (ordered by id) into per-aggregate chains, each still ordered by id.
fn chains(rows: Vec<Row>) -> Vec<Vec<Row>> {
    let mut index: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut chains: Vec<Vec<Row>> = Vec::new();
    for row in rows {
        let key = (row.aggregate_type.clone(), row.aggregate_id.clone());
        match index.get(&key) {
            Some(&i) => chains[i].push(row),
            None => {
                index.insert(key, chains.len());
                chains.push(vec![row]);
            }
        }
    }
    chains
}

#[cfg(test)]
mod tests;

/// Sets the outbox's and the pool's gauges every `every` until shutdown.
async fn record_gauges(pool: PgPool, outbox: Outbox, every: Duration, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => return,
        }
        crate::metrics::record_pool(&pool);
        if let Err(error) = outbox.record_gauges(&pool).await {
            debug!(stage = "metrics", %error, "could not read the outbox status");
        }
    }
}

/// Wakes the relay when an append commits (NOTIFY), reconnecting after connection loss.
async fn listen(pool: PgPool, channel: String, wake: Arc<Notify>, shutdown: CancellationToken) {
    while !shutdown.is_cancelled() {
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(listener) => listener,
            Err(error) => {
                warn!(stage = "listen", %error, "cannot connect the NOTIFY listener; polling meanwhile");
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    () = shutdown.cancelled() => return,
                }
            }
        };
        if let Err(error) = listener.listen(&channel).await {
            warn!(stage = "listen", %error, "LISTEN failed; polling meanwhile");
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                () = shutdown.cancelled() => return,
            }
        }
        loop {
            tokio::select! {
                received = listener.try_recv() => match received {
                    Ok(_) => wake.notify_one(), // a notification, or a reconnect after which we may have missed some
                    Err(error) => {
                        warn!(stage = "listen", %error, "NOTIFY listener failed; reconnecting");
                        break;
                    }
                },
                () = shutdown.cancelled() => return,
            }
        }
    }
}
