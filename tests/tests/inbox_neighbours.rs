//! The inbox beside others, and settings that cannot work (invariants 10, 12): two
//! consumers sharing one inbox table, a member joining the group mid-stream, and settings
//! refused by name. Each test names the neighbour or fault; each failed on the code before
//! its fix.

use std::time::{Duration, Instant};

use outbox_runtime::inbox::{Handlers, Inbox, InboxConfig};
use outbox_runtime::Error;
use outbox_tests::eventually;
use outbox_tests::inbox_kit::effects::{applied_amounts, setup, start, Ledger};
use sqlx::PgPool;

/// Neighbour: two consumers share one inbox table, one keeps event ids for a day, the other
/// for ever. Before the fix the first one's cleanup deleted the other's dedup rows too, so
/// a replay would apply those events twice.
#[sqlx::test(migrations = false)]
async fn cleanup_deletes_only_its_own_consumers_rows(pool: PgPool) {
    let config = |consumer: &str| InboxConfig::new(consumer, "127.0.0.1:1", ["t"]);
    let short = Inbox::new(
        pool.clone(),
        config("short").dedup_retention(Some(Duration::from_secs(86_400))),
        Handlers::new(),
    )
    .expect("inbox");
    let forever =
        Inbox::new(pool.clone(), config("forever").dedup_retention(None), Handlers::new()).expect("inbox");
    short.migrator().run(&pool).await.expect("migrate");
    for consumer in ["short", "forever"] {
        sqlx::query(
            "INSERT INTO inbox (consumer, event_id, event_type, schema_version, topic, kafka_partition, kafka_offset, applied_at, bucket) \
             SELECT $1, id, 'x.y', 1, 't', 0, n, now() - interval '2 days', inbox_bucket(id) \
             FROM (SELECT n, gen_random_uuid() AS id FROM generate_series(1, 5) n) s",
        )
        .bind(consumer)
        .execute(&pool)
        .await
        .expect("old rows");
    }
    let deleted = short.delete_applied(Duration::from_secs(86_400), 2).await.expect("cleanup");
    let left: Vec<(String, i64)> =
        sqlx::query_as("SELECT consumer, count(*) FROM inbox GROUP BY consumer ORDER BY consumer")
            .fetch_all(&pool)
            .await
            .expect("count");
    assert_eq!(deleted, 5);
    assert_eq!(left, vec![("forever".to_owned(), 5)]);
    assert_eq!(forever.delete_applied(Duration::from_secs(86_400), 2).await.expect("cleanup"), 5);
}

/// Settings that cannot work: before the fix `commit_interval(0)` panicked inside `run()`
/// and `backoff(0, _)` retried in a hot loop; both were accepted by `Inbox::new`.
#[sqlx::test(migrations = false)]
async fn settings_that_cannot_work_are_refused_by_name(pool: PgPool) {
    let base = || InboxConfig::new("c", "127.0.0.1:1", ["t"]);
    let cases: Vec<(InboxConfig, &str)> = vec![
        (base().commit_interval(Duration::ZERO), "commit_interval"),
        (base().backoff(Duration::ZERO, Duration::from_secs(1)), "backoff"),
        (base().backoff(Duration::from_secs(2), Duration::from_secs(1)), "backoff"),
        (base().queue_per_partition(0), "queue_per_partition"),
        (base().operator_poll_interval(Duration::ZERO), "operator_poll_interval"),
        (base().dedup_retention(Some(Duration::ZERO)), "dedup_retention"),
        (base().batch_size(0), "batch_size"),
        (base().batch_size(10_001), "batch_size"),
        (base().batch_wait(Duration::from_secs(2)), "batch_wait"),
        (base().batch_timeout(Duration::ZERO), "batch_timeout"),
    ];
    for (config, setting) in cases {
        match Inbox::new(pool.clone(), config, Handlers::new()) {
            Err(Error::Config(message)) => assert!(message.contains(setting), "{message:?} names {setting}"),
            other => panic!("{setting}: expected Error::Config, got {other:?}"),
        }
    }
    Inbox::new(pool.clone(), base(), Handlers::new()).expect("the defaults are valid");
    let edges =
        base().batch_size(1).batch_wait(Duration::from_secs(1)).batch_timeout(Duration::from_millis(1));
    Inbox::new(pool.clone(), edges, Handlers::new()).expect("the batch settings' bounds are valid");
}

/// Neighbour: a second member joins the group mid-stream while the first holds every
/// partition. The revoke stops the first member's workers of the partitions handed over,
/// drops their queued records and commits what they finished (a broker may refuse that
/// commit during the rebalance: librdkafka's mock cluster does); the new owner reads on
/// from the committed offsets. Every record applies exactly once, nothing is lost, and at
/// the end every partition's committed offset is at its end.
#[sqlx::test(migrations = false)]
async fn a_member_joining_mid_stream_takes_partitions_over_without_loss_or_double_effects(pool: PgPool) {
    let s = setup(&pool, 4).await;
    for n in 0..40 {
        s.credit(n % 4, &format!("acc-{n}"), n.into());
    }
    s.producer.flush();
    let config = s.config("rebalance");
    let first = start(&pool, config.clone(), &Ledger::default()).await;
    let stats = first.stats.clone();
    assert!(eventually(Duration::from_secs(20), || async { stats.applied() == 40 }).await);
    let second = start(&pool, config, &Ledger::default()).await;
    let joined = second.stats.clone();
    // Records keep coming until the second member applies some: it owns partitions then.
    let mut n = 40;
    let deadline = Instant::now() + Duration::from_secs(40);
    while joined.applied() == 0 && Instant::now() < deadline {
        for _ in 0..4 {
            s.credit(n % 4, &format!("acc-{n}"), n.into());
            n += 1;
        }
        s.producer.flush();
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let total = u64::try_from(n).expect("count");
    let all =
        eventually(Duration::from_secs(40), || async { stats.applied() + joined.applied() == total }).await;
    let (a, b) = (first.stats.clone(), second.stats.clone());
    first.shutdown().await;
    second.shutdown().await;
    assert!(all, "applied {} + {} of {total}", a.applied(), b.applied());
    assert!(b.applied() > 0, "the second member took partitions over");
    assert_eq!(applied_amounts(&pool).await, (0..i64::from(n)).collect::<Vec<i64>>(), "each record once");
    // Both stopping at once is a rebalance too, during which a broker may refuse the final
    // commits (the mock does): a member that starts once the group has settled reads what
    // is left, absorbs it, and commits every partition to its end.
    let ends: Vec<i64> = (0..4).map(|p| i64::from((n + 3 - p) / 4)).collect();
    let left: i64 =
        ends.iter().zip(s.kafka.committed("rebalance", &s.topic, 4)).map(|(e, c)| e - c.max(0)).sum();
    let third = start(&pool, s.config("rebalance"), &Ledger::default()).await;
    let last = third.stats.clone();
    let absorbed = eventually(Duration::from_secs(30), || async {
        last.duplicates() >= u64::try_from(left).unwrap_or(0)
    })
    .await;
    third.shutdown().await;
    assert!(absorbed, "the {left} records not committed come again and are absorbed: {}", last.duplicates());
    assert_eq!(last.applied(), 0, "nothing applies twice");
    assert_eq!(s.kafka.committed("rebalance", &s.topic, 4), ends, "committed to the end of every partition");
    eprintln!("redelivered and absorbed: {} + {} + {}", a.duplicates(), b.duplicates(), last.duplicates());
}
