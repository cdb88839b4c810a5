//! The `outbox` command line against a real database: status JSON shape and values, failed
//! list, retry and discard effects, exit codes.

use std::process::{Command, Output};

use outbox_runtime::{AppendOptions, NewEvent, Outbox, OutboxEvent};
use schemars::JsonSchema;
use serde::Serialize;
use sqlx::PgPool;

#[derive(Serialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "test.cli", schema_version = 1, aggregate = "test", topic = "test")]
struct Ping {
    #[outbox(aggregate_id)]
    id: String,
    /// A marker that must never appear in operator output.
    secret: String,
}

fn database_url(pool: &PgPool) -> String {
    let base =
        std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let db = pool.connect_options().get_database().unwrap_or("test").to_owned();
    format!("{}/{db}", base.rsplit_once('/').map_or(base.as_str(), |(server, _)| server))
}

fn outbox_cli(pool: &PgPool, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_outbox"))
        .arg("--database-url")
        .arg(database_url(pool))
        .args(args)
        .output()
        .expect("run")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Appends one `Ping` per id (with a payload marker) to the default outbox, migrated first.
async fn append_pings(pool: &PgPool, ids: &[String]) -> Vec<uuid::Uuid> {
    let outbox = Outbox::default_ref();
    outbox.migrator().run(pool).await.expect("migrate");
    let events: Vec<NewEvent> = ids
        .iter()
        .map(|id| {
            NewEvent::new(&Ping { id: id.clone(), secret: "PAYLOAD-MARKER".into() }, AppendOptions::default())
                .expect("event")
        })
        .collect();
    let mut tx = pool.begin().await.expect("begin");
    outbox.append_batch(&mut tx, &events).await.expect("append");
    tx.commit().await.expect("commit");
    events.iter().map(NewEvent::event_id).collect()
}

async fn seed(pool: &PgPool) -> Vec<uuid::Uuid> {
    let ids = append_pings(pool, &["a", "a", "b", "c"].map(String::from)).await;
    // a's first event failed permanently, holding a's second back; c is published; all 10 s old.
    sqlx::query(
        "UPDATE outbox SET created_at = now() - interval '10 seconds', \
           status = CASE id WHEN 1 THEN 'failed' WHEN 4 THEN 'published' ELSE 'pending' END, \
           attempts = CASE id WHEN 1 THEN 1 ELSE 0 END, \
           last_error = CASE id WHEN 1 THEN 'Broker: Message size too large' END, \
           published_at = CASE id WHEN 4 THEN now() END",
    )
    .execute(pool)
    .await
    .expect("states");
    ids
}

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

/// Every column of every outbox row, to show a command changed nothing.
async fn snapshot(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar("SELECT row_to_json(o)::text FROM outbox o ORDER BY id")
        .fetch_all(pool)
        .await
        .expect("rows")
}

#[sqlx::test(migrations = false)]
async fn replay_dry_run_changes_nothing_and_replay_republishes_with_the_same_ids(pool: PgPool) {
    let ids = seed(&pool).await;
    // Publish b (id 3) too, an hour earlier, so two published rows match by time differently.
    sqlx::query("UPDATE outbox SET status = 'published', published_at = now(), created_at = now() - interval '2 hours' WHERE id = 3")
        .execute(&pool)
        .await
        .expect("publish b");
    let before = snapshot(&pool).await;
    let dry = outbox_cli(&pool, &["replay", "--event-type", "test.cli", "--dry-run", "--json"]);
    assert_eq!(dry.status.code(), Some(0), "{dry:?}");
    let report: serde_json::Value = serde_json::from_str(&stdout(&dry)).expect("json");
    assert_eq!(
        (report["matched"].as_u64(), report["replayable"].as_u64(), report["replayed"].as_u64()),
        (Some(4), Some(2), Some(0))
    );
    assert_eq!((report["not_yet_published"].as_u64(), report["discarded"].as_u64()), (Some(2), Some(0)));
    assert_eq!(snapshot(&pool).await, before, "a dry run changes nothing");

    // Only the last hour: c, not b.
    let since = outbox_cli(&pool, &["replay", "--since", "now", "--dry-run", "--json"]);
    let report: serde_json::Value = serde_json::from_str(&stdout(&since)).expect("json");
    assert_eq!(report["matched"], 0, "nothing created after now");
    assert_eq!(since.status.code(), Some(1), "nothing matched");

    let out = outbox_cli(&pool, &["replay", "--aggregate", "c", "--since=-infinity"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(stdout(&out).contains("1 put back up for publication"), "{}", stdout(&out));
    let c: (uuid::Uuid, String) =
        sqlx::query_as("SELECT event_id, status FROM outbox WHERE id = 4").fetch_one(&pool).await.expect("c");
    assert_eq!(c, (ids[3], "pending".to_owned()), "same event id, up for publication again");
    let b: String =
        sqlx::query_scalar("SELECT status FROM outbox WHERE id = 3").fetch_one(&pool).await.expect("b");
    assert_eq!(b, "published", "other aggregates untouched");

    let bad = outbox_cli(&pool, &["replay", "--since", "yesterday-ish"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("invalid --since \"yesterday-ish\""), "{bad:?}");
    assert_eq!(outbox_cli(&pool, &["replay"]).status.code(), Some(2), "a replay needs a filter");
}

#[sqlx::test(migrations = false)]
async fn purge_removes_only_old_published_and_discarded_events_and_replay_counts_them(pool: PgPool) {
    seed(&pool).await;
    append_pings(&pool, &(0..5).map(|i| format!("p{i}")).collect::<Vec<_>>()).await;
    // ids 5..9: 5, 6 published 8 days ago (purged); 7 published 6 days ago (kept);
    // 8 discarded, created 8 days ago (purged); 9 pending, created 8 days ago (kept).
    // Also 1 (failed) and 2, 3 (pending) become 8 days old: kept, never purged.
    sqlx::query(
        "UPDATE outbox SET created_at = now() - interval '8 days', \
           status = CASE WHEN id IN (5, 6, 7) THEN 'published' WHEN id = 8 THEN 'discarded' ELSE status END, \
           published_at = CASE WHEN id IN (5, 6) THEN now() - interval '8 days' WHEN id = 7 THEN now() - interval '6 days' ELSE published_at END \
         WHERE id <> 4",
    )
    .execute(&pool)
    .await
    .expect("ages");
    let out = outbox_cli(&pool, &["purge", "--older-than", "7d", "--batch-size", "2"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(stdout(&out).starts_with("3 published or discarded event(s)"), "{}", stdout(&out));
    let progress = String::from_utf8_lossy(&out.stderr);
    assert!(
        progress.contains("purge: 2 deleted") && progress.contains("purge: 3 deleted"),
        "batches of 2: {progress}"
    );
    let left: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM outbox ORDER BY id").fetch_all(&pool).await.expect("left");
    assert_eq!(left, [1, 2, 3, 4, 7, 9]);
    let tally: Vec<(String, i64)> =
        sqlx::query_as("SELECT status, events FROM outbox_cleaned ORDER BY status")
            .fetch_all(&pool)
            .await
            .expect("tally");
    assert_eq!(tally, [("discarded".to_owned(), 1), ("published".to_owned(), 2)], "what is gone is counted");

    let out =
        outbox_cli(&pool, &["replay", "--event-type", "test.cli", "--until", "now", "--dry-run", "--json"]);
    let report: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("json");
    assert_eq!((report["cleaned_up"].as_u64(), report["cleaned_up_exact"].as_bool()), (Some(2), Some(false)));
    assert_eq!(report["replayable"], 2, "4 and 7 are still there");
}

#[sqlx::test(migrations = false)]
async fn reconcile_exits_1_and_names_a_published_event_missing_from_the_inbox(pool: PgPool) {
    let ids = seed(&pool).await;
    sqlx::query("UPDATE outbox SET status = 'published', published_at = now()")
        .execute(&pool)
        .await
        .expect("publish");
    // The consumer's inbox, in this same database: every event has its outcome there (one
    // absorbed as stale, one discarded by its operator), then one row removed.
    sqlx::query(
        "CREATE TABLE inbox (consumer text NOT NULL, event_id uuid NOT NULL, outcome text NOT NULL, \
         PRIMARY KEY (consumer, event_id))",
    )
    .execute(&pool)
    .await
    .expect("inbox");
    for (id, outcome) in ids.iter().zip(["stale", "discarded", "applied", "applied"]) {
        sqlx::query("INSERT INTO inbox VALUES ('billing', $1, $2)")
            .bind(id)
            .bind(outcome)
            .execute(&pool)
            .await
            .expect("outcome");
    }
    let url = database_url(&pool);
    let args = [
        "reconcile",
        "--since=-infinity",
        "--until",
        "infinity",
        "--consumer",
        "billing",
        "--inbox-database-url",
        &url,
    ];
    let clean = outbox_cli(&pool, &args);
    assert_eq!(clean.status.code(), Some(0), "{}{}", stdout(&clean), String::from_utf8_lossy(&clean.stderr));
    assert!(stdout(&clean).contains("no differences"), "{}", stdout(&clean));

    sqlx::query("DELETE FROM inbox WHERE event_id = $1").bind(ids[2]).execute(&pool).await.expect("remove");
    let out = outbox_cli(&pool, &args);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains(&format!("not applied: {}", ids[2])), "{}", stdout(&out));
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let report: serde_json::Value =
        serde_json::from_str(&stdout(&outbox_cli(&pool, &json_args))).expect("json");
    let row = &report["rows"][0];
    assert_eq!(
        (
            row["appended"].as_i64(),
            row["published"].as_i64(),
            row["applied"].as_i64(),
            row["not_applied"].as_i64()
        ),
        (Some(4), Some(4), Some(1), Some(1))
    );
    // Stale and discarded outcomes are final but not applied effects: reported apart
    // (before, both were counted as applied).
    assert_eq!((row["stale"].as_i64(), row["consumer_discarded"].as_i64()), (Some(1), Some(1)));
    assert_eq!(report["differences"], 1);

    // Without a consumer: appended against published only; an unpublished event differs.
    sqlx::query("UPDATE outbox SET status = 'pending' WHERE id = 1").execute(&pool).await.expect("unpublish");
    let out = outbox_cli(&pool, &["reconcile", "--since=-infinity", "--until", "infinity"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let bad = outbox_cli(&pool, &["reconcile", "--since", "now", "--until=-infinity"]);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
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
    let inbox = outbox_runtime::inbox::Inbox::new(
        pool.clone(),
        outbox_runtime::inbox::InboxConfig::new("billing", "127.0.0.1:1", ["orders"]),
        outbox_runtime::inbox::Handlers::new(),
    )
    .expect("inbox");
    inbox.migrator().run(&pool).await.expect("migrate");
    // One parked message of key k with one held behind it, and one parked of key j.
    for (offset, key, status) in [(0_i64, "k", "parked"), (1, "k", "held"), (2, "j", "parked")] {
        sqlx::query(
            "INSERT INTO inbox_parked (consumer, topic, kafka_partition, kafka_offset, record_key, headers, payload, \
                                       event_id, event_type, schema_version, status, reason) \
             VALUES ('billing', 'orders', 0, $1, $2, '{}', 'PAYLOAD-MARKER', $3, 'order.confirmed', 1, $4, 'handler failed: boom')",
        )
        .bind(offset)
        .bind(key.as_bytes())
        .bind(uuid::Uuid::now_v7())
        .bind(status)
        .execute(&pool)
        .await
        .expect("park");
    }
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
    assert_eq!(
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox WHERE status = 'published'")
            .fetch_one(&pool)
            .await
            .expect("n"),
        3
    );
}
