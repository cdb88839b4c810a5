//! `#[derive(OutboxEvent)]`: turns an annotated serde struct into a versioned outbox event.
//!
//! Use it through `outbox-runtime`, which re-exports it and holds the trait it implements:
//!
//! ```ignore
//! #[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
//! #[outbox(event_type = "order.confirmed", schema_version = 1, aggregate = "order", topic = "orders")]
//! pub struct OrderConfirmed {
//!     #[outbox(aggregate_id)]
//!     pub order_id: Uuid,
//!     pub total_cents: i64,
//! }
//! ```
//!
//! Parsing (`attr`), validation (`valid`) and code generation (`expand`) live apart; every
//! problem of one item is collected (`ctxt`) and reported together at its own span.

mod ast;
mod attr;
mod ctxt;
mod expand;
mod valid;

use proc_macro::TokenStream;
use syn::{parse_macro_input, DeriveInput};

/// Derives `outbox_runtime::OutboxEvent`. See the `outbox-runtime` crate documentation for
/// the attributes it takes.
#[proc_macro_derive(OutboxEvent, attributes(outbox))]
pub fn derive_outbox_event(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand::derive(&input).into()
}
