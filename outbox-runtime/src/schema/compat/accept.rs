//! Whether a reader accepts one value, for writers that can produce only a few values.

use serde_json::Value;

use super::node::{expand, Expanded, Node, Term, UNDERSTOOD};
use super::parts::{
    child, describe_types, items_of, reader_extras, required_of, true_schema, type_accepts, Extras,
};
use super::range::{End, Num, Range};
use super::subsume::Checker;
use super::Rule;

pub(super) struct Rejection {
    pub(super) path: String,
    pub(super) rule: Rule,
    pub(super) reason: String,
}

pub(super) fn reject(path: &str, rule: Rule, reason: impl Into<String>) -> Result<(), Rejection> {
    Err(Rejection { path: path.to_owned(), rule, reason: reason.into() })
}

pub(super) fn json_type_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(n) if n.as_f64().is_some_and(|f| f.fract() == 0.0) => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

impl<'a> Checker<'a> {
    pub(super) fn accepts(&self, r: &Term<'a>, value: &Value, path: &str) -> Result<(), Rejection> {
        // A `$ref` cycle with no property or item on it would not end.
        let depth = self.accept_depth.get();
        if depth > 128 {
            return reject(
                path,
                Rule::CannotProve,
                "cannot prove compatible: references here expand without end",
            );
        }
        self.accept_depth.set(depth + 1);
        let verdict = self.accepts_inner(r, value, path);
        self.accept_depth.set(depth);
        verdict
    }

    fn accepts_inner(&self, r: &Term<'a>, value: &Value, path: &str) -> Result<(), Rejection> {
        match r {
            Term::All(parts) => parts.iter().try_for_each(|p| self.accepts(p, value, path)),
            Term::Any(parts) => {
                let mut last = None;
                for p in parts {
                    match self.accepts(p, value, path) {
                        Ok(()) => return Ok(()),
                        Err(e) => last = Some(e),
                    }
                }
                match (parts.len(), last) {
                    (1, Some(e)) => Err(e),
                    _ => reject(path, Rule::VariantNotAccepted, "it matches none of the reader's variants"),
                }
            }
            Term::Node(n) => match expand(*n, self.r) {
                Expanded::Term(t) => self.accepts(&t, value, path),
                Expanded::Anything => Ok(()),
                Expanded::Nothing => reject(path, Rule::TypeChanged, "the reader accepts nothing here"),
                Expanded::Leaf(leaf) => self.accepts_leaf(&leaf, value, path),
            },
        }
    }

    pub(super) fn accepts_leaf(&self, r: &Node<'a>, value: &Value, path: &str) -> Result<(), Rejection> {
        let t = json_type_of(value);
        let types = r.types();
        if !type_accepts(&types, t) {
            return reject(path, Rule::TypeChanged, format!("it accepts only {}", describe_types(&types)));
        }
        if let Some(c) = r.get("const") {
            if c != value {
                return reject(path, Rule::ValueNotAccepted, format!("it accepts only {c}"));
            }
        }
        if let Some(Value::Array(allowed)) = r.get("enum") {
            if !allowed.contains(value) {
                let shown: Vec<String> = allowed.iter().map(Value::to_string).collect();
                return reject(path, Rule::ValueNotAccepted, format!("it accepts only {}", shown.join(", ")));
            }
        }
        for key in r.constraint_keys() {
            if !UNDERSTOOD.contains(&key) {
                return reject(
                    path,
                    Rule::CannotProve,
                    format!("cannot prove compatible: the reader uses keyword `{key}`"),
                );
            }
        }
        match value {
            Value::Number(_) => {
                let v = Num::of(value).unwrap_or(Num::Int(0));
                let at = End { value: v, exclusive: false };
                let range = Range::of(r, t);
                let ok =
                    range.min.is_none_or(|m| at.at_least(&m)) && range.max.is_none_or(|m| at.at_most(&m));
                if !ok {
                    return reject(path, Rule::RangeNarrowed, format!("it accepts {}", range.describe(t)));
                }
                if let Some(m) = r.get("multipleOf").and_then(Num::of) {
                    if !v.is_multiple_of(&m) {
                        return reject(
                            path,
                            Rule::ConstraintTightened,
                            format!("it accepts only multiples of {m}"),
                        );
                    }
                }
            }
            Value::String(s) => {
                let len = s.chars().count() as u64;
                if r.get("minLength").and_then(Value::as_u64).is_some_and(|m| len < m)
                    || r.get("maxLength").and_then(Value::as_u64).is_some_and(|m| len > m)
                {
                    return reject(
                        path,
                        Rule::ConstraintTightened,
                        "its length is outside the reader's bounds",
                    );
                }
                if r.get("pattern").is_some() {
                    return reject(
                        path,
                        Rule::CannotProve,
                        "cannot prove compatible: the reader requires a pattern",
                    );
                }
                if let Some(f) = r.get("format").and_then(Value::as_str) {
                    match format_holds(f, s) {
                        Some(true) => {}
                        Some(false) => {
                            return reject(path, Rule::FormatAdded, format!("it is not in format `{f}`"))
                        }
                        None => {
                            return reject(
                                path,
                                Rule::CannotProve,
                                format!("cannot prove compatible: cannot check format `{f}`"),
                            )
                        }
                    }
                }
            }
            Value::Array(items) => {
                let (prefix, rest) = items_of(r);
                for (i, item) in items.iter().enumerate() {
                    let schema = prefix.get(i).copied().or(rest).unwrap_or(true_schema());
                    self.accepts(&Term::root(schema), item, &format!("{path}[{i}]"))?;
                }
                let n = items.len() as u64;
                if r.get("minItems").and_then(Value::as_u64).is_some_and(|m| n < m)
                    || r.get("maxItems").and_then(Value::as_u64).is_some_and(|m| n > m)
                {
                    return reject(
                        path,
                        Rule::ConstraintTightened,
                        "its item count is outside the reader's bounds",
                    );
                }
            }
            Value::Object(map) => {
                let props = r.get("properties").and_then(Value::as_object);
                for name in required_of(r) {
                    if !map.contains_key(name) {
                        return reject(
                            &child(path, name),
                            Rule::RequiredAdded,
                            format!("it lacks required property `{name}`"),
                        );
                    }
                }
                for (k, v) in map {
                    let p = child(path, k);
                    match (props.and_then(|ps| ps.get(k)), reader_extras(r)) {
                        (Some(s), _) => self.accepts(&Term::root(s), v, &p)?,
                        (None, Extras::Closed) => {
                            return reject(
                                &p,
                                Rule::ClosedReader,
                                "the reader is closed and does not declare it",
                            )
                        }
                        (None, Extras::Schema(s)) => {
                            for s in s {
                                self.accepts(&Term::root(s), v, &p)?;
                            }
                        }
                        (None, Extras::Open) => {}
                    }
                }
            }
            Value::Null | Value::Bool(_) => {}
        }
        Ok(())
    }
}

/// Whether `s` is in `format`; `None` for formats this checker cannot check.
pub(super) fn format_holds(format: &str, s: &str) -> Option<bool> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    Some(match format {
        "uuid" => {
            let parts: Vec<&str> = s.split('-').collect();
            parts.iter().map(|p| p.len()).eq([8, 4, 4, 4, 12])
                && parts.iter().all(|p| p.bytes().all(|b| b.is_ascii_hexdigit()))
        }
        "date" => {
            let parts: Vec<&str> = s.split('-').collect();
            parts.len() == 3 && parts.iter().map(|p| p.len()).eq([4, 2, 2]) && parts.iter().all(|p| digits(p))
        }
        "date-time" => {
            let Some((date, time)) = s.split_once(['T', 't']) else { return Some(false) };
            format_holds("date", date)?
                && time.len() >= 9
                && (time.ends_with(['Z', 'z']) || time.contains(['+', '-']))
        }
        _ => return None,
    })
}
