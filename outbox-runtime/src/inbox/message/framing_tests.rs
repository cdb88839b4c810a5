//! Records framed in a schema registry's wire format (Confluent's serializers): the id
//! prefix, the GUID prefix, the id header; and frames that cannot be read.

use super::*;
use crate::schema_registry::framing::{guid_header, prefix, SchemaRef};

const ID: &str = "0190d5a2-8f7e-7a1c-9d5e-3f2b1a0c9e8d";

fn headers(extra: Vec<RawHeader>) -> Vec<RawHeader> {
    let mut out: Vec<RawHeader> = [
        ("ce_id", ID),
        ("ce_type", "x.y"),
        ("ce_specversion", "1.0"),
        ("ce_source", "/tests"),
        ("ce_schemaversion", "1"),
    ]
    .iter()
    .map(|(k, v)| RawHeader { name: Some(k.as_bytes().to_vec()), value: Some(v.as_bytes().to_vec()) })
    .collect();
    out.extend(extra);
    out
}

fn schema_header(value: &[u8]) -> RawHeader {
    RawHeader { name: Some(VALUE_SCHEMA_ID_HEADER.as_bytes().to_vec()), value: Some(value.to_vec()) }
}

fn read(value: &[u8], extra: Vec<RawHeader>) -> Incoming {
    Incoming::new("t", 0, 0, Some(b"k".to_vec()), Some(value.to_vec()), headers(extra))
}

#[test]
fn framed_values_are_read_and_handlers_get_the_payload_after_the_frame() {
    let guid = [7u8; 16];
    let mut guid_prefixed = guid_header(guid).to_vec();
    guid_prefixed.extend_from_slice(br#"{"a":2}"#);
    let cases = [
        (read(&prefix(42, br#"{"a":1}"#), vec![]), SchemaRef::Id(42), &br#"{"a":1}"#[..]),
        (read(&guid_prefixed, vec![]), SchemaRef::Guid(guid), br#"{"a":2}"#),
        (read(br#"{"a":3}"#, vec![schema_header(&guid_header(guid))]), SchemaRef::Guid(guid), br#"{"a":3}"#),
        (read(br#"{"a":4}"#, vec![schema_header(&[0, 0, 0, 0, 9])]), SchemaRef::Id(9), br#"{"a":4}"#),
    ];
    for (incoming, schema, data) in cases {
        let meta = incoming.meta.as_ref().expect("meta");
        assert_eq!(meta.registry_schema, Some(schema));
        assert_eq!(incoming.event_data(), data);
    }
    // Unframed: as before.
    let plain = read(br#"{"a":5}"#, vec![]);
    assert_eq!(plain.meta.as_ref().expect("meta").registry_schema, None);
    assert_eq!(plain.event_data(), br#"{"a":5}"#);
    assert!(plain.data.is_none());
}

#[test]
fn frames_that_cannot_be_read_are_parked_with_the_reason() {
    let cases: [(Incoming, &str); 6] = [
        (
            read(&[0, 0, 1], vec![]),
            "truncated schema registry frame: magic byte 0x00 needs 5 bytes, the value has 3",
        ),
        (
            read(&[1, 2, 3], vec![]),
            "truncated schema registry frame: magic byte 0x01 needs 17 bytes, the value has 3",
        ),
        (read(&[5, b'{', b'}'], vec![]), "unknown magic byte 0x05"),
        (
            read(b"{}", vec![schema_header(&[1, 2])]),
            "header __value_schema_id: expected 0x01 and a 16-byte GUID",
        ),
        (read(&prefix(1, b"not json"), vec![]), "payload is not JSON"),
        (
            read(b"{}", vec![schema_header(&guid_header([1; 16])), schema_header(&guid_header([2; 16]))]),
            "header __value_schema_id appears more than once with different values",
        ),
    ];
    for (incoming, reason) in cases {
        let got = incoming.meta.as_ref().expect_err("parked");
        assert!(got.contains(reason), "{got:?} should say {reason:?}");
        // The value is kept whole for the parked row.
        assert!(!incoming.payload.is_empty());
    }
    // The frame is read from the value only in binary mode; an empty framed payload is empty.
    let empty = read(&prefix(1, b""), vec![]);
    assert_eq!(empty.meta.as_ref().expect_err("parked"), "empty payload");
}

#[test]
fn a_framed_record_weighs_its_copy() {
    let framed = Received::for_test("t", None, Some(prefix(1, &[b' '; 1000])), vec![]);
    let plain = Received::for_test("t", None, Some(vec![b' '; 1005]), vec![]);
    assert!(framed.size() >= plain.size() + 1000, "{} vs {}", framed.size(), plain.size());
}
