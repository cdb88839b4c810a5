//! Hot aggregates: the relay hands an aggregate's events to the producer without waiting
//! for each acknowledgement. These tests inject faults while such windows are in flight
//! on a mock cluster and check invariant 5 where a consumer sees it: in Kafka, in order of
//! first appearance, every aggregate's events come in version order with none skipped.

use std::collections::BTreeMap;
use std::time::Duration;

use outbox_runtime::relay::RelayConfig;
use outbox_runtime::{AppendOptions, NewEvent, Outbox};
use outbox_tests::kafka::{Kafka, Record};
use outbox_tests::running::{quick, start};
use outbox_tests::{eventually, migrate, rows_in, Step};
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use sqlx::PgPool;

/// Where [`Step`] events go.
const TOPIC: &str = "outbox-test-steps";

/// Small produce requests (10 records), so that one aggregate has several requests in
/// flight at once: the case where a failure in the middle could leave a gap.
fn windowed(kafka: &Kafka) -> RelayConfig {
    quick(kafka).kafka_setting("batch.num.messages", "10").kafka_setting("linger.ms", "0")
}

/// [`windowed`], with a message timeout that a starved test machine does not reach: a
/// batch past it is purged and sent again, which may write its events twice (at least
/// once, never lost). The tests that count each event once are not about that deadline.
fn windowed_patient(kafka: &Kafka) -> RelayConfig {
    windowed(kafka).message_timeout(Duration::from_secs(10)).lease_ttl(Duration::from_secs(30))
}

/// Appends `per` events to each of `aggregates` aggregates, interleaved, versions 1..=per.
async fn append_hot(pool: &PgPool, outbox: &Outbox, prefix: &str, aggregates: usize, per: i64) {
    let mut events = Vec::new();
    for n in 1..=per {
        for a in 0..aggregates {
            let step = Step { id: format!("{prefix}-{a}"), n, data: "x".repeat(64) };
            events.push(NewEvent::new(&step, AppendOptions::default().aggregate_version(n)).expect("event"));
        }
    }
    for chunk in events.chunks(1000) {
        let mut tx = pool.begin().await.expect("begin");
        outbox.append_batch(&mut tx, chunk).await.expect("append");
        tx.commit().await.expect("commit");
    }
}

/// Per aggregate, the versions in Kafka in order of first appearance.
fn first_appearance(records: &[Record]) -> BTreeMap<String, Vec<i64>> {
    let mut seen: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for record in records {
        let version: i64 = record.headers["ce_aggregateversion"].parse().expect("version");
        let versions = seen.entry(record.key.clone()).or_default();
        if !versions.contains(&version) {
            versions.push(version);
        }
    }
    seen
}

/// Aggregates whose first appearances are not 1, 2, 3, ... in order.
fn order_violations(records: &[Record]) -> Vec<(String, Vec<i64>)> {
    first_appearance(records)
        .into_iter()
        .filter(|(_, versions)| versions.iter().enumerate().any(|(i, v)| *v != i as i64 + 1))
        .collect()
}

async fn published_count(pool: &PgPool) -> i64 {
    rows_in(pool, "published").await
}

/// Fault: retriable Produce errors (not enough replicas, leader moved, request timed out)
/// hit requests in the middle of 10 aggregates' windows. The idempotent producer retries
/// them in sequence: every event published, each once, in order.
#[sqlx::test(migrations = false)]
async fn retriable_errors_in_flight_keep_every_aggregate_in_order(pool: PgPool) {
    let kafka = Kafka::mock();
    let mock = kafka.mock_cluster().expect("mock");
    kafka.create_topic(TOPIC, 2).await;
    let outbox = migrate(&pool).await;
    append_hot(&pool, &outbox, "retriable", 10, 100).await;
    let mut errors = Vec::new();
    for i in 0..30 {
        errors.push(RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR);
        errors.push(match i % 3 {
            0 => RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            1 => RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
            _ => RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
        });
    }
    mock.request_errors(RDKafkaApiKey::Produce, &errors);
    let relay = start(&pool, &outbox, windowed_patient(&kafka));
    assert!(eventually(Duration::from_secs(60), || async { published_count(&pool).await == 1000 }).await);
    let stats = relay.shutdown().await;
    let records = kafka.read_all(TOPIC, Duration::from_secs(30));
    let violations = order_violations(&records);
    if !violations.is_empty() {
        let bad = &violations[0].0;
        for r in records.iter().filter(|r| &r.key == bad).take(15) {
            eprintln!("{} p{} o{} v{}", r.key, r.partition, r.offset, r.headers["ce_aggregateversion"]);
        }
        eprintln!("order gaps seen by the relay: {}; {stats:?}", stats.order_gaps());
    }
    assert_eq!(violations, Vec::<(String, Vec<i64>)>::new());
    assert_eq!(records.len(), 1000, "the idempotent producer wrote each event once: {stats:?}");
    assert_eq!(stats.order_gaps(), 0);
}

/// Fault: the only broker goes down while windows are in flight, for longer than the
/// message timeout, and comes back. The relay purges what is left at its deadline, retries
/// with backoff, and nothing later of an aggregate appears before an earlier event.
#[sqlx::test(migrations = false)]
async fn a_broker_outage_in_the_middle_of_windows_leaves_no_gap(pool: PgPool) {
    let kafka = Kafka::mock();
    let mock = kafka.mock_cluster().expect("mock");
    kafka.create_topic(TOPIC, 2).await;
    let outbox = migrate(&pool).await;
    append_hot(&pool, &outbox, "outage", 10, 300).await;
    // Slow round trips keep windows in flight when the broker goes.
    mock.broker_round_trip_time(1, Duration::from_millis(30)).expect("rtt");
    let relay = start(&pool, &outbox, windowed(&kafka).batch_size(500));
    assert!(
        eventually(Duration::from_secs(30), || async { published_count(&pool).await >= 200 }).await,
        "some published before the outage"
    );
    mock.broker_down(1).expect("down");
    let during = published_count(&pool).await;
    // Longer than the message timeout: the relay's purge at its deadline ends the batch.
    tokio::time::sleep(Duration::from_secs(5)).await;
    mock.broker_up(1).expect("up");
    mock.broker_round_trip_time(1, Duration::ZERO).expect("rtt");
    assert!(
        eventually(Duration::from_secs(60), || async { published_count(&pool).await == 3000 }).await,
        "all published after the outage (had {during} when it began)"
    );
    let stats = relay.shutdown().await;
    assert!(stats.retried() > 0, "the outage failed some sends: {stats:?}");
    let records = kafka.read_all(TOPIC, Duration::from_secs(30));
    assert_eq!(order_violations(&records), Vec::<(String, Vec<i64>)>::new());
    assert_eq!(first_appearance(&records).values().map(Vec::len).sum::<usize>(), 3000);
    assert_eq!(stats.order_gaps(), 0);
}

/// Fault: one produce request in the middle of the windows fails with a permanent error
/// (the broker calls its records invalid) while later records of the same partition are
/// queued behind it. Without the gapless guarantee librdkafka would renumber those later
/// records and the broker would write them after the hole. With it, the producer stops at
/// the hole: the failed events are quarantined, their aggregates held back from there, and
/// what the outbox marks published of each aggregate is a gap-free prefix of its versions.
///
/// In Kafka, too, on a broker that checks the idempotent producer's sequence numbers: it
/// refuses anything behind the hole (OUT_OF_ORDER_SEQUENCE_NUMBER). librdkafka's mock
/// cluster checks them only for a transactional producer (`rd_kafka_mock_validate_records`
/// returns at once without a transactional id), so on it a request librdkafka had built
/// before the failure came back may still be written past the hole (CI saw versions 1..26,
/// then 30..33). The relay cannot take such a record back; it must see it acknowledged
/// after the failure, count it (`order_gaps`), and leave its row unpublished behind the
/// failed one. Every record in Kafka past an aggregate's published prefix is one of those.
#[sqlx::test(migrations = false)]
async fn a_permanent_error_inside_a_window_holds_back_from_there(pool: PgPool) {
    let _ = tracing_subscriber::fmt().with_test_writer().with_env_filter("outbox_runtime=info").try_init();
    let kafka = Kafka::mock();
    let mock = kafka.mock_cluster().expect("mock");
    kafka.create_topic(TOPIC, 1).await;
    let outbox = migrate(&pool).await;
    append_hot(&pool, &outbox, "poison", 10, 60).await;
    let mut errors = vec![RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR; 5];
    errors.push(RDKafkaRespErr::RD_KAFKA_RESP_ERR_INVALID_RECORD);
    mock.request_errors(RDKafkaApiKey::Produce, &errors);
    let relay = start(&pool, &outbox, windowed_patient(&kafka));
    assert!(
        eventually(Duration::from_secs(60), || async {
            let failed = rows_in(&pool, "failed").await;
            let pending: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM outbox o WHERE status = 'pending' AND NOT EXISTS \
                 (SELECT 1 FROM outbox f WHERE f.status = 'failed' AND f.aggregate_id = o.aggregate_id AND f.id < o.id)",
            )
            .fetch_one(&pool)
            .await
            .expect("count");
            failed > 0 && pending == 0
        })
        .await,
        "some events failed and everything not behind them was published"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let stats = relay.shutdown().await;
    let records = kafka.read_all(TOPIC, Duration::from_secs(30));
    let rows: Vec<(String, i64, String)> =
        sqlx::query_as("SELECT aggregate_id, aggregate_version, status FROM outbox ORDER BY id")
            .fetch_all(&pool)
            .await
            .expect("rows");
    let in_kafka = first_appearance(&records);
    assert_eq!(in_kafka.len(), 10, "every aggregate has events in Kafka");
    let (mut held_back, mut past_the_hole) = (0, 0);
    for (aggregate, versions) in &in_kafka {
        let of = |status: &str| -> Vec<i64> {
            rows.iter().filter(|r| &r.0 == aggregate && r.2 == status).map(|r| r.1).collect()
        };
        let published = of("published");
        let first_failed = of("failed").first().copied();
        // The outbox: published in order, none skipped, up to right before the first failure.
        let prefix: Vec<i64> = (1..=published.len() as i64).collect();
        assert_eq!(published, prefix, "{aggregate}: marked published in version order, none skipped");
        if let Some(failed) = first_failed {
            assert_eq!(published.len() as i64, failed - 1, "{aggregate}: stops right before v{failed}");
            held_back += 1;
        }
        // Kafka: exactly what was marked published, first and in order...
        assert!(
            versions.len() >= published.len(),
            "{aggregate}: Kafka holds {versions:?}, published {published:?}"
        );
        assert_eq!(
            &versions[..published.len()],
            &published[..],
            "{aggregate}: Kafka holds what was marked published"
        );
        // ...then only what a broker wrote past the hole, behind a failed event, unpublished.
        let past = &versions[published.len()..];
        if !past.is_empty() {
            let failed =
                first_failed.unwrap_or_else(|| panic!("{aggregate}: {past:?} in Kafka, not published"));
            let pending = of("pending");
            assert!(
                past.iter().all(|v| *v > failed && pending.contains(v)),
                "{aggregate}: written past the hole at v{failed}: {past:?}; they must stay pending behind it"
            );
            eprintln!("{aggregate}: the mock cluster wrote {past:?} past the failed v{failed}");
            past_the_hole += past.len();
        }
    }
    assert!(held_back > 0, "the poisoned request failed some aggregate's event");
    assert_eq!(
        stats.order_gaps(),
        past_the_hole as u64,
        "every record written past a hole is one the relay saw acknowledged after the failure"
    );
}
