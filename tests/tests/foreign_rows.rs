//! Rows that another writer put in the outbox table by hand, with a `created_at` that
//! PostgreSQL accepts and CloudEvents cannot carry (`ce_time` is RFC 3339: a finite time,
//! years 0001 to 9999): `infinity`, `-infinity`, year 10000, a date BC. Each is parked with
//! a reason that names `created_at`, holding back only its own aggregate, under both
//! relays; the years at the edges of the range publish, with the same `ce_time` from both.
//!
//! Before the fix, such a row stopped everything: the polling relay's claim read a NULL
//! `ce_time` (`to_char` of an infinite time) and failed at every poll, and the
//! change-data-capture relay stopped with a fatal decode error.

use std::time::Duration;

use outbox_runtime::Outbox;
use outbox_tests::cdc_kit::{self, Slot};
use outbox_tests::kafka::{Kafka, Record};
use outbox_tests::relay_kit::{append_steps, has_all, TOPIC};
use outbox_tests::running::{quick, start, Running};
use outbox_tests::{eventually, migrate, rows_in};
use sqlx::PgPool;
use uuid::Uuid;

/// `created_at` values PostgreSQL takes and RFC 3339 cannot express.
const UNREPRESENTABLE: [&str; 4] =
    ["infinity", "-infinity", "10000-01-01 00:00:00+00", "0044-03-15 12:00:00+00 BC"];
/// The first and last instants RFC 3339 can express, and the `ce_time` each must carry.
const EDGES: [(&str, &str); 2] = [
    ("0001-01-01 00:00:00+00", "0001-01-01T00:00:00.000000Z"),
    ("9999-12-31 23:59:59.999999+00", "9999-12-31T23:59:59.999999Z"),
];

/// Inserts, by hand, versions 1 to 3 of `aggregate` with version 2 created at `created_at`.
async fn insert_by_hand(pool: &PgPool, aggregate: &str, created_at: &str) -> Vec<Uuid> {
    let ids: Vec<Uuid> = (0..3).map(|_| Uuid::new_v4()).collect();
    for (v, id) in (1_i64..).zip(&ids) {
        sqlx::query(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, \
                                 schema_version, topic, payload, created_at) \
             VALUES ($1, 'test', $2, $3, 'test.step', 1, $4, '{\"n\":1}', \
                     CASE WHEN $3 = 2 THEN $5::timestamptz ELSE now() END)",
        )
        .bind(id)
        .bind(aggregate)
        .bind(v)
        .bind(TOPIC)
        .bind(created_at)
        .execute(pool)
        .await
        .expect("insert by hand");
    }
    ids
}

/// Writes the cases, runs `relay` until they settle and checks what became of each.
async fn check(pool: &PgPool, outbox: &Outbox, kafka: &Kafka, relay: Running) {
    let mut bad = Vec::new();
    for (i, created_at) in UNREPRESENTABLE.iter().enumerate() {
        let aggregate = format!("bad-{i}-{}", Uuid::new_v4());
        bad.push((aggregate.clone(), *created_at, insert_by_hand(pool, &aggregate, created_at).await));
    }
    let mut edges = Vec::new();
    for (i, (created_at, ce_time)) in EDGES.iter().enumerate() {
        let aggregate = format!("edge-{i}-{}", Uuid::new_v4());
        edges.push((insert_by_hand(pool, &aggregate, created_at).await[1], *ce_time));
    }
    let healthy = append_steps(pool, outbox, &format!("healthy-{}", Uuid::new_v4()), 5, "ok").await;
    // 4 × (1 published, 1 parked, 1 held back), 2 × 3 published, 5 published.
    let settled = eventually(Duration::from_secs(60), || async {
        rows_in(pool, "published").await == 4 + 6 + 5 && rows_in(pool, "failed").await == 4
    })
    .await;
    // A few more rounds: the held-back versions must stay pending.
    tokio::time::sleep(Duration::from_secs(1)).await;
    relay.shutdown().await;
    assert!(
        settled,
        "published {}, failed {}",
        rows_in(pool, "published").await,
        rows_in(pool, "failed").await
    );
    for (aggregate, created_at, ids) in &bad {
        let rows: Vec<(Uuid, String, Option<String>)> = sqlx::query_as(
            "SELECT event_id, status, last_error FROM outbox WHERE aggregate_id = $1 ORDER BY aggregate_version",
        )
        .bind(aggregate)
        .fetch_all(pool)
        .await
        .expect("rows");
        let statuses: Vec<&str> = rows.iter().map(|r| r.1.as_str()).collect();
        assert_eq!(statuses, ["published", "failed", "pending"], "created_at {created_at}");
        assert_eq!(rows.iter().map(|r| r.0).collect::<Vec<_>>(), *ids);
        let reason = rows[1].2.clone().unwrap_or_default();
        assert!(reason.contains("created_at"), "the reason names the column ({created_at}): {reason}");
    }
    let records: Vec<Record> = kafka.read_all(TOPIC, Duration::from_secs(30));
    assert!(has_all(&healthy)(&records), "the other aggregates are published");
    for (id, expected) in edges {
        let record =
            records.iter().find(|r| r.headers.get("ce_id") == Some(&id.to_string())).expect("edge record");
        assert_eq!(record.headers["ce_time"], expected);
    }
}

#[sqlx::test(migrations = false)]
async fn the_polling_relay_parks_a_created_at_cloudevents_cannot_carry(pool: PgPool) {
    let kafka = Kafka::start();
    kafka.create_topic(TOPIC, 3).await;
    let outbox = migrate(&pool).await;
    let relay = start(&pool, &outbox, quick(&kafka));
    check(&pool, &outbox, &kafka, relay).await;
}

#[tokio::test]
async fn the_cdc_relay_parks_a_created_at_cloudevents_cannot_carry() {
    let pool = cdc_kit::database().await;
    let kafka = Kafka::start();
    kafka.create_topic(TOPIC, 3).await;
    let outbox = migrate(&pool).await;
    let slot = Slot::setup(&pool, &outbox).await;
    let relay = slot.start(&pool, &outbox, quick(&kafka));
    check(&pool, &outbox, &kafka, relay).await;
}
