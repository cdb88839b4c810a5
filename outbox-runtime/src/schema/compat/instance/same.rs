//! Whether two schemas are the same, up to annotations.

use std::collections::HashSet;

use serde_json::Value;

use super::{content_asserted, CONTENT};
use crate::schema::dialect::{Dialect, IGNORED};
use crate::schema::document::SchemaDoc;

/// Whether two schema values, each in its document, are the same schema: equal JSON but
/// for annotations (`title`, `description`, `x-...`), and every `$ref` reachable from
/// them resolving to the same schema in both documents.
pub(super) fn same(a: &Value, ad: &SchemaDoc, b: &Value, bd: &SchemaDoc) -> bool {
    same_within(a, ad, b, bd, usize::MAX)
}

/// References [`same_nearby`] follows at most.
const NEARBY_REFS: usize = 64;

/// [`same`] for the shortcut taken at every level of a comparison: it follows at most
/// [`NEARBY_REFS`] references, and answers "not shown the same" past them (the comparison
/// then goes on keyword by keyword, which is sound, only slower). Unbounded, a chain of
/// `$ref`s that differs only at its end is walked again at every level of it: a chain
/// 1,024 long took a minute.
pub(super) fn same_nearby(a: &Value, ad: &SchemaDoc, b: &Value, bd: &SchemaDoc) -> bool {
    same_within(a, ad, b, bd, NEARBY_REFS)
}

fn same_within(a: &Value, ad: &SchemaDoc, b: &Value, bd: &SchemaDoc, max_refs: usize) -> bool {
    // `$schema` is an annotation to the comparison below, but the dialect is not: draft-04
    // reads `integer` its own way, and draft-06/07 validators may check content keywords
    // that later drafts only annotate.
    if (ad.dialect() == Dialect::Draft4) != (bd.dialect() == Dialect::Draft4) {
        return false;
    }
    let content_differs = content_asserted(ad) != content_asserted(bd);
    let mut refs = Vec::new();
    if !same_shape(a, b, content_differs, &mut refs) {
        return false;
    }
    let mut seen: HashSet<String> = HashSet::new();
    while let Some(r) = refs.pop() {
        if !seen.insert(r.clone()) {
            continue;
        }
        if seen.len() > max_refs {
            return false;
        }
        match (ad.resolve(&r), bd.resolve(&r)) {
            (Some(x), Some(y)) => {
                if !same_shape(x, y, content_differs, &mut refs) {
                    return false;
                }
            }
            // Only in keywords set aside (resolution is checked everywhere else).
            (None, None) => {}
            _ => return false,
        }
    }
    true
}

/// [`same`] without following references: those met are pushed onto `refs`.
pub(super) fn same_shape(a: &Value, b: &Value, content_differs: bool, refs: &mut Vec<String>) -> bool {
    use crate::schema::keywords::{
        is_annotation, SCHEMA_ARRAY_KEYWORDS, SCHEMA_KEYWORDS, SCHEMA_MAP_KEYWORDS,
    };
    let (Value::Object(x), Value::Object(y)) = (a, b) else { return a == b };
    if content_differs && CONTENT.iter().any(|k| x.contains_key(*k) || y.contains_key(*k)) {
        return false;
    }
    let kept = |k: &String| CONTENT.contains(&k.as_str()) || !is_annotation(k);
    let xs: Vec<&String> = x.keys().filter(|k| kept(k)).collect();
    let ys = y.keys().filter(|k| kept(k)).count();
    if xs.len() != ys {
        return false;
    }
    // Keywords set aside may still be applied by some validators: compared, but none is
    // the same as an empty set.
    let empty = Value::Object(serde_json::Map::new());
    let (xi, yi) = (x.get(IGNORED), y.get(IGNORED));
    if (xi.is_some() || yi.is_some())
        && !same_shape(xi.unwrap_or(&empty), yi.unwrap_or(&empty), content_differs, refs)
    {
        return false;
    }
    xs.into_iter().all(|k| {
        let (Some(u), Some(v)) = (x.get(k), y.get(k)) else { return false };
        match k.as_str() {
            "$ref" => {
                if let Value::String(r) = u {
                    refs.push(r.clone());
                }
                u == v
            }
            "items" if u.is_array() => u == v,
            k if SCHEMA_KEYWORDS.contains(&k) || k == "items" => same_shape(u, v, content_differs, refs),
            k if SCHEMA_ARRAY_KEYWORDS.contains(&k) => match (u, v) {
                (Value::Array(p), Value::Array(q)) => {
                    p.len() == q.len()
                        && p.iter().zip(q).all(|(p, q)| same_shape(p, q, content_differs, refs))
                }
                _ => u == v,
            },
            k if SCHEMA_MAP_KEYWORDS.contains(&k) || k == "dependencies" => match (u, v) {
                (Value::Object(p), Value::Object(q)) => {
                    p.len() == q.len()
                        && p.iter().all(|(name, s)| {
                            q.get(name).is_some_and(|t| same_shape(s, t, content_differs, refs))
                        })
                }
                _ => u == v,
            },
            _ => u == v,
        }
    })
}
