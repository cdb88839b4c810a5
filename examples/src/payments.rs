//! Effects outside the database: capturing a confirmed order's payment at a gateway.
//!
//! The inbox makes a handler's database effect happen once (the dedup row and the effect
//! commit together). A call to another service is not part of that transaction: it can
//! succeed while the transaction then rolls back, and the event is delivered again. So
//! the call carries a key that is the same on every delivery,
//! [`Meta::idempotency_key`], and the receiver performs the effect once per key.
//!
//! The pattern, in two steps:
//! 1. [`RequestCapture`], consumer `payments` of `order.confirmed`, appends the intent,
//!    [`CaptureRequested`] with that key, to its own outbox in the inbox transaction: the
//!    intent commits exactly when the event counts as applied, whatever the gateway does.
//! 2. [`Capture`], consumer `payment-capture` of `payments`, calls the gateway with the
//!    intent's key. An unavailable gateway is a transient error: retried with backoff,
//!    parked after `max_attempts`; a declined payment is permanent: parked with its reason
//!    for an operator (`outbox inbox --consumer payment-capture parked`). A call that
//!    succeeded before a rollback is repeated with the same key, which the gateway absorbs.
//!
//! Where the receiver has no idempotency key, nothing on this side can make the call
//! happen once: reconcile (compare what the receiver did with the intents, e.g. by the
//! order id) and compensate (refund a second capture).

use std::future::Future;

use outbox_runtime::inbox::{EventHandler, HandlerError, Meta};
use outbox_runtime::{Outbox, OutboxEvent};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::events::OrderConfirmed;

/// The payments service intends to capture an order's payment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(
    event_type = "payment.capture_requested",
    schema_version = 1,
    aggregate = "order",
    topic = "payments"
)]
pub struct CaptureRequested {
    /// The order.
    #[outbox(aggregate_id)]
    pub order_id: Uuid,
    /// Amount in the smallest currency unit.
    pub amount_cents: i64,
    /// ISO 4217 currency code.
    pub currency: String,
    /// The key the gateway deduplicates on: the idempotency key of the `order.confirmed`
    /// event for consumer `payments`, the same on every delivery.
    pub idempotency_key: Uuid,
}

/// Step 1: records the intent to capture, in the transaction that applies the event.
#[derive(Debug, Clone)]
pub struct RequestCapture {
    /// The payments service's own outbox (in the inbox's database).
    pub outbox: Outbox,
}

impl EventHandler<OrderConfirmed> for RequestCapture {
    async fn handle(
        &self,
        tx: &mut PgConnection,
        e: OrderConfirmed,
        meta: &Meta,
    ) -> Result<(), HandlerError> {
        let intent = CaptureRequested {
            order_id: e.order_id,
            amount_cents: e.total_cents,
            currency: e.currency,
            idempotency_key: meta.idempotency_key(),
        };
        // In the inbox's transaction: if it rolls back, so does the intent; once it
        // commits, the inbox row keeps a redelivery from appending a second one.
        self.outbox.append(tx, &intent).await.map_err(HandlerError::transient)?;
        Ok(())
    }
}

/// Why a gateway did not capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GatewayError {
    /// Down, timing out, rate limiting: may pass.
    Unavailable(String),
    /// Refused for good (card declined, amount invalid).
    Declined(String),
}

/// A payment gateway that honours idempotency keys (an HTTP API in a real service: send
/// the key as its `Idempotency-Key` header).
pub trait Gateway: Send + Sync + 'static {
    /// Captures `amount_cents` for `order_id`, once per `key`.
    fn capture(
        &self,
        key: Uuid,
        order_id: Uuid,
        amount_cents: i64,
        currency: &str,
    ) -> impl Future<Output = Result<(), GatewayError>> + Send;
}

/// Step 2: performs the call, with the intent's key.
#[derive(Debug, Clone)]
pub struct Capture<G> {
    /// The gateway.
    pub gateway: G,
}

impl<G: Gateway> EventHandler<CaptureRequested> for Capture<G> {
    async fn handle(&self, _: &mut PgConnection, e: CaptureRequested, _: &Meta) -> Result<(), HandlerError> {
        match self.gateway.capture(e.idempotency_key, e.order_id, e.amount_cents, &e.currency).await {
            Ok(()) => Ok(()),
            Err(GatewayError::Unavailable(why)) => Err(HandlerError::transient(format!("gateway: {why}"))),
            Err(GatewayError::Declined(why)) => {
                Err(HandlerError::permanent(format!("payment declined for order {}: {why}", e.order_id)))
            }
        }
    }
}
