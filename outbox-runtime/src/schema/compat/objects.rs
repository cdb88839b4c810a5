//! Objects under serde semantics: declared properties, required ones, and the keys a
//! writer that is a map may write.

use serde_json::Value;

use super::node::{Node, Term};
use super::parts::{
    bounds, child, empty_map, reader_extras, required_of, true_schema, writer_extras, Extras,
};
use super::subsume::Checker;
use super::{finding, Finding, Rule};

impl<'a> Checker<'a> {
    pub(super) fn objects(&mut self, w: &Node<'a>, r: &Node<'a>, path: &str) -> Vec<Finding> {
        let mut found = Vec::new();
        let empty = empty_map();
        let w_props = w.get("properties").and_then(Value::as_object).unwrap_or(empty);
        let r_props = r.get("properties").and_then(Value::as_object).unwrap_or(empty);
        let w_req = required_of(w);
        let r_req = required_of(r);
        let w_extra = writer_extras(w);
        let r_extra = reader_extras(r);

        for (name, ws) in w_props {
            let p = child(path, name);
            match (r_props.get(name), &r_extra) {
                (Some(rs), _) => found.extend(self.sub(&Term::root(ws), &Term::root(rs), &p)),
                (None, Extras::Schema(rs)) => {
                    for rs in rs.clone() {
                        found.extend(self.sub(&Term::root(ws), &Term::root(rs), &p));
                    }
                }
                (None, Extras::Closed) => found.extend(finding(
                    &p,
                    Rule::ClosedReader,
                    format!("the writer writes property `{name}`; the reader is closed (additionalProperties: false) and does not declare it"),
                )),
                (None, Extras::Open) => {}
            }
        }
        for name in &r_req {
            if w_req.contains(name) {
                continue;
            }
            let p = child(path, name);
            let reason = if w_props.contains_key(*name) {
                format!(
                    "the reader requires property `{name}`; the writer may omit it (it is optional there)"
                )
            } else {
                format!("the reader requires property `{name}`; the writer does not write it")
            };
            found.extend(finding(&p, Rule::RequiredAdded, reason));
        }
        match &w_extra {
            Extras::Closed => {}
            Extras::Open | Extras::Schema(_) => {
                // The writer may write keys it does not declare (a map): they may collide
                // with properties the reader declares, and the reader must accept the rest.
                let w_terms: Vec<&'a Value> = match &w_extra {
                    Extras::Schema(s) => s.clone(),
                    _ => vec![true_schema()],
                };
                for (name, rs) in r_props {
                    if w_props.contains_key(name) {
                        continue;
                    }
                    for ws in &w_terms {
                        found.extend(self.sub(&Term::root(ws), &Term::root(rs), &child(path, name)));
                    }
                }
                match &r_extra {
                    Extras::Open => {}
                    Extras::Closed => found.extend(finding(
                        &format!("{path}.*"),
                        Rule::ClosedReader,
                        "the writer may write keys it does not declare (a map); the reader is closed (additionalProperties: false)",
                    )),
                    Extras::Schema(rs) => {
                        for ws in &w_terms {
                            for r in rs {
                                found.extend(self.sub(&Term::root(ws), &Term::root(r), &format!("{path}.*")));
                            }
                        }
                    }
                }
            }
        }
        found.extend(bounds(w, r, "minProperties", "maxProperties", "properties", path));
        if r.get("patternProperties").is_some() && r.get("patternProperties") != w.get("patternProperties") {
            found.extend(finding(
                path,
                Rule::CannotProve,
                "cannot prove compatible: the reader uses `patternProperties`",
            ));
        }
        found
    }
}
