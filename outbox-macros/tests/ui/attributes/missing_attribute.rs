use outbox_runtime::OutboxEvent;
use schemars::JsonSchema;
use serde::Serialize;

#[derive(Serialize, JsonSchema, OutboxEvent)]
struct OrderConfirmed {
    #[outbox(aggregate_id)]
    order_id: u64,
}

fn main() {}
