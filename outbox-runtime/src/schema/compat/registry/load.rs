//! JSON documents into the registry's model of node kinds (CONFLUENT.md §3): draft-04, -06
//! and -07 as its everit loader reads them (one builder per keyword family, several
//! joined in a synthetic `allOf`), 2019-09 and 2020-12 as its translator does (one
//! fragment per keyword, joined). `$ref`s are shared nodes, one per target, so that a
//! recursive schema is a cycle.

use std::collections::HashMap;

use serde_json::{Map, Number, Value};

use super::Unpredicted;
use crate::schema::uri::percent_decode;

mod model;
mod modern;

pub(super) use self::model::{Arr, Crit, Graph, Id, Num, Obj, Shape, Str};
use self::model::{Common, Node, Spec};

const NUMBER_KW: [&str; 5] = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"];
const STRING_KW: [&str; 4] = ["minLength", "maxLength", "pattern", "format"];
const ARRAY_KW: [&str; 6] = ["items", "additionalItems", "minItems", "maxItems", "uniqueItems", "contains"];
const OBJECT_KW: [&str; 8] = [
    "properties",
    "required",
    "minProperties",
    "maxProperties",
    "dependencies",
    "patternProperties",
    "additionalProperties",
    "propertyNames",
];

fn unsupported(why: impl Into<String>) -> Unpredicted {
    Unpredicted(why.into())
}

/// Reads a keyword of the object being loaded.
type Get<'a, 'b> = &'b dyn Fn(&str) -> Option<&'a Value>;

struct Loader<'a> {
    doc: &'a Value,
    spec: Spec,
    nodes: Vec<Node>,
    /// `$ref` target (a JSON pointer) to its node.
    targets: HashMap<String, Id>,
    /// `$ref` nodes waiting for their target: (node, pointer).
    pending: Vec<(Id, String)>,
    /// How deep the schema being loaded is nested.
    depth: usize,
}

/// How deep a schema may nest before the emulation declines it (JSON read from text nests
/// 128 deep at most).
const MAX_DEPTH: usize = 256;

impl Graph {
    /// Loads `doc` as the registry does (its `$schema` picks the loader; none is draft-07).
    pub(super) fn load(doc: &Value) -> Result<Graph, Unpredicted> {
        let spec = match doc.get("$schema").and_then(Value::as_str).map(|s| s.strip_suffix('#').unwrap_or(s))
        {
            Some(uri) => {
                let rest = uri.strip_prefix("http://").or_else(|| uri.strip_prefix("https://")).unwrap_or("");
                match rest {
                    "json-schema.org/draft-04/schema" | "json-schema.org/schema" => Spec::Draft4,
                    "json-schema.org/draft-06/schema" => Spec::Draft6,
                    "json-schema.org/draft/2019-09/schema" | "json-schema.org/draft/2020-12/schema" => {
                        Spec::Modern
                    }
                    _ => Spec::Draft7,
                }
            }
            None => Spec::Draft7,
        };
        let mut loader =
            Loader { doc, spec, nodes: Vec::new(), targets: HashMap::new(), pending: Vec::new(), depth: 0 };
        let root = loader.load(doc)?;
        // Each target loads once, however many `$ref`s name it; loading one may add more.
        let mut rounds = 0;
        while let Some((node, pointer)) = loader.pending.pop() {
            rounds += 1;
            if rounds > 100_000 {
                return Err(unsupported("too many $ref targets"));
            }
            let target = match loader.targets.get(&pointer) {
                Some(&id) => id,
                None => {
                    let value = loader.resolve(&pointer)?;
                    let id = loader.load(value)?;
                    loader.targets.insert(pointer, id);
                    id
                }
            };
            loader.nodes[node].shape = Shape::Ref(Some(target));
        }
        Ok(Graph { nodes: loader.nodes, root })
    }
}

impl<'a> Loader<'a> {
    fn push(&mut self, shape: Shape) -> Id {
        self.nodes.push(Node { shape, common: Common::default(), raw: None });
        self.nodes.len() - 1
    }

    /// The value a local `$ref` names; `#/$defs/X` falls back on `#/definitions/X`, since
    /// the registry copies the root's `definitions` into `$defs` before loading.
    fn resolve(&self, pointer: &str) -> Result<&'a Value, Unpredicted> {
        let not_local =
            || unsupported(format!("$ref {pointer:?} is not a JSON pointer into the same document"));
        let path = percent_decode(pointer.strip_prefix('#').ok_or_else(not_local)?);
        if path.is_empty() {
            return Ok(self.doc);
        }
        if !path.starts_with('/') {
            return Err(not_local());
        }
        let found = self.doc.pointer(&path).or_else(|| {
            path.strip_prefix("/$defs/").and_then(|rest| self.doc.pointer(&format!("/definitions/{rest}")))
        });
        found.ok_or_else(|| unsupported(format!("$ref {pointer:?} names nothing in the document")))
    }

    fn load(&mut self, value: &'a Value) -> Result<Id, Unpredicted> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(unsupported(format!("schemas nested deeper than {MAX_DEPTH}")));
        }
        let loaded = self.load_at(value);
        self.depth -= 1;
        let id = loaded?;
        self.nodes[id].raw.get_or_insert_with(|| value.clone());
        Ok(id)
    }

    fn load_at(&mut self, value: &'a Value) -> Result<Id, Unpredicted> {
        let map = match value {
            Value::Bool(true) => return Ok(self.push(Shape::True)),
            Value::Bool(false) => return Ok(self.push(Shape::False)),
            Value::Object(map) => map,
            other => return Err(unsupported(format!("a schema is {other}, not an object or a boolean"))),
        };
        let id = match self.spec {
            Spec::Modern => self.load_modern(map)?,
            _ => self.load_draft(map)?,
        };
        let id_key = if self.spec == Spec::Draft4 { "id" } else { "$id" };
        let common = Common {
            id: map.get(id_key).cloned(),
            title: map.get("title").cloned(),
            description: map.get("description").cloned(),
            // The 2019-09+ translator reads a null default as none.
            default: map.get("default").filter(|d| !(self.spec == Spec::Modern && d.is_null())).cloned(),
            connect_bytes: map.get("connect.type").and_then(Value::as_str) == Some("bytes"),
        };
        self.nodes[id].common = common;
        Ok(id)
    }

    fn reference(&mut self, target: &Value) -> Result<Id, Unpredicted> {
        let pointer = target.as_str().ok_or_else(|| unsupported("$ref is not a string"))?;
        let id = self.push(Shape::Ref(None));
        self.pending.push((id, pointer.to_owned()));
        Ok(id)
    }

    fn list(&mut self, value: &'a Value, keyword: &str) -> Result<Vec<Id>, Unpredicted> {
        let items = value.as_array().ok_or_else(|| unsupported(format!("{keyword} is not an array")))?;
        items.iter().map(|s| self.load(s)).collect()
    }

    /// Draft-04/06/07, as everit loads them (CONFLUENT.md §3.2).
    fn load_draft(&mut self, map: &'a Map<String, Value>) -> Result<Id, Unpredicted> {
        if let Some(target) = map.get("$ref") {
            return self.reference(target);
        }
        let mut builders = Vec::new();
        let mut consumed: Vec<&str> = Vec::new();
        if let Some(values) = map.get("enum") {
            builders.push(self.push(Shape::Enum(enum_values(values)?)));
            consumed.push("enum");
        }
        for (keyword, crit) in [("allOf", Crit::AllOf), ("anyOf", Crit::AnyOf), ("oneOf", Crit::OneOf)] {
            if let Some(members) = map.get(keyword) {
                let members = self.list(members, keyword)?;
                builders.push(self.push(Shape::Combined(crit, members, false)));
                consumed.push(keyword);
            }
        }
        if let Some(not) = map.get("not") {
            let inner = self.load(not)?;
            builders.push(self.push(Shape::Not(inner)));
            consumed.push("not");
        }
        if self.spec != Spec::Draft4 {
            if let Some(value) = map.get("const") {
                builders.push(self.push(Shape::Const(value.clone())));
                consumed.push("const");
            }
        }
        let kinds = |list: &[&'static str]| -> Vec<&'static str> {
            list.iter()
                .copied()
                .filter(|k| self.spec != Spec::Draft4 || (*k != "contains" && *k != "propertyNames"))
                .collect()
        };
        let (number_kw, string_kw, array_kw, object_kw) =
            (kinds(&NUMBER_KW), kinds(&STRING_KW), kinds(&ARRAY_KW), kinds(&OBJECT_KW));
        if let Some(ty) = map.get("type") {
            consumed.push("type");
            let names: Vec<&str> = match ty {
                Value::String(s) => vec![s.as_str()],
                Value::Array(items) => items.iter().map(|t| t.as_str().unwrap_or("?")).collect(),
                _ => return Err(unsupported("type is neither a string nor an array")),
            };
            let mut typed = Vec::new();
            for name in &names {
                let (shape, uses) = match *name {
                    "string" => (Shape::String(self.string(&|k: &str| map.get(k))?), &string_kw),
                    "integer" | "number" => {
                        (Shape::Number(self.number(&|k: &str| map.get(k), *name == "integer")?), &number_kw)
                    }
                    "array" => (Shape::Array(self.array(&|k: &str| map.get(k))?), &array_kw),
                    "object" => (Shape::Object(self.object(&|k: &str| map.get(k))?), &object_kw),
                    "boolean" => (Shape::Boolean, &Vec::new()),
                    "null" => (Shape::Null, &Vec::new()),
                    other => return Err(unsupported(format!("unknown type {other:?}"))),
                };
                consumed.extend(uses.iter().copied());
                typed.push(self.push(shape));
            }
            match ty {
                Value::String(_) => builders.extend(typed),
                _ => builders.push(self.push(Shape::Combined(Crit::AnyOf, typed, false))),
            }
        }
        let remaining = |list: &[&str]| list.iter().any(|k| map.contains_key(*k) && !consumed.contains(k));
        if remaining(&array_kw) {
            let shape = Shape::Array(self.array(&|k: &str| map.get(k))?);
            builders.push(self.push(shape));
        }
        if remaining(&object_kw) {
            let shape = Shape::Object(self.object(&|k: &str| map.get(k))?);
            builders.push(self.push(shape));
        }
        if remaining(&number_kw) {
            let shape = Shape::Number(self.number(&|k: &str| map.get(k), false)?);
            builders.push(self.push(shape));
        }
        if remaining(&string_kw) {
            let shape = Shape::String(self.string(&|k: &str| map.get(k))?);
            builders.push(self.push(shape));
        }
        if self.spec == Spec::Draft7 && ["if", "then", "else"].iter().any(|k| map.contains_key(*k)) {
            builders.push(self.push(Shape::Conditional));
        }
        Ok(match builders.len() {
            0 => self.push(Shape::Empty),
            1 => builders[0],
            _ => self.push(Shape::Combined(Crit::AllOf, builders, false)),
        })
    }

    fn string(&mut self, get: Get<'a, '_>) -> Result<Str, Unpredicted> {
        Ok(Str {
            min_length: number(get("minLength"), "minLength")?,
            max_length: number(get("maxLength"), "maxLength")?,
            pattern: match get("pattern") {
                None => None,
                Some(Value::String(p)) => Some(p.clone()),
                Some(_) => return Err(unsupported("pattern is not a string")),
            },
        })
    }

    fn number(&mut self, get: Get<'a, '_>, integer: bool) -> Result<Num, Unpredicted> {
        // Draft-04's boolean exclusive bounds set flags the diff never reads.
        let limit = |key| if self.spec == Spec::Draft4 { Ok(None) } else { number(get(key), key) };
        Ok(Num {
            minimum: number(get("minimum"), "minimum")?,
            maximum: number(get("maximum"), "maximum")?,
            exclusive_minimum: limit("exclusiveMinimum")?,
            exclusive_maximum: limit("exclusiveMaximum")?,
            multiple_of: number(get("multipleOf"), "multipleOf")?,
            integer,
        })
    }

    fn array(&mut self, get: Get<'a, '_>) -> Result<Arr, Unpredicted> {
        let mut array = Arr::default();
        match get("items") {
            None => {}
            Some(Value::Array(items)) => {
                array.item_schemas = Some(items.iter().map(|s| self.load(s)).collect::<Result<_, _>>()?);
            }
            Some(schema) => array.all_items = Some(self.load(schema)?),
        }
        match get("additionalItems") {
            None | Some(Value::Bool(true)) => {}
            Some(Value::Bool(false)) => array.permits_additional = false,
            Some(schema) => array.additional = Some(self.load(schema)?),
        }
        if array.all_items.is_some() {
            array.permits_additional = true;
        }
        array.min_items = number(get("minItems"), "minItems")?;
        array.max_items = number(get("maxItems"), "maxItems")?;
        array.unique_items = get("uniqueItems").and_then(Value::as_bool).unwrap_or(false);
        Ok(array)
    }

    fn object(&mut self, get: Get<'a, '_>) -> Result<Obj, Unpredicted> {
        let mut object = Obj::default();
        let as_map = |key: &str| -> Result<Option<&'a Map<String, Value>>, Unpredicted> {
            match get(key) {
                None => Ok(None),
                Some(Value::Object(m)) => Ok(Some(m)),
                Some(_) => Err(unsupported(format!("{key} is not an object"))),
            }
        };
        for (name, schema) in as_map("properties")?.into_iter().flatten() {
            let id = self.load(schema)?;
            object.properties.insert(name.clone(), id);
        }
        if let Some(Value::Array(names)) = get("required") {
            object.required = names.iter().filter_map(Value::as_str).map(str::to_owned).collect();
        }
        for (pattern, schema) in as_map("patternProperties")?.into_iter().flatten() {
            let id = self.load(schema)?;
            object.pattern_properties.push((pattern.clone(), id));
        }
        match get("additionalProperties") {
            None | Some(Value::Bool(true)) => {}
            Some(Value::Bool(false)) => object.permits_additional = false,
            Some(schema) => object.additional = Some(self.load(schema)?),
        }
        for (name, dependency) in as_map("dependencies")?.into_iter().flatten() {
            match dependency {
                // One entry per name required: an empty list is no dependency at all.
                Value::Array(names) if names.is_empty() => {}
                Value::Array(names) => {
                    let names = names.iter().filter_map(Value::as_str).map(str::to_owned).collect();
                    object.property_dependencies.insert(name.clone(), names);
                }
                schema => {
                    let id = self.load(schema)?;
                    object.schema_dependencies.insert(name.clone(), id);
                }
            }
        }
        object.min_properties = number(get("minProperties"), "minProperties")?;
        object.max_properties = number(get("maxProperties"), "maxProperties")?;
        Ok(object)
    }
}

fn number(value: Option<&Value>, key: &str) -> Result<Option<Number>, Unpredicted> {
    match value {
        None => Ok(None),
        Some(Value::Number(n)) => Ok(Some(n.clone())),
        Some(_) => Err(unsupported(format!("{key} is not a number"))),
    }
}

fn enum_values(values: &Value) -> Result<Vec<Value>, Unpredicted> {
    let mut out: Vec<Value> = Vec::new();
    for v in values.as_array().ok_or_else(|| unsupported("enum is not an array"))? {
        if !out.contains(v) {
            out.push(v.clone());
        }
    }
    Ok(out)
}
