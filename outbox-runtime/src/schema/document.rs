//! A JSON Schema document read from somewhere, checked to be a schema whose `$ref`s all
//! resolve, so that comparing two of them never meets bad input halfway.

use std::fmt;

use serde_json::Value;

use super::dialect::{canonical_in, Dialect};
use super::keywords::{SCHEMA_ARRAY_KEYWORDS, SCHEMA_KEYWORDS, SCHEMA_MAP_KEYWORDS};
use super::uri::percent_decode;

/// Why a document could not be used as a schema. Every variant names its source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InputError {
    /// The file could not be read.
    #[error("{source_name}: cannot read: {error}")]
    Unreadable {
        /// The file.
        source_name: String,
        /// The I/O error.
        error: std::io::Error,
    },
    /// The text is not JSON.
    #[error("{source_name}: not JSON: {error}")]
    NotJson {
        /// The file.
        source_name: String,
        /// The parse error, with line and column.
        error: serde_json::Error,
    },
    /// The JSON is not a JSON Schema.
    #[error("{source_name}: not a JSON Schema: at {pointer}: {reason}")]
    NotASchema {
        /// The file.
        source_name: String,
        /// JSON pointer of the offending value (`""` is the root).
        pointer: String,
        /// What is wrong there.
        reason: String,
    },
    /// A `$ref` points nowhere inside the document.
    #[error("{source_name}: unresolvable $ref {reference:?} at {pointer} (only references inside the document, like \"#/$defs/Name\", are supported)")]
    UnresolvableRef {
        /// The file.
        source_name: String,
        /// JSON pointer of the `$ref`.
        pointer: String,
        /// The reference as written.
        reference: String,
    },
}

/// A validated JSON Schema document.
#[derive(Clone, PartialEq)]
pub struct SchemaDoc {
    name: String,
    /// The document in the 2020-12 vocabulary (see `dialect`).
    root: Value,
    dialect: Dialect,
    /// The document as given, before the rewrite into 2020-12 (what a registry judges).
    original: Value,
    /// What a writer writes, when it is narrower than what the document accepts
    /// (`x-outbox.writer`, a whole schema document of its own).
    writer: Option<Box<SchemaDoc>>,
}

impl fmt::Debug for SchemaDoc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SchemaDoc").field("name", &self.name).finish_non_exhaustive()
    }
}

const TYPE_NAMES: &[&str] = &["null", "boolean", "object", "array", "number", "string", "integer"];

impl SchemaDoc {
    /// Reads and validates the file at `path`; errors name the file.
    pub fn from_file(path: &std::path::Path) -> Result<Self, InputError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|error| InputError::Unreadable { source_name: name.clone(), error })?;
        Self::from_str(&name, &text)
    }

    /// [`SchemaDoc::from_file`], reading a document without `$schema` in `default` (as
    /// schema registries do, in draft-07) rather than in 2020-12.
    pub fn from_file_in(path: &std::path::Path, default: Dialect) -> Result<Self, InputError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|error| InputError::Unreadable { source_name: name.clone(), error })?;
        Self::from_str_in(&name, &text, default)
    }

    /// Parses and validates `text`; `name` is used in error messages.
    pub fn from_str(name: &str, text: &str) -> Result<Self, InputError> {
        Self::from_str_in(name, text, Dialect::Draft2020)
    }

    /// [`SchemaDoc::from_str`], reading a document without `$schema` in `default`.
    pub fn from_str_in(name: &str, text: &str, default: Dialect) -> Result<Self, InputError> {
        let root: Value = serde_json::from_str(text)
            .map_err(|error| InputError::NotJson { source_name: name.to_owned(), error })?;
        Self::from_value_in(name, root, default)
    }

    /// Validates an already parsed document (2020-12 when it has no `$schema`).
    pub fn from_value(name: &str, root: Value) -> Result<Self, InputError> {
        Self::from_value_in(name, root, Dialect::Draft2020)
    }

    /// [`SchemaDoc::from_value`], reading a document without `$schema` in `default`.
    pub fn from_value_in(name: &str, root: Value, default: Dialect) -> Result<Self, InputError> {
        let writer = root.get("x-outbox").and_then(|x| x.get("writer")).cloned();
        let original = root.clone();
        let (dialect, root) = canonical_in(&root, default).map_err(|refused| InputError::NotASchema {
            source_name: name.to_owned(),
            pointer: refused.pointer,
            reason: refused.reason,
        })?;
        let mut doc = SchemaDoc { name: name.to_owned(), root, dialect, original, writer: None };
        doc.validate(&doc.root, &mut String::new())?;
        if let Some(writer) = writer {
            let writer = SchemaDoc::from_value_in(&format!("{name} (x-outbox.writer)"), writer, default)?;
            doc.writer = Some(Box::new(writer));
        }
        Ok(doc)
    }

    /// The schema of what a writer writes: `x-outbox.writer` when the document carries
    /// one (see [`crate::schema::document()`]), else the document itself.
    pub fn writer(&self) -> &SchemaDoc {
        self.writer.as_deref().unwrap_or(self)
    }

    /// The name errors and reports use (usually the file path).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The dialect its `$schema` names (when it names none, the default it was read in:
    /// 2020-12 unless told otherwise).
    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The document, rewritten into the 2020-12 vocabulary when its dialect is another
    /// (draft-04's boolean `exclusiveMinimum`, an `items` tuple, `dependencies`, ...), with
    /// the same meaning.
    pub fn root(&self) -> &Value {
        &self.root
    }

    /// The document as it was given, in its own dialect.
    pub(crate) fn original(&self) -> &Value {
        &self.original
    }

    /// The document as schema registries read it (Confluent's, and its serializers'
    /// validators): one without `$schema` is draft-07 there, where it is 2020-12 here.
    /// One that is not a draft-07 schema (a `$ref` only 2020-12 resolves) stays as read.
    pub(crate) fn as_registries_read(&self) -> std::borrow::Cow<'_, SchemaDoc> {
        match &self.original {
            Value::Object(map) if !map.contains_key("$schema") && self.dialect != Dialect::Draft7 => {
                match SchemaDoc::from_value_in(&self.name, self.original.clone(), Dialect::Draft7) {
                    Ok(doc) => std::borrow::Cow::Owned(doc),
                    Err(_) => std::borrow::Cow::Borrowed(self),
                }
            }
            _ => std::borrow::Cow::Borrowed(self),
        }
    }

    /// Follows a local `$ref` (`#`, `#/$defs/X`, `#/definitions/X`, any JSON pointer).
    pub(crate) fn resolve(&self, reference: &str) -> Option<&Value> {
        let pointer = reference.strip_prefix('#')?;
        if pointer.is_empty() {
            return Some(&self.root);
        }
        self.root.pointer(&percent_decode(pointer))
    }

    fn not_a_schema(&self, pointer: &str, reason: impl Into<String>) -> InputError {
        InputError::NotASchema {
            source_name: self.name.clone(),
            pointer: pointer.to_owned(),
            reason: reason.into(),
        }
    }

    fn validate(&self, node: &Value, pointer: &mut String) -> Result<(), InputError> {
        let obj = match node {
            Value::Bool(_) => return Ok(()),
            Value::Object(obj) => obj,
            other => {
                return Err(self.not_a_schema(
                    pointer,
                    format!("a schema is an object or a boolean, found {}", kind(other)),
                ))
            }
        };
        for (key, value) in obj {
            let len = pointer.len();
            pointer.push('/');
            pointer.push_str(&escape(key));
            match key.as_str() {
                "$ref" => {
                    let Value::String(reference) = value else {
                        return Err(self.not_a_schema(pointer, "$ref must be a string"));
                    };
                    if self.resolve(reference).is_none() {
                        return Err(InputError::UnresolvableRef {
                            source_name: self.name.clone(),
                            pointer: pointer.clone(),
                            reference: reference.clone(),
                        });
                    }
                }
                "type" => {
                    let ok = match value {
                        Value::String(t) => TYPE_NAMES.contains(&t.as_str()),
                        // Non-empty and without repeats, as every dialect's meta-schema says.
                        Value::Array(ts) => {
                            !ts.is_empty()
                                && ts.iter().all(|t| t.as_str().is_some_and(|t| TYPE_NAMES.contains(&t)))
                                && ts.iter().enumerate().all(|(i, t)| !ts[..i].contains(t))
                        }
                        _ => false,
                    };
                    if !ok {
                        return Err(self.not_a_schema(
                            pointer,
                            format!("type must be one of {TYPE_NAMES:?} or a non-empty array of them without repeats, found {value}"),
                        ));
                    }
                }
                "required" if !value.as_array().is_some_and(|names| names.iter().all(Value::is_string)) => {
                    return Err(self.not_a_schema(pointer, "required must be an array of property names"));
                }
                "enum" if !value.is_array() => {
                    return Err(self.not_a_schema(pointer, "enum must be an array"));
                }
                "items" => match value {
                    // Draft 7 tuples: an array of schemas.
                    Value::Array(items) => self
                        .validate_each(items.iter().enumerate().map(|(i, v)| (i.to_string(), v)), pointer)?,
                    other => self.validate(other, pointer)?,
                },
                k if SCHEMA_KEYWORDS.contains(&k) => self.validate(value, pointer)?,
                k if SCHEMA_ARRAY_KEYWORDS.contains(&k) => {
                    let Value::Array(items) = value else {
                        return Err(self.not_a_schema(pointer, format!("{k} must be an array of schemas")));
                    };
                    self.validate_each(items.iter().enumerate().map(|(i, v)| (i.to_string(), v)), pointer)?;
                }
                "patternProperties" if value.is_object() => {
                    let map = value.as_object().into_iter().flatten();
                    if let Some((pattern, error)) =
                        map.clone().find_map(|(p, _)| ecma_regex(p).err().map(|e| (p, e)))
                    {
                        return Err(self.not_a_schema(
                            pointer,
                            format!(
                                "property pattern {pattern:?} is not an ECMA-262 regular expression: {error}"
                            ),
                        ));
                    }
                    self.validate_each(map.map(|(k, v)| (escape(k), v)), pointer)?;
                }
                k if SCHEMA_MAP_KEYWORDS.contains(&k) => {
                    let Value::Object(map) = value else {
                        return Err(self.not_a_schema(pointer, format!("{k} must be an object of schemas")));
                    };
                    self.validate_each(map.iter().map(|(k, v)| (escape(k), v)), pointer)?;
                }
                "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum" | "multipleOf"
                    if !value.is_number() =>
                {
                    return Err(self.not_a_schema(pointer, format!("{key} must be a number")));
                }
                "minLength" | "maxLength" | "minItems" | "maxItems" | "minProperties" | "maxProperties"
                    if value.as_u64().is_none() =>
                {
                    return Err(self.not_a_schema(pointer, format!("{key} must be a non-negative integer")));
                }
                "format" if !value.is_string() => {
                    return Err(self.not_a_schema(pointer, format!("{key} must be a string")));
                }
                "pattern" => {
                    let Value::String(pattern) = value else {
                        return Err(self.not_a_schema(pointer, "pattern must be a string"));
                    };
                    if let Err(error) = ecma_regex(pattern) {
                        return Err(self.not_a_schema(
                            pointer,
                            format!("pattern {pattern:?} is not an ECMA-262 regular expression: {error}"),
                        ));
                    }
                }
                "dependentRequired"
                    if !value.as_object().is_some_and(|m| {
                        m.values()
                            .all(|names| names.as_array().is_some_and(|n| n.iter().all(Value::is_string)))
                    }) =>
                {
                    return Err(self.not_a_schema(
                        pointer,
                        "dependentRequired must map property names to arrays of property names",
                    ));
                }
                "uniqueItems" if !value.is_boolean() => {
                    return Err(self.not_a_schema(pointer, "uniqueItems must be a boolean"));
                }
                "minContains" | "maxContains" if value.as_u64().is_none() => {
                    return Err(self.not_a_schema(pointer, format!("{key} must be a non-negative integer")));
                }
                _ => {}
            }
            pointer.truncate(len);
        }
        Ok(())
    }

    fn validate_each<'v>(
        &self,
        items: impl Iterator<Item = (String, &'v Value)>,
        pointer: &mut String,
    ) -> Result<(), InputError> {
        for (segment, value) in items {
            let len = pointer.len();
            pointer.push('/');
            pointer.push_str(&segment);
            self.validate(value, pointer)?;
            pointer.truncate(len);
        }
        Ok(())
    }
}

/// `pattern` compiled as JSON Schema reads it: an ECMA-262 regular expression, unanchored.
pub(crate) fn ecma_regex(pattern: &str) -> Result<regress::Regex, regress::Error> {
    regress::Regex::with_flags(pattern, "u")
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// JSON pointer escaping of one segment.
fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}
