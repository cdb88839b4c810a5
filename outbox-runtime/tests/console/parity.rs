//! An action through the console gives what the CLI's `--json` gives on the same rows.

use super::common::{append_pings, outbox_cli, stdout};
use super::*;

/// Two identical sets of failed events, in topics `left` and `right`: per topic, three whose
/// reason says "boom" (numbers differing) and two of another reason; their ids by topic.
async fn twin_failures(pool: &PgPool) -> [Vec<Uuid>; 2] {
    let ids = append_pings(pool, &(0..10).map(|i| format!("agg-{i}")).collect::<Vec<_>>()).await;
    for (i, id) in ids.iter().enumerate() {
        let topic = if i < 5 { "left" } else { "right" };
        let reason = if i % 5 < 3 { format!("boom at offset {i}") } else { "something else".to_owned() };
        sqlx::query("UPDATE outbox SET status = 'failed', topic = $2, last_error = $3, failed_at = now() WHERE event_id = $1")
            .bind(id)
            .bind(topic)
            .bind(reason)
            .execute(pool)
            .await
            .expect("failed");
    }
    [ids[..5].to_vec(), ids[5..].to_vec()]
}

/// The states of `ids`, in order.
async fn states(pool: &PgPool, ids: &[Uuid]) -> Vec<String> {
    let mut out = Vec::new();
    for id in ids {
        out.push(status_of(pool, *id).await);
    }
    out
}

#[sqlx::test(migrations = false)]
async fn the_console_acts_as_the_cli_does_on_the_same_rows(pool: PgPool) {
    let [left, right] = twin_failures(&pool).await;
    let (addr, stop) = serve(&pool, ConsoleConfig::default()).await;
    let token = csrf(&get(addr, "/failures").await.body);
    let same = [("Sec-Fetch-Site", "same-origin")];
    for (action, extra) in [("retry", ""), ("discard", "&reason=obsolete")] {
        // Retry takes the three "boom" events; discard then takes the two others.
        let filter = if action == "retry" { "boom" } else { "something" };
        let mut cli_args =
            vec!["failed", action, "--topic", "left", "--reason-contains", filter, "--yes", "--json"];
        if action == "discard" {
            cli_args.extend(["--reason", "obsolete"]);
        }
        let cli = outbox_cli(&pool, &cli_args);
        assert_eq!(cli.status.code(), Some(0), "{cli:?}");
        let cli: serde_json::Value = serde_json::from_str(&stdout(&cli)).expect("the CLI's JSON");
        let body = format!(
            "csrf={token}&key={action}-parity&confirm=yes&format=json&topic=right&reason_contains={filter}{extra}"
        );
        let console = request(addr, "POST", &format!("/actions/outbox/{action}"), &same, &body).await;
        assert_eq!(console.status, 200, "{}", console.body);
        let console: serde_json::Value = serde_json::from_str(&console.body).expect("the console's JSON");
        let report = &console["report"];
        for field in ["action", "dry_run", "matched", "applied", "skipped"] {
            assert_eq!(report[field], cli[field], "{action}: {field}: console {report}, CLI {cli}");
        }
        assert_eq!(report["first"].as_array().map(Vec::len), cli["first"].as_array().map(Vec::len));
        assert_eq!(states(&pool, &left).await, states(&pool, &right).await, "after {action}");
    }
    assert_eq!(states(&pool, &right).await, ["pending", "pending", "pending", "discarded", "discarded"]);
    let audit: Vec<(String, i64)> = sqlx::query_as("SELECT action, applied FROM outbox_audit ORDER BY id")
        .fetch_all(&pool)
        .await
        .expect("audit");
    assert_eq!(
        audit,
        [("retry".into(), 3), ("retry".into(), 3), ("discard".into(), 2), ("discard".into(), 2)]
    );
    stop.cancel();
}

#[sqlx::test(migrations = false)]
async fn the_console_acts_as_the_cli_does_on_an_inbox_too(pool: PgPool) {
    billing_inbox(&pool).await;
    // Twin sets of parked messages, one per topic: three "ledger closed" heads of their
    // keys (one with a message held behind it) and one of another reason.
    let mut rows = Vec::new();
    for (partition, key_prefix) in [(0, "l"), (1, "r")] {
        for i in 0..4_i64 {
            rows.push((
                partition,
                i,
                format!("{key_prefix}{i}"),
                if i < 3 { "ledger 7 closed" } else { "no handler" },
                "parked",
            ));
        }
        rows.push((partition, 4, format!("{key_prefix}0"), "held behind parked message", "held"));
    }
    let keys: Vec<String> = rows.iter().map(|r| r.2.clone()).collect();
    let parked: Vec<Parked<'_>> = rows
        .iter()
        .zip(&keys)
        .map(|(r, key)| Parked {
            partition: r.0,
            offset: r.1,
            key,
            event_type: "e",
            version: 1,
            status: r.4,
            reason: r.3,
        })
        .collect();
    park(&pool, &parked).await;
    sqlx::query("UPDATE inbox_parked SET topic = CASE kafka_partition WHEN 0 THEN 'left' ELSE 'right' END")
        .execute(&pool)
        .await
        .expect("topics");
    let (addr, stop) = serve(&pool, ConsoleConfig::default().inbox("public", "inbox")).await;
    let token = csrf(&get(addr, "/failures").await.body);
    let same = [("Sec-Fetch-Site", "same-origin")];
    let state = |topic: &'static str| {
        let pool = pool.clone();
        async move {
            let rows: Vec<(String, bool)> = sqlx::query_as(
                "SELECT status, retry_requested_at IS NOT NULL FROM inbox_parked WHERE topic = $1 ORDER BY kafka_offset",
            )
            .bind(topic)
            .fetch_all(&pool)
            .await
            .expect("rows");
            rows
        }
    };
    for (action, filter) in [("retry", "ledger"), ("discard", "handler")] {
        let mut cli_args = vec![
            "inbox",
            "--consumer",
            "billing",
            action,
            "--topic",
            "left",
            "--reason-contains",
            filter,
            "--yes",
            "--json",
        ];
        if action == "discard" {
            cli_args.extend(["--reason", "obsolete"]);
        }
        let cli = outbox_cli(&pool, &cli_args);
        assert_eq!(cli.status.code(), Some(0), "{cli:?}");
        let cli: serde_json::Value = serde_json::from_str(&stdout(&cli)).expect("the CLI's JSON");
        let body = format!(
            "csrf={token}&key=inbox-{action}&confirm=yes&format=json&topic=right&reason_contains={filter}&reason=obsolete"
        );
        let console = request(addr, "POST", &format!("/actions/inbox/billing/{action}"), &same, &body).await;
        assert_eq!(console.status, 200, "{}", console.body);
        let console: serde_json::Value = serde_json::from_str(&console.body).expect("the console's JSON");
        let report = &console["report"];
        for field in ["action", "dry_run", "matched", "applied", "skipped"] {
            assert_eq!(report[field], cli[field], "{action}: {field}: console {report}, CLI {cli}");
        }
        assert_eq!(state("left").await, state("right").await, "after {action}");
    }
    let right = state("right").await;
    assert_eq!(right.iter().filter(|(_, requested)| *requested).count(), 3, "{right:?}");
    assert_eq!(right.iter().filter(|(status, _)| status == "discarded").count(), 1, "{right:?}");
    stop.cancel();
}
