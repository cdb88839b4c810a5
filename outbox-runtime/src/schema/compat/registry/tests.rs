//! The emulation against the corpus's traced differences: every case's list, as a
//! multiset, under both policies.

use serde_json::{json, Value};

use super::{differences, refusals, Kind, Unpredicted};

fn corpus() -> Vec<Value> {
    serde_json::from_str(include_str!("../confluent_corpus.json")).expect("the corpus")
}

/// `expected` and `found` hold the same differences, `?` in an expected path standing for
/// any one segment (an index the registry's hash order picks).
fn same_multiset(expected: &[String], found: &[String]) -> bool {
    let matches = |e: &str, f: &str| {
        let (e, f): (Vec<&str>, Vec<&str>) = (e.split('/').collect(), f.split('/').collect());
        e.len() == f.len() && e.iter().zip(&f).all(|(a, b)| a == b || *a == "?")
    };
    let mut left: Vec<&String> = found.iter().collect();
    for e in expected {
        match left.iter().position(|f| matches(e, f)) {
            Some(i) => {
                left.remove(i);
            }
            None => return false,
        }
    }
    left.is_empty()
}

#[test]
fn every_corpus_case_gives_the_traced_differences() {
    let mut wrong = Vec::new();
    let mut checked = 0;
    for case in corpus() {
        let name = case["name"].as_str().expect("name");
        for lenient in [false, true] {
            let key = if lenient { "lenient" } else { "strict" };
            let verdict = case[key].as_str().expect("verdict");
            let found = differences(&case["old"], &case["new"], lenient);
            if verdict == "unsure" {
                // The registry throws; read as no difference here (values refuse it).
                assert_eq!(found, Ok(Vec::new()), "{name}");
                continue;
            }
            let found = found.unwrap_or_else(|e| panic!("{name}: {e}"));
            let list = |field: &str| -> Option<Vec<String>> {
                case[field]
                    .as_array()
                    .map(|l| l.iter().map(|d| d.as_str().expect("a difference").to_owned()).collect())
            };
            let expected =
                if lenient { list("differences_lenient") } else { None }.or_else(|| list("differences"));
            let expected = expected.expect("differences");
            let rendered: Vec<String> =
                found.iter().map(|d| format!("{} {}", d.kind.name(), d.path)).collect();
            let compatible = found.iter().all(|d| d.kind.compatible(lenient));
            if !same_multiset(&expected, &rendered) || compatible != (verdict == "compatible") {
                wrong.push(format!("{name} ({key}): expected {verdict} {expected:?}, emulated {rendered:?}"));
            }
            checked += 1;
        }
    }
    eprintln!("{checked} case-policy pairs checked, {} wrong", wrong.len());
    assert!(checked >= 300, "{checked}");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_policy_sets_are_the_registrys() {
    let strict = Kind::ALL.iter().filter(|k| k.compatible(false)).count();
    let lenient_only: Vec<&str> =
        Kind::ALL.iter().filter(|k| k.compatible(true) && !k.compatible(false)).map(|k| k.name()).collect();
    // 65 compatible STRICT types, less the deprecated and reserved ones the diff never emits (none are compatible).
    assert_eq!(strict, 65);
    assert_eq!(lenient_only.len(), 9, "{lenient_only:?}");
    assert!(Kind::ALL.iter().all(|k| !k.compatible(false) || k.compatible(true)), "LENIENT holds STRICT");
}

#[test]
fn a_recursive_schema_settles_and_names_the_change_at_every_depth() {
    let node = |t: &str| {
        json!({"$ref": "#/definitions/N", "definitions": {"N": {"type": "object",
            "properties": {"v": {"type": t}, "next": {"$ref": "#/definitions/N"}}}}})
    };
    let found = refusals(&node("number"), &node("integer"), false).expect("a verdict");
    let paths: Vec<&str> = found.iter().map(|d| d.path.as_str()).collect();
    assert_eq!(paths, ["#/properties/next/properties/v", "#/properties/v"]);
    assert!(refusals(&node("integer"), &node("number"), false).expect("a verdict").is_empty());
}

#[test]
fn what_the_emulation_does_not_cover_is_said_not_guessed() {
    let remote = json!({"$ref": "https://example.com/other.json"});
    let err = differences(&json!({"type": "string"}), &remote, false).expect_err("not local");
    assert!(matches!(&err, Unpredicted(why) if why.contains("other.json")), "{err}");
}

#[test]
fn multiple_of_is_compared_as_decimals() {
    let m = |v: Value| json!({"type": "number", "multipleOf": v});
    let kinds = |a, b| -> Vec<&'static str> {
        differences(&m(a), &m(b), false).expect("a verdict").iter().map(|d| d.kind.name()).collect()
    };
    assert_eq!(kinds(json!(0.1), json!(0.2)), ["MULTIPLE_OF_EXPANDED"]);
    assert_eq!(kinds(json!(0.3), json!(0.1)), ["MULTIPLE_OF_REDUCED"]);
    assert_eq!(kinds(json!(0.2), json!(0.3)), ["MULTIPLE_OF_CHANGED"]);
    assert!(kinds(json!(2), json!(2.0)).is_empty());
}

#[test]
fn a_schema_against_itself_is_never_refused() {
    let mut checked = 0;
    for case in corpus() {
        for side in ["old", "new"] {
            let schema = &case[side];
            for lenient in [false, true] {
                match refusals(schema, schema, lenient) {
                    Ok(refused) => assert!(refused.is_empty(), "{} {side}: {refused:?}", case["name"]),
                    Err(e) => panic!("{} {side}: {e}", case["name"]),
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 600, "{checked}");
}

/// Found by `cargo xtask fuzz compat --seed 7`: a `not` around a `$ref` to itself once
/// recursed without end (each `not` compared in a fresh pass, so the cycle was never seen).
#[test]
fn a_not_around_its_own_ref_ends() {
    let schema = |t: &str| {
        json!({"$schema": "https://json-schema.org/draft/2020-12/schema",
        "$ref": "#/$defs/D0", "title": t, "$defs": {"D0": {"not": {"$ref": "#/$defs/D0"}}}})
    };
    let found = differences(&schema("a"), &schema("b"), false).expect("a verdict");
    assert!(found.iter().all(|d| d.kind.compatible(false)), "{found:?}");
}

fn kinds(old: Value, new: Value) -> Vec<&'static str> {
    let mut found: Vec<&str> =
        differences(&old, &new, false).expect("a verdict").iter().map(|d| d.kind.name()).collect();
    found.sort_unstable();
    found
}

const S2020: &str = "https://json-schema.org/draft/2020-12/schema";

/// From a review of the emulation against the registry's source, cases the corpus did
/// not hold.
#[test]
fn what_a_review_of_the_source_found() {
    // A keyword before `type` (serde_json's maps are sorted) joins the `type` array's branch.
    let union = |extra: bool| {
        let mut v = json!({"$schema": S2020, "type": ["string", "null"]});
        if extra {
            v["maxLength"] = json!(5);
        }
        v
    };
    assert_eq!(kinds(union(true), union(false)), ["MAX_LENGTH_REMOVED"]);
    // A `then` without an `if` is nothing.
    assert!(kinds(
        json!({"$schema": S2020, "if": {"required": ["a"]}}),
        json!({"$schema": S2020, "if": {"required": ["a"]}, "then": {"required": ["b"]}})
    )
    .is_empty());
    // Equal branches with children are one branch; different unknown keywords are two.
    let a = json!({"type": "array", "items": {"type": "string"}});
    assert!(!kinds(json!({"oneOf": [a, a]}), json!({"oneOf": [a]})).contains(&"SUM_TYPE_NARROWED"));
    assert!(kinds(
        json!({"anyOf": [{"type": "string", "x-a": 1}, {"type": "string", "x-a": 2}]}),
        json!({"anyOf": [{"type": "string"}]})
    )
    .contains(&"SUM_TYPE_NARROWED"));
    // A `$ref` to a `$ref` is followed one level: two references compare as references.
    let chain = |t: &str| {
        json!({"properties": {"x": {"$ref": "#/definitions/A"}},
            "definitions": {"A": {"$ref": "#/definitions/B"}, "B": {"type": t}}})
    };
    assert!(kinds(chain("string"), chain("integer")).is_empty());
    // `propertyNames` is an object fragment in 2020-12.
    assert_eq!(
        kinds(json!({"$schema": S2020}), json!({"$schema": S2020, "propertyNames": {"maxLength": 3}})),
        ["TYPE_CHANGED"]
    );
    // One trailing `#` is stripped from `$schema`, not two: that is no dialect, so draft-07.
    let twice = format!("{S2020}##");
    assert_eq!(
        kinds(
            json!({"$schema": twice, "type": "integer"}),
            json!({"$schema": twice, "type": "integer", "format": "int64"})
        ),
        ["TYPE_CHANGED"]
    );
    // An empty dependency list is no dependency.
    assert!(kinds(json!({"type": "object"}), json!({"type": "object", "dependencies": {"a": []}})).is_empty());
    // 2019-09+ reads a null default as none.
    let with_default = |required: bool| {
        let mut v = json!({"$schema": S2020, "type": "object", "properties": {"a": {"type": "string", "default": null}}});
        if required {
            v["required"] = json!(["a"]);
        }
        v
    };
    assert_eq!(kinds(with_default(false), with_default(true)), ["REQUIRED_ATTRIBUTE_ADDED"]);
}

/// A chain of `$ref`s to ever other definitions nests without a cycle: past a bound the
/// emulation declines the pair rather than overflow the stack.
#[test]
fn a_long_chain_of_refs_is_declined_not_overflowed() {
    let mut definitions = serde_json::Map::new();
    for i in 0..5_000 {
        definitions.insert(
            format!("d{i}"),
            json!({"properties": {"n": {"$ref": format!("#/definitions/d{}", i + 1)}}}),
        );
    }
    definitions.insert("d5000".to_owned(), json!({"type": "string"}));
    let schema = json!({"$ref": "#/definitions/d0", "definitions": definitions});
    let mut other = schema.clone();
    other["title"] = json!("t");
    let run = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || differences(&schema, &other, false))
        .expect("thread");
    let found = run.join().expect("no overflow");
    assert!(matches!(&found, Err(Unpredicted(why)) if why.contains("levels deep")), "{found:?}");
}
