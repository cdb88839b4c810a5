//! Leases and fencing against real PostgreSQL.

use std::time::Duration;

use schemars::JsonSchema;
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use super::claim::{Fence, Marked, Marks, Placement, Statements};
use super::lease::Leases;
use crate::{Outbox, OutboxConfig, OutboxEvent};

#[derive(Serialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "test.ping", schema_version = 1, aggregate = "test", topic = "test")]
struct Ping {
    #[outbox(aggregate_id)]
    id: u32,
}

const TTL: Duration = Duration::from_secs(30);

async fn one_partition_outbox(pool: &PgPool) -> Outbox {
    let outbox = Outbox::new(OutboxConfig::default().work_partitions(1)).expect("config");
    outbox.migrator().run(pool).await.expect("migrate");
    let mut tx = pool.begin().await.expect("begin");
    outbox.append(&mut tx, &Ping { id: 1 }).await.expect("append");
    outbox.append(&mut tx, &Ping { id: 2 }).await.expect("append");
    tx.commit().await.expect("commit");
    outbox
}

fn fence_of(leases: &Leases) -> Fence {
    let (partitions, tokens) = leases.fence();
    Fence { relay_id: leases.relay_id(), partitions, tokens }
}

#[sqlx::test(migrations = false)]
async fn a_relay_whose_lease_expired_cannot_mark_rows_taken_over(pool: PgPool) {
    // Fault: relay A stalls past its lease while B takes the partition over. Invariant 5:
    // A's marks are refused (fenced); B's go through; A learns it lost the lease.
    let outbox = one_partition_outbox(&pool).await;
    let sql = Statements::new(outbox.names());
    let mut a = Leases::new(outbox.names(), Uuid::new_v4(), TTL);
    assert_eq!(a.maintain(&pool).await.expect("maintain").acquired, [0]);
    let rows = sql.claim(&pool, &a.partitions(Duration::ZERO), 10, &[]).await.expect("claim");
    assert_eq!(rows.len(), 2);

    let mut b = Leases::new(outbox.names(), Uuid::new_v4(), TTL);
    assert!(
        b.maintain(&pool).await.expect("maintain").acquired.is_empty(),
        "no takeover while A's lease runs"
    );

    sqlx::query("UPDATE outbox_leases SET expires_at = now() - interval '1 second'")
        .execute(&pool)
        .await
        .expect("expire");
    assert_eq!(b.maintain(&pool).await.expect("maintain").acquired, [0], "B takes the expired partition");

    let marks = || Marks {
        published: vec![(rows[0].id, Placement { partition: 0, offset: 7 })],
        retry: vec![(rows[1].id, Duration::from_secs(1), "transient".into())],
        failed: Vec::new(),
    };
    let refused = sql.mark(&pool, &marks(), &fence_of(&a)).await.expect("mark");
    assert_eq!(refused, Marked::default(), "A's marks are fenced off");
    let untouched: Vec<(String, i32)> = sqlx::query_as("SELECT status, attempts FROM outbox ORDER BY id")
        .fetch_all(&pool)
        .await
        .expect("rows");
    assert_eq!(untouched, [("pending".to_owned(), 0), ("pending".to_owned(), 0)]);

    let accepted = sql.mark(&pool, &marks(), &fence_of(&b)).await.expect("mark");
    assert_eq!(accepted, Marked { published: 1, retry: 1, failed: 0 });

    assert_eq!(a.maintain(&pool).await.expect("maintain").lost, [0], "A finds out at its next renewal");
    assert!(a.partitions(Duration::ZERO).is_empty());
}

#[sqlx::test(migrations = false)]
async fn fair_share_splits_partitions_between_live_relays(pool: PgPool) {
    let outbox = Outbox::new(OutboxConfig::default().work_partitions(8)).expect("config");
    outbox.migrator().run(&pool).await.expect("migrate");
    let mut a = Leases::new(outbox.names(), Uuid::new_v4(), TTL);
    assert_eq!(a.maintain(&pool).await.expect("maintain").acquired.len(), 8, "alone, A takes all");
    let mut b = Leases::new(outbox.names(), Uuid::new_v4(), TTL);
    assert!(b.maintain(&pool).await.expect("maintain").acquired.is_empty(), "nothing free yet");
    assert_eq!(a.maintain(&pool).await.expect("maintain").released.len(), 4, "A sees B and gives back half");
    assert_eq!(b.maintain(&pool).await.expect("maintain").acquired.len(), 4);
    let (mut pa, pb) = (a.partitions(Duration::ZERO), b.partitions(Duration::ZERO));
    pa.extend(&pb);
    pa.sort_unstable();
    assert_eq!(pa, (0..8).collect::<Vec<_>>(), "disjoint and complete");

    b.release_all(&pool).await.expect("release");
    assert_eq!(a.maintain(&pool).await.expect("maintain").acquired.len(), 4, "A takes B's back at once");
}

#[sqlx::test(migrations = false)]
async fn the_claims_order_check_probes_the_blocked_index_not_every_open_row(pool: PgPool) {
    // A claim must cost O(batch), not O(backlog): with 20,000 pending rows, the check for
    // an earlier blocking event of the same aggregate goes through the small `blocked`
    // partial index. Planned as a scan of every open row, a claim over 100k pending rows
    // took 14.9 ms instead of 0.4 ms (BENCHMARKS.md).
    let outbox = Outbox::default_ref();
    outbox.migrator().run(&pool).await.expect("migrate");
    sqlx::query(
        "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, event_type, schema_version, topic, payload) \
         SELECT gen_random_uuid(), 'test', 'a' || (g % 2000), 'test.ping', 1, 'test', '{}' \
         FROM generate_series(1, 20000) AS g",
    )
    .execute(&pool)
    .await
    .expect("backlog");
    // One aggregate waits for a retry, so there is something to find.
    sqlx::query("UPDATE outbox SET next_attempt_at = now() + interval '1 hour', attempts = 1 WHERE id = 1")
        .execute(&pool)
        .await
        .expect("retrying");
    sqlx::query("ANALYZE outbox").execute(&pool).await.expect("analyze");
    let sql = Statements::new(outbox.names());
    let partitions: Vec<i32> = (0..32).collect();
    let plan: serde_json::Value =
        sqlx::query_scalar(crate::table::sql(format!("EXPLAIN (FORMAT JSON) {}", sql.claim_sql())))
            .bind(&partitions)
            .bind(500_i64)
            .bind(Vec::<i64>::new())
            .fetch_one(&pool)
            .await
            .expect("explain");
    let plan = plan.to_string();
    assert!(
        plan.contains("\"Index Name\":\"outbox_blocked\""),
        "the order check must use the blocked index: {plan}"
    );
    let rows = sql.claim(&pool, &partitions, 500, &[]).await.expect("claim");
    assert_eq!(rows.len(), 500);
    assert!(
        rows.iter().all(|r| r.aggregate_id != "a1" || r.id == 1) && rows.iter().all(|r| r.id != 1),
        "a1 waits behind its retrying event"
    );
}
