//! Hooks for `cargo xtask bench`: the relay's own statements and producer, run one piece at
//! a time, so that the benchmarks compare the relay with baselines built from the same
//! parts. Not public API.

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use rdkafka::producer::FutureRecord;
use sqlx::PgPool;

use super::claim::{Row, Statements};
use super::{publish, RelayConfig};
use crate::error::Result;
use crate::outbox::Outbox;

/// Runs the relay's claim statement once over every work partition, `limit` rows; returns
/// how many rows it read and how long it took.
pub async fn claim_once(pool: &PgPool, outbox: &Outbox, limit: i64) -> Result<(usize, Duration)> {
    let statements = Statements::new(outbox.names());
    let partitions: Vec<i32> =
        (0..i32::try_from(outbox.config().work_partitions).unwrap_or(i32::MAX)).collect();
    let started = Instant::now();
    let rows = statements.claim(pool, &partitions, limit, &[]).await?;
    Ok((rows.len(), started.elapsed()))
}

/// Every pending row, in id order, with the columns the relay reads.
async fn pending_rows(pool: &PgPool, outbox: &Outbox) -> Result<Vec<Row>> {
    Ok(sqlx::query_as(crate::table::sql(format!(
        "SELECT o.id, o.event_id, o.aggregate_type, o.aggregate_id, o.aggregate_version, o.event_type, \
                o.schema_version, o.topic, o.payload::text AS payload, o.headers::text AS headers, \
                to_char(o.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') AS created_at, \
                o.attempts, o.work_partition \
         FROM {} o WHERE o.status = 'pending' ORDER BY o.id",
        outbox.names().outbox
    )))
    .fetch_all(pool)
    .await?)
}

/// Sends `rows` with the relay's keys and headers and these producer `settings`, `window`
/// rows at a time, each window acknowledged before the next. Returns the records
/// acknowledged and the time from the first send to the last acknowledgement.
async fn send_rows(
    rows: &[Row],
    config: &RelayConfig,
    settings: &std::collections::BTreeMap<String, String>,
    window: usize,
) -> Result<(usize, Duration)> {
    // The relay's producer times nothing out itself: the whole backlog may wait in its queue.
    let producer = publish::producer(&config.brokers, settings)?;
    let started = Instant::now();
    let mut acked = 0;
    for chunk in rows.chunks(window.max(1)) {
        let deliveries = chunk.iter().map(|row| {
            let record = FutureRecord::to(&row.topic)
                .key(row.aggregate_id.as_bytes())
                .payload(row.payload.as_bytes())
                .headers(publish::headers(row, config, None));
            producer.send(record, Duration::from_secs(60))
        });
        acked += join_all(deliveries).await.iter().filter(|r| r.is_ok()).count();
    }
    Ok((acked, started.elapsed()))
}

/// Sends every pending row once, all at once, with the relay's producer settings but
/// lingering 100 ms (input for the consumer benchmarks). Returns the records acknowledged.
pub async fn produce_pending(pool: &PgPool, outbox: &Outbox, config: &RelayConfig) -> Result<usize> {
    let rows = pending_rows(pool, outbox).await?;
    // Large record batches: a consumer of the mock cluster gets one batch per fetch, so
    // small ones would make the consumers measure the fetch round trip instead.
    let mut settings = config.producer.clone();
    settings.insert("linger.ms".to_owned(), "100".to_owned());
    Ok(send_rows(&rows, config, &settings, rows.len()).await?.0)
}

/// The raw producer baseline: the best of three ways a raw client sends every pending row
/// with the relay's keys, headers and durability (acks=all, idempotent), nothing marked.
/// All at once with 5 requests in flight (the most idempotence allows; a raw client need
/// not keep order on a broker that does not check sequences), all at once with the relay's
/// own settings, and in windows of the relay's batch size, each acknowledged before the
/// next. Returns the records acknowledged and the time of the fastest way; each way sends
/// every row once more, so the topic ends up with three copies.
pub async fn raw_produce(pool: &PgPool, outbox: &Outbox, config: &RelayConfig) -> Result<(usize, Duration)> {
    let rows = pending_rows(pool, outbox).await?;
    let mut five = config.producer.clone();
    five.insert("max.in.flight.requests.per.connection".to_owned(), "5".to_owned());
    let batch = usize::try_from(config.batch_size).unwrap_or(usize::MAX);
    let mut best: Option<(usize, Duration)> = None;
    for (settings, window) in [(&five, rows.len()), (&config.producer, rows.len()), (&config.producer, batch)]
    {
        let (acked, elapsed) = send_rows(&rows, config, settings, window).await?;
        if best.is_none_or(|(_, fastest)| elapsed < fastest) {
            best = Some((acked, elapsed));
        }
    }
    Ok(best.unwrap_or_default())
}

/// The database baseline: marks every pending row published with the relay's own claim
/// and fenced mark statements, `batch` rows at a time, with no Kafka at all (placements
/// are made up). Takes every work partition lease for the run and frees them after.
/// Returns the rows marked and the time it took.
pub async fn mark_all(pool: &PgPool, outbox: &Outbox, batch: i64) -> Result<(u64, Duration)> {
    use super::claim::Placement;
    use super::mark::{Fence, Marks};
    let statements = Statements::new(outbox.names());
    let owner = uuid::Uuid::new_v4();
    let leases = &outbox.names().leases;
    let held: Vec<(i32, i64)> = sqlx::query_as(crate::table::sql(format!(
        "UPDATE {leases} SET owner = $1, token = token + 1, expires_at = now() + interval '1 hour' \
         RETURNING work_partition, token"
    )))
    .bind(owner)
    .fetch_all(pool)
    .await?;
    let fence = Fence {
        relay_id: owner,
        partitions: held.iter().map(|(p, _)| *p).collect(),
        tokens: held.iter().map(|(_, t)| *t).collect(),
    };
    let started = Instant::now();
    let mut marked = 0;
    loop {
        let rows = statements.claim(pool, &fence.partitions, batch, &[]).await?;
        if rows.is_empty() {
            break;
        }
        let marks = Marks {
            published: rows.iter().map(|r| (r.id, Placement { partition: 0, offset: r.id })).collect(),
            ..Marks::default()
        };
        marked += statements.mark(pool, &marks, &fence).await?.published;
    }
    let elapsed = started.elapsed();
    sqlx::query(crate::table::sql(format!(
        "UPDATE {leases} SET owner = NULL, expires_at = '-infinity' WHERE owner = $1"
    )))
    .bind(owner)
    .execute(pool)
    .await?;
    Ok((marked, elapsed))
}
