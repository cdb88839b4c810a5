//! Cleanup of published rows (invariant 10), against real PostgreSQL.

use std::time::Duration;

use outbox_runtime::{AppendOptions, NewEvent};
use outbox_tests::{migrate, rows_in, Step};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

const WEEK: Duration = Duration::from_secs(7 * 24 * 3600);

#[sqlx::test(migrations = false)]
async fn cleanup_deletes_only_published_rows_past_retention_in_bounded_batches(pool: PgPool) {
    let outbox = migrate(&pool).await;
    let events: Vec<NewEvent> = (0..45)
        .map(|n| {
            NewEvent::new(
                &Step { id: format!("c-{}", n % 9), n, data: String::new() },
                AppendOptions::default(),
            )
            .expect("event")
        })
        .collect();
    let mut tx = pool.begin().await.expect("begin");
    outbox.append_batch(&mut tx, &events).await.expect("append");
    tx.commit().await.expect("commit");
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

/// The relay's cleanup on a new install's partitioned outbox, with a retention shorter
/// than the span: the current partition's events published past retention are deleted one
/// by one and counted in the tally, as in a plain table; recent and open ones stay. Before,
/// the cleanup of a partitioned outbox deleted from its legacy and default partitions only,
/// and the current partition kept them until it was dropped a span later.
#[sqlx::test(migrations = false)]
async fn the_relays_cleanup_deletes_from_the_current_partition_past_a_short_retention(pool: PgPool) {
    use outbox_runtime::relay::Cleanup;
    let kafka = outbox_tests::kafka::Kafka::start();
    let outbox = migrate(&pool).await;
    assert!(outbox.ops().is_partitioned(&pool).await.expect("layout"), "a new install's outbox");
    let events: Vec<NewEvent> = (0..20)
        .map(|n| {
            NewEvent::new(
                &Step { id: format!("p-{}", n % 4), n, data: String::new() },
                AppendOptions::default(),
            )
            .expect("event")
        })
        .collect();
    let mut tx = pool.begin().await.expect("begin");
    outbox.append_batch(&mut tx, &events).await.expect("append");
    tx.commit().await.expect("commit");
    // 10 published two hours ago, 5 a minute ago, 5 failed.
    sqlx::query(
        "UPDATE outbox SET status = CASE WHEN id <= 15 THEN 'published' ELSE 'failed' END, \
           published_at = CASE WHEN id <= 10 THEN now() - interval '2 hours' \
                               WHEN id <= 15 THEN now() - interval '1 minute' END",
    )
    .execute(&pool)
    .await
    .expect("states");
    let config = outbox_tests::running::quick(&kafka)
        .cleanup(Cleanup::default().retention(Duration::from_secs(3600)).interval(Duration::from_secs(1)));
    let relay = outbox_tests::running::start(&pool, &outbox, config);
    let gone = outbox_tests::eventually(Duration::from_secs(20), || async {
        rows_in(&pool, "published").await == 5
    })
    .await;
    relay.shutdown().await;
    assert!(
        gone,
        "the events published two hours ago are deleted: {} published left",
        rows_in(&pool, "published").await
    );
    assert_eq!(rows_in(&pool, "failed").await, 5, "failed events stay");
    let tallied: i64 = sqlx::query_scalar("SELECT coalesce(sum(events), 0)::bigint FROM outbox_cleaned")
        .fetch_one(&pool)
        .await
        .expect("tally");
    assert_eq!(tallied, 10, "counted in the cleaned tally");
}
