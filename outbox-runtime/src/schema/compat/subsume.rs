//! The checker: everything that stops a reader from reading what a writer writes.

use std::collections::BTreeSet;

use serde_json::Value;

use super::node::{expand, Expanded, Node, Term, UNDERSTOOD};
use super::parts::{
    bounds, describe_types, finite_values, items_of, strings, tag_of, true_schema, type_accepts,
};
use super::range::{Num, Range};
use super::{finding, Finding, Rule, SchemaDoc};

pub(super) struct Checker<'a> {
    pub(super) w: &'a SchemaDoc,
    pub(super) r: &'a SchemaDoc,
    /// Node pairs being compared, to end recursion through `$ref` cycles (coinductively:
    /// a pair met again on its own path is assumed compatible).
    pub(super) stack: Vec<(*const Value, *const Value)>,
    /// How deep `sub` is: a `$ref` cycle with no property or item on it (`D0` being
    /// `{"$ref": "#/$defs/D0"}`) would otherwise recurse until the stack overflows.
    pub(super) depth: usize,
    /// The same for value acceptance (`accept`), which takes `&self`.
    pub(super) accept_depth: std::cell::Cell<usize>,
}

/// How deep the checker goes before it answers `cannot-prove`.
const MAX_DEPTH: usize = 256;

impl<'a> Checker<'a> {
    /// Everything that stops `r` from reading what `w` writes, at instance path `path`.
    pub(super) fn sub(&mut self, w: &Term<'a>, r: &Term<'a>, path: &str) -> Vec<Finding> {
        if self.depth >= MAX_DEPTH {
            return finding(
                path,
                Rule::CannotProve,
                "cannot prove compatible: references here expand without end",
            );
        }
        self.depth += 1;
        let found = self.sub_inner(w, r, path);
        self.depth -= 1;
        found
    }

    fn sub_inner(&mut self, w: &Term<'a>, r: &Term<'a>, path: &str) -> Vec<Finding> {
        // 1. A writer union: every alternative must be readable (exact).
        if let Term::Any(ws) = w {
            return ws.iter().flat_map(|wi| self.sub(wi, r, path)).collect();
        }
        // 2. A writer that can produce only a few values: check each against the whole reader.
        if let Term::Node(wn) = w {
            match expand(*wn, self.w) {
                Expanded::Term(t) => return self.sub(&t, r, path),
                Expanded::Nothing => return Vec::new(),
                Expanded::Leaf(leaf) => {
                    if let Some(values) = finite_values(&leaf) {
                        return self.values_readable(&values, r, path);
                    }
                }
                Expanded::Anything => {}
            }
        }
        // 3. A reader intersection: the writer must satisfy every part (exact).
        if let Term::All(rs) = r {
            return rs.iter().flat_map(|ri| self.sub(w, ri, path)).collect();
        }
        // 4. A writer intersection: enough that one part is readable.
        if let Term::All(ws) = w {
            return self.best_of(ws.iter().map(|wi| (wi, r)), path);
        }
        let Term::Node(wn) = w else { return Vec::new() };
        // 5. Expand the reader.
        let rn = match r {
            Term::Node(rn) => match expand(*rn, self.r) {
                Expanded::Term(t) => return self.sub(w, &t, path),
                Expanded::Anything => return Vec::new(),
                Expanded::Nothing => {
                    return finding(
                        path,
                        Rule::TypeChanged,
                        "the reader accepts nothing here (schema `false`)",
                    )
                }
                Expanded::Leaf(rn) => rn,
            },
            Term::Any(rs) => return self.sub_union(*wn, rs, path),
            Term::All(_) => return Vec::new(),
        };
        let wn = match expand(*wn, self.w) {
            Expanded::Leaf(wn) => wn,
            _ => {
                return finding(
                    path,
                    Rule::TypeChanged,
                    format!(
                        "the writer may write any JSON value here; the reader accepts only {}",
                        describe_types(&rn.types())
                    ),
                )
            }
        };
        let key = (wn.value as *const Value, rn.value as *const Value);
        if self.stack.contains(&key) {
            return Vec::new();
        }
        self.stack.push(key);
        let found = self.leaf(wn, rn, path);
        self.stack.pop();
        found
    }

    /// The findings of the most readable of several alternatives (none if one is fully readable).
    pub(super) fn best_of<'t>(
        &mut self,
        pairs: impl Iterator<Item = (&'t Term<'a>, &'t Term<'a>)>,
        path: &str,
    ) -> Vec<Finding>
    where
        'a: 't,
    {
        let mut best: Option<Vec<Finding>> = None;
        for (w, r) in pairs {
            let found = self.sub(w, r, path);
            if found.is_empty() {
                return found;
            }
            if best.as_ref().is_none_or(|b| found.len() < b.len()) {
                best = Some(found);
            }
        }
        best.unwrap_or_default()
    }

    /// A writer leaf against a reader union: it must be readable by one variant.
    pub(super) fn sub_union(&mut self, wn: Node<'a>, rs: &[Term<'a>], path: &str) -> Vec<Finding> {
        let w = Term::Node(wn);
        let wleaf = match expand(wn, self.w) {
            Expanded::Leaf(leaf) => Some(leaf),
            _ => None,
        };
        let w_type = wleaf.and_then(|l| l.types()).and_then(|t| t.first().copied());
        let mut candidates: Vec<(usize, Vec<Finding>, bool, bool)> = Vec::new();
        for (i, ri) in rs.iter().enumerate() {
            let found = self.sub(&w, ri, path);
            if found.is_empty() {
                return found;
            }
            let same_type =
                w_type.is_some_and(|t| self.term_types(ri).is_none_or(|ts| type_accepts(&Some(ts), t)));
            let tag_match = wleaf.is_some_and(|wl| self.tags_match(&wl, ri));
            candidates.push((i, found, same_type, tag_match));
        }
        let typed: Vec<_> = candidates.iter().filter(|c| c.2).collect();
        if typed.is_empty() {
            let accepted: BTreeSet<String> =
                rs.iter().map(|ri| describe_types(&self.term_types(ri))).collect();
            let accepted = accepted.into_iter().collect::<Vec<_>>().join(", ");
            return match w_type {
                Some("null") => finding(path, Rule::NullNotAccepted, format!("the writer may write null here (an optional or nullable value); the reader accepts only {accepted}")),
                Some(t) => finding(path, Rule::TypeChanged, format!("the writer writes {t}; the reader accepts only {accepted}")),
                None => finding(path, Rule::VariantNotAccepted, "no reader variant accepts what the writer writes here"),
            };
        }
        if let Some(found) = wleaf.and_then(|wl| self.unknown_tag(&wl, rs, path)) {
            return found;
        }
        let tagged: Vec<_> = typed.iter().filter(|c| c.3).collect();
        let chosen = match tagged.as_slice() {
            [one] => *one,
            _ => typed.iter().min_by_key(|c| c.1.len()).copied().unwrap_or(typed[0]),
        };
        if typed.len() == 1 || chosen.3 {
            return chosen.1.clone();
        }
        let mut found = finding(
            path,
            Rule::VariantNotAccepted,
            format!(
                "this writer variant matches none of the reader's {} variants; closest is variant {}:",
                rs.len(),
                chosen.0
            ),
        );
        found.extend(chosen.1.iter().cloned());
        found
    }

    /// The JSON types a reader term allows at its top, `None` for any.
    pub(super) fn term_types(&self, t: &Term<'a>) -> Option<Vec<&'a str>> {
        self.term_types_at(t, 0)
    }

    /// [`Self::term_types`], `depth` expansions in: a `$ref` cycle reads as any type.
    fn term_types_at(&self, t: &Term<'a>, depth: usize) -> Option<Vec<&'a str>> {
        if depth > 64 {
            return None;
        }
        match t {
            Term::Node(n) => match expand(*n, self.r) {
                Expanded::Leaf(l) => l.types(),
                Expanded::Term(t) => self.term_types_at(&t, depth + 1),
                Expanded::Anything => None,
                Expanded::Nothing => Some(Vec::new()),
            },
            Term::Any(ts) => {
                let mut all = Vec::new();
                for t in ts {
                    all.extend(self.term_types_at(t, depth + 1)?);
                }
                Some(all)
            }
            Term::All(ts) => ts.iter().find_map(|t| self.term_types_at(t, depth + 1)),
        }
    }

    /// A writer variant whose tag (a `const` property, as serde's tagged enums write) no
    /// reader variant carries: reported as one finding rather than as field differences.
    pub(super) fn unknown_tag(&self, w: &Node<'a>, rs: &[Term<'a>], path: &str) -> Option<Vec<Finding>> {
        let wprops = w.get("properties").and_then(Value::as_object)?;
        for (name, ws) in wprops {
            let Some(wtag) = tag_of(self.w, ws) else { continue };
            let reader_tags: Vec<Value> = rs
                .iter()
                .filter_map(|ri| self.reader_leaf(ri))
                .filter_map(|rl| rl.get("properties").and_then(Value::as_object)?.get(name))
                .filter_map(|rs| tag_of(self.r, rs))
                .collect();
            if !reader_tags.is_empty() && !reader_tags.contains(&wtag) {
                let known: Vec<String> = reader_tags.iter().map(Value::to_string).collect();
                return Some(finding(
                    path,
                    Rule::VariantNotAccepted,
                    format!(
                        "the writer may write the variant with `{name}` = {wtag}; the reader knows only {}",
                        known.join(", ")
                    ),
                ));
            }
        }
        None
    }

    /// The leaf a reader term stands for, looking through `$ref` and single-part terms.
    pub(super) fn reader_leaf(&self, t: &Term<'a>) -> Option<Node<'a>> {
        self.reader_leaf_at(t, 0)
    }

    fn reader_leaf_at(&self, t: &Term<'a>, depth: usize) -> Option<Node<'a>> {
        if depth > 64 {
            return None;
        }
        match t {
            Term::Node(n) => match expand(*n, self.r) {
                Expanded::Leaf(l) => Some(l),
                Expanded::Term(t) => self.reader_leaf_at(&t, depth + 1),
                _ => None,
            },
            Term::All(ts) => ts.iter().find_map(|t| self.reader_leaf_at(t, depth + 1)),
            Term::Any(_) => None,
        }
    }

    /// Whether the writer leaf and a reader variant share a discriminating `const` property.
    pub(super) fn tags_match(&self, w: &Node<'a>, r: &Term<'a>) -> bool {
        self.tags_match_at(w, r, 0)
    }

    fn tags_match_at(&self, w: &Node<'a>, r: &Term<'a>, depth: usize) -> bool {
        if depth > 64 {
            return false;
        }
        let Some(wprops) = w.get("properties").and_then(Value::as_object) else { return false };
        let rnode = match r {
            Term::Node(n) => match expand(*n, self.r) {
                Expanded::Leaf(l) => l,
                Expanded::Term(t) => return self.tags_match_at(w, &t, depth + 1),
                _ => return false,
            },
            Term::All(ts) => return ts.iter().any(|t| self.tags_match_at(w, t, depth + 1)),
            Term::Any(_) => return false,
        };
        let Some(rprops) = rnode.get("properties").and_then(Value::as_object) else { return false };
        wprops.iter().any(|(name, ws)| {
            rprops.get(name).is_some_and(|rs| {
                let (wt, rt) = (tag_of(self.w, ws), tag_of(self.r, rs));
                wt.is_some() && wt == rt
            })
        })
    }

    /// Each value must validate against the reader.
    pub(super) fn values_readable(&mut self, values: &[Value], r: &Term<'a>, path: &str) -> Vec<Finding> {
        let mut found = Vec::new();
        for value in values {
            if let Err(why) = self.accepts(r, value, path) {
                let rule = if value.is_null() { Rule::NullNotAccepted } else { why.rule };
                found.push(Finding {
                    path: why.path,
                    rule,
                    reason: format!("the writer may write {value}, which the reader rejects: {}", why.reason),
                });
            }
        }
        found
    }

    pub(super) fn leaf(&mut self, w: Node<'a>, r: Node<'a>, path: &str) -> Vec<Finding> {
        let w_types = w.types();
        let Some(w_types) = w_types else {
            if r.types().is_none() && self.unknown_reader_keywords(&w, &r, path).is_empty() {
                return Vec::new();
            }
            return finding(
                path,
                Rule::CannotProve,
                "cannot prove compatible: the writer's schema here declares no type",
            );
        };
        let mut found = Vec::new();
        let r_types = r.types();
        for t in w_types {
            if !type_accepts(&r_types, t) {
                let (rule, reason) = if t == "null" {
                    (Rule::NullNotAccepted, format!("the writer may write null here (an optional or nullable value); the reader accepts only {}", describe_types(&r_types)))
                } else if t == "number" && type_accepts(&r_types, "integer") {
                    (Rule::TypeChanged, "the writer writes numbers that may have a fraction; the reader accepts only integers".to_owned())
                } else {
                    (
                        Rule::TypeChanged,
                        format!(
                            "the writer writes {t}; the reader accepts only {}",
                            describe_types(&r_types)
                        ),
                    )
                };
                found.extend(finding(path, rule, reason));
                continue;
            }
            if let Some(allowed) = r
                .get("const")
                .map(|c| vec![c.clone()])
                .or_else(|| r.get("enum").and_then(Value::as_array).cloned())
            {
                let shown: Vec<String> = allowed.iter().map(Value::to_string).collect();
                found.extend(finding(
                    path,
                    Rule::ValueNotAccepted,
                    format!("the reader accepts only {}; the writer may write any {t}", shown.join(", ")),
                ));
                continue;
            }
            match t {
                "integer" | "number" => found.extend(self.numbers(&w, &r, t, path)),
                "string" => found.extend(strings(&w, &r, path)),
                "array" => found.extend(self.arrays(&w, &r, path)),
                "object" => found.extend(self.objects(&w, &r, path)),
                _ => {}
            }
        }
        found.extend(self.unknown_reader_keywords(&w, &r, path));
        found
    }

    /// Reader keywords the checker does not understand are fine only when the writer has
    /// the very same constraint.
    pub(super) fn unknown_reader_keywords(&self, w: &Node<'a>, r: &Node<'a>, path: &str) -> Vec<Finding> {
        let mut found = Vec::new();
        for key in r.constraint_keys() {
            if UNDERSTOOD.contains(&key) {
                continue;
            }
            if w.get(key).is_some() && w.get(key) == r.get(key) {
                continue;
            }
            found.extend(finding(
                path,
                Rule::CannotProve,
                format!("cannot prove compatible: the reader uses keyword `{key}`, which this checker does not understand, and the writer does not have the same constraint"),
            ));
        }
        if let Some(Value::Object(_)) = r.get("unevaluatedProperties") {
            found.extend(finding(
                path,
                Rule::CannotProve,
                "cannot prove compatible: the reader's `unevaluatedProperties` is a schema",
            ));
        }
        found
    }

    pub(super) fn numbers(&mut self, w: &Node<'a>, r: &Node<'a>, t: &str, path: &str) -> Vec<Finding> {
        let mut found = Vec::new();
        let wr = Range::of(w, t);
        let rr = Range::of(r, t);
        if !wr.within(&rr) {
            found.extend(finding(
                path,
                Rule::RangeNarrowed,
                format!("the reader accepts {}; the writer may write {}", rr.describe(t), wr.describe(t)),
            ));
        }
        if let Some(rm) = r.get("multipleOf").and_then(Num::of) {
            let ok = w.get("multipleOf").and_then(Num::of).is_some_and(|wm| wm.is_multiple_of(&rm));
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

    pub(super) fn arrays(&mut self, w: &Node<'a>, r: &Node<'a>, path: &str) -> Vec<Finding> {
        let mut found = Vec::new();
        let (w_prefix, w_rest) = items_of(w);
        let (r_prefix, r_rest) = items_of(r);
        let any = true_schema();
        for i in 0..w_prefix.len().max(r_prefix.len()) {
            let wi = w_prefix.get(i).copied().or(w_rest).unwrap_or(any);
            if wi == &Value::Bool(false) {
                continue;
            }
            let ri = r_prefix.get(i).copied().or(r_rest).unwrap_or(any);
            found.extend(self.sub(&Term::root(wi), &Term::root(ri), &format!("{path}[{i}]")));
        }
        let wi = w_rest.unwrap_or(any);
        if wi != &Value::Bool(false) {
            let ri = r_rest.unwrap_or(any);
            found.extend(self.sub(&Term::root(wi), &Term::root(ri), &format!("{path}[*]")));
        }
        found.extend(bounds(w, r, "minItems", "maxItems", "items", path));
        if r.get("uniqueItems") == Some(&Value::Bool(true))
            && w.get("uniqueItems") != Some(&Value::Bool(true))
        {
            found.extend(finding(
                path,
                Rule::ConstraintTightened,
                "the reader requires unique items (a set); the writer may repeat items",
            ));
        }
        found
    }
}
