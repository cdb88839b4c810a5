//! `outbox_runtime::testing`: the harness a service's own tests use, as the README shows it.

use std::time::Duration;

use outbox_runtime::inbox::{EventHandler, HandlerError, Handlers, Inbox, InboxConfig, Meta};
use outbox_runtime::relay::{Relay, RelayConfig};
use outbox_runtime::testing::{EmbeddedKafka, Harness};
use outbox_runtime::{Error, OutboxEvent};
use outbox_tests::migrate;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

#[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(
    event_type = "test.harness_step",
    schema_version = 1,
    aggregate = "test",
    topic = "outbox-test-harness"
)]
struct Step {
    #[outbox(aggregate_id)]
    run: String,
    n: i64,
}

/// The same on a topic of its own: tests run in parallel against one broker under
/// `KAFKA_BROKERS`, and an inbox reading from the start of a shared topic would apply the
/// other test's events too.
#[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(
    event_type = "test.harness_slow_step",
    schema_version = 1,
    aggregate = "test",
    topic = "outbox-test-harness-slow"
)]
struct SlowStep {
    #[outbox(aggregate_id)]
    run: String,
    n: i64,
}

/// Records each step, slowly: a settle that returned before the inbox was done would
/// find fewer rows than were appended.
struct Record {
    delay: Duration,
}

impl EventHandler<Step> for Record {
    async fn handle(&self, tx: &mut PgConnection, step: Step, _: &Meta) -> Result<(), HandlerError> {
        tokio::time::sleep(self.delay).await;
        sqlx::query("INSERT INTO steps (run, n) VALUES ($1, $2)")
            .bind(&step.run)
            .bind(step.n)
            .execute(tx)
            .await?;
        Ok(())
    }
}

impl EventHandler<SlowStep> for Record {
    async fn handle(&self, tx: &mut PgConnection, step: SlowStep, meta: &Meta) -> Result<(), HandlerError> {
        EventHandler::<Step>::handle(self, tx, Step { run: step.run, n: step.n }, meta).await
    }
}

async fn harness(
    pool: &PgPool,
    topic: &'static str,
    delay: Duration,
    shutdown: Duration,
) -> (EmbeddedKafka, outbox_runtime::Outbox, Harness) {
    sqlx::query("CREATE TABLE steps (run text NOT NULL, n bigint NOT NULL)")
        .execute(pool)
        .await
        .expect("steps");
    let outbox = migrate(pool).await;
    // KAFKA_BROKERS when set (CI runs this against Tansu too), else the embedded broker.
    let kafka = EmbeddedKafka::from_env().expect("broker");
    kafka.create_topic(topic, 3).await.expect("topic");
    let relay = Relay::new(
        pool.clone(),
        outbox.clone(),
        RelayConfig::new(kafka.bootstrap()).poll_interval(Duration::from_millis(100)),
    )
    .expect("relay");
    let consumer = format!("harness-{}", Uuid::new_v4().simple());
    let config = InboxConfig::new(consumer, kafka.bootstrap(), [topic]).shutdown_timeout(shutdown);
    let handlers = Handlers::new().on::<Step, _>(Record { delay }).on::<SlowStep, _>(Record { delay });
    let inbox = Inbox::new(pool.clone(), config, handlers).expect("inbox");
    inbox.migrator().run(pool).await.expect("inbox migrations");
    let harness = Harness::start(relay, inbox).expect("harness");
    (kafka, outbox, harness)
}

async fn append(pool: &PgPool, outbox: &outbox_runtime::Outbox, run: &str, steps: std::ops::Range<i64>) {
    let mut tx = pool.begin().await.expect("begin");
    for n in steps {
        outbox.append(&mut tx, &Step { run: run.to_owned(), n }).await.expect("append");
    }
    tx.commit().await.expect("commit");
}

async fn recorded(pool: &PgPool, run: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM steps WHERE run = $1")
        .bind(run)
        .fetch_one(pool)
        .await
        .expect("count")
}

#[sqlx::test(migrations = false)]
async fn settle_returns_once_everything_appended_so_far_is_applied(pool: PgPool) {
    let (_kafka, outbox, mut harness) =
        harness(&pool, Step::TOPIC, Duration::from_millis(20), Duration::from_secs(5)).await;
    let run = Uuid::new_v4().simple().to_string();
    append(&pool, &outbox, &run, 0..5).await;
    // A rolled-back append is not waited for.
    let mut tx = pool.begin().await.expect("begin");
    outbox.append(&mut tx, &Step { run: run.clone(), n: 99 }).await.expect("append");
    tx.rollback().await.expect("rollback");

    let settled = harness.settle().await.expect("settles");
    assert_eq!((settled.published, settled.applied, settled.consumed), (5, 5, 5), "{settled:?}");
    assert_eq!(recorded(&pool, &run).await, 5, "every event is applied when settle returns");

    append(&pool, &outbox, &run, 5..8).await;
    let settled = harness.settle().await.expect("settles again");
    assert_eq!((settled.published, settled.applied, settled.ignored), (8, 8, 0), "{settled:?}");
    assert_eq!(recorded(&pool, &run).await, 8);
    assert_eq!(harness.inbox_stats().applied(), 8);
    assert_eq!(harness.inbox_stats().parked(), 0);
    harness.stop().await.expect("stops cleanly");
}

#[sqlx::test(migrations = false)]
async fn settle_gives_up_naming_what_is_still_waiting(pool: PgPool) {
    // A handler slower than the timeout: settle must not report success.
    let (_kafka, outbox, mut harness) =
        harness(&pool, SlowStep::TOPIC, Duration::from_secs(60), Duration::from_millis(200)).await;
    let run = Uuid::new_v4().simple().to_string();
    let mut tx = pool.begin().await.expect("begin");
    for n in 0..2 {
        outbox.append(&mut tx, &SlowStep { run: run.clone(), n }).await.expect("append");
    }
    tx.commit().await.expect("commit");
    let err = harness.settle_within(Duration::from_secs(3)).await.expect_err("cannot settle");
    let Error::NotSettled { waiting, .. } = &err else { panic!("{err:?}") };
    assert!(waiting.starts_with("2 event(s) still waiting: event "), "names the events waiting: {err}");
    assert!(
        waiting.contains("not yet published") || waiting.contains("not yet consumed by inbox `harness-"),
        "and what each waits for: {err}"
    );
    assert_eq!(recorded(&pool, &run).await, 0);
    harness.stop().await.expect("stops within the shutdown timeout");
}
