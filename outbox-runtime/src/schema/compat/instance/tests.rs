//! Instance semantics, keyword by keyword: `reads(w, r)` is whether every value `w`
//! accepts, `r` accepts, as the checker proves it.

use serde_json::{json, Value};

use super::includes;
use crate::schema::compat::Rule;
use crate::schema::SchemaDoc;

fn doc(v: Value) -> SchemaDoc {
    SchemaDoc::from_value("t", v).expect("test schema is valid")
}

fn found(w: Value, r: Value) -> Vec<(String, Rule)> {
    includes(&doc(w), &doc(r), false).into_iter().map(|f| (f.path, f.rule)).collect()
}

fn reads(w: Value, r: Value) -> bool {
    found(w, r).is_empty()
}

#[track_caller]
fn yes(w: Value, r: Value) {
    let f = includes(&doc(w.clone()), &doc(r.clone()), false);
    assert!(f.is_empty(), "expected {r} to read everything {w} accepts, found {f:?}");
}

#[track_caller]
fn no(w: Value, r: Value) {
    assert!(!reads(w.clone(), r.clone()), "expected {r} NOT to read everything {w} accepts");
}

#[test]
fn identical_schemas_read_each_other_even_when_nothing_satisfies_them() {
    let never = json!({ "type": "string", "const": 5 });
    yes(never.clone(), never.clone());
    // And a writer nothing satisfies is read by anything.
    yes(never, json!(false));
}

#[test]
fn an_open_writer_may_hold_any_property_a_reader_adds() {
    let old = json!({ "type": "object", "properties": { "a": { "type": "string" } } });
    let new =
        json!({ "type": "object", "properties": { "a": { "type": "string" }, "b": { "type": "string" } } });
    assert_eq!(found(old.clone(), new.clone()), vec![("$.b".to_owned(), Rule::TypeChanged)]);
    yes(new.clone(), old.clone());
    // A closed writer does not write `b`.
    let mut closed = old.clone();
    closed["additionalProperties"] = json!(false);
    yes(closed, new);
    // A reader that closes refuses the open writer's other properties.
    let mut closed_reader = old.clone();
    closed_reader["additionalProperties"] = json!(false);
    assert_eq!(found(old, closed_reader), vec![("$.*".to_owned(), Rule::ClosedReader)]);
}

#[test]
fn draft_04_bounds_and_ids_are_read_as_draft_04() {
    let d4 = json!({ "$schema": "http://json-schema.org/draft-04/schema#", "id": "http://x/s.json",
        "type": "number", "minimum": 0, "exclusiveMinimum": true });
    let d7 = json!({ "$schema": "http://json-schema.org/draft-07/schema#", "type": "number", "exclusiveMinimum": 0 });
    yes(d4.clone(), d7.clone());
    yes(d7, d4.clone());
    no(json!({ "type": "number", "minimum": 0 }), d4);
    // Draft-04's `integer` refuses 3.0, which a later draft's integer may be written as.
    let int4 = json!({ "$schema": "http://json-schema.org/draft-04/schema#", "type": "integer" });
    let int7 = json!({ "$schema": "http://json-schema.org/draft-07/schema#", "type": "integer" });
    yes(int4.clone(), int7.clone());
    assert_eq!(found(int7, int4.clone()), vec![("$".to_owned(), Rule::TypeChanged)]);
    no(json!({ "enum": [1, 2] }), int4);
}

#[test]
fn dependencies_and_their_2019_09_split_mean_the_same() {
    let d7 = json!({ "$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
        "dependencies": { "a": ["b"], "c": { "required": ["d"] } } });
    let d2019 = json!({ "$schema": "https://json-schema.org/draft/2019-09/schema", "type": "object",
        "dependentRequired": { "a": ["b"] }, "dependentSchemas": { "c": { "required": ["d"] } } });
    yes(d7.clone(), d2019.clone());
    yes(d2019, d7.clone());
    no(json!({ "type": "object" }), d7);
    // The reader's dependency is kept by a writer that always has what it needs.
    yes(
        json!({ "type": "object", "properties": { "a": {}, "b": {} }, "required": ["b", "d"] }),
        json!({ "dependentRequired": { "a": ["b"] }, "dependentSchemas": { "c": { "required": ["d"] } } }),
    );
}

#[test]
fn not_is_proved_by_disjointness() {
    yes(json!({ "enum": ["a", "c"] }), json!({ "not": { "const": "b" } }));
    no(json!({ "enum": ["a", "b"] }), json!({ "not": { "const": "b" } }));
    yes(json!({ "type": "integer", "minimum": 5 }), json!({ "not": { "type": "integer", "maximum": 2 } }));
    yes(json!({ "type": "string" }), json!({ "not": { "type": "number" } }));
    no(json!({ "type": ["string", "number"] }), json!({ "not": { "type": "number" } }));
    // `not` read by `not`: the reader refuses less than the writer does.
    yes(json!({ "not": { "type": "number" } }), json!({ "not": { "type": "integer" } }));
    yes(json!({ "type": "string", "not": { "enum": ["a", "b"] } }), json!({ "not": { "const": "a" } }));
    no(json!({ "not": { "type": "integer" } }), json!({ "not": { "type": "number" } }));
}

/// Judging `not B` against a writer's `not A` asks whether B's values are A's: B read in
/// the reader's document and dialect, A in the writer's, and no policy's closed world.
#[test]
fn not_beside_not_reads_each_side_in_its_own_document() {
    // A `$ref` under the writer's `not` resolves in the writer's document: there A's `p`
    // is an integer, so the writer accepts {"p": 1.5}, which the reader refuses.
    let w = json!({ "not": { "properties": { "p": { "$ref": "#/$defs/A" } }, "required": ["p"] },
        "$defs": { "A": { "type": "integer" } } });
    let r = json!({ "not": { "properties": { "p": { "$ref": "#/$defs/A" } }, "required": ["p"] },
        "$defs": { "A": { "type": "number" } } });
    no(w.clone(), r.clone());
    yes(r, w);
    // draft-04's integer refuses 1.0, 2020-12's accepts it: the draft-04 writer under
    // `not: integer` accepts 1.0, which the 2020-12 reader's `not: integer` refuses.
    let d4 = json!({ "$schema": "http://json-schema.org/draft-04/schema#", "not": { "type": "integer" } });
    let d2020 =
        json!({ "$schema": "https://json-schema.org/draft/2020-12/schema", "not": { "type": "integer" } });
    no(d4.clone(), d2020.clone());
    yes(d2020, d4);
    // An open B is not A because B declares nothing: {"x": 5} is B's and not A's, so the
    // writer under `not A` writes it, and the reader under `not B` refuses it; under the
    // lenient policy too, whose closed world is the writer's, not B's.
    let w = json!({ "not": { "type": "object", "properties": { "x": { "type": "string" } } }, "properties": { "x": {} } });
    let r = json!({ "not": { "type": "object" } });
    no(w.clone(), r.clone());
    assert!(!includes(&doc(w), &doc(r), true).is_empty(), "lenient");
}

#[test]
fn contains_property_names_and_counts() {
    yes(
        json!({ "type": "array", "items": { "type": "string" }, "minItems": 1 }),
        json!({ "contains": { "type": "string" } }),
    );
    no(
        json!({ "type": "array", "items": { "type": "string" } }),
        json!({ "contains": { "type": "string" } }),
    );
    let closed =
        json!({ "type": "object", "properties": { "ab": {}, "abc": {} }, "additionalProperties": false });
    yes(closed.clone(), json!({ "propertyNames": { "maxLength": 3 } }));
    no(closed.clone(), json!({ "propertyNames": { "maxLength": 2 } }));
    no(json!({ "type": "object" }), json!({ "propertyNames": { "maxLength": 3 } }));
    yes(json!({ "type": "object", "required": ["a", "b"] }), json!({ "minProperties": 2 }));
    yes(closed.clone(), json!({ "maxProperties": 2 }));
    no(json!({ "type": "object", "properties": { "a": {} } }), json!({ "maxProperties": 2 }));
}

#[test]
fn if_then_else_is_judged_by_its_branches() {
    let w = json!({ "type": "object", "properties": { "kind": { "const": "a" }, "x": { "type": "string" } },
        "required": ["kind", "x"] });
    yes(
        w.clone(),
        json!({ "if": { "properties": { "kind": { "const": "a" } } }, "then": { "required": ["x"] } }),
    );
    no(w, json!({ "if": { "properties": { "kind": { "const": "a" } } }, "then": { "required": ["y"] } }));
    // A writer with a condition is judged by both of its branches.
    let cond =
        json!({ "if": { "type": "string" }, "then": { "maxLength": 3 }, "else": { "type": "integer" } });
    yes(cond.clone(), json!({ "anyOf": [ { "type": "string", "maxLength": 3 }, { "type": "integer" } ] }));
    no(cond, json!({ "type": "integer" }));
}

#[test]
fn pattern_properties_are_matched_by_name() {
    let w = json!({ "type": "object", "patternProperties": { "^x-": { "type": "string" } }, "additionalProperties": false });
    yes(w.clone(), json!({ "patternProperties": { "^x-": { "type": "string" } } }));
    yes(w.clone(), json!({ "additionalProperties": { "type": "string" } }));
    no(w.clone(), json!({ "additionalProperties": { "type": "integer" } }));
    // A declared name that a pattern matches is judged by both.
    yes(
        json!({ "type": "object", "properties": { "x-a": { "type": "string", "maxLength": 2 } }, "additionalProperties": false }),
        json!({ "patternProperties": { "^x-": { "maxLength": 5 } } }),
    );
    no(
        json!({ "type": "object", "properties": { "x-a": { "type": "string" } }, "additionalProperties": false }),
        json!({ "patternProperties": { "^x-": { "maxLength": 5 } } }),
    );
}

#[test]
fn one_of_needs_the_other_variants_disjoint() {
    let a = json!({ "type": "object", "properties": { "kind": { "const": "a" } }, "required": ["kind"] });
    let b = json!({ "type": "object", "properties": { "kind": { "const": "b" } }, "required": ["kind"] });
    let c = json!({ "type": "object", "properties": { "kind": { "const": "c" } }, "required": ["kind"] });
    yes(json!({ "oneOf": [a, b] }), json!({ "oneOf": [a, b, c] }));
    no(json!({ "oneOf": [a, b, c] }), json!({ "oneOf": [a, b] }));
    // Overlapping variants: a string of length 2 matches both, which oneOf refuses.
    no(json!({ "type": "string" }), json!({ "oneOf": [ { "type": "string" }, { "maxLength": 3 } ] }));
}

#[test]
fn constants_and_enums_are_judged_value_by_value() {
    yes(json!({ "const": 1 }), json!({ "enum": [1, 2] }));
    yes(json!({ "const": 1.0 }), json!({ "const": 1 }));
    no(json!({ "enum": [1, 3] }), json!({ "enum": [1, 2] }));
    yes(json!({ "type": "boolean" }), json!({ "enum": [true, false] }));
    no(json!({ "type": "string" }), json!({ "enum": ["a"] }));
    // A value the writer's own schema refuses is never written.
    yes(json!({ "enum": ["a", 5], "type": "string" }), json!({ "type": "string" }));
}

#[test]
fn numbers_and_strings() {
    yes(json!({ "type": "integer", "exclusiveMinimum": 0 }), json!({ "type": "integer", "minimum": 1 }));
    no(json!({ "type": "number", "exclusiveMinimum": 0 }), json!({ "type": "number", "minimum": 1 }));
    no(json!({ "type": "number" }), json!({ "type": "integer" }));
    yes(json!({ "type": "number", "multipleOf": 2 }), json!({ "type": "integer" }));
    yes(json!({ "type": "integer" }), json!({ "multipleOf": 0.5 }));
    yes(json!({ "multipleOf": 4 }), json!({ "multipleOf": 2 }));
    no(json!({ "multipleOf": 2 }), json!({ "multipleOf": 4 }));
    yes(json!({ "type": "string", "pattern": "^a" }), json!({ "pattern": "^a" }));
    yes(json!({ "type": "string" }), json!({ "pattern": ".*" }));
    no(json!({ "type": "string" }), json!({ "pattern": "^a" }));
    no(json!({ "type": "string" }), json!({ "format": "date-time" }));
    // Formats validators do not know are not checked by them.
    yes(json!({ "type": "string" }), json!({ "format": "x-mine" }));
    yes(json!({ "type": "string", "minLength": 2, "maxLength": 3 }), json!({ "maxLength": 5 }));
}

#[test]
fn arrays_and_tuples() {
    let tuple7 = json!({ "$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
        "items": [ { "type": "string" }, { "type": "integer" } ], "additionalItems": false });
    let tuple2020 = json!({ "type": "array", "prefixItems": [ { "type": "string" }, { "type": "integer" } ], "items": false });
    yes(tuple7.clone(), tuple2020.clone());
    yes(tuple2020.clone(), tuple7.clone());
    yes(tuple2020.clone(), json!({ "type": "array", "maxItems": 2 }));
    no(json!({ "type": "array", "prefixItems": [ { "type": "string" } ] }), tuple2020);
    yes(json!({ "type": "array", "maxItems": 1 }), json!({ "uniqueItems": true }));
    no(json!({ "type": "array" }), json!({ "uniqueItems": true }));
}

#[test]
fn recursive_schemas_end() {
    let tree = json!({ "$defs": { "T": { "type": "object", "properties": { "kids": { "type": "array", "items": { "$ref": "#/$defs/T" } } } } },
        "$ref": "#/$defs/T" });
    let mut tree2 = tree.clone();
    tree2["$comment"] = json!("differs");
    yes(tree.clone(), tree2);
    let looser = json!({ "$defs": { "U": { "type": "object" } }, "$ref": "#/$defs/U" });
    yes(tree.clone(), looser.clone());
    no(looser, tree);
}

#[test]
fn what_cannot_be_proved_is_named() {
    let f = includes(
        &doc(json!({ "type": "object" })),
        &doc(json!({ "allOf": [ { "properties": { "a": {} } } ], "unevaluatedProperties": false })),
        false,
    );
    assert!(
        f.iter().any(|f| f.rule == Rule::CannotProve && f.reason.contains("unevaluatedProperties")),
        "{f:?}"
    );
    let f = includes(&doc(json!({ "type": "object" })), &doc(json!({ "$dynamicRef": "#x" })), false);
    assert!(f.iter().any(|f| f.rule == Rule::CannotProve && f.reason.contains("$dynamicRef")), "{f:?}");
}

#[test]
fn the_same_schema_with_other_annotations_reads_itself() {
    // A `$ref` cycle that no validator could expand, in draft-04 where the siblings of a
    // `$ref` are set aside: the same schema all the same.
    let s = json!({ "$ref": "#/definitions/D0", "$schema": "http://json-schema.org/draft-04/schema#",
        "definitions": { "D0": { "$ref": "#/definitions/D0" }, "D1": { "maxLength": 1, "type": "string" } } });
    let mut a = s.clone();
    a["description"] = json!("x");
    a["definitions"]["D0"]["description"] = json!("x");
    a["definitions"]["D1"]["title"] = json!("x");
    yes(s.clone(), a.clone());
    yes(a, s);
    // A writer with no value of a type writes none of it.
    yes(json!({ "type": "number", "minimum": 3, "maximum": 2 }), json!({ "type": "string" }));
    yes(
        json!({ "type": "string" }),
        json!({ "oneOf": [ { "type": "number", "minimum": 3, "maximum": 2 }, { "type": "string" } ] }),
    );
}

/// The counterexamples the soundness fuzz found (`outbox_tests::compat_fuzz`), each a
/// compatible verdict the `jsonschema` crate refuted before its fix.
#[test]
fn counterexamples_the_fuzz_found_stay_refused() {
    // A `false` inside the reader's allOf accepts nothing.
    no(json!({ "not": { "type": "integer" } }), json!({ "allOf": [false] }));
    // Draft-07 validators may check contentMediaType: "" is not JSON.
    no(
        json!({ "$schema": "http://json-schema.org/draft-07/schema#", "type": "string" }),
        json!({ "$schema": "http://json-schema.org/draft-07/schema#", "type": "string", "contentMediaType": "application/json" }),
    );
    // 1 and 1.0 are one value: a draft-04 integer writer's 1 matches the reader's `not: 1.0`.
    no(
        json!({ "$schema": "http://json-schema.org/draft-04/schema#", "type": "integer" }),
        json!({ "$schema": "http://json-schema.org/draft-06/schema#", "not": { "enum": [1.0] } }),
    );
    // An enum [1, 0] also writes 1.0, which draft-04's integer refuses.
    no(
        json!({ "$schema": "http://json-schema.org/draft-04/schema#", "enum": [1, 0] }),
        json!({ "$schema": "http://json-schema.org/draft-04/schema#", "enum": [1, 0], "type": "integer" }),
    );
    // `dependencies` in a 2020-12 reader: ignored by the specification, applied by some validators.
    let f = includes(
        &doc(json!({ "const": { "a": 2.5, "b": 2 } })),
        &doc(json!({ "type": "object", "dependencies": { "a": { "enum": [2.5] } } })),
        false,
    );
    assert!(f.iter().any(|f| f.rule == Rule::CannotProve), "{f:?}");
}

#[test]
fn the_lenient_policy_reads_open_writers_as_writing_only_what_they_declare() {
    let lenient = |w: Value, r: Value| includes(&doc(w), &doc(r), true);
    let open = json!({ "type": "object", "properties": { "a": { "type": "string" } } });
    let added =
        json!({ "type": "object", "properties": { "a": { "type": "string" }, "b": { "type": "integer" } } });
    // Strict: the open writer may hold `b` with any value.
    assert!(found(open.clone(), added.clone()).iter().any(|(p, _)| p == "$.b"), "strict refuses");
    assert!(lenient(open.clone(), added.clone()).is_empty(), "lenient accepts an optional property added");
    // A reader closing the model, or bounding the count by what the writer declares.
    let closed = json!({ "type": "object", "properties": { "a": { "type": "string" } }, "additionalProperties": false });
    assert!(!found(open.clone(), closed.clone()).is_empty());
    assert!(lenient(open.clone(), closed).is_empty());
    let counted = json!({ "type": "object", "maxProperties": 1 });
    assert!(lenient(open.clone(), counted).is_empty());
    // What the writer declares is still judged: a changed type, a required property added.
    let retyped = json!({ "type": "object", "properties": { "a": { "type": "integer" } } });
    assert!(!lenient(open.clone(), retyped).is_empty());
    let required =
        json!({ "type": "object", "properties": { "a": { "type": "string" }, "b": {} }, "required": ["b"] });
    assert!(lenient(open.clone(), required).iter().any(|f| f.rule == Rule::RequiredAdded));
    // A writer that promises a map (`additionalProperties` a schema) or patterns still writes them.
    let map = json!({ "type": "object", "additionalProperties": { "type": "string" } });
    assert!(!lenient(map, added.clone()).is_empty());
    let patterned = json!({ "type": "object", "patternProperties": { "^b": {} } });
    assert!(!lenient(patterned, added).is_empty());
}
