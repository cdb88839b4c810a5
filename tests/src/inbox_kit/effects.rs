//! The set-up of `tests/tests/inbox_robust.rs`, `inbox_neighbours.rs` and
//! `inbox_batches.rs`: an `effects` table written by [`Ledger`], credits produced raw
//! ([`RawProducer`]) to the partitions the tests choose.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::inbox::{EventHandler, HandlerError, Handlers, Inbox, InboxConfig, Meta};
use outbox_runtime::OutboxEvent;
use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::Running;
use crate::events::event_headers;
use crate::kafka::Kafka;
use crate::raw::{RawProducer, RawRecord};
use crate::Credit;

/// Records every application in `effects`; credits to account `slow` wait for the gate.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    /// Credits to account `slow` wait for a permit here.
    pub gate: Option<Arc<tokio::sync::Semaphore>>,
    /// Calls so far.
    pub calls: Arc<AtomicU32>,
}

impl EventHandler<Credit> for Ledger {
    async fn handle(&self, tx: &mut PgConnection, credit: Credit, meta: &Meta) -> Result<(), HandlerError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if let (Some(gate), "slow") = (&self.gate, credit.account.as_str()) {
            gate.acquire().await.expect("gate").forget();
        }
        sqlx::query("INSERT INTO effects (event_id, account, amount, kafka_partition, kafka_offset) VALUES ($1, $2, $3, $4, $5)")
            .bind(meta.event_id)
            .bind(&credit.account)
            .bind(credit.amount)
            .bind(meta.partition)
            .bind(meta.offset)
            .execute(&mut *tx)
            .await?;
        Ok(())
    }
}

/// A broker, a topic of the test's own, and a raw producer for it.
#[derive(Debug)]
pub struct Setup {
    /// The broker.
    pub kafka: Kafka,
    /// The topic.
    pub topic: String,
    /// A raw producer for it.
    pub producer: RawProducer,
}

/// Creates the `effects` table the [`Ledger`] writes.
pub async fn create_effects(pool: &PgPool) {
    sqlx::query(
        "CREATE TABLE effects (event_id uuid NOT NULL, account text NOT NULL, amount bigint NOT NULL, \
         kafka_partition integer NOT NULL, kafka_offset bigint NOT NULL)",
    )
    .execute(pool)
    .await
    .expect("effects");
}

/// Creates the `effects` table, starts the broker and a topic of `partitions`.
pub async fn setup(pool: &PgPool, partitions: i32) -> Setup {
    create_effects(pool).await;
    let kafka = Kafka::start();
    let topic = format!("robust-{}", Uuid::new_v4().simple());
    kafka.create_topic(&topic, partitions).await;
    let producer = RawProducer::new(kafka.bootstrap());
    Setup { kafka, topic, producer }
}

/// The headers of credit `id`.
pub fn credit_headers(id: Uuid, subject: Option<&str>, version: Option<i64>) -> Vec<(String, String)> {
    event_headers(id, Credit::EVENT_TYPE, version, subject)
}

impl Setup {
    /// A well-formed credit on `partition`, keyed by its account.
    pub fn credit(&self, partition: i32, account: &str, amount: i64) -> Uuid {
        let id = Uuid::now_v7();
        let record = RawRecord::text(
            partition,
            account,
            &Credit::json(account, amount),
            &credit_headers(id, Some(account), None),
        );
        self.producer.send(&self.topic, &record);
        id
    }

    /// Consumer `consumer` of the topic: quick backoff (20-100 ms) and commits (100 ms).
    pub fn config(&self, consumer: &str) -> InboxConfig {
        InboxConfig::new(consumer, self.kafka.bootstrap(), [self.topic.clone()])
            .backoff(Duration::from_millis(20), Duration::from_millis(100))
            .commit_interval(Duration::from_millis(100))
    }
}

/// Migrates and starts an inbox applying credits with `ledger`.
pub async fn start(pool: &PgPool, config: InboxConfig, ledger: &Ledger) -> Running {
    start_with(pool, config, ledger.clone()).await
}

/// Migrates and starts an inbox applying credits with `handler`.
pub async fn start_with<H: EventHandler<Credit> + Clone>(
    pool: &PgPool,
    config: InboxConfig,
    handler: H,
) -> Running {
    let inbox = Inbox::new(pool.clone(), config, Handlers::new().on::<Credit, _>(handler)).expect("inbox");
    inbox.migrator().run(pool).await.expect("migrate");
    let stats = inbox.stats();
    let stop = CancellationToken::new();
    let task = tokio::spawn(inbox.run(stop.clone()));
    Running { stop, task, stats }
}

/// The amounts in `effects`, in order.
pub async fn applied_amounts(pool: &PgPool) -> Vec<i64> {
    sqlx::query_scalar("SELECT amount FROM effects ORDER BY amount").fetch_all(pool).await.expect("effects")
}

/// The parked table's rows: offset, status and reason.
pub async fn parked(pool: &PgPool) -> Vec<(i64, String, String)> {
    sqlx::query_as("SELECT kafka_offset, status, reason FROM inbox_parked ORDER BY kafka_offset")
        .fetch_all(pool)
        .await
        .expect("parked")
}
