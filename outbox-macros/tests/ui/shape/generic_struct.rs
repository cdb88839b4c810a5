use outbox_runtime::OutboxEvent;
use schemars::JsonSchema;
use serde::Serialize;

#[derive(Serialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "order.confirmed", schema_version = 1, aggregate = "order", topic = "orders")]
struct OrderConfirmed<T> {
    #[outbox(aggregate_id)]
    order_id: u64,
    detail: T,
}

fn main() {}
