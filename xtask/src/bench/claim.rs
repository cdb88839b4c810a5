//! `claim_backlog_ratio`: the relay's claim of one batch over a large backlog against a
//! small one.

use outbox_runtime::relay::bench as hooks;
use outbox_runtime::Outbox;
use sqlx::PgPool;

use super::{Failure, Figures, Sizes};

/// `claim_backlog_ratio`: the relay's claim of one batch over a large backlog against a
/// small one. The two backlogs are two outbox tables side by side and the claims alternate
/// between them, so that whatever else the machine does hits both alike.
pub(super) async fn claim_backlog(pool: &PgPool, sizes: Sizes, f: &mut Figures) -> Result<(), Failure> {
    let small = Outbox::new(outbox_runtime::OutboxConfig::default().table("claim_small"))?;
    let large = Outbox::new(outbox_runtime::OutboxConfig::default().table("claim_large"))?;
    for (outbox, table, backlog) in
        [(&small, "claim_small", sizes.claim_small), (&large, "claim_large", sizes.claim_large)]
    {
        outbox.migrator().run(pool).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {table} (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, \
                                  schema_version, topic, payload) \
             SELECT gen_random_uuid(), 'bench', 'agg-' || (g % 10000), g / 10000 + 1, 'bench.claim', 1, 'bench-claim', '{{}}' \
             FROM generate_series(0, $1::bigint - 1) AS g"
        )))
        .bind(backlog)
        .execute(pool)
        .await?;
        sqlx::query(sqlx::AssertSqlSafe(format!("VACUUM ANALYZE {table}"))).execute(pool).await?;
    }
    // Flush what the inserts dirtied now rather than during the measurement (needs a
    // superuser; without one the checkpoint simply happens when PostgreSQL decides).
    let _ = sqlx::query("CHECKPOINT").execute(pool).await;
    let (mut small_total, mut large_total) = (0.0, 0.0);
    for i in 0..sizes.claims + 5 {
        let (small_rows, small_time) = hooks::claim_once(pool, &small, 500).await?;
        let (large_rows, large_time) = hooks::claim_once(pool, &large, 500).await?;
        if small_rows != 500 || large_rows != 500 {
            return Err(format!("claims read {small_rows} and {large_rows} rows, not 500").into());
        }
        if i >= 5 {
            small_total += small_time.as_secs_f64();
            large_total += large_time.as_secs_f64();
        }
    }
    #[allow(clippy::cast_precision_loss)]
    let (small_mean, large_mean) = (small_total / sizes.claims as f64, large_total / sizes.claims as f64);
    f.set("claim_backlog_ratio", large_mean / small_mean);
    f.set("claim_ms_small_backlog", small_mean * 1e3);
    f.set("claim_ms_large_backlog", large_mean * 1e3);
    f.set("claim_small_backlog", sizes.claim_small);
    f.set("claim_large_backlog", sizes.claim_large);
    f.set("claims_measured", sizes.claims);
    Ok(())
}
