//! Reading a Kafka message: its place, key, payload, and the CloudEvents headers the relay
//! writes. Nothing here fails: what is wrong becomes a reason to park the message.

use std::collections::BTreeMap;

use rdkafka::message::{Headers, Message, OwnedMessage};
use uuid::Uuid;

use super::handler::Meta;

/// One consumed message, read.
#[derive(Debug, Clone)]
pub(crate) struct Incoming {
    pub(crate) topic: String,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) key: Option<Vec<u8>>,
    pub(crate) payload: Vec<u8>,
    pub(crate) headers: BTreeMap<String, String>,
    /// The event's metadata, or why the message is not a readable event.
    pub(crate) meta: Result<Meta, String>,
}

fn header<'h>(headers: &'h BTreeMap<String, String>, name: &str) -> Result<&'h str, String> {
    headers.get(name).map(String::as_str).ok_or_else(|| format!("missing header {name}"))
}

fn read_meta(
    headers: &BTreeMap<String, String>,
    bad_headers: &[String],
    key: Option<&[u8]>,
    payload: &[u8],
    place: (&str, i32, i64),
) -> Result<Meta, String> {
    if let Some(bad) = bad_headers.first() {
        return Err(if bad.ends_with("(contains NUL)") {
            format!("header {bad}: not storable text")
        } else {
            format!("header {bad} is not UTF-8")
        });
    }
    let id = header(headers, "ce_id")?;
    let event_id = Uuid::parse_str(id).map_err(|e| format!("header ce_id {id:?} is not a UUID: {e}"))?;
    let event_type = header(headers, "ce_type")?.to_owned();
    let version = header(headers, "ce_schemaversion")?;
    let schema_version = version
        .parse::<u32>()
        .ok()
        .filter(|v| *v > 0)
        .ok_or_else(|| format!("header ce_schemaversion {version:?} is not a positive integer"))?;
    let aggregate_version = match headers.get("ce_aggregateversion") {
        Some(v) => Some(
            v.parse::<i64>().map_err(|_| format!("header ce_aggregateversion {v:?} is not an integer"))?,
        ),
        None => None,
    };
    if payload.is_empty() {
        return Err("empty payload".to_owned());
    }
    if let Err(error) = serde_json::from_slice::<serde::de::IgnoredAny>(payload) {
        return Err(format!("payload is not JSON: {error}"));
    }
    let aggregate_id =
        headers.get("ce_subject").cloned().or_else(|| key.map(|k| String::from_utf8_lossy(k).into_owned()));
    Ok(Meta {
        event_id,
        event_type,
        schema_version,
        aggregate_type: headers.get("ce_aggregatetype").cloned(),
        aggregate_id,
        aggregate_version,
        time: headers.get("ce_time").cloned(),
        topic: place.0.to_owned(),
        partition: place.1,
        offset: place.2,
        headers: headers.clone(),
    })
}

impl Incoming {
    pub(crate) fn read(message: &OwnedMessage) -> Incoming {
        let mut headers = BTreeMap::new();
        let mut bad_headers = Vec::new();
        if let Some(hs) = message.headers() {
            for h in hs.iter() {
                match std::str::from_utf8(h.value.unwrap_or_default()) {
                    // PostgreSQL text cannot hold NUL: such a header makes the message
                    // unreadable, and is stored with the NUL replaced so it can be parked.
                    Ok(v) if v.contains('\0') || h.key.contains('\0') => {
                        bad_headers.push(format!("{} (contains NUL)", h.key.replace('\0', "\u{fffd}")));
                        headers.insert(h.key.replace('\0', "\u{fffd}"), v.replace('\0', "\u{fffd}"));
                    }
                    Ok(v) => {
                        headers.insert(h.key.to_owned(), v.to_owned());
                    }
                    Err(_) => bad_headers.push(h.key.to_owned()),
                }
            }
        }
        let key = message.key().map(<[u8]>::to_vec);
        let payload = message.payload().map(<[u8]>::to_vec).unwrap_or_default();
        Incoming::from_parts(
            message.topic(),
            message.partition(),
            message.offset(),
            key,
            payload,
            headers,
            &bad_headers,
        )
    }

    /// A message rebuilt from its parts (e.g. from the parked table).
    pub(crate) fn from_parts(
        topic: &str,
        partition: i32,
        offset: i64,
        key: Option<Vec<u8>>,
        payload: Vec<u8>,
        headers: BTreeMap<String, String>,
        bad_headers: &[String],
    ) -> Incoming {
        let meta = read_meta(&headers, bad_headers, key.as_deref(), &payload, (topic, partition, offset));
        Incoming { topic: topic.to_owned(), partition, offset, key, payload, headers, meta }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    const ID: &str = "0190d5a2-8f7e-7a1c-9d5e-3f2b1a0c9e8d";

    fn meta(h: &[(&str, &str)], payload: &[u8]) -> Result<Meta, String> {
        read_meta(&headers(h), &[], Some(b"k"), payload, ("t", 0, 0))
    }

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
        let ok = [("ce_id", ID), ("ce_type", "x.y"), ("ce_schemaversion", "1")];
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
            (ok.to_vec(), b"", "empty payload"),
            (ok.to_vec(), b"<xml/>", "payload is not JSON"),
            (
                [ok.as_slice(), &[("ce_aggregateversion", "v2")]].concat(),
                b"{}",
                "header ce_aggregateversion \"v2\" is not an integer",
            ),
        ];
        for (h, payload, reason) in cases {
            let err = meta(&h, payload).expect_err(reason);
            assert!(err.starts_with(reason), "{err:?} should start with {reason:?}");
        }
        let not_utf8 = read_meta(&headers(&ok), &["ce_type".to_owned()], None, b"{}", ("t", 0, 0));
        assert_eq!(not_utf8.expect_err("bad header"), "header ce_type is not UTF-8");
    }
}
