//! `Harness::settle` cannot pass falsely: each way it once returned `Ok` while the
//! consumer had not applied what the service appended (an inbox subscribed to another
//! topic, a forgotten `Handlers::ignore` that parked one record and held the next), and a
//! timeout that did not say which event waited or why.

use std::time::Duration;

use outbox_runtime::inbox::{EventHandler, HandlerError, Handlers, Inbox, InboxConfig, Meta};
use outbox_runtime::relay::{Relay, RelayConfig};
use outbox_runtime::testing::{EmbeddedKafka, Harness};
use outbox_runtime::{Error, Outbox, OutboxEvent};
use outbox_tests::migrate;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

const INVOICES: &str = "outbox-test-harness-invoices";

#[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(
    event_type = "test.invoice_issued",
    schema_version = 2,
    aggregate = "invoice",
    topic = "outbox-test-harness-invoices"
)]
struct InvoiceIssued {
    #[outbox(aggregate_id)]
    invoice: String,
}

#[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(
    event_type = "test.invoice_paid",
    schema_version = 1,
    aggregate = "invoice",
    topic = "outbox-test-harness-invoices"
)]
struct InvoicePaid {
    #[outbox(aggregate_id)]
    invoice: String,
}

/// The same events on topics of their own per test: tests run in parallel against one
/// broker under `KAFKA_BROKERS`.
#[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(
    event_type = "test.invoice_voided",
    schema_version = 1,
    aggregate = "invoice",
    topic = "outbox-test-harness-voided"
)]
struct InvoiceVoided {
    #[outbox(aggregate_id)]
    invoice: String,
}

#[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(
    event_type = "test.invoice_missing",
    schema_version = 1,
    aggregate = "invoice",
    topic = "outbox-test-harness-never-created"
)]
struct InvoiceToNowhere {
    #[outbox(aggregate_id)]
    invoice: String,
}

/// Records each paid invoice.
struct Paid;

impl EventHandler<InvoicePaid> for Paid {
    async fn handle(&self, tx: &mut PgConnection, e: InvoicePaid, _: &Meta) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO paid (invoice) VALUES ($1)").bind(&e.invoice).execute(tx).await?;
        Ok(())
    }
}

impl EventHandler<InvoiceVoided> for Paid {
    async fn handle(&self, tx: &mut PgConnection, e: InvoiceVoided, m: &Meta) -> Result<(), HandlerError> {
        EventHandler::<InvoicePaid>::handle(self, tx, InvoicePaid { invoice: e.invoice }, m).await
    }
}

impl EventHandler<InvoiceToNowhere> for Paid {
    async fn handle(&self, tx: &mut PgConnection, e: InvoiceToNowhere, m: &Meta) -> Result<(), HandlerError> {
        EventHandler::<InvoicePaid>::handle(self, tx, InvoicePaid { invoice: e.invoice }, m).await
    }
}

async fn set_up(pool: &PgPool) -> Outbox {
    sqlx::query("CREATE TABLE paid (invoice text NOT NULL)").execute(pool).await.expect("paid");
    migrate(pool).await
}

fn relay(pool: &PgPool, outbox: &Outbox, kafka: &EmbeddedKafka) -> Relay {
    let config = RelayConfig::new(kafka.bootstrap()).poll_interval(Duration::from_millis(100));
    Relay::new(pool.clone(), outbox.clone(), config).expect("relay")
}

async fn inbox(pool: &PgPool, kafka: &EmbeddedKafka, topic: &str, handlers: Handlers) -> Inbox {
    let consumer = format!("harness-{}", Uuid::new_v4().simple());
    let config =
        InboxConfig::new(consumer, kafka.bootstrap(), [topic]).shutdown_timeout(Duration::from_secs(2));
    let inbox = Inbox::new(pool.clone(), config, handlers).expect("inbox");
    inbox.migrator().run(pool).await.expect("inbox migrations");
    inbox
}

async fn append<E: OutboxEvent + Serialize>(pool: &PgPool, outbox: &Outbox, events: &[E]) -> Vec<Uuid> {
    let mut tx = pool.begin().await.expect("begin");
    let mut ids = Vec::new();
    for event in events {
        ids.push(outbox.append(&mut tx, event).await.expect("append"));
    }
    tx.commit().await.expect("commit");
    ids
}

fn problem(result: outbox_runtime::Result<impl std::fmt::Debug>) -> String {
    match result {
        Err(error @ Error::NotSettled { .. }) => {
            eprintln!("settle said: {error}");
            error.to_string()
        }
        other => panic!("settle must fail, naming the event: {other:?}"),
    }
}

/// The inbox reads `...-invoice`, the events go to `...-invoices`: nothing is consumed,
/// and settle used to say `Ok(Settled { published: 2, consumed: 0 })`.
#[sqlx::test(migrations = false)]
async fn an_inbox_on_another_topic_fails_settle_naming_the_event_and_the_topics(pool: PgPool) {
    let outbox = set_up(&pool).await;
    let kafka = EmbeddedKafka::from_env().expect("broker");
    let typo = "outbox-test-harness-invoice";
    for topic in [INVOICES, typo] {
        kafka.create_topic(topic, 2).await.expect("topic");
    }
    let inbox = inbox(&pool, &kafka, typo, Handlers::new().on::<InvoicePaid, _>(Paid)).await;
    let mut harness = Harness::start(relay(&pool, &outbox, &kafka), inbox).expect("harness");
    let ids = append(&pool, &outbox, &[InvoicePaid { invoice: "inv-1".into() }]).await;

    let message = problem(harness.settle_within(Duration::from_secs(20)).await);
    assert!(message.contains(&ids[0].to_string()), "names the event id: {message}");
    assert!(message.contains("test.invoice_paid"), "names its type: {message}");
    assert!(
        message.contains(&format!("goes to topic {INVOICES}, which no inbox under test reads")),
        "names the topic: {message}"
    );
    assert!(message.contains(&format!("reads {typo}")), "and what the inbox reads: {message}");
    let _ = harness.stop().await;
}

/// No handler and no `ignore` for `test.invoice_issued`: the first record of the key is
/// parked, the next one held; settle used to return `Ok` with both counted as consumed.
#[sqlx::test(migrations = false)]
async fn a_forgotten_ignore_fails_settle_naming_the_parked_and_the_held_event(pool: PgPool) {
    let outbox = set_up(&pool).await;
    let kafka = EmbeddedKafka::from_env().expect("broker");
    kafka.create_topic(INVOICES, 2).await.expect("topic");
    let inbox = inbox(&pool, &kafka, INVOICES, Handlers::new().on::<InvoicePaid, _>(Paid)).await;
    let mut harness = Harness::start(relay(&pool, &outbox, &kafka), inbox).expect("harness");
    let invoice = format!("inv-{}", Uuid::new_v4().simple());
    let issued = append(&pool, &outbox, &[InvoiceIssued { invoice: invoice.clone() }]).await;
    let paid = append(&pool, &outbox, &[InvoicePaid { invoice: invoice.clone() }]).await;

    let message = problem(harness.settle_within(Duration::from_secs(20)).await);
    assert!(message.contains(&issued[0].to_string()), "names the parked event: {message}");
    assert!(message.contains("was parked by inbox"), "{message}");
    assert!(message.contains("no handler for event type test.invoice_issued version 2"), "{message}");
    assert!(message.contains(&paid[0].to_string()), "names the held event: {message}");
    assert!(message.contains("was held by inbox"), "{message}");
    let _ = harness.stop().await;
}

/// A topic that does not exist: the relay knows why the event waits, and the timeout
/// says it (it used to say "1 event(s) not yet published" and nothing else). A mock
/// cluster of its own: a real broker may create topics on first use.
#[sqlx::test(migrations = false)]
async fn a_timeout_names_each_waiting_event_and_the_relays_last_error(pool: PgPool) {
    let outbox = set_up(&pool).await;
    let kafka = EmbeddedKafka::start().expect("broker");
    let topic = InvoiceToNowhere::TOPIC;
    let inbox = inbox(&pool, &kafka, topic, Handlers::new().on::<InvoiceToNowhere, _>(Paid)).await;
    // The mock cluster creates a topic on first use unless the client says not to.
    let config = RelayConfig::new(kafka.bootstrap())
        .poll_interval(Duration::from_millis(100))
        .kafka_setting("allow.auto.create.topics", "false");
    let relay = Relay::new(pool.clone(), outbox.clone(), config).expect("relay");
    let mut harness = Harness::start(relay, inbox).expect("harness");
    let ids = append(&pool, &outbox, &[InvoiceToNowhere { invoice: "inv-9".into() }]).await;

    let message = problem(harness.settle_within(Duration::from_secs(5)).await);
    assert!(message.contains(&ids[0].to_string()), "names the event id: {message}");
    assert!(message.contains("test.invoice_missing"), "names its type: {message}");
    assert!(message.contains(&format!("topic {topic}")), "names the topic: {message}");
    assert!(message.contains("does not exist"), "gives the relay's last error: {message}");
    let _ = harness.stop().await;
}

/// What may pass does: two inboxes sharing one table read one topic, one applying and
/// one ignoring on purpose, and a topic declared unconsumed needs only publishing.
#[sqlx::test(migrations = false)]
async fn applied_ignored_and_declared_unconsumed_events_settle_and_are_counted(pool: PgPool) {
    let outbox = set_up(&pool).await;
    let kafka = EmbeddedKafka::from_env().expect("broker");
    for topic in [INVOICES, InvoiceVoided::TOPIC] {
        kafka.create_topic(topic, 2).await.expect("topic");
    }
    let applies =
        inbox(&pool, &kafka, InvoiceVoided::TOPIC, Handlers::new().on::<InvoiceVoided, _>(Paid)).await;
    let ignores =
        inbox(&pool, &kafka, InvoiceVoided::TOPIC, Handlers::new().ignore("test.invoice_voided")).await;
    let ignoring = ignores.stats();
    let mut harness = Harness::builder(relay(&pool, &outbox, &kafka))
        .inbox(applies)
        .inbox(ignores)
        .unconsumed_topic(INVOICES)
        .start()
        .expect("harness");
    let run = Uuid::new_v4().simple().to_string();
    append(
        &pool,
        &outbox,
        &[InvoiceVoided { invoice: format!("{run}-1") }, InvoiceVoided { invoice: format!("{run}-2") }],
    )
    .await;
    append(&pool, &outbox, &[InvoiceIssued { invoice: format!("{run}-3") }]).await;

    let settled = harness.settle_within(Duration::from_secs(30)).await.expect("settles");
    assert_eq!(
        (settled.published, settled.unconsumed, settled.consumed, settled.applied, settled.ignored),
        (3, 1, 4, 2, 2),
        "{settled:?}"
    );
    let paid: i64 = sqlx::query_scalar("SELECT count(*) FROM paid WHERE invoice LIKE $1")
        .bind(format!("{run}-%"))
        .fetch_one(&pool)
        .await
        .expect("count");
    assert_eq!(paid, 2, "applied once each, by the inbox that applies");
    assert!(ignoring.ignored() >= 2, "the other inbox ignored them: {ignoring:?}");
    harness.stop().await.expect("stops cleanly");
}

/// A relay whose cleanup would delete published events before the inboxes consume them
/// is refused when the harness starts; and an event purged while settle waits for it
/// fails settle, naming it, instead of vanishing into `Ok(Settled::default())`.
#[sqlx::test(migrations = false)]
async fn an_event_deleted_before_its_outcome_fails_settle(pool: PgPool) {
    struct Slow;
    impl EventHandler<InvoiceVoided> for Slow {
        async fn handle(&self, _: &mut PgConnection, _: InvoiceVoided, _: &Meta) -> Result<(), HandlerError> {
            tokio::time::sleep(Duration::from_secs(4)).await;
            Ok(())
        }
    }
    let outbox = set_up(&pool).await;
    let kafka = EmbeddedKafka::start().expect("broker");
    kafka.create_topic(InvoiceVoided::TOPIC, 1).await.expect("topic");
    let quick_cleanup = RelayConfig::new(kafka.bootstrap()).cleanup(
        outbox_runtime::relay::Cleanup::default().retention(Duration::ZERO).interval(Duration::from_secs(1)),
    );
    let relay = Relay::new(pool.clone(), outbox.clone(), quick_cleanup).expect("relay");
    let handlers = || Handlers::new().on::<InvoiceVoided, _>(Slow);
    let inbox_a = inbox(&pool, &kafka, InvoiceVoided::TOPIC, handlers()).await;
    let refused = Harness::start(relay, inbox_a).expect_err("a cleanup shorter than the settle timeout");
    assert!(
        refused.to_string().contains("cleanup retention (0ns) is shorter than the harness's settle timeout"),
        "{refused}"
    );

    let inbox_b = inbox(&pool, &kafka, InvoiceVoided::TOPIC, handlers()).await;
    let mut harness =
        Harness::start(relay_without_cleanup(&pool, &outbox, &kafka), inbox_b).expect("harness");
    let ids = append(&pool, &outbox, &[InvoiceVoided { invoice: "inv-7".into() }]).await;
    // An operator's purge, once the relay published it and while the handler is busy.
    let purger = {
        let (pool, outbox) = (pool.clone(), outbox.clone());
        tokio::spawn(async move {
            while outbox_tests::rows_in(&pool, "published").await == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            outbox.ops().purge(&pool, Duration::ZERO, 100, |_| {}).await.expect("purge")
        })
    };
    let message = problem(harness.settle_within(Duration::from_secs(20)).await);
    assert_eq!(purger.await.expect("purger"), 1);
    assert!(message.contains(&ids[0].to_string()), "names the event: {message}");
    assert!(
        message.contains("was deleted from the outbox (cleanup or purge) before it had its outcome"),
        "{message}"
    );
    let _ = harness.stop().await;
}

fn relay_without_cleanup(pool: &PgPool, outbox: &Outbox, kafka: &EmbeddedKafka) -> Relay {
    let config = RelayConfig::new(kafka.bootstrap()).poll_interval(Duration::from_millis(100)).cleanup(None);
    Relay::new(pool.clone(), outbox.clone(), config).expect("relay")
}
