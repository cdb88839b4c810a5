//! The change-data-capture relay and one transaction appending 100,000 events (test 8 of
//! its design). In a test binary of its own, with one test: it measures the process's
//! resident memory, which tests running beside it would blur.

use std::time::{Duration, Instant};

use outbox_tests::cdc_kit::{self, Slot};
use outbox_tests::kafka::Kafka;
use outbox_tests::relay_kit::TOPIC;
use outbox_tests::running::quick;
use outbox_tests::{eventually, migrate, rows_in};

/// Resident memory of this process, in bytes.
fn resident() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kb * 1024
}

/// Test 8. One transaction appends 100,000 events (100 MB of payloads): the relay streams
/// them in memory bounded by its read-ahead (256 messages) and `max_buffered_bytes` (4 MiB
/// here), not by the transaction, and keeps each aggregate's order. The resident memory the
/// process gains while it streams is measured: 26 MiB here, with the mock cluster (in this
/// process too, keeping at most 5 MB of the partition) and the producer's buffers; a relay
/// holding the transaction until its commit would need the 100 MB. Seen failing with the
/// read-ahead unbounded (a channel of 2^20 messages and a 1 GiB budget): 159 MiB.
#[tokio::test]
async fn one_transaction_of_100_000_events_streams_in_bounded_memory_and_in_order() {
    let pool = cdc_kit::database().await;
    const EVENTS: i64 = 100_000;
    const BUDGET: usize = 4 << 20;
    // Half the transaction's payloads.
    const GREW_LIMIT: u64 = 48 << 20;
    let kafka = Kafka::mock();
    kafka.create_topic(TOPIC, 1).await;
    let outbox = migrate(&pool).await;
    let slot = Slot::setup(&pool, &outbox).await;
    sqlx::query(
        "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, \
                             topic, payload) \
         SELECT gen_random_uuid(), 'test', 'big-tx-' || (g % 100), g / 100 + 1, 'test.step', 1, $1, \
                json_build_object('n', g, 'data', repeat('x', 980)) \
         FROM generate_series(0, $2 - 1) AS g",
    )
    .bind(TOPIC)
    .bind(EVENTS)
    .execute(&pool)
    .await
    .expect("one transaction of 100,000 events");
    // Acknowledgements slowed down: the stream is read faster than Kafka takes it, so what
    // bounds the relay's memory is its budget, not the publisher's pace.
    kafka.mock_cluster().expect("mock").broker_round_trip_time(1, Duration::from_millis(100)).expect("rtt");
    let baseline = resident();
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(baseline));
    let sampler = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                peak.fetch_max(resident(), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let started = Instant::now();
    let relay =
        slot.start_with(&pool, &outbox, quick(&kafka), slot.config.clone().max_buffered_bytes(BUDGET));
    let published =
        eventually(Duration::from_secs(180), || async { rows_in(&pool, "published").await == EVENTS }).await;
    let took = started.elapsed();
    relay.shutdown().await;
    sampler.abort();
    let grew = peak.load(std::sync::atomic::Ordering::Relaxed).saturating_sub(baseline);
    eprintln!(
        "100,000 events of one transaction streamed in {:.1}s; resident memory grew by {:.1} MiB at most (budget {} MiB)",
        took.as_secs_f64(),
        grew as f64 / 1048576.0,
        BUDGET >> 20
    );
    assert!(published, "every event published: {}", rows_in(&pool, "published").await);
    let out_of_order: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT kafka_offset < lag(kafka_offset) OVER (PARTITION BY aggregate_id ORDER BY \
         aggregate_version) AS back FROM outbox) o WHERE back",
    )
    .fetch_one(&pool)
    .await
    .expect("order");
    assert_eq!(out_of_order, 0, "each aggregate's events at rising offsets");
    assert!(grew < GREW_LIMIT, "resident memory grew by {grew} bytes, more than {GREW_LIMIT}");
}
