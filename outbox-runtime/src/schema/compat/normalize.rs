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
//! A merge is refused, and the node left as it was for the checker to judge part by part
//! (conservatively), where one object would not say the same thing:
//! - one part restricts the properties it does not declare (`additionalProperties` or
//!   `unevaluatedProperties` other than `true`) and another part declares properties
//!   outside its own: JSON Schema rejects those, and so does serde for a flattened map or
//!   `deny_unknown_fields` beside a flattened enum. The one exception follows serde: the
//!   tag beside an internally tagged variant's `$ref` (serde takes the tag off before the
//!   variant's struct sees the rest);
//! - one part is an open map (no `properties`, any other keys allowed) and the other a
//!   struct: one object with `properties` would be read as a struct that writes only those;
//! - two parts disagree on a keyword that cannot be intersected here.
//!
//! Rewriting is bounded in depth and in total size, so a crafted schema cannot make it
//! run away.

use serde_json::{Map, Value};

use crate::schema::document::SchemaDoc;
use crate::schema::keywords::{is_annotation, SCHEMA_ARRAY_KEYWORDS, SCHEMA_KEYWORDS, SCHEMA_MAP_KEYWORDS};

/// How deep rewriting goes: a recursive type whose `$ref` has siblings would otherwise be
/// inlined into itself forever. Deeper nodes are left as they are.
const MAX_DEPTH: usize = 48;
/// Rewrites of one node (a `$ref` whose target is itself a `$ref` with siblings, ...).
const MAX_REWRITES: usize = 16;
/// Rewrites of a whole document: a schema whose nodes each inline a definition that
/// inlines itself twice would otherwise grow as 2 to the depth.
const MAX_TOTAL_REWRITES: usize = 4096;

/// `doc` with every split object merged (see the module documentation).
pub(crate) fn normalize(doc: &SchemaDoc) -> SchemaDoc {
    let mut root = doc.root().clone();
    if let Some(Value::Object(x)) = root.get_mut("x-outbox") {
        // The writer's schema is a document of its own, normalised on its own.
        x.remove("writer");
    }
    let mut budget = MAX_TOTAL_REWRITES;
    node(&mut root, doc, 0, &mut budget);
    SchemaDoc::from_value(doc.name(), root).unwrap_or_else(|_| doc.clone())
}

fn node(value: &mut Value, doc: &SchemaDoc, depth: usize, budget: &mut usize) {
    if depth > MAX_DEPTH {
        return;
    }
    for _ in 0..MAX_REWRITES {
        if *budget == 0 || !rewrite(value, doc) {
            break;
        }
        *budget -= 1;
    }
    let Value::Object(obj) = value else { return };
    for (key, child) in obj.iter_mut() {
        match key.as_str() {
            k if SCHEMA_KEYWORDS.contains(&k) => node(child, doc, depth + 1, budget),
            "items" => match child {
                Value::Array(items) => items.iter_mut().for_each(|c| node(c, doc, depth + 1, budget)),
                other => node(other, doc, depth + 1, budget),
            },
            k if SCHEMA_ARRAY_KEYWORDS.contains(&k) => {
                if let Value::Array(items) = child {
                    items.iter_mut().for_each(|c| node(c, doc, depth + 1, budget));
                }
            }
            k if SCHEMA_MAP_KEYWORDS.contains(&k) => {
                if let Value::Object(map) = child {
                    map.values_mut().for_each(|c| node(c, doc, depth + 1, budget));
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
                if let Some(merged) = merge_with(target.clone(), rest, Extras::TagsMayJoin) {
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

/// Whether a part's restriction on undeclared properties may let another part's
/// properties in.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Extras {
    /// Never: JSON Schema's reading, and serde's for flatten.
    Strict,
    /// For properties that are tags (`const` or a one-value `enum`): the `$ref` of an
    /// internally tagged variant, whose tag serde removes before the struct reads.
    TagsMayJoin,
}

/// The intersection of two schema objects, when it can be written as one; `None` when
/// it cannot (see the module documentation).
fn merge(a: Map<String, Value>, b: Map<String, Value>) -> Option<Map<String, Value>> {
    merge_with(a, b, Extras::Strict)
}

/// Whether `m` restricts the properties it does not declare.
fn restricts_extras(m: &Map<String, Value>) -> bool {
    ["additionalProperties", "unevaluatedProperties"]
        .iter()
        .any(|k| m.get(*k).is_some_and(|v| *v != Value::Bool(true)))
}

/// Whether `m` is an open map: no declared properties, any other key allowed.
fn open_map(m: &Map<String, Value>) -> bool {
    !m.contains_key("properties")
        && (m.get("additionalProperties").is_some_and(|v| *v != Value::Bool(false))
            || m.contains_key("patternProperties"))
}

fn is_tag(schema: &Value) -> bool {
    schema.get("const").is_some()
        || schema.get("enum").and_then(Value::as_array).is_some_and(|e| e.len() == 1)
}

/// Properties `other` declares that `m` does not.
fn foreign<'m>(
    m: &'m Map<String, Value>,
    other: &'m Map<String, Value>,
) -> impl Iterator<Item = (&'m String, &'m Value)> {
    let own = m.get("properties").and_then(Value::as_object);
    other
        .get("properties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter(move |(name, _)| !own.is_some_and(|own| own.contains_key(*name)))
}

fn merge_with(
    mut a: Map<String, Value>,
    b: Map<String, Value>,
    extras: Extras,
) -> Option<Map<String, Value>> {
    let declares = |m: &Map<String, Value>| m.contains_key("properties");
    if (open_map(&a) && declares(&b)) || (open_map(&b) && declares(&a)) {
        return None;
    }
    let lets_in = |m: &Map<String, Value>, other: &Map<String, Value>| {
        !restricts_extras(m) || foreign(m, other).all(|(_, s)| extras == Extras::TagsMayJoin && is_tag(s))
    };
    if !lets_in(&a, &b) || !lets_in(&b, &a) {
        return None;
    }
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
    fn a_restriction_on_undeclared_properties_is_not_merged_with_properties_it_restricts() {
        // `method` must be an integer here (it is not declared beside the
        // additionalProperties): distributing would let a string in.
        let closed = json!({
            "type": "object", "additionalProperties": { "type": "integer" },
            "oneOf": [ { "type": "object", "properties": { "method": { "const": "Card" } }, "required": ["method"] } ]
        });
        assert_eq!(normalized(closed.clone()), closed);
        // The same beside a `$ref`, unless what joins is a tag: serde takes the tag off
        // an internally tagged variant before its struct reads the rest.
        let defs = json!({ "S": { "type": "object", "properties": { "a": { "type": "string" } }, "additionalProperties": false } });
        let with_field =
            json!({ "$defs": defs, "$ref": "#/$defs/S", "properties": { "b": { "type": "string" } } });
        assert_eq!(normalized(with_field.clone()), with_field);
        let with_tag = json!({ "$defs": defs, "$ref": "#/$defs/S", "properties": { "kind": { "const": "S" } }, "required": ["kind"] });
        let merged = normalized(with_tag);
        assert_eq!(merged.get("$ref"), None, "{merged}");
        assert_eq!(merged["required"], json!(["kind"]));
        // An open map and a struct stay apart: one object with properties reads as a
        // struct that writes only those.
        let map_and_struct = json!({ "allOf": [
            { "type": "object", "additionalProperties": true },
            { "type": "object", "properties": { "a": { "type": "string" } } } ] });
        assert_eq!(normalized(map_and_struct.clone()), map_and_struct);
    }

    #[test]
    fn a_schema_that_would_double_at_every_level_stays_bounded() {
        // Each level inlines T twice: unbounded, 2^48 nodes.
        let twice = json!({ "$ref": "#/$defs/T", "minProperties": 0 });
        let out = normalized(json!({
            "$defs": { "T": { "type": "object", "properties": { "l": twice.clone(), "r": twice } } },
            "$ref": "#/$defs/T", "minProperties": 0
        }));
        let size = out.to_string().len();
        assert!(size < 50_000_000, "{size} bytes");
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
