//! The relay against real PostgreSQL and a Kafka-protocol broker (`KAFKA_BROKERS`, or the
//! in-process mock cluster) when all goes well: what it publishes and marks, NOTIFY waking
//! it, relays sharing the partitions. Its faults are in `relay_faults.rs`.

use std::time::Duration;

use outbox_tests::kafka::{Kafka, Record};
use outbox_tests::relay_kit::{append_steps, has_all, records_for, TOPIC};
use outbox_tests::running::{quick, start};
use outbox_tests::{eventually, migrate, rows_in};
use sqlx::PgPool;
use uuid::Uuid;

#[sqlx::test(migrations = false)]
async fn publishes_key_value_and_cloudevents_headers_then_marks(pool: PgPool) {
    let kafka = Kafka::start();
    kafka.create_topic(TOPIC, 3).await;
    let outbox = migrate(&pool).await;
    let (a, b) = (format!("a-{}", Uuid::new_v4()), format!("b-{}", Uuid::new_v4()));
    let mut ids = append_steps(&pool, &outbox, &a, 3, "alpha").await;
    ids.extend(append_steps(&pool, &outbox, &b, 2, "beta").await);

    let relay = start(&pool, &outbox, quick(&kafka));
    assert!(eventually(Duration::from_secs(30), || async { rows_in(&pool, "published").await == 5 }).await);
    relay.shutdown().await;

    let records = kafka.read_all(TOPIC, Duration::from_secs(30));
    let rows: Vec<(Uuid, String, String, i64, i32, i64)> = sqlx::query_as(
        "SELECT event_id, aggregate_id, payload::text, aggregate_version, kafka_partition, kafka_offset \
         FROM outbox WHERE published_at IS NOT NULL ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .expect("rows");
    assert_eq!(rows.len(), 5);
    for (event_id, aggregate_id, payload, version, partition, offset) in rows {
        let found: Vec<&Record> =
            records.iter().filter(|r| r.headers.get("ce_id") == Some(&event_id.to_string())).collect();
        assert_eq!(found.len(), 1, "event {event_id} is in the topic once");
        let r = found[0];
        assert_eq!((r.partition, r.offset), (partition, offset), "marked with where Kafka put it");
        assert_eq!(r.key, aggregate_id);
        assert_eq!(r.value, payload);
        let h = |k: &str| r.headers.get(k).map(String::as_str);
        assert_eq!(h("ce_specversion"), Some("1.0"));
        assert_eq!(h("ce_type"), Some("test.step"));
        assert_eq!(h("ce_source"), Some("/outbox"));
        assert_eq!(h("ce_subject"), Some(aggregate_id.as_str()));
        assert_eq!(h("content-type"), Some("application/json"));
        assert_eq!(h("ce_schemaversion"), Some("1"));
        assert_eq!(h("ce_aggregatetype"), Some("test"));
        assert_eq!(h("ce_dataschema"), Some("urn:outbox:schemas/test.step/v1.json"));
        assert_eq!(h("ce_aggregateversion"), Some(version.to_string().as_str()));
        assert_eq!(h("x-test"), Some("yes"));
        let time = h("ce_time").expect("ce_time");
        assert!(time.len() == 27 && time.ends_with('Z') && &time[10..11] == "T", "RFC 3339 UTC: {time}");
    }
    for key in [&a, &b] {
        let versions: Vec<String> =
            records_for(&records, key).iter().map(|r| r.headers["ce_aggregateversion"].clone()).collect();
        let expected: Vec<String> = (1..=versions.len()).map(|v| v.to_string()).collect();
        assert_eq!(versions, expected, "aggregate {key} in order");
    }
}

#[sqlx::test(migrations = false)]
async fn notify_wakes_the_relay_long_before_the_poll_interval(pool: PgPool) {
    let kafka = Kafka::start();
    kafka.create_topic(TOPIC, 1).await;
    let outbox = migrate(&pool).await;
    let relay = start(&pool, &outbox, quick(&kafka).poll_interval(Duration::from_secs(120)));
    // Let it take its leases and settle into waiting.
    assert!(
        eventually(Duration::from_secs(10), || async {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox_leases WHERE owner IS NOT NULL")
                .fetch_one(&pool)
                .await
                .expect("leases")
                == 32
        })
        .await
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    append_steps(&pool, &outbox, &format!("wake-{}", Uuid::new_v4()), 1, "x").await;
    assert!(
        eventually(Duration::from_secs(15), || async { rows_in(&pool, "published").await == 1 }).await,
        "published well before the 120 s poll"
    );
    relay.shutdown().await;
}

#[sqlx::test(migrations = false)]
async fn relays_share_partitions_and_shutdown_hands_over_at_once(pool: PgPool) {
    let kafka = Kafka::start();
    kafka.create_topic(TOPIC, 3).await;
    let outbox = migrate(&pool).await;
    let config = quick(&kafka).lease_ttl(Duration::from_secs(3)).message_timeout(Duration::from_secs(1));
    let first = start(&pool, &outbox, config.clone());
    let second = start(&pool, &outbox, config.clone());
    let owners = || async {
        sqlx::query_as::<_, (Uuid, i64)>(
            "SELECT owner, count(*) FROM outbox_leases WHERE owner IS NOT NULL AND expires_at > now() GROUP BY owner",
        )
        .fetch_all(&pool)
        .await
        .expect("owners")
    };
    assert!(
        eventually(Duration::from_secs(20), || async {
            owners().await.iter().map(|o| o.1).collect::<Vec<_>>() == [16, 16]
        })
        .await,
        "two relays hold 16 partitions each: {:?}",
        owners().await
    );
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.extend(append_steps(&pool, &outbox, &format!("share-{i}-{}", Uuid::new_v4()), 2, "x").await);
    }
    assert!(eventually(Duration::from_secs(30), || async { rows_in(&pool, "published").await == 40 }).await);
    assert!(first.stats.published() > 0 && second.stats.published() > 0, "both relays published");
    assert_eq!(first.stats.published() + second.stats.published(), 40);

    // Graceful shutdown gives the leases back: the other relay takes all without waiting for expiry.
    first.shutdown().await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            owners().await.iter().map(|o| o.1).collect::<Vec<_>>() == [32]
        })
        .await,
        "the remaining relay holds every partition: {:?}",
        owners().await
    );
    ids.extend(append_steps(&pool, &outbox, &format!("after-{}", Uuid::new_v4()), 3, "x").await);
    assert!(eventually(Duration::from_secs(30), || async { rows_in(&pool, "published").await == 43 }).await);
    second.shutdown().await;
    let records = kafka.read_all(TOPIC, Duration::from_secs(30));
    assert!(has_all(&ids)(&records));
}

/// A relay on tables older than the library (an upgrade deployed before `outbox migrate`),
/// or on none, stops at once with `Error::MigrationsBehind` or `NotMigrated` naming the table, instead of
/// running and failing to record what it does.
#[sqlx::test(migrations = false)]
async fn a_relay_refuses_tables_older_than_it_or_missing(pool: PgPool) {
    let kafka = Kafka::start();
    let outbox = outbox_runtime::Outbox::default_ref().clone();
    let run = |pool: PgPool| {
        let relay = outbox_runtime::relay::Relay::new(pool, outbox.clone(), quick(&kafka)).expect("relay");
        tokio::time::timeout(Duration::from_secs(20), relay.run(outbox_runtime::CancellationToken::new()))
    };
    let missing = run(pool.clone()).await.expect("returns at once");
    assert!(
        matches!(&missing, Err(outbox_runtime::Error::NotMigrated { table }) if table == "\"public\".\"outbox\""),
        "{missing:?}"
    );
    migrate(&pool).await;
    // The column the latest migration added, gone: tables of the version before.
    sqlx::query("ALTER TABLE outbox DROP COLUMN failed_at").execute(&pool).await.expect("older tables");
    let older = run(pool.clone()).await.expect("returns at once");
    assert!(matches!(&older, Err(outbox_runtime::Error::MigrationsBehind { .. })), "{older:?}");
    assert!(older.expect_err("refused").to_string().contains("outbox migrate"), "says what to do");
    // Migration 10's table (the relays' missing-topic clock), gone.
    sqlx::query("ALTER TABLE outbox ADD COLUMN failed_at timestamptz")
        .execute(&pool)
        .await
        .expect("column back");
    sqlx::query("DROP TABLE outbox_topics").execute(&pool).await.expect("older tables");
    let older = run(pool.clone()).await.expect("returns at once");
    assert!(
        matches!(&older, Err(outbox_runtime::Error::MigrationsBehind { missing, .. }) if missing.contains("outbox_topics")),
        "{older:?}"
    );
}
