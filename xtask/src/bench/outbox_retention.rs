//! `outbox_retention_drop_vs_delete`: removing published events past retention from a
//! partitioned outbox by dropping its partitions (one maintenance round, which counts them
//! into the cleaned tally first) against the relay's cleanup DELETE of the same rows from a
//! table in one piece (`delete_published`, 1,000 rows a statement): time and WAL written,
//! each from a checkpoint.

use std::time::Duration;

use outbox_runtime::{Outbox, OutboxConfig};
use sqlx::{AssertSqlSafe, PgPool};
use tokio_util::sync::CancellationToken;

use super::retention::measure;
use super::{Failure, Figures, Sizes};

/// Partitions the rows are spread over.
const PARTS: i64 = 5;

const WEEK: Duration = Duration::from_secs(7 * 24 * 3600);

/// Appends `rows` events published eight days ago (created ten days ago, a 100-byte
/// payload), as the relay leaves them.
async fn load(pool: &PgPool, schema: &str, rows: i64) -> Result<(), Failure> {
    let sql = format!(
        "INSERT INTO \"{schema}\".outbox (event_id, aggregate_type, aggregate_id, event_type, schema_version, topic, \
                                          payload, created_at, status, published_at, attempts, kafka_partition, kafka_offset) \
         SELECT gen_random_uuid(), 'bench', 'a' || (g % 1000), 'bench.retention', 1, 'bench', \
                json_build_object('pad', repeat('x', 90)), now() - interval '10 days', 'published', \
                now() - interval '8 days', 1, 0, g \
         FROM generate_series(1, $1::bigint) g"
    );
    sqlx::query(AssertSqlSafe(sql)).bind(rows).execute(pool).await?;
    Ok(())
}

pub(super) async fn outbox_retention(pool: &PgPool, sizes: Sizes, f: &mut Figures) -> Result<(), Failure> {
    let rows = sizes.retention_rows;
    let outbox = |schema: &str| Outbox::new(OutboxConfig::default().schema(schema));
    let (dropped, deleted) = (outbox("bench_odrop")?, outbox("bench_odelete")?);
    for schema in ["bench_odrop", "bench_odelete"] {
        sqlx::query(AssertSqlSafe(format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE")))
            .execute(pool)
            .await?;
    }
    // A new install's outbox is partitioned; an existing install's (one that took an id
    // before migration 13) stays plain, and is cleaned by DELETE.
    dropped.migrator().run(pool).await?;
    deleted.migrator().run_to(12, pool).await?;
    sqlx::query("SELECT nextval(pg_get_serial_sequence('bench_odelete.outbox', 'id'))").execute(pool).await?;
    deleted.migrator().run(pool).await?;
    if !dropped.ops().is_partitioned(pool).await? || deleted.ops().is_partitioned(pool).await? {
        return Err("bench_odrop.outbox must be partitioned, bench_odelete.outbox plain".into());
    }
    // Each round moves appends on: every partition's first event is ten days old.
    sqlx::query("UPDATE bench_odrop.outbox_partitioning SET span_seconds = 1").execute(pool).await?;
    for _ in 0..PARTS {
        load(pool, "bench_odrop", rows / PARTS).await?;
        let report = dropped.ops().maintain_partitions(pool, None).await?.ok_or("not partitioned")?;
        if report.moved_to.is_none() {
            return Err(format!("a round did not move appends on: {report:?}").into());
        }
    }
    load(pool, "bench_odelete", rows / PARTS * PARTS).await?;
    for schema in ["bench_odrop", "bench_odelete"] {
        sqlx::query(AssertSqlSafe(format!("VACUUM ANALYZE \"{schema}\".outbox"))).execute(pool).await?;
    }

    let (drop_s, drop_wal) = measure(pool, || async {
        let report = dropped.ops().maintain_partitions(pool, Some(WEEK)).await?.ok_or("not partitioned")?;
        if report.dropped.len() < usize::try_from(PARTS)? {
            return Err(format!(
                "a round dropped {:?}, not the {PARTS} partitions of the rows",
                report.dropped
            )
            .into());
        }
        Ok(())
    })
    .await?;
    let (delete_s, delete_wal) = measure(pool, || async {
        let n = deleted.delete_published(pool, WEEK, 1000, &CancellationToken::new()).await?;
        if n != u64::try_from(rows / PARTS * PARTS)? {
            return Err(format!("delete_published deleted {n} of {rows} rows").into());
        }
        Ok(())
    })
    .await?;
    for schema in ["bench_odrop", "bench_odelete"] {
        let left: i64 =
            sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM \"{schema}\".outbox")))
                .fetch_one(pool)
                .await?;
        let tallied: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT coalesce(sum(events), 0)::bigint FROM \"{schema}\".outbox_cleaned"
        )))
        .fetch_one(pool)
        .await?;
        if left != 0 || tallied != rows / PARTS * PARTS {
            return Err(format!("{schema}: {left} rows left, {tallied} counted as cleaned").into());
        }
    }
    f.set("outbox_retention_drop_vs_delete", drop_s / delete_s);
    f.set("outbox_retention_drop_vs_delete_wal", drop_wal / delete_wal);
    f.set("outbox_retention_drop_seconds", drop_s);
    f.set("outbox_retention_delete_seconds", delete_s);
    f.set("outbox_retention_drop_wal_bytes", drop_wal);
    f.set("outbox_retention_delete_wal_bytes", delete_wal);
    for schema in ["bench_odrop", "bench_odelete"] {
        sqlx::query(AssertSqlSafe(format!("DROP SCHEMA \"{schema}\" CASCADE"))).execute(pool).await?;
    }
    Ok(())
}
