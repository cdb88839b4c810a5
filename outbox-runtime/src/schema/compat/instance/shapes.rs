//! Leaves by type: numbers, strings, arrays and objects of a writer conjunction against
//! one reader schema.

use serde_json::Value;

use super::values;
use super::{Instance, Part, Side};
use crate::schema::compat::range::{End, Num, Range};
use crate::schema::compat::{finding, Finding, Rule};
use crate::schema::document::{ecma_regex, SchemaDoc};

pub(super) use crate::schema::compat::parts::child;

/// What applies to property `name` of an object, on each part of `side`: its
/// `properties` entry and every `patternProperties` entry whose pattern matches, or
/// else `additionalProperties` (or an `unevaluatedProperties` that acts as one).
pub(crate) fn property<'a>(side: &Side<'a>, name: &str) -> Side<'a> {
    let mut out = Vec::new();
    for p in &side.parts {
        let mut named = false;
        if let Some(s) = p.get("properties").and_then(|m| m.get(name)) {
            out.push(s);
            named = true;
        }
        for (pattern, s) in p.get("patternProperties").and_then(Value::as_object).into_iter().flatten() {
            match ecma_regex(pattern) {
                Ok(re) if re.find(name).is_some() => {
                    out.push(s);
                    named = true;
                }
                Ok(_) => {}
                // Documents are checked to compile; an unknown match leaves the value free.
                Err(_) => named = true,
            }
        }
        if !named {
            out.extend(extra(p));
        }
    }
    side.with(out.into_iter().map(Part::new))
}

/// The schema for properties a part neither declares nor matches by pattern.
pub(super) fn extra<'a>(p: &Part<'a>) -> Option<&'a Value> {
    p.get("additionalProperties").or_else(|| {
        let unevaluated = p.get("unevaluatedProperties")?;
        (!p.had_applicators()).then_some(unevaluated)
    })
}

/// The schema for array item `i`, on each part of `side`.
pub(crate) fn items_at<'a>(side: &Side<'a>, i: usize) -> Side<'a> {
    let mut out = Vec::new();
    for p in &side.parts {
        let prefix = p.get("prefixItems").and_then(Value::as_array);
        if let Some(s) = prefix.and_then(|items| items.get(i)) {
            out.push(s);
        } else if let Some(s) = p.get("items") {
            out.push(s);
        } else if let Some(s) = p.get("unevaluatedItems") {
            if !p.had_applicators() && p.get("contains").is_none() {
                out.push(s);
            }
        }
    }
    side.with(out.into_iter().map(Part::new))
}

pub(super) fn max_u64(side: &Side<'_>, key: &str) -> Option<u64> {
    side.parts.iter().filter_map(|p| p.get(key)?.as_u64()).max()
}

pub(super) fn min_u64(side: &Side<'_>, key: &str) -> Option<u64> {
    side.parts.iter().filter_map(|p| p.get(key)?.as_u64()).min()
}

/// Count bounds (`minLength`, `maxItems`, ...): the reader's must hold for every writer value.
pub(super) fn bounds(
    w_min: u64,
    w_max: Option<u64>,
    r: &Part<'_>,
    keys: (&str, &str),
    what: &str,
    path: &str,
) -> Vec<Finding> {
    let mut found = Vec::new();
    if let Some(rmin) = r.get(keys.0).and_then(Value::as_u64) {
        if w_min < rmin {
            found.extend(finding(
                path,
                Rule::ConstraintTightened,
                format!("the reader requires {} {rmin} ({what}); the writer's minimum is {w_min}", keys.0),
            ));
        }
    }
    if let Some(rmax) = r.get(keys.1).and_then(Value::as_u64) {
        if w_max.is_none_or(|m| m > rmax) {
            found.extend(finding(
                path,
                Rule::ConstraintTightened,
                format!(
                    "the reader allows at most {rmax} ({}, {what}); the writer's maximum is {}",
                    keys.1,
                    w_max.map_or("unbounded".to_owned(), |m| m.to_string())
                ),
            ));
        }
    }
    found
}

/// A side's range over all its parts, with integer ends made inclusive.
pub(super) fn range_of(w: &Side<'_>, t: super::Ty) -> Range {
    let kind = if t == super::Ty::Int { "integer" } else { "number" };
    let mut out = Range::default();
    for p in &w.parts {
        let r = Range::of_value(p.value, kind, false);
        if let Some(m) = r.min {
            if out.min.is_none_or(|c| !c.at_least(&m)) {
                out.min = Some(m);
            }
        }
        if let Some(m) = r.max {
            if out.max.is_none_or(|c| !c.at_most(&m)) {
                out.max = Some(m);
            }
        }
    }
    if t == super::Ty::Int {
        out.min = out.min.map(|e| integer_end(e, true));
        out.max = out.max.map(|e| integer_end(e, false));
    }
    out
}

/// An end of a range of integers as the nearest inclusive integer end.
fn integer_end(e: End, low: bool) -> End {
    let value = match e.value {
        Num::Int(i) if e.exclusive => Num::Int(if low { i + 1 } else { i - 1 }),
        Num::Int(i) => Num::Int(i),
        Num::Float(f) if f.is_finite() && f.abs() < 1e30 => {
            let g = if low { f.ceil() } else { f.floor() };
            let g = if e.exclusive && g == f {
                if low {
                    g + 1.0
                } else {
                    g - 1.0
                }
            } else {
                g
            };
            // In range by the check above.
            #[allow(clippy::cast_possible_truncation)]
            Num::Int(g as i128)
        }
        other => return End { value: other, exclusive: e.exclusive },
    };
    End { value, exclusive: false }
}

pub(crate) fn numbers(w: &Side<'_>, r: Part<'_>, t: super::Ty, path: &str) -> Vec<Finding> {
    let mut found = Vec::new();
    let kind = if t == super::Ty::Int { "integer" } else { "number" };
    let wr = range_of(w, t);
    let rr = Range::of_value(r.value, kind, false);
    if !wr.within(&rr) {
        found.extend(finding(
            path,
            Rule::RangeNarrowed,
            format!("the reader accepts {}; the writer may write {}", rr.describe(kind), wr.describe(kind)),
        ));
    }
    if let Some(rm) = r.get("multipleOf").and_then(Num::of) {
        let divides = |wm: Num| match (wm, rm) {
            (Num::Int(a), Num::Int(b)) => b != 0 && a % b == 0,
            (a, b) => {
                let q = a.as_f64() / b.as_f64();
                q.is_finite() && q == q.round() && q != 0.0
            }
        };
        let one = |m: Num| match m {
            Num::Int(1) => true,
            Num::Int(_) => false,
            // 0.5, 0.25, ...: every integer is a multiple when 1/m is an exact integer.
            Num::Float(f) => (1.0 / f).fract() == 0.0 && (1.0 / f) * f == 1.0,
        };
        let ok = w.parts.iter().filter_map(|p| p.get("multipleOf").and_then(Num::of)).any(divides)
            || (t == super::Ty::Int && one(rm));
        if !ok {
            found.extend(finding(
                path,
                Rule::ConstraintTightened,
                format!("the reader requires multiples of {rm}; the writer does not promise that"),
            ));
        }
    }
    found
}

/// A pattern every string matches: no anchor, assertion or back-reference, and it
/// matches the empty string (so an unanchored search finds it at the start of any string).
fn universal(pattern: &str) -> bool {
    const SPECIAL: [&str; 9] = ["^", "$", "\\b", "\\B", "(?=", "(?!", "(?<=", "(?<!", "\\k"];
    !SPECIAL.iter().any(|s| pattern.contains(s))
        && !pattern.chars().zip(pattern.chars().skip(1)).any(|(a, b)| a == '\\' && b.is_ascii_digit())
        && ecma_regex(pattern).is_ok_and(|re| re.find("").is_some())
}

pub(crate) fn strings(w: &Side<'_>, r: Part<'_>, reader: &SchemaDoc, path: &str) -> Vec<Finding> {
    let w_min = max_u64(w, "minLength").unwrap_or(0);
    let w_max = min_u64(w, "maxLength");
    let mut found = bounds(w_min, w_max, &r, ("minLength", "maxLength"), "string length", path);
    if let Some(rp) = r.get("pattern").and_then(Value::as_str) {
        let promised = w.parts.iter().any(|p| p.get("pattern").and_then(Value::as_str) == Some(rp));
        if !promised && !universal(rp) && w_max != Some(0) {
            found.extend(finding(
                path,
                Rule::ConstraintTightened,
                format!("the reader requires strings matching pattern {rp:?}; the writer does not promise that pattern"),
            ));
        }
    }
    if super::content_asserted(reader) {
        for key in super::CONTENT {
            let Some(rc) = r.get(key) else { continue };
            let promised = super::content_asserted(w.doc) && w.parts.iter().any(|p| p.get(key) == Some(rc));
            if !promised {
                found.extend(finding(
                    path,
                    Rule::ConstraintTightened,
                    format!(
                        "the reader ({}) may check strings' `{key}` {rc}; the writer does not promise it",
                        reader.dialect()
                    ),
                ));
            }
        }
    }
    if let Some(rf) = r.get("format").and_then(Value::as_str) {
        let promised = w.parts.iter().any(|p| p.get("format").and_then(Value::as_str) == Some(rf));
        if !promised && values::asserted_format(rf) {
            found.extend(finding(
                path,
                Rule::FormatAdded,
                format!(
                    "the reader requires strings in format `{rf}`; the writer does not promise that format"
                ),
            ));
        }
    }
    found
}

impl<'a> Instance<'a> {
    pub(super) fn arrays(&mut self, w: &Side<'a>, r: Part<'a>, path: &str) -> Vec<Finding> {
        let rside = Side { doc: self.r, parts: vec![r] };
        let closed_len = w
            .parts
            .iter()
            .filter(|p| p.get("items") == Some(&Value::Bool(false)))
            .map(|p| p.get("prefixItems").and_then(Value::as_array).map_or(0, Vec::len) as u64)
            .min();
        let w_min = max_u64(w, "minItems").unwrap_or(0);
        let w_max = match (min_u64(w, "maxItems"), closed_len) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let mut found = bounds(w_min, w_max, &r, ("minItems", "maxItems"), "items", path);
        if w_max.is_some_and(|m| m < w_min) {
            return Vec::new();
        }
        let prefix_len = |p: &Part<'_>| p.get("prefixItems").and_then(Value::as_array).map_or(0, Vec::len);
        let longest = w.parts.iter().map(prefix_len).chain([prefix_len(&r)]).max().unwrap_or(0);
        let mut open_end = true;
        for i in 0..longest {
            if w_max.is_some_and(|m| i as u64 >= m) {
                open_end = false;
                break;
            }
            let wi = items_at(w, i);
            if wi.parts.iter().any(Part::is_false) {
                open_end = false;
                break;
            }
            found.extend(self.descend(&wi, &items_at(&rside, i), &format!("{path}[{i}]")));
        }
        if open_end && w_max.is_none_or(|m| m > longest as u64) {
            let wi = items_at(w, longest);
            if !wi.parts.iter().any(Part::is_false) {
                found.extend(self.descend(&wi, &items_at(&rside, longest), &format!("{path}[*]")));
            }
        }
        if r.get("uniqueItems") == Some(&Value::Bool(true))
            && !w.parts.iter().any(|p| p.get("uniqueItems") == Some(&Value::Bool(true)))
            && w_max.is_none_or(|m| m > 1)
        {
            found.extend(finding(
                path,
                Rule::ConstraintTightened,
                "the reader requires unique items; the writer may repeat items",
            ));
        }
        if let Some(rc) = r.get("contains") {
            found.extend(self.contains(w, &r, rc, w_min, path));
        }
        if let Some(v) = r.get("unevaluatedItems") {
            if *v != Value::Bool(true) && r.get("contains").is_some() {
                found.extend(finding(
                    path,
                    Rule::CannotProve,
                    "cannot prove compatible: the reader's `unevaluatedItems` depends on its `contains`",
                ));
            }
        }
        found
    }

    fn contains(
        &mut self,
        w: &Side<'a>,
        r: &Part<'a>,
        rc: &'a Value,
        w_min: u64,
        path: &str,
    ) -> Vec<Finding> {
        let min = r.get("minContains").and_then(Value::as_u64).unwrap_or(1);
        let max = r.get("maxContains").and_then(Value::as_u64);
        if min == 0 && max.is_none() {
            return Vec::new();
        }
        let same_as_reader = |p: &Part<'a>| {
            ["contains", "minContains", "maxContains"].iter().all(|k| match (p.get(k), r.get(k)) {
                (None, None) => true,
                (Some(a), Some(b)) => super::same_nearby(a, self.w, b, self.r),
                _ => false,
            })
        };
        if w.parts.iter().any(same_as_reader) {
            return Vec::new();
        }
        if min == 1 && max.is_none() {
            let rside = Side::of(self.r, rc);
            for p in &w.parts {
                if let Some(wc) = p.get("contains") {
                    if p.get("minContains").and_then(Value::as_u64).unwrap_or(1) >= 1
                        && self.descend(&Side::of(self.w, wc), &rside, path).is_empty()
                    {
                        return Vec::new();
                    }
                }
            }
            if w_min >= 1 && self.descend(&items_at(w, 0), &rside, &format!("{path}[0]")).is_empty() {
                return Vec::new();
            }
            return finding(
                path,
                Rule::ConstraintTightened,
                "the reader requires an item matching its `contains`; the writer does not promise one",
            );
        }
        finding(
            path,
            Rule::CannotProve,
            "cannot prove compatible: the reader's `minContains`/`maxContains` differ from the writer's",
        )
    }
}
