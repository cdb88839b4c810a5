//! The `outbox` command line against a real database: status JSON shape and values, failed
//! list, retry and discard effects, events waiting for a retry, the inbox commands, exit
//! codes, the relay's metrics. Replay, purge and reconcile are in `cli_history.rs`.

use std::process::Command;

use outbox_runtime::OutboxEvent;
use sqlx::PgPool;

mod common;

use common::{append_pings, billing_inbox, database_url, outbox_cli, park, seed, stdout, Parked, Ping};

#[sqlx::test(migrations = false)]
async fn status_json_reports_counts_and_the_oldest_unpublished_age(pool: PgPool) {
    seed(&pool).await;
    let out = outbox_cli(&pool, &["status", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let status: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("json");
    assert_eq!(
        (status["pending"].as_i64(), status["failed"].as_i64(), status["published"].as_i64()),
        (Some(2), Some(1), Some(1))
    );
    assert_eq!(status["discarded"], 0);
    assert!(status["oldest_unpublished_age_seconds"].as_f64().expect("age") >= 10.0, "{status}");
    // All four were appended 10 s ago and one was published just now: over the default
    // 5-minute window, 4 and 1 per 300 s.
    let per_window = |key: &str| (status[key].as_f64().expect(key) * 300.0).round();
    assert_eq!((per_window("appended_per_second"), per_window("published_per_second")), (4.0, 1.0));
    assert_eq!(status["window_seconds"], 300.0);
    assert!(status["table_bytes"].as_i64().expect("bytes") > 8192, "{status}");
    assert!(status["dead_tuples"].as_i64().is_some(), "{status}");
    assert!(status["capacity"].is_null(), "no capacity configured");
    let table = stdout(&outbox_cli(&pool, &["status"]));
    assert!(
        table.contains("failed                         1") && table.contains("oldest unpublished"),
        "{table}"
    );
}

#[sqlx::test(migrations = false)]
async fn status_forecasts_the_time_to_full_from_the_net_growth(pool: PgPool) {
    seed(&pool).await;
    // 3 unpublished of 10; net growth (4 appended - 1 published) / 300 s = 0.01/s, so the
    // 7 rows left fill in 700 s.
    let out = outbox_cli(&pool, &["--capacity-rows", "10", "status", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let status: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("json");
    let capacity = &status["capacity"];
    assert_eq!(
        (capacity["unit"].as_str(), capacity["used"].as_u64(), capacity["limit"].as_u64()),
        (Some("rows"), Some(3), Some(10))
    );
    assert!((capacity["growth_per_second"].as_f64().expect("growth") - 0.01).abs() < 1e-9, "{capacity}");
    assert!((capacity["seconds_to_full"].as_f64().expect("forecast") - 700.0).abs() < 1e-6, "{capacity}");
    let table = stdout(&outbox_cli(&pool, &["--capacity-rows", "10", "status"]));
    assert!(table.lines().any(|l| l.starts_with("full in") && l.contains(" 700 s")), "{table}");

    // Already over capacity: full now, whatever the growth.
    let out = outbox_cli(&pool, &["--capacity-rows", "2", "status", "--json"]);
    let status: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("json");
    assert_eq!(status["capacity"]["seconds_to_full"], 0.0);
    // Everything appended is published: not growing, never full.
    sqlx::query("UPDATE outbox SET status = 'published', published_at = now() WHERE status <> 'published'")
        .execute(&pool)
        .await
        .expect("publish");
    let out = outbox_cli(&pool, &["--capacity-rows", "10", "status", "--json"]);
    let status: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("json");
    assert!(status["capacity"]["seconds_to_full"].is_null(), "{status}");
}

#[sqlx::test(migrations = false)]
async fn failed_list_retry_and_discard_change_what_they_say(pool: PgPool) {
    let ids = seed(&pool).await;
    let list = outbox_cli(&pool, &["failed", "list", "--json"]);
    let failed: serde_json::Value = serde_json::from_str(&stdout(&list)).expect("json");
    assert_eq!(failed[0]["event_id"], ids[0].to_string());
    assert_eq!(failed[0]["held_back"], 1, "a's second event waits behind it");
    assert_eq!(failed[0]["last_error"], "Broker: Message size too large");
    assert!(!stdout(&list).contains("PAYLOAD-MARKER"), "operators never see payloads");

    // Discard needs --yes.
    let refused = outbox_cli(&pool, &["discard", &ids[0].to_string(), "--reason", "too big, resent by hand"]);
    assert_eq!(refused.status.code(), Some(2));
    let status: String =
        sqlx::query_scalar("SELECT status FROM outbox WHERE id = 1").fetch_one(&pool).await.expect("status");
    assert_eq!(status, "failed", "nothing changed without --yes");

    let retried = outbox_cli(&pool, &["retry", "--all-failed"]);
    assert_eq!(retried.status.code(), Some(0));
    assert!(stdout(&retried).starts_with("1 failed event(s) put back"));
    let row: (String, bool) =
        sqlx::query_as("SELECT status, next_attempt_at <= now() FROM outbox WHERE id = 1")
            .fetch_one(&pool)
            .await
            .expect("row");
    assert_eq!(row, ("pending".to_owned(), true), "due at once");
    assert_eq!(
        outbox_cli(&pool, &["retry", &ids[0].to_string()]).status.code(),
        Some(1),
        "nothing failed to retry"
    );

    let discarded =
        outbox_cli(&pool, &["discard", &ids[0].to_string(), "--reason", "resent by hand", "--yes"]);
    assert_eq!(discarded.status.code(), Some(0), "{discarded:?}");
    let row: (String, Option<String>) = sqlx::query_as("SELECT status, last_error FROM outbox WHERE id = 1")
        .fetch_one(&pool)
        .await
        .expect("row");
    assert_eq!(row, ("discarded".to_owned(), Some("discarded: resent by hand".to_owned())));
    assert_eq!(
        outbox_cli(&pool, &["discard", &ids[0].to_string(), "--reason", "x", "--yes"]).status.code(),
        Some(1)
    );
}

/// `outbox retrying` lists pending events waiting for a retry after a failed attempt,
/// with attempts, next attempt and last error; not replayed or plain pending ones.
#[sqlx::test(migrations = false)]
async fn retrying_lists_events_waiting_for_a_retry_with_their_errors(pool: PgPool) {
    let ids = seed(&pool).await;
    let none = outbox_cli(&pool, &["retrying"]);
    assert_eq!((none.status.code(), stdout(&none).trim()), (Some(0), "no events waiting for a retry"));
    // b waits 30 s after two failed attempts; c is published; a replayed event (attempts
    // made, due at once, no error) is plain pending and not listed.
    sqlx::query(
        "UPDATE outbox SET attempts = 2, next_attempt_at = now() + interval '30 seconds', \
           last_error = 'Local: Message timed out (topic test)' WHERE id = 3",
    )
    .execute(&pool)
    .await
    .expect("b retrying");
    sqlx::query("UPDATE outbox SET status = 'pending', attempts = 1, published_at = NULL WHERE id = 4")
        .execute(&pool)
        .await
        .expect("c replayed");
    let listed = outbox_cli(&pool, &["retrying", "--json"]);
    assert_eq!(listed.status.code(), Some(0), "{listed:?}");
    let retrying: serde_json::Value = serde_json::from_str(&stdout(&listed)).expect("json");
    assert_eq!(retrying["total"], 1, "{retrying}");
    let b = &retrying["events"][0];
    assert_eq!(b["event_id"], ids[2].to_string());
    assert_eq!((b["attempts"].as_i64(), b["topic"].as_str()), (Some(2), Some("test")));
    assert_eq!(b["last_error"], "Local: Message timed out (topic test)");
    let seconds = b["next_attempt_in_seconds"].as_f64().expect("seconds");
    assert!(seconds > 20.0 && seconds <= 30.0, "{seconds}");
    assert!(b["next_attempt_at"].as_str().is_some_and(|t| t.ends_with('Z')));
    let status: serde_json::Value =
        serde_json::from_str(&stdout(&outbox_cli(&pool, &["status", "--json"]))).expect("status");
    assert_eq!(status["retrying"], 1, "status counts the same events");
    let table = stdout(&outbox_cli(&pool, &["retrying"]));
    assert!(
        // 30 s ahead when written, a moment less when listed: "in 30.0s" or "in 29.9s".
        table.contains(&ids[2].to_string())
            && (table.contains("in 2") || table.contains("in 30.0s"))
            && table.contains("(topic test)"),
        "{table}"
    );
    assert!(!table.contains("PAYLOAD-MARKER") && !table.contains(&ids[3].to_string()), "{table}");
}

#[sqlx::test(migrations = false)]
async fn inbox_commands_list_request_retries_and_discard_parked_messages(pool: PgPool) {
    billing_inbox(&pool).await;
    // One parked message of key k with one held behind it, and one parked of key j.
    let rows =
        [(0_i64, "k", "parked"), (1, "k", "held"), (2, "j", "parked")].map(|(offset, key, status)| Parked {
            partition: 0,
            offset,
            key,
            event_type: "order.confirmed",
            version: 1,
            status,
            reason: "handler failed: boom",
        });
    park(&pool, &rows).await;
    let inbox_cli = |args: &[&str]| {
        let mut all = vec!["inbox", "--consumer", "billing"];
        all.extend_from_slice(args);
        outbox_cli(&pool, &all)
    };
    let listed = inbox_cli(&["parked", "--json"]);
    assert_eq!(listed.status.code(), Some(0), "{listed:?}");
    assert!(!stdout(&listed).contains("PAYLOAD-MARKER"), "operators never see payloads");
    let parked: serde_json::Value = serde_json::from_str(&stdout(&listed)).expect("json");
    assert_eq!(parked.as_array().map(Vec::len), Some(3));
    assert_eq!(parked[1]["status"], "held");

    assert_eq!(
        inbox_cli(&["retry", "2"]).status.code(),
        Some(4),
        "held behind 1: release 1 first (a conflict, not bad arguments)"
    );
    assert_eq!(inbox_cli(&["retry", "99"]).status.code(), Some(1), "no such message");
    let retried = inbox_cli(&["retry", "3"]);
    assert_eq!(retried.status.code(), Some(0), "{retried:?}");
    let requested: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM inbox_parked WHERE retry_requested_at IS NOT NULL")
            .fetch_all(&pool)
            .await
            .expect("q");
    assert_eq!(requested, [3], "the request waits for the running consumer");

    assert_eq!(inbox_cli(&["discard", "1", "--reason", "refunded"]).status.code(), Some(2), "needs --yes");
    let discarded = inbox_cli(&["discard", "1", "--reason", "refunded", "--yes"]);
    assert_eq!(discarded.status.code(), Some(0), "{discarded:?}");
    assert!(stdout(&discarded).contains("1 held behind it"), "{}", stdout(&discarded));
    let rows: Vec<(i64, String, bool)> =
        sqlx::query_as("SELECT id, status, retry_requested_at IS NOT NULL FROM inbox_parked ORDER BY id")
            .fetch_all(&pool)
            .await
            .expect("rows");
    assert_eq!(
        rows,
        [(1, "discarded".to_owned(), false), (2, "held".to_owned(), true), (3, "parked".to_owned(), true)],
        "the held message goes to the consumer next"
    );
    let absorbed: i64 = sqlx::query_scalar("SELECT count(*) FROM inbox WHERE outcome = 'discarded'")
        .fetch_one(&pool)
        .await
        .expect("n");
    assert_eq!(absorbed, 1, "a redelivery of the discarded event is absorbed");
}

#[test]
fn bad_arguments_and_unreachable_databases_have_their_exit_codes() {
    let bad = Command::new(env!("CARGO_BIN_EXE_outbox")).args(["retry"]).output().expect("run");
    assert_eq!(bad.status.code(), Some(2), "retry needs a target");
    // Passwords in the URL, in the userinfo or as a query parameter, never reach the output.
    for (url, shown) in [
        ("postgres://app:s3cret@127.0.0.1:1/none", "postgres://app:(redacted)@127.0.0.1:1/none"),
        (
            "postgres://app@127.0.0.1:1/none?password=s3cret&sslmode=disable",
            "postgres://app@127.0.0.1:1/none?password=(redacted)&sslmode=disable",
        ),
    ] {
        let unreachable = Command::new(env!("CARGO_BIN_EXE_outbox"))
            .args(["--database-url", url, "status"])
            .output()
            .expect("run");
        assert_eq!(unreachable.status.code(), Some(3));
        let err = String::from_utf8_lossy(&unreachable.stderr);
        assert!(err.contains(&format!("cannot connect to {shown}")) && !err.contains("s3cret"), "{err}");
    }
}

/// `outbox relay --hold-locks` publishes holding its batches' locks, with no lease ever
/// written; `--hold-locks` and `--cdc` are two different relay models and refused together.
#[sqlx::test(migrations = false)]
async fn relay_hold_locks_publishes_without_leases_and_is_refused_with_cdc(pool: PgPool) {
    let both = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(["relay", "--brokers", "127.0.0.1:1", "--hold-locks", "--cdc", "--slot", "s"])
        .output()
        .expect("run");
    assert_eq!(both.status.code(), Some(2), "{both:?}");
    let err = String::from_utf8_lossy(&both.stderr);
    assert!(err.contains("--hold-locks") && err.contains("--cdc"), "{err}");

    append_pings(&pool, &(0..5).map(|i| format!("h{i}")).collect::<Vec<_>>()).await;
    let kafka = rdkafka::mocking::MockCluster::new(1).expect("mock cluster");
    kafka.create_topic(Ping::TOPIC, 1, 1).expect("topic");
    let relay = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .arg("--database-url")
        .arg(database_url(&pool))
        .args(["relay", "--brokers", &kafka.bootstrap_servers(), "--hold-locks", "--poll-interval", "100ms"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("relay");
    let published = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox WHERE status = 'published'")
            .fetch_one(&pool)
            .await
            .expect("count")
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while published().await < 5 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let killed = Command::new("kill").args(["-TERM", &relay.id().to_string()]).status().expect("kill");
    assert!(killed.success());
    let out =
        tokio::task::spawn_blocking(move || relay.wait_with_output()).await.expect("join").expect("wait");
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(published().await, 5, "{log}");
    assert_eq!(out.status.code(), Some(0), "{log}");
    let leased: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_leases WHERE owner IS NOT NULL OR token > 0")
            .fetch_one(&pool)
            .await
            .expect("leases");
    assert_eq!(leased, 0, "a relay holding locks writes no lease");
}

/// `GET /metrics` over a plain TCP connection; `None` while nothing listens.
fn scrape(addr: std::net::SocketAddr) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(5))).ok()?;
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    Some(response)
}

#[sqlx::test(migrations = false)]
async fn relay_serves_prometheus_metrics_and_stops_on_sigterm(pool: PgPool) {
    append_pings(&pool, &(0..3).map(|i| format!("m{i}")).collect::<Vec<_>>()).await;
    let kafka = rdkafka::mocking::MockCluster::new(1).expect("mock cluster");
    kafka.create_topic(Ping::TOPIC, 1, 1).expect("topic");
    let addr = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port");
    let relay = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .arg("--database-url")
        .arg(database_url(&pool))
        .args(["relay", "--brokers", &kafka.bootstrap_servers(), "--metrics-addr", &addr.to_string()])
        .args(["--poll-interval", "100ms"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("relay");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut last = String::new();
    while std::time::Instant::now() < deadline {
        if let Some(body) = scrape(addr) {
            if body.lines().any(|l| l == "outbox_published_total 3") {
                last = body;
                break;
            }
            last = body;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert!(last.starts_with("HTTP/1.") && last.contains("outbox_published_total 3"), "{last}");
    assert!(
        last.contains("outbox_created_to_published_seconds_bucket{le=\"0.001\"}"),
        "latency buckets: {last}"
    );
    assert!(last.contains("outbox_oldest_unpublished_age_seconds"), "{last}");
    assert!(
        !last.contains("PAYLOAD-MARKER") && !last.contains("m0"),
        "no payloads, no aggregate ids as labels"
    );

    let killed = Command::new("kill").args(["-TERM", &relay.id().to_string()]).status().expect("kill");
    assert!(killed.success());
    let status =
        tokio::task::spawn_blocking(move || relay.wait_with_output()).await.expect("join").expect("wait");
    assert_eq!(status.status.code(), Some(0), "a graceful stop: {}", String::from_utf8_lossy(&status.stderr));
    let log = String::from_utf8_lossy(&status.stderr);
    assert!(log.contains("relay started"), "the relay logs to stderr: {log}");
    assert!(!log.contains('\u{1b}'), "no colour codes in a log that is not a terminal: {log:?}");
    assert_eq!(
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox WHERE status = 'published'")
            .fetch_one(&pool)
            .await
            .expect("n"),
        3
    );
}

/// A concurrent index build that fails (here a lock timeout while it waits for a writer's
/// transaction) leaves its index behind, invalid, and the migration's next run
/// (`IF NOT EXISTS`) is recorded as applied: the index stays unused for ever. `outbox
/// migrate` names it with the statement that rebuilds it and exits 1 until it is rebuilt.
#[sqlx::test(migrations = false)]
async fn migrate_names_an_index_a_failed_concurrent_build_left_invalid(pool: PgPool) {
    // An existing install's plain table: a new install's is partitioned, and a partitioned
    // table's indexes are not built concurrently.
    common::existing_install(&pool).await;
    let out = outbox_cli(&pool, &["migrate"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    // Migration 7 (the index of fresh events) taken back, then run again while a writer's
    // transaction is open: the build waits for it, and gives up at the lock timeout.
    sqlx::query("DROP INDEX outbox_fresh").execute(&pool).await.expect("drop");
    sqlx::query("DELETE FROM outbox_migrations WHERE version = 7").execute(&pool).await.expect("forget");
    let mut writer = pool.begin().await.expect("begin");
    sqlx::query("LOCK TABLE outbox IN ROW EXCLUSIVE MODE").execute(&mut *writer).await.expect("lock");
    let impatient = format!("{}?options=-c%20lock_timeout%3D300", database_url(&pool));
    let out = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(["--database-url", &impatient, "migrate"])
        .output()
        .expect("run");
    assert_ne!(out.status.code(), Some(0), "the build waits for the writer and times out: {out:?}");
    writer.rollback().await.expect("rollback");
    let valid: Option<bool> =
        sqlx::query_scalar("SELECT indisvalid FROM pg_index WHERE indexrelid = 'outbox_fresh'::regclass")
            .fetch_optional(&pool)
            .await
            .expect("index");
    assert_eq!(valid, Some(false), "the failed build left its index, invalid");

    let out = outbox_cli(&pool, &["migrate"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let rebuild = "REINDEX INDEX CONCURRENTLY \"public\".\"outbox_fresh\"";
    assert!(stderr.contains("index outbox_fresh is invalid") && stderr.contains(rebuild), "{stderr}");
    let applied: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM outbox_migrations WHERE version = 7 AND success)")
            .fetch_one(&pool)
            .await
            .expect("applied");
    assert!(applied, "the migration itself is recorded: running it again cannot repair the index");

    sqlx::query(rebuild).execute(&pool).await.expect("rebuild");
    let out = outbox_cli(&pool, &["migrate"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(stdout(&out).contains("up to date"), "{out:?}");
}

/// An index still being built is invalid until its build ends, and is not reported as a
/// failed build: a relay starting (or `outbox migrate` run) while another session builds
/// one, in a rolling deploy, gets no false alarm. Before the fix `migrate` exited 1 here.
#[sqlx::test(migrations = false)]
async fn migrate_says_nothing_of_an_index_still_being_built(pool: PgPool) {
    // An existing install's plain table: a new install's is partitioned, and a partitioned
    // table's indexes are not built concurrently.
    common::existing_install(&pool).await;
    let out = outbox_cli(&pool, &["migrate"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    sqlx::query("DROP INDEX outbox_fresh").execute(&pool).await.expect("drop");
    // A writer's open transaction keeps the build waiting, its index created and invalid.
    let mut writer = pool.begin().await.expect("begin");
    sqlx::query("LOCK TABLE outbox IN ROW EXCLUSIVE MODE").execute(&mut *writer).await.expect("lock");
    let builder = pool.clone();
    let build = tokio::spawn(async move {
        sqlx::query(
            "CREATE INDEX CONCURRENTLY outbox_fresh ON outbox (id) INCLUDE (work_partition) \
             WHERE status = 'pending' AND next_attempt_at = '-infinity'",
        )
        .execute(&builder)
        .await
    });
    let mut waiting = false;
    for _ in 0..200 {
        waiting = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_stat_progress_create_index b \
                            ON b.index_relid = i.indexrelid \
                            WHERE i.indexrelid = 'outbox_fresh'::regclass AND NOT i.indisvalid)",
        )
        .fetch_one(&pool)
        .await
        .unwrap_or(false);
        if waiting {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(waiting, "the build waits for the writer, its index invalid");
    let out = outbox_cli(&pool, &["migrate"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("invalid"), "{out:?}");
    writer.rollback().await.expect("rollback");
    build.await.expect("join").expect("the build finishes once the writer is gone");
    let out = outbox_cli(&pool, &["migrate"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

/// `outbox inbox partition` converts an existing dedup table (with rows, so that the
/// migration left it as it was) into partitions; its rows stay, in the legacy partition;
/// run again, it says so and changes nothing.
#[sqlx::test(migrations = false)]
async fn inbox_partition_converts_an_existing_dedup_table(pool: PgPool) {
    use outbox_runtime::inbox::{Handlers, Inbox, InboxConfig};
    let inbox =
        Inbox::new(pool.clone(), InboxConfig::new("billing", "127.0.0.1:1", ["orders"]), Handlers::new())
            .expect("inbox");
    inbox.migrator().run_to(5, &pool).await.expect("migrate to 5");
    sqlx::query(
        "INSERT INTO inbox (consumer, event_id, event_type, schema_version, topic, kafka_partition, kafka_offset) \
         SELECT 'billing', gen_random_uuid(), 'order.confirmed', 1, 'orders', 0, n FROM generate_series(1, 10) n",
    )
    .execute(&pool)
    .await
    .expect("rows");
    inbox.migrator().run(&pool).await.expect("migrate");
    let kind = || async {
        sqlx::query_scalar::<_, String>("SELECT relkind::text FROM pg_class WHERE oid = 'inbox'::regclass")
            .fetch_one(&pool)
            .await
            .expect("relkind")
    };
    assert_eq!(kind().await, "r", "a table with rows stays as it is through the migration");
    // Any consumer: the table is everyone's, and this one has no rows.
    let out = outbox_cli(&pool, &["inbox", "--consumer", "shipping", "partition"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(stdout(&out).contains("is partitioned"), "{}", stdout(&out));
    assert_eq!(kind().await, "p");
    let legacy: i64 =
        sqlx::query_scalar("SELECT count(*) FROM inbox_legacy").fetch_one(&pool).await.expect("legacy rows");
    assert_eq!(legacy, 10);
    let again = outbox_cli(&pool, &["inbox", "--consumer", "billing", "partition"]);
    assert_eq!(again.status.code(), Some(0), "{again:?}");
    assert!(stdout(&again).contains("partitioned already"), "{}", stdout(&again));
}
