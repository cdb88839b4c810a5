use outbox_runtime::OutboxEvent;
use schemars::JsonSchema;
use serde::Serialize;

#[derive(Serialize, JsonSchema, OutboxEvent)]
#[outbox(even_type = "order.confirmed", schema_version = 1, aggregate = "order", topic = "orders")]
struct OrderConfirmed {
    #[outbox(agregate_id)]
    order_id: u64,
}

fn main() {}
