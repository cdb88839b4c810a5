//! Reading a Kafka record: its place, key, value and headers, normalised before anything
//! reaches SQL. Nothing here fails and nothing panics: bytes that are not storable text
//! (not UTF-8, or holding NUL, which PostgreSQL text refuses) are kept as bytes for the
//! parked row and never used as text identifiers; what makes the record unreadable as an
//! event becomes the reason to park it ([invariant 9](crate::guarantees#i9)).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use rdkafka::message::{BorrowedMessage, Message};
use serde_json::{json, Value};

use super::budget::Charge;
use super::handler::Meta;
use crate::schema_registry::framing::{MAGIC_GUID, MAGIC_ID, VALUE_SCHEMA_ID_HEADER};

mod cloudevents;
mod native;

#[cfg(test)]
use self::cloudevents::version_in_dataschema;
pub use self::cloudevents::{event_id_of, FOREIGN_ID_NAMESPACE};
use self::cloudevents::{read_meta, Parts};

/// The longest aggregate id or aggregate type the inbox tracks versions of, in bytes
/// (PostgreSQL's B-tree rows hold about 2,700 bytes).
pub(crate) const MAX_IDENTIFIER_BYTES: usize = 1000;

/// One header as it came: name and value bytes. `name` is `None` only in rows parked by
/// earlier versions, which could not read names that are not UTF-8.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawHeader {
    pub(crate) name: Option<Vec<u8>>,
    pub(crate) value: Option<Vec<u8>>,
}

/// How a structured-mode CloudEvent's content type begins (see `cloudevents`).
const STRUCTURED_PREFIX: &[u8] = b"application/cloudevents";

/// One consumed record, read.
#[derive(Debug, Clone)]
pub(crate) struct Incoming {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) key: Option<Vec<u8>>,
    /// The value; empty for a null value (`null_value` tells which).
    pub(crate) payload: Vec<u8>,
    /// The event's data when it is not the value itself: a structured-mode CloudEvent's
    /// `data` (or decoded `data_base64`), or a framed value's payload (a schema registry's
    /// wire format). `None` in binary mode without a frame, where it is the value.
    pub(crate) data: Option<Vec<u8>>,
    pub(crate) null_value: bool,
    /// Headers whose name and value are storable text, by name (the last of a repeated name).
    pub(crate) headers: BTreeMap<String, String>,
    /// Every header in order, as bytes.
    pub(crate) raw_headers: Vec<RawHeader>,
    /// The event's metadata, or why the record is not a readable event.
    pub(crate) meta: Result<Meta, String>,
    /// Its bytes, counted against the memory budget while any copy of it lives.
    pub(crate) charge: Option<std::sync::Arc<Charge>>,
}

/// `bytes` as text PostgreSQL can store: UTF-8 without NUL.
pub(crate) fn storable_text(bytes: &[u8]) -> Option<&str> {
    std::str::from_utf8(bytes).ok().filter(|s| !s.contains('\0'))
}

fn why_not_text(bytes: &[u8]) -> &'static str {
    if std::str::from_utf8(bytes).is_err() {
        "is not UTF-8"
    } else {
        "contains a NUL byte"
    }
}

/// Headers the inbox reads: their values must be text.
fn is_read(name: &str) -> bool {
    name.starts_with("ce_") || name.eq_ignore_ascii_case("content-type")
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

impl RawHeader {
    /// The parked row's form: text where it is storable text, hex otherwise, `null` when
    /// absent or unreadable.
    fn to_json(&self) -> Value {
        let part = |field: &str, bytes: &Option<Vec<u8>>| match bytes {
            None => (field.to_owned(), Value::Null),
            Some(b) => match storable_text(b) {
                Some(text) => (field.to_owned(), json!(text)),
                None => (format!("{field}_hex"), json!(hex(b))),
            },
        };
        let mut object = serde_json::Map::new();
        for (field, value) in [part("name", &self.name), part("value", &self.value)] {
            object.insert(field, value);
        }
        Value::Object(object)
    }

    fn from_json(value: &Value) -> RawHeader {
        let part = |field: &str| {
            if let Some(text) = value.get(field).and_then(Value::as_str) {
                return Some(text.as_bytes().to_vec());
            }
            value.get(format!("{field}_hex")).and_then(Value::as_str).and_then(unhex)
        };
        RawHeader { name: part("name"), value: part("value") }
    }
}

/// The parked row's `raw_headers`.
pub(crate) fn raw_headers_json(headers: &[RawHeader]) -> Value {
    Value::Array(headers.iter().map(RawHeader::to_json).collect())
}

/// Headers as text by name, the problems that make the record unreadable, and the value
/// of the `__value_schema_id` header (a schema registry's id of the value's schema, not
/// text) when there is one: repeated with different values, it is a problem.
fn text_headers(raw: &[RawHeader]) -> (BTreeMap<String, String>, Vec<String>, Option<&[u8]>) {
    let mut headers = BTreeMap::new();
    let mut problems = Vec::new();
    let mut schema_id: Option<&[u8]> = None;
    for (index, h) in raw.iter().enumerate() {
        if let (Some(name), Some(value)) = (h.name.as_deref(), h.value.as_deref()) {
            if name == VALUE_SCHEMA_ID_HEADER.as_bytes() {
                match schema_id {
                    None => schema_id = Some(value),
                    Some(first) if first != value => problems.push(format!(
                        "header {VALUE_SCHEMA_ID_HEADER} appears more than once with different values"
                    )),
                    Some(_) => {}
                }
                continue;
            }
        }
        let Some(name_bytes) = &h.name else {
            problems.push(format!("header #{index} has a name that is not UTF-8"));
            continue;
        };
        let Some(name) = storable_text(name_bytes) else {
            problems.push(format!(
                "header #{index} (name {}) has a name that {}",
                String::from_utf8_lossy(name_bytes).escape_debug(),
                why_not_text(name_bytes)
            ));
            continue;
        };
        let value = match &h.value {
            // A header without a value is absent (kafkajs writes the CloudEvents SDK's unset
            // attributes, `ce_subject: undefined`, so): a required one is then missing.
            None => continue,
            Some(v) => match storable_text(v) {
                Some(text) => text,
                None => {
                    // Other headers may carry bytes (tracing, a foreign client's own); only
                    // the ones the inbox reads must be text. All stay in the raw headers.
                    if is_read(name) {
                        problems.push(format!("header {name} {}: not storable as text", why_not_text(v)));
                    }
                    continue;
                }
            },
        };
        if let Some(earlier) = headers.insert(name.to_owned(), value.to_owned()) {
            if is_read(name) && earlier != value {
                problems.push(format!("header {name} appears more than once with different values"));
            }
        }
    }
    (headers, problems, schema_id)
}

/// A consumed record as the inbox keeps it until a worker reads it: detached from the
/// consumer, every byte as it came.
#[derive(Debug)]
pub(crate) struct Received {
    topic: String,
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    payload: Option<Vec<u8>>,
    headers: Vec<RawHeader>,
    charge: Option<Charge>,
}

impl Received {
    /// Copies `message` out of the consumer: headers through librdkafka's C API (names of
    /// any bytes; see [`native`]), never through rdkafka's `Headers`, which panics on a name
    /// that is not UTF-8.
    pub(crate) fn read(message: &BorrowedMessage<'_>) -> Received {
        Received {
            topic: message.topic().to_owned(),
            partition: message.partition(),
            offset: message.offset(),
            key: message.key().map(<[u8]>::to_vec),
            payload: message.payload().map(<[u8]>::to_vec),
            headers: native::headers(message),
            charge: None,
        }
    }

    /// A record as if received, for tests.
    #[cfg(test)]
    pub(crate) fn for_test(
        topic: &str,
        key: Option<Vec<u8>>,
        payload: Option<Vec<u8>>,
        headers: Vec<RawHeader>,
    ) -> Received {
        Received { topic: topic.to_owned(), partition: 0, offset: 0, key, payload, headers, charge: None }
    }

    /// Counts the record against the memory budget from now until its outcome.
    pub(crate) fn charge(&mut self, charge: Charge) {
        self.charge = Some(charge);
    }

    pub(crate) fn topic(&self) -> &str {
        &self.topic
    }

    pub(crate) fn partition(&self) -> i32 {
        self.partition
    }

    /// What the record weighs from its receipt to its outcome: its bytes, what reading it
    /// copies (the headers as text; in structured mode the event's data, at most the value
    /// again) and a fixed amount of bookkeeping.
    pub(crate) fn size(&self) -> usize {
        let (mut structured, mut schema_header) = (false, false);
        let headers: usize = self
            .headers
            .iter()
            .map(|h| {
                let (name, value) =
                    (h.name.as_deref().unwrap_or_default(), h.value.as_deref().unwrap_or_default());
                structured |= name.eq_ignore_ascii_case(b"content-type")
                    && value
                        .trim_ascii_start()
                        .get(..STRUCTURED_PREFIX.len())
                        .is_some_and(|p| p.eq_ignore_ascii_case(STRUCTURED_PREFIX));
                schema_header |= name == VALUE_SCHEMA_ID_HEADER.as_bytes();
                2 * (name.len() + value.len()) + 64
            })
            .sum();
        let payload = self.payload.as_ref().map_or(0, Vec::len);
        // A schema registry frame is stripped into a copy of the payload, as structured
        // mode's data is.
        let framed = self
            .payload
            .as_ref()
            .and_then(|p| p.first())
            .is_some_and(|b| matches!(*b, MAGIC_ID | MAGIC_GUID))
            || schema_header;
        self.topic.len()
            + self.key.as_ref().map_or(0, Vec::len)
            + if structured || framed { 2 * payload } else { payload }
            + headers
            + 256
    }
}

impl Incoming {
    /// Reads a received record.
    pub(crate) fn read(record: Received) -> Incoming {
        let Received { topic, partition, offset, key, payload, headers, charge } = record;
        let mut incoming = Incoming::new(&topic, partition, offset, key, payload, headers);
        incoming.charge = charge.map(std::sync::Arc::new);
        incoming
    }

    /// A record from its parts; `payload` `None` is a null value.
    pub(crate) fn new(
        topic: &str,
        partition: i32,
        offset: i64,
        key: Option<Vec<u8>>,
        payload: Option<Vec<u8>>,
        raw_headers: Vec<RawHeader>,
    ) -> Incoming {
        let (headers, problems, schema_header) = text_headers(&raw_headers);
        let null_value = payload.is_none();
        let payload = payload.unwrap_or_default();
        let read = read_meta(&Parts {
            headers: &headers,
            problems: &problems,
            schema_header,
            key: key.as_deref(),
            payload: &payload,
            null_value,
            place: (topic, partition, offset),
        });
        let (meta, data) = match read {
            Ok((meta, data)) => (Ok(meta), data),
            Err(reason) => (Err(reason), None),
        };
        Incoming {
            topic: topic.to_owned(),
            partition,
            offset,
            key,
            payload,
            data,
            null_value,
            headers,
            raw_headers,
            meta,
            charge: None,
        }
    }

    /// The same record, its meta naming `consumer` (handlers read it, and
    /// [`Meta::idempotency_key`](crate::inbox::Meta::idempotency_key) is made of it).
    pub(crate) fn for_consumer(mut self, consumer: &std::sync::Arc<str>) -> Incoming {
        if let Ok(meta) = &mut self.meta {
            meta.consumer = consumer.clone();
        }
        self
    }

    /// The event's data, as handlers decode it: the value in binary mode, the `data`
    /// member in structured mode.
    pub(crate) fn event_data(&self) -> &[u8] {
        self.data.as_deref().unwrap_or(&self.payload)
    }

    /// A record rebuilt from the parked table: from its raw headers when the row has them,
    /// else (rows parked before they were kept) from its text headers.
    pub(crate) fn from_parked(
        place: (&str, i32, i64),
        key: Option<Vec<u8>>,
        payload: Vec<u8>,
        null_value: bool,
        headers: BTreeMap<String, String>,
        raw_headers: Option<Value>,
    ) -> Incoming {
        let raw = match raw_headers {
            Some(Value::Array(items)) => items.iter().map(RawHeader::from_json).collect(),
            _ => headers
                .into_iter()
                .map(|(k, v)| RawHeader { name: Some(k.into_bytes()), value: Some(v.into_bytes()) })
                .collect(),
        };
        Incoming::new(place.0, place.1, place.2, key, (!null_value).then_some(payload), raw)
    }
}

#[cfg(test)]
mod framing_tests;
#[cfg(test)]
mod tests;
