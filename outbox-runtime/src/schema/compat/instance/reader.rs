//! The reader's applicators: unions, conditions, `not` and dependent schemas.

use serde_json::Value;

use super::values::Tri;
use super::{shapes, Instance, Side, Step, Ty};
use crate::schema::compat::{finding, Finding, Rule};

impl<'a> Instance<'a> {
    pub(super) fn reader_step(&mut self, w: &Side<'a>, s: Step<'a>, t: Ty, path: &str) -> Vec<Finding> {
        match s {
            Step::Same(r) => self.sub(w, &r, Some(t), path),
            Step::Union { rest, variants, exclusive } => {
                let mut found = self.sub(w, &rest, Some(t), path);
                found.extend(self.one_of_variants(w, &variants, exclusive, t, path));
                found
            }
            Step::Cond { rest, cond, then, otherwise } => {
                let mut found = self.sub(w, &rest, Some(t), path);
                // (if → then): the writer meets `then`, or never meets `if`.
                let then_found = self.sub(w, &then, Some(t), path);
                if !then_found.is_empty() && self.disjoint(w, &cond, Some(t)) != Tri::Yes {
                    found.extend(then_found);
                }
                // (¬if → else): the writer meets `else`, or always meets `if`.
                let else_found = self.sub(w, &otherwise, Some(t), path);
                if !else_found.is_empty() && !self.sub(w, &cond, Some(t), path).is_empty() {
                    found.extend(else_found);
                }
                found
            }
            Step::Not { rest, negated } => {
                let mut found = self.sub(w, &rest, Some(t), path);
                // A writer under `not A` writes nothing the reader's `not B` refuses when
                // every value B accepts, A accepts.
                let writer_nots: Vec<&'a Value> = w.parts.iter().filter_map(|p| p.value.get("not")).collect();
                let refused_by_writer =
                    writer_nots.into_iter().any(|a| self.within(&negated, &Side::of(w.doc, a), t, path));
                let apart = if refused_by_writer { Tri::Yes } else { self.disjoint(w, &negated, Some(t)) };
                match apart {
                    Tri::Yes => {}
                    Tri::No => found.extend(finding(
                        path,
                        Rule::ValueNotAccepted,
                        "the reader refuses values matching its `not` schema; the writer may write such values",
                    )),
                    Tri::Unknown => found.extend(finding(
                        path,
                        Rule::CannotProve,
                        "cannot prove compatible: the reader's `not` may refuse values the writer writes",
                    )),
                }
                found
            }
            Step::Deps { rest, deps } => {
                let mut found = self.sub(w, &rest, Some(t), path);
                if t == Ty::Obj {
                    for (name, schema) in deps {
                        if self.never_has(w, name) || self.writer_has_same(w, "dependentSchemas", name, schema) {
                            continue;
                        }
                        let dep = Side::of(rest.doc, schema);
                        let dep_found = self.sub(w, &dep, Some(t), path);
                        if !dep_found.is_empty() {
                            found.extend(finding(
                                &shapes::child(path, name),
                                Rule::ConstraintTightened,
                                format!("the reader's dependentSchemas applies when property `{name}` is present; the writer does not promise it"),
                            ));
                        }
                    }
                }
                found
            }
            Step::Dynamic { keyword, .. } => finding(
                path,
                Rule::CannotProve,
                format!("cannot prove compatible: the reader uses `{keyword}`, which this checker does not follow"),
            ),
        }
    }

    /// The writer against a reader union: one variant accepts all of it (and, for
    /// `oneOf`, every other variant is disjoint from it).
    fn one_of_variants(
        &mut self,
        w: &Side<'a>,
        variants: &[Side<'a>],
        exclusive: bool,
        t: Ty,
        path: &str,
    ) -> Vec<Finding> {
        let mut best: Option<Vec<Finding>> = None;
        for (i, v) in variants.iter().enumerate() {
            if v.types() & t.bit() == 0 {
                continue;
            }
            let mut found = self.sub(w, v, Some(t), path);
            if found.is_empty() && exclusive {
                for (j, other) in variants.iter().enumerate() {
                    if j == i {
                        continue;
                    }
                    match self.disjoint(w, other, Some(t)) {
                        Tri::Yes => {}
                        tri => found.extend(finding(
                            path,
                            if tri == Tri::No { Rule::VariantNotAccepted } else { Rule::CannotProve },
                            format!(
                                "{}the reader's oneOf variant {i} accepts what the writer writes, but variant {j} may match it too (oneOf refuses a value that matches two)",
                                if tri == Tri::No { "" } else { "cannot prove compatible: " }
                            ),
                        )),
                    }
                }
            }
            if found.is_empty() {
                return found;
            }
            if best.as_ref().is_none_or(|b| found.len() < b.len()) {
                best = Some(found);
            }
        }
        match best {
            None => finding(
                path,
                Rule::TypeChanged,
                format!("the writer writes {}; no variant of the reader accepts that type", t.name()),
            ),
            Some(found) if variants.len() == 1 => found,
            Some(mut found) => {
                let mut head = finding(
                    path,
                    Rule::VariantNotAccepted,
                    format!(
                        "no one variant of the reader's {} accepts every {} the writer writes; the closest:",
                        if exclusive { "oneOf" } else { "anyOf" },
                        t.name()
                    ),
                );
                head.append(&mut found);
                head
            }
        }
    }

    /// A reader whose `unevaluatedProperties`/`unevaluatedItems` depends on what its
    /// applicators evaluated: not judged.
    pub(super) fn unevaluated_beside_applicators(&self, r: &Side<'a>, path: &str) -> Option<Vec<Finding>> {
        for p in &r.parts {
            for key in ["unevaluatedProperties", "unevaluatedItems"] {
                let Some(v) = p.get(key) else { continue };
                if *v != Value::Bool(true) && p.had_applicators() {
                    return Some(finding(
                        path,
                        Rule::CannotProve,
                        format!("cannot prove compatible: the reader's `{key}` depends on what its applicators evaluate, which this checker does not track"),
                    ));
                }
            }
        }
        None
    }
}
