//! Operating the pipeline end to end: reconcile compares the outbox with a real consumer's
//! inbox, and replay republishes with the original event ids, absorbed by the inbox.

use std::time::{Duration, SystemTime};

use outbox_runtime::inbox::{EventHandler, HandlerError, Handlers, Inbox, InboxConfig, Meta};
use outbox_runtime::ops::{InboxSide, ReplayFilter};
use outbox_runtime::relay::{Relay, RelayConfig};
use outbox_runtime::{AppendOptions, NewEvent, OutboxEvent};
use outbox_tests::kafka::Kafka;
use outbox_tests::{eventually, migrate, rows_in};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Only this file uses the topic, so no other test's events reach its consumer.
#[derive(Debug, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "test.deposit", schema_version = 1, aggregate = "account", topic = "outbox-test-ops")]
struct Deposit {
    #[outbox(aggregate_id)]
    account: String,
    amount: i64,
}

#[derive(Clone)]
struct Ledger;

impl EventHandler<Deposit> for Ledger {
    async fn handle(&self, tx: &mut PgConnection, d: Deposit, meta: &Meta) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO deposits (event_id, account, amount) VALUES ($1, $2, $3)")
            .bind(meta.event_id)
            .bind(&d.account)
            .bind(d.amount)
            .execute(tx)
            .await?;
        Ok(())
    }
}

async fn deposits(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM deposits").fetch_one(pool).await.expect("count")
}

#[sqlx::test(migrations = false)]
async fn reconcile_finds_a_removed_inbox_row_and_replay_is_absorbed_by_the_inbox(pool: PgPool) {
    let outbox = migrate(&pool).await;
    sqlx::query(
        "CREATE TABLE deposits (event_id uuid PRIMARY KEY, account text NOT NULL, amount bigint NOT NULL)",
    )
    .execute(&pool)
    .await
    .expect("deposits");
    let kafka = Kafka::start();
    kafka.create_topic(Deposit::TOPIC, 2).await;
    let events: Vec<NewEvent> = (0..20)
        .map(|i| {
            let deposit = Deposit { account: format!("acc-{}", i % 4), amount: i };
            NewEvent::new(&deposit, AppendOptions::default().aggregate_version(i / 4 + 1)).expect("event")
        })
        .collect();
    let mut tx = pool.begin().await.expect("begin");
    outbox.append_batch(&mut tx, &events).await.expect("append");
    tx.commit().await.expect("commit");

    let stop = CancellationToken::new();
    let relay = Relay::new(
        pool.clone(),
        outbox.clone(),
        RelayConfig::new(kafka.bootstrap()).poll_interval(Duration::from_millis(100)),
    )
    .expect("relay");
    let relay_task = tokio::spawn(relay.run(stop.clone()));
    let config = InboxConfig::new("ledger", kafka.bootstrap(), [Deposit::TOPIC])
        .commit_interval(Duration::from_millis(100));
    let inbox = Inbox::new(pool.clone(), config, Handlers::new().on::<Deposit, _>(Ledger)).expect("inbox");
    inbox.migrator().run(&pool).await.expect("inbox tables");
    let stats = inbox.stats();
    let inbox_task = tokio::spawn(inbox.run(stop.clone()));
    assert!(
        eventually(Duration::from_secs(60), || async { deposits(&pool).await == 20 }).await,
        "all applied"
    );

    let hour = Duration::from_secs(3600);
    let (since, until) = (SystemTime::now() - hour, SystemTime::now() + hour);
    let side = InboxSide::new(pool.clone(), "public", "inbox", "ledger").expect("side");
    let clean = outbox.reconcile(&pool, since, until, Some(&side)).await.expect("reconcile");
    assert_eq!(clean.differences, 0, "{clean:?}");
    let total = |f: fn(&outbox_runtime::ops::ReconciliationRow) -> i64| clean.rows.iter().map(f).sum::<i64>();
    assert_eq!(
        (total(|r| r.appended), total(|r| r.published), total(|r| r.applied.unwrap_or(0))),
        (20, 20, 20)
    );

    // Replay one account: its 5 events go out again with their ids and are absorbed.
    let filter = ReplayFilter { aggregate_id: Some("acc-1".into()), ..ReplayFilter::default() };
    let report = outbox.replay(&pool, &filter, false).await.expect("replay");
    assert_eq!((report.matched, report.replayed), (5, 5));
    assert!(
        eventually(Duration::from_secs(60), || async {
            rows_in(&pool, "published").await == 20 && stats.duplicates() == 5
        })
        .await,
        "republished and absorbed: duplicates {}",
        stats.duplicates()
    );
    assert_eq!(deposits(&pool).await, 20, "each deposit applied once");
    assert_eq!(stats.applied(), 20);

    // Fault: one applied event's inbox row disappears. Reconcile names it and only it.
    let removed: Uuid = sqlx::query_scalar(
        "DELETE FROM inbox WHERE event_id = (SELECT event_id FROM outbox WHERE id = 7) RETURNING event_id",
    )
    .fetch_one(&pool)
    .await
    .expect("remove");
    let found = outbox.reconcile(&pool, since, until, Some(&side)).await.expect("reconcile");
    assert_eq!(found.differences, 1, "{found:?}");
    let missing: Vec<Uuid> = found.rows.iter().flat_map(|r| r.not_applied_ids.clone()).collect();
    assert_eq!(missing, [removed]);

    stop.cancel();
    relay_task.await.expect("task").expect("relay");
    inbox_task.await.expect("task").expect("inbox");
}

/// Fault: a replay of 200,000 published rows while a relay runs and republishes them as
/// fast as it can. Before the fix each replay batch re-selected published rows from the
/// lowest id, so rows the relay had just republished matched again (232,000 to 256,000
/// replayed, one row eight times) and the loop had no bound with a fast relay. Now the set
/// is fixed at the start: each row is replayed, and republished, exactly once.
#[sqlx::test(migrations = false)]
async fn a_replay_with_a_relay_running_replays_each_row_exactly_once(pool: PgPool) {
    let rows: i64 = std::env::var("OUTBOX_REPLAY_ROWS").ok().and_then(|s| s.parse().ok()).unwrap_or(200_000);
    // A mock cluster of its own whatever KAFKA_BROKERS says: this is about the database side,
    // and 400,000 records would flood a slow broker (Tansu serves new groups slowly after).
    let kafka = Kafka::mock();
    kafka.create_topic("replay-test", 4).await;
    let outbox = migrate(&pool).await;
    sqlx::query(
        "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, \
                             topic, payload, status, published_at, attempts) \
         SELECT gen_random_uuid(), 'test', 'agg-' || (n % 1000), n, 'test.step', 1, 'replay-test', \
                '{\"n\":1}', 'published', now() - interval '1 hour', 1 \
         FROM generate_series(1, $1) n",
    )
    .bind(rows)
    .execute(&pool)
    .await
    .expect("published rows");
    let relay = Relay::new(pool.clone(), outbox.clone(), RelayConfig::new(kafka.bootstrap())).expect("relay");
    let stop = CancellationToken::new();
    let task = tokio::spawn(relay.run(stop.clone()));
    let report = outbox.replay(&pool, &ReplayFilter::default(), false).await.expect("replay");
    assert_eq!(report.replayed, rows.unsigned_abs(), "each row replayed once: {report:?}");
    // Statistics for the new backlog, so that the relay's marks get their index plans
    // (plans on stale statistics are issue 13's matter, not this test's).
    sqlx::query("ANALYZE outbox").execute(&pool).await.expect("analyze");
    let republished =
        eventually(Duration::from_secs(300), || async { rows_in(&pool, "published").await == rows }).await;
    stop.cancel();
    task.await.expect("relay task").expect("relay");
    assert!(republished, "published again: {} of {rows}", rows_in(&pool, "published").await);
    let not_twice: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox WHERE attempts <> 2")
        .fetch_one(&pool)
        .await
        .expect("attempts");
    assert_eq!(not_twice, 0, "every row was sent exactly once more");
}
