//! Each rule of the checker, in both directions. `judge(old, new)` returns what breaks
//! BACKWARD (new reads old) and FORWARD (old reads new) as (path, rule) pairs.

use serde_json::{json, Value};

use super::*;
use crate::schema::SchemaDoc;

fn doc(name: &str, v: Value) -> SchemaDoc {
    SchemaDoc::from_value(name, v).expect("test schema is valid")
}

type Found = Vec<(String, Rule)>;

fn judge(old: Value, new: Value) -> (Found, Found) {
    let report = compare(&doc("old", old), &doc("new", new), Mode::Full);
    let pick = |d: Direction| -> Found {
        report
            .incompatibilities
            .iter()
            .filter(|i| i.direction == d)
            .map(|i| (i.path.clone(), i.rule))
            .collect()
    };
    (pick(Direction::Backward), pick(Direction::Forward))
}

fn at(path: &str, rule: Rule) -> Found {
    vec![(path.to_owned(), rule)]
}

fn object(props: Value, required: &[&str]) -> Value {
    json!({ "type": "object", "properties": props, "required": required })
}

fn none() -> Found {
    Vec::new()
}

#[test]
fn identical_schemas_are_full_compatible() {
    let s = object(json!({ "id": { "type": "string", "format": "uuid" } }), &["id"]);
    assert_eq!(judge(s.clone(), s), (none(), none()));
}

#[test]
fn annotations_are_not_a_change() {
    let old = object(json!({ "n": { "type": "integer", "description": "old" } }), &["n"]);
    let mut new = object(json!({ "n": { "type": "integer", "description": "new", "title": "N" } }), &["n"]);
    new["$comment"] = json!("generated");
    new["x-outbox"] = json!({ "topic": "t" });
    assert_eq!(judge(old, new), (none(), none()));
}

#[test]
fn required_added_breaks_backward_only() {
    let old = object(json!({ "a": { "type": "string" } }), &["a"]);
    let new = object(json!({ "a": { "type": "string" }, "b": { "type": "string" } }), &["a", "b"]);
    assert_eq!(judge(old, new), (at("$.b", Rule::RequiredAdded), none()));
}

#[test]
fn required_removed_breaks_forward_only() {
    let old = object(json!({ "a": { "type": "string" }, "b": { "type": "string" } }), &["a", "b"]);
    let new = object(json!({ "a": { "type": "string" } }), &["a"]);
    assert_eq!(judge(old, new), (none(), at("$.b", Rule::RequiredAdded)));
}

#[test]
fn required_made_optional_breaks_forward_only() {
    let old = object(json!({ "a": { "type": "string" } }), &["a"]);
    let new = object(json!({ "a": { "type": "string" } }), &[]);
    assert_eq!(judge(old, new), (none(), at("$.a", Rule::RequiredAdded)));
}

#[test]
fn optional_added_is_full_compatible_with_open_readers() {
    let old = object(json!({ "a": { "type": "string" } }), &["a"]);
    let new = object(json!({ "a": { "type": "string" }, "b": { "type": "integer" } }), &["a"]);
    assert_eq!(judge(old, new), (none(), none()));
}

#[test]
fn field_with_default_added_is_full_compatible() {
    // `#[serde(default)]`: schemars leaves the field out of `required` and states the default.
    let old = object(json!({ "a": { "type": "string" } }), &["a"]);
    let new = object(json!({ "a": { "type": "string" }, "n": { "type": "integer", "default": 0 } }), &["a"]);
    assert_eq!(judge(old, new), (none(), none()));
}

#[test]
fn closed_reader_rejects_new_property_forward() {
    let mut old = object(json!({ "a": { "type": "string" } }), &["a"]);
    old["additionalProperties"] = json!(false);
    let mut new = object(json!({ "a": { "type": "string" }, "b": { "type": "string" } }), &["a"]);
    new["additionalProperties"] = json!(false);
    assert_eq!(judge(old, new), (none(), at("$.b", Rule::ClosedReader)));
}

#[test]
fn closed_reader_rejects_removed_property_backward() {
    let mut old = object(json!({ "a": { "type": "string" }, "b": { "type": "string" } }), &["a"]);
    old["additionalProperties"] = json!(false);
    let mut new = object(json!({ "a": { "type": "string" } }), &["a"]);
    new["additionalProperties"] = json!(false);
    assert_eq!(judge(old, new), (at("$.b", Rule::ClosedReader), none()));
}

#[test]
fn type_changed_breaks_both_directions() {
    let old = object(json!({ "total": { "type": "integer" } }), &["total"]);
    let new = object(json!({ "total": { "type": "string" } }), &["total"]);
    assert_eq!(judge(old, new), (at("$.total", Rule::TypeChanged), at("$.total", Rule::TypeChanged)));
}

#[test]
fn integer_widened_to_number_breaks_forward_only() {
    let old = json!({ "type": "integer" });
    let new = json!({ "type": "number" });
    assert_eq!(judge(old, new), (none(), at("$", Rule::TypeChanged)));
}

#[test]
fn integer_format_widened_breaks_forward_only() {
    let old = json!({ "type": "integer", "format": "uint32", "minimum": 0 });
    let new = json!({ "type": "integer", "format": "uint64", "minimum": 0 });
    assert_eq!(judge(old, new), (none(), at("$", Rule::RangeNarrowed)));
}

#[test]
fn integer_signedness_changed_breaks_both_directions() {
    let old = json!({ "type": "integer", "format": "int64" });
    let new = json!({ "type": "integer", "format": "uint64", "minimum": 0 });
    assert_eq!(judge(old, new), (at("$", Rule::RangeNarrowed), at("$", Rule::RangeNarrowed)));
}

#[test]
fn integer_same_width_formats_are_equal() {
    // i64's schema with and without explicit bounds admits the same values.
    let old = json!({ "type": "integer", "format": "int64" });
    let new = json!({ "type": "integer", "format": "int64", "minimum": -9223372036854775808i64, "maximum": 9223372036854775807i64 });
    assert_eq!(judge(old, new), (none(), none()));
}

#[test]
fn minimum_raised_breaks_backward_only() {
    let old = json!({ "type": "integer", "minimum": 0 });
    let new = json!({ "type": "integer", "minimum": 1 });
    assert_eq!(judge(old, new), (at("$", Rule::RangeNarrowed), none()));
}

#[test]
fn exclusive_maximum_is_tighter_than_inclusive() {
    let old = json!({ "type": "number", "maximum": 10 });
    let new = json!({ "type": "number", "exclusiveMaximum": 10 });
    assert_eq!(judge(old, new), (at("$", Rule::RangeNarrowed), none()));
}

#[test]
fn multiple_of_added_breaks_backward_only() {
    let old = json!({ "type": "integer" });
    let new = json!({ "type": "integer", "multipleOf": 5 });
    assert_eq!(judge(old, new), (at("$", Rule::ConstraintTightened), none()));
}

#[test]
fn nullable_added_breaks_forward_only() {
    let old = object(json!({ "note": { "type": "string" } }), &["note"]);
    let new = object(json!({ "note": { "type": ["string", "null"] } }), &["note"]);
    assert_eq!(judge(old, new), (none(), at("$.note", Rule::NullNotAccepted)));
}

#[test]
fn nullable_removed_breaks_backward_only() {
    let old = json!({ "anyOf": [{ "type": "string" }, { "type": "null" }] });
    let new = json!({ "type": "string" });
    assert_eq!(judge(old, new), (at("$", Rule::NullNotAccepted), none()));
}

#[test]
fn nullable_type_array_and_any_of_null_are_equal() {
    let old = json!({ "type": ["string", "null"] });
    let new = json!({ "anyOf": [{ "type": "string" }, { "type": "null" }] });
    assert_eq!(judge(old, new), (none(), none()));
}

#[test]
fn nullable_ref_through_any_of() {
    // Option<Address>: schemars writes anyOf [$ref, null].
    let defs = json!({ "Address": object(json!({ "zip": { "type": "string" } }), &["zip"]) });
    let old = json!({ "$defs": defs, "anyOf": [{ "$ref": "#/$defs/Address" }, { "type": "null" }] });
    let new = json!({ "$defs": defs, "$ref": "#/$defs/Address" });
    assert_eq!(judge(old, new), (at("$", Rule::NullNotAccepted), none()));
}

#[test]
fn format_added_breaks_backward_only() {
    let old = object(json!({ "id": { "type": "string" } }), &["id"]);
    let new = object(json!({ "id": { "type": "string", "format": "uuid" } }), &["id"]);
    assert_eq!(judge(old, new), (at("$.id", Rule::FormatAdded), none()));
}

#[test]
fn format_changed_breaks_both_directions() {
    let old = json!({ "type": "string", "format": "date-time" });
    let new = json!({ "type": "string", "format": "date" });
    assert_eq!(judge(old, new), (at("$", Rule::FormatAdded), at("$", Rule::FormatAdded)));
}

#[test]
fn enum_value_added_breaks_forward_only() {
    let old = json!({ "type": "string", "enum": ["card", "invoice"] });
    let new = json!({ "type": "string", "enum": ["card", "invoice", "cash"] });
    assert_eq!(judge(old, new), (none(), at("$", Rule::ValueNotAccepted)));
}

#[test]
fn enum_value_removed_breaks_backward_only() {
    let old = json!({ "type": "string", "enum": ["card", "invoice"] });
    let new = json!({ "type": "string", "enum": ["card"] });
    assert_eq!(judge(old, new), (at("$", Rule::ValueNotAccepted), none()));
}

#[test]
fn string_narrowed_to_enum_breaks_backward_only() {
    let old = json!({ "type": "string" });
    let new = json!({ "type": "string", "enum": ["a", "b"] });
    assert_eq!(judge(old, new), (at("$", Rule::ValueNotAccepted), none()));
}

#[test]
fn const_changed_breaks_both_directions() {
    let old = json!({ "const": "v1" });
    let new = json!({ "const": "v2" });
    assert_eq!(judge(old, new), (at("$", Rule::ValueNotAccepted), at("$", Rule::ValueNotAccepted)));
}

#[test]
fn boolean_reader_enum_of_both_values_accepts_any_boolean() {
    let old = json!({ "type": "boolean" });
    let new = json!({ "enum": [true, false] });
    assert_eq!(judge(old, new), (none(), none()));
}

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
fn max_length_tightened_breaks_backward_only() {
    let old = json!({ "type": "string", "maxLength": 20 });
    let new = json!({ "type": "string", "maxLength": 10 });
    assert_eq!(judge(old, new), (at("$", Rule::ConstraintTightened), none()));
}

#[test]
fn pattern_added_breaks_backward_only() {
    let old = json!({ "type": "string" });
    let new = json!({ "type": "string", "pattern": "^[A-Z]{3}$" });
    assert_eq!(judge(old, new), (at("$", Rule::ConstraintTightened), none()));
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

#[test]
fn reasons_are_readable() {
    let old = json!({ "type": "integer", "format": "uint64", "minimum": 0 });
    let new = json!({ "type": "integer", "format": "uint32", "minimum": 0 });
    let report = compare(&doc("old", old), &doc("new", new), Mode::Backward);
    let text = report.incompatibilities[0].to_string();
    assert_eq!(
        text,
        "$: the reader accepts integers from 0 to 4294967295 (uint32); the writer may write integers from 0 to 18446744073709551615 (uint64) [range-narrowed, backward (new reads old)]"
    );
}

#[test]
fn modes_check_their_directions_only() {
    let old = json!({ "type": "integer" });
    let new = json!({ "type": "number" });
    assert!(compare(&doc("o", old.clone()), &doc("n", new.clone()), Mode::Backward).is_compatible());
    assert!(!compare(&doc("o", old.clone()), &doc("n", new.clone()), Mode::Forward).is_compatible());
    assert!(!compare(&doc("o", old), &doc("n", new), Mode::Full).is_compatible());
}

#[test]
fn transitive_compares_against_every_older_schema() {
    let v1 = doc("v1", object(json!({ "a": { "type": "string" } }), &["a"]));
    let v2 = doc("v2", object(json!({ "a": { "type": "string" }, "b": { "type": "string" } }), &["a"]));
    let v3 = doc("v3", object(json!({ "a": { "type": "string" }, "b": { "type": "string" } }), &["a", "b"]));
    // v3 reads v2 data only when b is present; neither v1 nor v2 guarantees it.
    let report = compare_transitive(&[v1, v2], &v3, Mode::Backward);
    let paths: Vec<&str> = report.incompatibilities.iter().map(|i| i.path.as_str()).collect();
    assert_eq!(paths, ["v1 $.b", "v2 $.b"]);
}

#[test]
fn unknown_mode_is_an_error_naming_it() {
    let err = "sideways".parse::<Mode>().unwrap_err();
    assert_eq!(
        err.to_string(),
        "unknown compatibility mode \"sideways\": expected backward, forward or full"
    );
    assert_eq!("full".parse::<Mode>(), Ok(Mode::Full));
}

#[test]
fn bad_input_names_the_source() {
    let not_json = SchemaDoc::from_str("a.json", "{ nope").unwrap_err();
    assert!(matches!(not_json, crate::schema::InputError::NotJson { .. }));
    assert!(not_json.to_string().starts_with("a.json: not JSON"), "{not_json}");

    let not_schema = SchemaDoc::from_str("b.json", "[1, 2]").unwrap_err();
    assert!(not_schema.to_string().starts_with("b.json: not a JSON Schema"), "{not_schema}");

    let bad_type =
        SchemaDoc::from_str("c.json", r#"{ "properties": { "x": { "type": "text" } } }"#).unwrap_err();
    assert!(bad_type.to_string().contains("/properties/x/type"), "{bad_type}");

    let bad_ref = SchemaDoc::from_str("d.json", r##"{ "$ref": "#/$defs/Missing" }"##).unwrap_err();
    assert_eq!(
        bad_ref.to_string(),
        "d.json: unresolvable $ref \"#/$defs/Missing\" at /$ref (only references inside the document, like \"#/$defs/Name\", are supported)"
    );
    let remote = SchemaDoc::from_str("e.json", r#"{ "$ref": "https://example.com/s.json" }"#).unwrap_err();
    assert!(matches!(remote, crate::schema::InputError::UnresolvableRef { .. }));
}
