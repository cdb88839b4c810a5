//! The generated consumer types: current with the committed schemas, and faithful to the
//! producer's structs in both directions.

use std::path::PathBuf;

use outbox_examples::consumer_types::{self, decode, DecodeError, Event};
use outbox_examples::events::{OrderConfirmed, OrderConfirmedV1, OrderLine, OrderPlaced, Payment};
use outbox_runtime::typegen::{write_or_check, Status};
use outbox_runtime::OutboxEvent;
use serde::de::DeserializeOwned;
use serde::Serialize;
use uuid::Uuid;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn generated_file_is_current() {
    let status =
        write_or_check(&root().join("schemas"), &root().join("examples/src/consumer_types.rs"), true)
            .expect("generate");
    assert_eq!(
        status,
        Status::UpToDate,
        "run `cargo xtask typegen` and commit examples/src/consumer_types.rs"
    );
}

/// producer struct -> JSON -> generated type -> JSON -> producer struct.
fn round_trip<P, G>(event: &P)
where
    P: OutboxEvent + DeserializeOwned + PartialEq + std::fmt::Debug,
    G: Serialize + DeserializeOwned,
{
    let json = serde_json::to_vec(event).expect("producer serializes");
    let generated: G = serde_json::from_slice(&json).expect("the generated type decodes the producer's JSON");
    let again = serde_json::to_value(&generated).expect("generated serializes");
    let back: P = serde_json::from_value(again).expect("the producer decodes the generated type's JSON");
    assert_eq!(&back, event);
    assert!(
        decode(P::EVENT_TYPE, P::SCHEMA_VERSION, &json).is_ok(),
        "decode dispatches {} v{}",
        P::EVENT_TYPE,
        P::SCHEMA_VERSION
    );
}

#[test]
fn every_example_event_round_trips_through_its_generated_type() {
    let id = Uuid::from_u128(7);
    round_trip::<_, consumer_types::OrderPlacedV1>(&OrderPlaced {
        order_id: id,
        customer_id: Uuid::from_u128(8),
        lines: vec![OrderLine { sku: "a".into(), quantity: 2 }, OrderLine { sku: "b".into(), quantity: 1 }],
        total_cents: 1250,
    });
    round_trip::<_, consumer_types::OrderConfirmedV1>(&OrderConfirmedV1 { order_id: id, total_cents: -5 });
    for (payment, note) in [
        (Payment::Card { last4: "4242".into() }, None),
        (Payment::Invoice { due_days: 30 }, Some("leave at the door".to_owned())),
    ] {
        round_trip::<_, consumer_types::OrderConfirmedV2>(&OrderConfirmed {
            order_id: id,
            total_cents: i64::MAX,
            currency: "EUR".into(),
            payment,
            note,
        });
    }
}

#[test]
fn decode_dispatches_on_type_and_version_and_names_unknown_pairs() {
    let v1 =
        serde_json::to_vec(&OrderConfirmedV1 { order_id: Uuid::from_u128(1), total_cents: 3 }).expect("json");
    match decode("order.confirmed", 1, &v1).expect("decodes") {
        Event::OrderConfirmed(consumer_types::OrderConfirmed::V1(e)) => assert_eq!(e.total_cents, 3),
        other => panic!("wrong variant {other:?}"),
    }
    let unknown = decode("order.confirmed", 9, &v1).expect_err("unknown version");
    assert!(matches!(unknown, DecodeError::Unknown { schema_version: 9, .. }));
    assert_eq!(unknown.to_string(), "unknown event type order.confirmed version 9: no committed schema");
    let bad = decode("order.confirmed", 2, &v1).expect_err("v1 payload is not v2");
    assert!(
        bad.to_string().starts_with("payload does not decode as order.confirmed v2: missing field"),
        "{bad}"
    );
}

/// A payload whose values do not fit: the error says where and what kind of mismatch, and
/// neither its `Display` (what `HandlerError::permanent` records) nor its `Debug` carries a
/// value of the payload (serde_json's message quotes it: a customer's e-mail address landed
/// in parked reasons). serde_json's error stays reachable for code.
#[test]
fn decode_errors_never_carry_a_payload_value() {
    let secret = "someone@example.com";
    let id = Uuid::from_u128(1);
    let v2 = |total: serde_json::Value, payment: serde_json::Value| serde_json::json!({"order_id": id, "total_cents": total, "currency": "EUR", "payment": payment});
    let card = serde_json::json!({"method": "card", "last4": "4242"});
    for (version, payload, kind) in [
        (
            1,
            serde_json::json!({"order_id": id, "total_cents": secret}),
            Some("invalid type: string, expected i64"),
        ),
        (1, serde_json::json!({"order_id": secret, "total_cents": 1}), None),
        (2, v2(serde_json::json!(secret), card.clone()), Some("invalid type: string, expected i64")),
        (2, v2(serde_json::json!(1), serde_json::json!({"method": secret, "last4": "1"})), None),
        (
            2,
            v2(serde_json::json!(1), card)
                .as_object()
                .map(|o| {
                    let mut o = o.clone();
                    o.insert("note".into(), serde_json::json!({ secret: secret }));
                    serde_json::Value::Object(o)
                })
                .expect("object"),
            None,
        ),
    ] {
        let error = decode("order.confirmed", version, payload.to_string().as_bytes()).expect_err("refused");
        let (shown, debug) = (error.to_string(), format!("{error:?}"));
        assert!(
            shown.starts_with(&format!("payload does not decode as order.confirmed v{version}: ")),
            "{shown}"
        );
        if let Some(kind) = kind {
            assert!(shown.contains(kind), "{shown}");
        }
        assert!(shown.contains("(line 1, column "), "{shown}");
        assert!(!shown.contains("someone") && !debug.contains("someone"), "{shown} / {debug}");
        assert!(matches!(error, DecodeError::Payload { .. }), "{error:?}");
        assert!(std::error::Error::source(&error).is_none(), "no chain that would print serde's message");
    }
    // serde_json's own message, the ground truth, quotes the value.
    let bad = serde_json::json!({"order_id": id, "total_cents": secret}).to_string();
    let DecodeError::Payload { source, .. } =
        decode("order.confirmed", 1, bad.as_bytes()).expect_err("refused")
    else {
        panic!("a payload error")
    };
    assert!(source.to_string().contains(secret), "{source}");
}
