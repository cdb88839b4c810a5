//! JSON Schema instance semantics: the writer schema W is compatible with the reader
//! schema R when every JSON value W accepts, R accepts (L(W) ⊆ L(R)).
//!
//! The checker proves inclusion; whatever it cannot prove it reports, never passes. It is
//! sound by construction in three ways:
//! - a writer is only ever widened: a keyword it does not need to prove the inclusion
//!   (`not`, `dependentSchemas`, `if`, a `format`, an unknown keyword) is dropped, which
//!   can only add values to the writer's set;
//! - a reader is never widened: a reader keyword is judged exactly, or the inclusion is
//!   reported as `cannot-prove` with the keyword named;
//! - a writer with finitely many values (`const`, `enum`, `boolean`, `null`) is judged
//!   value by value with a validator that answers yes, no or "cannot tell".
//!
//! Values are split by JSON type first (null, boolean, integer, number with a fraction,
//! string, array, object), so a union of types on either side is judged type by type.
//! Recursive schemas end coinductively: a pair met again after descending into a property
//! or item is assumed to hold, which is sound because JSON values are finite.

use serde_json::Value;

use super::{finding, Finding, Rule};
use crate::schema::dialect::Dialect;
use crate::schema::document::SchemaDoc;

mod disjoint;
mod objects;
mod reader;
mod same;
mod shapes;
mod side;
mod values;

use self::same::{same, same_nearby};
use self::side::{content_asserted, contested, describe, step, Step, ALL_TYPES, CONTENT};
pub(crate) use self::side::{Part, Side, Ty};
use self::values::{Tri, Work};

/// How much work one comparison may do before it answers `cannot-prove`: a crafted schema
/// pair could otherwise take exponential time through nested unions.
const BUDGET: usize = 200_000;
/// How deep expansions may go without descending into a property or item.
const MAX_UNGUARDED: usize = 64;
/// How many properties or items deep a comparison may descend (a chain of `$ref`s to
/// ever other definitions has no cycle to stop it).
const MAX_DESCENT: usize = 1024;

/// A writer with no value of type `t`: its own bounds (minimum above maximum, ...) say so.
fn writes_none(w: &Side<'_>, t: Ty) -> bool {
    match t {
        Ty::Int | Ty::Frac => disjoint::range_empty(w, t),
        Ty::Str => disjoint::counts_empty(w, "minLength", "maxLength"),
        Ty::Arr => disjoint::counts_empty(w, "minItems", "maxItems"),
        Ty::Obj => disjoint::counts_empty(w, "minProperties", "maxProperties"),
        Ty::Null | Ty::Bool => false,
    }
}

/// The parts of one side by address and mask: a key of a pair on the stack.
type PairKey = Vec<(usize, u16)>;

/// The checker of one writer/reader pair.
pub(crate) struct Instance<'a> {
    w: &'a SchemaDoc,
    r: &'a SchemaDoc,
    /// Pairs under comparison after descending into a property or item.
    stack: Vec<(PairKey, PairKey)>,
    work: Work,
    unguarded: usize,
    /// Open writers write only the properties they declare (the lenient policy; unsound
    /// against JSON Schema instance semantics, sound against writers that keep to it).
    closed_world: bool,
}

/// Everything that stops `reader` from accepting a value `writer` accepts; with
/// `closed_world`, of the values that hold no property the writer's schema does not
/// declare where it leaves them open.
pub(crate) fn includes(writer: &SchemaDoc, reader: &SchemaDoc, closed_world: bool) -> Vec<Finding> {
    if same(writer.root(), writer, reader.root(), reader) {
        return Vec::new();
    }
    let mut cx = Instance {
        w: writer,
        r: reader,
        stack: Vec::new(),
        work: Work::new(BUDGET),
        unguarded: 0,
        closed_world,
    };
    let mut found = cx.sub(&Side::of(writer, writer.root()), &Side::of(reader, reader.root()), None, "$");
    found.sort_by(|a, b| (&a.path, a.rule, &a.reason).cmp(&(&b.path, b.rule, &b.reason)));
    found.dedup();
    found
}

impl<'a> Instance<'a> {
    /// Everything that stops `r` from accepting what `w` accepts, for values of type `ty`
    /// (every type when `None`), at instance path `path`.
    fn sub(&mut self, w: &Side<'a>, r: &Side<'a>, ty: Option<Ty>, path: &str) -> Vec<Finding> {
        if !self.work.spend() {
            return finding(
                path,
                Rule::CannotProve,
                "cannot prove compatible: the schemas are too large to compare here (work budget spent)",
            );
        }
        if let ([wp], [rp]) = (w.parts.as_slice(), r.parts.as_slice()) {
            if wp.skip == 0 && rp.skip == 0 && same_nearby(wp.value, w.doc, rp.value, r.doc) {
                return Vec::new();
            }
        }
        if r.parts.iter().all(|p| p.is_true_in(r.doc)) {
            return Vec::new();
        }
        if w.parts.iter().any(Part::is_false) {
            return Vec::new();
        }
        // A writer of finitely many values: each one against the reader.
        if let Some(values) = values::finite(w) {
            return self.values(w, &values, r, ty, path);
        }
        let types = w.types() & ty.map_or(ALL_TYPES, Ty::bit);
        let Some(t) = ty else {
            // Types no reader part allows, as one finding; the others one by one.
            let rtypes = r.types();
            // Types the writer has no value of (minimum above maximum, ...) are not refused.
            let none = Ty::ALL.iter().filter(|t| writes_none(w, **t)).fold(0, |acc, t| acc | t.bit());
            let refused = types & !rtypes & !none;
            let mut found = Vec::new();
            if refused != 0 {
                let (rule, what) = if refused == Ty::Null.bit() {
                    (Rule::NullNotAccepted, "null here (an optional or nullable value)".to_owned())
                } else if refused == ALL_TYPES & !rtypes && types == ALL_TYPES {
                    (Rule::TypeChanged, "any JSON value here".to_owned())
                } else {
                    (Rule::TypeChanged, describe(refused))
                };
                let why = if refused == Ty::Frac.bit() && rtypes & Ty::Int.bit() != 0 {
                    "the writer writes numbers that may have a fraction; the reader accepts only integers"
                        .to_owned()
                } else {
                    format!("the writer may write {what}; the reader accepts only {}", describe(rtypes))
                };
                found.extend(finding(path, rule, why));
            }
            for t in Ty::ALL.iter().filter(|t| types & rtypes & t.bit() != 0) {
                found.extend(self.sub(w, r, Some(*t), path));
            }
            return found;
        };
        if types == 0 {
            return Vec::new();
        }
        if self.unguarded > MAX_UNGUARDED {
            return finding(
                path,
                Rule::CannotProve,
                "cannot prove compatible: references expand without end here",
            );
        }
        // The writer's applicators first: afterwards the writer is one conjunction of leaves.
        if let Some(s) = step(w) {
            self.unguarded += 1;
            let found = self.writer_step(s, r, t, path);
            self.unguarded -= 1;
            return found;
        }
        if let Some(found) = self.unevaluated_beside_applicators(r, path) {
            return found;
        }
        if let Some(keyword) = r.parts.iter().find_map(|p| contested(p, r.doc)) {
            return finding(
                path,
                Rule::CannotProve,
                format!("cannot prove compatible: the reader has `{keyword}`, which {} does not define but some validators still apply", r.doc.dialect()),
            );
        }
        if let Some(s) = step(r) {
            self.unguarded += 1;
            let found = self.reader_step(w, s, t, path);
            self.unguarded -= 1;
            return found;
        }
        let mut found = Vec::new();
        for rp in &r.parts {
            found.extend(self.leaf(w, *rp, t, path));
        }
        found
    }

    /// Whether every value of type `t` that `inner` accepts, `outer` accepts: the
    /// question asked the other way round (`inner` in the reader's document, `outer` in
    /// the writer's), so each side is read in its own document and dialect, and without
    /// the lenient policy's closed world, which is about what the writer writes.
    fn within(&mut self, inner: &Side<'a>, outer: &Side<'a>, t: Ty, path: &str) -> bool {
        let saved = (self.w, self.r, self.closed_world, std::mem::take(&mut self.stack));
        (self.w, self.r, self.closed_world) = (inner.doc, outer.doc, false);
        let found = self.sub(inner, outer, Some(t), path);
        (self.w, self.r, self.closed_world, self.stack) = saved;
        found.is_empty()
    }

    fn writer_step(&mut self, s: Step<'a>, r: &Side<'a>, t: Ty, path: &str) -> Vec<Finding> {
        match s {
            Step::Same(w) => self.sub(&w, r, Some(t), path),
            Step::Union { rest, variants, .. } => {
                // A `oneOf` writer accepts fewer values than the `anyOf` judged here.
                let mut found = Vec::new();
                for v in variants {
                    let w = rest.and(v.parts.iter().map(|p| p.value));
                    found.extend(self.sub(&w, r, Some(t), path));
                }
                found
            }
            Step::Cond { rest, cond, then, otherwise } => {
                let mut found = self.sub(
                    &rest.and(cond.parts.iter().chain(&then.parts).map(|p| p.value)),
                    r,
                    Some(t),
                    path,
                );
                found.extend(self.sub(&rest.and(otherwise.parts.iter().map(|p| p.value)), r, Some(t), path));
                found
            }
            // Dropped: the writer only widens.
            Step::Not { rest, .. } | Step::Deps { rest, .. } | Step::Dynamic { rest, .. } => {
                self.sub(&rest, r, Some(t), path)
            }
        }
    }

    /// Values a writer can write, judged one by one.
    fn values(
        &mut self,
        w: &Side<'a>,
        values: &[&Value],
        r: &Side<'a>,
        ty: Option<Ty>,
        path: &str,
    ) -> Vec<Finding> {
        let mut found = Vec::new();
        // `1` and `1.0` are the same JSON Schema value, so a writer of one may write both;
        // only draft-04 tells them apart (its `integer` refuses `1.0`).
        let forms: Vec<Value> = values.iter().flat_map(|v| values::forms(v)).collect();
        for value in &forms {
            if ty.is_some_and(|t| t != Ty::of(value)) {
                continue;
            }
            // A value the writer's own schema refuses is never written.
            if values::accepts(w, value, &mut self.work) == Tri::No {
                continue;
            }
            match values::accepts(r, value, &mut self.work) {
                Tri::Yes => {}
                Tri::No => found.extend(finding(
                    path,
                    if value.is_null() { Rule::NullNotAccepted } else { Rule::ValueNotAccepted },
                    format!("the writer may write {}, which the reader refuses", values::shown(value)),
                )),
                Tri::Unknown => found.extend(finding(
                    path,
                    Rule::CannotProve,
                    format!(
                        "cannot prove compatible: cannot tell whether the reader accepts {}",
                        values::shown(value)
                    ),
                )),
            }
        }
        found
    }

    /// The writer never writes property `name` (its schema there is `false`).
    fn never_has(&self, w: &Side<'a>, name: &str) -> bool {
        shapes::property(w, name).parts.iter().any(Part::is_false)
    }

    /// A writer part has the reader's `keyword` entry for `name`, the same schema.
    fn writer_has_same(&self, w: &Side<'a>, keyword: &str, name: &str, schema: &Value) -> bool {
        // As written: the writer's own `dependentSchemas` was dropped (widened) on expansion,
        // but it still holds for every value the writer writes.
        w.parts.iter().any(|p| {
            p.value
                .get(keyword)
                .and_then(|m| m.get(name))
                .is_some_and(|ws| same_nearby(ws, w.doc, schema, self.r))
        })
    }

    /// Whether no value is accepted by both sides (`Yes` only when proven).
    fn disjoint(&mut self, a: &Side<'a>, b: &Side<'a>, ty: Option<Ty>) -> Tri {
        disjoint::disjoint(a, b, ty, &mut self.work, 0)
    }

    /// A writer leaf conjunction against one reader leaf, both restricted to type `t`.
    fn leaf(&mut self, w: &Side<'a>, r: Part<'a>, t: Ty, path: &str) -> Vec<Finding> {
        if r.is_false() {
            return finding(
                path,
                Rule::TypeChanged,
                format!("the writer writes {}; the reader accepts nothing here (schema `false`)", t.name()),
            );
        }
        let rtypes = r.get("type").map_or(ALL_TYPES, Ty::allowed_by);
        if t == Ty::Int
            && self.r.dialect() == Dialect::Draft4
            && rtypes & Ty::Frac.bit() == 0
            && rtypes & Ty::Int.bit() != 0
        {
            // Draft-04 validators read `3.0` as a number that is not an integer; only a
            // draft-04 writer of type integer never writes one.
            let writer_integers = self.w.dialect() == Dialect::Draft4
                && w.parts
                    .iter()
                    .any(|p| p.get("type").is_some_and(|t| Ty::allowed_by(t) & Ty::Frac.bit() == 0));
            if !writer_integers {
                return finding(path, Rule::TypeChanged, "the reader is draft-04, whose `integer` refuses integers written with a fraction part (3.0); the writer may write them");
            }
        }
        if rtypes & t.bit() == 0 {
            let rule = if t == Ty::Null { Rule::NullNotAccepted } else { Rule::TypeChanged };
            let why = if t == Ty::Frac && rtypes & Ty::Int.bit() != 0 {
                "the writer writes numbers that may have a fraction; the reader accepts only integers"
                    .to_owned()
            } else {
                format!("the writer writes {}; the reader accepts only {}", t.name(), describe(rtypes))
            };
            return finding(path, rule, why);
        }
        if let Some(allowed) = r
            .get("const")
            .map(std::slice::from_ref)
            .or_else(|| r.get("enum").and_then(Value::as_array).map(Vec::as_slice))
        {
            // The writer is not finite here (that was judged value by value): only a
            // reader that lists every value of the type accepts all of it.
            let whole = match t {
                Ty::Null => allowed.contains(&Value::Null),
                Ty::Bool => allowed.contains(&Value::Bool(true)) && allowed.contains(&Value::Bool(false)),
                _ => false,
            };
            if !whole {
                let shown: Vec<String> = allowed.iter().take(8).map(values::shown).collect();
                return finding(
                    path,
                    Rule::ValueNotAccepted,
                    format!(
                        "the reader accepts only {}; the writer may write any {}",
                        shown.join(", "),
                        t.name()
                    ),
                );
            }
        }
        if writes_none(w, t) {
            return Vec::new();
        }
        let mut found = match t {
            Ty::Null | Ty::Bool => Vec::new(),
            Ty::Int | Ty::Frac => shapes::numbers(w, r, t, path),
            Ty::Str => shapes::strings(w, r, self.r, path),
            Ty::Arr => self.arrays(w, r, path),
            Ty::Obj => self.objects(w, r, path),
        };
        if r.get("$recursiveRef").is_some() {
            found.extend(finding(
                path,
                Rule::CannotProve,
                "cannot prove compatible: the reader uses `$recursiveRef`",
            ));
        }
        found
    }

    /// Descends into a property or an item: a pair met again on the way is assumed to hold.
    fn descend(&mut self, w: &Side<'a>, r: &Side<'a>, path: &str) -> Vec<Finding> {
        let keys = |s: &Side<'a>| {
            let mut k: Vec<(usize, u16)> =
                s.parts.iter().map(|p| (std::ptr::from_ref(p.value) as usize, p.skip)).collect();
            k.sort_unstable();
            k
        };
        let key = (keys(w), keys(r));
        if self.stack.contains(&key) {
            return Vec::new();
        }
        if self.stack.len() >= MAX_DESCENT {
            return finding(
                path,
                Rule::CannotProve,
                format!("cannot prove compatible: values nest more than {MAX_DESCENT} properties or items deep here"),
            );
        }
        self.stack.push(key);
        let saved = std::mem::replace(&mut self.unguarded, 0);
        let found = self.sub(w, r, None, path);
        self.unguarded = saved;
        self.stack.pop();
        found
    }
}

#[cfg(test)]
mod tests;
