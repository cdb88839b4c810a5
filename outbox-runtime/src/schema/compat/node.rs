//! A schema as the checker sees it: nodes, boolean terms over them, and the expansion
//! of `$ref`, `allOf`, `anyOf`/`oneOf` and `type` arrays.

use serde_json::{Map, Value};

use crate::schema::document::SchemaDoc;
use crate::schema::keywords::is_annotation;

/// Keywords the checker understands.
pub(super) const UNDERSTOOD: &[&str] = &[
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

/// A schema node, possibly with some keywords already expanded into a [`Term`].
#[derive(Clone, Copy)]
pub(super) struct Node<'a> {
    pub(super) value: &'a Value,
    /// Skip `$ref`, `allOf`, `anyOf`/`oneOf` (already expanded).
    pub(super) skip_ref: bool,
    pub(super) skip_all: bool,
    pub(super) skip_union: bool,
    /// Restricted to one of the node's `type`s (a `type` array split into a union).
    pub(super) only_type: Option<&'a str>,
}

/// A schema as a boolean formula over nodes.
#[derive(Clone)]
pub(super) enum Term<'a> {
    Node(Node<'a>),
    /// Every part must hold.
    All(Vec<Term<'a>>),
    /// At least one part must hold.
    Any(Vec<Term<'a>>),
}

impl<'a> Term<'a> {
    pub(super) fn root(value: &'a Value) -> Self {
        Term::Node(Node::new(value))
    }
}

impl<'a> Node<'a> {
    pub(super) fn new(value: &'a Value) -> Self {
        Node { value, skip_ref: false, skip_all: false, skip_union: false, only_type: None }
    }

    pub(super) fn obj(&self) -> Option<&'a Map<String, Value>> {
        self.value.as_object()
    }

    pub(super) fn get(&self, key: &str) -> Option<&'a Value> {
        self.obj().and_then(|o| o.get(key))
    }

    /// Constraint keywords left on this node (not annotations, not skipped).
    pub(super) fn constraint_keys(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.obj()
            .into_iter()
            .flat_map(|o| o.keys())
            .map(String::as_str)
            .filter(move |k| !is_annotation(k) && !self.skipped(k))
    }

    /// Whether keyword `k` was already expanded into a [`Term`].
    pub(super) fn skipped(&self, k: &str) -> bool {
        match k {
            "$ref" => self.skip_ref,
            "allOf" => self.skip_all,
            "anyOf" | "oneOf" => self.skip_union,
            _ => false,
        }
    }

    pub(super) fn has_constraints(&self) -> bool {
        self.constraint_keys().next().is_some()
    }

    /// The JSON types this node allows; `None` means any.
    pub(super) fn types(&self) -> Option<Vec<&'a str>> {
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
pub(super) enum Expanded<'a> {
    Term(Term<'a>),
    /// `true`, `{}` or only annotations.
    Anything,
    /// `false`.
    Nothing,
    /// A leaf with constraints and at most one type.
    Leaf(Node<'a>),
}

/// `node` with its composite keywords expanded, against the document it belongs to.
pub(super) fn expand<'a>(node: Node<'a>, doc: &'a SchemaDoc) -> Expanded<'a> {
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
            let terms =
                variants
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
