//! What `#[derive(OutboxEvent)]` generates: the trait's constants, the aggregate id, the
//! registration, and the `crate = "..."` override.

use outbox_runtime::{registry, OutboxEvent};
use schemars::JsonSchema;
use serde::Serialize;
use uuid::Uuid;

#[derive(Serialize, JsonSchema, OutboxEvent)]
#[outbox(
    event_type = "invoice.paid",
    schema_version = 3,
    aggregate = "billing.invoice",
    topic = "billing-events"
)]
struct InvoicePaid {
    amount_cents: i64,
    #[outbox(aggregate_id)]
    invoice_id: Uuid,
}

#[derive(Serialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "customer.renamed", schema_version = 1, aggregate = "customer", topic = "customers")]
struct CustomerRenamed {
    #[outbox(aggregate_id)]
    customer: String,
    name: String,
}

mod renamed {
    // A crate that re-exports the runtime under another path.
    pub(crate) use outbox_runtime as rt;
}

#[derive(Serialize, JsonSchema, OutboxEvent)]
#[outbox(
    event_type = "ticket.closed",
    schema_version = 1,
    aggregate = "ticket",
    topic = "tickets",
    crate = "renamed::rt"
)]
struct TicketClosed {
    #[outbox(aggregate_id)]
    ticket: u64,
}

#[test]
fn constants_come_from_the_attribute() {
    assert_eq!(InvoicePaid::EVENT_TYPE, "invoice.paid");
    assert_eq!(InvoicePaid::SCHEMA_VERSION, 3);
    assert_eq!(InvoicePaid::AGGREGATE_TYPE, "billing.invoice");
    assert_eq!(InvoicePaid::TOPIC, "billing-events");
}

#[test]
fn aggregate_id_is_the_marked_field_displayed() {
    let id = Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
    let event = InvoicePaid { amount_cents: 5, invoice_id: id };
    assert_eq!(event.aggregate_id(), "01234567-89ab-cdef-0123-456789abcdef");
    let renamed = CustomerRenamed { customer: "c-42".into(), name: "Ada".into() };
    assert_eq!(renamed.aggregate_id(), "c-42");
    assert_eq!(TicketClosed { ticket: 9 }.aggregate_id(), "9");
}

#[test]
fn every_derived_event_is_registered_once() {
    let events = registry::events();
    for (event_type, rust_type) in [
        ("invoice.paid", "derive::InvoicePaid"),
        ("customer.renamed", "derive::CustomerRenamed"),
        ("ticket.closed", "derive::TicketClosed"),
    ] {
        let found: Vec<_> = events.iter().filter(|e| e.event_type == event_type).collect();
        assert_eq!(found.len(), 1, "{event_type} registered {} times", found.len());
        assert_eq!(found[0].rust_type, rust_type);
    }
    let invoice = events.iter().find(|e| e.event_type == "invoice.paid").expect("registered");
    assert_eq!(
        (invoice.schema_version, invoice.aggregate_type, invoice.topic),
        (3, "billing.invoice", "billing-events")
    );
}

#[test]
fn registered_schema_is_the_types_schema() {
    let invoice =
        registry::events().into_iter().find(|e| e.event_type == "invoice.paid").expect("registered");
    let schema = invoice.json_schema().to_value();
    assert_eq!(schema["$schema"], "https://json-schema.org/draft/2020-12/schema");
    assert_eq!(schema["properties"]["invoice_id"]["format"], "uuid");
    assert_eq!(schema["required"], serde_json::json!(["amount_cents", "invoice_id"]));
}
