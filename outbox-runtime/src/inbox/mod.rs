//! The inbox: consumes events from Kafka and applies each once, in the same PostgreSQL
//! transaction as its effect, committing the Kafka offset only after that transaction.
//!
//! For every message, one transaction inserts `(consumer, event_id)` into the inbox with
//! `ON CONFLICT DO NOTHING`; only a new row runs the handler, whose effect commits or rolls
//! back with it (invariant 8). Partitions are processed in parallel, each in order, and an
//! offset is committed only once every message before it has a final outcome (invariant 7).
//! A transient handler error retries the same message with backoff. A permanent one, and
//! any message that is not a readable event (headers, JSON, unknown type or version,
//! payload that does not decode), is parked with its reason and raw bytes; later messages
//! of the same key are held behind it, stored, not applied, until an operator retries or
//! discards it (invariant 9). Nothing is dropped.
//!
//! ```no_run
//! # use outbox_runtime::inbox::{EventHandler, HandlerError, Handlers, Inbox, InboxConfig, Meta};
//! # #[derive(serde::Deserialize, serde::Serialize, schemars::JsonSchema, outbox_runtime::OutboxEvent)]
//! # #[outbox(event_type = "order.confirmed", schema_version = 1, aggregate = "order", topic = "orders")]
//! # struct OrderConfirmed { #[outbox(aggregate_id)] order_id: uuid::Uuid }
//! struct Projection;
//! impl EventHandler<OrderConfirmed> for Projection {
//!     async fn handle(&self, tx: &mut sqlx::PgConnection, e: OrderConfirmed, _: &Meta) -> Result<(), HandlerError> {
//!         sqlx::query("INSERT INTO confirmed (id) VALUES ($1)").bind(e.order_id).execute(tx).await?;
//!         Ok(())
//!     }
//! }
//! # async fn f(pool: sqlx::PgPool) -> outbox_runtime::Result<()> {
//! let config = InboxConfig::new("billing", "127.0.0.1:9092", ["orders"]);
//! let inbox = Inbox::new(pool.clone(), config, Handlers::new().on::<OrderConfirmed, _>(Projection))?;
//! inbox.migrator().run(&pool).await?;
//! inbox.run(tokio_util::sync::CancellationToken::new()).await?;
//! # Ok(()) }
//! ```

mod admin;
mod handler;
mod message;
mod retention;
mod store;

use std::collections::{BTreeMap, HashMap};
use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::consumer::{CommitMode, Consumer, ConsumerContext, StreamConsumer};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::statistics::Statistics;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::{AssertSqlSafe, PgPool, SqlSafeStr};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, info_span, warn, Instrument};

pub use self::admin::{Discarded, InboxAdmin};
pub use self::handler::{BoxFuture, EventHandler, HandlerError, Handlers, Meta, RawHandler};
use self::message::Incoming;
pub use self::retention::{judge as judge_retention, RetentionVerdict};
pub(crate) use self::store::InboxNames;
use self::store::{Outcome, Store};
use crate::error::{Error, Result};
use crate::relay::backoff_delay;

/// How an inbox consumer runs. Every setting has a default except consumer, brokers, topics.
#[derive(Debug, Clone)]
pub struct InboxConfig {
    consumer: String,
    brokers: String,
    topics: Vec<String>,
    schema: String,
    table: String,
    dedup_retention: Option<Duration>,
    replay_window: Duration,
    refuse_short_retention: bool,
    backoff_base: Duration,
    backoff_max: Duration,
    queue_per_partition: usize,
    commit_interval: Duration,
    operator_poll_interval: Duration,
    cleanup_interval: Duration,
    cleanup_batch: u32,
    kafka: BTreeMap<String, String>,
}

impl InboxConfig {
    /// A consumer named `consumer` (its Kafka `group.id`, and its key in the inbox),
    /// reading `topics` from `brokers`; otherwise defaults.
    pub fn new(
        consumer: impl Into<String>,
        brokers: impl Into<String>,
        topics: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        InboxConfig {
            consumer: consumer.into(),
            brokers: brokers.into(),
            topics: topics.into_iter().map(Into::into).collect(),
            schema: "public".to_owned(),
            table: "inbox".to_owned(),
            dedup_retention: Some(Duration::from_secs(30 * 24 * 3600)),
            replay_window: Duration::from_secs(7 * 24 * 3600),
            refuse_short_retention: false,
            backoff_base: Duration::from_millis(200),
            backoff_max: Duration::from_secs(30),
            queue_per_partition: 256,
            commit_interval: Duration::from_millis(500),
            operator_poll_interval: Duration::from_secs(2),
            cleanup_interval: Duration::from_secs(60),
            cleanup_batch: 1000,
            kafka: BTreeMap::new(),
        }
    }

    /// Schema of the inbox tables. Default: `public`.
    #[must_use]
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// Inbox table name; `<table>_parked`, `<table>_aggregates` and `<table>_migrations`
    /// are named after it. Default: `inbox`.
    #[must_use]
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// How long event ids are kept for deduplication; `None` keeps them forever. It must
    /// cover the topic's retention plus the replay window, or a redelivered old event
    /// would apply twice. Default: 30 days.
    #[must_use]
    pub fn dedup_retention(mut self, retention: Option<Duration>) -> Self {
        self.dedup_retention = retention;
        self
    }

    /// How far back events may be replayed (re-published) after they first arrived.
    /// Default: 7 days.
    #[must_use]
    pub fn replay_window(mut self, window: Duration) -> Self {
        self.replay_window = window;
        self
    }

    /// Refuse to start (instead of warning) when the dedup retention is shorter than the
    /// topic's retention plus the replay window. Default: false.
    #[must_use]
    pub fn refuse_short_retention(mut self, refuse: bool) -> Self {
        self.refuse_short_retention = refuse;
        self
    }

    /// First retry delay after a transient handler error, doubling with jitter up to
    /// `backoff_max`. Defaults: 200 ms and 30 s.
    #[must_use]
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.backoff_base = base;
        self.backoff_max = max;
        self
    }

    /// Messages buffered per partition ahead of its worker. Default: 256.
    #[must_use]
    pub fn queue_per_partition(mut self, messages: usize) -> Self {
        self.queue_per_partition = messages.max(1);
        self
    }

    /// How often finished offsets are committed. Default: 500 ms.
    #[must_use]
    pub fn commit_interval(mut self, interval: Duration) -> Self {
        self.commit_interval = interval;
        self
    }

    /// How often the running consumer looks for retries requested by operators
    /// ([`InboxAdmin::request_retry`], `outbox inbox retry`). Default: 2 s.
    #[must_use]
    pub fn operator_poll_interval(mut self, interval: Duration) -> Self {
        self.operator_poll_interval = interval;
        self
    }

    /// A librdkafka consumer setting. `enable.auto.commit`, `enable.auto.offset.store` and
    /// `group.id` are fixed.
    #[must_use]
    pub fn kafka_setting(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.kafka.insert(key.into(), value.into());
        self
    }
}

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
    /// Effects applied.
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

    fn record(&self, consumer: &str, outcome: &Outcome) {
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

/// A parked or held message, for operators.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ParkedMessage {
    /// Its id in the parked table.
    pub id: i64,
    /// An operator asked for a retry that the running consumer has not carried out yet.
    pub retry_requested: bool,
    /// `parked` (failed itself), `held` (behind a parked one), `retried` or `discarded`.
    pub status: String,
    /// Why.
    pub reason: String,
    /// Where it was read.
    pub topic: String,
    /// Kafka partition.
    pub kafka_partition: i32,
    /// Kafka offset.
    pub kafka_offset: i64,
    /// The record key.
    pub record_key: Option<Vec<u8>>,
    /// `ce_type`, when readable.
    pub event_type: Option<String>,
    /// The raw payload.
    pub payload: Vec<u8>,
}

/// What an operator's retry or discard did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Released {
    /// Messages of the key applied (or absorbed as duplicates or stale), in order.
    pub applied: usize,
    /// Set when a message of the key was parked (again): the release stops there.
    pub parked_again: Option<String>,
}

/// An inbox consumer. See the [module documentation](self).
#[derive(Clone)]
pub struct Inbox {
    pool: PgPool,
    config: InboxConfig,
    names: InboxNames,
    store: Arc<Store>,
    handlers: Arc<Handlers>,
    stats: Arc<InboxStats>,
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox")
            .field("config", &self.config)
            .field("handlers", &self.handlers)
            .finish_non_exhaustive()
    }
}

impl Inbox {
    /// An inbox consumer on `pool` (not yet connected to Kafka).
    pub fn new(pool: PgPool, config: InboxConfig, handlers: Handlers) -> Result<Self> {
        let names = InboxNames::new(&config.schema, &config.table)?;
        if config.consumer.is_empty() || config.topics.is_empty() {
            return Err(Error::Config("an inbox needs a consumer name and at least one topic".into()));
        }
        for fixed in ["enable.auto.commit", "enable.auto.offset.store", "group.id"] {
            if config.kafka.contains_key(fixed) {
                return Err(Error::Config(format!("consumer setting {fixed} cannot be overridden")));
            }
        }
        let store = Arc::new(Store::new(&names, &config.consumer));
        Ok(Inbox { pool, config, names, store, handlers: Arc::new(handlers), stats: Arc::default() })
    }

    /// This consumer's counters.
    pub fn stats(&self) -> Arc<InboxStats> {
        self.stats.clone()
    }

    /// A migrator creating the inbox tables.
    pub fn migrator(&self) -> Migrator {
        let InboxNames { inbox, parked, aggregates, schema, table } = &self.names;
        let v1 = format!(
            r#"
-- One row per (consumer, event) applied: the dedup key, plus what diagnosing needs.
CREATE TABLE {inbox} (
    consumer          text NOT NULL,
    event_id          uuid NOT NULL,
    event_type        text NOT NULL,
    schema_version    integer NOT NULL,
    aggregate_type    text,
    aggregate_id      text,
    aggregate_version bigint,
    topic             text NOT NULL,
    kafka_partition   integer NOT NULL,
    kafka_offset      bigint NOT NULL,
    outcome           text NOT NULL DEFAULT 'applied' CHECK (outcome IN ('applied', 'stale', 'discarded')),
    applied_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);
CREATE INDEX "{table}_applied_at" ON {inbox} (applied_at);

-- Messages not applied: parked with their reason, or held behind a parked one of their
-- key. Raw bytes are kept: nothing is lost.
CREATE TABLE {parked} (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer        text NOT NULL,
    topic           text NOT NULL,
    kafka_partition integer NOT NULL,
    kafka_offset    bigint NOT NULL,
    record_key      bytea,
    headers         jsonb NOT NULL,
    payload         bytea NOT NULL,
    event_id        uuid,
    event_type      text,
    schema_version  integer,
    status          text NOT NULL CHECK (status IN ('parked', 'held', 'retried', 'discarded')),
    reason          text NOT NULL,
    parked_at       timestamptz NOT NULL DEFAULT now(),
    resolved_at     timestamptz,
    UNIQUE (consumer, topic, kafka_partition, kafka_offset)
);
CREATE INDEX "{table}_parked_open" ON {parked} (consumer, record_key, id) WHERE status IN ('parked', 'held');

-- Last applied aggregate_version per aggregate and topic (order holds within a topic's
-- partition only), with the gaps and stale events seen.
CREATE TABLE {aggregates} (
    consumer       text NOT NULL,
    topic          text NOT NULL,
    aggregate_type text NOT NULL,
    aggregate_id   text NOT NULL,
    last_version   bigint NOT NULL,
    gaps           bigint NOT NULL DEFAULT 0,
    stale          bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (consumer, topic, aggregate_type, aggregate_id)
);
"#
        );
        let migration = Migration::new(
            1,
            "inbox, parked, aggregates".into(),
            MigrationType::Simple,
            AssertSqlSafe(v1).into_sql_str(),
            false,
        );
        let v2 = format!(
            r#"
-- Retries requested by operators (outbox inbox retry), carried out by the running consumer.
ALTER TABLE {parked} ADD COLUMN retry_requested_at timestamptz;
"#
        );
        let migration2 = Migration::new(
            2,
            "operator retry requests".into(),
            MigrationType::Simple,
            AssertSqlSafe(v2).into_sql_str(),
            false,
        );
        let mut migrator = Migrator::with_migrations(vec![migration, migration2]);
        migrator.create_schema(schema.clone());
        migrator.dangerous_set_table_name(format!("\"{schema}\".\"{table}_migrations\""));
        migrator
    }

    /// The operator side of this inbox: parked messages, retry requests, discards.
    pub fn admin(&self) -> InboxAdmin {
        InboxAdmin::from_parts(self.pool.clone(), self.names.clone(), self.config.consumer.clone())
    }

    fn kafka_consumer(&self) -> Result<StreamConsumer<LagContext>> {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.config.brokers)
            .set("auto.offset.reset", "earliest")
            .set("session.timeout.ms", "10000")
            // Statistics carry the consumer lag per partition (the inbox_consumer_lag gauge).
            .set("statistics.interval.ms", "5000");
        for (k, v) in &self.config.kafka {
            config.set(k, v);
        }
        config
            .set("group.id", &self.config.consumer)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false");
        Ok(config.create_with_context(LagContext { consumer: self.config.consumer.clone() })?)
    }

    /// Consumes until `shutdown` is cancelled. Then it stops reading, lets each partition
    /// finish the message in hand (a message waiting for a retry is abandoned and will be
    /// redelivered), commits the finished offsets and returns.
    pub async fn run(self, shutdown: CancellationToken) -> Result<()> {
        let consumer = Arc::new(self.kafka_consumer()?);
        let tracker = TaskTracker::new();
        if self.config.refuse_short_retention {
            // Refusing needs the verdict before consuming anything.
            match retention::check_topics(&self.config).await {
                RetentionVerdict::Short(message) => return Err(Error::Config(message)),
                verdict => warn_retention(&self.config.consumer, verdict),
            }
        } else {
            // Only a warning: do not hold up start-up (some brokers never answer).
            let (config, name) = (self.config.clone(), self.config.consumer.clone());
            tracker.spawn(async move { warn_retention(&name, retention::check_topics(&config).await) });
        }
        let topics: Vec<&str> = self.config.topics.iter().map(String::as_str).collect();
        consumer.subscribe(&topics)?;
        info!(consumer = %self.config.consumer, topics = ?topics, "inbox started");

        if let Some(retention) = self.config.dedup_retention {
            tracker.spawn(cleanup_loop(
                self.pool.clone(),
                self.names.inbox.clone(),
                retention,
                self.config.cleanup_interval,
                self.config.cleanup_batch,
                shutdown.clone(),
            ));
        }
        tracker.spawn(self.clone().operator_requests(shutdown.clone()));
        let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(String, i32, i64)>();
        let mut workers: HashMap<(String, i32), mpsc::Sender<OwnedMessage>> = HashMap::new();
        let mut finished: BTreeMap<(String, i32), i64> = BTreeMap::new();
        let mut committed: BTreeMap<(String, i32), i64> = BTreeMap::new();
        let mut tick = tokio::time::interval(self.config.commit_interval);
        loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                Some((topic, partition, next)) = done_rx.recv() => { finished.insert((topic, partition), next); }
                _ = tick.tick() => commit(&consumer, &finished, &mut committed, CommitMode::Async),
                received = consumer.recv() => match received {
                    Ok(message) => {
                        let message = message.detach();
                        let place = (message.topic().to_owned(), message.partition());
                        let sender = workers.entry(place).or_insert_with(|| {
                            let (tx, rx) = mpsc::channel(self.config.queue_per_partition);
                            tracker.spawn(self.worker(rx, done_tx.clone(), shutdown.clone()));
                            tx
                        });
                        tokio::select! {
                            sent = sender.send(message) => if sent.is_err() {
                                // The worker is gone (it cannot end otherwise): stop, so the
                                // partition is redelivered after a restart instead of skipped.
                                warn!(consumer = %self.config.consumer, stage = "consume", "a partition worker stopped; stopping the consumer");
                                break;
                            },
                            () = shutdown.cancelled() => break,
                        }
                    }
                    Err(error) => {
                        warn!(consumer = %self.config.consumer, stage = "consume", %error, "receiving failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }
        drop(workers);
        drop(done_tx);
        tracker.close();
        tracker.wait().await;
        while let Some((topic, partition, next)) = done_rx.recv().await {
            finished.insert((topic, partition), next);
        }
        // An async commit may have failed unseen: commit every finished offset once more.
        committed.clear();
        commit(&consumer, &finished, &mut committed, CommitMode::Sync);
        info!(consumer = %self.config.consumer, applied = self.stats.applied(), "inbox stopped");
        Ok(())
    }

    /// Processes one partition's messages in order.
    fn worker(
        &self,
        mut rx: mpsc::Receiver<OwnedMessage>,
        done: mpsc::UnboundedSender<(String, i32, i64)>,
        shutdown: CancellationToken,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (pool, store, handlers, stats) =
            (self.pool.clone(), self.store.clone(), self.handlers.clone(), self.stats.clone());
        let (base, max, consumer) =
            (self.config.backoff_base, self.config.backoff_max, self.config.consumer.clone());
        async move {
            while let Some(message) = rx.recv().await {
                if shutdown.is_cancelled() {
                    return; // not started: redelivered after restart
                }
                let incoming = Incoming::read(&message);
                let event_id = incoming.meta.as_ref().map(|m| m.event_id.to_string()).unwrap_or_default();
                let span = info_span!("inbox_message", consumer = %consumer, topic = %incoming.topic,
                                      partition = incoming.partition, offset = incoming.offset, event_id = %event_id);
                let mut attempt: u32 = 0;
                let started = std::time::Instant::now();
                let finished = async {
                    loop {
                        attempt += 1;
                        let processed = AssertUnwindSafe(store.process(&pool, &handlers, &incoming)).catch_unwind().await;
                        let processed = match processed {
                            Ok(result) => result,
                            // A panicking handler is a permanent failure of this message.
                            Err(panic) => {
                                let what = panic
                                    .downcast_ref::<&str>()
                                    .map(|s| (*s).to_owned())
                                    .or_else(|| panic.downcast_ref::<String>().cloned())
                                    .unwrap_or_else(|| "unknown panic".to_owned());
                                store.park_after_rollback(&pool, &incoming, &format!("handler panicked: {what}"), None).await
                            }
                        };
                        let reason = match processed {
                            Ok(Outcome::RetryLater(reason)) => reason,
                            Ok(outcome) => {
                                if let Outcome::Parked(reason) = &outcome {
                                    warn!(attempt, stage = "inbox", %reason, "message parked");
                                }
                                stats.record(&consumer, &outcome);
                                metrics::histogram!(crate::metrics::INBOX_APPLY_SECONDS, "consumer" => consumer.clone())
                                    .record(started.elapsed().as_secs_f64());
                                return true;
                            }
                            Err(error) => error.to_string(),
                        };
                        stats.record(&consumer, &Outcome::RetryLater(String::new()));
                        let delay = backoff_delay(base, max, attempt);
                        warn!(attempt, stage = "inbox", %reason, retry_in = ?delay, "transient failure; retrying");
                        tokio::select! {
                            () = tokio::time::sleep(delay) => {}
                            () = shutdown.cancelled() => return false, // abandoned: redelivered
                        }
                    }
                }
                .instrument(span)
                .await;
                if !finished {
                    return;
                }
                let _ = done.send((incoming.topic.clone(), incoming.partition, incoming.offset + 1));
            }
        }
    }

    /// Parked and held messages, oldest first.
    pub async fn parked(&self) -> Result<Vec<ParkedMessage>> {
        self.admin().parked().await
    }

    /// Carries out the retries operators requested, every `operator_poll_interval`.
    async fn operator_requests(self, shutdown: CancellationToken) {
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
        let target: Option<(Option<Vec<u8>>, bool)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT record_key, NOT EXISTS (SELECT 1 FROM {parked} q WHERE q.consumer = p.consumer \
                 AND q.record_key = p.record_key AND q.status IN ('parked', 'held') AND q.id < p.id) \
             FROM {parked} p WHERE id = $1 AND consumer = $2 AND status IN ('parked', 'held')"
        )))
        .bind(id)
        .bind(&self.config.consumer)
        .fetch_optional(&self.pool)
        .await?;
        let key = match target {
            None => {
                return Err(Error::NotFound(format!(
                    "no parked message {id} for consumer {}",
                    self.config.consumer
                )))
            }
            Some((_, false)) => {
                return Err(Error::Config(format!(
                    "message {id} is held behind an earlier one of its key: release that first"
                )))
            }
            Some((key, true)) => key,
        };
        type Row =
            (i64, String, i32, i64, Option<Vec<u8>>, sqlx::types::Json<BTreeMap<String, String>>, Vec<u8>);
        // The next open message of the key, read under the key's lock each time, so that
        // messages arriving during the release are released too, in order.
        let next_open = format!(
            "SELECT id, topic, kafka_partition, kafka_offset, record_key, headers, payload FROM {parked} \
             WHERE consumer = $1 AND status IN ('parked', 'held') AND (id = $2 OR (record_key = $3 AND id > $2)) \
             ORDER BY id LIMIT 1"
        );
        let mut released = Released::default();
        loop {
            let mut tx = self.pool.begin().await?;
            self.store.lock(&mut tx, key.as_deref()).await?;
            let row: Option<Row> = sqlx::query_as(AssertSqlSafe(next_open.as_str()))
                .bind(&self.config.consumer)
                .bind(id)
                .bind(key.as_deref())
                .fetch_optional(&mut *tx)
                .await?;
            let Some((row_id, topic, partition, offset, row_key, headers, payload)) = row else {
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
            let incoming = Incoming::from_parts(&topic, partition, offset, row_key, payload, headers.0, &[]);
            match self
                .store
                .apply(&self.pool, tx, &self.handlers, &incoming, Some((row_id, "retried")))
                .await?
            {
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

    /// Deletes inbox rows applied more than `older_than` ago, `batch_size` per statement.
    pub async fn delete_applied(&self, older_than: Duration, batch_size: u32) -> Result<u64> {
        delete_applied(&self.pool, &self.names.inbox, older_than, batch_size).await
    }
}

fn warn_retention(consumer: &str, verdict: RetentionVerdict) {
    match verdict {
        RetentionVerdict::Covered => {}
        RetentionVerdict::Short(message) | RetentionVerdict::Unknown(message) => {
            warn!(consumer, stage = "startup", "{message}");
        }
    }
}

/// The Kafka client context: reports the consumer lag per partition from librdkafka's
/// statistics.
struct LagContext {
    consumer: String,
}

impl ClientContext for LagContext {
    fn stats(&self, statistics: Statistics) {
        for (topic, t) in statistics.topics {
            for (partition, p) in t.partitions {
                // -1 is librdkafka's internal partition; a negative lag means unknown.
                if partition >= 0 && p.consumer_lag >= 0 {
                    #[allow(clippy::cast_precision_loss)]
                    metrics::gauge!(crate::metrics::INBOX_LAG, "consumer" => self.consumer.clone(),
                                    "topic" => topic.clone(), "partition" => partition.to_string())
                    .set(p.consumer_lag as f64);
                }
            }
        }
    }
}

impl ConsumerContext for LagContext {}

/// Commits each partition's finished offset when it moved.
fn commit(
    consumer: &StreamConsumer<LagContext>,
    finished: &BTreeMap<(String, i32), i64>,
    committed: &mut BTreeMap<(String, i32), i64>,
    mode: CommitMode,
) {
    let mut list = TopicPartitionList::new();
    for ((topic, partition), next) in finished {
        if committed.get(&(topic.clone(), *partition)) != Some(next) {
            let _ = list.add_partition_offset(topic, *partition, Offset::Offset(*next));
        }
    }
    if list.count() == 0 {
        return;
    }
    match consumer.commit(&list, mode) {
        Ok(()) => committed.extend(finished.iter().map(|(k, v)| (k.clone(), *v))),
        // After a rebalance the partition may belong to another consumer: it reads from
        // the last committed offset and the inbox absorbs what this one already applied.
        Err(error) => {
            warn!(stage = "commit", %error, "offset commit failed; messages may be redelivered and absorbed")
        }
    }
}

async fn delete_applied(pool: &PgPool, inbox: &str, older_than: Duration, batch_size: u32) -> Result<u64> {
    let sql = format!(
        "DELETE FROM {inbox} WHERE ctid IN (SELECT ctid FROM {inbox} \
         WHERE applied_at < now() - $1 * interval '1 millisecond' LIMIT $2)"
    );
    let mut total = 0;
    loop {
        let deleted = sqlx::query(AssertSqlSafe(sql.as_str()))
            .bind(i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX))
            .bind(i64::from(batch_size))
            .execute(pool)
            .await?
            .rows_affected();
        total += deleted;
        if deleted < u64::from(batch_size) {
            return Ok(total);
        }
    }
}

async fn cleanup_loop(
    pool: PgPool,
    inbox: String,
    retention: Duration,
    every: Duration,
    batch: u32,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = shutdown.cancelled() => return,
        }
        if let Err(error) = delete_applied(&pool, &inbox, retention, batch).await {
            warn!(stage = "cleanup", %error, "inbox cleanup failed; trying again next round");
        }
    }
}
