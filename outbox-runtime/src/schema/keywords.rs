//! JSON Schema keywords by what their values are, shared by validation, normalisation and
//! the compatibility checker.

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

/// Whether `key` only annotates (or is an extension, `x-...`).
pub(super) fn is_annotation(key: &str) -> bool {
    ANNOTATIONS.contains(&key) || key.starts_with("x-")
}

/// Keywords whose value is one schema.
pub(super) const SCHEMA_KEYWORDS: &[&str] = &[
    "additionalProperties",
    "unevaluatedProperties",
    "additionalItems",
    "unevaluatedItems",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
];
/// Keywords whose value is an array of schemas.
pub(super) const SCHEMA_ARRAY_KEYWORDS: &[&str] = &["allOf", "anyOf", "oneOf", "prefixItems"];
/// Keywords whose value is an object of schemas.
pub(super) const SCHEMA_MAP_KEYWORDS: &[&str] =
    &["properties", "patternProperties", "$defs", "definitions", "dependentSchemas"];
