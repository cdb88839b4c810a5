use outbox_runtime::OutboxEvent;
use schemars::JsonSchema;
use serde::Serialize;

#[derive(Serialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "Order Confirmed", schema_version = 0, topic = "orders!", colour = "red")]
struct OrderConfirmed {
    order_id: u64,
}

fn main() {}
