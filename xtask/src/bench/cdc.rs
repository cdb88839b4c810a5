//! The design's three relay models side by side, on librdkafka's mock cluster (where the
//! broker is not the limit, so the figures are the relays' own): the change-data-capture
//! relay's `cdc_vs_raw_producer` (a drained backlog, against a raw producer sending the
//! same records) and `cdc_db_cost` (WAL written per event while draining, against the
//! polling relay's); `hold_locks_vs_lease` (the polling relay holding each batch's locks
//! across the send, against the lease mode); for each model WAL bytes and dead tuples per
//! 10,000 events and the p50 and p99 of created-to-published at a steady 500 events/s.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_examples::events::{OrderConfirmed, Payment};
use outbox_runtime::cdc::{CdcConfig, CdcRelay};
use outbox_runtime::relay::{bench as hooks, ClaimMode, Relay, RelayConfig, RelayStats};
use outbox_runtime::{AppendOptions, NewEvent, Outbox, OutboxEvent};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::broker::mock_broker;
use super::relay::fill;
use super::{count, rate, wait_published, Failure, Figures, Sizes, PARTITIONS};

/// The bench's slot and publication, dropped at the end (and at the start, if a failed
/// run left them).
const SLOT: &str = "outbox_bench_cdc";

async fn drop_slot(pool: &PgPool) -> Result<(), Failure> {
    sqlx::query("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1")
        .bind(SLOT)
        .execute(pool)
        .await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP PUBLICATION IF EXISTS \"{SLOT}\""))).execute(pool).await?;
    Ok(())
}

/// The WAL position, after a checkpoint: each window then starts with the same full-page
/// images to write (one checkpoint falling inside one window and not the other made its
/// WAL look 1.8 times the other's).
async fn wal_after_checkpoint(pool: &PgPool) -> Result<f64, Failure> {
    sqlx::query("CHECKPOINT").execute(pool).await?;
    wal(pool).await
}

async fn wal(pool: &PgPool) -> Result<f64, Failure> {
    Ok(sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8")
        .fetch_one(pool)
        .await?)
}

/// Which relay a run uses.
enum Which {
    Polling,
    HoldLocks,
    Cdc,
}

/// Rows of the outbox (of each of its partitions) updated or deleted so far, each of which
/// left a dead tuple for vacuum (`pg_stat_user_tables`; a backend reports its counts when it ends, so the relays run on
/// pools of their own, closed before this is read).
async fn dead_tuples(pool: &PgPool) -> Result<f64, Failure> {
    let mut conn = pool.acquire().await?;
    sqlx::query("SELECT pg_stat_clear_snapshot()").execute(&mut *conn).await?;
    Ok(sqlx::query_scalar(
        "SELECT coalesce(sum(n_tup_upd + n_tup_del), 0)::float8 FROM pg_stat_user_tables \
         WHERE relid IN (SELECT relid FROM pg_partition_tree('outbox'))",
    )
    .fetch_one(&mut *conn)
    .await?)
}

/// Starts a relay of `which` kind.
/// A relay running: how to stop it, its counters, its task.
type Started = (CancellationToken, Arc<RelayStats>, tokio::task::JoinHandle<outbox_runtime::Result<()>>);

fn start(
    pool: &PgPool,
    outbox: &Outbox,
    config: RelayConfig,
    cdc: &CdcConfig,
    which: &Which,
) -> Result<Started, Failure> {
    let stop = CancellationToken::new();
    let (stats, task) = match which {
        Which::Polling | Which::HoldLocks => {
            let config = match which {
                Which::HoldLocks => config.claim_mode(ClaimMode::HoldLocks),
                _ => config,
            };
            let relay = Relay::new(pool.clone(), outbox.clone(), config)?;
            (relay.stats(), tokio::spawn(relay.run(stop.clone())))
        }
        Which::Cdc => {
            let relay = CdcRelay::new(pool.clone(), outbox.clone(), config, cdc.clone())?;
            (relay.stats(), tokio::spawn(relay.run(stop.clone())))
        }
    };
    Ok((stop, stats, task))
}

/// What draining a backlog cost.
struct Drained {
    events_per_s: f64,
    wal_bytes: f64,
    dead_tuples: f64,
}

/// Runs a relay on a pool of its own until `n` rows are published, from a checkpoint.
async fn drain(
    pool: &PgPool,
    url: &str,
    outbox: &Outbox,
    config: RelayConfig,
    cdc: &CdcConfig,
    which: &Which,
    n: i64,
) -> Result<Drained, Failure> {
    let relay_pool = PgPoolOptions::new().max_connections(8).connect(url).await?;
    let (wal_before, dead_before) = (wal_after_checkpoint(pool).await?, dead_tuples(pool).await?);
    let started = Instant::now();
    let (stop, stats, mut task) = start(&relay_pool, outbox, config, cdc, which)?;
    let waited = wait_published(pool, &stats, &mut task, n).await;
    let elapsed = started.elapsed();
    stop.cancel();
    waited?;
    task.await??;
    relay_pool.close().await;
    let wal_bytes = wal(pool).await? - wal_before;
    // The relay's backends have reported their counts as they ended.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let dead_tuples = dead_tuples(pool).await? - dead_before;
    Ok(Drained { events_per_s: rate(n, elapsed), wal_bytes, dead_tuples })
}

/// p50 and p99 of created-to-published (ms) at a steady 500 events/s, each in its own
/// transaction, with a relay of `which` kind running.
async fn steady(
    pool: &PgPool,
    outbox: &Outbox,
    config: RelayConfig,
    cdc: &CdcConfig,
    which: &Which,
    seconds: u64,
) -> Result<(f64, f64), Failure> {
    sqlx::query("TRUNCATE outbox").execute(pool).await?;
    let (stop, _, task) = start(pool, outbox, config, cdc, which)?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let total = seconds * 500;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut appended = 0;
    while appended < total {
        tick.tick().await;
        for _ in 0..5 {
            let event = OrderConfirmed {
                order_id: Uuid::now_v7(),
                total_cents: 1_000,
                currency: "EUR".into(),
                payment: Payment::Card { last4: "4242".into() },
                note: None,
            };
            let event = NewEvent::new(&event, AppendOptions::default())?;
            let mut tx = pool.begin().await?;
            outbox.append_batch(&mut tx, std::slice::from_ref(&event)).await?;
            tx.commit().await?;
            appended += 1;
        }
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while count(pool, "SELECT count(*) FROM outbox WHERE status = 'published'").await? < i64::try_from(total)?
    {
        if Instant::now() > deadline || task.is_finished() {
            return Err("the relay did not publish the steady load".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    task.await??;
    let (p50, p99): (f64, f64) = sqlx::query_as(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM published_at - created_at)), \
                percentile_cont(0.99) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM published_at - created_at)) \
         FROM outbox",
    )
    .fetch_one(pool)
    .await?;
    Ok((p50 * 1e3, p99 * 1e3))
}

/// `cdc_vs_raw_producer`, `cdc_db_cost`, `hold_locks_vs_lease`, and each model's costs.
pub(super) async fn cdc_throughput(
    pool: &PgPool,
    url: &str,
    outbox: &Outbox,
    sizes: Sizes,
    f: &mut Figures,
) -> Result<(), Failure> {
    let level: String = sqlx::query_scalar("SHOW wal_level").fetch_one(pool).await?;
    if level != "logical" {
        return Err(format!("the change-data-capture bench needs wal_level = logical (it is {level})").into());
    }
    drop_slot(pool).await?;
    let result = measure(pool, url, outbox, sizes, f).await;
    drop_slot(pool).await?;
    result
}

async fn measure(
    pool: &PgPool,
    url: &str,
    outbox: &Outbox,
    sizes: Sizes,
    f: &mut Figures,
) -> Result<(), Failure> {
    let mock = mock_broker()?;
    let topic = format!("bench-cdc-{}", Uuid::new_v4().simple());
    mock.create_topic(&topic, PARTITIONS).await?;
    mock.create_topic(<OrderConfirmed as OutboxEvent>::TOPIC, PARTITIONS).await?;
    let n = sizes.relay_events;
    let config = RelayConfig::new(mock.bootstrap()).poll_interval(Duration::from_millis(100)).cleanup(None);
    let cdc = CdcConfig::new(url).slot(SLOT).publication(SLOT);

    // The raw producer and the polling relay on the same backlog.
    sqlx::query("TRUNCATE outbox").execute(pool).await?;
    fill(pool, n, sizes.aggregates, &topic).await?;
    let (acked, raw_elapsed) = hooks::raw_produce(pool, outbox, &config).await?;
    if i64::try_from(acked)? != n {
        return Err(format!("the raw producer had {acked} of {n} records acknowledged").into());
    }
    let raw = rate(n, raw_elapsed);
    let polling = drain(pool, url, outbox, config.clone(), &cdc, &Which::Polling, n).await?;
    sqlx::query("TRUNCATE outbox").execute(pool).await?;
    fill(pool, n, sizes.aggregates, &topic).await?;
    let holding = drain(pool, url, outbox, config.clone(), &cdc, &Which::HoldLocks, n).await?;
    // The polling relays' steady loads before the slot exists: a slot set up before them
    // would stream their inserts to the CDC relay's steady run first (rows truncated since,
    // each looked up and skipped), which put 1.4 s into its p99.
    let (polling_p50, polling_p99) =
        steady(pool, outbox, config.clone(), &cdc, &Which::Polling, sizes.steady_seconds).await?;
    let (holding_p50, holding_p99) =
        steady(pool, outbox, config.clone(), &cdc, &Which::HoldLocks, sizes.steady_seconds).await?;

    // The stream: the slot first, then the same backlog written (so that it is streamed).
    sqlx::query("TRUNCATE outbox").execute(pool).await?;
    cdc.setup(pool, outbox).await?;
    fill(pool, n, sizes.aggregates, &topic).await?;
    let streamed = drain(pool, url, outbox, config.clone(), &cdc, &Which::Cdc, n).await?;
    let (cdc_p50, cdc_p99) = steady(pool, outbox, config, &cdc, &Which::Cdc, sizes.steady_seconds).await?;
    sqlx::query("TRUNCATE outbox").execute(pool).await?;

    #[allow(clippy::cast_precision_loss)]
    let per_10k = |amount: f64| amount / n as f64 * 10_000.0;
    f.set("cdc_vs_raw_producer", streamed.events_per_s / raw);
    f.set("cdc_db_cost", streamed.wal_bytes / polling.wal_bytes);
    f.set("hold_locks_vs_lease", holding.events_per_s / polling.events_per_s);
    f.set("cdc_events_per_s", streamed.events_per_s);
    f.set("cdc_polling_events_per_s", polling.events_per_s);
    f.set("hold_locks_events_per_s", holding.events_per_s);
    f.set("cdc_raw_producer_msgs_per_s", raw);
    f.set("cdc_wal_bytes_per_10k_events", per_10k(streamed.wal_bytes));
    f.set("polling_wal_bytes_per_10k_events", per_10k(polling.wal_bytes));
    f.set("hold_locks_wal_bytes_per_10k_events", per_10k(holding.wal_bytes));
    f.set("cdc_dead_tuples_per_10k_events", per_10k(streamed.dead_tuples));
    f.set("polling_dead_tuples_per_10k_events", per_10k(polling.dead_tuples));
    f.set("hold_locks_dead_tuples_per_10k_events", per_10k(holding.dead_tuples));
    f.set("cdc_latency_p50_ms", cdc_p50);
    f.set("cdc_latency_p99_ms", cdc_p99);
    f.set("polling_notify_latency_p50_ms_mock", polling_p50);
    f.set("polling_notify_latency_p99_ms_mock", polling_p99);
    f.set("hold_locks_latency_p50_ms", holding_p50);
    f.set("hold_locks_latency_p99_ms", holding_p99);
    Ok(())
}
