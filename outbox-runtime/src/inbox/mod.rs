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
mod config;
mod consume;
mod failure;
mod handler;
mod message;
mod retention;
mod store;
mod worker;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::{AssertSqlSafe, PgPool, SqlSafeStr};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use self::admin::{Discarded, InboxAdmin};
pub use self::config::InboxConfig;
pub use self::handler::{BoxFuture, EventHandler, HandlerError, Handlers, Meta, RawHandler};
use self::message::Incoming;
pub use self::retention::{judge as judge_retention, judge_topic, RetentionVerdict};
pub(crate) use self::store::InboxNames;
use self::store::{Outcome, Store};
use crate::error::{Error, Result};

type Bytes = Vec<u8>;

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
    ///
    /// Every setting is checked here (invariant 12): one that cannot work is an
    /// [`Error::Config`] naming it.
    pub fn new(pool: PgPool, config: InboxConfig, handlers: Handlers) -> Result<Self> {
        let names = InboxNames::new(&config.schema, &config.table)?;
        config.validate()?;
        let store = Arc::new(Store::new(&names, &config.consumer));
        Ok(Inbox { pool, config, names, store, handlers: Arc::new(handlers), stats: Arc::default() })
    }

    /// Its settings.
    #[cfg(feature = "testing")]
    pub(crate) fn config(&self) -> &InboxConfig {
        &self.config
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
        let v3 = format!(
            r#"
-- Holds are keyed by topic and record key (a parked record holds back later records of its
-- key in its topic only), hashed: keys may be any size, an index row about 2,700 bytes.
-- Every header is kept as read, bytes included; null values are told from empty ones.
DROP INDEX "{schema}"."{table}_parked_open";
-- The database's encoding never changes, so the function is immutable and the key can be a
-- generated column: every row gets it, however it is inserted.
CREATE FUNCTION "{schema}"."{table}_hold_key"(topic text, record_key bytea) RETURNS bytea
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT sha256(convert_to(topic, 'UTF8') || decode('00', 'hex') || record_key) $$;
ALTER TABLE {parked}
    ADD COLUMN hold_key bytea GENERATED ALWAYS AS ("{schema}"."{table}_hold_key"(topic, record_key)) STORED,
    ADD COLUMN raw_headers jsonb,
    ADD COLUMN null_value boolean NOT NULL DEFAULT false;
CREATE INDEX "{table}_parked_hold" ON {parked} (consumer, hold_key, id) WHERE status IN ('parked', 'held');
-- Cleanup deletes one consumer's rows at a time.
DROP INDEX "{schema}"."{table}_applied_at";
CREATE INDEX "{table}_applied_at" ON {inbox} (consumer, applied_at);
"#
        );
        let migration3 = Migration::new(
            3,
            "holds by topic and hashed key, raw headers, cleanup per consumer".into(),
            MigrationType::Simple,
            AssertSqlSafe(v3).into_sql_str(),
            false,
        );
        let mut migrator = Migrator::with_migrations(vec![migration, migration2, migration3]);
        migrator.create_schema(schema.clone());
        migrator.dangerous_set_table_name(format!("\"{schema}\".\"{table}_migrations\""));
        migrator
    }

    /// The operator side of this inbox: parked messages, retry requests, discards.
    pub fn admin(&self) -> InboxAdmin {
        InboxAdmin::from_parts(self.pool.clone(), self.names.clone(), self.config.consumer.clone())
    }

    /// Consumes until `shutdown` is cancelled. Then it stops reading, lets each partition
    /// finish the record in hand (a record waiting for a retry is abandoned and will be
    /// redelivered), commits the finished offsets and returns, all within
    /// [`InboxConfig::shutdown_timeout`] (records still in hand then are abandoned too).
    ///
    /// It returns early with [`Error::Inbox`] when the consumer cannot go on: a record that
    /// cannot be given any outcome (not even parked), a worker that panicked, a Kafka error
    /// that does not pass (authorization, a fatal idempotence error). It never lives on
    /// without consuming: restart it (or the process) on an error.
    pub async fn run(self, shutdown: CancellationToken) -> Result<()> {
        self.consume(shutdown).await
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
            Some((.., false)) => {
                return Err(Error::Config(format!(
                    "message {id} is held behind an earlier one of its key: release that first"
                )))
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
        // The next open message of the key, read under the key's lock each time, so that
        // messages arriving during the release are released too, in order.
        let next_open = format!(
            "SELECT id, kafka_partition, kafka_offset, record_key, headers, payload, null_value, raw_headers \
             FROM {parked} WHERE consumer = $1 AND status IN ('parked', 'held') \
             AND (id = $2 OR (hold_key = $3 AND id > $2)) ORDER BY id LIMIT 1"
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
            );
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
        delete_applied(&self.pool, &self.names.inbox, &self.config.consumer, older_than, batch_size).await
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

/// Deletes `consumer`'s inbox rows applied more than `older_than` ago, `batch_size` per
/// statement. Only its own: consumers sharing the table keep theirs as long as they choose
/// (invariant 10).
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
            .bind(i64::from(batch_size.max(1)))
            .bind(consumer)
            .execute(pool)
            .await?
            .rows_affected();
        total += deleted;
        if deleted < u64::from(batch_size.max(1)) {
            return Ok(total);
        }
    }
}

/// Deletes this consumer's expired dedup rows every `cleanup_interval`.
async fn cleanup_loop(inbox: Inbox, retention: Duration, shutdown: CancellationToken) {
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
