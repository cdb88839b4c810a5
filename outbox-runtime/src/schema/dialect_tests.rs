//! Each dialect's documents rewritten into the 2020-12 vocabulary.

use serde_json::{json, Value};

use super::dialect::*;

fn canon(v: Value) -> (Dialect, Value) {
    canonical(&v).expect("a schema")
}

#[test]
fn every_dialect_is_known_by_its_uri_and_an_unknown_one_is_refused() {
    for d in Dialect::ALL {
        assert_eq!(Dialect::from_uri(d.uri()), Some(d));
    }
    assert_eq!(Dialect::from_uri("https://json-schema.org/draft-07/schema"), Some(Dialect::Draft7));
    assert_eq!(canon(json!({})).0, Dialect::Draft2020);
    let err = canonical(&json!({ "$schema": "http://example.com/mine" })).expect_err("unknown");
    assert_eq!(err.pointer, "/$schema");
    assert!(err.reason.contains("example.com/mine"), "{}", err.reason);
}

#[test]
fn draft_04_exclusive_bounds_and_ids_become_the_2020_12_form() {
    let (d, out) = canon(json!({
        "$schema": "http://json-schema.org/draft-04/schema#", "id": "http://x/y.json",
        "properties": {
            "a": { "minimum": 1, "exclusiveMinimum": true, "maximum": 5, "exclusiveMaximum": false },
            "b": { "$ref": "http://x/y.json#/definitions/B" },
            "c": { "$ref": "#named" }
        },
        "definitions": { "B": { "type": "string" }, "N": { "id": "#named", "type": "integer" } }
    }));
    assert_eq!(d, Dialect::Draft4);
    assert_eq!(out["properties"]["a"], json!({ "exclusiveMinimum": 1, "maximum": 5 }));
    assert_eq!(out["$id"], "http://x/y.json");
    assert_eq!(out["properties"]["b"]["$ref"], "#/definitions/B");
    assert_eq!(out["properties"]["c"]["$ref"], "#/definitions/N");
    let err =
        canonical(&json!({ "$schema": "http://json-schema.org/draft-07/schema#", "exclusiveMinimum": true }))
            .expect_err("a boolean in draft-07");
    assert_eq!(err.pointer, "/exclusiveMinimum");
}

#[test]
fn tuples_dependencies_and_ref_siblings_follow_their_dialect() {
    let (_, out) = canon(json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "items": [ { "type": "string" }, { "$ref": "#/items/0", "maxLength": 3 } ],
        "additionalItems": false,
        "dependencies": { "a": ["b"], "c": { "required": ["d"] } },
        "dependentRequired": { "x": ["y"] }
    }));
    assert_eq!(out["prefixItems"][0], json!({ "type": "string" }));
    assert_eq!(out["items"], json!(false));
    // Up to draft-07 the sibling of a `$ref` means nothing; the ref follows its target.
    assert_eq!(out["prefixItems"][1]["$ref"], "#/prefixItems/0");
    assert_eq!(out["prefixItems"][1][IGNORED], json!({ "maxLength": 3 }));
    assert_eq!(out["dependentRequired"], json!({ "a": ["b"] }));
    assert_eq!(out["dependentSchemas"], json!({ "c": { "required": ["d"] } }));
    assert_eq!(out[IGNORED], json!({ "dependentRequired": { "x": ["y"] } }), "a 2019-09 keyword in draft-07");

    let (_, out) = canon(json!({ "$schema": "https://json-schema.org/draft/2019-09/schema",
        "items": { "type": "string" }, "additionalItems": false, "dependencies": {} }));
    assert_eq!(out["items"], json!({ "type": "string" }));
    assert!(out.get("additionalItems").is_none() && out[IGNORED].get("additionalItems").is_some(), "{out}");
    assert!(out[IGNORED].get("dependencies").is_some(), "{out}");
    let err = canonical(&json!({ "items": [ {} ] })).expect_err("2020-12 has no tuple items");
    assert_eq!(err.pointer, "/items");
}

#[test]
fn a_2020_12_document_is_unchanged() {
    let doc = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$defs": { "A": { "type": "string" } },
        "prefixItems": [ { "$ref": "#/$defs/A", "minLength": 1 } ], "items": false,
        "if": { "minItems": 1 }, "then": { "maxItems": 3 }
    });
    assert_eq!(canon(doc.clone()).1, doc);
}
