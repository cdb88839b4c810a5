//! JSON Schema dialects, and every document rewritten into one form before it is judged.
//!
//! A registry accepts draft-04, -06, -07, 2019-09 and 2020-12 schemas, chosen by `$schema`.
//! The same keyword can mean different things in two of them (`items` as an array is a
//! tuple up to 2019-09 and invalid in 2020-12; `exclusiveMinimum` is a boolean in draft-04;
//! a `$ref`'s siblings are ignored up to draft-07), and a keyword from a later draft means
//! nothing in an earlier one. [`canonical`] rewrites a document of any dialect into the
//! 2020-12 vocabulary, with the same meaning:
//! - draft-04's boolean `exclusiveMinimum`/`exclusiveMaximum` become the numeric form;
//!   draft-04's `id` becomes `$id`, and `id`/`$id` fragments (`"#name"`) become anchors;
//! - up to 2019-09, an `items` array becomes `prefixItems` and `additionalItems` its
//!   `items`; an `additionalItems` beside a single `items` schema, ignored there, is set aside;
//! - up to draft-07, `dependencies` becomes `dependentRequired` / `dependentSchemas`, and
//!   the siblings of a `$ref` are set aside, as validators of those drafts ignore them;
//! - keywords the dialect does not have (`if` in draft-06, `prefixItems` in draft-07,
//!   `dependencies` in 2020-12, ...) are set aside: validators ignore unknown keywords.
//!
//! "Set aside" means moved under `x-outbox-ignored` on the same node: an extension keyword,
//! which nothing judges, where a `$ref` pointing into it still resolves. Every `$ref` is
//! rewritten to point at the same schema in the rewritten document, anchors and references
//! through the document's own `$id` included.

use std::collections::HashMap;
use std::fmt;

use serde_json::{Map, Value};

use super::keywords::{SCHEMA_ARRAY_KEYWORDS, SCHEMA_KEYWORDS, SCHEMA_MAP_KEYWORDS};

/// Where keywords a document's dialect does not interpret are kept.
pub(crate) const IGNORED: &str = "x-outbox-ignored";

/// A JSON Schema dialect, chosen by a document's `$schema`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Dialect {
    /// `http://json-schema.org/draft-04/schema#`
    Draft4,
    /// `http://json-schema.org/draft-06/schema#`
    Draft6,
    /// `http://json-schema.org/draft-07/schema#`
    Draft7,
    /// `https://json-schema.org/draft/2019-09/schema`
    Draft2019,
    /// `https://json-schema.org/draft/2020-12/schema`, and documents without `$schema`.
    Draft2020,
}

impl Dialect {
    /// Every dialect, oldest first.
    pub const ALL: [Dialect; 5] =
        [Dialect::Draft4, Dialect::Draft6, Dialect::Draft7, Dialect::Draft2019, Dialect::Draft2020];

    /// The dialect a `$schema` URI names (http or https, with or without the empty fragment).
    pub fn from_uri(uri: &str) -> Option<Dialect> {
        let rest = uri.strip_prefix("http://").or_else(|| uri.strip_prefix("https://"))?;
        let rest = rest.strip_suffix('#').unwrap_or(rest);
        Some(match rest {
            "json-schema.org/draft-04/schema" => Dialect::Draft4,
            "json-schema.org/draft-06/schema" => Dialect::Draft6,
            "json-schema.org/draft-07/schema" => Dialect::Draft7,
            "json-schema.org/draft/2019-09/schema" => Dialect::Draft2019,
            "json-schema.org/draft/2020-12/schema" => Dialect::Draft2020,
            _ => return None,
        })
    }

    /// The URI documents of this dialect put in `$schema`.
    pub fn uri(self) -> &'static str {
        match self {
            Dialect::Draft4 => "http://json-schema.org/draft-04/schema#",
            Dialect::Draft6 => "http://json-schema.org/draft-06/schema#",
            Dialect::Draft7 => "http://json-schema.org/draft-07/schema#",
            Dialect::Draft2019 => "https://json-schema.org/draft/2019-09/schema",
            Dialect::Draft2020 => "https://json-schema.org/draft/2020-12/schema",
        }
    }

    /// Whether a keyword of the validation or applicator vocabularies means something in
    /// this dialect. Keywords of no dialect (`x-...`, typos) are not asked about.
    fn has(self, keyword: &str) -> bool {
        use Dialect::*;
        match keyword {
            "const" | "contains" | "propertyNames" => self >= Draft6,
            "if" | "then" | "else" => self >= Draft7,
            "dependencies" => self <= Draft7,
            "dependentRequired"
            | "dependentSchemas"
            | "unevaluatedItems"
            | "unevaluatedProperties"
            | "minContains"
            | "maxContains"
            | "$recursiveRef"
            | "$recursiveAnchor"
            | "$anchor" => self >= Draft2019,
            "additionalItems" => self <= Draft2019,
            "prefixItems" | "$dynamicRef" | "$dynamicAnchor" => self >= Draft2020,
            _ => true,
        }
    }
}

impl fmt::Display for Dialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Dialect::Draft4 => "draft-04",
            Dialect::Draft6 => "draft-06",
            Dialect::Draft7 => "draft-07",
            Dialect::Draft2019 => "2019-09",
            Dialect::Draft2020 => "2020-12",
        })
    }
}

/// Draft-04 has no boolean schemas, but for `additionalProperties` and `additionalItems`.
fn draft4_schemas_are_objects(keyword: &str, value: &Value) -> Result<(), String> {
    let boolean = match keyword {
        "additionalProperties" | "additionalItems" => false,
        "items" => match value {
            Value::Array(items) => items.iter().any(Value::is_boolean),
            other => other.is_boolean(),
        },
        k if SCHEMA_KEYWORDS.contains(&k) => value.is_boolean(),
        k if SCHEMA_ARRAY_KEYWORDS.contains(&k) => {
            value.as_array().is_some_and(|v| v.iter().any(Value::is_boolean))
        }
        k if SCHEMA_MAP_KEYWORDS.contains(&k) || k == "dependencies" => {
            value.as_object().is_some_and(|m| m.values().any(Value::is_boolean))
        }
        _ => false,
    };
    if boolean {
        Err(format!("draft-04 has no boolean schemas (only additionalProperties and additionalItems may be true or false); {keyword} holds one"))
    } else {
        Ok(())
    }
}

/// Why a document cannot be rewritten: a JSON pointer into the document as written, and
/// what is wrong there.
#[derive(Debug)]
pub(crate) struct Refused {
    pub(crate) pointer: String,
    pub(crate) reason: String,
}

/// `root` in the 2020-12 vocabulary, and its dialect (see the module documentation).
#[cfg(test)]
pub(crate) fn canonical(root: &Value) -> Result<(Dialect, Value), Refused> {
    canonical_in(root, Dialect::Draft2020)
}

/// [`canonical`], reading a document without `$schema` in `default`.
pub(crate) fn canonical_in(root: &Value, default: Dialect) -> Result<(Dialect, Value), Refused> {
    let dialect = match root.get("$schema") {
        None => default,
        Some(Value::String(uri)) => Dialect::from_uri(uri).ok_or_else(|| Refused {
            pointer: "/$schema".to_owned(),
            reason: format!(
                "unknown dialect {uri:?}: expected one of {}",
                Dialect::ALL.iter().map(|d| d.uri()).collect::<Vec<_>>().join(", ")
            ),
        })?,
        Some(other) => {
            return Err(Refused {
                pointer: "/$schema".to_owned(),
                reason: format!("$schema must be a string, found {other}"),
            })
        }
    };
    let base = root
        .get(if dialect == Dialect::Draft4 { "id" } else { "$id" })
        .and_then(Value::as_str)
        .map(|id| id.split('#').next().unwrap_or_default().to_owned())
        .filter(|id| !id.is_empty());
    let mut walk = Walk { dialect, moved: HashMap::new(), anchors: HashMap::new() };
    let mut out = walk.schema(root, "", "")?;
    walk.rewrite_refs(&mut out, base.as_deref());
    Ok((dialect, out))
}

struct Walk {
    dialect: Dialect,
    /// Pointers (as written) whose node moved, to where it is now.
    moved: HashMap<String, String>,
    /// Anchor names to the pointer (rewritten) of their schema.
    anchors: HashMap<String, String>,
}

fn join(pointer: &str, segment: &str) -> String {
    format!("{pointer}/{}", segment.replace('~', "~0").replace('/', "~1"))
}

impl Walk {
    /// One schema node, at `from` as written and `to` in the output.
    fn schema(&mut self, value: &Value, from: &str, to: &str) -> Result<Value, Refused> {
        if from != to {
            self.moved.insert(from.to_owned(), to.to_owned());
        }
        let Value::Object(obj) = value else { return Ok(value.clone()) };
        let d = self.dialect;
        let refused = |key: &str, reason: String| Refused { pointer: join(from, key), reason };
        let mut out = Map::new();
        let mut ignored = Map::new();
        let ref_only = d <= Dialect::Draft7 && obj.contains_key("$ref");

        // Anchors: `$anchor` from 2019-09, a fragment-only `$id` (`id` in draft-04) before.
        let id_key = if d == Dialect::Draft4 { "id" } else { "$id" };
        if let Some(name) = obj.get(id_key).and_then(Value::as_str).and_then(|id| id.strip_prefix('#')) {
            if d <= Dialect::Draft7 && !name.is_empty() {
                self.anchors.insert(name.to_owned(), to.to_owned());
            }
        }
        if let Some(name) = obj.get("$anchor").and_then(Value::as_str) {
            if d >= Dialect::Draft2019 {
                self.anchors.insert(name.to_owned(), to.to_owned());
            }
        }

        for (key, child) in obj {
            let k = key.as_str();
            if d == Dialect::Draft4 {
                draft4_schemas_are_objects(k, child).map_err(|reason| refused(k, reason))?;
            }
            // Up to draft-07 a `$ref` stands alone.
            if ref_only && k != "$ref" {
                ignored.insert(key.clone(), child.clone());
                continue;
            }
            if !d.has(k) || (k == "additionalItems" && !matches!(obj.get("items"), Some(Value::Array(_)))) {
                ignored.insert(key.clone(), child.clone());
                continue;
            }
            match k {
                "id" if d == Dialect::Draft4 => {
                    out.insert("$id".to_owned(), child.clone());
                }
                "exclusiveMinimum" | "exclusiveMaximum" if d == Dialect::Draft4 => {
                    let Value::Bool(exclusive) = child else {
                        return Err(refused(k, format!("{k} is a boolean in draft-04, found {child}")));
                    };
                    let bound = if k == "exclusiveMinimum" { "minimum" } else { "maximum" };
                    if *exclusive {
                        if let Some(limit) = obj.get(bound) {
                            out.insert(k.to_owned(), limit.clone());
                        }
                    }
                }
                "minimum" | "maximum" if d == Dialect::Draft4 => {
                    let exclusive = if k == "minimum" { "exclusiveMinimum" } else { "exclusiveMaximum" };
                    if obj.get(exclusive) != Some(&Value::Bool(true)) {
                        out.insert(key.clone(), child.clone());
                    }
                }
                "exclusiveMinimum" | "exclusiveMaximum" if !child.is_number() => {
                    return Err(refused(k, format!("{k} must be a number in {d}, found {child}")));
                }
                "items" => match child {
                    Value::Array(_) if d == Dialect::Draft2020 => {
                        return Err(refused(
                            k,
                            "items must be one schema in 2020-12 (a tuple is prefixItems)".to_owned(),
                        ));
                    }
                    Value::Array(items) => {
                        let mut prefix = Vec::with_capacity(items.len());
                        for (i, item) in items.iter().enumerate() {
                            let (f, t) = (
                                join(&join(from, k), &i.to_string()),
                                join(&join(to, "prefixItems"), &i.to_string()),
                            );
                            prefix.push(self.schema(item, &f, &t)?);
                        }
                        out.insert("prefixItems".to_owned(), Value::Array(prefix));
                    }
                    other => {
                        let v = self.schema(other, &join(from, k), &join(to, k))?;
                        out.insert(key.clone(), v);
                    }
                },
                "additionalItems" => {
                    let v = self.schema(child, &join(from, k), &join(to, "items"))?;
                    out.insert("items".to_owned(), v);
                }
                "dependencies" => {
                    let Value::Object(deps) = child else {
                        return Err(refused(k, "dependencies must be an object".to_owned()));
                    };
                    let (mut required, mut schemas) = (Map::new(), Map::new());
                    for (name, dep) in deps {
                        if dep.is_array() {
                            required.insert(name.clone(), dep.clone());
                        } else {
                            let f = join(&join(from, k), name);
                            let t = join(&join(to, "dependentSchemas"), name);
                            schemas.insert(name.clone(), self.schema(dep, &f, &t)?);
                        }
                    }
                    for (keyword, map) in [("dependentRequired", required), ("dependentSchemas", schemas)] {
                        if !map.is_empty() {
                            out.insert(keyword.to_owned(), Value::Object(map));
                        }
                    }
                }
                k if SCHEMA_KEYWORDS.contains(&k) => {
                    let v = self.schema(child, &join(from, k), &join(to, k))?;
                    out.insert(key.clone(), v);
                }
                k if SCHEMA_ARRAY_KEYWORDS.contains(&k) => {
                    let Value::Array(items) = child else {
                        return Err(refused(k, format!("{k} must be an array of schemas")));
                    };
                    let mut parts = Vec::with_capacity(items.len());
                    for (i, item) in items.iter().enumerate() {
                        let p = i.to_string();
                        parts.push(self.schema(item, &join(&join(from, k), &p), &join(&join(to, k), &p))?);
                    }
                    out.insert(key.clone(), Value::Array(parts));
                }
                k if SCHEMA_MAP_KEYWORDS.contains(&k) => {
                    let Value::Object(map) = child else {
                        return Err(refused(k, format!("{k} must be an object of schemas")));
                    };
                    let mut schemas = Map::new();
                    for (name, s) in map {
                        let v = self.schema(s, &join(&join(from, k), name), &join(&join(to, k), name))?;
                        schemas.insert(name.clone(), v);
                    }
                    out.insert(key.clone(), Value::Object(schemas));
                }
                _ => {
                    out.insert(key.clone(), child.clone());
                }
            }
        }
        if !ignored.is_empty() {
            let to_ignored = join(to, IGNORED);
            let mut kept = Map::new();
            for (key, child) in ignored {
                let (f, t) = (join(from, &key), join(&to_ignored, &key));
                self.moved.insert(f.clone(), t.clone());
                let child = self.set_aside(&key, &child, &f, &t)?;
                kept.insert(key, child);
            }
            out.insert(IGNORED.to_owned(), Value::Object(kept));
        }
        Ok(Value::Object(out))
    }

    /// A keyword set aside, its schemas still rewritten: a `$ref` may point into it (the
    /// `definitions` beside a draft-07 root `$ref`).
    fn set_aside(&mut self, key: &str, child: &Value, from: &str, to: &str) -> Result<Value, Refused> {
        let each = |walk: &mut Self, items: &[Value]| -> Result<Value, Refused> {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let p = i.to_string();
                out.push(walk.schema(item, &join(from, &p), &join(to, &p))?);
            }
            Ok(Value::Array(out))
        };
        match (key, child) {
            (k, Value::Array(items)) if k == "items" || SCHEMA_ARRAY_KEYWORDS.contains(&k) => {
                each(self, items)
            }
            (k, Value::Object(map)) if SCHEMA_MAP_KEYWORDS.contains(&k) || k == "dependencies" => {
                let mut out = Map::new();
                for (name, s) in map {
                    let v = if s.is_array() {
                        s.clone()
                    } else {
                        self.schema(s, &join(from, name), &join(to, name))?
                    };
                    out.insert(name.clone(), v);
                }
                Ok(Value::Object(out))
            }
            (k, v) if SCHEMA_KEYWORDS.contains(&k) || k == "items" => self.schema(v, from, to),
            (_, v) => Ok(v.clone()),
        }
    }

    /// Every `$ref` in the output pointed at where its target now is.
    fn rewrite_refs(&self, value: &mut Value, base: Option<&str>) {
        match value {
            Value::Object(obj) => {
                for (key, child) in obj.iter_mut() {
                    if key == "$ref" {
                        if let Value::String(reference) = child {
                            if let Some(rewritten) = self.rewrite(reference, base) {
                                *reference = rewritten;
                            }
                        }
                    } else if key != "enum" && key != "const" && key != "default" && key != "examples" {
                        self.rewrite_refs(child, base);
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| self.rewrite_refs(v, base)),
            _ => {}
        }
    }

    fn rewrite(&self, reference: &str, base: Option<&str>) -> Option<String> {
        let (resource, fragment) = reference.split_once('#').unwrap_or((reference, ""));
        let own = resource.is_empty()
            || base
                .is_some_and(|b| b == resource || b.rsplit('/').next().is_some_and(|last| last == resource));
        if !own {
            return None;
        }
        if fragment.is_empty() {
            return Some("#".to_owned());
        }
        if !fragment.starts_with('/') {
            return self.anchors.get(fragment).map(|p| format!("#{p}"));
        }
        let pointer = super::uri::percent_decode(fragment);
        // The longest moved prefix of the pointer decides where it points now.
        let mut cut = pointer.len();
        loop {
            let prefix = &pointer[..cut];
            if let Some(to) = self.moved.get(prefix) {
                return Some(format!("#{to}{}", &pointer[cut..]));
            }
            match prefix.rfind('/') {
                Some(i) if i > 0 => cut = i,
                _ => return Some(format!("#{pointer}")),
            }
        }
    }
}
