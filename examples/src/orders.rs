//! The order service: its table and the `place` and `confirm` transitions, each appending
//! its event in the same transaction as the change.

use outbox_runtime::{AppendOptions, Outbox};
use sqlx::migrate::Migrator;
use sqlx::PgPool;
use uuid::Uuid;

use crate::events::{OrderConfirmed, OrderLine, OrderPlaced, Payment};

/// The order service's own migrations (`examples/migrations`).
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// What can go wrong in the order service.
#[derive(Debug, thiserror::Error)]
pub enum OrderError {
    /// The outbox refused the event or the database failed.
    #[error(transparent)]
    Outbox(#[from] outbox_runtime::Error),
    /// The database failed.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// A stored value could not be read back.
    #[error("order {0}: stored payment is unreadable: {1}")]
    Corrupt(Uuid, serde_json::Error),
}

/// The outcome of [`confirm`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confirmed {
    /// This call confirmed the order; the event carries the new version.
    Now {
        /// The order's version after confirmation.
        version: i64,
        /// The `order.confirmed` event appended with it.
        event_id: Uuid,
    },
    /// The order was not pending (already confirmed, cancelled or unknown): nothing changed.
    NotPending,
}

/// A new order to place.
#[derive(Debug, Clone)]
pub struct NewOrder {
    /// Who orders.
    pub customer_id: Uuid,
    /// What.
    pub lines: Vec<OrderLine>,
    /// Total in the smallest currency unit.
    pub total_cents: i64,
    /// ISO 4217 code.
    pub currency: String,
    /// How it will be paid.
    pub payment: Payment,
}

/// Inserts a pending order and appends `order.placed` (version 1) in one transaction.
pub async fn place(pool: &PgPool, outbox: &Outbox, order: &NewOrder) -> Result<Uuid, OrderError> {
    let id = Uuid::now_v7();
    let payment = serde_json::to_value(&order.payment).map_err(|e| OrderError::Corrupt(id, e))?;
    let mut tx = pool.begin().await?;
    sqlx::query(
        "INSERT INTO orders (id, customer_id, total_cents, currency, payment) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(id)
    .bind(order.customer_id)
    .bind(order.total_cents)
    .bind(&order.currency)
    .bind(payment)
    .execute(&mut *tx)
    .await?;
    let event = OrderPlaced {
        order_id: id,
        customer_id: order.customer_id,
        lines: order.lines.clone(),
        total_cents: order.total_cents,
    };
    outbox.append_with(&mut tx, &event, AppendOptions::default().aggregate_version(1)).await?;
    tx.commit().await?;
    Ok(id)
}

/// The confirm transition: only a pending order changes, and the new version comes back.
/// The confirm transition (the bench's append floor runs it too).
#[doc(hidden)]
pub const CONFIRM: &str = "UPDATE orders SET status = 'confirmed', version = version + 1 \
                       WHERE id = $1 AND status = 'pending' \
                       RETURNING version, total_cents, currency, payment";

/// [`confirm`] without the outbox: the same transaction, the same UPDATE, no event. It
/// exists as the baseline of the `append_overhead` benchmark (`cargo xtask bench`).
pub async fn confirm_without_event(pool: &PgPool, order_id: Uuid) -> Result<bool, OrderError> {
    let mut tx = pool.begin().await?;
    let row: Option<(i64, i64, String, serde_json::Value)> =
        sqlx::query_as(CONFIRM).bind(order_id).fetch_optional(&mut *tx).await?;
    tx.commit().await?;
    Ok(row.is_some())
}

/// Confirms a pending order. The conditional UPDATE lets exactly one of any number of
/// concurrent calls record the transition, and its event is appended in the same
/// transaction, with the version the UPDATE returned.
pub async fn confirm(pool: &PgPool, outbox: &Outbox, order_id: Uuid) -> Result<Confirmed, OrderError> {
    let mut tx = pool.begin().await?;
    let row: Option<(i64, i64, String, serde_json::Value)> =
        sqlx::query_as(CONFIRM).bind(order_id).fetch_optional(&mut *tx).await?;
    let Some((version, total_cents, currency, payment)) = row else {
        tx.rollback().await?;
        return Ok(Confirmed::NotPending);
    };
    let payment: Payment = serde_json::from_value(payment).map_err(|e| OrderError::Corrupt(order_id, e))?;
    let event = OrderConfirmed { order_id, total_cents, currency, payment, note: None };
    let event_id =
        outbox.append_with(&mut tx, &event, AppendOptions::default().aggregate_version(version)).await?;
    tx.commit().await?;
    Ok(Confirmed::Now { version, event_id })
}
