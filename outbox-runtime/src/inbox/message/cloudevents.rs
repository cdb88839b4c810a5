//! A record read as a CloudEvent (the Kafka protocol binding's binary or structured
//! mode): the required attributes, the event id it is deduplicated on, the schema version
//! (`schemaversion`, or the `dataschema` URI), the aggregate, and the data handlers decode.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::value::RawValue;
use serde_json::Value;
use uuid::Uuid;

use super::{storable_text, why_not_text, MAX_IDENTIFIER_BYTES};
use crate::inbox::handler::Meta;
use crate::schema_registry::framing::unframe;

/// The CloudEvents media type of the structured mode, and the JSON event format.
const STRUCTURED: &str = "application/cloudevents";
const STRUCTURED_JSON: &str = "application/cloudevents+json";

/// The attributes CloudEvents types as strings (String, URI-reference, URI, Timestamp):
/// in the JSON format they must be JSON strings. Extensions may be numbers or booleans.
const STRING_ATTRIBUTES: &[&str] =
    &["id", "source", "specversion", "type", "datacontenttype", "dataschema", "subject", "time"];

/// The members of a JSON object in the order written, each as its raw JSON text; a
/// repeated name is kept twice (serde_json's maps keep the last), for the caller to refuse.
struct Members(Vec<(String, Box<RawValue>)>);

impl<'de> serde::Deserialize<'de> for Members {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Members;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Members, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry::<String, Box<RawValue>>()? {
                    members.push(member);
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}

/// A record's CloudEvents attributes by name (without the binary mode's `ce_` prefix), how
/// to name one in a reason, and the event's data.
struct Attributes {
    values: BTreeMap<String, String>,
    structured: bool,
    /// Structured mode: the `data` member's JSON (or decoded `data_base64`).
    data: Option<Vec<u8>>,
}

impl Attributes {
    /// `id` as a reason names it: `header ce_id` in binary mode, `attribute id` in
    /// structured mode.
    fn named(&self, name: &str) -> String {
        if self.structured {
            format!("attribute {name}")
        } else {
            format!("header ce_{name}")
        }
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// A required attribute: present and not empty.
    fn required(&self, name: &str) -> Result<&str, String> {
        match self.get(name) {
            None => Err(format!("missing {}", self.named(name))),
            Some("") => Err(format!("{} is empty", self.named(name))),
            Some(value) => Ok(value),
        }
    }

    /// Binary mode: the `ce_*` headers.
    fn binary(headers: &BTreeMap<String, String>) -> Attributes {
        let values = headers
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix("ce_")?.to_owned(), v.clone())))
            .collect();
        Attributes { values, structured: false, data: None }
    }

    /// Structured mode: the value is the whole event in the JSON format; its members are
    /// the attributes (strings as they are, numbers and booleans as their JSON text, `null`
    /// as absent), and `data` (any JSON) or `data_base64` (bytes that must hold JSON) the
    /// event's data.
    fn structured(content_type: &str, value: &[u8]) -> Result<Attributes, String> {
        let media = content_type.split(';').next().unwrap_or_default().trim();
        if !media.eq_ignore_ascii_case(STRUCTURED_JSON) {
            return Err(format!(
                "content-type {content_type:?}: of the structured CloudEvents formats only the JSON event format \
                 ({STRUCTURED_JSON}) is read"
            ));
        }
        let Members(members) = serde_json::from_slice(value)
            .map_err(|e| format!("structured CloudEvent is not a JSON object: {e}"))?;
        let mut values = BTreeMap::new();
        let mut data: Option<Box<RawValue>> = None;
        let mut data_base64 = None;
        let mut seen = std::collections::BTreeSet::new();
        for (name, raw) in members {
            if !seen.insert(name.clone()) {
                // Which one a reader takes differs between JSON parsers: neither is sure.
                return Err(format!("attribute {} appears more than once", name.escape_debug()));
            }
            if raw.get() == "null" {
                continue;
            }
            if name == "data" {
                // As sent, byte for byte (numbers beyond f64, key order): as binary mode.
                data = Some(raw);
                continue;
            }
            let member: Value =
                serde_json::from_str(raw.get()).map_err(|e| format!("attribute {name}: {e}"))?;
            match (name.as_str(), member) {
                ("data_base64", Value::String(encoded)) => data_base64 = Some(encoded),
                ("data_base64", _) => return Err("attribute data_base64 is not a string".to_owned()),
                (_, Value::String(s)) => {
                    if s.contains('\0') {
                        return Err(format!("attribute {name} contains a NUL byte"));
                    }
                    values.insert(name, s);
                }
                (n, _) if STRING_ATTRIBUTES.contains(&n) => {
                    return Err(format!("attribute {name} is not a string"));
                }
                (_, member @ (Value::Number(_) | Value::Bool(_))) => {
                    values.insert(name, member.to_string());
                }
                (_, _) => return Err(format!("attribute {name} is not a string, number or boolean")),
            }
        }
        let data = match (data, data_base64) {
            (Some(_), Some(_)) => {
                return Err("structured CloudEvent has both data and data_base64".to_owned());
            }
            (None, None) => return Err("structured CloudEvent has no data".to_owned()),
            (Some(json), None) => json.get().as_bytes().to_vec(),
            (None, Some(encoded)) => {
                use base64::Engine as _;
                base64::engine::general_purpose::STANDARD
                    .decode(encoded.trim())
                    .map_err(|e| format!("attribute data_base64 is not base64: {e}"))?
            }
        };
        Ok(Attributes { values, structured: true, data: Some(data) })
    }
}

/// The namespace of the event ids the inbox derives from CloudEvents ids that are not
/// UUIDs (UUIDv5 of `source`, a NUL, and `id`): fixed, so that every consumer derives the
/// same event id from the same event.
pub const FOREIGN_ID_NAMESPACE: Uuid = Uuid::from_u128(0x6f75_7462_6f78_4000_8000_0063_6569_6473);

/// The event id of a CloudEvent: its `id` when that is a UUID written as the relay writes
/// one (canonical: lower-case, hyphenated; not the nil or max UUID), else a UUIDv5 of its
/// `source` and `id` in [`FOREIGN_ID_NAMESPACE`]. CloudEvents makes `source` + `id` unique
/// per event, so two producers' `id` "42" stay two events, and a redelivery of one is a
/// duplicate. A canonical UUID is taken as unique by itself, whatever the source (so an
/// outbox event keeps its id across relays with different sources); any other spelling of
/// a UUID (`{...}`, `urn:uuid:`, upper case, 32 bare hex digits) is a different string to
/// CloudEvents and is mapped like any other id.
pub fn event_id_of(source: &str, id: &str) -> Uuid {
    match Uuid::try_parse(id) {
        Ok(uuid) if !uuid.is_nil() && !uuid.is_max() && uuid.hyphenated().to_string() == id => uuid,
        _ => {
            let mut name = Vec::with_capacity(source.len() + 1 + id.len());
            name.extend_from_slice(source.as_bytes());
            name.push(0);
            name.extend_from_slice(id.as_bytes());
            Uuid::new_v5(&FOREIGN_ID_NAMESPACE, &name)
        }
    }
}

/// The schema version a `dataschema` URI names in its last segment, `v<N>` or
/// `v<N>.json` (the layout of `schemas/`, and what the relay sends), if it names one.
pub(super) fn version_in_dataschema(uri: &str) -> Option<u32> {
    let path = uri.split(['?', '#']).next().unwrap_or_default();
    let last = path.rsplit(['/', ':']).next()?;
    let digits = last.strip_suffix(".json").unwrap_or(last).strip_prefix('v')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || digits.starts_with('0') {
        return None;
    }
    digits.parse::<u32>().ok().filter(|v| i32::try_from(*v).is_ok())
}

pub(super) struct Parts<'a> {
    pub(super) headers: &'a BTreeMap<String, String>,
    pub(super) problems: &'a [String],
    /// The `__value_schema_id` header's value, when the record has one.
    pub(super) schema_header: Option<&'a [u8]>,
    pub(super) key: Option<&'a [u8]>,
    pub(super) payload: &'a [u8],
    pub(super) null_value: bool,
    pub(super) place: (&'a str, i32, i64),
}

/// The event's metadata, and its data when that is not the value (structured mode).
pub(super) fn read_meta(parts: &Parts<'_>) -> Result<(Meta, Option<Vec<u8>>), String> {
    let headers = parts.headers;
    if let Some(problem) = parts.problems.first() {
        return Err(problem.clone());
    }
    let mut content_types = headers.iter().filter(|(k, _)| k.eq_ignore_ascii_case("content-type"));
    let content_type = content_types.next().map(|(_, v)| v);
    if content_types.next().is_some() {
        return Err("header content-type appears more than once (in different cases)".to_owned());
    }
    let structured = content_type.is_some_and(|ct| {
        ct.trim_start().get(..STRUCTURED.len()).is_some_and(|p| p.eq_ignore_ascii_case(STRUCTURED))
    });
    let attributes = if structured {
        if parts.null_value {
            return Err("null value (a tombstone): no event to apply".to_owned());
        }
        Attributes::structured(content_type.map_or("", String::as_str), parts.payload)?
    } else {
        Attributes::binary(headers)
    };
    // The required attributes (CloudEvents 1.0): id, source, specversion, type.
    let id = attributes.required("id")?;
    let event_type = attributes.required("type")?.to_owned();
    let specversion = attributes.required("specversion")?;
    if specversion != "1.0" {
        return Err(format!("{} {specversion:?} is not 1.0", attributes.named("specversion")));
    }
    let source = attributes.required("source")?;
    let event_id = event_id_of(source, id);
    let dataschema = attributes.get("dataschema").map(str::to_owned);
    let from_dataschema = dataschema.as_deref().and_then(version_in_dataschema);
    let schema_version = match (attributes.get("schemaversion"), &dataschema) {
        (Some(version), _) => {
            let v = version.parse::<u32>().ok().filter(|v| *v > 0 && i32::try_from(*v).is_ok()).ok_or_else(
                || format!("{} {version:?} is not a positive integer", attributes.named("schemaversion")),
            )?;
            if let (Some(named), Some(uri)) = (from_dataschema, &dataschema) {
                if named != v {
                    return Err(format!(
                        "{} {version:?} contradicts {} {uri:?}",
                        attributes.named("schemaversion"),
                        attributes.named("dataschema")
                    ));
                }
            }
            v
        }
        (None, Some(uri)) => from_dataschema.ok_or_else(|| {
            format!(
                "no schema version: no {}, and {} {uri:?} does not end in /v<N>.json",
                attributes.named("schemaversion"),
                attributes.named("dataschema")
            )
        })?,
        (None, None) => {
            return Err(format!(
                "no schema version: missing {} (or a {} ending in /v<N>.json)",
                attributes.named("schemaversion"),
                attributes.named("dataschema")
            ))
        }
    };
    let aggregate_version = match attributes.get("aggregateversion") {
        Some(v) => Some(
            v.parse::<i64>()
                .map_err(|_| format!("{} {v:?} is not an integer", attributes.named("aggregateversion")))?,
        ),
        None => None,
    };
    // In binary mode the value may be framed in a schema registry's wire format.
    let mut registry_schema = None;
    let data: &[u8] = match &attributes.data {
        Some(data) => data,
        None => {
            if parts.null_value {
                return Err("null value (a tombstone): no event to apply".to_owned());
            }
            let unframed = unframe(parts.payload, parts.schema_header).map_err(|e| e.to_string())?;
            registry_schema = unframed.schema;
            unframed.payload
        }
    };
    // The data when it is not the value: structured mode's, or the payload after a frame.
    let own_data = match &attributes.data {
        Some(_) => None,
        None => registry_schema.is_some().then(|| data.to_vec()),
    };
    if data.is_empty() {
        return Err("empty payload".to_owned());
    }
    if let Err(error) = serde_json::from_slice::<serde::de::IgnoredAny>(data) {
        return Err(format!("payload is not JSON: {error}"));
    }
    // The aggregate: the subject, or else the record key when it is text. A binary key is
    // never used as a text identifier.
    let subject_name = attributes.named("subject");
    let (aggregate_id, from) = match attributes.get("subject").filter(|s| !s.is_empty()) {
        Some(subject) => (Some(subject.to_owned()), subject_name.as_str()),
        None => (parts.key.and_then(storable_text).map(str::to_owned), "record key"),
    };
    let aggregate_type = attributes.get("aggregatetype").map(str::to_owned);
    if aggregate_version.is_some() {
        // Versions are tracked per aggregate, in an index: the aggregate must be known and fit.
        match &aggregate_id {
            None => {
                return Err(format!(
                    "{} is given but the aggregate is unknown: no {subject_name}, and the record key {}",
                    attributes.named("aggregateversion"),
                    parts.key.map_or("is null", |k| why_not_text(k))
                ))
            }
            Some(id) if id.len() > MAX_IDENTIFIER_BYTES => {
                return Err(format!(
                    "{from} is {} bytes, over the {MAX_IDENTIFIER_BYTES} bytes an aggregate id may have",
                    id.len()
                ))
            }
            Some(_) => {}
        }
        if let Some(t) = aggregate_type.as_ref().filter(|t| t.len() > MAX_IDENTIFIER_BYTES) {
            return Err(format!(
                "{} is {} bytes, over the {MAX_IDENTIFIER_BYTES} bytes an aggregate type may have",
                attributes.named("aggregatetype"),
                t.len()
            ));
        }
    }
    let meta = Meta {
        event_id,
        id: id.to_owned(),
        source: source.to_owned(),
        dataschema,
        structured: attributes.structured,
        event_type,
        schema_version,
        aggregate_type,
        aggregate_id,
        aggregate_version,
        time: attributes.get("time").map(str::to_owned),
        topic: parts.place.0.to_owned(),
        partition: parts.place.1,
        offset: parts.place.2,
        headers: headers.clone(),
        registry_schema,
        consumer: Arc::default(),
    };
    Ok((meta, attributes.data.or(own_data)))
}
