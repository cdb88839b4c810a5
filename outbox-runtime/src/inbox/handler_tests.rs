//! Handler errors.

use super::*;

/// A catch-all arm's error names the event and nothing of its payload (the README's
/// old `format!("{other:?}")` put a customer's e-mail address into parked reasons).
#[test]
fn an_unhandled_event_is_named_by_type_version_and_id_only() {
    let meta = Meta {
        event_id: Uuid::from_u128(7),
        id: "7".into(),
        source: "/orders".into(),
        dataschema: None,
        structured: false,
        event_type: "order.placed".into(),
        schema_version: 3,
        aggregate_type: Some("order".into()),
        aggregate_id: Some("someone@example.com".into()),
        aggregate_version: Some(2),
        time: None,
        topic: "orders".into(),
        partition: 0,
        offset: 9,
        headers: BTreeMap::from([("x-customer".to_owned(), "someone@example.com".to_owned())]),
        registry_schema: None,
        consumer: Arc::from("billing"),
    };
    let error = HandlerError::unhandled(&meta);
    assert!(!error.is_transient(), "parked, not retried");
    assert_eq!(
        error.reason_with_causes(),
        "not handled here: order.placed v3 (event 00000000-0000-0000-0000-000000000007)"
    );
}
