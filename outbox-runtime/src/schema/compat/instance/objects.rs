//! Objects: required and named properties, the properties neither side names, counts,
//! property names and dependencies.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use super::shapes::{bounds, child, extra, max_u64, min_u64, property};
use super::values::{self, Tri};
use super::{Instance, Part, Side};
use crate::schema::compat::{finding, Finding, Rule};

static TRUE: Value = Value::Bool(true);

/// The pieces of a part that judge properties it does not name: each pattern's schema,
/// and the schema for the rest.
struct Pieces<'a> {
    patterns: Vec<(&'a str, &'a Value)>,
    rest: &'a Value,
}

fn pieces<'a>(p: &Part<'a>) -> Pieces<'a> {
    let patterns = p
        .get("patternProperties")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    Pieces { patterns, rest: extra(p).unwrap_or(&TRUE) }
}

/// Whether `p` names property `name` (in `properties` or `required`).
fn declares(p: &Part<'_>, name: &str) -> bool {
    p.get("properties").and_then(|m| m.get(name)).is_some()
        || p.get("required").and_then(Value::as_array).is_some_and(|r| r.iter().any(|n| n == name))
}

impl<'a> Instance<'a> {
    /// Whether a writer part writes no property it does not declare: it is closed
    /// (`additionalProperties: false`, no patterns), or it is open and the checker reads
    /// open writers as writing only what they declare (the lenient policy).
    fn closed(&self, p: &Part<'a>) -> bool {
        let pc = pieces(p);
        pc.patterns.is_empty()
            && (*pc.rest == Value::Bool(false) || (self.closed_world && Part::new(pc.rest).is_true()))
    }

    pub(super) fn objects(&mut self, w: &Side<'a>, r: Part<'a>, path: &str) -> Vec<Finding> {
        let rside = Side { doc: self.r, parts: vec![r] };
        let mut found = Vec::new();
        let names_of = |p: &Part<'a>, key: &str| -> Vec<&'a str> {
            match p.get(key) {
                Some(Value::Array(names)) => names.iter().filter_map(Value::as_str).collect(),
                Some(Value::Object(map)) => map.keys().map(String::as_str).collect(),
                _ => Vec::new(),
            }
        };
        let w_required: BTreeSet<&str> = w.parts.iter().flat_map(|p| names_of(p, "required")).collect();
        let r_required = names_of(&r, "required");
        for name in &r_required {
            if !w_required.contains(name) {
                let declared =
                    w.parts.iter().any(|p| p.get("properties").and_then(|m| m.get(*name)).is_some());
                found.extend(finding(
                    &child(path, name),
                    Rule::RequiredAdded,
                    if declared {
                        format!("the reader requires property `{name}`; the writer may omit it (it is optional there)")
                    } else {
                        format!("the reader requires property `{name}`; the writer does not require it")
                    },
                ));
            }
        }
        // Every property either side names, judged by name.
        let mut names: BTreeSet<&str> = BTreeSet::new();
        for p in w.parts.iter().chain([&r]) {
            names.extend(names_of(p, "properties"));
            names.extend(names_of(p, "required"));
            names.extend(names_of(p, "dependentRequired"));
        }
        for name in &names {
            if w.parts.iter().any(|p| self.closed(p) && !declares(p, name)) {
                // The writer never writes `name`.
                continue;
            }
            let wn = property(w, name);
            if wn.parts.iter().any(Part::is_false) {
                continue;
            }
            let rn = property(&rside, name);
            found.extend(self.descend(&wn, &rn, &child(path, name)));
        }
        found.extend(self.other_properties(w, &r, path));
        // Property counts.
        let w_min = max_u64(w, "minProperties").unwrap_or(0).max(w_required.len() as u64);
        let w_max = self.writer_max_properties(w);
        found.extend(bounds(w_min, w_max, &r, ("minProperties", "maxProperties"), "properties", path));
        if let Some(rn) = r.get("propertyNames") {
            found.extend(self.property_names(w, rn, path));
        }
        if let Some(Value::Object(deps)) = r.get("dependentRequired") {
            for (name, needs) in deps {
                let needs: Vec<&str> =
                    needs.as_array().into_iter().flatten().filter_map(Value::as_str).collect();
                let kept = self.never_has(w, name)
                    || needs.iter().all(|n| w_required.contains(n))
                    || w.parts.iter().any(|p| {
                        p.get("dependentRequired")
                            .and_then(|d| d.get(name))
                            .and_then(Value::as_array)
                            .is_some_and(|has| {
                                needs.iter().all(|n| has.iter().any(|h| h.as_str() == Some(n)))
                            })
                    });
                if !kept {
                    found.extend(finding(
                        &child(path, name),
                        Rule::RequiredAdded,
                        format!("the reader requires {} when `{name}` is present (dependentRequired); the writer does not promise that", needs.join(", ")),
                    ));
                }
            }
        }
        found
    }

    /// Properties neither side names: the writer's schema for them (its patterns' and its
    /// `additionalProperties`) must be read by the reader's.
    fn other_properties(&mut self, w: &Side<'a>, r: &Part<'a>, path: &str) -> Vec<Finding> {
        if w.parts.iter().any(|p| self.closed(p)) {
            return Vec::new();
        }
        let rp = pieces(r);
        let r_free = rp.patterns.iter().all(|(_, s)| Part::new(s).is_true_in(self.r))
            && Part::new(rp.rest).is_true_in(self.r);
        if r_free {
            return Vec::new();
        }
        let at = format!("{path}.*");
        let wparts: Vec<Pieces<'a>> = w.parts.iter().map(pieces).collect();
        let mut best: Option<Vec<Finding>> = None;
        for wp in &wparts {
            let mut found = Vec::new();
            let same_patterns = wp.patterns.len() == rp.patterns.len()
                && wp.patterns.iter().all(|(k, _)| rp.patterns.iter().any(|(rk, _)| rk == k));
            let w_pieces: Vec<&'a Value> = wp.patterns.iter().map(|(_, s)| *s).chain([wp.rest]).collect();
            if same_patterns {
                for (k, ws) in &wp.patterns {
                    let rs = rp.patterns.iter().find(|(rk, _)| rk == k).map_or(&TRUE, |(_, s)| *s);
                    found.extend(self.descend(&Side::of(self.w, ws), &Side::of(self.r, rs), &at));
                }
                found.extend(self.extra_piece(wp.rest, rp.rest, &at));
            } else {
                for ws in &w_pieces {
                    for (_, rs) in &rp.patterns {
                        found.extend(self.extra_piece(ws, rs, &at));
                    }
                    found.extend(self.extra_piece(ws, rp.rest, &at));
                }
            }
            if found.is_empty() {
                return found;
            }
            if best.as_ref().is_none_or(|b| found.len() < b.len()) {
                best = Some(found);
            }
        }
        best.unwrap_or_else(|| self.extra_piece(&TRUE, rp.rest, &at))
    }

    fn extra_piece(&mut self, ws: &'a Value, rs: &'a Value, at: &str) -> Vec<Finding> {
        if *ws == Value::Bool(false) || Part::new(rs).is_true_in(self.r) {
            return Vec::new();
        }
        if Part::new(ws).is_true() && *rs == Value::Bool(false) {
            return finding(
                at,
                Rule::ClosedReader,
                "the writer accepts properties it does not declare (an open content model); the reader refuses properties it does not declare",
            );
        }
        self.descend(&Side::of(self.w, ws), &Side::of(self.r, rs), at)
    }

    /// How many properties the writer's objects can have at most.
    fn writer_max_properties(&self, w: &Side<'a>) -> Option<u64> {
        let declared = w
            .parts
            .iter()
            .filter(|p| self.closed(p))
            .map(|p| {
                p.get("properties")
                    .and_then(Value::as_object)
                    .map_or(0, |m| m.values().filter(|s| **s != Value::Bool(false)).count() as u64)
            })
            .min();
        match (min_u64(w, "maxProperties"), declared) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn property_names(&mut self, w: &Side<'a>, rn: &'a Value, path: &str) -> Vec<Finding> {
        let reader = Side::of(self.r, rn);
        for p in &w.parts {
            if let Some(wn) = p.get("propertyNames") {
                if self.descend(&Side::of(self.w, wn), &reader, path).is_empty() {
                    return Vec::new();
                }
            }
        }
        // A closed writer: its declared names, one by one.
        let closed = w.parts.iter().find(|p| self.closed(p));
        let Some(closed) = closed else {
            return finding(
                path,
                Rule::ConstraintTightened,
                "the reader restricts property names (propertyNames); the writer may write any name",
            );
        };
        let mut found = Vec::new();
        let empty = Map::new();
        for (name, s) in closed.get("properties").and_then(Value::as_object).unwrap_or(&empty) {
            if *s == Value::Bool(false) {
                continue;
            }
            match values::accepts(&reader, &Value::String(name.clone()), &mut self.work) {
                Tri::Yes => {}
                Tri::No => found.extend(finding(&child(path, name), Rule::ConstraintTightened, format!("the reader's propertyNames refuses the name `{name}`, which the writer may write"))),
                Tri::Unknown => found.extend(finding(&child(path, name), Rule::CannotProve, format!("cannot prove compatible: cannot tell whether the reader's propertyNames accepts `{name}`"))),
            }
        }
        found
    }
}
