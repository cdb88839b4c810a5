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

const OK: [(&str, &str); 5] = [
    ("ce_id", ID),
    ("ce_type", "x.y"),
    ("ce_specversion", "1.0"),
    ("ce_source", "/tests"),
    ("ce_schemaversion", "1"),
];

/// `OK` without the headers named.
fn ok_without(names: &[&str]) -> Vec<(&'static str, &'static str)> {
    OK.iter().copied().filter(|(k, _)| !names.contains(k)).collect()
}

#[test]
fn complete_headers_read_into_meta() {
    let m = meta(
        &[
            ("ce_id", ID),
            ("ce_type", "order.confirmed"),
            ("ce_specversion", "1.0"),
            ("ce_source", "/order-service"),
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
        (ok_without(&["ce_id"]), b"{}", "missing header ce_id"),
        ([ok_without(&["ce_id"]).as_slice(), &[("ce_id", "")]].concat(), b"{}", "header ce_id is empty"),
        (ok_without(&["ce_type"]), b"{}", "missing header ce_type"),
        (ok_without(&["ce_specversion"]), b"{}", "missing header ce_specversion"),
        (
            [ok_without(&["ce_specversion"]).as_slice(), &[("ce_specversion", "0.3")]].concat(),
            b"{}",
            "header ce_specversion \"0.3\" is not 1.0",
        ),
        (ok_without(&["ce_source"]), b"{}", "missing header ce_source"),
        (ok_without(&["ce_schemaversion"]), b"{}", "no schema version: missing header ce_schemaversion"),
        (
            [ok_without(&["ce_schemaversion"]).as_slice(), &[("ce_dataschema", "https://s/x.y/latest.json")]]
                .concat(),
            b"{}",
            "no schema version: no header ce_schemaversion, and header ce_dataschema",
        ),
        (
            [OK.as_slice(), &[("ce_dataschema", "https://s/x.y/v2.json")]].concat(),
            b"{}",
            "header ce_schemaversion \"1\" contradicts header ce_dataschema",
        ),
        (
            [ok_without(&["ce_schemaversion"]).as_slice(), &[("ce_schemaversion", "0")]].concat(),
            b"{}",
            "header ce_schemaversion \"0\" is not a positive integer",
        ),
        (
            [ok_without(&["ce_schemaversion"]).as_slice(), &[("ce_schemaversion", "4294967295")]].concat(),
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

/// CloudEvents allows any non-empty id: one that is not a UUID gets a UUIDv5 of its
/// source and id, the same for every consumer and every delivery, different for
/// another source. Before, such a record was parked ("is not a UUID").
#[test]
fn an_id_that_is_not_a_uuid_maps_to_a_stable_event_id_per_source() {
    let with = |id: &'static str, source: &'static str| {
        let h = [ok_without(&["ce_id", "ce_source"]).as_slice(), &[("ce_id", id), ("ce_source", source)]]
            .concat();
        meta(&h, b"{}").expect("applies")
    };
    let a = with("order-42", "/shop");
    assert_eq!((a.id.as_str(), a.source.as_str()), ("order-42", "/shop"));
    assert_eq!(a.event_id, with("order-42", "/shop").event_id, "a redelivery is a duplicate");
    assert_ne!(a.event_id, with("order-42", "/billing").event_id, "source + id identify an event");
    assert_ne!(a.event_id, with("order-43", "/shop").event_id);
    assert_eq!(a.event_id, event_id_of("/shop", "order-42"));
    assert_eq!(a.event_id.get_version_num(), 5);
    assert_eq!(a.foreign(), Some(("order-42", "/shop")));
    // A UUID id is the event id, whatever the source: the relay's events dedup as before.
    let own = with(ID, "/anything");
    assert_eq!(own.event_id.to_string(), ID);
    assert_eq!(own.foreign(), None);
}

/// The version may come from the standard `dataschema` alone (`.../v<N>.json`, as the
/// relay sends it), and a header without a value (kafkajs' undefined attributes) is
/// absent, not a defect.
#[test]
fn the_version_comes_from_dataschema_and_null_headers_are_absent() {
    let h = [
        ok_without(&["ce_schemaversion"]).as_slice(),
        &[("ce_dataschema", "https://schemas.example.com/x.y/v12.json")],
    ]
    .concat();
    let mut headers = raw(&h);
    headers.push(RawHeader { name: Some(b"ce_subject".to_vec()), value: None });
    headers.push(RawHeader { name: Some(b"ce_dataschema".to_vec()), value: None });
    let m =
        Incoming::new("t", 0, 0, Some(b"k".to_vec()), Some(b"{}".to_vec()), headers).meta.expect("applies");
    assert_eq!(m.schema_version, 12);
    assert_eq!(m.aggregate_id.as_deref(), Some("k"), "a null ce_subject falls back to the key");
    for (uri, version) in [
        ("urn:outbox:schemas/order.confirmed/v2.json", Some(2)),
        ("/schemas/order.confirmed/v3.json?x=1#frag", Some(3)),
        ("https://s/order.confirmed/v7", Some(7)),
        ("https://s/order.confirmed/v07.json", None),
        ("https://s/order.confirmed/v0.json", None),
        ("https://s/v2/order.confirmed.json", None),
        ("https://s/order.confirmed/v99999999999.json", None),
        ("", None),
    ] {
        assert_eq!(version_in_dataschema(uri), version, "{uri}");
    }
}

fn structured(content_type: &str, value: &str) -> Result<(Meta, Vec<u8>), String> {
    let incoming = Incoming::new(
        "t",
        0,
        0,
        Some(b"k".to_vec()),
        Some(value.as_bytes().to_vec()),
        raw(&[("content-type", content_type)]),
    );
    let data = incoming.event_data().to_vec();
    incoming.meta.map(|m| (m, data))
}

/// Structured mode, as the CloudEvents Kafka binding says implementations should read
/// it: the whole event as JSON in the value. Before, it was parked "missing header ce_id".
#[test]
fn structured_events_are_read_from_the_value() {
    let event = r#"{"specversion":"1.0","id":"e-1","source":"/py","type":"x.y","schemaversion":2,
                   "subject":"o-1","aggregateversion":3,"time":"2026-12-01T00:00:00Z","data":{"a":1}}"#;
    for content_type in [
        "application/cloudevents+json",
        "application/cloudevents+json; charset=utf-8",
        "Application/CloudEvents+JSON",
    ] {
        let (m, data) = structured(content_type, event).expect(content_type);
        assert!(m.structured);
        assert_eq!((m.id.as_str(), m.source.as_str(), m.schema_version), ("e-1", "/py", 2));
        assert_eq!((m.aggregate_id.as_deref(), m.aggregate_version), (Some("o-1"), Some(3)));
        assert_eq!(data, br#"{"a":1}"#, "handlers get data, not the envelope");
    }
    let base64 = r#"{"specversion":"1.0","id":"e-2","source":"/js","type":"x.y",
                    "dataschema":"urn:outbox:schemas/x.y/v1.json","data_base64":"eyJhIjoyfQ=="}"#;
    let (m, data) = structured("application/cloudevents+json", base64).expect("data_base64");
    assert_eq!((m.schema_version, data.as_slice()), (1, br#"{"a":2}"#.as_slice()));
    type Case<'a> = (&'a str, &'a str, &'a str);
    let cases: Vec<Case<'_>> = vec![
        ("application/cloudevents-batch+json", "[]", "content-type \"application/cloudevents-batch+json\""),
        ("application/cloudevents+json", "[1]", "structured CloudEvent is not a JSON object"),
        (
            "application/cloudevents+json",
            r#"{"specversion":"1.0","id":"1","source":"s","type":"x.y","schemaversion":1}"#,
            "structured CloudEvent has no data",
        ),
        (
            "application/cloudevents+json",
            r#"{"specversion":"1.0","id":"1","source":"s","type":"x.y","schemaversion":1,"data":{},"data_base64":"e30="}"#,
            "structured CloudEvent has both data and data_base64",
        ),
        (
            "application/cloudevents+json",
            r#"{"specversion":"1.0","id":"1","source":"s","type":"x.y","schemaversion":1,"data_base64":"%%"}"#,
            "attribute data_base64 is not base64",
        ),
        (
            "application/cloudevents+json",
            r#"{"specversion":"1.0","source":"s","type":"x.y","schemaversion":1,"data":{}}"#,
            "missing attribute id",
        ),
        (
            "application/cloudevents+json",
            r#"{"specversion":"0.3","id":"1","source":"s","type":"x.y","schemaversion":1,"data":{}}"#,
            "attribute specversion \"0.3\" is not 1.0",
        ),
        (
            "application/cloudevents+json",
            r#"{"specversion":"1.0","id":"1","type":"x.y","schemaversion":1,"data":{}}"#,
            "missing attribute source",
        ),
        (
            "application/cloudevents+json",
            r#"{"specversion":"1.0","id":{"x":1},"source":"s","type":"x.y","data":{}}"#,
            "attribute id is not a string",
        ),
        (
            "application/cloudevents+json",
            r#"{"specversion":"1.0","id":"1","source":"s","type":"x.y","data":{}}"#,
            "no schema version: missing attribute schemaversion",
        ),
        (
            "application/cloudevents+json",
            r#"{"specversion":"1.0","id":"1","source":"s","type":"x.y","schemaversion":1,"data":"<xml/>"}"#,
            "",
        ),
    ];
    for (content_type, value, reason) in cases {
        match structured(content_type, value) {
            Err(err) if reason.is_empty() => panic!("{value}: expected to be read, parked: {err}"),
            Err(err) => assert!(err.starts_with(reason), "{err:?} should start with {reason:?}"),
            Ok(_) if reason.is_empty() => {} // a JSON string is JSON data
            Ok(m) => panic!("{value}: expected {reason:?}, read {m:?}"),
        }
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
    let err = meta(&[OK.as_slice(), &[("ce_subject", &long), ("ce_aggregateversion", "1")]].concat(), b"{}");
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
    let back = Incoming::from_parked(("t", 0, 0), None, b"{}".to_vec(), false, BTreeMap::new(), Some(json));
    assert_eq!(back.raw_headers, headers);
    assert_eq!(unhex("0g"), None);
}

/// A UUID is the event id only as the relay writes one (canonical); any other spelling,
/// and the nil and max UUIDs, are ids like any other: mapped with their source and kept,
/// so that two sources' events never fold into one. Before, `Uuid::parse_str` took them
/// all as the event id, whatever the source: the second source's event was dropped as a
/// duplicate.
#[test]
fn only_a_canonical_uuid_is_the_event_id_and_other_spellings_keep_their_source() {
    let with = |id: &str, source: &str| {
        let h: Vec<(&str, &str)> =
            [ok_without(&["ce_id", "ce_source"]).as_slice(), &[("ce_id", id), ("ce_source", source)]]
                .concat();
        meta(&h, b"{}").expect("applies")
    };
    let upper = ID.to_uppercase();
    let braced = format!("{{{ID}}}");
    let urn = format!("urn:uuid:{ID}");
    let simple = ID.replace('-', "");
    let nil = "00000000-0000-0000-0000-000000000000";
    let max = "ffffffff-ffff-ffff-ffff-ffffffffffff";
    for id in [upper.as_str(), braced.as_str(), urn.as_str(), simple.as_str(), nil, max] {
        let a = with(id, "/a");
        let b = with(id, "/b");
        assert_ne!(a.event_id, b.event_id, "{id}: two sources, two events");
        assert_ne!(a.event_id.to_string(), ID, "{id}: not folded into the canonical id's event");
        assert_eq!(a.foreign(), Some((id, "/a")), "{id}: kept as sent");
        assert_eq!(a.event_id, with(id, "/a").event_id, "{id}: a redelivery is a duplicate");
    }
    let own = with(ID, "/b");
    assert_eq!((own.event_id.to_string().as_str(), own.foreign()), (ID, None));
}

/// Structured mode's `data` reaches the handler as sent, byte for byte, as binary mode's
/// value does. Before, it was parsed and written again: keys sorted, a number beyond f64
/// rounded (`1.2345678901234568e23`).
#[test]
fn structured_data_is_passed_on_as_sent() {
    let data = r#"{ "z": 123456789012345678901234, "a": [1.10, "x"] }"#;
    let event = format!(
        r#"{{"specversion":"1.0","id":"e-1","source":"/py","type":"x.y","schemaversion":1,"data":{data}}}"#
    );
    let (_, read) = structured("application/cloudevents+json", &event).expect("read");
    assert_eq!(String::from_utf8(read).expect("utf-8"), data);
}

/// What a structured event or its headers say twice, or in the wrong JSON type, is not
/// guessed at: parked with the reason.
#[test]
fn repeated_members_and_mistyped_attributes_are_parked() {
    let cases = [
        (
            r#"{"specversion":"1.0","id":"a","id":"b","source":"s","type":"x.y","schemaversion":1,"data":{}}"#,
            "attribute id appears more than once",
        ),
        (
            r#"{"specversion":"1.0","id":"a","source":"s","type":"x.y","schemaversion":1,"data":{},"data":[]}"#,
            "attribute data appears more than once",
        ),
        (
            r#"{"specversion":1.0,"id":"a","source":"s","type":"x.y","schemaversion":1,"data":{}}"#,
            "attribute specversion is not a string",
        ),
        (
            r#"{"specversion":"1.0","id":1,"source":"s","type":"x.y","schemaversion":1,"data":{}}"#,
            "attribute id is not a string",
        ),
        (
            r#"{"specversion":"1.0","id":"a","source":true,"type":"x.y","schemaversion":1,"data":{}}"#,
            "attribute source is not a string",
        ),
        (
            r#"{"specversion":"1.0","id":"a","source":"s","type":"x.y","dataschema":2,"data":{}}"#,
            "attribute dataschema is not a string",
        ),
    ];
    for (value, reason) in cases {
        match structured("application/cloudevents+json", value) {
            Err(err) => assert!(err.starts_with(reason), "{value}: {err:?} should start with {reason:?}"),
            Ok((m, _)) => panic!("{value}: expected {reason:?}, read {m:?}"),
        }
    }
    // An extension may be a number or a boolean.
    let ok = r#"{"specversion":"1.0","id":"a","source":"s","type":"x.y","schemaversion":1,"aggregateversion":4,"flag":true,"data":{}}"#;
    assert_eq!(structured("application/cloudevents+json", ok).expect("read").0.aggregate_version, Some(4));

    let twice = [
        OK.as_slice(),
        &[("Content-Type", "application/json"), ("content-type", "application/cloudevents+json")],
    ]
    .concat();
    assert_eq!(
        meta(&twice, b"{}").unwrap_err(),
        "header content-type appears more than once (in different cases)"
    );
    let empty_subject = [OK.as_slice(), &[("ce_subject", "")]].concat();
    assert_eq!(
        meta(&empty_subject, b"{}").expect("applies").aggregate_id.as_deref(),
        Some("k"),
        "an empty subject falls back to the key"
    );
}

/// The idempotency key is the same for every delivery of an event to one consumer (any
/// partition, offset, or a record rebuilt from the parked table), and differs between
/// consumers and between events.
#[test]
fn the_idempotency_key_depends_on_the_consumer_and_the_event_only() {
    let key = |consumer: &str, place: (&str, i32, i64), id: &str| {
        let headers = [&[("ce_id", id)], &OK[1..]].concat();
        let incoming = Incoming::new(
            place.0,
            place.1,
            place.2,
            Some(b"k".to_vec()),
            Some(b"{}".to_vec()),
            raw(&headers),
        )
        .for_consumer(&std::sync::Arc::from(consumer));
        let meta = incoming.meta.expect("meta");
        assert_eq!(meta.consumer(), consumer);
        meta.idempotency_key()
    };
    let first = key("billing", ("t", 0, 5), ID);
    assert_eq!(first, key("billing", ("t", 3, 900), ID), "a redelivery elsewhere has the same key");
    assert_ne!(first, key("shipping", ("t", 0, 5), ID), "another consumer has its own");
    assert_ne!(first, key("billing", ("t", 0, 5), "0190d5a2-8f7e-7a1c-9d5e-3f2b1a0c9e8e"));
    // Fixed by the namespace and the name (consumer, NUL, event id bytes): it never changes
    // between versions of this library, or a receiver would see a new key after an upgrade.
    let mut name = b"billing\0".to_vec();
    name.extend_from_slice(uuid::Uuid::parse_str(ID).expect("uuid").as_bytes());
    assert_eq!(first, uuid::Uuid::new_v5(&crate::inbox::IDEMPOTENCY_NAMESPACE, &name));
    assert_eq!(
        first.to_string(),
        "1355c06e-ff82-53e3-9d08-27a5f90e1fb4",
        "pinned (Python: uuid5 of the same bytes)"
    );
}

/// The heap bytes an `Incoming` holds: what a record weighs once a worker has read it.
fn held_bytes(incoming: &Incoming) -> usize {
    incoming.topic.capacity()
        + incoming.key.as_ref().map_or(0, Vec::capacity)
        + incoming.payload.capacity()
        + incoming.data.as_ref().map_or(0, Vec::capacity)
        + incoming.headers.iter().map(|(k, v)| k.capacity() + v.capacity()).sum::<usize>()
        + incoming
            .raw_headers
            .iter()
            .map(|h| h.name.as_ref().map_or(0, Vec::capacity) + h.value.as_ref().map_or(0, Vec::capacity))
            .sum::<usize>()
}

/// What a record is charged against the memory budget when received covers what it holds
/// once read: in structured mode the event's data is a second copy of most of the value.
/// Before, a structured record of 64 KiB was charged about half of what it held.
#[test]
fn a_record_is_charged_at_least_what_it_holds_once_read() {
    let pad = "x".repeat(64 * 1024);
    let structured = format!(
        r#"{{"specversion":"1.0","id":"{ID}","source":"/tests","type":"x.y","schemaversion":1,"data":{{"pad":"{pad}"}}}}"#
    );
    let base64 = format!(
        r#"{{"specversion":"1.0","id":"{ID}","source":"/tests","type":"x.y","schemaversion":1,"data_base64":"{}"}}"#,
        {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD.encode(format!("\"{pad}\""))
        }
    );
    let binary = format!(r#"{{"pad":"{pad}"}}"#);
    let ct = [("content-type", "application/cloudevents+json; charset=utf-8")];
    let cases: [(&str, Vec<RawHeader>, &str); 4] = [
        ("structured", raw(&ct), &structured),
        ("structured, data_base64", raw(&ct), &base64),
        ("structured, upper case", raw(&[("Content-Type", "APPLICATION/CLOUDEVENTS+JSON")]), &structured),
        ("binary", raw(&OK), &binary),
    ];
    for (case, headers, value) in cases {
        let received =
            Received::for_test("topic", Some(b"key".to_vec()), Some(value.as_bytes().to_vec()), headers);
        let charged = received.size();
        let incoming = Incoming::read(received);
        assert!(incoming.meta.is_ok(), "{case}: {:?}", incoming.meta);
        let held = held_bytes(&incoming);
        assert!(charged >= held, "{case}: charged {charged} bytes, holds {held}");
    }
}
