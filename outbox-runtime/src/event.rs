use schemars::JsonSchema;
use serde::Serialize;

/// A versioned event that can be appended to the outbox.
///
/// Implement it with `#[derive(OutboxEvent)]` (see the [crate] documentation); a hand-written
/// implementation is possible but is not registered for the schema tools.
pub trait OutboxEvent: Serialize + JsonSchema {
    /// What happened, as lowercase dotted words, e.g. `order.confirmed`.
    const EVENT_TYPE: &'static str;
    /// The version of this event's contract (its JSON Schema), starting at 1.
    const SCHEMA_VERSION: u32;
    /// The kind of entity the event belongs to, e.g. `order`.
    const AGGREGATE_TYPE: &'static str;
    /// The Kafka topic the event is published to.
    const TOPIC: &'static str;

    /// The id of the entity the event belongs to; the Kafka record key, so that one
    /// aggregate's events stay in one partition, in order.
    fn aggregate_id(&self) -> String;
}
