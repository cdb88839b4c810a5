//! Values a schema probably accepts, and small edits of them.

use serde_json::{json, Map, Value};

use super::gen::Gen;
use super::{NAMES, STRINGS};

impl Gen<'_> {
    /// A plain JSON value from a small pool, nested to `depth`.
    pub(super) fn plain_value(&mut self, depth: u32) -> Value {
        match self.rng.u8(..10) {
            0 => Value::Null,
            1 => Value::Bool(self.rng.bool()),
            2 => json!(self.rng.i64(-4..9)),
            3 => json!(self.pick(&[2.5, -0.5, 1.0, 3.0])),
            4 | 5 => json!(self.pick(&STRINGS)),
            6 if depth > 0 => {
                Value::Array((0..self.rng.usize(..3)).map(|_| self.plain_value(depth - 1)).collect())
            }
            7 if depth > 0 => {
                let mut m = Map::new();
                for _ in 0..self.rng.usize(..3) {
                    let v = self.plain_value(depth - 1);
                    m.insert(self.pick(&NAMES).to_owned(), v);
                }
                Value::Object(m)
            }
            _ => json!(self.rng.i64(0..3)),
        }
    }

    /// A value `schema` probably accepts, built by reading its keywords.
    pub(super) fn sample(&mut self, schema: &Value, root: &Value, depth: u32) -> Value {
        if depth == 0 {
            return self.plain_value(0);
        }
        let Value::Object(o) = schema else { return self.plain_value(1) };
        if let Some(c) = o.get("const") {
            return c.clone();
        }
        if let Some(Value::Array(values)) = o.get("enum") {
            if !values.is_empty() {
                return values[self.rng.usize(..values.len())].clone();
            }
        }
        if let Some(Value::String(r)) = o.get("$ref") {
            if let Some(target) = r.strip_prefix('#').and_then(|p| root.pointer(p)) {
                return self.sample(target, root, depth - 1);
            }
        }
        for key in ["anyOf", "oneOf", "allOf"] {
            if let Some(Value::Array(parts)) = o.get(key) {
                if !parts.is_empty() && self.chance(7) {
                    let i = self.rng.usize(..parts.len());
                    let mut v = self.sample(&parts[i], root, depth - 1);
                    if let (Value::Object(m), Some("object")) =
                        (&mut v, o.get("type").and_then(Value::as_str))
                    {
                        m.entry("kind").or_insert(json!("a"));
                    }
                    return v;
                }
            }
        }
        if let Some(then) = o.get("then").filter(|_| self.rng.bool()) {
            return self.sample(then, root, depth - 1);
        }
        let types: Vec<&str> = match o.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
            _ => vec!["null", "boolean", "integer", "number", "string", "array", "object"],
        };
        if types.is_empty() {
            return self.plain_value(1);
        }
        let num = |k: &str| o.get(k).and_then(Value::as_f64);
        match self.pick(&types) {
            "null" => Value::Null,
            "boolean" => Value::Bool(self.rng.bool()),
            t @ ("integer" | "number") => {
                let lo = num("minimum").or(num("exclusiveMinimum").map(|v| v + 1.0)).unwrap_or(-5.0);
                let hi =
                    num("maximum").or(num("exclusiveMaximum").map(|v| v - 1.0)).unwrap_or(lo + 10.0).max(lo);
                let span = (hi - lo).floor().max(0.0) as i64;
                let mut v = lo.ceil() as i64 + self.rng.i64(0..=span);
                if let Some(m) = num("multipleOf").filter(|m| *m >= 1.0) {
                    let m = m as i64;
                    v -= v.rem_euclid(m);
                }
                if t == "number" && self.chance(2) {
                    json!(v as f64 + 0.5)
                } else {
                    json!(v)
                }
            }
            "string" => {
                let candidates: Vec<&str> = STRINGS
                    .iter()
                    .copied()
                    .filter(|s| {
                        let len = s.chars().count() as f64;
                        num("minLength").is_none_or(|m| len >= m) && num("maxLength").is_none_or(|m| len <= m)
                    })
                    .collect();
                if candidates.is_empty() {
                    json!("a".repeat(num("minLength").unwrap_or(1.0) as usize))
                } else {
                    json!(self.pick(&candidates))
                }
            }
            "array" => {
                let min = num("minItems").unwrap_or(0.0) as usize;
                let max = num("maxItems").map_or(min + 3, |m| m as usize).max(min);
                let len = self.rng.usize(min..=max);
                let prefix = o
                    .get("prefixItems")
                    .or_else(|| o.get("items").filter(|i| i.is_array()))
                    .and_then(Value::as_array);
                let rest = o.get("items").filter(|i| !i.is_array()).or_else(|| o.get("additionalItems"));
                (0..len)
                    .map(|i| match prefix.and_then(|p| p.get(i)).or(rest) {
                        Some(s) => self.sample(s, root, depth - 1),
                        None => self.plain_value(1),
                    })
                    .collect()
            }
            _ => {
                let mut m = Map::new();
                let props = o.get("properties").and_then(Value::as_object);
                let required: Vec<&str> = o
                    .get("required")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                for (name, s) in props.into_iter().flatten() {
                    if required.contains(&name.as_str()) || self.rng.bool() {
                        let v = self.sample(s, root, depth - 1);
                        m.insert(name.clone(), v);
                    }
                }
                for name in required {
                    if !m.contains_key(name) {
                        m.insert(name.to_owned(), self.plain_value(1));
                    }
                }
                if self.chance(3) {
                    let extra = o.get("additionalProperties").cloned().unwrap_or(json!(true));
                    let v = self.sample(&extra, root, depth - 1);
                    m.insert(self.pick(&["zz", "x-z", "b"]).to_owned(), v);
                }
                Value::Object(m)
            }
        }
    }

    /// A small change to a value: another leaf, a property more or less, an item more.
    pub(super) fn mutate_value(&mut self, v: &Value) -> Value {
        let mut v = v.clone();
        match &mut v {
            Value::Object(m) => {
                if self.rng.bool() && !m.is_empty() {
                    let k = m.keys().nth(self.rng.usize(..m.len())).cloned().unwrap_or_default();
                    let child = m.get(&k).cloned().unwrap_or(Value::Null);
                    let new = if self.rng.bool() { self.mutate_value(&child) } else { self.plain_value(1) };
                    m.insert(k, new);
                } else {
                    m.insert(self.pick(&NAMES).to_owned(), self.plain_value(1));
                }
            }
            Value::Array(items) => {
                if self.rng.bool() || items.is_empty() {
                    items.push(self.plain_value(1));
                } else {
                    let i = self.rng.usize(..items.len());
                    items[i] = self.mutate_value(&items[i]);
                }
            }
            Value::Number(n) => {
                let f = n.as_f64().unwrap_or(0.0);
                v = if self.rng.bool() { json!(f + 1.0) } else { json!((f as i64) - 1) };
            }
            _ => v = self.plain_value(1),
        }
        v
    }
}
