//! The example consumer: a projection of confirmed orders in its own database, kept by
//! the inbox (each event applied once, in the transaction that records it).

use outbox_runtime::inbox::{EventHandler, HandlerError, Handlers, Meta};
use outbox_runtime::OutboxEvent;
use sqlx::migrate::Migrator;
use sqlx::PgConnection;

use crate::events::{OrderConfirmed, OrderConfirmedV1};

/// The projection's own migrations (`examples/consumer_migrations`).
pub static MIGRATOR: Migrator = sqlx::migrate!("./consumer_migrations");

/// The consumer's name: its Kafka group and its key in the inbox.
pub const CONSUMER: &str = "order-projection";

/// Writes `confirmed_orders`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ConfirmedOrders;

async fn record(
    tx: &mut PgConnection,
    order_id: uuid::Uuid,
    total_cents: i64,
    currency: &str,
    meta: &Meta,
) -> Result<(), HandlerError> {
    // A second application for the same order is counted, never hidden: the chaos run
    // checks that `applications` stays 1.
    sqlx::query(
        "INSERT INTO confirmed_orders (order_id, total_cents, currency, order_version, event_id) \
         VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (order_id) DO UPDATE SET applications = confirmed_orders.applications + 1",
    )
    .bind(order_id)
    .bind(total_cents)
    .bind(currency)
    .bind(meta.aggregate_version)
    .bind(meta.event_id)
    .execute(tx)
    .await?;
    Ok(())
}

impl EventHandler<OrderConfirmed> for ConfirmedOrders {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        event: OrderConfirmed,
        meta: &Meta,
    ) -> Result<(), HandlerError> {
        record(tx, event.order_id, event.total_cents, &event.currency, meta).await
    }
}

impl EventHandler<OrderConfirmedV1> for ConfirmedOrders {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        event: OrderConfirmedV1,
        meta: &Meta,
    ) -> Result<(), HandlerError> {
        // v1 events predate currencies; the service then sold in euros only.
        record(tx, event.order_id, event.total_cents, "EUR", meta).await
    }
}

/// The projection's handlers: both versions of `order.confirmed`; `order.placed` is not its business.
pub fn handlers() -> Handlers {
    Handlers::new()
        .on::<OrderConfirmed, _>(ConfirmedOrders)
        .on::<OrderConfirmedV1, _>(ConfirmedOrders)
        .ignore(crate::events::OrderPlaced::EVENT_TYPE)
}
