//! Sides of a comparison: JSON types, the parts of a conjunction, and the steps that
//! expand applicators.

use serde_json::{Map, Value};

use super::super::range::Num;
use crate::schema::dialect::{Dialect, IGNORED};
use crate::schema::document::SchemaDoc;

/// Applicator keywords: each one is expanded before a node is judged as a leaf.
pub(super) const APPLICATORS: [(&str, u16); 8] = [
    ("$ref", 1),
    ("allOf", 2),
    ("anyOf", 4),
    ("oneOf", 8),
    ("if", 16),
    ("not", 32),
    ("dependentSchemas", 64),
    ("$dynamicRef", 128),
];

/// Keywords that constrain instances (2020-12 validation and applicator vocabularies,
/// as the documents are rewritten into); any other keyword is an annotation to validators.
pub(super) const VOCABULARY: &[&str] = &[
    "type",
    "enum",
    "const",
    "multipleOf",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "maxLength",
    "minLength",
    "pattern",
    "format",
    "prefixItems",
    "items",
    "contains",
    "minContains",
    "maxContains",
    "maxItems",
    "minItems",
    "uniqueItems",
    "unevaluatedItems",
    "properties",
    "patternProperties",
    "additionalProperties",
    "unevaluatedProperties",
    "propertyNames",
    "required",
    "dependentRequired",
    "maxProperties",
    "minProperties",
    "$ref",
    "$dynamicRef",
    "$recursiveRef",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "if",
    "then",
    "else",
    "dependentSchemas",
];

/// A JSON type as the checker splits values: integers apart from numbers with a fraction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Ty {
    Null,
    Bool,
    Int,
    Frac,
    Str,
    Arr,
    Obj,
}

impl Ty {
    pub(super) const ALL: [Ty; 7] = [Ty::Null, Ty::Bool, Ty::Int, Ty::Frac, Ty::Str, Ty::Arr, Ty::Obj];

    pub(super) fn bit(self) -> u8 {
        1 << (self as u8)
    }

    /// The type of `value` as validators of `dialect` read it: draft-04's `integer` is
    /// an integer written without a fraction part (`3`, not `3.0`).
    pub(crate) fn of_in(value: &Value, dialect: Dialect) -> Ty {
        match value {
            Value::Number(n) if dialect == Dialect::Draft4 && n.is_f64() => Ty::Frac,
            other => Ty::of(other),
        }
    }

    pub(crate) fn of(value: &Value) -> Ty {
        match value {
            Value::Null => Ty::Null,
            Value::Bool(_) => Ty::Bool,
            Value::Number(n) if n.is_i64() || n.is_u64() => Ty::Int,
            Value::Number(n) if n.as_f64().is_some_and(|f| f.fract() == 0.0) => Ty::Int,
            Value::Number(_) => Ty::Frac,
            Value::String(_) => Ty::Str,
            Value::Array(_) => Ty::Arr,
            Value::Object(_) => Ty::Obj,
        }
    }

    /// The types a `type` keyword's value allows, as a bit set.
    pub(super) fn allowed_by(value: &Value) -> u8 {
        let one = |name: &str| match name {
            "null" => Ty::Null.bit(),
            "boolean" => Ty::Bool.bit(),
            "integer" => Ty::Int.bit(),
            "number" => Ty::Int.bit() | Ty::Frac.bit(),
            "string" => Ty::Str.bit(),
            "array" => Ty::Arr.bit(),
            "object" => Ty::Obj.bit(),
            _ => 0,
        };
        match value {
            Value::String(t) => one(t),
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).fold(0, |acc, t| acc | one(t)),
            _ => ALL_TYPES,
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Ty::Null => "null",
            Ty::Bool => "boolean",
            Ty::Int => "integer",
            Ty::Frac => "number with a fraction",
            Ty::Str => "string",
            Ty::Arr => "array",
            Ty::Obj => "object",
        }
    }
}

pub(super) const ALL_TYPES: u8 = 0b111_1111;

pub(super) fn describe(types: u8) -> String {
    if types == ALL_TYPES {
        return "any type".to_owned();
    }
    if types == 0 {
        return "nothing".to_owned();
    }
    let names: Vec<&str> = Ty::ALL.iter().filter(|t| types & t.bit() != 0).map(|t| t.name()).collect();
    names.join(" or ")
}

/// Keywords about a string's content: annotations from 2019-09, but validators of
/// draft-06 and -07 may check them (the `jsonschema` crate does).
pub(super) const CONTENT: [&str; 2] = ["contentMediaType", "contentEncoding"];

pub(super) fn content_asserted(doc: &SchemaDoc) -> bool {
    matches!(doc.dialect(), Dialect::Draft6 | Dialect::Draft7)
}

/// A keyword the document's dialect does not have, which validators still apply:
/// `dependencies` after draft-07 and `additionalItems` in 2020-12 (the `jsonschema`
/// crate applies both; the specification says to ignore them). The document rewriting
/// set it aside; a reader with one is not judged.
pub(super) fn contested(p: &Part<'_>, doc: &SchemaDoc) -> Option<&'static str> {
    let ignored = p.obj()?.get(IGNORED)?.as_object()?;
    ["dependencies", "additionalItems"].into_iter().find(|k| {
        ignored.contains_key(*k)
            && match *k {
                "dependencies" => doc.dialect() >= Dialect::Draft2019,
                _ => doc.dialect() == Dialect::Draft2020,
            }
    })
}

/// One schema of a conjunction, with the applicators already expanded masked out.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Part<'a> {
    pub(super) value: &'a Value,
    pub(super) skip: u16,
}

impl<'a> Part<'a> {
    pub(super) fn new(value: &'a Value) -> Self {
        Part { value, skip: 0 }
    }

    pub(super) fn skipped(&self, key: &str) -> bool {
        APPLICATORS.iter().any(|(k, bit)| {
            (*k == key || (*k == "if" && (key == "then" || key == "else"))) && self.skip & bit != 0
        })
    }

    pub(crate) fn get(&self, key: &str) -> Option<&'a Value> {
        if self.skipped(key) {
            return None;
        }
        self.value.as_object()?.get(key)
    }

    pub(crate) fn obj(&self) -> Option<&'a Map<String, Value>> {
        self.value.as_object()
    }

    pub(super) fn is_false(&self) -> bool {
        *self.value == Value::Bool(false)
    }

    /// Whether the part constrains nothing (left).
    pub(super) fn is_true(&self) -> bool {
        match self.value {
            Value::Bool(b) => *b,
            Value::Object(o) => !o.keys().any(|k| VOCABULARY.contains(&k.as_str()) && !self.skipped(k)),
            _ => true,
        }
    }

    /// [`Part::is_true`] as a reader of `doc`'s dialect sees it: up to draft-07,
    /// `contentMediaType` and `contentEncoding` may be checked by validators.
    pub(super) fn is_true_in(&self, doc: &SchemaDoc) -> bool {
        self.is_true() && !(content_asserted(doc) && CONTENT.iter().any(|k| self.get(k).is_some()))
    }

    /// Whether the schema as written has an applicator (for `unevaluated*`, which then
    /// depends on what the applicators evaluated).
    pub(super) fn had_applicators(&self) -> bool {
        self.obj().is_some_and(|o| APPLICATORS.iter().any(|(k, _)| o.contains_key(*k)))
    }
}

/// A conjunction of schemas of one document.
#[derive(Clone)]
pub(crate) struct Side<'a> {
    pub(super) doc: &'a SchemaDoc,
    pub(super) parts: Vec<Part<'a>>,
}

impl<'a> Side<'a> {
    pub(crate) fn of(doc: &'a SchemaDoc, value: &'a Value) -> Self {
        Side { doc, parts: vec![Part::new(value)] }
    }

    pub(super) fn with(&self, parts: impl IntoIterator<Item = Part<'a>>) -> Self {
        Side { doc: self.doc, parts: parts.into_iter().collect() }
    }

    pub(super) fn and(&self, more: impl IntoIterator<Item = &'a Value>) -> Self {
        let mut parts = self.parts.clone();
        parts.extend(more.into_iter().map(Part::new));
        Side { doc: self.doc, parts }
    }

    /// The types every part allows (`type`, `const` and `enum` kept as written).
    pub(super) fn types(&self) -> u8 {
        let mut types = ALL_TYPES;
        for p in &self.parts {
            if p.is_false() {
                return 0;
            }
            if let Some(t) = p.get("type") {
                types &= Ty::allowed_by(t);
            }
            if let Some(c) = p.get("const") {
                types &= Ty::of(c).bit();
            }
            if let Some(Value::Array(values)) = p.get("enum") {
                types &= values.iter().fold(0, |acc, v| acc | Ty::of(v).bit());
            }
            // An integer `multipleOf` leaves no number with a fraction.
            if matches!(p.get("multipleOf").and_then(Num::of), Some(Num::Int(m)) if m != 0) {
                types &= !Ty::Frac.bit();
            }
        }
        types
    }

    /// The first applicator left to expand, as the part's index and the keyword.
    pub(super) fn next_applicator(&self) -> Option<(usize, &'static str, u16)> {
        self.parts.iter().enumerate().find_map(|(i, p)| {
            let obj = p.obj()?;
            APPLICATORS
                .iter()
                .find(|(k, bit)| {
                    p.skip & bit == 0
                        && (obj.contains_key(*k)
                            || (*k == "$dynamicRef" && obj.contains_key("$recursiveRef")))
                })
                .map(|(k, bit)| (i, *k, *bit))
        })
    }

    /// The side with part `i` masked by `bit`, and the extra parts added.
    pub(super) fn expanded(&self, i: usize, bit: u16, extra: impl IntoIterator<Item = &'a Value>) -> Self {
        let mut parts = self.parts.clone();
        parts[i].skip |= bit;
        parts.extend(extra.into_iter().map(Part::new));
        Side { doc: self.doc, parts }
    }
}

/// One expansion of an applicator.
pub(super) enum Step<'a> {
    /// An equivalent conjunction (`$ref`, `allOf`).
    Same(Side<'a>),
    /// `rest ∧ (v1 ∨ v2 ∨ ...)`; `exclusive` for `oneOf` (exactly one).
    Union { rest: Side<'a>, variants: Vec<Side<'a>>, exclusive: bool },
    /// `rest ∧ (if → then) ∧ (¬if → else)`.
    Cond { rest: Side<'a>, cond: Side<'a>, then: Side<'a>, otherwise: Side<'a> },
    /// `rest ∧ ¬negated`.
    Not { rest: Side<'a>, negated: Side<'a> },
    /// `rest ∧` for each `(name, s)`: if the object has `name`, it is valid against `s`.
    Deps { rest: Side<'a>, deps: &'a Map<String, Value> },
    /// `$dynamicRef` / `$recursiveRef`: not followed.
    Dynamic { rest: Side<'a>, keyword: &'static str },
}

pub(super) fn step<'a>(side: &Side<'a>) -> Option<Step<'a>> {
    let (i, key, bit) = side.next_applicator()?;
    let part = side.parts[i];
    let rest = side.expanded(i, bit, []);
    let sub = |v: &'a Value| Side::of(side.doc, v);
    Some(match key {
        "$ref" => {
            let target = part.get("$ref").and_then(Value::as_str).and_then(|r| side.doc.resolve(r));
            // Documents are checked to resolve every `$ref`; a miss reads as `true`.
            Step::Same(side.expanded(i, bit, target))
        }
        "allOf" => {
            let parts = part.get("allOf").and_then(Value::as_array).into_iter().flatten();
            Step::Same(side.expanded(i, bit, parts))
        }
        "anyOf" | "oneOf" => {
            let variants = part.get(key).and_then(Value::as_array).into_iter().flatten().map(sub).collect();
            Step::Union { rest, variants, exclusive: key == "oneOf" }
        }
        "if" => {
            let get = |k: &str| sub(part.get(k).unwrap_or(&Value::Bool(true)));
            Step::Cond { rest, cond: get("if"), then: get("then"), otherwise: get("else") }
        }
        "not" => Step::Not { rest, negated: sub(part.get("not").unwrap_or(&Value::Bool(false))) },
        "dependentSchemas" => match part.get("dependentSchemas") {
            Some(Value::Object(deps)) => Step::Deps { rest, deps },
            _ => Step::Same(rest),
        },
        _ => Step::Dynamic {
            rest,
            keyword: if part.get("$dynamicRef").is_some() { "$dynamicRef" } else { "$recursiveRef" },
        },
    })
}
