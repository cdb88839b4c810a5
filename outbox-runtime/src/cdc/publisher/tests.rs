//! The publisher's reading of the table against real PostgreSQL.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::PgPool;
use tokio::sync::Semaphore;

use super::{Meta, Publisher};
use crate::cdc::marks::State;
use crate::relay::claim::Row;
use crate::relay::{publish, RelayConfig};
use crate::Outbox;

fn row(id: i64) -> Row {
    Row {
        id,
        event_id: uuid::Uuid::new_v4(),
        aggregate_type: "t".into(),
        aggregate_id: "a".into(),
        aggregate_version: None,
        event_type: "e".into(),
        schema_version: 1,
        topic: "x".into(),
        payload: "{}".into(),
        headers: "{}".into(),
        created_at: "2026-12-02T00:00:00.000000Z".into(),
        attempts: 0,
        work_partition: 0,
    }
}

fn meta(xid: u32) -> Meta {
    let budget = Arc::new(Semaphore::new(1));
    let flight = crate::relay::flight::Flight::new(&Arc::default(), ["t"]);
    Meta { seq: 0, xid, _permit: budget.try_acquire_owned().expect("a permit"), flight }
}

/// The stream can carry a transaction the moment its commit is in the WAL, before a new
/// snapshot sees it (with synchronous replication, until the standbys confirm). Such a
/// row was taken for deleted, skipped and its commit confirmed: `cargo xtask chaos --cdc`
/// lost 2 of 2,000 events that way. It is waited for now; a row that is really gone is
/// not.
#[sqlx::test(migrations = false)]
async fn a_row_not_visible_yet_is_waited_for_and_a_deleted_one_is_not(pool: PgPool) {
    let outbox = Outbox::default_ref().clone();
    outbox.migrator().run(&pool).await.expect("migrate");
    let mut tx = pool.begin().await.expect("begin");
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, schema_version, topic, payload) \
         VALUES (gen_random_uuid(), 't', 'a', 'e', 1, 'x', '{}') RETURNING id",
    )
    .fetch_one(&mut *tx)
    .await
    .expect("insert");
    let xid: i64 = sqlx::query_scalar("SELECT pg_current_xact_id()::text::bigint")
        .fetch_one(&mut *tx)
        .await
        .expect("xid");
    let xid = u32::try_from(xid & 0xffff_ffff).expect("32 bits");
    let config = RelayConfig::new("127.0.0.1:1");
    let producer = publish::producer("127.0.0.1:1", &Default::default()).expect("producer");
    let publisher = Publisher::new(pool.clone(), outbox.names(), config, producer, Arc::default());

    let committing = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        tx.commit().await.expect("commit");
    });
    let started = Instant::now();
    let states = publisher.states(&[(row(id), meta(xid))]).await.expect("states");
    committing.await.expect("committed");
    assert_eq!(states.get(&id), Some(&State::Mine), "the row, once its transaction is visible");
    assert!(started.elapsed() >= Duration::from_millis(250), "it was waited for");

    // A row its (ended) transaction wrote and that is gone since: skipped without a wait.
    let started = Instant::now();
    let states = publisher.states(&[(row(id + 1_000), meta(xid))]).await.expect("states");
    assert_eq!(states.get(&(id + 1_000)), Some(&State::Gone), "gone");
    assert!(started.elapsed() < Duration::from_secs(2), "not waited for: {:?}", started.elapsed());
}
