//! The change-data-capture relay on a partitioned outbox: the publication carries every
//! partition's inserts under the outbox's name, one that does not is refused, and a table in
//! a publication is not converted.

use std::time::Duration;

use outbox_tests::cdc_kit::{self, first_versions, ours, Slot};
use outbox_tests::kafka::Kafka;
use outbox_tests::partition_kit::{append, move_on, partition_of};
use outbox_tests::relay_kit::TOPIC;
use outbox_tests::running::quick;
use outbox_tests::{eventually, migrate_existing, rows_in};
use sqlx::AssertSqlSafe;
use uuid::Uuid;

/// The change-data-capture relay on a partitioned outbox: the publication carries each
/// partition's inserts under the outbox's name (`publish_via_partition_root`), so the events
/// of the legacy partition (handed to the table path by the setup), of a partition, and of
/// the next one after appends move on while it streams are all published, each aggregate's
/// in order; an event an operator retries goes through the table path's bounded claim.
/// Before, the setup refused a partitioned outbox.
#[tokio::test]
async fn the_change_data_capture_relay_streams_a_partitioned_outbox() {
    let pool = cdc_kit::database().await;
    let kafka = Kafka::start();
    kafka.create_topic(TOPIC, 3).await;
    let outbox = migrate_existing(&pool).await;
    let aggregates: Vec<String> = (0..3).map(|a| format!("cdc-{a}-{}", Uuid::new_v4())).collect();
    let mut ids = Vec::new();
    let append_round = |n: i64| {
        let (pool, outbox, aggregates) = (pool.clone(), outbox.clone(), aggregates.clone());
        async move {
            let mut ids = Vec::new();
            for a in &aggregates {
                ids.push(append(&pool, &outbox, a, n, None).await.expect("append"));
            }
            ids
        }
    };
    ids.extend(append_round(1).await);
    assert!(outbox.ops().partition_table(&pool).await.expect("convert"));
    let slot = Slot::setup(&pool, &outbox).await;
    let relay = slot.start(&pool, &outbox, quick(&kafka));
    for n in 2..=4 {
        ids.extend(append_round(n).await);
    }
    let published = |count: i64| {
        let pool = pool.clone();
        async move {
            eventually(Duration::from_secs(30), || async { rows_in(&pool, "published").await == count }).await
        }
    };
    assert!(published(12).await, "the legacy partition's events and the first partition's are published");
    move_on(&pool, &outbox).await;
    for n in 5..=7 {
        ids.extend(append_round(n).await);
    }
    assert!(published(21).await, "the next partition's events are streamed too");
    let mut placed = Vec::new();
    for id in [ids[0], ids[3], ids[20]] {
        placed.push(partition_of(&pool, id).await);
    }
    assert!(placed[0] == "outbox_legacy" && placed[0] != placed[1] && placed[1] != placed[2], "{placed:?}");

    let retried = ids[20];
    sqlx::query("UPDATE outbox SET status = 'failed', last_error = 'by hand' WHERE event_id = $1")
        .bind(retried)
        .execute(&pool)
        .await
        .expect("fail one");
    let target = outbox_runtime::ops::RetryTarget::Event(retried);
    assert_eq!(outbox.ops().retry(&pool, &target).await.expect("retry"), 1);
    assert!(published(21).await, "the retried event is published again");
    let stats = relay.shutdown().await;
    assert!(stats.published() >= 21, "published {}", stats.published());

    let records = ours(kafka.read_all(TOPIC, Duration::from_secs(30)), &ids);
    for a in &aggregates {
        assert_eq!(first_versions(&records, a), (1..=7).collect::<Vec<i64>>(), "aggregate {a} in order");
    }
    let copies = records.iter().filter(|r| r.headers["ce_id"] == retried.to_string()).count();
    assert_eq!((records.len(), copies), (22, 2), "each event once, the retried one twice");
}

/// A publication made by hand that sends a partitioned outbox's inserts under its
/// partitions' names (without `publish_via_partition_root`): the stream, which reads the
/// outbox's name, would skip them all. The setup and the relay's check refuse it and name
/// the fix; with the fix they accept it.
#[tokio::test]
async fn a_publication_of_the_partitions_under_their_own_names_is_refused() {
    let pool = cdc_kit::database().await;
    let outbox = migrate_existing(&pool).await;
    assert!(outbox.ops().partition_table(&pool).await.expect("convert"));
    let slot = Slot::named(&pool).await;
    sqlx::query(AssertSqlSafe(format!(
        "CREATE PUBLICATION \"{}\" FOR TABLE outbox WITH (publish = 'insert')",
        slot.name()
    )))
    .execute(&pool)
    .await
    .expect("publication");
    let fix = "publish_via_partition_root = true";
    match slot.config.setup(&pool, &outbox).await {
        Err(outbox_runtime::Error::Config(message)) => assert!(message.contains(fix), "{message}"),
        other => panic!("expected Error::Config, got {other:?}"),
    }
    sqlx::query(AssertSqlSafe(format!("ALTER PUBLICATION \"{}\" SET ({fix})", slot.name())))
        .execute(&pool)
        .await
        .expect("the fix");
    slot.config.setup(&pool, &outbox).await.expect("setup with the fix");
    slot.config.check(&pool, &outbox).await.expect("a relay may stream");
    sqlx::query(AssertSqlSafe(format!(
        "ALTER PUBLICATION \"{}\" SET (publish_via_partition_root = false)",
        slot.name()
    )))
    .execute(&pool)
    .await
    .expect("undone");
    match slot.config.check(&pool, &outbox).await {
        Err(outbox_runtime::Error::Config(message)) => assert!(message.contains(fix), "{message}"),
        other => panic!("expected Error::Config from the relay's check, got {other:?}"),
    }
}

/// A table in a publication is not converted: the new partitions' inserts would not be in
/// it. The error says how to go on.
#[tokio::test]
async fn an_outbox_in_a_publication_is_not_converted() {
    let pool = cdc_kit::database().await;
    let outbox = migrate_existing(&pool).await;
    let slot = Slot::setup(&pool, &outbox).await;
    match outbox.ops().partition_table(&pool).await {
        Err(outbox_runtime::Error::Config(message)) => {
            assert!(message.contains(&format!("is in publication {}", slot.name())), "{message}");
            assert!(message.contains("outbox cdc drop"), "{message}");
        }
        other => panic!("expected Error::Config, got {other:?}"),
    }
    assert!(!outbox.ops().is_partitioned(&pool).await.expect("layout"), "left as it was");
}
