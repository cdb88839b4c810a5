//! Our JSON Schema verdicts beside Confluent Schema Registry's, on a corpus of our own
//! (`confluent_corpus.json`: minimal BACKWARD pairs per rule, each with the verdict
//! Confluent gives under its STRICT and LENIENT policies, derived from its source as
//! `CONFLUENT.md` describes; no registry runs here). The disagreements are listed by
//! name, so that a change of any verdict, either way, fails here and is looked at.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::{compare_with, Judge, Mode, Policy, Rule, Semantics};
use crate::schema::{Dialect, SchemaDoc};

/// How our verdict on a case stands beside Confluent's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    Agree,
    /// We pass a change the registry refuses: users would learn it at deploy time.
    WeAcceptTheyRefuse,
    /// We refuse a change the registry passes (a value exists that breaks the reader, or
    /// we cannot prove it).
    WeRefuseTheyAccept,
}

/// A schema read as the CLI reads one for json-schema semantics: no `$schema` is
/// draft-07, as the registry reads it.
fn doc(name: &str, schema: &Value) -> SchemaDoc {
    SchemaDoc::from_value_in(name, schema.clone(), Dialect::Draft7).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn outcomes(policy: Policy) -> BTreeMap<Outcome, Vec<String>> {
    let corpus: Vec<Value> = serde_json::from_str(include_str!("confluent_corpus.json")).expect("the corpus");
    assert!(corpus.len() >= 150, "{} cases", corpus.len());
    let key = match policy {
        Policy::Strict => "strict",
        Policy::Lenient => "lenient",
    };
    let mut out: BTreeMap<Outcome, Vec<String>> = BTreeMap::new();
    for case in &corpus {
        let name = case["name"].as_str().expect("name");
        let theirs = match case[key].as_str() {
            Some("compatible") => true,
            Some("incompatible") => false,
            // Confluent's check throws (HTTP 500): nothing registers, and we refuse too.
            Some("unsure") => {
                let (old, new) = (doc(name, &case["old"]), doc(name, &case["new"]));
                let judge = Judge::new(Semantics::JsonSchema, policy);
                assert!(!compare_with(&old, &new, Mode::Backward, judge).is_compatible(), "{name}");
                continue;
            }
            other => panic!("{name}: {key} is {other:?}"),
        };
        let (old, new) =
            (doc(&format!("{name} old"), &case["old"]), doc(&format!("{name} new"), &case["new"]));
        let ours = compare_with(&old, &new, Mode::Backward, Judge::new(Semantics::JsonSchema, policy))
            .is_compatible();
        let outcome = match (ours, theirs) {
            (a, b) if a == b => Outcome::Agree,
            (true, false) => Outcome::WeAcceptTheyRefuse,
            _ => Outcome::WeRefuseTheyAccept,
        };
        out.entry(outcome).or_default().push(name.to_owned());
    }
    out
}

fn check(policy: Policy, accept_refused: &[String], refuse_accepted: &[String]) {
    let out = outcomes(policy);
    let count = |o| out.get(&o).map_or(0, Vec::len);
    let judged: usize = out.values().map(Vec::len).sum();
    eprintln!(
        "{policy} policy: {judged} cases, {} agree ({:.0}%), {} we accept and Confluent refuses, {} we refuse and Confluent accepts",
        count(Outcome::Agree),
        100.0 * count(Outcome::Agree) as f64 / judged as f64,
        count(Outcome::WeAcceptTheyRefuse),
        count(Outcome::WeRefuseTheyAccept),
    );
    let names = |o| out.get(&o).cloned().unwrap_or_default();
    assert_eq!(names(Outcome::WeAcceptTheyRefuse), accept_refused, "{policy}: we accept, Confluent refuses");
    assert_eq!(names(Outcome::WeRefuseTheyAccept), refuse_accepted, "{policy}: we refuse, Confluent accepts");
}

/// Sound changes Confluent refuses and no value breaks: its diff reads a keyword beside
/// `type` as an added `allOf`, and `anyOf` to `oneOf` as a changed combination. Ours
/// refuses them too, by its emulation of that diff (`registry`), as `registry-refuses`.
const CONFLUENT_QUIRKS: [&str; 4] = [
    "format_added_to_integer_draft7",
    "type_added_beside_enum",
    "enum_to_const_same_value",
    "anyOf_to_oneOf",
];

/// Passed by Confluent, refused by us under both policies: it ignores `format`,
/// `propertyNames`, `contains`, `if`/`then`/`else`, `patternProperties` schemas, `not`'s
/// direction, draft-04's boolean `exclusiveMaximum`, a decreased `exclusiveMaximum` beside
/// a `maximum`, and `required` names it does not find in `properties`; it lets a default
/// stand in for a required value and `connect.type: bytes` change type; it collapses a
/// `oneOf`'s duplicate branches. Each lets through a value the writer's schema accepts
/// and the reader's refuses.
const UNSOUND_IN_CONFLUENT: [&str; 13] = [
    "format_changed_on_string",
    "format_added_on_string",
    "contains_changed_ignored_draft7",
    "if_then_else_body_changed_ignored_draft7",
    "connect_type_bytes_type_change_allowed",
    "closed_model_add_required_property_with_default",
    "patternProperties_add_non_matching_property",
    "patternProperties_schema_change_ignored",
    "required_added_to_property_with_default",
    "required_added_for_undeclared_property",
    "untyped_properties_schema_gets_type_object",
    "exclusiveMaximum_decreased_with_maximum_is_missed",
    "oneOf_duplicate_branch_collapsed",
];

/// `names` in the corpus's order.
fn in_corpus_order(names: &[&str]) -> Vec<String> {
    let corpus: Vec<Value> = serde_json::from_str(include_str!("confluent_corpus.json")).expect("the corpus");
    corpus
        .iter()
        .filter_map(|c| c["name"].as_str())
        .filter(|n| names.contains(n))
        .map(str::to_owned)
        .collect()
}

#[test]
fn strict_verdicts_beside_confluents() {
    let refused_by_us: Vec<&str> = UNSOUND_IN_CONFLUENT
        .iter()
        .copied()
        .chain(["propertyNames_narrowed_ignored_draft7", "draft4_exclusiveMaximum_boolean_ignored"])
        .collect();
    check(Policy::Strict, &[], &in_corpus_order(&refused_by_us));
}

/// The changes only the registry's own rules refuse are refused with that rule named.
#[test]
fn the_registrys_own_refusals_are_named_as_such() {
    let corpus: Vec<Value> = serde_json::from_str(include_str!("confluent_corpus.json")).expect("the corpus");
    for name in CONFLUENT_QUIRKS {
        let case = corpus.iter().find(|c| c["name"] == name).expect(name);
        let (old, new) = (doc(name, &case["old"]), doc(name, &case["new"]));
        for policy in [Policy::Strict, Policy::Lenient] {
            let report = compare_with(&old, &new, Mode::Backward, Judge::new(Semantics::JsonSchema, policy));
            let rules: Vec<_> = report.incompatibilities.iter().map(|i| i.rule).collect();
            assert!(
                !rules.is_empty() && rules.iter().all(|r| *r == Rule::RegistryRefuses),
                "{name} {policy}: {report:?}"
            );
            // The same change judged by values alone passes: it is the registry's rule.
            let serde = compare_with(&old, &new, Mode::Backward, Judge::default());
            assert!(serde.is_compatible() || name == "format_added_to_integer_draft7", "{name}: {serde:?}");
        }
    }
}

/// LENIENT reads open writers as holding only what they declare; Confluent's LENIENT
/// accepts a property removed from a closed model and a required one with a default
/// added to an open one, which let values through that the reader refuses. What its
/// LENIENT refuses beyond ours (a property added beside `additionalProperties: {}`, a
/// lowered `maxProperties`, a narrowed recursive `$ref`) the emulation refuses too.
#[test]
fn lenient_verdicts_beside_confluents() {
    let refused_by_us: Vec<&str> = UNSOUND_IN_CONFLUENT
        .iter()
        .copied()
        .chain([
            "open_model_add_required_property_with_default",
            "closed_model_remove_property",
            "draft4_exclusiveMaximum_boolean_ignored",
        ])
        .collect();
    check(Policy::Lenient, &[], &in_corpus_order(&refused_by_us));
}

/// A schema without `$schema` is draft-07 to a registry, where a `$ref`'s siblings mean
/// nothing: json-schema semantics judges it so, however the document was read.
#[test]
fn a_schema_without_dollar_schema_is_judged_as_draft_07() {
    let old = json!({"type": "object", "properties": {"a": {"type": "string"}}});
    let new = json!({"type": "object", "properties": {"a": {"$ref": "#/definitions/S", "maxLength": 3}},
        "definitions": {"S": {"type": "string"}}});
    let judge = Judge::new(Semantics::JsonSchema, Policy::Strict);
    let read = |v: &Value| SchemaDoc::from_value("t", v.clone()).expect("a schema");
    let report = compare_with(&read(&old), &read(&new), Mode::Backward, judge);
    assert!(report.is_compatible(), "{report:?}");
    // In 2020-12 the sibling narrows the reader: the same pair, said to be 2020-12, is not.
    let in_2020 = |v: &Value| {
        let mut v = v.clone();
        v["$schema"] = json!("https://json-schema.org/draft/2020-12/schema");
        read(&v)
    };
    let report = compare_with(&in_2020(&old), &in_2020(&new), Mode::Backward, judge);
    assert!(!report.is_compatible(), "{report:?}");
}
