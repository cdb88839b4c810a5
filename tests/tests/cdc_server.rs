//! The change-data-capture relay against what happens to the whole server: another
//! database writing 1.25 GB of WAL while the outbox is idle (test 10: the slot must not keep
//! it), and PostgreSQL restarted in fast and immediate mode mid-stream (test 6: nothing
//! lost, order kept).
//!
//! Both act on a whole server (a restart ends every connection; 1.25 GB of WAL slows
//! everything beside it), so each test runs on a server of its own, thrown away after it.
//! They are long, and timed against the machine: ignored by default, `.ci/run` runs them one
//! at a time (`cargo test -p outbox-tests --test cdc_server -- --ignored --test-threads=1`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_runtime::{AppendOptions, NewEvent, Outbox};
use outbox_tests::cdc_kit::{ours, Slot};
use outbox_tests::db::test_database;
use outbox_tests::kafka::Kafka;
use outbox_tests::pg_server::Cluster;
use outbox_tests::relay_kit::TOPIC;
use outbox_tests::running::quick;
use outbox_tests::{eventually, migrate, rows_in, Step};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use uuid::Uuid;

/// The relay's log lines (RUST_LOG, default warnings) with the test's output.
fn logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}

/// A server of the test's own at `wal_level = logical`, and a database of the test's on it.
async fn own_server() -> (Cluster, PgPool) {
    let cluster = Cluster::streaming().expect("a server of the test's own");
    let pool = test_database(&cluster.server()).await;
    (cluster, pool)
}

/// Restarts `cluster` in fast mode and returns how long it took; when `pg_ctl` gives up (a
/// stream held the shutdown), stops `relay`, starts the server and fails.
async fn restart_fast(cluster: &Arc<Cluster>, relay: &outbox_tests::running::Running) -> Duration {
    let started = Instant::now();
    let restarting = Arc::clone(cluster);
    let restarted = tokio::task::spawn_blocking(move || restarting.restart("fast")).await.expect("restart");
    let took = started.elapsed();
    if !restarted {
        relay.task.abort();
        let starting = Arc::clone(cluster);
        tokio::task::spawn_blocking(move || starting.start_again()).await.expect("start");
        panic!("a fast shutdown was held by the relay's stream: pg_ctl gave up after {took:?}");
    }
    took
}

/// A fast shutdown while Kafka is down and streamed events wait for it, unconfirmed: the
/// walsender waits for its client to confirm everything it sent before it exits, so a relay
/// that kept its stream open held PostgreSQL in shutdown for as long as Kafka was down (seen:
/// `pg_ctl: server does not shut down` after 60 s, the server stuck until the relay's process
/// died). The relay ends its stream when the server asks for a final reply it cannot give;
/// the events are streamed again after the restart and published once Kafka is back.
#[tokio::test]
#[ignore = "restarts a server: .ci/run runs it with the others of this file, one at a time"]
async fn a_fast_shutdown_is_not_held_by_events_kafka_has_not_acknowledged() {
    let (cluster, pool) = own_server().await;
    let cluster = Arc::new(cluster);
    logs();
    let kafka = Kafka::mock();
    let mock = kafka.mock_cluster().expect("mock");
    kafka.create_topic(TOPIC, 1).await;
    let outbox = migrate(&pool).await;
    let slot = Slot::setup(&pool, &outbox).await;
    mock.broker_down(1).expect("broker down");
    let relay = slot.start(&pool, &outbox, quick(&kafka));
    let ids = outbox_tests::relay_kit::append_steps(&pool, &outbox, "held-shutdown", 20, "h").await;
    // Streamed and waiting for Kafka.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let took = restart_fast(&cluster, &relay).await;
    eprintln!("restarted (fast) in {:.1}s with the broker down", took.as_secs_f64());
    // The restart of an idle server takes 2-3 s here; the relay holding the shutdown until
    // its publisher gave up took 33 s.
    assert!(took < Duration::from_secs(15), "the shutdown waited {took:?} for the relay");
    mock.broker_up(1).expect("broker up");
    assert!(eventually(Duration::from_secs(60), || async { rows_in(&pool, "published").await == 20 }).await);
    relay.shutdown().await;
    let records = ours(kafka.read_all(TOPIC, Duration::from_secs(30)), &ids);
    assert!(outbox_tests::relay_kit::has_all(&ids)(&records), "every event published after the restart");
}

/// The same fast shutdown, with so many events waiting for Kafka that the relay's memory
/// budget is full: the reader waits for room, the replication client's read-ahead fills up
/// behind it, and the server's request for a final reply sits unread in the socket, so the
/// reader cannot see it (seen: the shutdown held until `wal_sender_timeout`, 60 s). The
/// relay learns that the server is stopping from its other connections (SQLSTATE 57P01 and
/// 57P03) and ends the stream.
#[tokio::test]
#[ignore = "restarts a server: .ci/run runs it with the others of this file, one at a time"]
async fn a_fast_shutdown_is_not_held_by_a_full_memory_budget() {
    let (cluster, pool) = own_server().await;
    let cluster = Arc::new(cluster);
    logs();
    let kafka = Kafka::mock();
    let mock = kafka.mock_cluster().expect("mock");
    kafka.create_topic(TOPIC, 1).await;
    let outbox = migrate(&pool).await;
    let slot = Slot::setup(&pool, &outbox).await;
    mock.broker_down(1).expect("broker down");
    // Records wait for the broker longer than the test: the budget stays full.
    let config = quick(&kafka).message_timeout(Duration::from_secs(60)).lease_ttl(Duration::from_secs(130));
    let relay = slot.start_with(&pool, &outbox, config, slot.config.clone().max_buffered_bytes(64 * 1024));
    let data = "x".repeat(1024);
    let mut ids = Vec::new();
    for t in 0..30 {
        ids.extend(
            outbox_tests::relay_kit::append_steps(&pool, &outbox, &format!("full-{t}"), 100, &data).await,
        );
    }
    // Streamed up to the budget, the rest queued behind it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let took = restart_fast(&cluster, &relay).await;
    eprintln!("restarted (fast) in {:.1}s with the broker down and the budget full", took.as_secs_f64());
    assert!(took < Duration::from_secs(15), "the shutdown waited {took:?} for the relay");
    mock.broker_up(1).expect("broker up");
    assert!(
        eventually(Duration::from_secs(120), || async { rows_in(&pool, "published").await == 3000 }).await
    );
    relay.shutdown().await;
    let records = ours(kafka.read_all(TOPIC, Duration::from_secs(30)), &ids);
    assert!(outbox_tests::relay_kit::has_all(&ids)(&records), "every event published after the restart");
}

/// Test 10. A relay streams from an idle outbox while another database of the server writes
/// 1.25 GB of WAL: the relay confirms the positions the server's keepalives carry (nothing of
/// its own is in flight), so its slot keeps little of that WAL; a slot no relay reads, set
/// up beside it, keeps all of it (the control: what an outbox relay that confirmed only its
/// own commits would cost).
#[tokio::test]
#[ignore = "writes 1.25 GB of WAL: .ci/run runs it with the others of this file, one at a time"]
async fn an_idle_outbox_on_a_busy_server_does_not_keep_its_wal() {
    let (cluster, pool) = own_server().await;
    let kafka = Kafka::start();
    kafka.create_topic(TOPIC, 1).await;
    let outbox = migrate(&pool).await;
    let slot = Slot::setup(&pool, &outbox).await;
    let control = Slot::named(&pool).await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE PUBLICATION \"{0}\" FOR TABLE outbox WITH (publish = 'insert')",
        control.name()
    )))
    .execute(&pool)
    .await
    .expect("control publication");
    sqlx::query("SELECT pg_create_logical_replication_slot($1, 'pgoutput')")
        .bind(control.name())
        .execute(&pool)
        .await
        .expect("control slot");
    let relay = slot.start(&pool, &outbox, quick(&kafka));

    // Another database of the server.
    let other = PgPoolOptions::new()
        .max_connections(1)
        .connect(&cluster.url("postgres"))
        .await
        .expect("the other database");
    let table = format!("cdc_filler_{}", Uuid::new_v4().simple());
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE TABLE {table} (b text)")))
        .execute(&other)
        .await
        .expect("filler");
    let wal = || async {
        sqlx::query_scalar::<_, f64>("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8")
            .fetch_one(&pool)
            .await
            .expect("wal")
    };
    let retained = |name: String| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, Option<f64>>(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::float8 FROM pg_replication_slots \
                 WHERE slot_name = $1",
            )
            .bind(name)
            .fetch_one(&pool)
            .await
            .expect("retained")
            .unwrap_or(0.0)
        }
    };
    // The slot's restart position moves with the server's snapshots of running
    // transactions, logged every 15 s while WAL is written (LOG_SNAPSHOT_INTERVAL_MS), once
    // the relay confirmed a position past one; a snapshot that comes while the one before
    // still waits for that confirmation is skipped. So what the slot keeps at any moment is
    // bounded by the WAL of the last two intervals and the confirmation, by time and not by
    // volume: 40 s on a quiet machine (192 MiB at most here), 48 s seen in a CI run sharing
    // the machine's two cores with other builds. The bound is 60 s; the writer runs at
    // about 12 MiB/s for some 105 s, so the last 45 s of samples tell it from a slot that
    // keeps everything (the control).
    const WINDOW: Duration = Duration::from_secs(60);
    let started = Instant::now();
    let from = wal().await;
    let mut samples: Vec<(Instant, f64)> = vec![(started, from)];
    let (mut most_retained, mut over_window): (f64, Vec<String>) = (0.0, Vec::new());
    while wal().await - from < f64::from(5u32 << 28) {
        // About 4 MiB of WAL per transaction.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {table} SELECT repeat(md5(g::text), 32) FROM generate_series(1, 4000) g"
        )))
        .execute(&other)
        .await
        .expect("fill");
        sqlx::query(sqlx::AssertSqlSafe(format!("TRUNCATE {table}")))
            .execute(&other)
            .await
            .expect("truncate");
        let kept = retained(slot.name().to_owned()).await;
        let (now, position) = (Instant::now(), wal().await);
        most_retained = most_retained.max(kept);
        // The WAL written since the last sample at least WINDOW old (more than the window's
        // own, so the bound is generous); none yet in the first WINDOW.
        if let Some(&(_, then)) = samples.iter().rev().find(|(at, _)| now.duration_since(*at) >= WINDOW) {
            let allowed = position - then + f64::from(16u32 << 20);
            if kept > allowed {
                over_window.push(format!(
                    "{:.0} MiB kept at {:.1}s, {:.0} MiB written in the {}s before",
                    kept / 1048576.0,
                    now.duration_since(started).as_secs_f64(),
                    (position - then) / 1048576.0,
                    WINDOW.as_secs()
                ));
            }
        }
        samples.push((now, position));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let written = wal().await - from;
    let bounded = eventually(Duration::from_secs(60), || async {
        retained(slot.name().to_owned()).await < f64::from(64u32 << 20)
    })
    .await;
    let (ours_now, control_now) =
        (retained(slot.name().to_owned()).await, retained(control.name().to_owned()).await);
    eprintln!(
        "wrote {:.0} MiB of WAL in {:.1}s; retained by the relay's slot: at most {:.0} MiB while writing ({} samples \
         over the last {}s of WAL), {:.1} MiB after; by the slot no relay reads: {:.0} MiB",
        written / 1048576.0,
        started.elapsed().as_secs_f64(),
        most_retained / 1048576.0,
        over_window.len(),
        WINDOW.as_secs(),
        ours_now / 1048576.0,
        control_now / 1048576.0
    );
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {table}"))).execute(&other).await.expect("drop");
    relay.shutdown().await;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP PUBLICATION \"{}\"", control.name())))
        .execute(&pool)
        .await
        .expect("drop control publication");
    assert!(control_now >= written * 0.9, "the control slot keeps the WAL: {control_now} of {written}");
    assert!(bounded, "the relay's slot lets the WAL go: {ours_now} bytes retained after {written} written");
    assert!(
        over_window.is_empty(),
        "while it is written, the slot keeps no more than the last {}s of WAL: {over_window:?}",
        WINDOW.as_secs()
    );
    assert!(
        most_retained < written * 0.7,
        "and so well under all of it: at most {most_retained} of {written}"
    );
}

/// Test 6. PostgreSQL restarted, in fast and then immediate mode, while events are appended
/// and streamed: the relay reconnects and sends what was not confirmed again; every event
/// whose append committed is published, in order per aggregate.
#[tokio::test]
#[ignore = "restarts a server: .ci/run runs it with the others of this file, one at a time"]
async fn postgres_restarted_fast_and_immediate_mid_stream_loses_nothing() {
    let (cluster, pool) = own_server().await;
    let cluster = Arc::new(cluster);
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
    let kafka = Kafka::start();
    kafka.create_topic(TOPIC, 3).await;
    let outbox = migrate(&pool).await;
    let slot = Slot::setup(&pool, &outbox).await;
    let relay = slot.start(&pool, &outbox, quick(&kafka));
    let run = Uuid::new_v4().simple().to_string()[..8].to_owned();
    let appender =
        tokio::spawn(append_for(pool.clone(), outbox.clone(), run.clone(), Duration::from_secs(14)));
    for mode in ["fast", "immediate"] {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let (before, started) = (rows_in(&pool, "published").await, Instant::now());
        let restarting = Arc::clone(&cluster);
        let restarted = tokio::task::spawn_blocking(move || restarting.restart(mode)).await.expect("restart");
        assert!(restarted, "PostgreSQL restarted ({mode}): {}", cluster.log());
        eprintln!("restarted ({mode}) in {:.1}s with {before} published", started.elapsed().as_secs_f64());
    }
    let (committed, failed_appends) = appender.await.expect("appender");
    // Only what the table holds was committed (an append whose commit was cut off by the
    // restart may or may not have been).
    let ids: Vec<Uuid> =
        sqlx::query_scalar("SELECT event_id FROM outbox ORDER BY id").fetch_all(&pool).await.expect("ids");
    assert!(ids.len() >= committed, "every acknowledged append is in the table");
    let total = i64::try_from(ids.len()).expect("count");
    let published =
        eventually(Duration::from_secs(90), || async { rows_in(&pool, "published").await == total }).await;
    let stats = relay.shutdown().await;
    assert!(
        published,
        "every committed event is published: {} of {total}",
        rows_in(&pool, "published").await
    );
    let records = ours(kafka.read_all(TOPIC, Duration::from_secs(60)), &ids);
    let mut firsts: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut seen = std::collections::BTreeSet::new();
    for r in &records {
        if seen.insert(r.headers["ce_id"].clone()) {
            firsts
                .entry(r.key.clone())
                .or_default()
                .push(r.headers["ce_aggregateversion"].parse().expect("version"));
        }
    }
    eprintln!(
        "{total} events committed ({failed_appends} appends cut off by the restarts), {} records, {} distinct; \
         the relay published {}",
        records.len(),
        seen.len(),
        stats.published()
    );
    assert_eq!(seen.len(), ids.len(), "every event is in the topic");
    for (key, versions) in firsts {
        assert!(versions.windows(2).all(|w| w[0] < w[1]), "{key}: first appearances in order: {versions:?}");
    }
}

/// Appends one event to each of 8 aggregates per transaction for `how_long`, riding over
/// the restarts; returns the appends that committed and those that failed.
async fn append_for(pool: PgPool, outbox: Outbox, run: String, how_long: Duration) -> (usize, usize) {
    let until = Instant::now() + how_long;
    let (mut committed, mut failed) = (0, 0);
    let mut version = 1;
    while Instant::now() < until {
        let events: Vec<NewEvent> = (0..8)
            .map(|a| {
                let step = Step { id: format!("restart-{run}-{a}"), n: version, data: "r".into() };
                NewEvent::new(&step, AppendOptions::default().aggregate_version(version)).expect("event")
            })
            .collect();
        let appended: outbox_runtime::Result<()> = async {
            let mut tx = pool.begin().await?;
            outbox.append_batch(&mut tx, &events).await?;
            tx.commit().await?;
            Ok(())
        }
        .await;
        match appended {
            Ok(()) => {
                committed += events.len();
                version += 1;
            }
            Err(_) => {
                // The version is kept: an append cut off before its commit is tried again
                // with the same version; one that committed unseen makes the next a
                // duplicate version, which the order check reads as a first appearance.
                failed += 1;
                let exists: Option<i64> = sqlx::query_scalar(
                    "SELECT count(*) FROM outbox WHERE aggregate_id LIKE $1 AND aggregate_version = $2",
                )
                .bind(format!("restart-{run}-%"))
                .bind(version)
                .fetch_one(&pool)
                .await
                .ok();
                if exists.is_some_and(|n| n > 0) {
                    version += 1;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (committed, failed)
}
