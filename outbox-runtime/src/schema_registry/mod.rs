//! Schema registries that speak Confluent's REST API (Confluent Schema Registry,
//! Karapace, Apicurio's `ccompat` API, Redpanda's built-in registry), and their wire
//! format.
//!
//! - [`framing`]: the bytes of a record whose schema a registry names (a magic byte and
//!   the schema id before the payload, or the id in a header), read and written. Always
//!   built: the inbox reads framed records without any client.
//! - [`SchemaIds`]: the ids a relay frames its records with, resolved before it starts.
//! - `Client` (feature `schema-registry`): the few endpoints `cargo xtask schema push`
//!   and a relay that frames its records need (lookup, register, subject configuration,
//!   compatibility with `verbose=true`, schema by id), blocking, over HTTP or HTTPS.
//!
//! A subject is named from a template ([`subject_name`]); the default,
//! [`TOPIC_RECORD_SUBJECT`], is Confluent's `TopicRecordNameStrategy` as its JSON Schema
//! serializers apply it: `<topic>-<title of the schema>`. Every committed version of an
//! event has its own title (`order.confirmed v2`), so each version is its own subject and
//! a new version, which may be incompatible by design, never meets the previous one's
//! compatibility check; a file changed without a version bump is checked against its own
//! earlier registrations.

#[cfg(feature = "schema-registry")]
mod client;
#[cfg(feature = "schema-registry")]
mod committed;
#[cfg(feature = "schema-registry")]
mod error;
pub mod framing;
mod ids;

#[cfg(feature = "schema-registry")]
pub use client::{Client, Compatibility, Lookup, Registered};
#[cfg(feature = "schema-registry")]
pub use committed::{committed_schemas, CommittedSchema};
#[cfg(feature = "schema-registry")]
pub use error::{RegistryError, AUTH_PASSWORD_VAR, AUTH_USER_VAR};
#[cfg(feature = "runtime")]
pub(crate) use ids::Frame;
pub use ids::{SchemaIdForm, SchemaIds};

/// `<topic>-<title>`: Confluent's `TopicRecordNameStrategy` for JSON Schema, whose record
/// name is the schema's `title`.
pub const TOPIC_RECORD_SUBJECT: &str = "{topic}-{title}";

/// The subject of a schema: `template` with `{topic}`, `{title}`, `{event_type}` and
/// `{version}` replaced. `{topic}-value` is Confluent's `TopicNameStrategy`, `{title}` its
/// `RecordNameStrategy`. An unknown placeholder, or an empty result, is an error naming it.
pub fn subject_name(
    template: &str,
    topic: &str,
    title: &str,
    event_type: &str,
    version: u32,
) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else {
            return Err(format!("subject template {template:?}: `{{` without `}}`"));
        };
        match &after[..close] {
            "topic" => out.push_str(topic),
            "title" => out.push_str(title),
            "event_type" => out.push_str(event_type),
            "version" => out.push_str(&version.to_string()),
            other => {
                return Err(format!(
                    "subject template {template:?}: unknown placeholder {{{other}}} (expected {{topic}}, {{title}}, {{event_type}} or {{version}})"
                ))
            }
        }
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    if out.trim().is_empty() {
        return Err(format!("subject template {template:?} names an empty subject"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_follow_the_template() {
        let name = |t: &str| subject_name(t, "orders", "order.placed v1", "order.placed", 1);
        assert_eq!(name(TOPIC_RECORD_SUBJECT).as_deref(), Ok("orders-order.placed v1"));
        assert_eq!(name("{topic}-value").as_deref(), Ok("orders-value"));
        assert_eq!(name("{event_type}.v{version}").as_deref(), Ok("order.placed.v1"));
        assert!(name("{topic}-{nope}").unwrap_err().contains("unknown placeholder {nope}"));
        assert!(name("{topic").unwrap_err().contains("without"));
        assert!(name("").unwrap_err().contains("empty subject"));
    }
}
