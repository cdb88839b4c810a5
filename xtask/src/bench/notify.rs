//! `notify_latency_vs_poll`: created-to-published latency at a steady load, with the relay
//! woken by NOTIFY and polling every second.

use std::time::{Duration, Instant};

use outbox_examples::events::{OrderConfirmed, Payment};
use outbox_runtime::relay::{Relay, RelayConfig};
use outbox_runtime::{AppendOptions, NewEvent, Outbox, OutboxEvent};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::broker::Broker;
use super::{count, Failure, Figures, Sizes, PARTITIONS};

/// The relay's poll interval in the NOTIFY benchmark: latency is judged against it.
const POLL: Duration = Duration::from_secs(1);

/// `notify_latency_vs_poll`: p99 created-to-published latency at a steady 500 events/s,
/// each appended in its own transaction, with the relay woken by NOTIFY and polling every
/// second.
pub(super) async fn notify_latency(
    pool: &PgPool,
    outbox: &Outbox,
    broker: &Broker,
    sizes: Sizes,
    f: &mut Figures,
) -> Result<(), Failure> {
    sqlx::query("TRUNCATE outbox").execute(pool).await?;
    broker.create_topic(<OrderConfirmed as OutboxEvent>::TOPIC, PARTITIONS).await?;
    let relay = Relay::new(
        pool.clone(),
        outbox.clone(),
        RelayConfig::new(broker.bootstrap()).poll_interval(POLL).cleanup(None),
    )?;
    let stop = CancellationToken::new();
    let task = tokio::spawn(relay.run(stop.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let total = sizes.steady_seconds * 500;
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
    let total_i64 = i64::try_from(total)?;
    while count(pool, "SELECT count(*) FROM outbox WHERE status = 'published'").await? < total_i64 {
        if Instant::now() > deadline {
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
    f.set("notify_latency_vs_poll", p99 / POLL.as_secs_f64());
    f.set("steady_events", total);
    f.set("created_to_published_p50_ms", p50 * 1e3);
    f.set("created_to_published_p99_ms", p99 * 1e3);
    sqlx::query("TRUNCATE outbox").execute(pool).await?;
    Ok(())
}
