//! Every event type linked into the binary, registered by `#[derive(OutboxEvent)]`.
//!
//! Tools (schema generation and checks, consumer type generation) enumerate events here
//! instead of keeping a list by hand. A crate's events are registered when the crate is
//! linked: a binary that only depends on it must reference it (`use my_events as _;`).

use schemars::generate::SchemaSettings;

use crate::OutboxEvent;

/// Static facts about one event type, as registered by the derive.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct EventDescriptor {
    /// [`OutboxEvent::EVENT_TYPE`].
    pub event_type: &'static str,
    /// [`OutboxEvent::SCHEMA_VERSION`].
    pub schema_version: u32,
    /// [`OutboxEvent::AGGREGATE_TYPE`].
    pub aggregate_type: &'static str,
    /// [`OutboxEvent::TOPIC`].
    pub topic: &'static str,
    /// The Rust type's path, e.g. `my_service::events::OrderConfirmed`.
    pub rust_type: &'static str,
    schema: fn() -> schemars::Schema,
    writer_schema: fn() -> schemars::Schema,
}

inventory::collect!(EventDescriptor);

impl EventDescriptor {
    /// The descriptor of `T`, named `rust_type` in reports.
    pub const fn of<T: OutboxEvent>(rust_type: &'static str) -> Self {
        EventDescriptor {
            event_type: T::EVENT_TYPE,
            schema_version: T::SCHEMA_VERSION,
            aggregate_type: T::AGGREGATE_TYPE,
            topic: T::TOPIC,
            rust_type,
            schema: json_schema_of::<T>,
            writer_schema: json_writer_schema_of::<T>,
        }
    }

    /// A descriptor built from parts, for tools and tests that judge a schema which no
    /// registered type produces (for example a proposed change). `schema` serves as both
    /// contracts; see [`EventDescriptor::with_writer_schema`].
    pub fn from_parts(
        event_type: &'static str,
        schema_version: u32,
        aggregate_type: &'static str,
        topic: &'static str,
        rust_type: &'static str,
        schema: fn() -> schemars::Schema,
    ) -> Self {
        EventDescriptor {
            event_type,
            schema_version,
            aggregate_type,
            topic,
            rust_type,
            schema,
            writer_schema: schema,
        }
    }

    /// The same descriptor with another schema of what a writer writes.
    pub fn with_writer_schema(mut self, writer_schema: fn() -> schemars::Schema) -> Self {
        self.writer_schema = writer_schema;
        self
    }

    /// The reader's contract, as schemars generates it (draft 2020-12, schemars'
    /// default deserialize contract): what a reader accepts. A `#[serde(default)]` field
    /// is optional here.
    pub fn json_schema(&self) -> schemars::Schema {
        (self.schema)()
    }

    /// The writer's contract (schemars' serialize contract): what a writer writes. A
    /// `#[serde(default)]` field is required here, since it is always written; one with
    /// `skip_serializing_if` is not.
    pub fn json_writer_schema(&self) -> schemars::Schema {
        (self.writer_schema)()
    }
}

/// The draft 2020-12 root schema of `T` as a reader accepts it (deserialize contract).
pub fn json_schema_of<T: schemars::JsonSchema>() -> schemars::Schema {
    SchemaSettings::draft2020_12().for_deserialize().into_generator().into_root_schema_for::<T>()
}

/// The draft 2020-12 root schema of `T` as a writer writes it (serialize contract).
pub fn json_writer_schema_of<T: schemars::JsonSchema>() -> schemars::Schema {
    SchemaSettings::draft2020_12().for_serialize().into_generator().into_root_schema_for::<T>()
}

/// Every registered event, sorted by event type, then schema version, then Rust type.
pub fn events() -> Vec<&'static EventDescriptor> {
    let mut all: Vec<_> = inventory::iter::<EventDescriptor>.into_iter().collect();
    all.sort_by(|a, b| {
        (a.event_type, a.schema_version, a.rust_type).cmp(&(b.event_type, b.schema_version, b.rust_type))
    });
    all
}
