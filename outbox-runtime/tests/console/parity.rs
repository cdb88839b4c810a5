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

/// Per aggregate `left` and `right`, the same five events: three published, one pending,
/// one discarded; their ids by aggregate.
async fn twin_published(pool: &PgPool) -> [Vec<Uuid>; 2] {
    let aggregates: Vec<String> = ["left", "right"].iter().flat_map(|a| vec![a.to_string(); 5]).collect();
    let ids = append_pings(pool, &aggregates).await;
    for (i, id) in ids.iter().enumerate() {
        let status = ["published", "published", "published", "pending", "discarded"][i % 5];
        sqlx::query(
            "UPDATE outbox SET status = $2, published_at = CASE WHEN $2 = 'published' THEN now() END, \
             kafka_partition = 0, kafka_offset = $3 WHERE event_id = $1",
        )
        .bind(id)
        .bind(status)
        .bind(i as i64)
        .execute(pool)
        .await
        .expect("state");
    }
    [ids[..5].to_vec(), ids[5..].to_vec()]
}

#[sqlx::test(migrations = false)]
async fn a_replay_in_the_console_is_the_clis_replay(pool: PgPool) {
    let [left, right] = twin_published(&pool).await;
    Outbox::default_ref().ops().create_browse_indexes(&pool).await.expect("browse indexes");
    let (addr, stop) = serve(&pool, ConsoleConfig::default()).await;
    let page = get(addr, "/events?aggregate_id=right").await.body;
    assert!(page.contains("id=\"replay-filter\""), "a filtered list offers its replay: {page}");
    let token = csrf(&page);
    let same = [("Sec-Fetch-Site", "same-origin")];
    let replay_fields = [
        "matched",
        "replayable",
        "replayed",
        "not_yet_published",
        "discarded",
        "cleaned_up",
        "cleaned_up_exact",
    ];
    // A dry run, then one event by its id, then the rest by aggregate.
    let left_first = left[0].to_string();
    for (cli_filter, form_filter, confirm) in [
        (vec!["--aggregate", "left", "--dry-run"], "aggregate_id=right".to_owned(), ""),
        (vec!["--event-id", left_first.as_str()], format!("event_id={}", right[0]), "&confirm=yes"),
        (vec!["--aggregate", "left"], "aggregate_id=right".to_owned(), "&confirm=yes"),
    ] {
        let mut args = vec!["replay", "--json"];
        args.extend(cli_filter.iter().copied());
        let cli = outbox_cli(&pool, &args);
        let cli: serde_json::Value = serde_json::from_str(&stdout(&cli)).expect("the CLI's JSON");
        let body = format!("csrf={token}&key=replay-{form_filter}&format=json&{form_filter}{confirm}");
        let console = request(addr, "POST", "/actions/outbox/replay", &same, &body).await;
        assert_eq!(console.status, 200, "{}", console.body);
        let console: serde_json::Value = serde_json::from_str(&console.body).expect("the console's JSON");
        for field in replay_fields {
            assert_eq!(
                console["replay"][field], cli[field],
                "{form_filter}: {field}: console {console}, CLI {cli}"
            );
        }
        assert_eq!(console["report"]["applied"], cli["replayed"]);
        assert_eq!(states(&pool, &left).await, states(&pool, &right).await, "after {form_filter}{confirm}");
    }
    assert_eq!(states(&pool, &right).await, ["pending", "pending", "pending", "pending", "discarded"]);
    let audit: Vec<(String, String, i64, i64)> =
        sqlx::query_as("SELECT actor, action, matched, applied FROM outbox_audit ORDER BY id")
            .fetch_all(&pool)
            .await
            .expect("audit");
    let actions: Vec<(&str, i64, i64)> = audit.iter().map(|(_, a, m, n)| (a.as_str(), *m, *n)).collect();
    assert_eq!(
        actions,
        [("replay", 1, 1), ("replay", 1, 1), ("replay", 2, 2), ("replay", 2, 2)],
        "{audit:?}"
    );
    assert!(audit.iter().any(|(actor, ..)| actor == "console"), "{audit:?}");
    // Without a filter a replay is refused (as the CLI refuses it), and nothing is written.
    let all =
        request(addr, "POST", "/actions/outbox/replay", &same, &format!("csrf={token}&key=all&confirm=yes"))
            .await;
    assert_eq!(all.status, 400, "{}", all.body);
    assert!(all.body.contains("a replay needs a filter"), "{}", all.body);
    stop.cancel();
}
