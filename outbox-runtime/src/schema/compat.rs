//! Schema compatibility judged as writer/reader resolution.
//!
//! The question is always: can a reader built from schema R deserialize every document
//! that a writer built from schema W can produce? BACKWARD asks it with R = new, W = old
//! (new code reads old events); FORWARD with R = old, W = new (old consumers read new
//! events); FULL asks both.
//!
//! Writers are Rust structs serialized by serde: an object schema that declares
//! `properties` emits only those properties (its `additionalProperties` is not a promise
//! of arbitrary extra keys, unless it is a schema, as for a map). Readers ignore unknown
//! properties unless their schema is closed (`additionalProperties: false`).
//!
//! The checker is conservative: whatever it does not understand in a reader it reports as
//! [`Rule::CannotProve`], never as compatible.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use serde_json::{Map, Value};

use super::document::SchemaDoc;

/// Which readers must read which writers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mode {
    /// New schema reads data written with the old one.
    Backward,
    /// Old schema reads data written with the new one.
    Forward,
    /// Both.
    Full,
}

impl Mode {
    /// The directions this mode checks.
    pub fn directions(self) -> &'static [Direction] {
        match self {
            Mode::Backward => &[Direction::Backward],
            Mode::Forward => &[Direction::Forward],
            Mode::Full => &[Direction::Backward, Direction::Forward],
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Backward => "backward",
            Mode::Forward => "forward",
            Mode::Full => "full",
        })
    }
}

/// A mode name that is not `backward`, `forward` or `full`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown compatibility mode {0:?}: expected backward, forward or full")]
pub struct UnknownMode(pub String);

impl FromStr for Mode {
    type Err = UnknownMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "backward" => Ok(Mode::Backward),
            "forward" => Ok(Mode::Forward),
            "full" => Ok(Mode::Full),
            other => Err(UnknownMode(other.to_owned())),
        }
    }
}

/// One direction of reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    /// The new schema reads what the old one wrote.
    Backward,
    /// The old schema reads what the new one wrote.
    Forward,
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Direction::Backward => "backward (new reads old)",
            Direction::Forward => "forward (old reads new)",
        })
    }
}

/// The rule an incompatibility breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Rule {
    /// The writer produces a JSON type the reader does not accept.
    TypeChanged,
    /// The writer may produce `null` (an optional or nullable value); the reader does not accept it.
    NullNotAccepted,
    /// The reader requires a property the writer may omit or never writes.
    RequiredAdded,
    /// The reader is closed (`additionalProperties: false`) and the writer emits a property it does not declare.
    ClosedReader,
    /// The reader accepts a narrower range of numbers (integer format, minimum, maximum).
    RangeNarrowed,
    /// The reader enforces a string format (uuid, date-time, ...) the writer does not promise.
    FormatAdded,
    /// The reader accepts only some values (`enum`, `const`) and the writer may write others.
    ValueNotAccepted,
    /// A writer variant (e.g. of a tagged enum) matches no reader variant.
    VariantNotAccepted,
    /// A length, item count, pattern, uniqueness or multiple-of constraint is stricter in the reader.
    ConstraintTightened,
    /// Something the checker does not understand: it cannot prove compatibility.
    CannotProve,
}

impl Rule {
    /// A short, stable name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Rule::TypeChanged => "type-changed",
            Rule::NullNotAccepted => "null-not-accepted",
            Rule::RequiredAdded => "required-added",
            Rule::ClosedReader => "closed-reader",
            Rule::RangeNarrowed => "range-narrowed",
            Rule::FormatAdded => "format-added",
            Rule::ValueNotAccepted => "value-not-accepted",
            Rule::VariantNotAccepted => "variant-not-accepted",
            Rule::ConstraintTightened => "constraint-tightened",
            Rule::CannotProve => "cannot-prove",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One reason a reader cannot read a writer's documents.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub struct Incompatibility {
    /// Which reading fails.
    pub direction: Direction,
    /// Where in the document, as a JSON path: `$.lines[*].sku`.
    pub path: String,
    /// The rule broken.
    pub rule: Rule,
    /// What a person needs to know.
    pub reason: String,
}

impl fmt::Display for Incompatibility {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} [{}, {}]", self.path, self.reason, self.rule, self.direction)
    }
}

/// The outcome of comparing two schemas.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    /// The mode that was checked.
    pub mode: Mode,
    /// Every incompatibility found, in both directions for FULL.
    pub incompatibilities: Vec<Incompatibility>,
}

impl Report {
    /// No incompatibility was found.
    pub fn is_compatible(&self) -> bool {
        self.incompatibilities.is_empty()
    }
}

/// Compares `old` and `new` in `mode`.
pub fn compare(old: &SchemaDoc, new: &SchemaDoc, mode: Mode) -> Report {
    let mut incompatibilities = Vec::new();
    for &direction in mode.directions() {
        let (writer, reader) = match direction {
            Direction::Backward => (old, new),
            Direction::Forward => (new, old),
        };
        incompatibilities.extend(can_read(writer, reader).into_iter().map(|f| Incompatibility {
            direction,
            path: f.path,
            rule: f.rule,
            reason: f.reason,
        }));
    }
    incompatibilities.sort();
    incompatibilities.dedup();
    Report { mode, incompatibilities }
}

/// Compares `new` against every schema in `older` (the `*_TRANSITIVE` modes); each
/// incompatibility's path is prefixed with the name of the older schema it concerns.
pub fn compare_transitive(older: &[SchemaDoc], new: &SchemaDoc, mode: Mode) -> Report {
    let mut incompatibilities = Vec::new();
    for old in older {
        for mut inc in compare(old, new, mode).incompatibilities {
            inc.path = format!("{} {}", old.name(), inc.path);
            incompatibilities.push(inc);
        }
    }
    Report { mode, incompatibilities }
}

/// A finding without its direction.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Finding {
    path: String,
    rule: Rule,
    reason: String,
}

fn finding(path: &str, rule: Rule, reason: impl Into<String>) -> Vec<Finding> {
    vec![Finding { path: path.to_owned(), rule, reason: reason.into() }]
}

/// Everything that stops `reader` from reading what `writer` writes.
fn can_read(writer: &SchemaDoc, reader: &SchemaDoc) -> Vec<Finding> {
    let mut cx = Checker { w: writer, r: reader, stack: Vec::new() };
    cx.sub(&Term::root(writer.root()), &Term::root(reader.root()), "$")
}

// ---------------------------------------------------------------------------------------
// Normalized view of a schema.

/// Keywords that only annotate and never restrict what validates.
const ANNOTATIONS: &[&str] = &[
    "$schema",
    "$id",
    "$anchor",
    "$dynamicAnchor",
    "$comment",
    "$defs",
    "definitions",
    "$vocabulary",
    "title",
    "description",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
    "contentEncoding",
    "contentMediaType",
    "contentSchema",
];

/// Keywords the checker understands.
const UNDERSTOOD: &[&str] = &[
    "$ref",
    "allOf",
    "anyOf",
    "oneOf",
    "type",
    "enum",
    "const",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "format",
    "minLength",
    "maxLength",
    "pattern",
    "items",
    "prefixItems",
    "additionalItems",
    "minItems",
    "maxItems",
    "uniqueItems",
    "properties",
    "required",
    "additionalProperties",
    "unevaluatedProperties",
    "patternProperties",
];

fn is_annotation(key: &str) -> bool {
    ANNOTATIONS.contains(&key) || key.starts_with("x-")
}

/// A schema node, possibly with some keywords already expanded into a [`Term`].
#[derive(Clone, Copy)]
struct Node<'a> {
    value: &'a Value,
    /// Skip `$ref`, `allOf`, `anyOf`/`oneOf` (already expanded).
    skip_ref: bool,
    skip_all: bool,
    skip_union: bool,
    /// Restricted to one of the node's `type`s (a `type` array split into a union).
    only_type: Option<&'a str>,
}

/// A schema as a boolean formula over nodes.
#[derive(Clone)]
enum Term<'a> {
    Node(Node<'a>),
    /// Every part must hold.
    All(Vec<Term<'a>>),
    /// At least one part must hold.
    Any(Vec<Term<'a>>),
}

impl<'a> Term<'a> {
    fn root(value: &'a Value) -> Self {
        Term::Node(Node::new(value))
    }
}

impl<'a> Node<'a> {
    fn new(value: &'a Value) -> Self {
        Node { value, skip_ref: false, skip_all: false, skip_union: false, only_type: None }
    }

    fn obj(&self) -> Option<&'a Map<String, Value>> {
        self.value.as_object()
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.obj().and_then(|o| o.get(key))
    }

    /// Constraint keywords left on this node (not annotations, not skipped).
    fn constraint_keys(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.obj()
            .into_iter()
            .flat_map(|o| o.keys())
            .map(String::as_str)
            .filter(move |k| !is_annotation(k) && !self.skipped(k))
    }

    /// Whether keyword `k` was already expanded into a [`Term`].
    fn skipped(&self, k: &str) -> bool {
        match k {
            "$ref" => self.skip_ref,
            "allOf" => self.skip_all,
            "anyOf" | "oneOf" => self.skip_union,
            _ => false,
        }
    }

    fn has_constraints(&self) -> bool {
        self.constraint_keys().next().is_some()
    }

    /// The JSON types this node allows; `None` means any.
    fn types(&self) -> Option<Vec<&'a str>> {
        if let Some(t) = self.only_type {
            return Some(vec![t]);
        }
        match self.get("type")? {
            Value::String(t) => Some(vec![t.as_str()]),
            Value::Array(ts) => Some(ts.iter().filter_map(Value::as_str).collect()),
            _ => None,
        }
    }
}

/// What a node is once its composite keywords are expanded.
enum Expanded<'a> {
    Term(Term<'a>),
    /// `true`, `{}` or only annotations.
    Anything,
    /// `false`.
    Nothing,
    /// A leaf with constraints and at most one type.
    Leaf(Node<'a>),
}

impl<'a> Checker<'a> {
    fn expand(&self, node: Node<'a>, doc: &'a SchemaDoc) -> Expanded<'a> {
        match node.value {
            Value::Bool(true) => return Expanded::Anything,
            Value::Bool(false) => return Expanded::Nothing,
            _ => {}
        }
        if !node.skip_ref {
            if let Some(target) = node.get("$ref").and_then(Value::as_str).and_then(|r| doc.resolve(r)) {
                let rest = Node { skip_ref: true, ..node };
                let target = Term::Node(Node::new(target));
                return Expanded::Term(if rest.has_constraints() {
                    Term::All(vec![target, Term::Node(rest)])
                } else {
                    target
                });
            }
        }
        if !node.skip_all {
            if let Some(Value::Array(parts)) = node.get("allOf") {
                let rest = Node { skip_all: true, skip_ref: true, ..node };
                let mut terms: Vec<Term<'a>> = parts.iter().map(Term::root).collect();
                if rest.has_constraints() {
                    terms.push(Term::Node(rest));
                }
                return Expanded::Term(Term::All(terms));
            }
        }
        if !node.skip_union {
            let union = node.get("anyOf").or_else(|| node.get("oneOf"));
            if let Some(Value::Array(variants)) = union {
                let rest = Node { skip_union: true, skip_all: true, skip_ref: true, ..node };
                let with_rest = rest.has_constraints();
                let terms = variants
                    .iter()
                    .map(|v| {
                        if with_rest {
                            Term::All(vec![Term::root(v), Term::Node(rest)])
                        } else {
                            Term::root(v)
                        }
                    })
                    .collect();
                return Expanded::Term(Term::Any(terms));
            }
        }
        if node.only_type.is_none() {
            if let Some(Value::Array(types)) = node.get("type") {
                if types.len() != 1 {
                    let terms = types
                        .iter()
                        .filter_map(Value::as_str)
                        .map(|t| Term::Node(Node { only_type: Some(t), ..node }))
                        .collect();
                    return Expanded::Term(Term::Any(terms));
                }
            }
        }
        if node.has_constraints() {
            Expanded::Leaf(node)
        } else {
            Expanded::Anything
        }
    }
}

// ---------------------------------------------------------------------------------------
// The checker.

struct Checker<'a> {
    w: &'a SchemaDoc,
    r: &'a SchemaDoc,
    /// Node pairs being compared, to end recursion through `$ref` cycles (coinductively:
    /// a pair met again on its own path is assumed compatible).
    stack: Vec<(*const Value, *const Value)>,
}

fn child(path: &str, name: &str) -> String {
    let plain = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if plain {
        format!("{path}.{name}")
    } else {
        format!("{path}[{}]", Value::String(name.to_owned()))
    }
}

/// The finite set of values a writer node can produce, when it has one.
fn finite_values(node: &Node<'_>) -> Option<Vec<Value>> {
    if let Some(c) = node.get("const") {
        return Some(vec![c.clone()]);
    }
    if let Some(Value::Array(values)) = node.get("enum") {
        return Some(values.clone());
    }
    if node.types().is_some_and(|t| t == ["boolean"]) {
        return Some(vec![Value::Bool(false), Value::Bool(true)]);
    }
    if node.types().is_some_and(|t| t == ["null"]) {
        return Some(vec![Value::Null]);
    }
    None
}

/// The single value a property schema allows (`const` or a one-value `enum`): a tag.
fn tag_of(doc: &SchemaDoc, v: &Value) -> Option<Value> {
    let v = match v.get("$ref").and_then(Value::as_str) {
        Some(r) => doc.resolve(r)?,
        None => v,
    };
    v.get("const").cloned().or_else(|| match v.get("enum") {
        Some(Value::Array(a)) if a.len() == 1 => Some(a[0].clone()),
        _ => None,
    })
}

fn describe_types(types: &Option<Vec<&str>>) -> String {
    match types {
        None => "any type".to_owned(),
        Some(ts) if ts.is_empty() => "no type".to_owned(),
        Some(ts) => ts.join(" or "),
    }
}

fn type_accepts(reader_types: &Option<Vec<&str>>, writer_type: &str) -> bool {
    match reader_types {
        None => true,
        Some(ts) => ts.iter().any(|t| *t == writer_type || (*t == "number" && writer_type == "integer")),
    }
}

impl<'a> Checker<'a> {
    /// Everything that stops `r` from reading what `w` writes, at instance path `path`.
    fn sub(&mut self, w: &Term<'a>, r: &Term<'a>, path: &str) -> Vec<Finding> {
        // 1. A writer union: every alternative must be readable (exact).
        if let Term::Any(ws) = w {
            return ws.iter().flat_map(|wi| self.sub(wi, r, path)).collect();
        }
        // 2. A writer that can produce only a few values: check each against the whole reader.
        if let Term::Node(wn) = w {
            match self.expand(*wn, self.w) {
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
            Term::Node(rn) => match self.expand(*rn, self.r) {
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
        let wn = match self.expand(*wn, self.w) {
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
    fn best_of<'t>(
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
    fn sub_union(&mut self, wn: Node<'a>, rs: &[Term<'a>], path: &str) -> Vec<Finding> {
        let w = Term::Node(wn);
        let wleaf = match self.expand(wn, self.w) {
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
    fn term_types(&self, t: &Term<'a>) -> Option<Vec<&'a str>> {
        match t {
            Term::Node(n) => match self.expand(*n, self.r) {
                Expanded::Leaf(l) => l.types(),
                Expanded::Term(t) => self.term_types(&t),
                Expanded::Anything => None,
                Expanded::Nothing => Some(Vec::new()),
            },
            Term::Any(ts) => {
                let mut all = Vec::new();
                for t in ts {
                    all.extend(self.term_types(t)?);
                }
                Some(all)
            }
            Term::All(ts) => ts.iter().find_map(|t| self.term_types(t)),
        }
    }

    /// A writer variant whose tag (a `const` property, as serde's tagged enums write) no
    /// reader variant carries: reported as one finding rather than as field differences.
    fn unknown_tag(&self, w: &Node<'a>, rs: &[Term<'a>], path: &str) -> Option<Vec<Finding>> {
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
    fn reader_leaf(&self, t: &Term<'a>) -> Option<Node<'a>> {
        match t {
            Term::Node(n) => match self.expand(*n, self.r) {
                Expanded::Leaf(l) => Some(l),
                Expanded::Term(t) => self.reader_leaf(&t),
                _ => None,
            },
            Term::All(ts) => ts.iter().find_map(|t| self.reader_leaf(t)),
            Term::Any(_) => None,
        }
    }

    /// Whether the writer leaf and a reader variant share a discriminating `const` property.
    fn tags_match(&self, w: &Node<'a>, r: &Term<'a>) -> bool {
        let Some(wprops) = w.get("properties").and_then(Value::as_object) else { return false };
        let rnode = match r {
            Term::Node(n) => match self.expand(*n, self.r) {
                Expanded::Leaf(l) => l,
                Expanded::Term(t) => return self.tags_match(w, &t),
                _ => return false,
            },
            Term::All(ts) => return ts.iter().any(|t| self.tags_match(w, t)),
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
    fn values_readable(&mut self, values: &[Value], r: &Term<'a>, path: &str) -> Vec<Finding> {
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

    fn leaf(&mut self, w: Node<'a>, r: Node<'a>, path: &str) -> Vec<Finding> {
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
    fn unknown_reader_keywords(&self, w: &Node<'a>, r: &Node<'a>, path: &str) -> Vec<Finding> {
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

    fn numbers(&mut self, w: &Node<'a>, r: &Node<'a>, t: &str, path: &str) -> Vec<Finding> {
        let mut found = Vec::new();
        let wr = Range::of(w, t);
        let rr = Range::of(r, t);
        let low_ok = match (&rr.min, &wr.min) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(rmin), Some(wmin)) => wmin.at_least(rmin),
        };
        let high_ok = match (&rr.max, &wr.max) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(rmax), Some(wmax)) => wmax.at_most(rmax),
        };
        if !low_ok || !high_ok {
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

    fn arrays(&mut self, w: &Node<'a>, r: &Node<'a>, path: &str) -> Vec<Finding> {
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

    fn objects(&mut self, w: &Node<'a>, r: &Node<'a>, path: &str) -> Vec<Finding> {
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

/// The `true` schema, usable with any lifetime (it is a constant).
fn true_schema<'a>() -> &'a Value {
    static TRUE: Value = Value::Bool(true);
    &TRUE
}

/// An empty map, usable with any lifetime.
fn empty_map<'a>() -> &'a Map<String, Value> {
    static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
    EMPTY.get_or_init(Map::new)
}

fn required_of<'a>(node: &Node<'a>) -> Vec<&'a str> {
    node.get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// What an object may hold beyond its declared properties.
#[derive(Clone)]
enum Extras<'a> {
    /// Anything (an open reader, a free-form writer).
    Open,
    /// Nothing.
    Closed,
    /// Values of these schemas (a map's `additionalProperties`, `patternProperties`).
    Schema(Vec<&'a Value>),
}

/// A writer that declares `properties` (a struct) writes only those; one that declares
/// none writes whatever its `additionalProperties` allows (a map).
fn writer_extras<'a>(w: &Node<'a>) -> Extras<'a> {
    let mut schemas: Vec<&'a Value> = Vec::new();
    let mut free = false;
    for key in ["additionalProperties", "unevaluatedProperties"] {
        match w.get(key) {
            Some(Value::Object(_)) => schemas.extend(w.get(key)),
            Some(Value::Bool(true)) | None if key == "additionalProperties" => {
                free = w.get("properties").is_none() && w.get("patternProperties").is_none();
            }
            _ => {}
        }
    }
    if let Some(Value::Object(patterns)) = w.get("patternProperties") {
        schemas.extend(patterns.values());
    }
    if free && schemas.is_empty() {
        Extras::Open
    } else if schemas.is_empty() {
        Extras::Closed
    } else {
        Extras::Schema(schemas)
    }
}

fn reader_extras<'a>(r: &Node<'a>) -> Extras<'a> {
    match r.get("additionalProperties") {
        Some(Value::Bool(false)) => Extras::Closed,
        Some(schema @ Value::Object(_)) => Extras::Schema(vec![schema]),
        _ if r.get("unevaluatedProperties") == Some(&Value::Bool(false)) => Extras::Closed,
        _ => Extras::Open,
    }
}

/// Prefix items and the schema for the rest (`None`: anything).
fn items_of<'a>(node: &Node<'a>) -> (Vec<&'a Value>, Option<&'a Value>) {
    match (node.get("prefixItems"), node.get("items")) {
        (Some(Value::Array(prefix)), rest) => (prefix.iter().collect(), rest),
        // Draft 7 tuple form.
        (None, Some(Value::Array(prefix))) => (prefix.iter().collect(), node.get("additionalItems")),
        (_, rest) => (Vec::new(), rest),
    }
}

/// min/max count constraints (`minItems`, `maxLength`, ...): the reader's must be looser.
fn bounds(w: &Node<'_>, r: &Node<'_>, min_key: &str, max_key: &str, what: &str, path: &str) -> Vec<Finding> {
    let get = |n: &Node<'_>, k: &str| n.get(k).and_then(Value::as_u64);
    let mut found = Vec::new();
    if let Some(rmin) = get(r, min_key) {
        let wmin = get(w, min_key).unwrap_or(0);
        if wmin < rmin {
            found.extend(finding(
                path,
                Rule::ConstraintTightened,
                format!("the reader requires {min_key} {rmin} ({what}); the writer's minimum is {wmin}"),
            ));
        }
    }
    if let Some(rmax) = get(r, max_key) {
        match get(w, max_key) {
            Some(wmax) if wmax <= rmax => {}
            wmax => found.extend(finding(
                path,
                Rule::ConstraintTightened,
                format!(
                    "the reader allows at most {rmax} ({max_key}, {what}); the writer's maximum is {}",
                    wmax.map_or("unbounded".to_owned(), |m| m.to_string())
                ),
            )),
        }
    }
    found
}

fn strings(w: &Node<'_>, r: &Node<'_>, path: &str) -> Vec<Finding> {
    let mut found = Vec::new();
    if let Some(rf) = r.get("format").and_then(Value::as_str) {
        let wf = w.get("format").and_then(Value::as_str);
        if wf != Some(rf) {
            found.extend(finding(
                path,
                Rule::FormatAdded,
                match wf {
                    Some(wf) => format!("the reader requires strings in format `{rf}`; the writer's are in format `{wf}`"),
                    None => format!("the reader requires strings in format `{rf}`; the writer's strings have no declared format"),
                },
            ));
        }
    }
    found.extend(bounds(w, r, "minLength", "maxLength", "string length", path));
    if let Some(rp) = r.get("pattern") {
        if w.get("pattern") != Some(rp) {
            found.extend(finding(path, Rule::ConstraintTightened, format!("the reader requires strings matching pattern {rp}; the writer does not promise that pattern")));
        }
    }
    found
}

// ---------------------------------------------------------------------------------------
// Numbers and ranges.

/// A bound: exact for integers, `f64` otherwise.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Num {
    Int(i128),
    Float(f64),
}

impl Num {
    fn of(v: &Value) -> Option<Num> {
        let n = v.as_number()?;
        if let Some(i) = n.as_i64() {
            Some(Num::Int(i.into()))
        } else if let Some(u) = n.as_u64() {
            Some(Num::Int(u.into()))
        } else {
            n.as_f64().map(Num::Float)
        }
    }

    fn as_f64(self) -> f64 {
        match self {
            // Precision loss is fine here: only used against non-integer bounds.
            #[allow(clippy::cast_precision_loss)]
            Num::Int(i) => i as f64,
            Num::Float(f) => f,
        }
    }

    fn cmp(self, other: Num) -> std::cmp::Ordering {
        match (self, other) {
            (Num::Int(a), Num::Int(b)) => a.cmp(&b),
            (a, b) => a.as_f64().total_cmp(&b.as_f64()),
        }
    }

    fn is_multiple_of(self, of: &Num) -> bool {
        match (self, *of) {
            (Num::Int(a), Num::Int(b)) => b != 0 && a % b == 0,
            (a, b) => {
                let q = a.as_f64() / b.as_f64();
                q.is_finite() && (q - q.round()).abs() < 1e-9
            }
        }
    }
}

impl fmt::Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Num::Int(i) => write!(f, "{i}"),
            Num::Float(x) => write!(f, "{x}"),
        }
    }
}

/// One end of a range: a value and whether it is exclusive.
#[derive(Debug, Clone, Copy)]
struct End {
    value: Num,
    exclusive: bool,
}

impl End {
    /// As a lower bound, this admits no value below `other`.
    fn at_least(&self, other: &End) -> bool {
        match self.value.cmp(other.value) {
            std::cmp::Ordering::Greater => true,
            std::cmp::Ordering::Equal => self.exclusive || !other.exclusive,
            std::cmp::Ordering::Less => false,
        }
    }

    /// As an upper bound, this admits no value above `other`.
    fn at_most(&self, other: &End) -> bool {
        match self.value.cmp(other.value) {
            std::cmp::Ordering::Less => true,
            std::cmp::Ordering::Equal => self.exclusive || !other.exclusive,
            std::cmp::Ordering::Greater => false,
        }
    }
}

/// The numbers a node admits: from its integer `format` and its min/max keywords.
#[derive(Debug, Default)]
struct Range {
    min: Option<End>,
    max: Option<End>,
    format: Option<String>,
}

/// Value ranges of the integer formats schemars emits.
fn format_range(format: &str) -> Option<(Num, Num)> {
    let signed = |bits: u32| (Num::Int(-(1i128 << (bits - 1))), Num::Int((1i128 << (bits - 1)) - 1));
    let unsigned = |bits: u32| (Num::Int(0), Num::Int((1i128 << bits) - 1));
    Some(match format {
        "int8" => signed(8),
        "int16" => signed(16),
        "int32" => signed(32),
        "int64" | "int" => signed(64),
        "int128" => (Num::Int(i128::MIN), Num::Int(i128::MAX)),
        "uint8" => unsigned(8),
        "uint16" => unsigned(16),
        "uint32" => unsigned(32),
        "uint64" | "uint" => unsigned(64),
        "uint128" => (Num::Int(0), Num::Float(2f64.powi(128) - 1.0)),
        _ => return None,
    })
}

impl Range {
    fn of(node: &Node<'_>, t: &str) -> Range {
        let mut range = Range::default();
        let tighter_min = |cur: Option<End>, new: End| match cur {
            Some(c) if c.at_least(&new) => Some(c),
            _ => Some(new),
        };
        let tighter_max = |cur: Option<End>, new: End| match cur {
            Some(c) if c.at_most(&new) => Some(c),
            _ => Some(new),
        };
        if t == "integer" {
            if let Some(f) = node.get("format").and_then(Value::as_str) {
                if let Some((lo, hi)) = format_range(f) {
                    range.min = Some(End { value: lo, exclusive: false });
                    range.max = Some(End { value: hi, exclusive: false });
                    range.format = Some(f.to_owned());
                }
            }
        }
        if let Some(v) = node.get("minimum").and_then(Num::of) {
            range.min = tighter_min(range.min, End { value: v, exclusive: false });
        }
        if let Some(v) = node.get("exclusiveMinimum").and_then(Num::of) {
            range.min = tighter_min(range.min, End { value: v, exclusive: true });
        }
        if let Some(v) = node.get("maximum").and_then(Num::of) {
            range.max = tighter_max(range.max, End { value: v, exclusive: false });
        }
        if let Some(v) = node.get("exclusiveMaximum").and_then(Num::of) {
            range.max = tighter_max(range.max, End { value: v, exclusive: true });
        }
        range
    }

    fn describe(&self, t: &str) -> String {
        let kind = if t == "integer" { "integers" } else { "numbers" };
        let end = |e: &Option<End>, unbounded: &str| match e {
            Some(End { value, exclusive: true }) => format!("{value} (exclusive)"),
            Some(End { value, .. }) => value.to_string(),
            None => unbounded.to_owned(),
        };
        let format = self.format.as_ref().map(|f| format!(" ({f})")).unwrap_or_default();
        format!("{kind} from {} to {}{format}", end(&self.min, "-infinity"), end(&self.max, "+infinity"))
    }
}

// ---------------------------------------------------------------------------------------
// Validating one value against a reader, for writers with finitely many values.

struct Rejection {
    path: String,
    rule: Rule,
    reason: String,
}

fn reject(path: &str, rule: Rule, reason: impl Into<String>) -> Result<(), Rejection> {
    Err(Rejection { path: path.to_owned(), rule, reason: reason.into() })
}

fn json_type_of(value: &Value) -> &'static str {
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
    fn accepts(&self, r: &Term<'a>, value: &Value, path: &str) -> Result<(), Rejection> {
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
            Term::Node(n) => match self.expand(*n, self.r) {
                Expanded::Term(t) => self.accepts(&t, value, path),
                Expanded::Anything => Ok(()),
                Expanded::Nothing => reject(path, Rule::TypeChanged, "the reader accepts nothing here"),
                Expanded::Leaf(leaf) => self.accepts_leaf(&leaf, value, path),
            },
        }
    }

    fn accepts_leaf(&self, r: &Node<'a>, value: &Value, path: &str) -> Result<(), Rejection> {
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
fn format_holds(format: &str, s: &str) -> Option<bool> {
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

#[cfg(test)]
#[path = "compat_tests.rs"]
mod tests;
