//! The inbox: consumes events from Kafka and applies each once, in the same PostgreSQL
//! transaction as its effect, committing the Kafka offset only after that transaction.
//!
//! For every message, one transaction inserts `(consumer, event_id)` into the inbox with
//! `ON CONFLICT DO NOTHING`; only a new row runs the handler, whose effect commits or rolls
//! back with it ([invariant 8](crate::guarantees#i8)). Partitions are processed in parallel, each in order, and an
//! offset is committed only once every message before it has a final outcome ([invariant 7](crate::guarantees#i7)).
//! A transient handler error retries the same message with backoff. A permanent one, and
//! any message that is not a readable event (headers, JSON, unknown type or version,
//! payload that does not decode), is parked with its reason and raw bytes; later messages
//! of the same key are held behind it, stored, not applied, until an operator retries or
//! discards it ([invariant 9](crate::guarantees#i9)). Nothing is dropped.
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
mod budget;
mod cleanup;
mod config;
mod consume;
mod decode;
mod failure;
mod handler;
mod lag;
mod message;
mod migrate;
mod names;
mod partitions;
mod release;
mod retention;
mod spans;
mod stats;
mod store;

use std::sync::Arc;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

pub use self::admin::{
    AppliedCursor, AppliedPage, AppliedQuery, AppliedRecord, ConsumerSummary, Discarded, InboxAdmin,
    ParkedGroup, ParkedPage, ParkedQuery, ParkedSummary,
};
pub use self::config::InboxConfig;
pub use self::handler::{
    BoxFuture, EventHandler, HandlerError, Handlers, Meta, RawHandler, IDEMPOTENCY_NAMESPACE,
};
pub use self::lag::{ConsumerLag, LagReader, PartitionLag, MAX_LAG_PARTITIONS};
pub use self::message::{event_id_of, FOREIGN_ID_NAMESPACE};
pub(crate) use self::names::InboxNames;
pub use self::partitions::{KeptPartition, Layout, PartitionReport};
pub use self::release::Released;
pub use self::retention::{judge as judge_retention, judge_topic, RetentionVerdict};
pub use self::stats::InboxStats;
use self::store::Store;
pub use crate::action::{ActionFilter, ActionReport, AuditEntry, AuditPage, MAX_PAGE};
use crate::error::Result;

type Bytes = Vec<u8>;

/// A parked or held message, for operators. Its `Debug` shows the payload's length, never
/// its bytes (logs never carry payloads), and the key as text (hex when it is not UTF-8).
#[derive(Clone, PartialEq, Eq)]
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

impl std::fmt::Debug for ParkedMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let key = self.record_key.as_deref().map(|key| match std::str::from_utf8(key) {
            Ok(text) => format!("{text:?}"),
            Err(_) => format!("0x{}", key.iter().map(|b| format!("{b:02x}")).collect::<String>()),
        });
        f.debug_struct("ParkedMessage")
            .field("id", &self.id)
            .field("retry_requested", &self.retry_requested)
            .field("status", &self.status)
            .field("reason", &self.reason)
            .field("topic", &self.topic)
            .field("kafka_partition", &self.kafka_partition)
            .field("kafka_offset", &self.kafka_offset)
            .field("record_key", &format_args!("{}", key.as_deref().unwrap_or("None")))
            .field("event_type", &self.event_type)
            .field("payload", &format_args!("<{} bytes>", self.payload.len()))
            .finish()
    }
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
    /// Every setting is checked here ([invariant 12](crate::guarantees#i12)): one that cannot work is an
    /// [`Error::Config`](crate::Error::Config) naming it.
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

    /// Its tables.
    #[cfg(feature = "testing")]
    pub(crate) fn names(&self) -> &InboxNames {
        &self.names
    }

    /// Its handlers.
    #[cfg(feature = "testing")]
    pub(crate) fn handlers(&self) -> Arc<Handlers> {
        self.handlers.clone()
    }

    /// The pool its tables are in.
    #[cfg(feature = "testing")]
    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// This consumer's counters.
    pub fn stats(&self) -> Arc<InboxStats> {
        self.stats.clone()
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
    /// It returns early with [`Error::Inbox`](crate::Error::Inbox) when the consumer cannot go on: a record that
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
}

#[cfg(test)]
mod tests {
    use super::ParkedMessage;

    /// Logs never carry payloads: `Debug` gives the payload's length, and the key as text
    /// (or hex when it is not UTF-8), not byte arrays.
    #[test]
    fn a_parked_message_debugs_without_its_payload() {
        let mut message = ParkedMessage {
            id: 1,
            retry_requested: false,
            status: "parked".into(),
            reason: "handler failed".into(),
            topic: "orders".into(),
            kafka_partition: 0,
            kafka_offset: 7,
            record_key: Some(b"order-1".to_vec()),
            event_type: Some("order.confirmed".into()),
            payload: b"{\"card\":\"4111\"}".to_vec(),
        };
        let shown = format!("{message:?}");
        assert!(
            shown.contains("record_key: \"order-1\"") && shown.contains("payload: <15 bytes>"),
            "{shown}"
        );
        assert!(!shown.contains("4111") && !shown.contains("123,"), "{shown}");
        message.record_key = Some(vec![0xff, 0x00, 0x10]);
        assert!(format!("{message:?}").contains("record_key: 0xff0010"), "{message:?}");
        message.record_key = None;
        assert!(format!("{message:?}").contains("record_key: None"), "{message:?}");
    }
}
