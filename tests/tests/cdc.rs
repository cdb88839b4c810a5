//! The change-data-capture relay against real PostgreSQL (`wal_level = logical`, a slot of
//! each test's own) and a Kafka-protocol broker: the records it writes are the polling
//! relay's, commit order per aggregate, rolled-back transactions, failures held back per
//! aggregate, the table path, an `ALTER TABLE` while streaming, a missing slot. Its
//! faults (stops, Kafka down, takeovers, a dropped slot) are in `cdc_faults.rs`.

use std::time::Duration;

use outbox_runtime::cdc::CdcRelay;
use outbox_runtime::ops::RetryTarget;
use outbox_runtime::{AppendOptions, CancellationToken, Error, NewEvent, Outbox, OutboxConfig};
use outbox_tests::cdc_kit::{self, by_event, first_versions, ours, Slot};
use outbox_tests::kafka::Kafka;
use outbox_tests::relay_kit::{append_steps, has_all, records_for, TOPIC};
use outbox_tests::running::{quick, start};
use outbox_tests::{eventually, migrate, rows_in, Step};
use sqlx::AssertSqlSafe;
use uuid::Uuid;

/// The same rows through the polling relay (table `outbox`) and the stream (a twin table,
/// its rows copied with another topic): every record has the same key, value, headers
/// and partition. A difference in any byte of them fails.
#[tokio::test]
async fn writes_the_records_the_polling_relay_writes() {
    let pool = cdc_kit::database().await;
    let kafka = Kafka::start();
    let streamed_topic = format!("{TOPIC}-cdc");
    kafka.create_topic(TOPIC, 3).await;
    kafka.create_topic(&streamed_topic, 3).await;
    let outbox = migrate(&pool).await;
    let twin = Outbox::new(OutboxConfig::default().table("outbox_twin")).expect("twin outbox");
    twin.migrator().run(&pool).await.expect("twin migrations");
    let slot = Slot::setup(&pool, &twin).await;

    let mut ids = Vec::new();
    for i in 0..8 {
        ids.extend(
            append_steps(&pool, &outbox, &format!("agg-{i}-{}", Uuid::new_v4()), 4, "d\u{e9}j\u{e0} \"vu\"")
                .await,
        );
    }
    // Without an aggregate version, with a big integer and headers of its own.
    // The topics may hold other runs' records (a broker process keeps them): only this
    // test's events are compared.
    let odd = NewEvent::new(
        &Step { id: "odd".into(), n: i64::MAX, data: "\u{1F600}\n\t".into() },
        AppendOptions::default()
            .header("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
    )
    .expect("event");
    ids.push(odd.event_id());
    let mut tx = pool.begin().await.expect("begin");
    outbox.append_batch(&mut tx, &[odd]).await.expect("append");
    tx.commit().await.expect("commit");
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO outbox_twin (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, \
             schema_version, topic, payload, headers, created_at) \
         SELECT event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, \
             '{streamed_topic}', payload, headers, created_at FROM outbox ORDER BY id"
    )))
    .execute(&pool)
    .await
    .expect("copy");

    let polling = start(&pool, &outbox, quick(&kafka));
    let streaming = slot.start(&pool, &twin, quick(&kafka));
    let twin_published = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox_twin WHERE status = 'published'")
            .fetch_one(&pool)
            .await
            .expect("count")
    };
    assert!(
        eventually(Duration::from_secs(30), || async {
            rows_in(&pool, "published").await == 33 && twin_published().await == 33
        })
        .await,
        "both relays publish all 33 events"
    );
    polling.shutdown().await;
    let stats = streaming.shutdown().await;
    assert_eq!(stats.published(), 33);

    let polled = ours(kafka.read_all(TOPIC, Duration::from_secs(30)), &ids);
    let streamed = ours(kafka.read_all(&streamed_topic, Duration::from_secs(30)), &ids);
    assert_eq!((polled.len(), streamed.len()), (33, 33), "each event once");
    let (polled, streamed) = (by_event(&polled), by_event(&streamed));
    for (event_id, p) in &polled {
        let s = streamed.get(event_id).unwrap_or_else(|| panic!("event {event_id} was not streamed"));
        assert_eq!((&s.key, &s.value, s.partition), (&p.key, &p.value, p.partition), "event {event_id}");
        assert_eq!(s.headers, p.headers, "event {event_id}: headers");
    }
    assert!(polled.values().any(|r| r.headers.contains_key("traceparent")), "the trace header went through");
    let placement: Vec<(i32, i64)> =
        sqlx::query_as("SELECT kafka_partition, kafka_offset FROM outbox_twin ORDER BY id")
            .fetch_all(&pool)
            .await
            .expect("rows");
    let mut recorded: Vec<(i32, i64)> = streamed.values().map(|r| (r.partition, r.offset)).collect();
    let mut marked = placement.clone();
    recorded.sort_unstable();
    marked.sort_unstable();
    assert_eq!(marked, recorded, "each row is marked with where Kafka put it");
}

/// Many transactions append to a few aggregates while the relay streams, one in four
/// rolled back: Kafka holds every committed event and no rolled-back one, each
/// aggregate's in commit order.
#[tokio::test]
async fn commit_order_per_aggregate_and_nothing_of_a_rollback() {
    let pool = cdc_kit::database().await;
    let kafka = Kafka::start();
    kafka.create_topic(TOPIC, 3).await;
    let outbox = migrate(&pool).await;
    let slot = Slot::setup(&pool, &outbox).await;
    let relay = slot.start(&pool, &outbox, quick(&kafka));
    let keys: Vec<String> = (0..4).map(|i| format!("k{i}-{}", Uuid::new_v4().simple())).collect();
    let mut tasks = Vec::new();
    for worker in 0..8 {
        let (pool, outbox, keys) = (pool.clone(), outbox.clone(), keys.clone());
        tasks.push(tokio::spawn(async move {
            let mut committed = Vec::new();
            let mut rolled_back = Vec::new();
            for round in 0..20 {
                let key = &keys[(worker + round) % keys.len()];
                let events: Vec<NewEvent> = (0..(1 + round % 3))
                    .map(|_| {
                        NewEvent::new(
                            &Step { id: key.clone(), n: 0, data: String::new() },
                            AppendOptions::default(),
                        )
                        .expect("event")
                    })
                    .collect();
                let mut tx = pool.begin().await.expect("begin");
                outbox.append_batch(&mut tx, &events).await.expect("append");
                let ids = events.iter().map(NewEvent::event_id);
                if round % 4 == 3 {
                    tx.rollback().await.expect("rollback");
                    rolled_back.extend(ids);
                } else {
                    tx.commit().await.expect("commit");
                    committed.extend(ids);
                }
            }
            (committed, rolled_back)
        }));
    }
    let mut committed = Vec::new();
    let mut rolled_back = Vec::new();
    for task in tasks {
        let (c, r) = task.await.expect("worker");
        committed.extend(c);
        rolled_back.extend(r);
    }
    let total = committed.len() as i64;
    assert!(
        eventually(Duration::from_secs(60), || async { rows_in(&pool, "published").await == total }).await
    );
    relay.shutdown().await;
    let records = kafka.read_all(TOPIC, Duration::from_secs(30));
    assert!(has_all(&committed)(&records), "every committed event is in Kafka");
    let rolled: std::collections::HashSet<String> = rolled_back.iter().map(Uuid::to_string).collect();
    assert!(
        !records.iter().any(|r| rolled.contains(&r.headers["ce_id"])),
        "no rolled-back event is in Kafka"
    );
    // Commit order of one aggregate is the order of its ids (appends to it are serialised).
    for key in &keys {
        let order: Vec<String> =
            sqlx::query_scalar("SELECT event_id::text FROM outbox WHERE aggregate_id = $1 ORDER BY id")
                .bind(key)
                .fetch_all(&pool)
                .await
                .expect("rows");
        let mut seen = std::collections::HashSet::new();
        let in_kafka: Vec<String> = records_for(&records, key)
            .iter()
            .map(|r| r.headers["ce_id"].clone())
            .filter(|id| seen.insert(id.clone()))
            .collect();
        assert_eq!(in_kafka, order, "aggregate {key} in commit order");
    }
}

/// Without the slot, the publication or the table in it, the relay refuses to start and
/// names what to run; it creates nothing itself.
#[tokio::test]
async fn refuses_to_start_without_its_slot_or_publication() {
    let pool = cdc_kit::database().await;
    let kafka = Kafka::start();
    let outbox = migrate(&pool).await;
    let slot = Slot::named(&pool).await;
    let run = |config| {
        let relay = CdcRelay::new(pool.clone(), outbox.clone(), quick(&kafka), config).expect("relay");
        relay.run(CancellationToken::new())
    };
    let error = run(slot.config.clone()).await.expect_err("no slot");
    assert!(matches!(error, Error::Config(_)), "{error:?}");
    assert!(
        error.to_string().contains(slot.name()) && error.to_string().contains("outbox cdc setup"),
        "{error}"
    );
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)")
            .bind(slot.name())
            .fetch_one(&pool)
            .await
            .expect("slots");
    assert!(!exists, "the relay created no slot");

    // A slot and publication made by hand: the events written before them are not handed
    // over, so the relay does not stream until `setup` did.
    sqlx::query("SELECT pg_create_logical_replication_slot($1, 'pgoutput')")
        .bind(slot.name())
        .execute(&pool)
        .await
        .expect("slot");
    // (A new install's outbox is partitioned: published under its own name.)
    sqlx::query(AssertSqlSafe(format!(
        "CREATE PUBLICATION \"{}\" FOR TABLE outbox WITH (publish_via_partition_root = true)",
        slot.name()
    )))
    .execute(&pool)
    .await
    .expect("publication");
    let error = run(slot.config.clone()).await.expect_err("setup not complete");
    assert!(
        error.to_string().contains("not complete") && error.to_string().contains("outbox cdc setup"),
        "{error}"
    );
    let report = slot.config.setup(&pool, &outbox).await.expect("setup");
    assert!(!report.slot_created && !report.publication_created, "{report:?}");
    sqlx::query(AssertSqlSafe(format!("ALTER PUBLICATION \"{}\" DROP TABLE outbox", slot.name())))
        .execute(&pool)
        .await
        .expect("alter");
    let error = run(slot.config.clone()).await.expect_err("table not published");
    assert!(error.to_string().contains("ADD TABLE"), "{error}");
    sqlx::query(AssertSqlSafe(format!("DROP PUBLICATION \"{}\"", slot.name())))
        .execute(&pool)
        .await
        .expect("drop");
    let error = run(slot.config.clone()).await.expect_err("no publication");
    assert!(
        error.to_string().contains("publication") && error.to_string().contains("outbox cdc setup"),
        "{error}"
    );
}

/// A record the broker refuses (too large) fails that event with its reason; its
/// aggregate's later events, streamed in the same transaction and after it, wait in the
/// table; every other aggregate is published. Discarding the failed event releases the
/// rest, which the table path publishes in order.
#[tokio::test]
async fn a_permanent_error_holds_back_only_its_aggregate_until_released() {
    let pool = cdc_kit::database().await;
    let kafka = Kafka::start();
    kafka.create_topic(TOPIC, 3).await;
    let outbox = migrate(&pool).await;
    let slot = Slot::setup(&pool, &outbox).await;
    let relay = slot.start(&pool, &outbox, quick(&kafka).kafka_setting("message.max.bytes", "4096"));
    let poisoned = format!("poisoned-{}", Uuid::new_v4());
    let event = |n: i64, data: String| {
        NewEvent::new(&Step { id: poisoned.clone(), n, data }, AppendOptions::default().aggregate_version(n))
            .expect("event")
    };
    let mut tx = pool.begin().await.expect("begin");
    outbox
        .append_batch(&mut tx, &[event(1, "s".into()), event(2, "L".repeat(8_000)), event(3, "s".into())])
        .await
        .expect("append");
    tx.commit().await.expect("commit");
    let mut others = Vec::new();
    for i in 0..6 {
        others
            .extend(append_steps(&pool, &outbox, &format!("healthy-{i}-{}", Uuid::new_v4()), 3, "ok").await);
    }
    assert!(
        eventually(Duration::from_secs(30), || async {
            rows_in(&pool, "published").await == 19 && rows_in(&pool, "failed").await == 1
        })
        .await,
        "all but the poisoned aggregate's published, its big event failed"
    );
    // A later event of the held aggregate, streamed while it is held: it waits too.
    let mut tx = pool.begin().await.expect("begin");
    outbox.append_batch(&mut tx, &[event(4, "s".into())]).await.expect("append");
    tx.commit().await.expect("commit");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rows: Vec<(i64, String, Option<String>)> = sqlx::query_as(
        "SELECT aggregate_version, status, last_error FROM outbox WHERE aggregate_id = $1 ORDER BY id",
    )
    .bind(&poisoned)
    .fetch_all(&pool)
    .await
    .expect("rows");
    let statuses: Vec<&str> = rows.iter().map(|r| r.1.as_str()).collect();
    assert_eq!(statuses, ["published", "failed", "pending", "pending"]);
    let reason = rows[1].2.clone().unwrap_or_default();
    assert!(reason.to_lowercase().contains("too large"), "the reason names the cause: {reason}");

    let failed: Uuid = sqlx::query_scalar("SELECT event_id FROM outbox WHERE status = 'failed'")
        .fetch_one(&pool)
        .await
        .expect("failed");
    assert!(outbox.ops().discard(&pool, failed, "too large for the topic").await.expect("discard"));
    assert!(
        eventually(Duration::from_secs(30), || async { rows_in(&pool, "published").await == 21 }).await,
        "released"
    );
    relay.shutdown().await;
    let records = kafka.read_all(TOPIC, Duration::from_secs(30));
    assert!(has_all(&others)(&records));
    assert_eq!(first_versions(&records, &poisoned), [1, 3, 4], "the rest of the aggregate, in order");
}

/// Pending events written before the slot existed are not in its stream: setup hands
/// them to the table path, which publishes them; an event an operator retries (an
/// update, which the stream does not carry) is published again the same way.
#[tokio::test]
async fn events_the_stream_never_carries_are_published_by_the_table_path() {
    let pool = cdc_kit::database().await;
    let kafka = Kafka::start();
    kafka.create_topic(TOPIC, 3).await;
    let outbox = migrate(&pool).await;
    let before = append_steps(&pool, &outbox, &format!("before-{}", Uuid::new_v4()), 3, "x").await;
    let slot = Slot::setup(&pool, &outbox).await;
    let relay = slot.start(&pool, &outbox, quick(&kafka));
    let after = append_steps(&pool, &outbox, &format!("after-{}", Uuid::new_v4()), 3, "y").await;
    assert!(eventually(Duration::from_secs(30), || async { rows_in(&pool, "published").await == 6 }).await);
    sqlx::query("UPDATE outbox SET status = 'failed', last_error = 'by hand' WHERE event_id = $1")
        .bind(after[2])
        .execute(&pool)
        .await
        .expect("fail one");
    assert_eq!(outbox.ops().retry(&pool, &RetryTarget::Event(after[2])).await.expect("retry"), 1);
    assert!(eventually(Duration::from_secs(30), || async { rows_in(&pool, "published").await == 6 }).await);
    relay.shutdown().await;
    let records =
        ours(kafka.read_all(TOPIC, Duration::from_secs(30)), &[before.clone(), after.clone()].concat());
    assert!(has_all(&before)(&records) && has_all(&after)(&records));
    let copies = records.iter().filter(|r| r.headers["ce_id"] == after[2].to_string()).count();
    assert_eq!(copies, 2, "the retried event is sent again");
    assert_eq!(records.len(), 7, "nothing else twice");
}

/// `ALTER TABLE` of the outbox while the relay streams: the column named `topic` becomes
/// a new one at the end of the row, the old one renamed and left NULL. Rows are read by
/// column name through the layout the stream sends before the first row in it; read by
/// position, the new rows' topic would be the old column's NULL.
#[tokio::test]
async fn rows_are_read_by_column_name_across_an_alter_table() {
    let pool = cdc_kit::database().await;
    let kafka = Kafka::start();
    kafka.create_topic(TOPIC, 3).await;
    let outbox = migrate(&pool).await;
    let slot = Slot::setup(&pool, &outbox).await;
    let relay = slot.start(&pool, &outbox, quick(&kafka));
    let mut ids = append_steps(&pool, &outbox, &format!("alter-{}", Uuid::new_v4()), 3, "before").await;
    assert!(eventually(Duration::from_secs(30), || async { rows_in(&pool, "published").await == 3 }).await);
    for statement in [
        "ALTER TABLE outbox RENAME COLUMN topic TO topic_before",
        "ALTER TABLE outbox ALTER COLUMN topic_before DROP NOT NULL",
        "ALTER TABLE outbox ADD COLUMN topic text",
        "ALTER TABLE outbox ADD COLUMN note text DEFAULT 'n'",
    ] {
        sqlx::query(statement).execute(&pool).await.expect(statement);
    }
    ids.extend(append_steps(&pool, &outbox, &format!("alter-{}", Uuid::new_v4()), 3, "after").await);
    assert!(eventually(Duration::from_secs(30), || async { rows_in(&pool, "published").await == 6 }).await);
    relay.shutdown().await;
    let records = ours(kafka.read_all(TOPIC, Duration::from_secs(30)), &ids);
    assert!(has_all(&ids)(&records), "every event, in its topic");
    assert_eq!(records.len(), 6);
}
