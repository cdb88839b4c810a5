//! The order service's events. Their schemas are committed under `schemas/`.
//!
//! `order.confirmed` has two versions: v2 added the currency (required, so not FULL
//! compatible with v1: a new version, and v1 stays because v1 events may still exist).

use outbox_runtime::OutboxEvent;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A customer placed an order; it waits for confirmation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "order.placed", schema_version = 1, aggregate = "order", topic = "orders")]
pub struct OrderPlaced {
    /// The order.
    #[outbox(aggregate_id)]
    pub order_id: Uuid,
    /// Who placed it.
    pub customer_id: Uuid,
    /// What was ordered.
    pub lines: Vec<OrderLine>,
    /// Total in the smallest currency unit.
    pub total_cents: i64,
}

/// One line of an order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OrderLine {
    /// Stock keeping unit.
    pub sku: String,
    /// How many.
    pub quantity: u32,
}

/// An order was confirmed (version 1, kept for events written before v2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "order.confirmed", schema_version = 1, aggregate = "order", topic = "orders")]
pub struct OrderConfirmedV1 {
    /// The order.
    #[outbox(aggregate_id)]
    pub order_id: Uuid,
    /// Total in the smallest currency unit.
    pub total_cents: i64,
}

/// An order was confirmed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "order.confirmed", schema_version = 2, aggregate = "order", topic = "orders")]
pub struct OrderConfirmed {
    /// The order.
    #[outbox(aggregate_id)]
    pub order_id: Uuid,
    /// Total in the smallest currency unit.
    pub total_cents: i64,
    /// ISO 4217 currency code.
    pub currency: String,
    /// How the customer pays.
    pub payment: Payment,
    /// A note from the customer, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// How an order is paid.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "method", rename_all = "snake_case")]
pub enum Payment {
    /// By card; only the last four digits are kept.
    Card {
        /// Last four digits.
        last4: String,
    },
    /// By bank transfer.
    Invoice {
        /// Days until due.
        due_days: u16,
    },
}
