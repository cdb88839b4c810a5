//! Transactional outbox for PostgreSQL and Kafka.
//!
//! A service appends an event in the same PostgreSQL transaction as the business change; a
//! relay publishes it to Kafka at least once, in order per aggregate; a consumer's inbox
//! applies it once, in the same transaction as its effect. This crate is the one users
//! depend on.
//!
//! # Event contracts
//!
//! ```
//! use outbox_runtime::OutboxEvent;
//! use schemars::JsonSchema;
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
//! #[outbox(event_type = "order.confirmed", schema_version = 1, aggregate = "order", topic = "orders")]
//! pub struct OrderConfirmed {
//!     #[outbox(aggregate_id)]
//!     pub order_id: u64,
//!     pub total_cents: i64,
//! }
//!
//! let event = OrderConfirmed { order_id: 7, total_cents: 1250 };
//! assert_eq!(OrderConfirmed::EVENT_TYPE, "order.confirmed");
//! assert_eq!(event.aggregate_id(), "7");
//! assert!(outbox_runtime::registry::events().iter().any(|e| e.rust_type.ends_with("::OrderConfirmed")));
//! ```
//!
//! Attributes on the struct (all required):
//!
//! | key | meaning |
//! |---|---|
//! | `event_type = "order.confirmed"` | lowercase dotted words; the CloudEvents `type` |
//! | `schema_version = 1` | positive integer; bump it for a change that is not FULL compatible |
//! | `aggregate = "order"` | the kind of entity the event belongs to |
//! | `topic = "orders"` | the Kafka topic it is published to |
//! | `crate = "path"` | optional: where `outbox_runtime` is, when re-exported under another name |
//!
//! and `#[outbox(aggregate_id)]` on exactly one field, whose `Display` form becomes the
//! Kafka record key. `schema_version` versions the *contract*; the entity's own sequence
//! number is the separate `aggregate_version` given at append time.
//!
//! The [`schema`] module generates the JSON Schemas, checks committed ones, and judges
//! compatibility between two schemas.
//!
//! The guarantees it keeps, numbered as the documentation cites them ("invariant 8"):
//! [`guarantees`].

#![cfg_attr(docsrs, feature(doc_auto_cfg))]
#![warn(missing_docs)]

// Lets the derive's `::outbox_runtime::...` paths resolve inside this crate's own tests.
#[allow(unused_extern_crates)]
extern crate self as outbox_runtime;

#[cfg(feature = "runtime")]
pub mod action;
#[cfg(feature = "runtime")]
mod append;
pub mod asyncapi;
#[cfg(feature = "runtime")]
mod backoff;
#[cfg(feature = "runtime")]
mod browse_index;
#[cfg(feature = "runtime")]
mod capacity;
#[cfg(feature = "cdc")]
pub mod cdc;
#[cfg(feature = "runtime")]
mod cleanup;
#[cfg(feature = "console")]
pub mod console;
mod error;
mod event;
#[doc = include_str!("guarantees.md")]
pub mod guarantees {}
#[cfg(feature = "runtime")]
pub mod inbox;
#[cfg(feature = "runtime")]
mod insert;
#[cfg(feature = "runtime")]
mod kafka_codes;
#[cfg(feature = "runtime")]
mod kafka_settings;
#[cfg(feature = "runtime")]
pub mod metrics;
#[cfg(feature = "runtime")]
mod migrate;
#[cfg(feature = "runtime")]
pub mod ops;
#[cfg(feature = "runtime")]
mod outbox;
#[cfg(feature = "runtime")]
mod partition;
#[cfg(feature = "runtime")]
mod redact;
pub mod registry;
#[cfg(feature = "runtime")]
pub mod relay;
pub mod schema;
pub mod schema_registry;
#[cfg(feature = "runtime")]
pub mod secrets;
#[cfg(feature = "signal")]
pub mod signal;
#[cfg(feature = "runtime")]
mod table;
#[cfg(feature = "testing")]
pub mod testing;
#[cfg(feature = "runtime")]
pub mod trace;
#[cfg(feature = "typegen")]
pub mod typegen;
#[cfg(feature = "xtask")]
pub mod xtask;

#[cfg(feature = "runtime")]
pub use append::{append, AppendOptions, NewEvent, RESERVED_HEADER_BYTES};

/// The local development database (`DATABASE_URL`'s default for this repository's
/// examples, demo and tests): the PostgreSQL of the quickstart. Never a default
/// of the library itself, which always takes a pool, nor of the `outbox` command, which
/// needs `--database-url` or `DATABASE_URL`.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
pub use error::{Error, Result};
pub use event::OutboxEvent;
#[cfg(feature = "runtime")]
pub use migrate::InvalidIndex;
#[cfg(feature = "runtime")]
pub use outbox::{Capacity, Outbox, OutboxConfig};
#[cfg(feature = "derive")]
pub use outbox_macros::OutboxEvent;

// The versions this crate is built against, so that a user's code names the same ones
// (`outbox_runtime::sqlx::PgPool`, `outbox_runtime::rdkafka::ClientConfig`): a second
// version of either in a build would not interoperate with this crate's types.
#[cfg(feature = "runtime")]
pub use rdkafka;
#[cfg(feature = "runtime")]
pub use sqlx;
/// The cancellation token [`relay::Relay::run`] and the inbox stop on (tokio-util's).
#[cfg(feature = "runtime")]
pub use tokio_util::sync::CancellationToken;

/// Implementation details used by code that `#[derive(OutboxEvent)]` generates. Not public
/// API: anything here may change in any release.
#[doc(hidden)]
pub mod __private {
    pub use crate::registry::EventDescriptor;
    pub use inventory;

    /// The aggregate id's string form (its `Display`).
    #[inline]
    pub fn aggregate_id_string<T: core::fmt::Display + ?Sized>(value: &T) -> String {
        value.to_string()
    }
}
