use outbox_runtime::OutboxEvent;
use schemars::JsonSchema;
use serde::Serialize;

#[derive(Serialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "order.changed", schema_version = 1, aggregate = "order", topic = "orders")]
enum OrderChanged {
    Confirmed { order_id: u64 },
    Cancelled { order_id: u64 },
}

fn main() {}
