//! Logs carry event_id, aggregate_id, type, attempt and stage, never the payload.

use std::time::Duration;

use outbox_runtime::relay::{Relay, RelayConfig};
use outbox_runtime::{AppendOptions, NewEvent, OutboxEvent};
use outbox_tests::events::event_headers;
use outbox_tests::inbox_kit::credits::{setup, start, Ledger};
use outbox_tests::kafka::Kafka;
use outbox_tests::log_kit::capture;
use outbox_tests::{eventually, migrate, rows_in, Credit, Step};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

#[sqlx::test(migrations = false)]
async fn the_payload_never_reaches_the_logs(pool: PgPool) {
    let (captured, _guard) = capture(tracing::Level::DEBUG);

    let kafka = Kafka::mock();
    kafka.create_topic("outbox-test-steps", 1).await;
    let outbox = migrate(&pool).await;
    // One event is too large for the producer (a permanent failure, logged at warn), one
    // publishes: both carry the marker in their payloads.
    let marker = "PAYLOAD-MARKER-7f3a";
    let big = NewEvent::new(
        &Step { id: "logged".into(), n: 1, data: format!("{marker}{}", "x".repeat(8_000)) },
        AppendOptions::default().aggregate_version(1),
    )
    .expect("event");
    let small =
        NewEvent::new(&Step { id: "fine".into(), n: 1, data: marker.into() }, AppendOptions::default())
            .expect("event");
    let big_id = big.event_id();
    let mut tx = pool.begin().await.expect("begin");
    outbox.append_batch(&mut tx, &[big, small]).await.expect("append");
    tx.commit().await.expect("commit");

    let relay = Relay::new(
        pool.clone(),
        outbox,
        RelayConfig::new(kafka.bootstrap()).kafka_setting("message.max.bytes", "4096"),
    )
    .expect("relay");
    let stop = CancellationToken::new();
    // Run on this thread so the thread-local subscriber sees the relay's events.
    let run = relay.run(stop.clone());
    let check = async {
        assert!(
            eventually(Duration::from_secs(30), || async {
                rows_in(&pool, "failed").await == 1 && rows_in(&pool, "published").await == 1
            })
            .await
        );
        stop.cancel();
    };
    let (result, ()) = tokio::join!(run, check);
    result.expect("relay");

    let logs = captured.text();
    assert!(!logs.contains(marker), "the payload leaked into the logs:\n{logs}");
    let failure = logs
        .lines()
        .find(|l| l.contains("failed permanently"))
        .unwrap_or_else(|| panic!("no failure logged:\n{logs}"));
    for field in [
        format!("event_id={big_id}"),
        "aggregate_id=logged".into(),
        "type=test.step".into(),
        "attempt=1".into(),
        "stage=\"publish\"".into(),
    ] {
        assert!(failure.contains(&field), "{field} missing from: {failure}");
    }
}

/// A relay starting on an outbox whose index a failed concurrent build left invalid says
/// so, with the statement that rebuilds it, and still publishes (correct, only slower).
#[sqlx::test(migrations = false)]
async fn a_relay_starting_on_an_invalid_index_says_how_to_rebuild_it(pool: PgPool) {
    let (captured, _guard) = capture(tracing::Level::INFO);

    let kafka = Kafka::mock();
    kafka.create_topic("outbox-test-steps", 1).await;
    let outbox = migrate(&pool).await;
    // What a failed `CREATE INDEX CONCURRENTLY` leaves: the index, maintained by writes,
    // read by no query.
    sqlx::query("UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'outbox_fresh'::regclass")
        .execute(&pool)
        .await
        .expect("invalidate");
    let event = NewEvent::new(&Step { id: "slow".into(), n: 1, data: "x".into() }, AppendOptions::default())
        .expect("event");
    let mut tx = pool.begin().await.expect("begin");
    outbox.append_batch(&mut tx, &[event]).await.expect("append");
    tx.commit().await.expect("commit");

    let relay = Relay::new(pool.clone(), outbox, RelayConfig::new(kafka.bootstrap())).expect("relay");
    let stop = CancellationToken::new();
    let run = relay.run(stop.clone());
    let check = async {
        assert!(
            eventually(Duration::from_secs(30), || async { rows_in(&pool, "published").await == 1 }).await,
            "published without the index"
        );
        stop.cancel();
    };
    let (result, ()) = tokio::join!(run, check);
    result.expect("relay");

    let logs = captured.text();
    let warning = logs
        .lines()
        .find(|l| l.contains("WARN") && l.contains("index=outbox_fresh"))
        .unwrap_or_else(|| panic!("no warning of the invalid index:\n{logs}"));
    assert!(warning.contains(r#"fix=REINDEX INDEX CONCURRENTLY "public"."outbox_fresh""#), "{warning}");
    sqlx::query("UPDATE pg_index SET indisvalid = true WHERE indexrelid = 'outbox_fresh'::regclass")
        .execute(&pool)
        .await
        .expect("restore");
}

/// Each duplicate delivery says so at debug, naming the event and how and when it was
/// first recorded; the run's summary counts duplicates, ignored and parked records beside
/// the applied ones (before: no line at any level, and `applied=1` alone). Here, not in
/// `inbox.rs`: a test binary whose other tests log nowhere loses this thread's INFO lines
/// (the callsites' cached interest), so the log tests live together.
#[sqlx::test(migrations = false)]
async fn duplicates_say_so_and_the_run_counts_them(pool: PgPool) {
    let s = setup(&pool).await;
    let id = Uuid::now_v7();
    for _ in 0..5 {
        s.produce(
            "acc-1",
            &Credit::json("acc-1", 10),
            &event_headers(id, Credit::EVENT_TYPE, None, Some("acc-1")),
        )
        .await;
    }
    let (logs, _guard) = capture(tracing::Level::DEBUG);
    let (running, _) = start(&pool, s.config("dedup-logs"), &Ledger::default()).await;
    let stats = running.stats.clone();
    assert!(
        eventually(Duration::from_secs(30), || async { stats.applied() + stats.duplicates() == 5 }).await
    );
    running.shutdown().await;
    assert_eq!((stats.applied(), stats.duplicates()), (1, 4));
    let logs = logs.text();
    let absorbed: Vec<&str> = logs.lines().filter(|l| l.contains("duplicate absorbed")).collect();
    assert_eq!(absorbed.len(), 4, "{logs}");
    for line in absorbed {
        assert!(line.contains("DEBUG") && line.contains(&format!("event_id={id}")), "{line}");
        assert!(line.contains("first_outcome=applied") && line.contains("first_at=20"), "{line}");
        assert!(!line.contains("\"amount\"") && !line.contains("acc-1\",\""), "no payload: {line}");
    }
    let stopped = logs.lines().find(|l| l.contains("inbox stopped")).unwrap_or_else(|| panic!("{logs}"));
    assert!(stopped.contains("applied=1") && stopped.contains("duplicates=4"), "{stopped}");
    assert!(stopped.contains("ignored=0") && stopped.contains("parked=0"), "{stopped}");
    // And in the database, where the console's consumer row reads it (before: nowhere but
    // this process's counters): counted in the transactions that absorbed them.
    let admin =
        outbox_runtime::inbox::InboxAdmin::new(pool.clone(), "public", "inbox", "dedup-logs").expect("admin");
    let summary = admin.summary(100).await.expect("summary");
    assert_eq!(summary.duplicates, 4, "{summary:?}");
    assert!(summary.last_duplicate_at.as_deref().is_some_and(|at| at.starts_with("20")), "{summary:?}");
}
