//! The relay partitions as the Java client does (invariant 13): a record keyed by an
//! aggregate id lands on `toPositive(murmur2(key)) % partitions`, so producers in other
//! languages keyed by the same id (Java, kafkajs' Java-compatible partitioner, Debezium)
//! put it on the same partition and per-aggregate order holds across them.
//!
//! Ground truth: the Java client's `Utils.murmur2`, ported below and held to the vectors
//! of Kafka's own `UtilsTest` and librdkafka's `unittest_murmur2`; then the partitions
//! librdkafka's producer chose, read back from the outbox rows the relay marked, are
//! compared with it for fixed and for generated keys.

use std::time::Duration;

use outbox_runtime::{AppendOptions, NewEvent, OutboxEvent};
use outbox_tests::running::{quick, start};
use outbox_tests::{eventually, kafka::Kafka, migrate, Rng};
use schemars::JsonSchema;
use serde::Serialize;
use sqlx::PgPool;

const PARTITIONS: i32 = 6;

#[derive(Serialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "test.keyed", schema_version = 1, aggregate = "keyed", topic = "outbox-test-murmur2")]
struct Keyed {
    #[outbox(aggregate_id)]
    key: String,
}

/// The Java client's `org.apache.kafka.common.utils.Utils.murmur2`.
fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h = SEED ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The Java client's default partition of a keyed record.
fn java_partition(key: &str, partitions: i32) -> i32 {
    (murmur2(key.as_bytes()) & 0x7fff_ffff) % partitions
}

#[test]
fn the_port_matches_the_java_clients_and_librdkafkas_own_vectors() {
    // Kafka's UtilsTest.testMurmur2.
    for (key, hash) in [
        ("21", -973_932_308),
        ("foobar", -790_332_482),
        ("a-little-bit-long-string", -985_981_536),
        ("a-little-bit-longer-string", -1_486_304_829),
        ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58_897_971),
        ("abc", 479_470_107),
    ] {
        assert_eq!(murmur2(key.as_bytes()), hash, "{key}");
    }
    // librdkafka's unittest_murmur2 (java_murmur2_results).
    for (key, hash) in [
        ("kafka", 0xd067_cf64_u32),
        ("giberish123456789", 0x8f55_2b0c),
        ("1234", 0x9fc9_7b14),
        ("234", 0xe7c0_09ca),
        ("34", 0x8739_30da),
        ("4", 0x5a4b_5ca1),
        ("PreAmbleWillBeRemoved,ThePrePartThatIs", 0x7842_4f1c),
        ("reAmbleWillBeRemoved,ThePrePartThatIs", 0x4a62_b377),
        ("eAmbleWillBeRemoved,ThePrePartThatIs", 0xe0e4_e09e),
        ("AmbleWillBeRemoved,ThePrePartThatIs", 0x62b8_b43f),
        ("", 0x106e_08d9),
    ] {
        assert_eq!(murmur2(key.as_bytes()) as u32, hash, "{key}");
    }
}

/// Keys the relay published, with the partition the broker acknowledged for each.
async fn published_partitions(pool: &PgPool) -> Vec<(String, i32)> {
    sqlx::query_as(
        "SELECT aggregate_id, kafka_partition FROM outbox WHERE event_type = 'test.keyed' \
         AND status = 'published' ORDER BY id",
    )
    .fetch_all(pool)
    .await
    .expect("published rows")
}

#[sqlx::test(migrations = false)]
async fn the_relay_puts_each_key_where_the_java_client_would(pool: PgPool) {
    let kafka = Kafka::start();
    kafka.create_topic(Keyed::TOPIC, PARTITIONS).await;
    let outbox = migrate(&pool).await;
    let mut rng = Rng::from_env("partitioner");
    // Fixed keys with known partitions, then generated ones (any printable bytes, any length).
    let mut keys: Vec<String> = ["21", "foobar", "abc", "kafka", "hejsan", "1"].map(String::from).to_vec();
    for _ in 0..200 {
        let len = rng.range(1, 40) as usize;
        keys.push((0..len).map(|_| char::from(rng.range(0x21, 0x7f) as u8)).collect());
    }
    keys.push("ünïcödé-aggregate-✓".to_owned());
    let events: Vec<NewEvent> = keys
        .iter()
        .map(|key| NewEvent::new(&Keyed { key: key.clone() }, AppendOptions::default()).expect("event"))
        .collect();
    let mut tx = pool.begin().await.expect("begin");
    outbox.append_batch(&mut tx, &events).await.expect("append");
    tx.commit().await.expect("commit");

    let relay = start(&pool, &outbox, quick(&kafka));
    let all_published = eventually(Duration::from_secs(60), || async {
        published_partitions(&pool).await.len() == keys.len()
    })
    .await;
    relay.shutdown().await;
    assert!(all_published, "every event published");

    let published = published_partitions(&pool).await;
    let known: Vec<(&str, i32)> =
        vec![("21", 0), ("foobar", 0), ("abc", 3), ("kafka", 4), ("hejsan", 1), ("1", 3)];
    for (key, partition) in known {
        let got = published.iter().find(|(k, _)| k == key).map(|(_, p)| *p);
        assert_eq!(got, Some(partition), "key {key:?}: the Java client's partition of {PARTITIONS}");
    }
    let wrong: Vec<String> = published
        .iter()
        .filter(|(key, partition)| java_partition(key, PARTITIONS) != *partition)
        .map(|(key, partition)| format!("{key:?} on {partition}, Java: {}", java_partition(key, PARTITIONS)))
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of {} keys not where Java puts them: {wrong:?}",
        wrong.len(),
        published.len()
    );
}

/// The partitioner is a setting like any other: a service that must keep librdkafka's
/// default (CRC32) for topics it already fills can say so.
#[sqlx::test(migrations = false)]
async fn the_partitioner_can_be_set_back_to_librdkafkas_default(pool: PgPool) {
    let kafka = Kafka::start();
    kafka.create_topic(Keyed::TOPIC, PARTITIONS).await;
    let outbox = migrate(&pool).await;
    let keys: Vec<String> = (0..60).map(|n| format!("order-{n}")).collect();
    let events: Vec<NewEvent> = keys
        .iter()
        .map(|key| NewEvent::new(&Keyed { key: key.clone() }, AppendOptions::default()).expect("event"))
        .collect();
    let mut tx = pool.begin().await.expect("begin");
    outbox.append_batch(&mut tx, &events).await.expect("append");
    tx.commit().await.expect("commit");
    let relay = start(&pool, &outbox, quick(&kafka).kafka_setting("partitioner", "consistent_random"));
    let all_published = eventually(Duration::from_secs(60), || async {
        published_partitions(&pool).await.len() == keys.len()
    })
    .await;
    relay.shutdown().await;
    assert!(all_published, "every event published");
    let published = published_partitions(&pool).await;
    let differing = published.iter().filter(|(key, p)| java_partition(key, PARTITIONS) != *p).count();
    assert!(
        differing > 0,
        "with consistent_random (CRC32) some of 60 keys land elsewhere than murmur2 puts them"
    );
}
