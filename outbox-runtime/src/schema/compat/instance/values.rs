//! Single values against a schema (yes, no, or cannot tell), finite writers, and
//! disjointness of two schemas (for `not`, `oneOf` and `if`).

use serde_json::Value;

use super::{Part, Side, Ty};
use crate::schema::compat::accept::format_holds;
use crate::schema::compat::range::{End, Num};
use crate::schema::document::ecma_regex;

/// What a comparison may still spend: steps left, and the nesting of the current one.
#[derive(Debug)]
pub(crate) struct Work {
    left: usize,
    depth: usize,
}

impl Work {
    pub(crate) fn new(steps: usize) -> Self {
        Work { left: steps, depth: 0 }
    }

    /// One step, if any is left.
    pub(crate) fn spend(&mut self) -> bool {
        if self.left == 0 {
            return false;
        }
        self.left -= 1;
        true
    }
}

/// A three-valued answer: `Unknown` whenever the checker cannot be sure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tri {
    Yes,
    No,
    Unknown,
}

impl Tri {
    fn and(self, other: Tri) -> Tri {
        match (self, other) {
            (Tri::No, _) | (_, Tri::No) => Tri::No,
            (Tri::Yes, Tri::Yes) => Tri::Yes,
            _ => Tri::Unknown,
        }
    }

    fn not(self) -> Tri {
        match self {
            Tri::Yes => Tri::No,
            Tri::No => Tri::Yes,
            Tri::Unknown => Tri::Unknown,
        }
    }

    fn of(b: bool) -> Tri {
        if b {
            Tri::Yes
        } else {
            Tri::No
        }
    }
}

/// A value for a message: JSON, cut at 60 characters.
pub(crate) fn shown(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() <= 60 {
        text
    } else {
        format!("{}...", text.chars().take(57).collect::<String>())
    }
}

/// JSON Schema's equality: numbers by value (`1` equals `1.0`), objects without order.
pub(crate) fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(_), Value::Number(_)) => match (Num::of(a), Num::of(b)) {
            (Some(x), Some(y)) => x.cmp(y) == std::cmp::Ordering::Equal,
            _ => false,
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_eq(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

/// The ways a value can be written: an integer also as a float (`1` and `1.0`), which
/// are one value to JSON Schema but two to draft-04's `integer`.
pub(crate) fn forms(v: &Value) -> Vec<Value> {
    match v {
        Value::Number(n) if n.is_f64() => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => {
                // In range by the check above.
                #[allow(clippy::cast_possible_truncation)]
                let i = f as i64;
                vec![v.clone(), Value::from(i)]
            }
            _ => vec![v.clone()],
        },
        Value::Number(n) => match n.as_f64().and_then(serde_json::Number::from_f64) {
            Some(f) if n.as_i64().is_some_and(|i| i.unsigned_abs() < 9_000_000_000_000_000) => {
                vec![v.clone(), Value::Number(f)]
            }
            _ => vec![v.clone()],
        },
        _ => vec![v.clone()],
    }
}

static NULL: Value = Value::Null;
static FALSE: Value = Value::Bool(false);
static TRUE: Value = Value::Bool(true);

/// The values a side can have, when they are finitely many: those of its first `const`
/// or `enum`, or `null` and the booleans when its types allow nothing else. The other
/// parts are not applied here: values they refuse are dropped by the caller.
pub(crate) fn finite<'a>(side: &Side<'a>) -> Option<Vec<&'a Value>> {
    for p in &side.parts {
        if let Some(c) = p.get("const") {
            return Some(vec![c]);
        }
        if let Some(Value::Array(values)) = p.get("enum") {
            return Some(values.iter().collect());
        }
    }
    let types = side.types();
    if types & !(Ty::Null.bit() | Ty::Bool.bit()) == 0 {
        let mut out = Vec::new();
        if types & Ty::Null.bit() != 0 {
            out.push(&NULL);
        }
        if types & Ty::Bool.bit() != 0 {
            out.extend([&FALSE, &TRUE]);
        }
        return Some(out);
    }
    None
}

/// Whether every part of `side` accepts `value`.
pub(crate) fn accepts(side: &Side<'_>, value: &Value, work: &mut Work) -> Tri {
    let mut all = Tri::Yes;
    for p in &side.parts {
        all = all.and(part(side, *p, value, work));
        if all == Tri::No {
            return all;
        }
    }
    all
}

/// How deep a value's schemas may nest, `$ref`s included, before the answer is `Unknown`:
/// a `$ref` cycle that never reaches a property or item would otherwise not end.
const MAX_DEPTH: usize = 96;

fn schema(side: &Side<'_>, s: &Value, value: &Value, work: &mut Work) -> Tri {
    if work.depth > MAX_DEPTH {
        return Tri::Unknown;
    }
    work.depth += 1;
    let verdict = part(side, Part::new(s), value, work);
    work.depth -= 1;
    verdict
}

/// Formats validators check; any other `format` is ignored by them.
const CHECKED_FORMATS: &[&str] = &[
    "date-time",
    "date",
    "time",
    "duration",
    "email",
    "idn-email",
    "hostname",
    "idn-hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "iri",
    "iri-reference",
    "uuid",
    "uri-template",
    "json-pointer",
    "relative-json-pointer",
    "regex",
];

/// Whether validators may check strings in `format` (they ignore formats they do not know).
pub(crate) fn asserted_format(format: &str) -> bool {
    CHECKED_FORMATS.contains(&format)
}

fn part(side: &Side<'_>, p: Part<'_>, value: &Value, work: &mut Work) -> Tri {
    if !work.spend() {
        return Tri::Unknown;
    }
    let obj = match p.value {
        Value::Bool(b) => return Tri::of(*b),
        Value::Object(o) => o,
        _ => return Tri::Yes,
    };
    if super::contested(&p, side.doc).is_some() {
        return Tri::Unknown;
    }
    let mut verdict = Tri::Yes;
    let t = Ty::of_in(value, side.doc.dialect());
    for (key, kv) in obj {
        if p.skipped(key) {
            continue;
        }
        let here = match key.as_str() {
            "type" => Tri::of(Ty::allowed_by(kv) & t.bit() != 0),
            "const" => Tri::of(json_eq(kv, value)),
            "enum" => Tri::of(kv.as_array().is_some_and(|vs| vs.iter().any(|v| json_eq(v, value)))),
            "$ref" => match kv.as_str().and_then(|r| side.doc.resolve(r)) {
                Some(target) => schema(side, target, value, work),
                None => Tri::Unknown,
            },
            "$dynamicRef" | "$recursiveRef" => Tri::Unknown,
            "allOf" => each(kv).fold(Tri::Yes, |acc, s| {
                if acc == Tri::No {
                    acc
                } else {
                    acc.and(schema(side, s, value, work))
                }
            }),
            "anyOf" => {
                let mut out = Tri::No;
                for s in each(kv) {
                    match schema(side, s, value, work) {
                        Tri::Yes => {
                            out = Tri::Yes;
                            break;
                        }
                        Tri::Unknown => out = Tri::Unknown,
                        Tri::No => {}
                    }
                }
                out
            }
            "oneOf" => {
                let (mut yes, mut unknown) = (0, 0);
                for s in each(kv) {
                    match schema(side, s, value, work) {
                        Tri::Yes => yes += 1,
                        Tri::Unknown => unknown += 1,
                        Tri::No => {}
                    }
                }
                match (yes, unknown) {
                    (1, 0) => Tri::Yes,
                    (0, 0) => Tri::No,
                    (y, _) if y > 1 => Tri::No,
                    _ => Tri::Unknown,
                }
            }
            "not" => schema(side, kv, value, work).not(),
            "if" => match schema(side, kv, value, work) {
                Tri::Yes => obj.get("then").map_or(Tri::Yes, |s| schema(side, s, value, work)),
                Tri::No => obj.get("else").map_or(Tri::Yes, |s| schema(side, s, value, work)),
                Tri::Unknown => Tri::Unknown,
            },
            "dependentSchemas" => match (kv, value) {
                (Value::Object(deps), Value::Object(map)) => deps
                    .iter()
                    .filter(|(name, _)| map.contains_key(*name))
                    .fold(Tri::Yes, |acc, (_, s)| acc.and(schema(side, s, value, work))),
                _ => Tri::Yes,
            },
            "contentMediaType" | "contentEncoding" if super::content_asserted(side.doc) => {
                match (key.as_str(), value) {
                    ("contentMediaType", Value::String(s)) if kv == "application/json" => {
                        Tri::of(serde_json::from_str::<Value>(s).is_ok())
                    }
                    (_, Value::String(_)) => Tri::Unknown,
                    _ => Tri::Yes,
                }
            }
            _ => match value {
                Value::Number(_) => number(key, kv, value),
                Value::String(s) => string(key, kv, s),
                Value::Array(items) => array(side, p, key, kv, items, work),
                Value::Object(map) => object(side, p, key, kv, map, work),
                _ => Tri::Yes,
            },
        };
        verdict = verdict.and(here);
        if verdict == Tri::No {
            return verdict;
        }
    }
    verdict
}

fn each(v: &Value) -> impl Iterator<Item = &Value> {
    v.as_array().into_iter().flatten()
}

fn number(key: &str, kv: &Value, value: &Value) -> Tri {
    let (Some(v), Some(limit)) = (Num::of(value), Num::of(kv)) else { return Tri::Yes };
    let at = End { value: v, exclusive: false };
    match key {
        "minimum" => Tri::of(at.at_least(&End { value: limit, exclusive: false })),
        "exclusiveMinimum" => Tri::of(at.at_least(&End { value: limit, exclusive: true })),
        "maximum" => Tri::of(at.at_most(&End { value: limit, exclusive: false })),
        "exclusiveMaximum" => Tri::of(at.at_most(&End { value: limit, exclusive: true })),
        "multipleOf" => match (v, limit) {
            (Num::Int(a), Num::Int(b)) => Tri::of(b != 0 && a % b == 0),
            // Validators differ on floating point multiples: only a clear answer counts.
            _ => {
                let q = v.as_f64() / limit.as_f64();
                if !q.is_finite() {
                    Tri::Unknown
                } else if (q - q.round()).abs() > 1e-6 {
                    Tri::No
                } else if q == q.round() {
                    Tri::Yes
                } else {
                    Tri::Unknown
                }
            }
        },
        _ => Tri::Yes,
    }
}

fn string(key: &str, kv: &Value, s: &str) -> Tri {
    let len = s.chars().count() as u64;
    match key {
        "minLength" => Tri::of(kv.as_u64().is_none_or(|m| len >= m)),
        "maxLength" => Tri::of(kv.as_u64().is_none_or(|m| len <= m)),
        "pattern" => match kv.as_str().map(ecma_regex) {
            Some(Ok(re)) => Tri::of(re.find(s).is_some()),
            _ => Tri::Unknown,
        },
        "format" => match kv.as_str() {
            Some(f) if !CHECKED_FORMATS.contains(&f) => Tri::Yes,
            // Whether a validator asserts formats is its setting: a value in the format is
            // accepted by both kinds; one that is not may be refused or not.
            Some("uuid") if format_holds("uuid", s) == Some(true) => Tri::Yes,
            _ => Tri::Unknown,
        },
        _ => Tri::Yes,
    }
}

fn array(side: &Side<'_>, p: Part<'_>, key: &str, kv: &Value, items: &[Value], work: &mut Work) -> Tri {
    let n = items.len() as u64;
    match key {
        "minItems" => Tri::of(kv.as_u64().is_none_or(|m| n >= m)),
        "maxItems" => Tri::of(kv.as_u64().is_none_or(|m| n <= m)),
        "uniqueItems" => Tri::of(
            *kv != Value::Bool(true)
                || items.iter().enumerate().all(|(i, a)| items[i + 1..].iter().all(|b| !json_eq(a, b))),
        ),
        "prefixItems" => each(kv).zip(items).fold(Tri::Yes, |acc, (s, v)| {
            if acc == Tri::No {
                acc
            } else {
                acc.and(schema(side, s, v, work))
            }
        }),
        "items" => {
            let skip = p.get("prefixItems").and_then(Value::as_array).map_or(0, Vec::len);
            items.iter().skip(skip).fold(Tri::Yes, |acc, v| {
                if acc == Tri::No {
                    acc
                } else {
                    acc.and(schema(side, kv, v, work))
                }
            })
        }
        "unevaluatedItems" => {
            if p.had_applicators() || p.get("contains").is_some() {
                return Tri::Unknown;
            }
            if p.get("items").is_some() {
                return Tri::Yes;
            }
            let skip = p.get("prefixItems").and_then(Value::as_array).map_or(0, Vec::len);
            items.iter().skip(skip).fold(Tri::Yes, |acc, v| acc.and(schema(side, kv, v, work)))
        }
        "contains" => {
            let min = p.get("minContains").and_then(Value::as_u64).unwrap_or(1);
            let max = p.get("maxContains").and_then(Value::as_u64);
            let (mut yes, mut unknown) = (0u64, 0u64);
            for v in items {
                match schema(side, kv, v, work) {
                    Tri::Yes => yes += 1,
                    Tri::Unknown => unknown += 1,
                    Tri::No => {}
                }
            }
            let low = if yes >= min {
                Tri::Yes
            } else if yes + unknown >= min {
                Tri::Unknown
            } else {
                Tri::No
            };
            let high = match max {
                None => Tri::Yes,
                Some(m) if yes + unknown <= m => Tri::Yes,
                Some(m) if yes > m => Tri::No,
                Some(_) => Tri::Unknown,
            };
            low.and(high)
        }
        _ => Tri::Yes,
    }
}

fn object(
    side: &Side<'_>,
    p: Part<'_>,
    key: &str,
    kv: &Value,
    map: &serde_json::Map<String, Value>,
    work: &mut Work,
) -> Tri {
    let n = map.len() as u64;
    match key {
        "minProperties" => Tri::of(kv.as_u64().is_none_or(|m| n >= m)),
        "maxProperties" => Tri::of(kv.as_u64().is_none_or(|m| n <= m)),
        "required" => Tri::of(each(kv).filter_map(Value::as_str).all(|name| map.contains_key(name))),
        "dependentRequired" => Tri::of(kv.as_object().into_iter().flatten().all(|(name, needs)| {
            !map.contains_key(name) || each(needs).filter_map(Value::as_str).all(|n| map.contains_key(n))
        })),
        "propertyNames" => map.keys().fold(Tri::Yes, |acc, k| {
            if acc == Tri::No {
                acc
            } else {
                acc.and(schema(side, kv, &Value::String(k.clone()), work))
            }
        }),
        "properties" => {
            kv.as_object().into_iter().flatten().fold(Tri::Yes, |acc, (name, s)| match map.get(name) {
                Some(v) if acc != Tri::No => acc.and(schema(side, s, v, work)),
                _ => acc,
            })
        }
        "patternProperties" => {
            let mut out = Tri::Yes;
            for (pattern, s) in kv.as_object().into_iter().flatten() {
                let Ok(re) = ecma_regex(pattern) else { return Tri::Unknown };
                for (k, v) in map {
                    if re.find(k).is_some() {
                        out = out.and(schema(side, s, v, work));
                    }
                }
            }
            out
        }
        "additionalProperties" | "unevaluatedProperties" => {
            if key == "unevaluatedProperties" {
                if p.had_applicators() {
                    return Tri::Unknown;
                }
                if p.get("additionalProperties").is_some() {
                    return Tri::Yes;
                }
            }
            let declared = p.get("properties").and_then(Value::as_object);
            let patterns: Vec<_> = p
                .get("patternProperties")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .map(|(pattern, _)| ecma_regex(pattern))
                .collect();
            if patterns.iter().any(Result::is_err) {
                return Tri::Unknown;
            }
            let mut out = Tri::Yes;
            for (k, v) in map {
                let named = declared.is_some_and(|d| d.contains_key(k))
                    || patterns.iter().flatten().any(|re| re.find(k).is_some());
                if !named {
                    out = out.and(schema(side, kv, v, work));
                    if out == Tri::No {
                        return out;
                    }
                }
            }
            out
        }
        _ => Tri::Yes,
    }
}
