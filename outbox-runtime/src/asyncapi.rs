//! An AsyncAPI 3.0 document of the registered events, for the teams that consume them:
//! one channel per Kafka topic, one message per event type and schema version, its payload
//! the committed schema (JSON Schema draft 2020-12, as committed) and its headers the
//! CloudEvents binary-mode headers the relay writes. `cargo xtask asyncapi` writes it and
//! `cargo xtask asyncapi --check` fails when the committed one is stale, like `schema check`.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Map, Value};

use crate::registry::EventDescriptor;
use crate::schema::{schema_path, schema_uri, SchemaDoc};

/// What the document says about itself.
#[derive(Debug, Clone)]
pub struct AsyncApiInfo {
    /// `info.title`.
    pub title: String,
    /// `info.version`: the version of the contract, not of AsyncAPI.
    pub version: String,
    /// The base of the schemas' URIs (`dataschema`, `$id`).
    pub schema_base: String,
}

/// Why a document could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AsyncApiError {
    /// No event is registered: the document would describe nothing.
    #[error("no events are registered: link the crate that defines them into this binary")]
    NoEvents,
    /// A registered event has no committed schema to describe its payload.
    #[error("{event_type} v{version}: {path} is not a committed schema ({reason}); run `cargo xtask schema generate`")]
    Schema {
        /// The event type.
        event_type: String,
        /// Its schema version.
        version: u32,
        /// The file looked for.
        path: String,
        /// What was wrong with it.
        reason: String,
    },
}

/// A name AsyncAPI accepts as a component or channel key (`^[A-Za-z0-9.\-_]+$`).
fn key(text: &str) -> String {
    text.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_') { c } else { '_' }).collect()
}

/// The CloudEvents binary-mode headers the relay writes, as a JSON Schema.
fn headers_schema() -> Value {
    let text = |description: &str| json!({ "type": "string", "description": description });
    json!({
        "type": "object",
        "required": ["ce_specversion", "ce_id", "ce_source", "ce_type", "ce_time", "ce_subject",
                     "ce_schemaversion", "ce_aggregatetype", "ce_dataschema", "content-type"],
        "properties": {
            "ce_specversion": { "type": "string", "const": "1.0" },
            "ce_id": text("The event id (a UUID); the inbox deduplicates on it."),
            "ce_source": text("The producing service (RelayConfig::source)."),
            "ce_type": text("The event type."),
            "ce_time": { "type": "string", "format": "date-time", "description": "When the event was appended." },
            "ce_subject": text("The aggregate id; also the record key."),
            "ce_schemaversion": { "type": "string", "pattern": "^[1-9][0-9]*$", "description": "The schema version." },
            "ce_aggregatetype": text("The kind of aggregate."),
            "ce_aggregateversion": { "type": "string", "pattern": "^-?[0-9]+$",
                                     "description": "The aggregate's version, when the producer gave one." },
            "ce_dataschema": { "type": "string", "format": "uri", "description": "The committed schema's URI (its $id)." },
            "content-type": { "type": "string", "const": "application/json" },
            "traceparent": text("W3C trace context, when the appending code was traced."),
            "tracestate": text("W3C trace state, with traceparent, when the trace has one."),
        },
    })
}

/// The document for `events`, with the payload schemas read from the committed files
/// under `schemas_dir`. Keys are sorted, so the same events give the same document.
pub fn document(
    events: &[&EventDescriptor],
    schemas_dir: &Path,
    info: &AsyncApiInfo,
) -> Result<Value, AsyncApiError> {
    if events.is_empty() {
        return Err(AsyncApiError::NoEvents);
    }
    let mut channels: BTreeMap<String, (String, Map<String, Value>)> = BTreeMap::new();
    let mut messages = Map::new();
    for event in events {
        let path = schema_path(schemas_dir, event.event_type, event.schema_version);
        let bad = |reason: String| AsyncApiError::Schema {
            event_type: event.event_type.to_owned(),
            version: event.schema_version,
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(&path).map_err(|e| bad(e.to_string()))?;
        let doc = SchemaDoc::from_str(&path.display().to_string(), &text).map_err(|e| bad(e.to_string()))?;
        let mut schema = doc.root().clone();
        if let Value::Object(map) = &mut schema {
            // The writer's contract is ours to judge compatibility by, not the consumer's.
            if let Some(Value::Object(outbox)) = map.get_mut("x-outbox") {
                outbox.remove("writer");
            }
        }
        let name = key(&format!("{}_v{}", event.event_type, event.schema_version));
        // The schema's own `#/$defs/..` would resolve against the document's root, which
        // AsyncAPI tools do (they do not honour the embedded `$id`): point them at where
        // the schema now is.
        rebase_refs(&mut schema, &format!("#/components/messages/{name}/payload/schema"));
        messages.insert(
            name.clone(),
            json!({
                "name": name,
                "title": format!("{} v{}", event.event_type, event.schema_version),
                "summary": format!("`{}` version {} of a `{}` aggregate.", event.event_type, event.schema_version, event.aggregate_type),
                "contentType": "application/json",
                "headers": headers_schema(),
                "payload": {
                    "schemaFormat": "application/schema+json;version=draft-2020-12",
                    "schema": schema,
                },
                "correlationId": { "location": "$message.header#/ce_id" },
                "bindings": { "kafka": { "key": { "type": "string", "description": "The aggregate id." },
                                         "bindingVersion": "0.5.0" } },
                "x-outbox": {
                    "event_type": event.event_type,
                    "schema_version": event.schema_version,
                    "aggregate_type": event.aggregate_type,
                    "dataschema": schema_uri(&info.schema_base, event.event_type, event.schema_version),
                },
            }),
        );
        let channel =
            channels.entry(key(event.topic)).or_insert_with(|| (event.topic.to_owned(), Map::new()));
        channel.1.insert(name.clone(), json!({ "$ref": format!("#/components/messages/{name}") }));
    }
    let mut channel_docs = Map::new();
    let mut operations = Map::new();
    for (channel_key, (topic, channel_messages)) in channels {
        let refs: Vec<Value> = channel_messages
            .keys()
            .map(|m| json!({ "$ref": format!("#/channels/{channel_key}/messages/{m}") }))
            .collect();
        channel_docs.insert(
            channel_key.clone(),
            json!({
                "address": topic,
                "description": "Events of one topic, keyed by aggregate id (murmur2 partitioner, as the Java client).",
                "messages": channel_messages,
                "bindings": { "kafka": { "topic": topic, "bindingVersion": "0.5.0" } },
            }),
        );
        operations.insert(
            format!("publish_{channel_key}"),
            json!({
                "action": "send",
                "summary": "The outbox relay publishes the events appended with the business changes, in order per aggregate.",
                "channel": { "$ref": format!("#/channels/{channel_key}") },
                "messages": refs,
            }),
        );
    }
    Ok(json!({
        "asyncapi": "3.0.0",
        "info": {
            "title": info.title,
            "version": info.version,
            "description": "Generated by `cargo xtask asyncapi` from the registered events and the committed schemas. Do not edit.",
        },
        "defaultContentType": "application/json",
        "channels": channel_docs,
        "operations": operations,
        "components": { "messages": messages },
    }))
}

/// Rewrites every local `$ref` (`#...`) in `schema` to start at `base`, leaving values
/// that are data (`const`, `enum`, `default`, `examples`) alone.
fn rebase_refs(schema: &mut Value, base: &str) {
    match schema {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                match (k.as_str(), v) {
                    ("$ref", Value::String(r)) => {
                        if let Some(pointer) = r.strip_prefix('#') {
                            *r = format!("{base}{pointer}");
                        }
                    }
                    ("const" | "enum" | "default" | "examples", _) => {}
                    (_, v) => rebase_refs(v, base),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| rebase_refs(v, base)),
        _ => {}
    }
}

/// The document's text: keys sorted, two-space indent, final newline.
pub fn render(
    events: &[&EventDescriptor],
    schemas_dir: &Path,
    info: &AsyncApiInfo,
) -> Result<String, AsyncApiError> {
    let value = document(events, schemas_dir, info)?;
    let mut text = serde_json::to_string_pretty(&crate::schema::sorted_value(value)).unwrap_or_default();
    text.push('\n');
    Ok(text)
}
