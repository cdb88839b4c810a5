//! Schemas rewritten so that one object serde writes or reads is one schema object.
//!
//! schemars describes some serde shapes as an object split over several schema objects:
//! an internally tagged variant is its struct's `$ref` with the tag's `properties` beside
//! it, a flattened enum is a `oneOf` beside the struct's own `properties`, and a flattened
//! struct is an `allOf`. Judged part by part, no single part holds every property serde
//! writes, and a reader's required property looks missing (`required-added`) where serde
//! reads every document. Before comparing, each such node is merged into one object
//! schema: a `$ref` with object keywords beside it takes its target's keywords, an
//! `allOf` becomes the intersection of its parts, and keywords beside a `oneOf`/`anyOf`
//! are distributed into every variant (A and (B or C) is (A and B) or (A and C)).
//!
//! Merging follows serde rather than the letter of JSON Schema in one place: an
//! `additionalProperties` of one part does not reject the properties another part
//! declares (serde hands a flattened or tagged struct every field it knows). Where two
//! parts disagree on a keyword that cannot be intersected here, the node is left as it
//! was, and the checker judges it part by part as before.

use serde_json::{Map, Value};

use super::document::SchemaDoc;
use super::keywords::{is_annotation, SCHEMA_ARRAY_KEYWORDS, SCHEMA_KEYWORDS, SCHEMA_MAP_KEYWORDS};

/// How deep rewriting goes: a recursive type whose `$ref` has siblings would otherwise be
/// inlined into itself forever. Deeper nodes are left as they are.
const MAX_DEPTH: usize = 48;
/// Rewrites of one node (a `$ref` whose target is itself a `$ref` with siblings, ...).
const MAX_REWRITES: usize = 16;

/// `doc` with every split object merged (see the module documentation).
pub(crate) fn normalize(doc: &SchemaDoc) -> SchemaDoc {
    let mut root = doc.root().clone();
    if let Some(Value::Object(x)) = root.get_mut("x-outbox") {
        // The writer's schema is a document of its own, normalised on its own.
        x.remove("writer");
    }
    node(&mut root, doc, 0);
    SchemaDoc::from_value(doc.name(), root).unwrap_or_else(|_| doc.clone())
}

fn node(value: &mut Value, doc: &SchemaDoc, depth: usize) {
    if depth > MAX_DEPTH {
        return;
    }
    for _ in 0..MAX_REWRITES {
        if !rewrite(value, doc) {
            break;
        }
    }
    let Value::Object(obj) = value else { return };
    for (key, child) in obj.iter_mut() {
        match key.as_str() {
            k if SCHEMA_KEYWORDS.contains(&k) => node(child, doc, depth + 1),
            "items" => match child {
                Value::Array(items) => items.iter_mut().for_each(|c| node(c, doc, depth + 1)),
                other => node(other, doc, depth + 1),
            },
            k if SCHEMA_ARRAY_KEYWORDS.contains(&k) => {
                if let Value::Array(items) = child {
                    items.iter_mut().for_each(|c| node(c, doc, depth + 1));
                }
            }
            k if SCHEMA_MAP_KEYWORDS.contains(&k) => {
                if let Value::Object(map) = child {
                    map.values_mut().for_each(|c| node(c, doc, depth + 1));
                }
            }
            _ => {}
        }
    }
}

/// Whether `obj` has a constraint keyword other than `except`.
fn constrained_besides(obj: &Map<String, Value>, except: &str) -> bool {
    obj.keys().any(|k| k != except && !is_annotation(k))
}

/// One rewrite of `value`, if one applies.
fn rewrite(value: &mut Value, doc: &SchemaDoc) -> bool {
    let Value::Object(obj) = value else { return false };
    // A `$ref` with constraints beside it: its target's keywords and the siblings, merged.
    if let Some(reference) = obj.get("$ref").and_then(Value::as_str) {
        if constrained_besides(obj, "$ref") {
            if let Some(Value::Object(target)) = doc.resolve(reference) {
                let mut rest = obj.clone();
                rest.remove("$ref");
                if let Some(merged) = merge(target.clone(), rest) {
                    *obj = merged;
                    return true;
                }
            }
            return false;
        }
    }
    // `allOf`: the intersection of its parts and the siblings.
    if let Some(Value::Array(parts)) = obj.get("allOf") {
        let mut merged = Some(obj.clone());
        if let Some(m) = merged.as_mut() {
            m.remove("allOf");
        }
        for part in parts {
            merged = merged.zip(inline(part, doc)).and_then(|(m, p)| merge(m, p));
        }
        if let Some(merged) = merged {
            *obj = merged;
            return true;
        }
        return false;
    }
    // Constraints beside a union: distributed into each variant.
    for key in ["oneOf", "anyOf"] {
        let Some(Value::Array(variants)) = obj.get(key) else { continue };
        if !constrained_besides(obj, key) {
            continue;
        }
        let (kept, shared): (Map<String, Value>, Map<String, Value>) = obj
            .iter()
            .filter(|(k, _)| *k != key)
            .map(|(k, v)| (k.clone(), v.clone()))
            .partition(|(k, _)| is_annotation(k));
        let distributed: Option<Vec<Value>> = variants
            .iter()
            .map(|v| inline(v, doc).and_then(|v| merge(shared.clone(), v)).map(Value::Object))
            .collect();
        let Some(distributed) = distributed else { return false };
        let mut out = kept;
        out.insert(key.to_owned(), Value::Array(distributed));
        *obj = out;
        return true;
    }
    false
}

/// A part as an object to merge: a plain `$ref` becomes its target's keywords.
fn inline(part: &Value, doc: &SchemaDoc) -> Option<Map<String, Value>> {
    match part {
        Value::Bool(true) => Some(Map::new()),
        Value::Object(obj) => match obj.get("$ref").and_then(Value::as_str) {
            Some(reference) if !constrained_besides(obj, "$ref") => match doc.resolve(reference)? {
                Value::Object(target) => Some(target.clone()),
                Value::Bool(true) => Some(Map::new()),
                _ => None,
            },
            _ => Some(obj.clone()),
        },
        _ => None,
    }
}

/// The intersection of two schema objects, when it can be written as one; `None` when
/// they disagree on a keyword this cannot intersect.
fn merge(mut a: Map<String, Value>, b: Map<String, Value>) -> Option<Map<String, Value>> {
    for (key, vb) in b {
        let Some(va) = a.get_mut(&key) else {
            a.insert(key, vb);
            continue;
        };
        if *va == vb || is_annotation(&key) {
            continue;
        }
        match key.as_str() {
            "properties" => {
                let (Value::Object(pa), Value::Object(pb)) = (va, vb) else { return None };
                for (name, sb) in pb {
                    match pa.get_mut(&name) {
                        None => {
                            pa.insert(name, sb);
                        }
                        Some(sa) if *sa == sb => {}
                        Some(sa) => *sa = serde_json::json!({ "allOf": [sa.take(), sb] }),
                    }
                }
            }
            "required" => {
                let (Value::Array(ra), Value::Array(rb)) = (va, vb) else { return None };
                for name in rb {
                    if !ra.contains(&name) {
                        ra.push(name);
                    }
                }
            }
            "type" => {
                let names = |v: &Value| -> Vec<String> {
                    match v {
                        Value::String(t) => vec![t.clone()],
                        Value::Array(ts) => ts.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
                        _ => Vec::new(),
                    }
                };
                let tb = names(&vb);
                // integer is a number: `number` and `integer` intersect in `integer`.
                let both: Vec<String> = names(va)
                    .into_iter()
                    .filter_map(|t| {
                        if tb.contains(&t) {
                            Some(t)
                        } else if t == "number" && tb.iter().any(|u| u == "integer") {
                            Some("integer".to_owned())
                        } else if t == "integer" && tb.iter().any(|u| u == "number") {
                            Some(t)
                        } else {
                            None
                        }
                    })
                    .collect();
                *va = match both.as_slice() {
                    [] => return None,
                    [one] => Value::String(one.clone()),
                    _ => Value::Array(both.into_iter().map(Value::String).collect()),
                };
            }
            _ => return None,
        }
    }
    Some(a)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn normalized(v: Value) -> Value {
        normalize(&SchemaDoc::from_value("t", v).expect("schema")).root().clone()
    }

    #[test]
    fn a_ref_with_a_tag_beside_it_becomes_one_object() {
        let out = normalized(json!({
            "$defs": { "Card": { "type": "object", "properties": { "last4": { "type": "string" } }, "required": ["last4"] } },
            "oneOf": [
                { "$ref": "#/$defs/Card", "type": "object", "properties": { "kind": { "const": "Card" } }, "required": ["kind"] },
                { "type": "object", "properties": { "kind": { "const": "Cash" } }, "required": ["kind"] }
            ]
        }));
        let card = &out["oneOf"][0];
        assert_eq!(card.get("$ref"), None, "{out}");
        assert_eq!(card["required"], json!(["last4", "kind"]));
        assert_eq!(card["properties"]["kind"]["const"], "Card");
        assert_eq!(card["properties"]["last4"]["type"], "string");
    }

    #[test]
    fn properties_beside_a_one_of_go_into_every_variant() {
        let out = normalized(json!({
            "type": "object", "title": "Payment",
            "properties": { "id": { "type": "integer" } }, "required": ["id"],
            "oneOf": [
                { "type": "object", "properties": { "card": { "type": "string" } }, "required": ["card"] },
                { "type": "object", "properties": { "cash": { "type": "boolean" } }, "required": ["cash"] }
            ]
        }));
        assert_eq!(out["title"], "Payment", "annotations stay on the node");
        assert_eq!(out.get("properties"), None, "{out}");
        assert_eq!(out["oneOf"][0]["required"], json!(["id", "card"]));
        assert_eq!(out["oneOf"][1]["required"], json!(["id", "cash"]));
        assert_eq!(out["oneOf"][1]["properties"]["id"]["type"], "integer");
    }

    #[test]
    fn all_of_parts_merge_and_conflicts_are_left_alone() {
        let out = normalized(json!({
            "$defs": { "Inner": { "type": "object", "properties": { "b": { "type": "string" } } } },
            "properties": {
                "merged": { "allOf": [ { "$ref": "#/$defs/Inner" }, { "type": "object", "properties": { "a": { "type": "integer" } } } ] },
                "conflict": { "allOf": [ { "maxLength": 3 }, { "maxLength": 4 } ] },
                "same_property": { "allOf": [
                    { "properties": { "x": { "type": "integer" } } },
                    { "properties": { "x": { "minimum": 0 } } } ] }
            }
        }));
        let merged = &out["properties"]["merged"];
        assert_eq!(merged["properties"]["a"]["type"], "integer", "{out}");
        assert_eq!(merged["properties"]["b"]["type"], "string");
        assert!(out["properties"]["conflict"].get("allOf").is_some(), "left as it was: {out}");
        // A property both parts declare: both schemas, then merged in their turn.
        assert_eq!(
            out["properties"]["same_property"]["properties"]["x"],
            json!({ "type": "integer", "minimum": 0 })
        );
    }

    #[test]
    fn a_recursive_ref_with_siblings_ends() {
        let out = normalized(json!({
            "$defs": { "Tree": { "type": "object", "properties": {
                "child": { "$ref": "#/$defs/Tree", "description": "x", "minProperties": 0 } } } },
            "$ref": "#/$defs/Tree", "minProperties": 0
        }));
        assert!(out.get("properties").is_some(), "{out}");
    }
}
