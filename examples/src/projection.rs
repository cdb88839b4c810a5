//! The example consumer: a projection of confirmed orders in its own database, kept by
//! the inbox (each event applied once, in the transaction that records it).
//!
//! It does not use the producer's structs: it decodes with the types generated from the
//! committed schemas (`consumer_types`, by `cargo xtask typegen`) and dispatches on the
//! generated enum, as a consumer in another service would.

use outbox_runtime::inbox::{HandlerError, Handlers, Meta, RawHandler};
use sqlx::migrate::Migrator;
use sqlx::PgConnection;

use crate::consumer_types::{decode, Event, OrderConfirmed};

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

impl RawHandler for ConfirmedOrders {
    async fn handle(&self, tx: &mut PgConnection, payload: &[u8], meta: &Meta) -> Result<(), HandlerError> {
        match decode(&meta.event_type, meta.schema_version, payload).map_err(HandlerError::permanent)? {
            Event::OrderConfirmed(OrderConfirmed::V2(e)) => {
                record(tx, e.order_id, e.total_cents, &e.currency, meta).await
            }
            // v1 events predate currencies; the service then sold in euros only.
            Event::OrderConfirmed(OrderConfirmed::V1(e)) => {
                record(tx, e.order_id, e.total_cents, "EUR", meta).await
            }
            // Type, version and id only: formatting the event would put its payload in the
            // parked reason, which operators list and the console shows.
            _ => Err(HandlerError::unhandled(meta)),
        }
    }
}

/// The projection's handlers: `order.confirmed` (every version) through the generated
/// enum; `order.placed` is not its business.
pub fn handlers() -> Handlers {
    Handlers::new().ignore("order.placed").fallback(ConfirmedOrders)
}
