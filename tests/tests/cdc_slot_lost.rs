//! Test 3 of the change-data-capture relay: the relay down while the load goes on. The
//! slot's retained WAL grows and its status shows it; a relay started again catches up.
//! With a small `max_slot_wal_keep_size` the server removes WAL the slot still needs
//! (`wal_status = 'lost'`): the relay refuses to stream with `Error::Replication` naming the
//! backfill, and the backfill (the polling relay, until nothing is pending) publishes every
//! event.
//!
//! It sets `max_slot_wal_keep_size`, a server-wide setting that would lose the slots of
//! tests running beside it, so it runs on a server of its own, thrown away after it.

use std::time::Duration;

use outbox_runtime::cdc::CdcRelay;
use outbox_runtime::{CancellationToken, Error};
use outbox_tests::cdc_kit::{ours, Slot};
use outbox_tests::db::test_database;
use outbox_tests::kafka::Kafka;
use outbox_tests::pg_server::Cluster;
use outbox_tests::relay_kit::{append_steps, TOPIC};
use outbox_tests::running::{quick, start};
use outbox_tests::{eventually, migrate, rows_in};
use sqlx::PgPool;

/// Sets `max_slot_wal_keep_size` server-wide and reloads the configuration.
async fn keep_size(pool: &PgPool, value: &str) {
    sqlx::query(sqlx::AssertSqlSafe(format!("ALTER SYSTEM SET max_slot_wal_keep_size = '{value}'")))
        .execute(pool)
        .await
        .expect("alter system");
    sqlx::query("SELECT pg_reload_conf()").execute(pool).await.expect("reload");
    // A reload is signalled, not waited for.
    tokio::time::sleep(Duration::from_millis(500)).await;
}

/// Writes about `mb` MiB of WAL in a table of the test's own, switching segments.
async fn write_wal(pool: &PgPool, mb: i64) {
    sqlx::query("CREATE TABLE IF NOT EXISTS filler (b text)").execute(pool).await.expect("filler");
    for _ in 0..mb {
        sqlx::query("INSERT INTO filler SELECT repeat(md5(g::text), 32) FROM generate_series(1, 1000) g")
            .execute(pool)
            .await
            .expect("fill");
    }
    sqlx::query("SELECT pg_switch_wal()").execute(pool).await.expect("switch");
}

#[tokio::test]
async fn a_relay_down_retains_wal_then_catches_up_and_a_lost_slot_is_backfilled() {
    let cluster = Cluster::streaming().expect("a server of the test's own");
    let pool = test_database(&cluster.server()).await;
    let outbox = migrate(&pool).await;
    let slot = Slot::setup(&pool, &outbox).await;
    run(pool, outbox, slot).await;
}

async fn run(pool: PgPool, outbox: outbox_runtime::Outbox, slot: Slot) {
    let kafka = Kafka::start();
    kafka.create_topic(TOPIC, 3).await;
    // 1. The relay down while events and other writes go on: the slot keeps the WAL.
    keep_size(&pool, "256MB").await;
    let mut ids = append_steps(&pool, &outbox, "lost-a", 50, "x").await;
    write_wal(&pool, 24).await;
    let status = slot.config.status(&pool).await.expect("status").expect("the slot");
    eprintln!("relay down: {status:?}");
    let retained = status.retained_bytes.expect("retained");
    assert!(retained > 16 << 20, "the slot keeps the WAL written while no relay streams: {retained}");
    assert_eq!(status.wal_status.as_deref(), Some("reserved"));
    let safe = status.safe_wal_size.expect("a limit is set, so a forecast");
    // The server counts the headroom in whole WAL segments (16 MiB).
    assert!(
        safe < 256 << 20 && safe <= (256 << 20) - retained + (16 << 20),
        "the headroom shrinks with the retained WAL: {safe} left with {retained} retained"
    );

    // 2. The relay catches up, and the slot lets go of the WAL.
    let relay = slot.start(&pool, &outbox, quick(&kafka));
    assert!(eventually(Duration::from_secs(30), || async { rows_in(&pool, "published").await == 50 }).await);
    sqlx::query("SELECT pg_switch_wal()").execute(&pool).await.expect("switch");
    sqlx::query("CHECKPOINT").execute(&pool).await.expect("checkpoint");
    assert!(
        eventually(Duration::from_secs(30), || async {
            let status = slot.config.status(&pool).await.expect("status").expect("the slot");
            status.retained_bytes.is_some_and(|r| r < retained / 2)
        })
        .await,
        "the retained WAL shrinks once the relay confirmed: {:?}",
        slot.config.status(&pool).await
    );
    relay.shutdown().await;

    // 3. Down again, past a small limit: the slot is lost.
    keep_size(&pool, "32MB").await;
    ids.extend(append_steps(&pool, &outbox, "lost-b", 50, "y").await);
    let lost = eventually(Duration::from_secs(60), || async {
        write_wal(&pool, 24).await;
        sqlx::query("CHECKPOINT").execute(&pool).await.expect("checkpoint");
        let status = slot.config.status(&pool).await.expect("status").expect("the slot");
        status.wal_status.as_deref() == Some("lost")
    })
    .await;
    assert!(lost, "the slot is lost past max_slot_wal_keep_size: {:?}", slot.config.status(&pool).await);

    // Bounded: a relay that missed the loss would stream (or retry) until cancelled.
    let error = tokio::time::timeout(
        Duration::from_secs(60),
        CdcRelay::new(pool.clone(), outbox.clone(), quick(&kafka), slot.config.clone())
            .expect("relay")
            .run(CancellationToken::new()),
    )
    .await
    .expect("the relay stops by itself on a lost slot, within 60 s")
    .expect_err("a lost slot is not streamed from");
    let text = error.to_string();
    eprintln!("the relay on a lost slot: {text}");
    assert!(matches!(error, Error::Replication(_)), "{error:?}");
    assert!(text.contains("lost") && text.contains("backfill"), "names the state and the recovery: {text}");
    assert_eq!(rows_in(&pool, "pending").await, 50, "the events after the loss wait in the table");

    // 4. The backfill: the polling relay until nothing is pending.
    let backfill = start(&pool, &outbox, quick(&kafka));
    assert!(eventually(Duration::from_secs(30), || async { rows_in(&pool, "pending").await == 0 }).await);
    backfill.shutdown().await;
    assert_eq!(rows_in(&pool, "published").await, 100);
    let records = ours(kafka.read_all(TOPIC, Duration::from_secs(60)), &ids);
    let events: std::collections::BTreeSet<&String> =
        records.iter().filter_map(|r| r.headers.get("ce_id")).collect();
    assert_eq!(events.len(), 100, "every event is in the topic");
}
