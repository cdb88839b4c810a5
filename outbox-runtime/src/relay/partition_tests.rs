//! A partitioned outbox's claim and marks read the partitions that can hold their rows, not
//! every partition the table has.

use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

use super::claim::{Placement, Statements};
use super::lease::Leases;
use super::mark::{Fence, Marks};
use super::tests::rows_read;
use crate::Outbox;

/// Index scans of the partitions in `old` that a plan started (all loops), and the rows
/// they read.
fn loops_in(plan: &serde_json::Value, old: &[String]) -> (u64, u64) {
    fn walk(node: &serde_json::Value, old: &[String], found: &mut (u64, u64)) {
        if let Some(relation) = node["Relation Name"].as_str() {
            if old.iter().any(|o| o == relation) && node["Node Type"] != "ModifyTable" {
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                {
                    let loops = node["Actual Loops"].as_f64().unwrap_or(0.0);
                    found.0 += loops as u64;
                    found.1 += (node["Actual Rows"].as_f64().unwrap_or(0.0) * loops) as u64;
                }
            }
        }
        for child in node["Plans"].as_array().into_iter().flatten() {
            walk(child, old, found);
        }
    }
    let mut found = (0, 0);
    walk(&plan[0]["Plan"], old, &mut found);
    found
}

/// Eight partitions of published events behind the current one: the claim's probe of each
/// claimed row's aggregate (an earlier waiting or failed event?) reads only the partitions
/// from the lowest open id on, and each mark only its batch's. Without the bound (the
/// statements of a plain table) the claim started 4,024 scans of the old partitions, and
/// under the plain table's planner settings it materialized every partition's waiting rows.
#[sqlx::test(migrations = false)]
async fn claims_and_marks_of_a_partitioned_outbox_leave_done_partitions_alone(pool: PgPool) {
    const BATCH: i64 = 500;
    let outbox = Outbox::default_ref();
    crate::migrate::migrate_existing(outbox, &pool).await;
    assert!(outbox.ops().partition_table(&pool).await.expect("convert"));
    let insert = |n: i64| {
        sqlx::query(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, schema_version, topic, payload) \
             SELECT gen_random_uuid(), 'test', 'a' || (g % 300), 'test.ping', 1, 'test', '{}' \
             FROM generate_series(1, $1) AS g",
        )
        .bind(n)
    };
    for _ in 0..8 {
        insert(2_000).execute(&pool).await.expect("rows");
        sqlx::query(
            "UPDATE outbox SET status = 'published', published_at = now(), created_at = now() - interval '2 days' \
             WHERE status = 'pending'",
        )
        .execute(&pool)
        .await
        .expect("publish");
        let report =
            outbox.ops().maintain_partitions(&pool, None).await.expect("round").expect("partitioned");
        assert!(report.moved_to.is_some(), "{report:?}");
    }
    insert(2_000).execute(&pool).await.expect("pending rows");
    // One aggregate's first pending event waits for a retry: something for the probe to find.
    sqlx::query(
        "UPDATE outbox SET next_attempt_at = now() + interval '1 hour', attempts = 1 \
         WHERE id = (SELECT min(id) FROM outbox WHERE status = 'pending')",
    )
    .execute(&pool)
    .await
    .expect("retrying");
    sqlx::query("ANALYZE outbox").execute(&pool).await.expect("analyze");
    let old: Vec<String> =
        sqlx::query_scalar("SELECT DISTINCT tableoid::regclass::text FROM outbox WHERE status = 'published'")
            .fetch_all(&pool)
            .await
            .expect("old partitions");
    assert_eq!(old.len(), 8, "{old:?}");
    let mut leases = Leases::new(outbox.names(), Uuid::new_v4(), Duration::from_secs(30));
    leases.maintain(&pool).await.expect("maintain");
    let partitions = leases.partitions(Duration::ZERO);

    let plain = Statements::new(outbox.names());
    let bounded = Statements::partitioned(outbox.names());
    let plans = bounded.explain_claim(&pool, &partitions, BATCH).await.expect("explain");
    let (loops, rows) = loops_in(&plans[0], &old);
    let mut shape = String::new();
    plan_shape(&plans[0][0]["Plan"], 0, &mut shape);
    assert!(
        loops <= 8 * 20 && rows == 0,
        "old partitions are looked at a bounded number of times, whatever the batch: {loops} scans, {rows} rows\n{shape}"
    );
    assert!(
        !shape.contains("Materialize"),
        "each row's aggregate is probed, never all waiting rows kept:\n{shape}"
    );
    let rows = bounded.claim(&pool, &partitions, BATCH, &[]).await.expect("claim");
    let ids = |rows: &[super::claim::Row]| rows.iter().map(|r| r.id).collect::<Vec<_>>();
    let unbounded = plain.claim(&pool, &partitions, BATCH, &[]).await.expect("claim");
    assert_eq!(ids(&rows), ids(&unbounded), "the same rows either way");
    assert_eq!(rows.len(), usize::try_from(BATCH).expect("batch"));

    let (parts, tokens) = leases.fence();
    let fence = Fence { relay_id: leases.relay_id(), partitions: parts, tokens };
    let marks = Marks {
        published: rows[..400].iter().map(|r| (r.id, Placement { partition: 0, offset: r.id })).collect(),
        retry: rows[400..450]
            .iter()
            .map(|r| (r.id, Duration::from_secs(60), "down".to_owned(), true))
            .collect(),
        failed: rows[450..].iter().map(|r| (r.id, "too large".to_owned())).collect(),
    };
    for plan in bounded.explain_mark(&pool, &marks, &fence).await.expect("explain marks") {
        assert_eq!(
            loops_in(&plan, &old),
            (0, 0),
            "a mark reads its batch's partition only: {:?}",
            rows_read(&plan, "outbox")
        );
    }
}

/// The plan's nodes, one a line, indented by depth, with their loops and rows.
fn plan_shape(node: &serde_json::Value, depth: usize, out: &mut String) {
    use std::fmt::Write as _;
    let _ = writeln!(
        out,
        "{}{} {} {} loops={} rows={}",
        "  ".repeat(depth),
        node["Node Type"].as_str().unwrap_or(""),
        node["Relation Name"].as_str().unwrap_or(""),
        node["Index Name"].as_str().unwrap_or(""),
        node["Actual Loops"],
        node["Actual Rows"]
    );
    for child in node["Plans"].as_array().into_iter().flatten() {
        plan_shape(child, depth + 1, out);
    }
}

/// The change-data-capture relay's table path on a partitioned outbox keeps its own scope
/// (only rows something touched since their append) and gets the partitioned bounds; the
/// polling relay's statements become the partitioned ones. Before, the table path kept
/// the plain table's unbounded statements.
#[cfg(feature = "cdc")]
#[test]
fn the_table_paths_statements_are_bounded_on_a_partitioned_outbox_and_keep_their_scope() {
    let names = Outbox::default_ref().names();
    let floor = crate::migrate::open_floor_sql(&names.outbox);
    let table_path = Statements::table_path(names).on_partitions(names);
    for sql in table_path.claim_sql() {
        assert!(sql.contains(&floor), "bounded by the lowest open id: {sql}");
        assert!(sql.contains(crate::migrate::TOUCHED), "only touched rows: {sql}");
    }
    let polling = Statements::new(names).on_partitions(names);
    for (sql, partitioned) in polling.claim_sql().into_iter().zip(Statements::partitioned(names).claim_sql())
    {
        assert_eq!(sql, partitioned);
        assert!(sql.contains(&floor));
    }
}

/// The rows whose mark is being written (the previous batch, acknowledged) are left out of
/// both walks, whatever order the relay lists them in, and one of them does not count as a
/// fresh row left out before a due row of its aggregate. The claim finds them by binary
/// search over the sorted ids; the relay's list is neither sorted nor free of repeats here.
#[sqlx::test(migrations = false)]
async fn rows_being_marked_are_left_out_of_both_walks(pool: PgPool) {
    let outbox = Outbox::default_ref();
    outbox.migrator().run(&pool).await.expect("migrate");
    // Ids 1-10 fresh, each its own aggregate; 11 and 12 due for a retry; aggregate x: 13
    // fresh (being marked), 14 due.
    sqlx::query(
        "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, schema_version, topic, payload, \
                             attempts, next_attempt_at) \
         SELECT gen_random_uuid(), 't', CASE WHEN g > 12 THEN 'x' ELSE 'a' || g END, 'e', 1, 't', '{}', \
                CASE WHEN g IN (11, 12, 14) THEN 1 ELSE 0 END, \
                CASE WHEN g IN (11, 12, 14) THEN now() - interval '1 second' ELSE '-infinity' END \
         FROM generate_series(1, 14) AS g",
    )
    .execute(&pool)
    .await
    .expect("rows");
    let partitions: Vec<i32> = (0..32).collect();
    for (which, sql) in
        [("plain", Statements::new(outbox.names())), ("partitioned", Statements::partitioned(outbox.names()))]
    {
        let claimed = sql.claim(&pool, &partitions, 100, &[12, 5, 13, 1, 10, 5]).await.expect("claim");
        let ids: Vec<i64> = claimed.iter().map(|r| r.id).collect();
        assert_eq!(ids, [2, 3, 4, 6, 7, 8, 9, 11, 14], "{which} statements");
        // Without marks being written every row (14 with 13 before it in the batch).
        let all = sql.claim(&pool, &partitions, 100, &[]).await.expect("claim");
        assert_eq!(all.len(), 14, "{which} statements");
    }
}
