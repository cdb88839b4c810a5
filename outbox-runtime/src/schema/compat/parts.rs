//! What a node says, read without judging it: paths, finite values, tags, types,
//! required and extra properties, items, length bounds and string formats. The checker
//! (`subsume`) and value acceptance (`accept`) build on these; they call back into neither.

use serde_json::{Map, Value};

use super::node::Node;
use super::{finding, Finding, Rule, SchemaDoc};

pub(super) fn child(path: &str, name: &str) -> String {
    let plain = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if plain {
        format!("{path}.{name}")
    } else {
        format!("{path}[{}]", Value::String(name.to_owned()))
    }
}

/// The finite set of values a writer node can produce, when it has one.
pub(super) fn finite_values(node: &Node<'_>) -> Option<Vec<Value>> {
    if let Some(c) = node.get("const") {
        return Some(vec![c.clone()]);
    }
    if let Some(Value::Array(values)) = node.get("enum") {
        return Some(values.clone());
    }
    if node.types().is_some_and(|t| t == ["boolean"]) {
        return Some(vec![Value::Bool(false), Value::Bool(true)]);
    }
    if node.types().is_some_and(|t| t == ["null"]) {
        return Some(vec![Value::Null]);
    }
    None
}

/// The single value a property schema allows (`const` or a one-value `enum`): a tag.
pub(super) fn tag_of(doc: &SchemaDoc, v: &Value) -> Option<Value> {
    let v = match v.get("$ref").and_then(Value::as_str) {
        Some(r) => doc.resolve(r)?,
        None => v,
    };
    v.get("const").cloned().or_else(|| match v.get("enum") {
        Some(Value::Array(a)) if a.len() == 1 => Some(a[0].clone()),
        _ => None,
    })
}

pub(super) fn describe_types(types: &Option<Vec<&str>>) -> String {
    match types {
        None => "any type".to_owned(),
        Some(ts) if ts.is_empty() => "no type".to_owned(),
        Some(ts) => ts.join(" or "),
    }
}

pub(super) fn type_accepts(reader_types: &Option<Vec<&str>>, writer_type: &str) -> bool {
    match reader_types {
        None => true,
        Some(ts) => ts.iter().any(|t| *t == writer_type || (*t == "number" && writer_type == "integer")),
    }
}

/// The `true` schema, usable with any lifetime (it is a constant).
pub(super) fn true_schema<'a>() -> &'a Value {
    static TRUE: Value = Value::Bool(true);
    &TRUE
}

/// An empty map, usable with any lifetime.
pub(super) fn empty_map<'a>() -> &'a Map<String, Value> {
    static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
    EMPTY.get_or_init(Map::new)
}

pub(super) fn required_of<'a>(node: &Node<'a>) -> Vec<&'a str> {
    node.get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// What an object may hold beyond its declared properties.
#[derive(Clone)]
pub(super) enum Extras<'a> {
    /// Anything (an open reader, a free-form writer).
    Open,
    /// Nothing.
    Closed,
    /// Values of these schemas (a map's `additionalProperties`, `patternProperties`).
    Schema(Vec<&'a Value>),
}

/// A writer that declares `properties` (a struct) writes only those; one that declares
/// none writes whatever its `additionalProperties` allows (a map).
pub(super) fn writer_extras<'a>(w: &Node<'a>) -> Extras<'a> {
    let mut schemas: Vec<&'a Value> = Vec::new();
    let mut free = false;
    for key in ["additionalProperties", "unevaluatedProperties"] {
        match w.get(key) {
            Some(Value::Object(_)) => schemas.extend(w.get(key)),
            Some(Value::Bool(true)) | None if key == "additionalProperties" => {
                free = w.get("properties").is_none() && w.get("patternProperties").is_none();
            }
            _ => {}
        }
    }
    if let Some(Value::Object(patterns)) = w.get("patternProperties") {
        schemas.extend(patterns.values());
    }
    if free && schemas.is_empty() {
        Extras::Open
    } else if schemas.is_empty() {
        Extras::Closed
    } else {
        Extras::Schema(schemas)
    }
}

pub(super) fn reader_extras<'a>(r: &Node<'a>) -> Extras<'a> {
    match r.get("additionalProperties") {
        Some(Value::Bool(false)) => Extras::Closed,
        Some(schema @ Value::Object(_)) => Extras::Schema(vec![schema]),
        _ if r.get("unevaluatedProperties") == Some(&Value::Bool(false)) => Extras::Closed,
        _ => Extras::Open,
    }
}

/// Prefix items and the schema for the rest (`None`: anything).
pub(super) fn items_of<'a>(node: &Node<'a>) -> (Vec<&'a Value>, Option<&'a Value>) {
    match (node.get("prefixItems"), node.get("items")) {
        (Some(Value::Array(prefix)), rest) => (prefix.iter().collect(), rest),
        // Draft 7 tuple form.
        (None, Some(Value::Array(prefix))) => (prefix.iter().collect(), node.get("additionalItems")),
        (_, rest) => (Vec::new(), rest),
    }
}

/// min/max count constraints (`minItems`, `maxLength`, ...): the reader's must be looser.
pub(super) fn bounds(
    w: &Node<'_>,
    r: &Node<'_>,
    min_key: &str,
    max_key: &str,
    what: &str,
    path: &str,
) -> Vec<Finding> {
    let get = |n: &Node<'_>, k: &str| n.get(k).and_then(Value::as_u64);
    let mut found = Vec::new();
    if let Some(rmin) = get(r, min_key) {
        let wmin = get(w, min_key).unwrap_or(0);
        if wmin < rmin {
            found.extend(finding(
                path,
                Rule::ConstraintTightened,
                format!("the reader requires {min_key} {rmin} ({what}); the writer's minimum is {wmin}"),
            ));
        }
    }
    if let Some(rmax) = get(r, max_key) {
        match get(w, max_key) {
            Some(wmax) if wmax <= rmax => {}
            wmax => found.extend(finding(
                path,
                Rule::ConstraintTightened,
                format!(
                    "the reader allows at most {rmax} ({max_key}, {what}); the writer's maximum is {}",
                    wmax.map_or("unbounded".to_owned(), |m| m.to_string())
                ),
            )),
        }
    }
    found
}

pub(super) fn strings(w: &Node<'_>, r: &Node<'_>, path: &str) -> Vec<Finding> {
    let mut found = Vec::new();
    if let Some(rf) = r.get("format").and_then(Value::as_str) {
        let wf = w.get("format").and_then(Value::as_str);
        if wf != Some(rf) {
            found.extend(finding(
                path,
                Rule::FormatAdded,
                match wf {
                    Some(wf) => format!("the reader requires strings in format `{rf}`; the writer's are in format `{wf}`"),
                    None => format!("the reader requires strings in format `{rf}`; the writer's strings have no declared format"),
                },
            ));
        }
    }
    found.extend(bounds(w, r, "minLength", "maxLength", "string length", path));
    if let Some(rp) = r.get("pattern") {
        if w.get("pattern") != Some(rp) {
            found.extend(finding(path, Rule::ConstraintTightened, format!("the reader requires strings matching pattern {rp}; the writer does not promise that pattern")));
        }
    }
    found
}
