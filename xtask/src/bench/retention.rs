//! `retention_drop_vs_delete`: removing expired dedup rows from a partitioned inbox table
//! by dropping its partitions (one maintenance round) against the batched DELETE of the
//! same rows from a table in one piece (`delete_applied`, 1,000 rows a statement): time
//! and WAL written, each after a checkpoint so that both start from the same state.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use outbox_runtime::inbox::{Handlers, Inbox, InboxConfig};
use sqlx::{AssertSqlSafe, PgPool};

use super::{Failure, Figures, Sizes};

/// Spans of one second each, the rows spread over them.
const SPANS: u64 = 5;

fn inbox(pool: &PgPool, schema: &str) -> Result<Inbox, Failure> {
    let config = InboxConfig::new("bench", "127.0.0.1:1", ["bench"])
        .schema(schema)
        .dedup_retention(Some(Duration::from_secs(1)));
    Ok(Inbox::new(pool.clone(), config, Handlers::new())?)
}

/// Inserts `rows` dedup rows applied two hours ago, their UUIDv7 ids spread over the
/// `SPANS` seconds from `base_ms`; with `bucket`, the partition key too.
async fn load(pool: &PgPool, schema: &str, rows: i64, base_ms: u64, bucket: bool) -> Result<(), Failure> {
    let (column, value) =
        if bucket { (", bucket", format!(", \"{schema}\".inbox_bucket(id)")) } else { ("", String::new()) };
    let sql = format!(
        "INSERT INTO \"{schema}\".inbox (consumer, event_id, event_type, schema_version, topic, kafka_partition, \
                                         kafka_offset, applied_at{column}) \
         SELECT 'bench', id, 'bench.retention', 1, 'bench', 0, g, now() - interval '2 hours'{value} \
         FROM (SELECT g, (lpad(to_hex($2::bigint + g * $3::bigint / $1::bigint), 12, '0') || '7' \
                          || substr(md5(g::text), 1, 3) || '8' || substr(md5(g::text), 4, 15))::uuid AS id \
               FROM generate_series(0, $1::bigint - 1) g) s"
    );
    sqlx::query(AssertSqlSafe(sql))
        .bind(rows)
        .bind(i64::try_from(base_ms)?)
        .bind(i64::try_from(SPANS * 1000)?)
        .execute(pool)
        .await?;
    sqlx::query(AssertSqlSafe(format!("VACUUM ANALYZE \"{schema}\".inbox"))).execute(pool).await?;
    Ok(())
}

/// Seconds and WAL bytes `work` takes, from a checkpoint.
pub(super) async fn measure<F, Fut>(pool: &PgPool, work: F) -> Result<(f64, f64), Failure>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<(), Failure>>,
{
    sqlx::query("CHECKPOINT").execute(pool).await?;
    let lsn: String = sqlx::query_scalar("SELECT pg_current_wal_insert_lsn()::text").fetch_one(pool).await?;
    let started = Instant::now();
    work().await?;
    let seconds = started.elapsed().as_secs_f64();
    let wal: f64 =
        sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::float8")
            .bind(lsn)
            .fetch_one(pool)
            .await?;
    Ok((seconds, wal))
}

pub(super) async fn retention(pool: &PgPool, sizes: Sizes, f: &mut Figures) -> Result<(), Failure> {
    let rows = sizes.retention_rows;
    let (dropped, deleted) = (inbox(pool, "bench_drop")?, inbox(pool, "bench_delete")?);
    for schema in ["bench_drop", "bench_delete"] {
        sqlx::query(AssertSqlSafe(format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE")))
            .execute(pool)
            .await?;
    }
    // A new install: partitioned, spans of a second for the bench.
    dropped.migrator().run(pool).await?;
    sqlx::query("UPDATE bench_drop.inbox_partitioning SET span_seconds = 1, ahead = $1")
        .bind(i32::try_from(SPANS + 1)?)
        .execute(pool)
        .await?;
    let now_ms = u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis())?;
    let base_ms = now_ms / 1000 * 1000;
    dropped.maintain_partitions().await?.ok_or("bench_drop.inbox is not partitioned")?;
    // An existing install: migrated before partitions, left in one piece.
    deleted.migrator().run_to(5, pool).await?;
    load(pool, "bench_drop", rows, base_ms, true).await?;
    load(pool, "bench_delete", rows, base_ms, false).await?;
    // Every span over, and past the retention of a second.
    let until = base_ms + SPANS * 1000 + 1500;
    let now_ms = u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis())?;
    tokio::time::sleep(Duration::from_millis(until.saturating_sub(now_ms))).await;

    let (drop_s, drop_wal) = measure(pool, || async {
        let report = dropped.maintain_partitions().await?.ok_or("not partitioned")?;
        if report.dropped.len() < usize::try_from(SPANS)? {
            return Err(format!(
                "a round dropped {:?}, not the {SPANS} partitions of the rows",
                report.dropped
            )
            .into());
        }
        Ok(())
    })
    .await?;
    let (delete_s, delete_wal) = measure(pool, || async {
        let n = deleted.delete_applied(Duration::from_secs(1), 1000).await?;
        if n != u64::try_from(rows)? {
            return Err(format!("delete_applied deleted {n} of {rows} rows").into());
        }
        Ok(())
    })
    .await?;
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM bench_drop.inbox").fetch_one(pool).await?;
    if left != 0 {
        return Err(format!("{left} rows left after the partitions were dropped").into());
    }
    f.set("retention_drop_vs_delete", drop_s / delete_s);
    f.set("retention_drop_vs_delete_wal", drop_wal / delete_wal);
    f.set("retention_rows", rows);
    f.set("retention_drop_seconds", drop_s);
    f.set("retention_delete_seconds", delete_s);
    f.set("retention_drop_wal_bytes", drop_wal);
    f.set("retention_delete_wal_bytes", delete_wal);
    for schema in ["bench_drop", "bench_delete"] {
        sqlx::query(AssertSqlSafe(format!("DROP SCHEMA \"{schema}\" CASCADE"))).execute(pool).await?;
    }
    Ok(())
}
