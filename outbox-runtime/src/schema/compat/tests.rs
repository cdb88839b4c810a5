//! Each rule of the checker, in both directions. `judge(old, new)` returns what breaks
//! BACKWARD (new reads old) and FORWARD (old reads new) as (path, rule) pairs. The rules
//! inside structures (variants, items, maps, definitions) are in `structure_tests`.

use serde_json::{json, Value};

use super::*;
use crate::schema::SchemaDoc;

fn doc(name: &str, v: Value) -> SchemaDoc {
    SchemaDoc::from_value(name, v).expect("test schema is valid")
}

type Found = Vec<(String, Rule)>;

pub(super) fn judge(old: Value, new: Value) -> (Found, Found) {
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

pub(super) fn at(path: &str, rule: Rule) -> Found {
    vec![(path.to_owned(), rule)]
}

pub(super) fn object(props: Value, required: &[&str]) -> Value {
    json!({ "type": "object", "properties": props, "required": required })
}

pub(super) fn none() -> Found {
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

#[test]
fn registry_level_names_parse_to_a_mode_and_transitivity() {
    let parsed: Vec<_> =
        Level::NAMES.iter().map(|n| Level::from_name(n).map(|l| (l.mode, l.transitive))).collect();
    assert_eq!(
        parsed,
        [
            Some((None, false)),
            Some((Some(Mode::Backward), false)),
            Some((Some(Mode::Backward), true)),
            Some((Some(Mode::Forward), false)),
            Some((Some(Mode::Forward), true)),
            Some((Some(Mode::Full), false)),
            Some((Some(Mode::Full), true)),
        ]
    );
    for other in ["NONE_TRANSITIVE", "backward", "FULL_", "_TRANSITIVE", ""] {
        assert_eq!(Level::from_name(other), None, "{other:?}");
    }
}

/// A chain of `$ref`s to ever other definitions has no cycle to stop a checker: each
/// answers (past its bound, `cannot-prove`) rather than overflow the caller's stack.
#[test]
fn a_long_chain_of_refs_is_answered_not_a_stack_overflow() {
    // Past both checkers' bounds on nesting (1,024 levels).
    const LENGTH: usize = 1_500;
    let chain = |last: &str| {
        let mut defs = serde_json::Map::new();
        for i in 0..LENGTH {
            let next = format!("#/$defs/d{}", i + 1);
            defs.insert(
                format!("d{i}"),
                json!({ "type": "object", "properties": { "n": { "$ref": next } } }),
            );
        }
        defs.insert(format!("d{LENGTH}"), json!({ "type": last }));
        json!({ "$schema": "https://json-schema.org/draft/2020-12/schema", "$ref": "#/$defs/d0", "$defs": defs })
    };
    let (old, new) = (doc("old", chain("string")), doc("new", chain("integer")));
    for judge in [Judge::default(), Judge::new(Semantics::JsonSchema, Policy::Strict)] {
        let report = compare_with(&old, &new, Mode::Backward, judge);
        assert!(!report.is_compatible(), "{judge:?}: the change at the end of the chain is not passed");
    }
}
