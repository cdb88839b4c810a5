//! The relay's throughput against its baselines (`relay_vs_raw_producer`,
//! `relay_vs_pg_mark`, `relay_vs_limit`), and filling the outbox with the backlog the relay
//! and inbox benchmarks start from.

use std::time::{Duration, Instant};

use outbox_runtime::relay::{bench as hooks, Relay, RelayConfig};
use outbox_runtime::Outbox;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::broker::Broker;
use super::{rate, wait_published, Failure, Figures, Sizes, PARTITIONS};

const PAYLOAD_BYTES: i64 = 1024;

/// Fills the outbox with `n` pending 1 KiB events over `aggregates` aggregates, on `topic`,
/// then vacuums and analyses it.
pub(super) async fn fill(pool: &PgPool, n: i64, aggregates: i64, topic: &str) -> Result<(), Failure> {
    fill_rows(pool, n, aggregates, topic).await?;
    sqlx::query("VACUUM ANALYZE outbox").execute(pool).await?;
    Ok(())
}

/// Fills the outbox as [`fill`] does, with nothing vacuumed or analysed after.
async fn fill_rows(pool: &PgPool, n: i64, aggregates: i64, topic: &str) -> Result<(), Failure> {
    let chunk = 50_000;
    let mut from = 0;
    while from < n {
        let to = (from + chunk).min(n);
        sqlx::query(
            "INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, \
                                 schema_version, topic, payload) \
             SELECT gen_random_uuid(), 'bench', 'agg-' || (g % $3), g / $3 + 1, 'bench.filled', 1, $4, \
                    json_build_object('n', g, 'data', repeat('x', $5::int - 24)) \
             FROM generate_series($1::bigint, $2::bigint - 1) AS g",
        )
        .bind(from)
        .bind(to)
        .bind(aggregates)
        .bind(topic)
        .bind(PAYLOAD_BYTES)
        .execute(pool)
        .await?;
        from = to;
    }
    Ok(())
}

/// Runs a relay until `n` rows are published; returns the time from its start.
async fn drain(pool: &PgPool, outbox: &Outbox, config: RelayConfig, n: i64) -> Result<Duration, Failure> {
    let relay = Relay::new(pool.clone(), outbox.clone(), config)?;
    let stats = relay.stats();
    let stop = CancellationToken::new();
    let started = Instant::now();
    let mut task = tokio::spawn(relay.run(stop.clone()));
    let waited = wait_published(pool, &stats, &mut task, n).await;
    let elapsed = started.elapsed();
    stop.cancel();
    waited?;
    task.await??;
    Ok(elapsed)
}

/// `relay_vs_raw_producer`, `relay_vs_pg_mark`, `relay_vs_limit`.
pub(super) async fn relay_throughput(
    pool: &PgPool,
    outbox: &Outbox,
    broker: &Broker,
    sizes: Sizes,
    f: &mut Figures,
) -> Result<(), Failure> {
    let topic = format!("bench-relay-{}", Uuid::new_v4().simple());
    broker.create_topic(&topic, PARTITIONS).await?;
    let n = sizes.relay_events;
    fill(pool, n, sizes.aggregates, &topic).await?;
    let config = RelayConfig::new(broker.bootstrap()).poll_interval(Duration::from_millis(100)).cleanup(None);

    // The raw producer: the same records, the same settings, all in flight at once.
    let (acked, raw_elapsed) = hooks::raw_produce(pool, outbox, &config).await?;
    if i64::try_from(acked)? != n {
        return Err(format!("the raw producer had {acked} of {n} records acknowledged").into());
    }
    let raw = rate(n, raw_elapsed);

    // The relay: claim, publish, mark.
    let relay_elapsed = drain(pool, outbox, config.clone(), n).await?;
    let relay = rate(n, relay_elapsed);

    // The same drain on statistics that say the table is empty: analysed empty, then the
    // whole backlog at once, nothing analysed since (a sudden backlog, autovacuum behind).
    sqlx::query("TRUNCATE outbox").execute(pool).await?;
    sqlx::query("ANALYZE outbox").execute(pool).await?;
    fill_rows(pool, n, sizes.aggregates, &topic).await?;
    let unanalyzed_elapsed = drain(pool, outbox, config.clone(), n).await?;
    let unanalyzed = rate(n, unanalyzed_elapsed);

    // The database alone: the relay's claim and mark statements, no Kafka.
    sqlx::query("UPDATE outbox SET status = 'pending', published_at = NULL, attempts = 0")
        .execute(pool)
        .await?;
    sqlx::query("VACUUM ANALYZE outbox").execute(pool).await?;
    let (marked, mark_elapsed) = hooks::mark_all(pool, outbox, 500).await?;
    if i64::try_from(marked)? != n {
        return Err(format!("marking alone marked {marked} of {n}").into());
    }
    let mark = rate(n, mark_elapsed);

    // Hot aggregates: 10 aggregates carry every event, against the raw producer sending
    // the same records.
    let hot_n = n.min(20_000);
    sqlx::query("TRUNCATE outbox").execute(pool).await?;
    fill(pool, hot_n, 10, &topic).await?;
    let (acked, raw_hot_elapsed) = hooks::raw_produce(pool, outbox, &config).await?;
    if i64::try_from(acked)? != hot_n {
        return Err(format!("the raw producer had {acked} of {hot_n} hot records acknowledged").into());
    }
    let raw_hot = rate(hot_n, raw_hot_elapsed);
    let hot = rate(hot_n, drain(pool, outbox, config.clone(), hot_n).await?);

    f.set("relay_vs_raw_producer", relay / raw);
    f.set("relay_unanalyzed_vs_raw_producer", unanalyzed / raw);
    f.set("relay_hot_vs_raw_producer", hot / raw_hot);
    f.set("relay_hot_events", hot_n);
    f.set("relay_hot_events_per_s", hot);
    f.set("raw_producer_hot_msgs_per_s", raw_hot);
    f.set("relay_vs_pg_mark", relay / mark);
    f.set("relay_vs_limit", relay / raw.min(mark));
    f.set("relay_events", n);
    f.set("relay_events_per_s", relay);
    f.set("relay_unanalyzed_events_per_s", unanalyzed);
    f.set("raw_producer_msgs_per_s", raw);
    f.set("pg_mark_rows_per_s", mark);
    Ok(())
}
