//! The change-data-capture relay with a 10 MB payload (test 7 of its design).

use std::time::Duration;

use outbox_runtime::{AppendOptions, NewEvent, Outbox, OutboxConfig};
use outbox_tests::cdc_kit::{self, Slot};
use outbox_tests::kafka::Kafka;
use outbox_tests::relay_kit::TOPIC;
use outbox_tests::running::quick;
use outbox_tests::{eventually, migrate, rows_in, Step};

/// Test 7. A 10 MB payload is streamed, published and marked like any other, and the
/// event behind it in its aggregate follows it, with a memory budget of 1 MiB (an event
/// larger than the budget is read alone). The outbox's record limit and the
/// producer's `message.max.bytes` are raised for it (both refuse it by default, by name).
#[tokio::test]
async fn a_10_mb_payload_is_streamed_and_published() {
    let pool = cdc_kit::database().await;
    // The mock cluster whatever KAFKA_BROKERS says: a broker process keeps the steps' topic
    // of other tests with its default limit (1 MB), which is the broker's setting to raise,
    // not the relay's.
    let kafka = Kafka::mock();
    kafka.create_topic(TOPIC, 1).await;
    migrate(&pool).await;
    let outbox = Outbox::new(OutboxConfig::default().max_record_bytes(12 << 20)).expect("outbox");
    let slot = Slot::setup(&pool, &outbox).await;
    let key = format!("large-{}", uuid::Uuid::new_v4().simple());
    let big = NewEvent::new(
        &Step { id: key.clone(), n: 1, data: "L".repeat(10 << 20) },
        AppendOptions::default().aggregate_version(1),
    )
    .expect("a 10 MB event");
    let small = NewEvent::new(
        &Step { id: key.clone(), n: 2, data: "s".into() },
        AppendOptions::default().aggregate_version(2),
    )
    .expect("event");
    let ids = [big.event_id(), small.event_id()];
    let mut tx = pool.begin().await.expect("begin");
    outbox.append_batch(&mut tx, &[big, small]).await.expect("append 10 MB");
    tx.commit().await.expect("commit");

    // A memory budget smaller than the event: it is read alone, not waited on for ever.
    let relay = slot.start_with(
        &pool,
        &outbox,
        quick(&kafka)
            .kafka_setting("message.max.bytes", "16777216")
            .message_timeout(Duration::from_secs(10))
            .lease_ttl(Duration::from_secs(30)),
        slot.config.clone().max_buffered_bytes(1 << 20),
    );
    assert!(eventually(Duration::from_secs(60), || async { rows_in(&pool, "published").await == 2 }).await);
    let stats = relay.shutdown().await;
    assert_eq!(stats.published(), 2);
    let placements: Vec<(i32, i64, i32)> = sqlx::query_as(
        "SELECT kafka_partition, kafka_offset, octet_length(payload::text) FROM outbox ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .expect("placements");
    assert!(placements[0].2 > 10 << 20, "the payload is 10 MB: {}", placements[0].2);
    assert!(placements[0].1 < placements[1].1, "the event after it follows it: {placements:?}");
    // Acknowledged by the broker (acks=all) at those offsets. Not read back: the mock
    // cluster keeps at most 5 MB of a partition and drops the segment holding both.
    assert_eq!(placements.len(), ids.len());
}
