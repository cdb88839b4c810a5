//! The outbox's events in a time window through the console: refused by the index's name
//! until the browse indexes exist, then newest first by time of append (not by id), every
//! event once across the pages its `next` links lead to, the window kept in each link.

use super::common::{append_pings, outbox_cli, stdout};
use super::*;

/// The event ids of a JSON `/events` answer, and its `next` link.
fn page(answer: &Answer) -> (Vec<i64>, Option<String>) {
    assert_eq!(answer.status, 200, "{}", answer.body);
    let json: serde_json::Value = serde_json::from_str(&answer.body).expect(&answer.body);
    let ids = json["page"]["events"]
        .as_array()
        .unwrap_or_else(|| panic!("events: {json}"))
        .iter()
        .map(|e| e["id"].as_i64().expect("an id"))
        .collect();
    (ids, json["next"].as_str().map(str::to_owned))
}

#[sqlx::test(migrations = false)]
async fn a_time_window_pages_by_time_through_its_next_links(pool: PgPool) {
    let names: Vec<String> = (0..7).map(|i| format!("t-{i}")).collect();
    append_pings(&pool, &names).await;
    // Times out of id order (two events share one), the last outside the window.
    sqlx::query(
        "UPDATE outbox SET created_at = timestamptz '2026-03-01 12:00:00+00' \
             + make_interval(secs => (ARRAY[5, 1, 9, 3, 3, 7, 100])[id - (SELECT min(id) FROM outbox) + 1])",
    )
    .execute(&pool)
    .await
    .expect("times");
    let expected: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM outbox WHERE created_at >= '2026-03-01 12:00:00+00' AND created_at < '2026-03-01 12:01:00+00' \
         ORDER BY created_at DESC, id DESC",
    )
    .fetch_all(&pool)
    .await
    .expect("truth");
    assert_eq!(expected.len(), 6);
    assert!(!expected.is_sorted_by(|a, b| a > b), "the window's order by time is not its order by id");
    let (addr, stop) = serve(&pool, ConsoleConfig::default()).await;
    let window = "/events?since=2026-03-01T12:00:00Z&until=2026-03-01T12:01:00Z&limit=2";

    let refused = get(addr, &format!("{window}&format=json")).await;
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert!(refused.body.contains("outbox_browse_time"), "names the index: {}", refused.body);
    let built = outbox_cli(&pool, &["browse-indexes"]);
    assert!(stdout(&built).contains("built outbox_browse_time\n"), "{built:?}");

    let mut listed = Vec::new();
    let mut path = window.to_owned();
    let mut pages = 0;
    loop {
        pages += 1;
        assert!(pages <= 10, "the links go round: {path}");
        let (ids, next) = page(&get(addr, &format!("{path}&format=json")).await);
        listed.extend(ids);
        match next {
            Some(next) => {
                assert!(next.contains("since=") && next.contains("until="), "the window is kept: {next}");
                path = next;
            }
            None => break,
        }
    }
    assert_eq!((listed, pages), (expected, 3));
    stop.cancel();
}
