//! The change-data-capture relay's faults: stopped abruptly (in the middle of a large
//! transaction too), Kafka down, standbys taking the slot over, the slot dropped under it.
//! What it confirms never passes what Kafka holds; nothing is lost, order per aggregate
//! holds.

use std::time::Duration;

use outbox_runtime::Error;
use outbox_tests::cdc_kit::{self, first_versions, lsn_number, Slot};
use outbox_tests::kafka::Kafka;
use outbox_tests::relay_kit::{append_steps, has_all, TOPIC};
use outbox_tests::running::quick;
use outbox_tests::{eventually, migrate, rows_in, Rng};

use uuid::Uuid;

/// A relay stopped abruptly (its task dropped: no last status, the producer gone) at
/// random points while transactions of many rows commit: the next one sends again what
/// was not confirmed and never skips; the slot's confirmed position never passes an event
/// that is not in Kafka.
#[tokio::test]
async fn an_abrupt_stop_sends_again_and_never_skips() {
    let pool = cdc_kit::database().await;
    // The mock cluster, slowed down: acknowledgements take longer than the status
    // interval, so that a position confirmed before its acknowledgement would reach the
    // server before the stop.
    let kafka = Kafka::mock();
    let mock = kafka.mock_cluster().expect("mock");
    kafka.create_topic(TOPIC, 3).await;
    let outbox = migrate(&pool).await;
    let slot = Slot::setup(&pool, &outbox).await;
    let seed = Rng::seed_from_env("an_abrupt_stop_sends_again_and_never_skips");
    let mut rng = Rng::seeded(seed);
    let keys: Vec<String> = (0..5).map(|i| format!("r{i}-{}", Uuid::new_v4().simple())).collect();
    let mut ids = Vec::new();
    for round in 0..6 {
        // Several rows per transaction: they share one commit position.
        for key in &keys {
            ids.extend(append_steps(&pool, &outbox, key, 1 + rng.range(0, 40) as i64, "z").await);
        }
        mock.broker_round_trip_time(1, Duration::from_millis(rng.range(0, 600))).expect("rtt");
        let relay = slot.start(&pool, &outbox, quick(&kafka));
        tokio::time::sleep(Duration::from_millis(rng.range(50, 1500))).await;
        relay.task.abort();
        let _ = relay.task.await;
        let confirmed = slot.confirmed(&pool).await;
        let records = kafka.read_all(TOPIC, Duration::from_secs(30));
        // Every row committed at or before the confirmed position is in Kafka: the rows not
        // in Kafka belong to commits after it.
        let missing: Vec<String> = ids
            .iter()
            .map(Uuid::to_string)
            .filter(|id| !records.iter().any(|r| &r.headers["ce_id"] == id))
            .collect();
        if !missing.is_empty() {
            let pending: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM outbox WHERE status = 'published' AND event_id::text = ANY($1)",
            )
            .bind(&missing)
            .fetch_one(&pool)
            .await
            .expect("count");
            assert_eq!(pending, 0, "seed {seed} round {round}: a row marked published is missing from Kafka");
        }
        println!(
            "round {round}: confirmed {confirmed:x}, {} of {} in Kafka",
            ids.len() - missing.len(),
            ids.len()
        );
    }
    mock.broker_round_trip_time(1, Duration::ZERO).expect("rtt");
    let relay = slot.start(&pool, &outbox, quick(&kafka));
    let total = ids.len() as i64;
    assert!(
        eventually(Duration::from_secs(60), || async { rows_in(&pool, "published").await == total }).await,
        "seed {seed}"
    );
    relay.shutdown().await;
    let records = kafka.read_all(TOPIC, Duration::from_secs(30));
    assert!(has_all(&ids)(&records), "seed {seed}: nothing skipped");
    for key in &keys {
        let versions = first_versions(&records, key);
        assert!(
            versions.windows(2).all(|w| w[0] < w[1] || w[1] == 1),
            "seed {seed}: {key} in order: {versions:?}"
        );
    }
}

/// Kafka down while events are streamed: the relay keeps its stream (the same server
/// process all along, keepalives answered), the slot's confirmed position does not pass
/// the events' commit, and a relay stopped abruptly then and started again once the
/// broker is back publishes every one of them. Confirming a commit before its
/// acknowledgement loses them here.
#[tokio::test]
async fn kafka_down_holds_the_confirmed_position_and_loses_nothing() {
    let pool = cdc_kit::database().await;
    let kafka = Kafka::mock();
    kafka.create_topic(TOPIC, 3).await;
    let mock = kafka.mock_cluster().expect("mock");
    let outbox = migrate(&pool).await;
    let slot = Slot::setup(&pool, &outbox).await;
    mock.broker_down(1).expect("broker down");
    let relay = slot.start(&pool, &outbox, quick(&kafka));
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.extend(append_steps(&pool, &outbox, &format!("down-{i}-{}", Uuid::new_v4()), 25, "x").await);
    }
    let pid = || async {
        sqlx::query_scalar::<_, Option<i32>>(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(slot.name())
        .fetch_one(&pool)
        .await
        .expect("slot")
    };
    assert!(eventually(Duration::from_secs(10), || async { pid().await.is_some() }).await, "streaming");
    let first = pid().await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(pid().await, first, "the same stream all along the outage");
    assert_eq!(rows_in(&pool, "published").await, 0);
    relay.task.abort();
    let _ = relay.task.await;
    mock.broker_up(1).expect("broker up");
    let relay = slot.start(&pool, &outbox, quick(&kafka));
    assert!(
        eventually(Duration::from_secs(30), || async { rows_in(&pool, "published").await == 100 }).await,
        "every event published after the outage"
    );
    relay.shutdown().await;
    let records = kafka.read_all(TOPIC, Duration::from_secs(30));
    assert!(has_all(&ids)(&records));
}

/// Three relays on one slot: one streams, two stand by; each time the streaming one is
/// stopped abruptly, another takes the slot over. Every event arrives, each aggregate's in
/// order (first copies), whatever the takeovers.
#[tokio::test]
async fn standbys_take_the_slot_over_and_keep_the_order() {
    let pool = cdc_kit::database().await;
    let kafka = Kafka::start();
    kafka.create_topic(TOPIC, 3).await;
    let outbox = migrate(&pool).await;
    let slot = Slot::setup(&pool, &outbox).await;
    let mut relays: Vec<_> = (0..3).map(|_| slot.start(&pool, &outbox, quick(&kafka))).collect();
    let streaming = || async {
        sqlx::query_scalar::<_, Option<i32>>(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(slot.name())
        .fetch_one(&pool)
        .await
        .expect("slot")
    };
    let keys: Vec<String> = (0..6).map(|i| format!("t{i}-{}", Uuid::new_v4().simple())).collect();
    let mut ids = Vec::new();
    let mut takeovers = 0;
    for round in 0..4 {
        for key in &keys {
            ids.extend(append_steps(&pool, &outbox, key, 5, "t").await);
        }
        assert!(
            eventually(Duration::from_secs(20), || async { streaming().await.is_some() }).await,
            "round {round}: one streams"
        );
        let before = streaming().await;
        // Stop the one that streams: the one whose task still runs and that published.
        // The slot can be active before the relay holding it has sent its first batch
        // (it took over at the end of the last round), so wait for that batch.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let active = loop {
            if let Some(i) = relays.iter().position(|r| r.stats.batches() > 0 && !r.task.is_finished()) {
                break i;
            }
            assert!(tokio::time::Instant::now() < deadline, "round {round}: no relay published");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let stopped = relays.remove(active);
        stopped.task.abort();
        let _ = stopped.task.await;
        relays.push(slot.start(&pool, &outbox, quick(&kafka)));
        let taken = eventually(Duration::from_secs(20), || async {
            let now = streaming().await;
            now.is_some() && now != before
        })
        .await;
        assert!(taken, "round {round}: a standby took the slot over");
        takeovers += 1;
    }
    let total = ids.len() as i64;
    assert!(
        eventually(Duration::from_secs(60), || async { rows_in(&pool, "published").await == total }).await
    );
    for relay in relays {
        relay.shutdown().await;
    }
    let records = kafka.read_all(TOPIC, Duration::from_secs(30));
    assert!(has_all(&ids)(&records));
    for key in &keys {
        assert_eq!(first_versions(&records, key), (1..=5).cycle().take(20).collect::<Vec<i64>>(), "{key}");
    }
    assert_eq!(takeovers, 4);
}

/// One transaction of 6,000 events (the mock cluster keeps 5 MB of a partition), its rows
/// sharing one commit position, streamed with a memory budget of 256 KiB and stopped
/// abruptly in the middle: the confirmed position stays before that commit, and the next
/// relay sends the rest (the events already marked published are not sent again), in
/// order.
#[tokio::test]
async fn a_large_transaction_stopped_in_the_middle_is_finished_after_a_restart() {
    let pool = cdc_kit::database().await;
    let kafka = Kafka::mock();
    kafka.create_topic(TOPIC, 3).await;
    let outbox = migrate(&pool).await;
    let slot = Slot::setup(&pool, &outbox).await;
    let before = slot.confirmed(&pool).await;
    let key = format!("large-{}", Uuid::new_v4().simple());
    let ids = append_steps(&pool, &outbox, &key, 6_000, "payload of the large transaction").await;
    let end: String =
        sqlx::query_scalar("SELECT pg_current_wal_lsn()::text").fetch_one(&pool).await.expect("lsn");
    let end = lsn_number(&end);
    let config = || quick(&kafka).batch_size(200);
    let relay = slot.start_with(&pool, &outbox, config(), slot.config.clone().max_buffered_bytes(256 << 10));
    assert!(
        eventually(Duration::from_secs(60), || async { rows_in(&pool, "published").await >= 600 }).await,
        "under way"
    );
    relay.task.abort();
    let _ = relay.task.await;
    let marked = rows_in(&pool, "published").await;
    assert!(marked < 6_000, "stopped in the middle ({marked} marked)");
    let confirmed = slot.confirmed(&pool).await;
    assert!(
        confirmed < end,
        "the confirmed position {confirmed:x} passed the unfinished commit (ends by {end:x}, was {before:x})"
    );
    let relay = slot.start(&pool, &outbox, config());
    assert!(
        eventually(Duration::from_secs(120), || async { rows_in(&pool, "published").await == 6_000 }).await
    );
    relay.shutdown().await;
    let records = kafka.read_all(TOPIC, Duration::from_secs(60));
    assert!(has_all(&ids)(&records));
    let versions = first_versions(&records, &key);
    assert_eq!(versions, (1..=6_000).collect::<Vec<i64>>(), "in order");
    assert!(
        records.len() < 6_000 + 2 * 500 + 8192,
        "events marked published are not sent again: {} records",
        records.len()
    );
}

/// The slot dropped under a running relay: it stops with an error that says to backfill,
/// and does not create the slot again.
#[tokio::test]
async fn a_dropped_slot_stops_the_relay_and_is_not_created_again() {
    let pool = cdc_kit::database().await;
    let kafka = Kafka::start();
    kafka.create_topic(TOPIC, 3).await;
    let outbox = migrate(&pool).await;
    let slot = Slot::setup(&pool, &outbox).await;
    let relay = slot.start(&pool, &outbox, quick(&kafka));
    append_steps(&pool, &outbox, "dropped", 2, "x").await;
    assert!(eventually(Duration::from_secs(30), || async { rows_in(&pool, "published").await == 2 }).await);
    let dropped = eventually(Duration::from_secs(10), || async {
        let _ = sqlx::query(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(slot.name())
        .execute(&pool)
        .await;
        sqlx::query("SELECT pg_drop_replication_slot($1)").bind(slot.name()).execute(&pool).await.is_ok()
    })
    .await;
    assert!(dropped, "the slot could be dropped");
    let ended = tokio::time::timeout(Duration::from_secs(30), relay.task)
        .await
        .expect("the relay stops")
        .expect("task");
    let error = ended.expect_err("an error");
    assert!(matches!(error, Error::Replication(_)), "{error:?}");
    assert!(error.to_string().contains("backfill"), "{error}");
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)")
            .bind(slot.name())
            .fetch_one(&pool)
            .await
            .expect("slots");
    assert!(!exists, "no slot created again");
}
