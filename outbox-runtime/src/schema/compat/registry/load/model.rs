//! The registry's model of a loaded schema: everit's node kinds, the fields its diff
//! reads, and one graph per document (CONFLUENT.md §3.0).

use std::collections::BTreeMap;

use serde_json::{Number, Value};

pub(in super::super) type Id = usize;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in super::super) enum Spec {
    Draft4,
    Draft6,
    Draft7,
    /// 2019-09 and 2020-12, both read through the translator.
    Modern,
}

/// A combination's keyword.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(clippy::enum_variant_names)] // the keywords' own names
pub(in super::super) enum Crit {
    AllOf,
    AnyOf,
    OneOf,
}

impl Crit {
    pub(in super::super) fn name(self) -> &'static str {
        match self {
            Crit::AllOf => "allOf",
            Crit::AnyOf => "anyOf",
            Crit::OneOf => "oneOf",
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub(in super::super) struct Str {
    pub(in super::super) min_length: Option<Number>,
    pub(in super::super) max_length: Option<Number>,
    pub(in super::super) pattern: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub(in super::super) struct Num {
    pub(in super::super) minimum: Option<Number>,
    pub(in super::super) maximum: Option<Number>,
    pub(in super::super) exclusive_minimum: Option<Number>,
    pub(in super::super) exclusive_maximum: Option<Number>,
    pub(in super::super) multiple_of: Option<Number>,
    pub(in super::super) integer: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub(in super::super) struct Obj {
    pub(in super::super) properties: BTreeMap<String, Id>,
    pub(in super::super) required: Vec<String>,
    pub(in super::super) pattern_properties: Vec<(String, Id)>,
    pub(in super::super) permits_additional: bool,
    pub(in super::super) additional: Option<Id>,
    pub(in super::super) property_dependencies: BTreeMap<String, Vec<String>>,
    pub(in super::super) schema_dependencies: BTreeMap<String, Id>,
    pub(in super::super) min_properties: Option<Number>,
    pub(in super::super) max_properties: Option<Number>,
    pub(in super::super) unevaluated: Option<Id>,
}

impl Default for Obj {
    fn default() -> Self {
        Obj {
            properties: BTreeMap::new(),
            required: Vec::new(),
            pattern_properties: Vec::new(),
            permits_additional: true,
            additional: None,
            property_dependencies: BTreeMap::new(),
            schema_dependencies: BTreeMap::new(),
            min_properties: None,
            max_properties: None,
            unevaluated: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(in super::super) struct Arr {
    pub(in super::super) all_items: Option<Id>,
    pub(in super::super) item_schemas: Option<Vec<Id>>,
    pub(in super::super) permits_additional: bool,
    pub(in super::super) additional: Option<Id>,
    pub(in super::super) min_items: Option<Number>,
    pub(in super::super) max_items: Option<Number>,
    pub(in super::super) unique_items: bool,
    pub(in super::super) min_contains: Option<Number>,
    pub(in super::super) max_contains: Option<Number>,
    pub(in super::super) unevaluated: Option<Id>,
}

impl Default for Arr {
    fn default() -> Self {
        Arr {
            all_items: None,
            item_schemas: None,
            permits_additional: true,
            additional: None,
            min_items: None,
            max_items: None,
            unique_items: false,
            min_contains: None,
            max_contains: None,
            unevaluated: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(in super::super) enum Shape {
    Empty,
    True,
    False,
    Null,
    Boolean,
    Conditional,
    String(Str),
    Number(Num),
    Object(Obj),
    Array(Arr),
    Enum(Vec<Value>),
    Const(Value),
    /// The criterion, the members, and whether the translator generated it (a `type` array).
    Combined(Crit, Vec<Id>, bool),
    Not(Id),
    /// A `$ref`, to the node its target loads into (`None` until resolved).
    Ref(Option<Id>),
}

impl Shape {
    /// The Java class, for "same kind" (both combinations count as one).
    pub(in super::super) fn class(&self) -> u8 {
        match self {
            Shape::Empty => 0,
            Shape::True => 1,
            Shape::False => 2,
            Shape::Null => 3,
            Shape::Boolean => 4,
            Shape::Conditional => 5,
            Shape::String(_) => 6,
            Shape::Number(_) => 7,
            Shape::Object(_) => 8,
            Shape::Array(_) => 9,
            Shape::Enum(_) => 10,
            Shape::Const(_) => 11,
            Shape::Combined(..) => 12,
            Shape::Not(_) => 13,
            Shape::Ref(_) => 14,
        }
    }

    /// `EmptySchema` or its subclass `TrueSchema`.
    pub(in super::super) fn is_empty(&self) -> bool {
        matches!(self, Shape::Empty | Shape::True)
    }
}

/// The keywords every node carries and the diff compares (`$id`, title, description,
/// default), and the `connect.type` marker it reads.
#[derive(Debug, Clone, Default, PartialEq)]
pub(in super::super) struct Common {
    pub(in super::super) id: Option<Value>,
    pub(in super::super) title: Option<Value>,
    pub(in super::super) description: Option<Value>,
    pub(in super::super) default: Option<Value>,
    pub(in super::super) connect_bytes: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub(in super::super) struct Node {
    pub(in super::super) shape: Shape,
    pub(in super::super) common: Common,
    /// The JSON it was loaded from (none for the parts of a synthetic `allOf`).
    pub(in super::super) raw: Option<Value>,
}

/// One loaded document.
#[derive(Debug)]
pub(in super::super) struct Graph {
    pub(in super::super) nodes: Vec<Node>,
    pub(in super::super) root: Id,
}

impl Graph {
    pub(in super::super) fn node(&self, id: Id) -> &Node {
        &self.nodes[id]
    }

    /// The node a chain of `$ref`s ends at.
    /// The node a `$ref` names, one level down, as the registry follows one (a `$ref` to
    /// a `$ref` is compared as a reference); any other node itself.
    pub(in super::super) fn deref(&self, id: Id) -> Id {
        match self.nodes[id].shape {
            Shape::Ref(Some(target)) => target,
            _ => id,
        }
    }

    /// A canonical text of the node as loaded (the registry dedupes combined members by
    /// their canonical JSON); `$ref`s by target, so cycles end.
    pub(in super::super) fn canonical(&self, id: Id) -> String {
        if let Some(raw) = &self.nodes[id].raw {
            // serde_json's maps are sorted: the same JSON is the same text.
            return raw.to_string();
        }
        match &self.nodes[id].shape {
            Shape::Ref(target) => format!("$ref:{target:?}"),
            shape => {
                let node = &self.nodes[id];
                let children = |ids: &mut dyn Iterator<Item = Id>| {
                    ids.map(|c| self.canonical(c)).collect::<Vec<_>>().join(",")
                };
                let inner = match shape {
                    Shape::Combined(c, members, _) => {
                        format!("{}[{}]", c.name(), children(&mut members.iter().copied()))
                    }
                    Shape::Not(n) => format!("not[{}]", self.canonical(*n)),
                    Shape::Object(o) => format!(
                        "{o:?}|{}|{}|{}",
                        children(&mut o.properties.values().copied()),
                        children(&mut o.additional.iter().copied()),
                        children(&mut o.pattern_properties.iter().map(|p| p.1))
                    ),
                    Shape::Array(a) => format!(
                        "{a:?}|{}|{}|{}",
                        children(&mut a.all_items.iter().copied()),
                        children(&mut a.item_schemas.iter().flatten().copied()),
                        children(&mut a.additional.iter().copied())
                    ),
                    other => format!("{other:?}"),
                };
                format!("{inner}|{:?}", node.common)
            }
        }
    }
}
