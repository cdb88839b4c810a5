//! Schemas of every dialect, and small edits of them.

use serde_json::{json, Map, Value};

use super::{DIALECTS, FORMATS, NAMES, PATTERNS, STRINGS};

pub(super) struct Gen<'r> {
    pub(super) rng: &'r mut fastrand::Rng,
    /// Index into [`DIALECTS`].
    pub(super) d: usize,
}

impl Gen<'_> {
    pub(super) fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.rng.usize(..from.len())]
    }

    pub(super) fn chance(&mut self, in_ten: u8) -> bool {
        self.rng.u8(..10) < in_ten
    }

    pub(super) fn defs_key(&self) -> &'static str {
        if self.d >= 3 {
            "$defs"
        } else {
            "definitions"
        }
    }

    /// A whole document: `$schema`, definitions, and a root that may use them.
    pub(super) fn document(&mut self) -> Value {
        let mut root = self.schema(3);
        if !root.is_object() {
            root = json!({ "allOf": [root] });
        }
        let defs: Map<String, Value> = (0..2).map(|i| (format!("D{i}"), self.schema(2))).collect();
        if let Value::Object(o) = &mut root {
            if self.chance(9) {
                o.insert("$schema".to_owned(), Value::String(DIALECTS[self.d].to_owned()));
            }
            o.insert(self.defs_key().to_owned(), Value::Object(defs));
        }
        root
    }

    pub(super) fn schema(&mut self, depth: u32) -> Value {
        let roll = self.rng.u8(..100);
        if depth == 0 || roll < 35 {
            return self.leaf();
        }
        match roll {
            35..=54 => self.object(depth),
            55..=66 => self.array(depth),
            67..=84 => self.combinator(depth),
            85..=92 => json!({ "$ref": format!("#/{}/D{}", self.defs_key(), self.rng.u8(..2)) }),
            // Draft-04 has no boolean schemas.
            93..=95 if self.d > 0 => Value::Bool(self.rng.bool()),
            _ if self.d > 0 => json!({ "const": self.plain_value(1) }),
            _ => json!({ "enum": [self.plain_value(1)] }),
        }
    }

    pub(super) fn leaf(&mut self) -> Value {
        let mut o = Map::new();
        match self.rng.u8(..7) {
            0 => {
                o.insert("type".into(), json!(self.pick(&["integer", "number"])));
                self.number_keywords(&mut o);
            }
            1 | 2 => {
                o.insert("type".into(), json!("string"));
                self.string_keywords(&mut o);
            }
            3 => {
                let mut types: Vec<&str> = ["null", "boolean", "integer", "string"]
                    .into_iter()
                    .filter(|_| self.rng.bool())
                    .collect();
                if types.is_empty() {
                    types.push("number");
                }
                o.insert("type".into(), json!(types));
            }
            4 => {
                let n = self.rng.usize(1..4);
                let values: Vec<Value> = (0..n).map(|_| self.plain_value(1)).collect();
                o.insert("enum".into(), Value::Array(values));
            }
            5 => {
                // No type: keywords of several types side by side.
                self.number_keywords(&mut o);
                self.string_keywords(&mut o);
            }
            _ => {
                o.insert("type".into(), json!(self.pick(&["null", "boolean"])));
            }
        }
        Value::Object(o)
    }

    pub(super) fn number_keywords(&mut self, o: &mut Map<String, Value>) {
        if self.chance(5) {
            let v = self.rng.i64(-3..4);
            if self.d == 0 && self.chance(4) {
                o.insert("minimum".into(), json!(v));
                o.insert("exclusiveMinimum".into(), json!(true));
            } else if self.d > 0 && self.chance(4) {
                o.insert("exclusiveMinimum".into(), json!(v));
            } else {
                o.insert("minimum".into(), json!(v));
            }
        }
        if self.chance(4) {
            let v = self.rng.i64(0..8);
            if self.d == 0 && self.chance(3) {
                o.insert("maximum".into(), json!(v));
                o.insert("exclusiveMaximum".into(), json!(true));
            } else if self.d > 0 && self.chance(3) {
                o.insert("exclusiveMaximum".into(), json!(v as f64 + 0.5));
            } else {
                o.insert("maximum".into(), json!(v));
            }
        }
        if self.chance(2) {
            let m = [json!(1), json!(2), json!(3), json!(0.5)][self.rng.usize(..4)].clone();
            o.insert("multipleOf".into(), m);
        }
    }

    pub(super) fn string_keywords(&mut self, o: &mut Map<String, Value>) {
        if self.chance(3) {
            o.insert("minLength".into(), json!(self.rng.u8(..3)));
        }
        if self.chance(3) {
            o.insert("maxLength".into(), json!(self.rng.u8(1..8)));
        }
        if self.chance(3) {
            o.insert("pattern".into(), json!(self.pick(&PATTERNS)));
        }
        if self.chance(2) {
            o.insert("format".into(), json!(self.pick(&FORMATS)));
        }
        if self.d >= 2 && self.chance(1) {
            o.insert("contentMediaType".into(), json!("application/json"));
        }
    }

    pub(super) fn object(&mut self, depth: u32) -> Value {
        let mut o = Map::new();
        o.insert("type".into(), json!("object"));
        let mut props = Map::new();
        for name in NAMES {
            if self.chance(4) {
                let child = if name == "kind" {
                    if self.d == 0 {
                        json!({ "enum": [self.pick(&["a", "b"])] })
                    } else {
                        json!({ "const": self.pick(&["a", "b"]) })
                    }
                } else {
                    self.schema(depth - 1)
                };
                props.insert(name.to_owned(), child);
            }
        }
        let required: Vec<&str> =
            NAMES.into_iter().filter(|n| props.contains_key(*n) && self.chance(5)).collect();
        o.insert("properties".into(), Value::Object(props));
        if !required.is_empty() || self.d > 0 {
            o.insert("required".into(), json!(required));
        }
        match self.rng.u8(..6) {
            0 => {
                o.insert("additionalProperties".into(), json!(false));
            }
            1 => {
                let s = self.schema(depth - 1);
                o.insert("additionalProperties".into(), s);
            }
            2 => {
                let s = self.schema(depth - 1);
                o.insert("patternProperties".into(), json!({ "^x-": s }));
                if self.rng.bool() {
                    o.insert("additionalProperties".into(), json!(false));
                }
            }
            _ => {}
        }
        if self.d >= 1 && self.chance(1) {
            o.insert("propertyNames".into(), json!({ "maxLength": self.rng.u8(1..4) }));
        }
        if self.chance(1) {
            o.insert("minProperties".into(), json!(self.rng.u8(..3)));
        }
        if self.chance(1) {
            o.insert("maxProperties".into(), json!(self.rng.u8(1..4)));
        }
        if self.chance(2) {
            let a = self.pick(&NAMES);
            let b = self.pick(&NAMES);
            let dep_schema = self.schema(depth - 1);
            if self.d <= 2 {
                let dep = if self.rng.bool() { json!([b]) } else { dep_schema };
                o.insert("dependencies".into(), json!({ a: dep }));
            } else if self.rng.bool() {
                o.insert("dependentRequired".into(), json!({ a: [b] }));
            } else {
                o.insert("dependentSchemas".into(), json!({ a: dep_schema }));
            }
        }
        if self.d >= 3 && self.chance(1) {
            o.insert("unevaluatedProperties".into(), json!(false));
        }
        Value::Object(o)
    }

    pub(super) fn array(&mut self, depth: u32) -> Value {
        let mut o = Map::new();
        o.insert("type".into(), json!("array"));
        if self.chance(3) {
            let prefix: Vec<Value> = (0..self.rng.usize(1..3)).map(|_| self.schema(depth - 1)).collect();
            let rest = if self.rng.bool() { json!(false) } else { self.schema(depth - 1) };
            if self.d == 4 {
                o.insert("prefixItems".into(), Value::Array(prefix));
                o.insert("items".into(), rest);
            } else {
                o.insert("items".into(), Value::Array(prefix));
                o.insert("additionalItems".into(), rest);
            }
        } else if self.chance(8) {
            let items = self.schema(depth - 1);
            o.insert("items".into(), items);
        }
        if self.chance(3) {
            o.insert("minItems".into(), json!(self.rng.u8(..3)));
        }
        if self.chance(3) {
            o.insert("maxItems".into(), json!(self.rng.u8(1..5)));
        }
        if self.chance(2) {
            o.insert("uniqueItems".into(), json!(self.rng.bool()));
        }
        if self.d >= 1 && self.chance(2) {
            let c = self.schema(depth - 1);
            o.insert("contains".into(), c);
            if self.d >= 3 && self.chance(3) {
                o.insert("minContains".into(), json!(self.rng.u8(..3)));
            }
            if self.d >= 3 && self.chance(2) {
                o.insert("maxContains".into(), json!(self.rng.u8(1..3)));
            }
        }
        Value::Object(o)
    }

    pub(super) fn combinator(&mut self, depth: u32) -> Value {
        let n = self.rng.usize(1..4);
        let parts: Vec<Value> = (0..n).map(|_| self.schema(depth - 1)).collect();
        match self.rng.u8(..6) {
            0 => json!({ "allOf": parts }),
            1 => json!({ "anyOf": parts }),
            2 => json!({ "oneOf": parts }),
            3 => json!({ "not": parts[0] }),
            4 if self.d >= 2 => {
                let then = self.schema(depth - 1);
                json!({ "if": parts[0], "then": then, "else": parts.get(1).cloned().unwrap_or(json!(true)) })
            }
            _ => {
                // A type beside a union: what schemars writes for tagged enums.
                json!({ "type": "object", "oneOf": parts })
            }
        }
    }

    /// A small edit of a document: a keyword changed, added or removed somewhere.
    pub(super) fn mutate_doc(&mut self, doc: &mut Value) {
        let mut nodes = Vec::new();
        collect_schema_nodes(doc, "", &mut nodes);
        if nodes.is_empty() {
            return;
        }
        let at = nodes[self.rng.usize(..nodes.len())].clone();
        let Some(node) = doc.pointer_mut(&at) else { return };
        let Value::Object(o) = node else {
            *node = self.schema(1);
            return;
        };
        match self.rng.u8(..10) {
            0 | 1 if !o.is_empty() => {
                let keys: Vec<String> =
                    o.keys().filter(|k| !k.starts_with('$') && *k != "definitions").cloned().collect();
                if !keys.is_empty() {
                    let i = self.rng.usize(..keys.len());
                    o.remove(&keys[i]);
                }
            }
            2 => {
                let props = o.entry("properties").or_insert_with(|| json!({}));
                if let Value::Object(p) = props {
                    p.insert(self.pick(&NAMES).to_owned(), self.leaf());
                }
            }
            3 => {
                o.insert("additionalProperties".into(), json!(self.rng.bool()));
            }
            4 => {
                for k in [
                    "minimum",
                    "maximum",
                    "minLength",
                    "maxLength",
                    "minItems",
                    "maxItems",
                    "minProperties",
                    "maxProperties",
                ] {
                    if let Some(Value::Number(n)) = o.get(k) {
                        let v = n.as_i64().unwrap_or(0) + if self.rng.bool() { 1 } else { -1 };
                        o.insert(k.to_owned(), json!(v.max(0)));
                    }
                }
            }
            5 => {
                let names: Vec<String> = o
                    .get("properties")
                    .and_then(Value::as_object)
                    .map(|p| p.keys().cloned().collect())
                    .unwrap_or_default();
                if !names.is_empty() {
                    let i = self.rng.usize(..names.len());
                    let n = names[i].clone();
                    let req = o.entry("required").or_insert_with(|| json!([]));
                    if let Value::Array(r) = req {
                        if let Some(i) = r.iter().position(|x| x == n.as_str()) {
                            r.remove(i);
                        } else {
                            r.push(json!(n));
                        }
                    }
                }
            }
            6 => {
                let other = self.leaf();
                let this = Value::Object(o.clone());
                *node = json!({ "anyOf": [this, other] });
            }
            7 => {
                if let Some(Value::Array(values)) = o.get_mut("enum") {
                    values.push(json!(self.pick(&STRINGS)));
                } else if let Some(Value::String(t)) = o.get("type").cloned() {
                    o.insert("type".into(), json!([t, "null"]));
                }
            }
            _ => {
                let extra = self.leaf();
                if let Value::Object(e) = extra {
                    for (k, v) in e {
                        o.entry(k).or_insert(v);
                    }
                }
            }
        }
    }
}

/// JSON pointers of every schema node under `v` (properties, items, parts, definitions).
pub(super) fn collect_schema_nodes(v: &Value, at: &str, out: &mut Vec<String>) {
    out.push(at.to_owned());
    let Value::Object(o) = v else { return };
    for (k, child) in o {
        let here = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
        match k.as_str() {
            "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas" => {
                for (name, s) in child.as_object().into_iter().flatten() {
                    collect_schema_nodes(
                        s,
                        &format!("{here}/{}", name.replace('~', "~0").replace('/', "~1")),
                        out,
                    );
                }
            }
            "allOf" | "anyOf" | "oneOf" | "prefixItems" | "items" if child.is_array() => {
                for (i, s) in child.as_array().into_iter().flatten().enumerate() {
                    collect_schema_nodes(s, &format!("{here}/{i}"), out);
                }
            }
            "items"
            | "additionalItems"
            | "additionalProperties"
            | "not"
            | "if"
            | "then"
            | "else"
            | "contains"
            | "propertyNames"
            | "unevaluatedProperties" => collect_schema_nodes(child, &here, out),
            _ => {}
        }
    }
}
