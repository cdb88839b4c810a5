//! The set-up of `tests/tests/inbox.rs` and `inbox_operator.rs`: a `credits` table written
//! by [`Ledger`], credits produced through rdkafka to a topic of 3 partitions.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::inbox::{EventHandler, HandlerError, Handlers, Inbox, InboxConfig, Meta};
use outbox_runtime::schema_registry::framing::SchemaRef;
use outbox_runtime::OutboxEvent;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::Running;
use crate::events::event_headers;
use crate::kafka::Kafka;
use crate::Credit;

/// An event handled, and the registry schema its record named, if any.
pub type SchemaSeen = (Uuid, Option<SchemaRef>);

/// Applies credits to a `credits` table. Fails transiently `fail_first` times, and
/// permanently for accounts listed in `blocked_accounts`.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    /// Transient failures still to come.
    pub fail_first: Arc<AtomicU32>,
    /// Calls so far.
    pub calls: Arc<AtomicU32>,
    /// Credits to account `slow` wait for a permit here.
    pub gate: Option<Arc<tokio::sync::Semaphore>>,
    /// Each event handled, with the registry schema its record named (a frame or the
    /// `__value_schema_id` header), if any.
    pub schemas: Arc<std::sync::Mutex<Vec<SchemaSeen>>>,
}

impl EventHandler<Credit> for Ledger {
    async fn handle(&self, tx: &mut PgConnection, credit: Credit, meta: &Meta) -> Result<(), HandlerError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.schemas.lock().expect("schemas").push((meta.event_id, meta.registry_schema));
        if let (Some(gate), "slow") = (&self.gate, credit.account.as_str()) {
            gate.acquire().await.expect("gate").forget();
        }
        if credit.account == "panic" {
            panic!("the ledger cannot take account {}", credit.account);
        }
        // Written before any failure: a rollback must take it away.
        sqlx::query("INSERT INTO credits (event_id, account, amount) VALUES ($1, $2, $3)")
            .bind(meta.event_id)
            .bind(&credit.account)
            .bind(credit.amount)
            .execute(&mut *tx)
            .await?;
        if self.fail_first.load(Ordering::SeqCst) > 0 {
            self.fail_first.fetch_sub(1, Ordering::SeqCst);
            return Err(HandlerError::transient("the ledger is busy"));
        }
        let blocked: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM blocked_accounts WHERE account = $1)")
                .bind(&credit.account)
                .fetch_one(&mut *tx)
                .await?;
        if blocked {
            return Err(HandlerError::permanent(format!("account {} is blocked", credit.account)));
        }
        Ok(())
    }
}

/// A broker, a topic of the test's own, and a producer for it.
#[allow(missing_debug_implementations)] // rdkafka's FutureProducer is not Debug
pub struct Setup {
    /// The broker.
    pub kafka: Kafka,
    /// The topic, of 3 partitions.
    pub topic: String,
    /// A producer for it.
    pub producer: FutureProducer,
}

/// Creates the `credits` and `blocked_accounts` tables, starts the broker and the topic.
pub async fn setup(pool: &PgPool) -> Setup {
    sqlx::query(
        "CREATE TABLE credits (event_id uuid NOT NULL, account text NOT NULL, amount bigint NOT NULL)",
    )
    .execute(pool)
    .await
    .expect("credits");
    sqlx::query("CREATE TABLE blocked_accounts (account text PRIMARY KEY)")
        .execute(pool)
        .await
        .expect("blocked");
    let kafka = Kafka::start();
    let topic = format!("inbox-{}", Uuid::new_v4().simple());
    kafka.create_topic(&topic, 3).await;
    let producer =
        ClientConfig::new().set("bootstrap.servers", kafka.bootstrap()).create().expect("producer");
    Setup { kafka, topic, producer }
}

impl Setup {
    /// Produces a record with text headers, on the partition of its key.
    pub async fn produce(&self, key: &str, payload: &[u8], headers: &[(String, String)]) {
        self.produce_to(None, key, payload, headers).await;
    }

    /// Produces a record with text headers to `partition`, or to the partition of its key.
    pub async fn produce_to(
        &self,
        partition: Option<i32>,
        key: &str,
        payload: &[u8],
        headers: &[(String, String)],
    ) {
        let mut owned = OwnedHeaders::new();
        for (k, v) in headers {
            owned = owned.insert(Header { key: k, value: Some(v.as_bytes()) });
        }
        let mut record = FutureRecord::to(&self.topic).key(key.as_bytes()).payload(payload).headers(owned);
        if let Some(p) = partition {
            record = record.partition(p);
        }
        self.producer.send(record, Duration::from_secs(10)).await.expect("produce");
    }

    /// Produces a well-formed credit; returns its event id.
    pub async fn credit(&self, account: &str, amount: i64, version: Option<i64>) -> Uuid {
        let id = Uuid::now_v7();
        let headers = event_headers(id, Credit::EVENT_TYPE, version, Some(account));
        self.produce(account, &Credit::json(account, amount), &headers).await;
        id
    }

    /// Consumer `consumer` of the topic; backoff 50-400 ms, commits every 100 ms.
    pub fn config(&self, consumer: &str) -> InboxConfig {
        InboxConfig::new(consumer, self.kafka.bootstrap(), [self.topic.clone()])
            .backoff(Duration::from_millis(50), Duration::from_millis(400))
            .commit_interval(Duration::from_millis(100))
    }
}

/// Migrates and starts an inbox with `ledger` for credits (ignoring `test.audit`); returns
/// it running, and an inbox of the same settings for operator calls.
pub async fn start(pool: &PgPool, config: InboxConfig, ledger: &Ledger) -> (Running, Inbox) {
    let handlers = Handlers::new().on::<Credit, _>(ledger.clone()).ignore("test.audit");
    let inbox = Inbox::new(pool.clone(), config.clone(), handlers.clone()).expect("inbox");
    inbox.migrator().run(pool).await.expect("migrate");
    let operator = Inbox::new(pool.clone(), config, handlers).expect("inbox");
    let stats = inbox.stats();
    let stop = CancellationToken::new();
    let task = tokio::spawn(inbox.run(stop.clone()));
    (Running { stop, task, stats }, operator)
}

/// The credits applied, by amount.
pub async fn credits(pool: &PgPool) -> Vec<(String, i64)> {
    sqlx::query_as("SELECT account, amount FROM credits ORDER BY amount")
        .fetch_all(pool)
        .await
        .expect("credits")
}

/// The one number `sql` selects.
pub async fn count(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.expect("count")
}
