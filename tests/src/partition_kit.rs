//! Helpers of the tests of a partitioned outbox: appends one at a time, where a row is,
//! moving appends on to the next partition, a maintenance round.

use std::time::Duration;

use outbox_runtime::ops::PartitionReport;
use outbox_runtime::{AppendOptions, NewEvent, Outbox};
use sqlx::{AssertSqlSafe, PgPool};
use uuid::Uuid;

use crate::Step;

/// Appends step `n` of aggregate `id` in a transaction of its own, with `event_id` if given.
pub async fn append(
    pool: &PgPool,
    outbox: &Outbox,
    id: &str,
    n: i64,
    event_id: Option<Uuid>,
) -> outbox_runtime::Result<Uuid> {
    let mut options = AppendOptions::default().aggregate_version(n);
    if let Some(event_id) = event_id {
        options = options.event_id(event_id);
    }
    let event = NewEvent::new(&Step { id: id.to_owned(), n, data: String::new() }, options).expect("event");
    let mut tx = pool.begin().await.expect("begin");
    outbox.append_batch(&mut tx, std::slice::from_ref(&event)).await?;
    tx.commit().await.expect("commit");
    Ok(event.event_id())
}

/// The partition that holds `event_id`.
pub async fn partition_of(pool: &PgPool, event_id: Uuid) -> String {
    sqlx::query_scalar("SELECT tableoid::regclass::text FROM outbox WHERE event_id = $1")
        .bind(event_id)
        .fetch_one(pool)
        .await
        .expect("the row")
}

/// Makes the current partition's events look a day old, then runs a round: appends move on.
pub async fn move_on(pool: &PgPool, outbox: &Outbox) -> PartitionReport {
    let current: String =
        sqlx::query_scalar("SELECT tableoid::regclass::text FROM outbox ORDER BY id DESC LIMIT 1")
            .fetch_one(pool)
            .await
            .expect("current");
    sqlx::query(AssertSqlSafe(format!("UPDATE {current} SET created_at = created_at - interval '1 day'")))
        .execute(pool)
        .await
        .expect("age");
    let report = round(pool, outbox, None).await;
    assert!(report.moved_to.is_some(), "a partition whose first event is a day old is left: {report:?}");
    report
}

/// One maintenance round with `retention`, on a partitioned outbox.
pub async fn round(pool: &PgPool, outbox: &Outbox, retention: Option<Duration>) -> PartitionReport {
    outbox.ops().maintain_partitions(pool, retention).await.expect("round").expect("partitioned")
}

/// Whether `result` is a unique violation (SQLSTATE 23505).
pub fn is_unique_violation(result: &outbox_runtime::Result<Uuid>) -> bool {
    matches!(result, Err(outbox_runtime::Error::Database(e))
        if e.as_database_error().and_then(|d| d.code()).as_deref() == Some("23505"))
}
