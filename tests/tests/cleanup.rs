//! Cleanup of published rows (invariant 10), against real PostgreSQL.

use std::time::Duration;

use outbox_runtime::{AppendOptions, NewEvent, Outbox};
use outbox_tests::{migrate, rows_in, Step};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

const WEEK: Duration = Duration::from_secs(7 * 24 * 3600);

/// Appends `n` steps of `aggregates` aggregates in one transaction (ids in append order).
async fn append_steps(pool: &PgPool, outbox: &Outbox, n: i64, aggregates: i64) {
    let events: Vec<NewEvent> = (0..n)
        .map(|n| {
            NewEvent::new(
                &Step { id: format!("c-{}", n % aggregates), n, data: String::new() },
                AppendOptions::default(),
            )
            .expect("event")
        })
        .collect();
    let mut tx = pool.begin().await.expect("begin");
    outbox.append_batch(&mut tx, &events).await.expect("append");
    tx.commit().await.expect("commit");
}

#[sqlx::test(migrations = false)]
async fn cleanup_deletes_only_published_rows_past_retention_in_bounded_batches(pool: PgPool) {
    let outbox = migrate(&pool).await;
    append_steps(&pool, &outbox, 45, 9).await;
    // 30 published 10 days ago, 5 published an hour ago, 5 failed 10 days ago, 5 pending.
    sqlx::query(
        "UPDATE outbox SET created_at = now() - interval '11 days', \
           status = CASE WHEN id <= 30 THEN 'published' WHEN id <= 35 THEN 'published' WHEN id <= 40 THEN 'failed' ELSE 'pending' END, \
           published_at = CASE WHEN id <= 30 THEN now() - interval '10 days' WHEN id <= 35 THEN now() - interval '1 hour' END",
    )
    .execute(&pool)
    .await
    .expect("age rows");

    let first = outbox.delete_published_batch(&pool, WEEK, 10).await.expect("batch");
    assert_eq!(first, 10, "one batch deletes at most its size");
    let rest = outbox.delete_published(&pool, WEEK, 10, &CancellationToken::new()).await.expect("cleanup");
    assert_eq!(rest, 20);
    assert_eq!(rows_in(&pool, "published").await, 5, "recently published rows stay");
    assert_eq!(rows_in(&pool, "failed").await, 5, "failed rows are never cleaned up");
    assert_eq!(rows_in(&pool, "pending").await, 5, "pending rows are never cleaned up");
    let oldest_left: i64 =
        sqlx::query_scalar("SELECT min(id) FROM outbox").fetch_one(&pool).await.expect("min");
    assert_eq!(oldest_left, 31);
}

/// A batch size of 0 is an `Error::Config` naming it, from every deletion that takes one.
/// Before the fix `delete_published(.., 0, ..)` deleted 0 rows a round and never returned
/// (0 < 0 never ends the loop), and `purge` and `delete_applied` silently made it 1.
#[sqlx::test(migrations = false)]
async fn a_zero_batch_size_is_refused_by_name_instead_of_looping(pool: PgPool) {
    let outbox = migrate(&pool).await;
    let mut tx = pool.begin().await.expect("begin");
    outbox.append(&mut tx, &Step { id: "z".into(), n: 1, data: String::new() }).await.expect("append");
    tx.commit().await.expect("commit");
    sqlx::query("UPDATE outbox SET status = 'published', published_at = now() - interval '10 days'")
        .execute(&pool)
        .await
        .expect("publish");
    let bounded = Duration::from_secs(10);
    let refused = |result: outbox_runtime::Result<u64>| {
        matches!(&result, Err(outbox_runtime::Error::Config(m)) if m.contains("batch_size")) || {
            panic!("expected Error::Config naming batch_size, got {result:?}")
        }
    };
    let stop = CancellationToken::new();
    let cleanup = tokio::time::timeout(bounded, outbox.delete_published(&pool, WEEK, 0, &stop)).await;
    assert!(refused(cleanup.expect("delete_published(.., 0, ..) returns instead of looping")));
    let purge = tokio::time::timeout(bounded, outbox.ops().purge(&pool, WEEK, 0, |_| {})).await;
    assert!(refused(purge.expect("purge returns")));
    assert!(refused(outbox.delete_published(&pool, WEEK, 100_001, &stop).await));
    assert_eq!(rows_in(&pool, "published").await, 1, "nothing was deleted by a refused call");
    let deleted = outbox.delete_published(&pool, WEEK, 1, &stop).await.expect("a batch of 1 works");
    assert_eq!(deleted, 1);
}

/// The relay's cleanup on a new install's partitioned outbox, run by a role granted the
/// outbox's tables (not each partition, not the id sequence): its maintenance rounds may
/// not move appends on or drop partitions, so events stay in the current partition, and the
/// cleanup deletes those published past retention one by one, counted in the tally, as in a
/// plain table; recent and open ones stay. `retention` against `age` (when the events were
/// appended and published). Before, the cleanup of a partitioned outbox deleted from its
/// legacy and default partitions only, and by each partition's name, which such a role may
/// not: nothing went.
async fn cleaned_by_a_relay_that_is_not_the_owner(pool: &PgPool, retention: Duration, age: &str) {
    use outbox_runtime::relay::Cleanup;
    let kafka = outbox_tests::kafka::Kafka::start();
    let outbox = migrate(pool).await;
    assert!(outbox.ops().is_partitioned(pool).await.expect("layout"), "a new install's outbox");
    append_steps(pool, &outbox, 20, 4).await;
    // All appended `age` ago: 10 published then, 5 a minute ago, 5 failed.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE outbox SET created_at = now() - interval '{age}', \
           status = CASE WHEN id <= 15 THEN 'published' ELSE 'failed' END, \
           published_at = CASE WHEN id <= 10 THEN now() - interval '{age}' \
                               WHEN id <= 15 THEN now() - interval '1 minute' END"
    )))
    .execute(pool)
    .await
    .expect("states");
    let role = format!("relay_{}", uuid::Uuid::new_v4().simple());
    for statement in [
        format!("CREATE ROLE {role} LOGIN"),
        format!(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON outbox, outbox_leases, outbox_relays, outbox_topics, \
             outbox_cleaned TO {role}"
        ),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(statement)).execute(pool).await.expect("role");
    }
    let relay_pool = PgPool::connect_with((*pool.connect_options()).clone().username(&role))
        .await
        .expect("connect as the role");
    let config = outbox_tests::running::quick(&kafka)
        .cleanup(Cleanup::default().retention(retention).interval(Duration::from_secs(1)));
    let relay = outbox_tests::running::start(&relay_pool, &outbox, config);
    let gone =
        outbox_tests::eventually(Duration::from_secs(20), || async { rows_in(pool, "published").await == 5 })
            .await;
    relay.shutdown().await;
    relay_pool.close().await;
    for statement in [format!("DROP OWNED BY {role}"), format!("DROP ROLE {role}")] {
        sqlx::query(sqlx::AssertSqlSafe(statement)).execute(pool).await.expect("drop role");
    }
    assert!(
        gone,
        "the events published {age} ago are deleted: {} published left",
        rows_in(pool, "published").await
    );
    assert_eq!(rows_in(pool, "failed").await, 5, "failed events stay");
    let tallied: i64 = sqlx::query_scalar("SELECT coalesce(sum(events), 0)::bigint FROM outbox_cleaned")
        .fetch_one(pool)
        .await
        .expect("tally");
    assert_eq!(tallied, 10, "counted in the cleaned tally");
}

/// A retention shorter than the span (an hour against a day).
#[sqlx::test(migrations = false)]
async fn the_relays_cleanup_deletes_from_the_current_partition_past_a_short_retention(pool: PgPool) {
    cleaned_by_a_relay_that_is_not_the_owner(&pool, Duration::from_secs(3600), "2 hours").await;
}

/// The default retention, 7 days, longer than the span: the current partition was never
/// moved on by this relay, and its events are cleaned all the same.
#[sqlx::test(migrations = false)]
async fn a_current_partition_that_never_moved_on_is_cleaned_past_the_default_retention(pool: PgPool) {
    cleaned_by_a_relay_that_is_not_the_owner(&pool, WEEK, "8 days").await;
}

/// With the default retention and a current partition younger than it (appends moved on
/// by the rounds), the cleanup leaves that partition alone: its events leave with it, by
/// a drop, and no cleanup round reads it. An event published eight days ago there (a
/// clock set back, here by hand) stays.
#[sqlx::test(migrations = false)]
async fn a_young_current_partition_is_left_to_the_drops(pool: PgPool) {
    use outbox_runtime::relay::Cleanup;
    let kafka = outbox_tests::kafka::Kafka::start();
    let outbox = migrate(&pool).await;
    let mut tx = pool.begin().await.expect("begin");
    outbox.append(&mut tx, &Step { id: "w".into(), n: 1, data: String::new() }).await.expect("append");
    tx.commit().await.expect("commit");
    sqlx::query("UPDATE outbox SET status = 'published', published_at = now() - interval '8 days'")
        .execute(&pool)
        .await
        .expect("published long ago");
    let config =
        outbox_tests::running::quick(&kafka).cleanup(Cleanup::default().interval(Duration::from_secs(1)));
    let relay = outbox_tests::running::start(&pool, &outbox, config);
    tokio::time::sleep(Duration::from_secs(3)).await;
    relay.shutdown().await;
    assert_eq!(rows_in(&pool, "published").await, 1, "left to the partition's drop");
}
