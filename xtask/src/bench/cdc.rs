//! The change-data-capture relay against its baselines, on librdkafka's mock cluster (where
//! the broker is not the limit, so the figures are the relay's own): `cdc_vs_raw_producer`
//! (a drained backlog, against a raw producer sending the same records), `cdc_db_cost`
//! (WAL written per event while draining, against the polling relay's), and the p99 of
//! created-to-published at a steady 500 events/s, beside the polling relay's with NOTIFY.

use std::time::{Duration, Instant};

use outbox_examples::events::{OrderConfirmed, Payment};
use outbox_runtime::cdc::{CdcConfig, CdcRelay};
use outbox_runtime::relay::{bench as hooks, Relay, RelayConfig};
use outbox_runtime::{AppendOptions, NewEvent, Outbox, OutboxEvent};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::broker::mock_broker;
use super::relay::fill;
use super::{count, rate, Failure, Figures, Sizes, Stall, PARTITIONS};

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
    Cdc,
}

/// Starts a relay of `which` kind.
fn start(
    pool: &PgPool,
    outbox: &Outbox,
    config: RelayConfig,
    cdc: &CdcConfig,
    which: &Which,
) -> Result<(CancellationToken, tokio::task::JoinHandle<outbox_runtime::Result<()>>), Failure> {
    let stop = CancellationToken::new();
    let task = match which {
        Which::Polling => tokio::spawn(Relay::new(pool.clone(), outbox.clone(), config)?.run(stop.clone())),
        Which::Cdc => {
            tokio::spawn(CdcRelay::new(pool.clone(), outbox.clone(), config, cdc.clone())?.run(stop.clone()))
        }
    };
    Ok((stop, task))
}

/// Runs a relay until `n` rows are published; returns the time from its start.
async fn drain(
    pool: &PgPool,
    outbox: &Outbox,
    config: RelayConfig,
    cdc: &CdcConfig,
    which: &Which,
    n: i64,
) -> Result<Duration, Failure> {
    let started = Instant::now();
    let (stop, task) = start(pool, outbox, config, cdc, which)?;
    let mut stall = Stall::new();
    loop {
        let published = count(pool, "SELECT count(*) FROM outbox WHERE status = 'published'").await?;
        if published >= n {
            break;
        }
        if task.is_finished() {
            return Err(
                format!("the relay stopped after publishing {published} of {n}: {:?}", task.await).into()
            );
        }
        if let Err(e) = stall.check("the relay", published, n) {
            stop.cancel();
            return Err(e);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = started.elapsed();
    stop.cancel();
    task.await??;
    Ok(elapsed)
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
    let (stop, task) = start(pool, outbox, config, cdc, which)?;
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

/// `cdc_vs_raw_producer`, `cdc_db_cost`, `cdc_latency_p99_ms`.
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
    let before = wal_after_checkpoint(pool).await?;
    let polling = rate(n, drain(pool, outbox, config.clone(), &cdc, &Which::Polling, n).await?);
    let polling_wal = wal(pool).await? - before;

    // The stream: the slot first, then the same backlog written (so that it is streamed).
    sqlx::query("TRUNCATE outbox").execute(pool).await?;
    cdc.setup(pool, outbox).await?;
    fill(pool, n, sizes.aggregates, &topic).await?;
    let before = wal_after_checkpoint(pool).await?;
    let streamed = rate(n, drain(pool, outbox, config.clone(), &cdc, &Which::Cdc, n).await?);
    let cdc_wal = wal(pool).await? - before;

    let (polling_p50, polling_p99) =
        steady(pool, outbox, config.clone(), &cdc, &Which::Polling, sizes.steady_seconds).await?;
    let (cdc_p50, cdc_p99) = steady(pool, outbox, config, &cdc, &Which::Cdc, sizes.steady_seconds).await?;
    sqlx::query("TRUNCATE outbox").execute(pool).await?;

    #[allow(clippy::cast_precision_loss)]
    let per_10k = |bytes: f64| bytes / n as f64 * 10_000.0;
    f.set("cdc_vs_raw_producer", streamed / raw);
    f.set("cdc_db_cost", cdc_wal / polling_wal);
    f.set("cdc_events_per_s", streamed);
    f.set("cdc_polling_events_per_s", polling);
    f.set("cdc_raw_producer_msgs_per_s", raw);
    f.set("cdc_wal_bytes_per_10k_events", per_10k(cdc_wal));
    f.set("polling_wal_bytes_per_10k_events", per_10k(polling_wal));
    f.set("cdc_latency_p50_ms", cdc_p50);
    f.set("cdc_latency_p99_ms", cdc_p99);
    f.set("polling_notify_latency_p50_ms_mock", polling_p50);
    f.set("polling_notify_latency_p99_ms_mock", polling_p99);
    Ok(())
}
