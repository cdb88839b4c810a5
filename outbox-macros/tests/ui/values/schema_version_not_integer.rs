use outbox_runtime::OutboxEvent;
use schemars::JsonSchema;
use serde::Serialize;

#[derive(Serialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "order.confirmed", schema_version = 1.5, aggregate = "order", topic = "orders")]
struct OrderConfirmed {
    #[outbox(aggregate_id)]
    order_id: u64,
}

const VERSION: u32 = 2;

#[derive(Serialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "order.shipped", schema_version = VERSION, aggregate = "order", topic = "orders")]
struct OrderShipped {
    #[outbox(aggregate_id)]
    order_id: u64,
}

fn main() {}
