//! `claim_backlog_ratio`: the relay's claim of one batch over a large backlog against a
//! small one; `claim_outage_ratio`: the same claim with a million rows waiting for a retry
//! (a broker outage) against none.

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
    let Claims { a: small_t, b: large_t } =
        alternate_claims(pool, (&small, &large), 500, sizes.claims).await?;
    f.set("claim_backlog_ratio", large_t.median / small_t.median);
    f.set("claim_backlog_ratio_of_means", large_t.mean / small_t.mean);
    f.set("claim_ms_small_backlog", small_t.median * 1e3);
    f.set("claim_ms_large_backlog", large_t.median * 1e3);
    f.set("claim_small_backlog", sizes.claim_small);
    f.set("claim_large_backlog", sizes.claim_large);
    f.set("claims_measured", sizes.claims);
    Ok(())
}

/// `claim_outage_ratio`: the relay's claim of one batch of due rows with
/// `sizes.claim_waiting` rows waiting for a retry that is not due (a broker outage: every
/// row sent failed and waits), against the same due rows alone. Two tables side by side,
/// claims alternating, as in [`claim_backlog`]; the waiting rows are older (lower ids) than
/// the due ones, as they are in an outage.
pub(super) async fn claim_outage(pool: &PgPool, sizes: Sizes, f: &mut Figures) -> Result<(), Failure> {
    const DUE: i64 = 500;
    let calm = Outbox::new(outbox_runtime::OutboxConfig::default().table("claim_calm"))?;
    let outage = Outbox::new(outbox_runtime::OutboxConfig::default().table("claim_outage"))?;
    for (outbox, table, waiting) in [(&calm, "claim_calm", 0), (&outage, "claim_outage", sizes.claim_waiting)]
    {
        outbox.migrator().run(pool).await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {table} (event_id, aggregate_type, aggregate_id, event_type, schema_version, topic, payload, \
                                  attempts, next_attempt_at, last_error) \
             SELECT gen_random_uuid(), 'bench', 'waiting-' || g, 'bench.claim', 1, 'bench-claim', '{{}}', 3, \
                    now() + interval '1 hour', 'broker down' \
             FROM generate_series(1, $1::bigint) AS g"
        )))
        .bind(waiting)
        .execute(pool)
        .await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {table} (event_id, aggregate_type, aggregate_id, event_type, schema_version, topic, payload) \
             SELECT gen_random_uuid(), 'bench', 'due-' || g, 'bench.claim', 1, 'bench-claim', '{{}}' \
             FROM generate_series(1, $1::bigint) AS g"
        )))
        .bind(DUE)
        .execute(pool)
        .await?;
        sqlx::query(sqlx::AssertSqlSafe(format!("VACUUM ANALYZE {table}"))).execute(pool).await?;
    }
    let Claims { a: calm_t, b: outage_t } =
        alternate_claims(pool, (&calm, &outage), DUE, sizes.claims).await?;
    f.set("claim_outage_ratio", outage_t.median / calm_t.median);
    f.set("claim_outage_ratio_of_means", outage_t.mean / calm_t.mean);
    f.set("claim_ms_no_waiting", calm_t.median * 1e3);
    f.set("claim_ms_waiting", outage_t.median * 1e3);
    f.set("claim_waiting_rows", sizes.claim_waiting);
    for table in ["claim_calm", "claim_outage"] {
        sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {table}"))).execute(pool).await?;
    }
    Ok(())
}

/// Claims `batch` rows of `a` and of `b` in turn, `claims` times each after 5 to warm up,
/// and returns the mean time of a claim of each. Alternating makes whatever else the
/// machine does hit both alike. A claim that returns other than `batch` rows is an error:
/// the two would not be measuring the same work.
async fn alternate_claims(
    pool: &PgPool,
    (a, b): (&Outbox, &Outbox),
    batch: i64,
    claims: usize,
) -> Result<Claims, Failure> {
    let _ = sqlx::query("CHECKPOINT").execute(pool).await;
    let (mut a_times, mut b_times) = (Vec::with_capacity(claims), Vec::with_capacity(claims));
    for i in 0..claims + 5 {
        let (a_rows, a_time) = hooks::claim_once(pool, a, batch).await?;
        let (b_rows, b_time) = hooks::claim_once(pool, b, batch).await?;
        if i64::try_from(a_rows) != Ok(batch) || i64::try_from(b_rows) != Ok(batch) {
            return Err(format!("claims read {a_rows} and {b_rows} rows, not {batch}").into());
        }
        if i >= 5 {
            a_times.push(a_time.as_secs_f64());
            b_times.push(b_time.as_secs_f64());
        }
    }
    Ok(Claims { a: Times::of(a_times), b: Times::of(b_times) })
}

/// Both tables' claim times.
struct Claims {
    a: Times,
    b: Times,
}

/// One table's claim times: the median (what a claim costs, unmoved by the odd claim that
/// waited for a checkpoint or autovacuum on a 2-core machine) and the mean.
struct Times {
    median: f64,
    mean: f64,
}

impl Times {
    fn of(mut times: Vec<f64>) -> Times {
        times.sort_by(f64::total_cmp);
        let n = times.len().max(1);
        let median = if times.is_empty() {
            0.0
        } else if n % 2 == 1 {
            times[n / 2]
        } else {
            (times[n / 2 - 1] + times[n / 2]) / 2.0
        };
        #[allow(clippy::cast_precision_loss)]
        let mean = times.iter().sum::<f64>() / n as f64;
        Times { median, mean }
    }
}
