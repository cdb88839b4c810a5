//! A maintenance round that fails is counted, logged and tried again, never silently:
//! the relay's cleanup of published rows, and a consumer's maintenance of its dedup table
//! (partitions and cleanup). Each is made to fail by a trigger that refuses its
//! statements, then let through.

use std::collections::BTreeMap;
use std::time::Duration;

use outbox_runtime::inbox::{Handlers, Inbox, InboxConfig};
use outbox_runtime::relay::Cleanup;
use outbox_tests::kafka::Kafka;
use outbox_tests::metrics_kit::{snapshot, snapshotter};
use outbox_tests::{eventually, migrate_existing, rows_in, Step};
use sqlx::{AssertSqlSafe, PgPool};
use tokio_util::sync::CancellationToken;

/// Refuses the statements of the tables named in `refusing`: let through by a DELETE there,
/// not by dropping the triggers, whose locks can deadlock with the running relay's and
/// consumer's statements.
const REFUSE: &str = "CREATE TABLE refusing (relname text PRIMARY KEY); \
                      CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
                        IF EXISTS (SELECT 1 FROM refusing WHERE relname = TG_TABLE_NAME) THEN \
                          RAISE EXCEPTION 'refused by the test'; \
                        END IF; RETURN NULL; END $$";

/// Counters summed over snapshots (each snapshot drains them).
#[derive(Default)]
struct Counted(BTreeMap<String, f64>);

impl Counted {
    fn take(&mut self) -> &Self {
        for (name, values) in snapshot() {
            *self.0.entry(name).or_default() += values.iter().sum::<f64>();
        }
        self
    }

    fn get(&self, name: &str) -> f64 {
        self.0.get(name).copied().unwrap_or(0.0)
    }
}

async fn run(pool: &PgPool, statement: &str) {
    sqlx::raw_sql(AssertSqlSafe(statement.to_owned())).execute(pool).await.expect(statement);
}

// One test: the recorder is global to this binary, and two tests at once would drain each
// other's counters.
#[sqlx::test(migrations = false)]
async fn failed_maintenance_rounds_are_counted_and_the_next_round_tries_again(pool: PgPool) {
    snapshotter();
    let kafka = Kafka::start();
    // A plain outbox: a partitioned one also lets old rows go by dropping their partition,
    // which no DELETE trigger refuses.
    let outbox = migrate_existing(&pool).await;
    run(&pool, REFUSE).await;

    // The relay's cleanup: 3 events published 8 days ago, each cleanup round refused.
    let mut tx = pool.begin().await.expect("begin");
    for n in 1..=3 {
        outbox.append(&mut tx, &Step { id: "m".into(), n, data: String::new() }).await.expect("append");
    }
    tx.commit().await.expect("commit");
    run(&pool, "UPDATE outbox SET status = 'published', published_at = now() - interval '8 days'").await;
    run(
        &pool,
        "INSERT INTO refusing VALUES ('outbox'); \
         CREATE TRIGGER refuse_delete BEFORE DELETE ON outbox FOR EACH STATEMENT EXECUTE FUNCTION refuse()",
    )
    .await;
    let config =
        outbox_tests::running::quick(&kafka).cleanup(Cleanup::default().interval(Duration::from_secs(1)));
    let relay = outbox_tests::running::start(&pool, &outbox, config);
    let mut counted = Counted::default();
    let counted_twice = eventually(Duration::from_secs(20), || {
        let errors = counted.take().get("outbox_cleanup_errors_total");
        async move { errors >= 2.0 }
    })
    .await;
    assert!(
        counted_twice,
        "two refused cleanup rounds counted: {}",
        counted.get("outbox_cleanup_errors_total")
    );
    assert_eq!(rows_in(&pool, "published").await, 3, "a refused round deleted nothing");
    run(&pool, "DELETE FROM refusing").await;
    let cleaned =
        eventually(Duration::from_secs(20), || async { rows_in(&pool, "published").await == 0 }).await;
    relay.shutdown().await;
    assert!(cleaned, "the next round deletes them: {} left", rows_in(&pool, "published").await);

    // A consumer's maintenance: its registration (every partitions round) and its deletes
    // of expired dedup rows (every cleanup round, from the legacy, foreign and default
    // partitions) refused.
    let topic = format!("outbox-test-maintenance-{}", uuid::Uuid::new_v4().simple());
    kafka.create_topic(&topic, 1).await;
    let inbox = Inbox::new(
        pool.clone(),
        InboxConfig::new("maintenance", kafka.bootstrap(), [topic.as_str()])
            .dedup_retention(Duration::from_secs(1))
            .cleanup_interval(Duration::from_secs(1)),
        Handlers::new().ignore("test.step"),
    )
    .expect("inbox");
    inbox.migrator().run(&pool).await.expect("inbox tables");
    let partitions: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
         WHERE i.inhparent = 'inbox'::regclass",
    )
    .fetch_all(&pool)
    .await
    .expect("partitions");
    assert!(partitions.iter().any(|p| p.ends_with("_default")), "a default partition: {partitions:?}");
    let refused: Vec<(String, &str)> = std::iter::once(("inbox_consumers".to_owned(), "INSERT OR UPDATE"))
        .chain(partitions.into_iter().map(|p| (p, "DELETE")))
        .collect();
    for (table, events) in &refused {
        run(
            &pool,
            &format!(
                "INSERT INTO refusing VALUES ('{table}'); \
                 CREATE TRIGGER refuse BEFORE {events} ON \"{table}\" FOR EACH STATEMENT EXECUTE FUNCTION refuse()"
            ),
        )
        .await;
    }
    let stop = CancellationToken::new();
    let task = tokio::spawn(inbox.run(stop.clone()));
    let keys = ["partitions", "cleanup"]
        .map(|stage| format!("inbox_maintenance_errors_total{{consumer=maintenance,stage={stage}}}"));
    let mut counted = Counted::default();
    let both = eventually(Duration::from_secs(20), || {
        let done = keys.iter().all(|key| counted.take().get(key) >= 2.0);
        async move { done }
    })
    .await;
    assert!(both, "two refused rounds of each stage counted: {:?}", keys.each_ref().map(|k| counted.get(k)));
    let registered = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM inbox_consumers WHERE consumer = 'maintenance'")
            .fetch_one(&pool)
            .await
            .expect("registered")
    };
    assert_eq!(registered().await, 0, "a refused round registered nothing");
    run(&pool, "DELETE FROM refusing").await;
    let recovered = eventually(Duration::from_secs(20), || async { registered().await == 1 }).await;
    stop.cancel();
    task.await.expect("task").expect("the consumer ran on through the refused rounds");
    assert!(recovered, "the next round registers the consumer");
}
