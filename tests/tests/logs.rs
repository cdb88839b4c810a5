//! Logs carry event_id, aggregate_id, type, attempt and stage, never the payload.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_runtime::relay::{Relay, RelayConfig};
use outbox_runtime::{AppendOptions, NewEvent};
use outbox_tests::kafka::Kafka;
use outbox_tests::{eventually, migrate, rows_in, Step};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// Collects everything the subscriber writes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Everything logged on this thread up to `level`, until the guard goes.
fn capture(level: tracing::Level) -> (Captured, tracing::subscriber::DefaultGuard) {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    (captured, tracing::subscriber::set_default(subscriber))
}

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

    let logs = String::from_utf8(captured.0.lock().expect("lock").clone()).expect("utf-8");
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

    let logs = String::from_utf8(captured.0.lock().expect("lock").clone()).expect("utf-8");
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
