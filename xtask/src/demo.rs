//! `cargo xtask demo`: the whole path on embedded defaults. The order service places and
//! confirms orders (each change and its event in one transaction), a relay publishes the
//! events, and the consumer's inbox applies them to a projection in a database of its own.
//!
//! PostgreSQL comes from `DATABASE_URL` (default: the local server); the demo creates two
//! fresh databases there, `outbox_demo_orders` and `outbox_demo_projection`. Kafka is
//! `KAFKA_BROKERS` if set, else an in-process mock cluster.

use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

use clap::Args;
use outbox_examples::events::{OrderLine, Payment};
use outbox_examples::orders::{self, Confirmed, NewOrder};
use outbox_examples::{consumer_process, projection};
use outbox_runtime::inbox::Inbox;
use outbox_runtime::ops::InboxSide;
use outbox_runtime::relay::{Relay, RelayConfig};
use outbox_runtime::Outbox;
use outbox_tests::db::fresh_databases;
use outbox_tests::kafka::Kafka;
use outbox_tests::Failure;
use sqlx::postgres::PgPoolOptions;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

#[derive(Args)]
pub(crate) struct DemoArgs {
    /// How many orders to place and confirm.
    #[arg(long, default_value_t = 12)]
    orders: usize,
}

pub(crate) fn run(args: DemoArgs) -> ExitCode {
    crate::block_on("demo", demo(args.orders))
}

async fn demo(count: usize) -> Result<bool, Failure> {
    let [orders_url, projection_url] =
        fresh_databases(["outbox_demo_orders", "outbox_demo_projection"]).await?;
    let orders_db = PgPoolOptions::new().max_connections(8).connect(&orders_url).await?;
    let projection_db = PgPoolOptions::new().max_connections(8).connect(&projection_url).await?;

    let kafka = Kafka::try_start()?;
    kafka.try_create_topic("orders", 6).await?;
    let brokers = kafka.bootstrap();
    println!("outbox demo");
    println!("  producer database  {orders_url}");
    println!("  consumer database  {projection_url}");
    println!(
        "  kafka              {brokers} ({})",
        if kafka.is_mock() { "in-process mock cluster" } else { "KAFKA_BROKERS" }
    );

    let outbox = Outbox::default_ref().clone();
    outbox.migrator().run(&orders_db).await?;
    orders::MIGRATOR.run(&orders_db).await?;
    projection::MIGRATOR.run(&projection_db).await?;
    let inbox =
        Inbox::new(projection_db.clone(), consumer_process::inbox_config(brokers), projection::handlers())?;
    inbox.migrator().run(&projection_db).await?;

    // 1. The order service: place, then confirm each order twice at once; the conditional
    //    UPDATE lets exactly one of the two record the transition and its event.
    let mut ids = Vec::new();
    for i in 0..count {
        let order = NewOrder {
            customer_id: Uuid::now_v7(),
            lines: vec![OrderLine { sku: format!("sku-{}", i % 4), quantity: 1 + (i as u32 % 3) }],
            total_cents: 1_000 + 250 * i as i64,
            currency: "EUR".into(),
            payment: if i % 2 == 0 {
                Payment::Card { last4: "4242".into() }
            } else {
                Payment::Invoice { due_days: 30 }
            },
        };
        ids.push(orders::place(&orders_db, &outbox, &order).await?);
    }
    let (mut confirmed, mut refused) = (0, 0);
    for id in &ids {
        let (a, b) = tokio::join!(
            orders::confirm(&orders_db, &outbox, *id),
            orders::confirm(&orders_db, &outbox, *id)
        );
        for outcome in [a?, b?] {
            match outcome {
                Confirmed::Now { .. } => confirmed += 1,
                Confirmed::NotPending => refused += 1,
            }
        }
    }
    println!("\n1. order service: placed {count} orders, confirmed {confirmed}; {refused} concurrent duplicate confirms were refused (not pending any more)");

    // 2. Relay and consumer run until the projection has every confirmed order.
    let shutdown = CancellationToken::new();
    let relay = Relay::new(orders_db.clone(), outbox.clone(), RelayConfig::new(brokers))?;
    let relay_stats = relay.stats();
    let inbox_stats = inbox.stats();
    let relay_task = tokio::spawn(relay.run(shutdown.clone()));
    let inbox_task = tokio::spawn(inbox.run(shutdown.clone()));
    // The demo's own orders: a shared broker's `orders` topic may hold other producers'
    // events, which the projection applies too.
    let ours: Vec<uuid::Uuid> =
        sqlx::query_scalar("SELECT id FROM orders WHERE status = 'confirmed'").fetch_all(&orders_db).await?;
    let started = Instant::now();
    let mut projected: i64 = 0;
    while started.elapsed() < Duration::from_secs(90) {
        projected = sqlx::query_scalar("SELECT count(*) FROM confirmed_orders WHERE order_id = ANY($1)")
            .bind(&ours)
            .fetch_one(&projection_db)
            .await?;
        if projected >= confirmed as i64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elapsed = started.elapsed();
    shutdown.cancel();
    relay_task.await??;
    inbox_task.await??;

    let by_status: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT event_type, status, count(*) FROM outbox GROUP BY 1, 2 ORDER BY 1, 2")
            .fetch_all(&orders_db)
            .await?;
    println!("2. relay: published {} events (acks=all, idempotent producer)", relay_stats.published());
    for (event_type, status, n) in &by_status {
        println!("     outbox  {event_type:<16} {status:<10} {n}");
    }
    println!(
        "3. consumer inbox: applied {}, ignored {} (order.placed is not its business), duplicates absorbed {}, parked {}",
        inbox_stats.applied(),
        inbox_stats.ignored(),
        inbox_stats.duplicates(),
        inbox_stats.parked()
    );
    let (rows, total, max_applications): (i64, Option<i64>, Option<i32>) = sqlx::query_as(
        "SELECT count(*), sum(total_cents)::bigint, max(applications) FROM confirmed_orders \
             WHERE order_id = ANY($1)",
    )
    .bind(&ours)
    .fetch_one(&projection_db)
    .await?;
    println!(
        "4. projection: {rows} confirmed orders worth {:.2} EUR, each applied {} time(s), {:.1}s after the relay started",
        total.unwrap_or(0) as f64 / 100.0,
        max_applications.unwrap_or(0),
        elapsed.as_secs_f64()
    );
    // 5. What an operator sees: `outbox status` and `outbox reconcile` against the inbox.
    let status = outbox.ops().status(&orders_db).await?;
    println!(
        "5. operator: pending {}, failed {}, published {}, oldest unpublished {}, table {} kB",
        status.pending,
        status.failed,
        status.published,
        status.oldest_unpublished_age_seconds.map_or("-".to_owned(), |s| format!("{s:.1} s")),
        status.table_bytes / 1024
    );
    let hour = Duration::from_secs(3600);
    let side = InboxSide::new(projection_db.clone(), "public", "inbox", projection::CONSUMER)?;
    let reconciled = outbox
        .ops()
        .reconcile(&orders_db, SystemTime::now() - hour, SystemTime::now() + hour, Some(&side))
        .await?;
    println!(
        "     reconcile: {} difference(s); not consumed by {}: {}",
        reconciled.differences,
        projection::CONSUMER,
        reconciled.not_consumed.join(", ")
    );
    println!("     see for yourself: cargo run -p outbox-runtime --features cli --bin outbox -- --database-url {orders_url} status");
    let ok = projected == confirmed as i64
        && max_applications == Some(1)
        && inbox_stats.parked() == 0
        && reconciled.differences == 0;
    if ok {
        println!("\ndemo ok: {confirmed} orders confirmed -> {confirmed} order.confirmed events published -> {rows} applied once each");
    } else {
        println!("\ndemo FAILED: {confirmed} confirmed, {projected} projected, max applications {max_applications:?}");
    }
    drop(kafka);
    Ok(ok)
}
