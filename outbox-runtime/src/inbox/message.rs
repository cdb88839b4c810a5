//! Reading a Kafka record: its place, key, value and headers, normalised before anything
//! reaches SQL. Nothing here fails and nothing panics: bytes that are not storable text
//! (not UTF-8, or holding NUL, which PostgreSQL text refuses) are kept as bytes for the
//! parked row and never used as text identifiers; what makes the record unreadable as an
//! event becomes the reason to park it (invariant 9).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::panic::AssertUnwindSafe;

use rdkafka::message::{Headers, Message, OwnedMessage};
use serde_json::{json, Value};
use uuid::Uuid;

use super::handler::Meta;

/// The longest aggregate id or aggregate type the inbox tracks versions of, in bytes
/// (PostgreSQL's B-tree rows hold about 2,700 bytes).
pub(crate) const MAX_IDENTIFIER_BYTES: usize = 1000;

/// One header as it came: name and value bytes. `name` is `None` when it could not be
/// read at all (rdkafka panics on names that are not UTF-8; the bytes are out of reach).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawHeader {
    pub(crate) name: Option<Vec<u8>>,
    pub(crate) value: Option<Vec<u8>>,
}

/// One consumed record, read.
#[derive(Debug, Clone)]
pub(crate) struct Incoming {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) key: Option<Vec<u8>>,
    /// The value; empty for a null value (`null_value` tells which).
    pub(crate) payload: Vec<u8>,
    pub(crate) null_value: bool,
    /// Headers whose name and value are storable text, by name (the last of a repeated name).
    pub(crate) headers: BTreeMap<String, String>,
    /// Every header in order, as bytes.
    pub(crate) raw_headers: Vec<RawHeader>,
    /// The event's metadata, or why the record is not a readable event.
    pub(crate) meta: Result<Meta, String>,
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

/// Headers as text by name, and the problems that make the record unreadable.
fn text_headers(raw: &[RawHeader]) -> (BTreeMap<String, String>, Vec<String>) {
    let mut headers = BTreeMap::new();
    let mut problems = Vec::new();
    for (index, h) in raw.iter().enumerate() {
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
            None => {
                if is_read(name) {
                    problems.push(format!("header {name} has a null value"));
                }
                continue;
            }
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
    (headers, problems)
}

fn header<'h>(headers: &'h BTreeMap<String, String>, name: &str) -> Result<&'h str, String> {
    headers.get(name).map(String::as_str).ok_or_else(|| format!("missing header {name}"))
}

struct Parts<'a> {
    headers: &'a BTreeMap<String, String>,
    problems: &'a [String],
    key: Option<&'a [u8]>,
    payload: &'a [u8],
    null_value: bool,
    place: (&'a str, i32, i64),
}

fn read_meta(parts: &Parts<'_>) -> Result<Meta, String> {
    let headers = parts.headers;
    if let Some(problem) = parts.problems.first() {
        return Err(problem.clone());
    }
    let id = header(headers, "ce_id")?;
    let event_id = Uuid::parse_str(id).map_err(|e| format!("header ce_id {id:?} is not a UUID: {e}"))?;
    let event_type = header(headers, "ce_type")?.to_owned();
    let version = header(headers, "ce_schemaversion")?;
    let schema_version = version
        .parse::<u32>()
        .ok()
        .filter(|v| *v > 0 && i32::try_from(*v).is_ok())
        .ok_or_else(|| format!("header ce_schemaversion {version:?} is not a positive integer"))?;
    let aggregate_version = match headers.get("ce_aggregateversion") {
        Some(v) => Some(
            v.parse::<i64>().map_err(|_| format!("header ce_aggregateversion {v:?} is not an integer"))?,
        ),
        None => None,
    };
    if parts.null_value {
        return Err("null value (a tombstone): no event to apply".to_owned());
    }
    if parts.payload.is_empty() {
        return Err("empty payload".to_owned());
    }
    if let Err(error) = serde_json::from_slice::<serde::de::IgnoredAny>(parts.payload) {
        return Err(format!("payload is not JSON: {error}"));
    }
    // The aggregate: ce_subject, or else the record key when it is text. A binary key is
    // never used as a text identifier.
    let (aggregate_id, source) = match headers.get("ce_subject") {
        Some(subject) => (Some(subject.clone()), "header ce_subject"),
        None => (parts.key.and_then(storable_text).map(str::to_owned), "record key"),
    };
    let aggregate_type = headers.get("ce_aggregatetype").cloned();
    if aggregate_version.is_some() {
        // Versions are tracked per aggregate, in an index: the aggregate must be known and fit.
        match &aggregate_id {
            None => {
                return Err(format!(
                    "header ce_aggregateversion is given but the aggregate is unknown: no ce_subject, and the record \
                     key {}",
                    parts.key.map_or("is null", |k| why_not_text(k))
                ))
            }
            Some(id) if id.len() > MAX_IDENTIFIER_BYTES => {
                return Err(format!(
                    "{source} is {} bytes, over the {MAX_IDENTIFIER_BYTES} bytes an aggregate id may have",
                    id.len()
                ))
            }
            Some(_) => {}
        }
        if let Some(t) = aggregate_type.as_ref().filter(|t| t.len() > MAX_IDENTIFIER_BYTES) {
            return Err(format!(
                "header ce_aggregatetype is {} bytes, over the {MAX_IDENTIFIER_BYTES} bytes an aggregate type may have",
                t.len()
            ));
        }
    }
    Ok(Meta {
        event_id,
        event_type,
        schema_version,
        aggregate_type,
        aggregate_id,
        aggregate_version,
        time: headers.get("ce_time").cloned(),
        topic: parts.place.0.to_owned(),
        partition: parts.place.1,
        offset: parts.place.2,
        headers: headers.clone(),
    })
}

impl Incoming {
    /// Reads a consumed record. Header names that are not UTF-8 make rdkafka panic (its
    /// `Headers::try_get` unwraps `CStr::to_str`): each header is read under a panic guard
    /// and such a header is recorded as unreadable.
    pub(crate) fn read(message: &OwnedMessage) -> Incoming {
        let mut raw_headers = Vec::new();
        if let Some(hs) = message.headers() {
            for index in 0..hs.count() {
                let read = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    hs.try_get(index).map(|h| (h.key.as_bytes().to_vec(), h.value.map(<[u8]>::to_vec)))
                }));
                match read {
                    Ok(Some((name, value))) => raw_headers.push(RawHeader { name: Some(name), value }),
                    Ok(None) => {}
                    Err(_) => raw_headers.push(RawHeader { name: None, value: None }),
                }
            }
        }
        Incoming::new(
            message.topic(),
            message.partition(),
            message.offset(),
            message.key().map(<[u8]>::to_vec),
            message.payload().map(<[u8]>::to_vec),
            raw_headers,
        )
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
        let (headers, problems) = text_headers(&raw_headers);
        let null_value = payload.is_none();
        let payload = payload.unwrap_or_default();
        let meta = read_meta(&Parts {
            headers: &headers,
            problems: &problems,
            key: key.as_deref(),
            payload: &payload,
            null_value,
            place: (topic, partition, offset),
        });
        Incoming {
            topic: topic.to_owned(),
            partition,
            offset,
            key,
            payload,
            null_value,
            headers,
            raw_headers,
            meta,
        }
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
mod tests {
    use super::*;

    const ID: &str = "0190d5a2-8f7e-7a1c-9d5e-3f2b1a0c9e8d";

    fn raw(pairs: &[(&str, &str)]) -> Vec<RawHeader> {
        pairs
            .iter()
            .map(|(k, v)| RawHeader { name: Some(k.as_bytes().to_vec()), value: Some(v.as_bytes().to_vec()) })
            .collect()
    }

    fn meta(h: &[(&str, &str)], payload: &[u8]) -> Result<Meta, String> {
        Incoming::new("t", 0, 0, Some(b"k".to_vec()), Some(payload.to_vec()), raw(h)).meta
    }

    const OK: [(&str, &str); 3] = [("ce_id", ID), ("ce_type", "x.y"), ("ce_schemaversion", "1")];

    #[test]
    fn complete_headers_read_into_meta() {
        let m = meta(
            &[
                ("ce_id", ID),
                ("ce_type", "order.confirmed"),
                ("ce_schemaversion", "2"),
                ("ce_aggregateversion", "7"),
                ("ce_subject", "o-1"),
            ],
            br#"{"a":1}"#,
        )
        .expect("meta");
        assert_eq!(
            (m.event_type.as_str(), m.schema_version, m.aggregate_version),
            ("order.confirmed", 2, Some(7))
        );
        assert_eq!(m.aggregate_id.as_deref(), Some("o-1"));
    }

    #[test]
    fn each_defect_has_its_reason() {
        type Case<'a> = (Vec<(&'a str, &'a str)>, &'a [u8], &'a str);
        let cases: Vec<Case<'_>> = vec![
            (vec![("ce_type", "x.y"), ("ce_schemaversion", "1")], b"{}", "missing header ce_id"),
            (
                vec![("ce_id", "nope"), ("ce_type", "x.y"), ("ce_schemaversion", "1")],
                b"{}",
                "header ce_id \"nope\" is not a UUID",
            ),
            (vec![("ce_id", ID), ("ce_schemaversion", "1")], b"{}", "missing header ce_type"),
            (vec![("ce_id", ID), ("ce_type", "x.y")], b"{}", "missing header ce_schemaversion"),
            (
                vec![("ce_id", ID), ("ce_type", "x.y"), ("ce_schemaversion", "0")],
                b"{}",
                "header ce_schemaversion \"0\" is not a positive integer",
            ),
            (
                vec![("ce_id", ID), ("ce_type", "x.y"), ("ce_schemaversion", "4294967295")],
                b"{}",
                "header ce_schemaversion \"4294967295\" is not a positive integer",
            ),
            (OK.to_vec(), b"", "empty payload"),
            (OK.to_vec(), b"<xml/>", "payload is not JSON"),
            (
                [OK.as_slice(), &[("ce_aggregateversion", "v2")]].concat(),
                b"{}",
                "header ce_aggregateversion \"v2\" is not an integer",
            ),
            (
                [OK.as_slice(), &[("ce_type", "x.z")]].concat(),
                b"{}",
                "header ce_type appears more than once with different values",
            ),
            ([OK.as_slice(), &[("ce_type", "a\0b")]].concat(), b"{}", "header ce_type contains a NUL byte"),
        ];
        for (h, payload, reason) in cases {
            let err = meta(&h, payload).expect_err(reason);
            assert!(err.starts_with(reason), "{err:?} should start with {reason:?}");
        }
    }

    #[test]
    fn bytes_that_are_not_text_never_become_identifiers() {
        let mut headers = raw(&OK);
        headers.push(RawHeader { name: Some(b"x-binary".to_vec()), value: Some(vec![0xff, 0]) });
        // A binary key without ce_subject: the aggregate is unknown, the event still applies.
        let m = Incoming::new("t", 0, 0, Some(b"a\0b".to_vec()), Some(b"{}".to_vec()), headers.clone())
            .meta
            .expect("applies untracked");
        assert_eq!(m.aggregate_id, None);
        assert!(!m.headers.contains_key("x-binary"), "binary values stay out of the text headers");
        // ... but then its version cannot be tracked.
        let mut versioned = headers.clone();
        versioned.push(RawHeader { name: Some(b"ce_aggregateversion".to_vec()), value: Some(b"3".to_vec()) });
        let err = Incoming::new("t", 0, 0, Some(vec![0xc3, 0x28]), Some(b"{}".to_vec()), versioned).meta;
        assert!(err.expect_err("unknown aggregate").contains("record key is not UTF-8"));
        let long = "s".repeat(MAX_IDENTIFIER_BYTES + 1);
        let err =
            meta(&[OK.as_slice(), &[("ce_subject", &long), ("ce_aggregateversion", "1")]].concat(), b"{}");
        assert!(err.expect_err("too long").starts_with("header ce_subject is 1001 bytes"));
        let unreadable =
            Incoming::new("t", 0, 0, None, Some(b"{}".to_vec()), vec![RawHeader { name: None, value: None }]);
        assert_eq!(unreadable.meta.expect_err("unreadable"), "header #0 has a name that is not UTF-8");
        let tombstone = Incoming::new("t", 0, 0, None, None, raw(&OK));
        assert!(tombstone.meta.expect_err("tombstone").starts_with("null value"));
    }

    #[test]
    fn raw_headers_survive_the_parked_row() {
        let headers = vec![
            RawHeader { name: Some(b"ce_id".to_vec()), value: Some(ID.as_bytes().to_vec()) },
            RawHeader { name: Some(vec![0xff, b'a']), value: Some(vec![0, 1, 2]) },
            RawHeader { name: Some(b"n".to_vec()), value: None },
            RawHeader { name: None, value: None },
        ];
        let json = raw_headers_json(&headers);
        assert_eq!(json[1], json!({"name_hex": "ff61", "value_hex": "000102"}));
        let back =
            Incoming::from_parked(("t", 0, 0), None, b"{}".to_vec(), false, BTreeMap::new(), Some(json));
        assert_eq!(back.raw_headers, headers);
        assert_eq!(unhex("0g"), None);
    }
}
