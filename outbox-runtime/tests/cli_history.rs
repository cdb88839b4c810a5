//! The `outbox` command line on published history, against a real database: replay (dry
//! run and for real), purge of old published and discarded events, and reconcile against
//! a consumer's inbox, with their exit codes.

use sqlx::PgPool;

mod common;

use common::{append_pings, database_url, existing_install, outbox_cli, seed, stdout};

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

    let audits = || async {
        sqlx::query_as::<_, (String, String, i64, i64, i64, serde_json::Value)>(
            "SELECT actor, action, matched, applied, skipped, filter FROM outbox_audit ORDER BY id",
        )
        .fetch_all(&pool)
        .await
        .expect("audit")
    };
    assert!(audits().await.is_empty(), "a dry run writes no audit row");
    let out = outbox_cli(&pool, &["replay", "--aggregate", "c", "--since=-infinity", "--actor", "ana"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(stdout(&out).contains("1 put back up for publication"), "{}", stdout(&out));
    // Recorded as every operator action is: who, the filter, matched and replayed.
    let audit = audits().await;
    assert_eq!(audit.len(), 1, "{audit:?}");
    let (actor, action, matched, applied, skipped, filter) = &audit[0];
    assert_eq!((actor.as_str(), action.as_str(), *matched, *applied, *skipped), ("ana", "replay", 1, 1, 0));
    assert_eq!(filter["aggregate_id"], "c", "{filter}");
    assert!(filter.get("event_types").is_none(), "{filter}");
    // "From the beginning", as given (it was recorded as 1970-01-01T00:00:00+00:00).
    assert_eq!(filter["since"], "-infinity", "{filter}");
    assert!(stdout(&out).contains("(audit #"), "{}", stdout(&out));
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

/// `outbox partition` converts the table with its rows in the legacy partition, says so,
/// and changes nothing run again; `partition --maintain` prints the round as JSON, and
/// exits 2 on a table that is not partitioned.
#[sqlx::test(migrations = false)]
async fn partition_converts_the_outbox_and_maintain_prints_the_round(pool: PgPool) {
    existing_install(&pool).await;
    seed(&pool).await;
    let not_yet = outbox_cli(&pool, &["partition", "--maintain"]);
    assert_eq!(not_yet.status.code(), Some(2), "{not_yet:?}");
    let out = outbox_cli(&pool, &["partition"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(stdout(&out).contains("is partitioned"), "{}", stdout(&out));
    let legacy: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox_legacy").fetch_one(&pool).await.expect("legacy rows");
    assert_eq!(legacy, 4);
    let again = outbox_cli(&pool, &["partition"]);
    assert!(stdout(&again).contains("partitioned already"), "{}", stdout(&again));
    // The status reads the partitioned table as it read the plain one.
    let status = outbox_cli(&pool, &["status", "--json"]);
    let status: serde_json::Value = serde_json::from_str(&stdout(&status)).expect("json");
    assert_eq!((status["pending"].as_i64(), status["failed"].as_i64()), (Some(2), Some(1)), "{status}");
    assert!(
        status["table_bytes"].as_i64().expect("bytes") > 0,
        "the size of its partitions, not of the parent: {status}"
    );
    let round = outbox_cli(&pool, &["partition", "--maintain", "--retention", "7d"]);
    assert_eq!(round.status.code(), Some(0), "{round:?}");
    let report: serde_json::Value = serde_json::from_str(&stdout(&round)).expect("json");
    assert_eq!(report["skipped"], false, "{report}");
    assert_eq!(report["dropped"], serde_json::json!([]), "the legacy partition holds young events: {report}");
    assert_eq!(report["partitions"], 4, "legacy and three partitions: {report}");
}
