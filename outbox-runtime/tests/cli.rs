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

async fn seed(pool: &PgPool) -> Vec<uuid::Uuid> {
    let outbox = Outbox::default_ref();
    outbox.migrator().run(pool).await.expect("migrate");
    let events: Vec<NewEvent> = ["a", "a", "b", "c"]
        .iter()
        .map(|id| {
            NewEvent::new(
                &Ping { id: (*id).into(), secret: "PAYLOAD-MARKER".into() },
                AppendOptions::default(),
            )
            .expect("event")
        })
        .collect();
    let mut tx = pool.begin().await.expect("begin");
    outbox.append_batch(&mut tx, &events).await.expect("append");
    tx.commit().await.expect("commit");
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
    events.iter().map(NewEvent::event_id).collect()
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
    let table = stdout(&outbox_cli(&pool, &["status"]));
    assert!(
        table.contains("failed                       1") && table.contains("oldest unpublished"),
        "{table}"
    );
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

#[test]
fn bad_arguments_and_unreachable_databases_have_their_exit_codes() {
    let bad = Command::new(env!("CARGO_BIN_EXE_outbox")).args(["retry"]).output().expect("run");
    assert_eq!(bad.status.code(), Some(2), "retry needs a target");
    let unreachable = Command::new(env!("CARGO_BIN_EXE_outbox"))
        .args(["--database-url", "postgres://app:s3cret@127.0.0.1:1/none", "status"])
        .output()
        .expect("run");
    assert_eq!(unreachable.status.code(), Some(3));
    let err = String::from_utf8_lossy(&unreachable.stderr);
    assert!(
        err.contains("cannot connect to postgres://app@127.0.0.1:1/none") && !err.contains("s3cret"),
        "{err}"
    );
}
