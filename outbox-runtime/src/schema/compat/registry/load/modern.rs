//! 2019-09 and 2020-12 as the registry's translator reads them (CONFLUENT.md §3.3): one
//! fragment per keyword, joined.

use serde_json::{Map, Value};

use super::model::{Arr, Crit, Id, Num, Obj, Shape, Str};
use super::{enum_values, unsupported, Loader};
use crate::schema::compat::registry::Unpredicted;

impl<'a> Loader<'a> {
    /// 2019-09/2020-12, as the translator joins one fragment per keyword (§3.3).
    pub(super) fn load_modern(&mut self, map: &'a Map<String, Value>) -> Result<Id, Unpredicted> {
        let mut fragments: Vec<Shape> = Vec::new();
        // `$ref` nodes, joined like any fragment (their siblings are kept in 2019-09+).
        let mut refs: Vec<Id> = Vec::new();
        for (keyword, value) in map {
            let only = |k: &str| (k == keyword).then_some(value);
            let shape = match keyword.as_str() {
                "type" => match value {
                    Value::String(name) => typed(name)?,
                    Value::Array(names) => {
                        let members = names
                            .iter()
                            .map(|n| typed(n.as_str().unwrap_or("?")).map(|s| self.push(s)))
                            .collect::<Result<_, _>>()?;
                        Shape::Combined(Crit::AnyOf, members, true)
                    }
                    _ => return Err(unsupported("type is neither a string nor an array")),
                },
                "minLength" | "maxLength" | "pattern" => Shape::String(self.string(&only)?),
                "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum" | "multipleOf" => {
                    Shape::Number(self.number(&only, false)?)
                }
                "properties"
                | "required"
                | "patternProperties"
                | "minProperties"
                | "maxProperties"
                | "additionalProperties" => Shape::Object(self.object(&only)?),
                // Kept as an object fragment, though the diff never compares it.
                "propertyNames" => Shape::Object(Obj::default()),
                "dependentRequired" => {
                    Shape::Object(self.object(&|k: &str| (k == "dependencies").then_some(value))?)
                }
                "dependentSchemas" => {
                    let mut object = Obj::default();
                    let schemas =
                        value.as_object().ok_or_else(|| unsupported("dependentSchemas is not an object"))?;
                    for (name, schema) in schemas {
                        let id = self.load(schema)?;
                        object.schema_dependencies.insert(name.clone(), id);
                    }
                    Shape::Object(object)
                }
                "unevaluatedProperties" => {
                    Shape::Object(Obj { unevaluated: Some(self.load(value)?), ..Obj::default() })
                }
                "prefixItems" => {
                    Shape::Array(Arr { item_schemas: Some(self.list(value, keyword)?), ..Arr::default() })
                }
                // 2019-09's tuple form: the registry's 2019-09 loader (json-sKema) reads
                // `items` as one schema only.
                "items" if value.is_array() => {
                    return Err(unsupported(
                        "a 2019-09 tuple `items`, which the registry's loader does not read",
                    ))
                }
                "items" if map.contains_key("prefixItems") => match value {
                    Value::Bool(false) => Shape::Array(Arr { permits_additional: false, ..Arr::default() }),
                    Value::Bool(true) => continue,
                    schema => Shape::Array(Arr { additional: Some(self.load(schema)?), ..Arr::default() }),
                },
                "items" => match value {
                    Value::Bool(false) => Shape::Array(Arr { permits_additional: false, ..Arr::default() }),
                    Value::Bool(true) => continue,
                    schema => Shape::Array(Arr { all_items: Some(self.load(schema)?), ..Arr::default() }),
                },
                "minItems" | "maxItems" | "uniqueItems" => Shape::Array(self.array(&only)?),
                "contains" => Shape::Array(Arr {
                    min_contains: Some(
                        map.get("minContains").and_then(Value::as_number).cloned().unwrap_or(1.into()),
                    ),
                    max_contains: map.get("maxContains").and_then(Value::as_number).cloned(),
                    ..Arr::default()
                }),
                "unevaluatedItems" => {
                    Shape::Array(Arr { unevaluated: Some(self.load(value)?), ..Arr::default() })
                }
                "enum" => Shape::Enum(enum_values(value)?),
                "const" => Shape::Const(value.clone()),
                "not" => Shape::Not(self.load(value)?),
                // Only `if` makes a conditional; a `then` or `else` without it is nothing.
                "if" => Shape::Conditional,
                "allOf" | "anyOf" | "oneOf" => {
                    let crit = match keyword.as_str() {
                        "allOf" => Crit::AllOf,
                        "anyOf" => Crit::AnyOf,
                        _ => Crit::OneOf,
                    };
                    Shape::Combined(crit, self.list(value, keyword)?, false)
                }
                "$ref" => {
                    refs.push(self.reference(value)?);
                    continue;
                }
                _ => continue,
            };
            fragments.push(shape);
        }
        self.join(refs, fragments)
    }

    /// The translator's join: same-class fragments merge, a fragment of a `type` array's
    /// class merges into that member (whichever comes first), anything else makes a
    /// generated `allOf`.
    fn join(&mut self, refs: Vec<Id>, fragments: Vec<Shape>) -> Result<Id, Unpredicted> {
        let mut members: Vec<Id> = refs;
        let mut typed_union: Option<Id> = None;
        for fragment in fragments {
            if members.iter().any(|&m| merge(&mut self.nodes[m].shape, &fragment)) {
                continue;
            }
            if let Some(union) = typed_union {
                if let Shape::Combined(_, branches, true) = self.nodes[union].shape.clone() {
                    if let Some(&b) =
                        branches.iter().find(|&&b| same_mergeable(&self.nodes[b].shape, &fragment))
                    {
                        merge(&mut self.nodes[b].shape, &fragment);
                        continue;
                    }
                }
            }
            let union = matches!(fragment, Shape::Combined(_, _, true));
            let id = self.push(fragment);
            if union {
                // Fragments joined before the union merge into its branches too.
                if let Shape::Combined(_, branches, true) = self.nodes[id].shape.clone() {
                    for b in branches {
                        let mut kept = Vec::with_capacity(members.len());
                        for m in std::mem::take(&mut members) {
                            let piece = self.nodes[m].shape.clone();
                            if same_mergeable(&self.nodes[b].shape, &piece) {
                                merge(&mut self.nodes[b].shape, &piece);
                            } else {
                                kept.push(m);
                            }
                        }
                        members = kept;
                    }
                }
                typed_union = Some(id);
            }
            members.push(id);
        }
        Ok(match members.len() {
            0 => self.push(Shape::Empty),
            1 => members[0],
            _ => self.push(Shape::Combined(Crit::AllOf, members, false)),
        })
    }
}

fn typed(name: &str) -> Result<Shape, Unpredicted> {
    Ok(match name {
        "string" => Shape::String(Str::default()),
        "integer" => Shape::Number(Num { integer: true, ..Num::default() }),
        "number" => Shape::Number(Num::default()),
        "array" => Shape::Array(Arr::default()),
        "object" => Shape::Object(Obj::default()),
        "boolean" => Shape::Boolean,
        "null" => Shape::Null,
        other => return Err(unsupported(format!("unknown type {other:?}"))),
    })
}

fn same_mergeable(a: &Shape, b: &Shape) -> bool {
    matches!(
        (a, b),
        (Shape::String(_), Shape::String(_))
            | (Shape::Number(_), Shape::Number(_))
            | (Shape::Object(_), Shape::Object(_))
            | (Shape::Array(_), Shape::Array(_))
    )
}

/// Merges `b` into `a` field by field when both are the same class of String, Number,
/// Object or Array; false (and `a` untouched) otherwise.
fn merge(a: &mut Shape, b: &Shape) -> bool {
    fn take<T: Clone>(a: &mut Option<T>, b: &Option<T>) {
        if b.is_some() {
            a.clone_from(b);
        }
    }
    match (a, b) {
        (Shape::String(a), Shape::String(b)) => {
            take(&mut a.min_length, &b.min_length);
            take(&mut a.max_length, &b.max_length);
            take(&mut a.pattern, &b.pattern);
        }
        (Shape::Number(a), Shape::Number(b)) => {
            take(&mut a.minimum, &b.minimum);
            take(&mut a.maximum, &b.maximum);
            take(&mut a.exclusive_minimum, &b.exclusive_minimum);
            take(&mut a.exclusive_maximum, &b.exclusive_maximum);
            take(&mut a.multiple_of, &b.multiple_of);
            a.integer |= b.integer;
        }
        (Shape::Object(a), Shape::Object(b)) => {
            a.properties.extend(b.properties.iter().map(|(k, v)| (k.clone(), *v)));
            a.required.extend(b.required.iter().cloned());
            a.pattern_properties.extend(b.pattern_properties.iter().cloned());
            a.permits_additional &= b.permits_additional;
            take(&mut a.additional, &b.additional);
            a.property_dependencies.extend(b.property_dependencies.clone());
            a.schema_dependencies.extend(b.schema_dependencies.clone());
            take(&mut a.min_properties, &b.min_properties);
            take(&mut a.max_properties, &b.max_properties);
            take(&mut a.unevaluated, &b.unevaluated);
        }
        (Shape::Array(a), Shape::Array(b)) => {
            take(&mut a.all_items, &b.all_items);
            take(&mut a.item_schemas, &b.item_schemas);
            a.permits_additional &= b.permits_additional;
            take(&mut a.additional, &b.additional);
            take(&mut a.min_items, &b.min_items);
            take(&mut a.max_items, &b.max_items);
            a.unique_items |= b.unique_items;
            take(&mut a.min_contains, &b.min_contains);
            take(&mut a.max_contains, &b.max_contains);
            take(&mut a.unevaluated, &b.unevaluated);
        }
        _ => return false,
    }
    true
}
