//! `inbox_vs_raw` and `inbox_vs_raw_batched`: the inbox applying events against a raw
//! consumer inserting one row per message, one per transaction and batched.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_runtime::inbox::{HandlerError, Handlers, Inbox, InboxConfig, Meta, RawHandler};
use outbox_runtime::relay::{bench as hooks, RelayConfig};
use outbox_runtime::Outbox;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message};
use rdkafka::ClientConfig;
use sqlx::{PgConnection, PgPool};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::broker::Broker;
use super::relay::fill;
use super::{count, percentile, rate, Failure, Figures, Sizes, Stall};

/// The bench consumer's effect: one row per event.
struct Effect;

impl RawHandler for Effect {
    async fn handle(&self, tx: &mut PgConnection, _payload: &[u8], meta: &Meta) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO bench_effects (event_id) VALUES ($1)")
            .bind(meta.event_id)
            .execute(tx)
            .await?;
        Ok(())
    }
}

/// `inbox_vs_raw`: the inbox applying `n` events against a raw consumer doing one INSERT
/// per message, both reading the same one-partition topic.
pub(super) async fn inbox_throughput(
    pool: &PgPool,
    outbox: &Outbox,
    broker: &Broker,
    sizes: Sizes,
    f: &mut Figures,
) -> Result<(), Failure> {
    let n = sizes.inbox_events;
    let topic = format!("bench-inbox-{}", Uuid::new_v4().simple());
    // Four partitions, a worker each on both sides (the mock cluster serves them all).
    broker.create_topic(&topic, INBOX_PARTITIONS).await?;
    sqlx::query("TRUNCATE outbox").execute(pool).await?;
    fill(pool, n, sizes.aggregates, &topic).await?;
    let config = RelayConfig::new(broker.bootstrap());
    let acked = hooks::produce_pending(pool, outbox, &config).await?;
    if i64::try_from(acked)? != n {
        return Err(format!("producing the inbox input: {acked} of {n} acknowledged").into());
    }
    sqlx::query("CREATE TABLE bench_effects (event_id uuid NOT NULL)").execute(pool).await?;
    sqlx::query(
        "CREATE TABLE bench_raw (kafka_partition int NOT NULL, kafka_offset bigint NOT NULL, event_id text)",
    )
    .execute(pool)
    .await?;

    // The raw consumers first (they warm the broker's caches for neither: each reads cold
    // from its own group's start).
    let raw = rate(n, raw_consume(pool, broker.bootstrap(), &topic, n, 1).await?);
    let single = rate(n, inbox_run(pool, broker.bootstrap(), &topic, n, 1, 0).await?);
    // Batched, both sides take well under a second here: three alternating rounds, the
    // median of their ratios (and of each side's rate).
    let (mut ratios, mut raws, mut inboxes) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..3 {
        let raw_batched = rate(n, raw_consume(pool, broker.bootstrap(), &topic, n, INBOX_BATCH).await?);
        let batched = rate(n, inbox_run(pool, broker.bootstrap(), &topic, n, INBOX_BATCH, round).await?);
        ratios.push(batched / raw_batched);
        raws.push(raw_batched);
        inboxes.push(batched);
    }
    let (raw_batched, batched) = (percentile(&mut raws, 0.5), percentile(&mut inboxes, 0.5));
    f.set("inbox_vs_raw", single / raw);
    f.set("inbox_vs_raw_batched", percentile(&mut ratios, 0.5));
    f.set("inbox_events", n);
    f.set("inbox_events_per_s", single);
    f.set("inbox_batched_events_per_s", batched);
    f.set("raw_consumer_msgs_per_s", raw);
    f.set("raw_consumer_batched_msgs_per_s", raw_batched);
    sqlx::query("TRUNCATE outbox").execute(pool).await?;
    Ok(())
}

/// Partitions of the inbox benchmark's topic.
const INBOX_PARTITIONS: i32 = 4;

/// The inbox's default batch size, which both batched consumers use.
const INBOX_BATCH: usize = 100;

/// Runs an inbox (a consumer group of its own per `batch` and `round`, `batch` records per
/// transaction at most) until it applied all `n` events; returns the time it took.
async fn inbox_run(
    pool: &PgPool,
    bootstrap: &str,
    topic: &str,
    n: i64,
    batch: usize,
    round: u32,
) -> Result<Duration, Failure> {
    sqlx::query("TRUNCATE bench_effects").execute(pool).await?;
    let consumer = format!("bench-inbox-{batch}-{round}");
    let inbox_config =
        InboxConfig::new(&consumer, bootstrap, [topic.to_owned()]).dedup_retention(None).batch_size(batch);
    let inbox = Inbox::new(pool.clone(), inbox_config, Handlers::new().fallback(Effect))?;
    inbox.migrator().run(pool).await?;
    let stats = inbox.stats();
    let stop = CancellationToken::new();
    let task = tokio::spawn(inbox.run(stop.clone()));
    // Timed from the first record applied: joining the consumer group (seconds on the mock
    // cluster) is not the inbox's work, and the raw consumer is timed the same way.
    let mut started = None;
    let mut stall = Stall::new();
    while i64::try_from(stats.applied())? < n {
        if started.is_none() && stats.applied() > 0 {
            started = Some(Instant::now());
        }
        if task.is_finished() {
            return Err(format!("the inbox stopped after applying {} of {n}", stats.applied()).into());
        }
        if let Err(e) = stall.check("the inbox", i64::try_from(stats.applied())?, n) {
            stop.cancel();
            return Err(e);
        }
        tokio::time::sleep(Duration::from_millis(if started.is_some() { 20 } else { 2 })).await;
    }
    let elapsed = started.map_or(Duration::ZERO, |t| t.elapsed());
    stop.cancel();
    task.await??;
    let applied = count(pool, "SELECT count(*) FROM bench_effects").await?;
    if applied != n {
        return Err(format!("the inbox ({consumer}) has {applied} effect rows for {n} events").into());
    }
    Ok(elapsed)
}

/// A consumer with the inbox's Kafka settings and a worker per partition that writes each
/// message's row: the messages waiting, up to `batch`, in one transaction (`batch` 1: each
/// in its own). Offsets are committed by librdkafka, periodically, as the inbox commits
/// its own.
async fn raw_consume(
    pool: &PgPool,
    bootstrap: &str,
    topic: &str,
    n: i64,
    batch: usize,
) -> Result<Duration, Failure> {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("bench-raw-{}", Uuid::new_v4().simple()))
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "10000")
        .set("enable.auto.commit", "true")
        .create()?;
    consumer.subscribe(&[topic])?;
    let consumer = Arc::new(consumer);
    let done = Arc::new(std::sync::atomic::AtomicI64::new(0));
    let mut workers: BTreeMap<i32, mpsc::Sender<(i32, i64, Option<String>)>> = BTreeMap::new();
    let mut tasks = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(1800);
    // Timed from the first record received, as the inbox is.
    let mut started = None;
    while done.load(std::sync::atomic::Ordering::Relaxed) < n {
        if Instant::now() > deadline {
            return Err(format!(
                "the raw consumer inserted {} of {n}",
                done.load(std::sync::atomic::Ordering::Relaxed)
            )
            .into());
        }
        let message = match tokio::time::timeout(Duration::from_millis(100), consumer.recv()).await {
            Ok(message) => message?,
            Err(_) => continue,
        };
        started.get_or_insert_with(Instant::now);
        let event_id = message.headers().and_then(|h| {
            h.iter()
                .find(|h| h.key == "ce_id")
                .and_then(|h| h.value)
                .map(|v| String::from_utf8_lossy(v).into_owned())
        });
        let sender = workers.entry(message.partition()).or_insert_with(|| {
            let (tx, mut rx) = mpsc::channel::<(i32, i64, Option<String>)>(256);
            let (pool, done) = (pool.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                let mut rows = Vec::with_capacity(batch);
                while let Some(first) = rx.recv().await {
                    rows.push(first);
                    while rows.len() < batch {
                        match rx.try_recv() {
                            Ok(row) => rows.push(row),
                            Err(_) => break,
                        }
                    }
                    let mut db = pool.begin().await?;
                    let written = i64::try_from(rows.len()).unwrap_or(i64::MAX);
                    for (partition, offset, event_id) in rows.drain(..) {
                        sqlx::query(
                            "INSERT INTO bench_raw (kafka_partition, kafka_offset, event_id) VALUES ($1, $2, $3)",
                        )
                        .bind(partition)
                        .bind(offset)
                        .bind(event_id)
                        .execute(&mut *db)
                        .await?;
                    }
                    db.commit().await?;
                    done.fetch_add(written, std::sync::atomic::Ordering::Relaxed);
                }
                Ok::<(), sqlx::Error>(())
            }));
            tx
        });
        sender.send((message.partition(), message.offset(), event_id)).await?;
    }
    let elapsed = started.map_or(Duration::ZERO, |t| t.elapsed());
    drop(workers);
    for task in tasks {
        task.await??;
    }
    Ok(elapsed)
}
