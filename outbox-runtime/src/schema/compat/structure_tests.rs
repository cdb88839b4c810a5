//! The checker's rules inside structures, in both directions (see `tests` for `judge`):
//! tagged variants, array items and tuples, map values, definitions and recursion, allOf,
//! free-form, boolean and unknown-keyword schemas, and the paths it reports.

use serde_json::{json, Value};

use super::tests::{at, judge, none, object};
use super::Rule;

fn tagged(variants: &[(&str, Value)]) -> Value {
    let variants: Vec<Value> = variants
        .iter()
        .map(|(tag, props)| {
            let mut p = props.clone();
            p["method"] = json!({ "type": "string", "const": tag });
            let mut required = vec![json!("method")];
            required.extend(props.as_object().into_iter().flat_map(|o| o.keys()).map(|k| json!(k)));
            json!({ "type": "object", "properties": p, "required": required })
        })
        .collect();
    json!({ "oneOf": variants })
}

#[test]
fn tagged_variant_added_breaks_forward_only() {
    let card = ("card", json!({ "last4": { "type": "string" } }));
    let cash = ("cash", json!({}));
    let old = tagged(std::slice::from_ref(&card));
    let new = tagged(&[card, cash]);
    assert_eq!(judge(old, new), (none(), at("$", Rule::VariantNotAccepted)));
}

#[test]
fn tagged_variant_removed_breaks_backward_only() {
    let card = ("card", json!({ "last4": { "type": "string" } }));
    let invoice = ("invoice", json!({ "due_days": { "type": "integer", "format": "uint16", "minimum": 0 } }));
    assert_eq!(
        judge(tagged(&[card.clone(), invoice]), tagged(&[card])),
        (at("$", Rule::VariantNotAccepted), none())
    );
}

#[test]
fn tagged_variant_field_changed_is_reported_inside_the_matching_variant() {
    let old = tagged(&[
        ("card", json!({ "last4": { "type": "string" } })),
        ("invoice", json!({ "due_days": { "type": "integer", "format": "uint16", "minimum": 0 } })),
    ]);
    let new = tagged(&[
        ("card", json!({ "last4": { "type": "integer" } })),
        ("invoice", json!({ "due_days": { "type": "integer", "format": "uint16", "minimum": 0 } })),
    ]);
    assert_eq!(judge(old, new), (at("$.last4", Rule::TypeChanged), at("$.last4", Rule::TypeChanged)));
}

#[test]
fn array_items_type_changed_names_the_item_path() {
    let line = |qty: Value| object(json!({ "sku": { "type": "string" }, "qty": qty }), &["sku", "qty"]);
    let old = object(
        json!({ "lines": { "type": "array", "items": line(json!({ "type": "integer" })) } }),
        &["lines"],
    );
    let new = object(
        json!({ "lines": { "type": "array", "items": line(json!({ "type": "string" })) } }),
        &["lines"],
    );
    assert_eq!(
        judge(old, new),
        (at("$.lines[*].qty", Rule::TypeChanged), at("$.lines[*].qty", Rule::TypeChanged))
    );
}

#[test]
fn array_made_unique_breaks_backward_only() {
    let old = json!({ "type": "array", "items": { "type": "string" } });
    let new = json!({ "type": "array", "items": { "type": "string" }, "uniqueItems": true });
    assert_eq!(judge(old, new), (at("$", Rule::ConstraintTightened), none()));
}

#[test]
fn tuple_prefix_items_compared_by_position() {
    let old = json!({ "type": "array", "prefixItems": [{ "type": "string" }, { "type": "integer" }], "items": false, "minItems": 2, "maxItems": 2 });
    let new = json!({ "type": "array", "prefixItems": [{ "type": "string" }, { "type": "number" }], "items": false, "minItems": 2, "maxItems": 2 });
    assert_eq!(judge(old, new), (none(), at("$[1]", Rule::TypeChanged)));
}

#[test]
fn map_value_type_changed_names_the_map_path() {
    let old = object(
        json!({ "attrs": { "type": "object", "additionalProperties": { "type": "string" } } }),
        &["attrs"],
    );
    let new = object(
        json!({ "attrs": { "type": "object", "additionalProperties": { "type": "integer" } } }),
        &["attrs"],
    );
    assert_eq!(judge(old, new), (at("$.attrs.*", Rule::TypeChanged), at("$.attrs.*", Rule::TypeChanged)));
}

#[test]
fn map_keys_may_collide_with_reader_properties() {
    // A writer map of strings read by a struct with an optional integer property `n`.
    let old = json!({ "type": "object", "additionalProperties": { "type": "string" } });
    let new = object(json!({ "n": { "type": "integer" } }), &[]);
    let (backward, _) = judge(old, new);
    assert_eq!(backward, at("$.n", Rule::TypeChanged));
}

#[test]
fn renamed_definition_is_not_a_change() {
    let addr = object(json!({ "zip": { "type": "string" } }), &["zip"]);
    let old = json!({ "$defs": { "Address": addr }, "type": "object",
        "properties": { "ship_to": { "$ref": "#/$defs/Address" } }, "required": ["ship_to"] });
    let new = json!({ "$defs": { "PostalAddress": addr }, "type": "object",
        "properties": { "ship_to": { "$ref": "#/$defs/PostalAddress" } }, "required": ["ship_to"] });
    assert_eq!(judge(old, new), (none(), none()));
}

#[test]
fn recursive_definitions_terminate_and_changes_inside_are_found() {
    let tree = |leaf: &str| {
        json!({ "$defs": { "Node": { "type": "object", "properties": {
            "value": { "type": leaf },
            "children": { "type": "array", "items": { "$ref": "#/$defs/Node" } } },
            "required": ["value", "children"] } }, "$ref": "#/$defs/Node" })
    };
    assert_eq!(judge(tree("integer"), tree("integer")), (none(), none()));
    assert_eq!(judge(tree("integer"), tree("number")), (none(), at("$.value", Rule::TypeChanged)));
}

#[test]
fn all_of_reader_needs_every_part() {
    let old = object(json!({ "a": { "type": "string" } }), &["a"]);
    let new = json!({ "allOf": [
        object(json!({ "a": { "type": "string" } }), &["a"]),
        object(json!({ "b": { "type": "string" } }), &["b"]) ] });
    let (backward, _) = judge(old, new);
    assert_eq!(backward, at("$.b", Rule::RequiredAdded));
}

#[test]
fn free_form_writer_cannot_satisfy_a_struct_reader() {
    let old = json!({ "type": "object" });
    let new = object(json!({ "id": { "type": "string" } }), &["id"]);
    let (backward, forward) = judge(old, new);
    assert!(backward.contains(&("$.id".to_owned(), Rule::RequiredAdded)), "{backward:?}");
    assert_eq!(forward, none());
}

#[test]
fn unknown_reader_keyword_cannot_be_proven() {
    let old = json!({ "type": "string" });
    let new = json!({ "type": "string", "not": { "const": "x" } });
    // The new reader has `not`: unproven. The new writer's `not` only restricts it.
    assert_eq!(judge(old, new), (at("$", Rule::CannotProve), none()));
}

#[test]
fn identical_unknown_keywords_on_both_sides_are_accepted() {
    let s = json!({ "type": "string", "not": { "const": "x" } });
    assert_eq!(judge(s.clone(), s), (none(), none()));
}

#[test]
fn false_schema_reader_accepts_nothing_and_false_writer_writes_nothing() {
    assert_eq!(judge(json!(false), json!({ "type": "string" })), (none(), at("$", Rule::TypeChanged)));
}

#[test]
fn unconstrained_writer_into_typed_reader_is_incompatible() {
    assert_eq!(judge(json!(true), json!({ "type": "string" })), (at("$", Rule::TypeChanged), none()));
}

#[test]
fn nested_property_paths_are_reported() {
    let old = object(
        json!({ "customer": object(json!({ "address": object(json!({ "zip": { "type": "string" } }), &["zip"]) }), &["address"]) }),
        &["customer"],
    );
    let new = object(
        json!({ "customer": object(json!({ "address": object(json!({ "zip": { "type": "integer" } }), &["zip"]) }), &["address"]) }),
        &["customer"],
    );
    assert_eq!(
        judge(old, new),
        (at("$.customer.address.zip", Rule::TypeChanged), at("$.customer.address.zip", Rule::TypeChanged))
    );
}
