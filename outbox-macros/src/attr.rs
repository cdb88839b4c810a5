//! Parsing of `#[outbox(...)]` attributes on the struct and on its fields.
//!
//! Parsing never stops at the first problem: each one is recorded in the [`Ctxt`] at the
//! tokens it concerns and parsing goes on with the next key.

use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::meta::ParseNestedMeta;
use syn::{Attribute, Expr, ExprLit, ExprUnary, Lit, LitStr, Token, UnOp};

use crate::ctxt::Ctxt;

/// Keys that belong on the struct.
const CONTAINER_KEYS: &[&str] = &["event_type", "schema_version", "aggregate", "topic", "crate"];
/// Keys that belong on a field.
const FIELD_KEYS: &[&str] = &["aggregate_id"];

/// Attributes found on the struct itself.
#[derive(Default)]
pub(crate) struct Container {
    pub(crate) event_type: Option<LitStr>,
    pub(crate) schema_version: Option<u32>,
    pub(crate) aggregate: Option<LitStr>,
    pub(crate) topic: Option<LitStr>,
    pub(crate) krate: Option<syn::Path>,
    /// The first `#[outbox]` attribute, where "missing key" errors point.
    pub(crate) first_attr: Option<TokenStream>,
    /// Every key written on the struct, valid or not.
    pub(crate) seen: Vec<String>,
}

/// Attributes found on one field.
#[derive(Default)]
pub(crate) struct Field {
    /// The `aggregate_id` key, when present, for error spans.
    pub(crate) aggregate_id: Option<TokenStream>,
}

fn key_of(meta: &ParseNestedMeta<'_>) -> String {
    meta.path
        .get_ident()
        .map(ToString::to_string)
        .unwrap_or_else(|| meta.path.to_token_stream().to_string().replace(' ', ""))
}

/// Consumes `= value` or `(...)` after a key that is being rejected, so parsing can go on.
fn skip_value(meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
    if meta.input.peek(Token![=]) {
        meta.value()?.parse::<Expr>()?;
    } else if meta.input.peek(syn::token::Paren) {
        meta.parse_nested_meta(|inner| skip_value(&inner))?;
    }
    Ok(())
}

/// Parses `= <expr>` after `key`, or records that the value is missing.
fn value_of(
    cx: &mut Ctxt,
    meta: &ParseNestedMeta<'_>,
    key: &str,
    example: &str,
) -> syn::Result<Option<Expr>> {
    if !meta.input.peek(Token![=]) {
        cx.error_spanned_by(&meta.path, format!("outbox attribute `{key}` needs a value, e.g. `{example}`"));
        skip_value(meta)?;
        return Ok(None);
    }
    Ok(Some(meta.value()?.parse::<Expr>()?))
}

fn string_lit(cx: &mut Ctxt, expr: Expr, key: &str, example: &str) -> Option<LitStr> {
    match expr {
        Expr::Lit(ExprLit { lit: Lit::Str(lit), .. }) => Some(lit),
        other => {
            cx.error_spanned_by(
                other,
                format!("outbox attribute `{key}` must be a string literal, e.g. `{example}`"),
            );
            None
        }
    }
}

fn version_lit(cx: &mut Ctxt, expr: Expr) -> Option<u32> {
    const HINT: &str = "e.g. `schema_version = 1`";
    match expr {
        Expr::Lit(ExprLit { lit: Lit::Int(lit), .. }) => {
            if !matches!(lit.suffix(), "" | "u32") {
                cx.error_spanned_by(
                    &lit,
                    format!("`schema_version` must be an unsuffixed integer literal, {HINT}"),
                );
                return None;
            }
            match lit.base10_parse::<u32>() {
                Ok(0) => {
                    cx.error_spanned_by(
                        &lit,
                        "`schema_version` must be a positive integer: versions start at 1",
                    );
                    None
                }
                Ok(value) => Some(value),
                Err(_) => {
                    cx.error_spanned_by(
                        &lit,
                        format!("`schema_version` must fit in a u32 (at most {})", u32::MAX),
                    );
                    None
                }
            }
        }
        Expr::Unary(ExprUnary { op: UnOp::Neg(_), .. }) => {
            cx.error_spanned_by(
                expr,
                "`schema_version` must be a positive integer, not a negative number: versions start at 1",
            );
            None
        }
        Expr::Lit(ExprLit { lit: Lit::Str(lit), .. }) => {
            cx.error_spanned_by(
                &lit,
                format!(
                    "`schema_version` must be an integer literal, not a string: write `schema_version = {}`",
                    lit.value()
                ),
            );
            None
        }
        other => {
            cx.error_spanned_by(
                other,
                format!("`schema_version` must be a positive integer literal, {HINT}"),
            );
            None
        }
    }
}

fn outbox_attrs(attrs: &[Attribute]) -> impl Iterator<Item = &Attribute> {
    attrs.iter().filter(|attr| attr.path().is_ident("outbox"))
}

/// Parses every `#[outbox(...)]` on the struct.
pub(crate) fn container(cx: &mut Ctxt, attrs: &[Attribute]) -> Container {
    let mut out = Container::default();
    // Duplicates are judged by key, even when the first value was rejected.
    let mut seen: Vec<String> = Vec::new();
    for attr in outbox_attrs(attrs) {
        out.first_attr.get_or_insert_with(|| attr.to_token_stream());
        let result = attr.parse_nested_meta(|meta| {
            let key = key_of(&meta);
            if CONTAINER_KEYS.contains(&key.as_str()) && seen.contains(&key) {
                cx.error_spanned_by(&meta.path, format!("duplicate outbox attribute `{key}`"));
                return skip_value(&meta);
            }
            seen.push(key.clone());
            match key.as_str() {
                "event_type" => {
                    const EX: &str = r#"event_type = "order.confirmed""#;
                    let v = value_of(cx, &meta, &key, EX)?.and_then(|e| string_lit(cx, e, &key, EX));
                    out.event_type = v;
                }
                "schema_version" => {
                    let v = value_of(cx, &meta, &key, "schema_version = 1")?.and_then(|e| version_lit(cx, e));
                    out.schema_version = v;
                }
                "aggregate" => {
                    const EX: &str = r#"aggregate = "order""#;
                    let v = value_of(cx, &meta, &key, EX)?.and_then(|e| string_lit(cx, e, &key, EX));
                    out.aggregate = v;
                }
                "topic" => {
                    const EX: &str = r#"topic = "orders""#;
                    let v = value_of(cx, &meta, &key, EX)?.and_then(|e| string_lit(cx, e, &key, EX));
                    out.topic = v;
                }
                "crate" => {
                    const EX: &str = r#"crate = "my_reexport::outbox_runtime""#;
                    let v = value_of(cx, &meta, &key, EX)?.and_then(|e| string_lit(cx, e, &key, EX));
                    let path = v.and_then(|lit| match lit.parse::<syn::Path>() {
                        Ok(path) => Some(path),
                        Err(_) => {
                            cx.error_spanned_by(&lit, "outbox attribute `crate` must be a path, e.g. `crate = \"outbox_runtime\"`");
                            None
                        }
                    });
                    out.krate = path;
                }
                k if FIELD_KEYS.contains(&k) => {
                    cx.error_spanned_by(&meta.path, format!("outbox attribute `{k}` belongs on a field, not on the struct: mark the field with `#[outbox({k})]`"));
                    skip_value(&meta)?;
                }
                _ => {
                    cx.error_spanned_by(&meta.path, unknown_key(&key, CONTAINER_KEYS));
                    skip_value(&meta)?;
                }
            }
            Ok(())
        });
        if let Err(err) = result {
            cx.syn_error(err);
        }
    }
    out.seen = seen;
    out
}

/// Parses every `#[outbox(...)]` on one field.
pub(crate) fn field(cx: &mut Ctxt, attrs: &[Attribute]) -> Field {
    let mut out = Field::default();
    for attr in outbox_attrs(attrs) {
        let result = attr.parse_nested_meta(|meta| {
            let key = key_of(&meta);
            match key.as_str() {
                "aggregate_id" => {
                    if meta.input.peek(Token![=]) || meta.input.peek(syn::token::Paren) {
                        cx.error_spanned_by(
                            &meta.path,
                            "outbox attribute `aggregate_id` takes no value: write `#[outbox(aggregate_id)]`",
                        );
                        skip_value(&meta)?;
                    }
                    if out.aggregate_id.is_some() {
                        cx.error_spanned_by(&meta.path, "duplicate outbox attribute `aggregate_id`");
                    } else {
                        out.aggregate_id = Some(meta.path.to_token_stream());
                    }
                }
                k if CONTAINER_KEYS.contains(&k) => {
                    cx.error_spanned_by(
                        &meta.path,
                        format!("outbox attribute `{k}` belongs on the struct, not on a field"),
                    );
                    skip_value(&meta)?;
                }
                _ => {
                    cx.error_spanned_by(&meta.path, unknown_key(&key, FIELD_KEYS));
                    skip_value(&meta)?;
                }
            }
            Ok(())
        });
        if let Err(err) = result {
            cx.syn_error(err);
        }
    }
    out
}

/// "unknown outbox attribute `even_type`; did you mean `event_type`?", or the keys that
/// belong where it was written when none is close.
fn unknown_key(key: &str, keys: &[&str]) -> String {
    let closest =
        keys.iter().map(|k| (edit_distance(key, k), *k)).filter(|(d, k)| *d <= (k.len() / 3).max(1)).min();
    match closest {
        Some((_, k)) => format!("unknown outbox attribute `{key}`; did you mean `{k}`?"),
        None => {
            let list: Vec<String> = keys.iter().map(|k| format!("`{k}`")).collect();
            format!("unknown outbox attribute `{key}`; expected {}", list.join(", "))
        }
    }
}

/// Levenshtein distance, by characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (row[j + 1] + 1).min(row[j] + 1).min(diagonal + usize::from(ca != *cb));
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typo_is_answered_with_the_closest_key() {
        assert_eq!(edit_distance("even_type", "event_type"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("topic", "topic"), 0);
        assert_eq!(
            unknown_key("even_type", CONTAINER_KEYS),
            "unknown outbox attribute `even_type`; did you mean `event_type`?"
        );
        assert_eq!(
            unknown_key("schema_verison", CONTAINER_KEYS),
            "unknown outbox attribute `schema_verison`; did you mean `schema_version`?"
        );
        assert_eq!(
            unknown_key("aggregate_di", FIELD_KEYS),
            "unknown outbox attribute `aggregate_di`; did you mean `aggregate_id`?"
        );
        assert_eq!(
            unknown_key("colour", CONTAINER_KEYS),
            "unknown outbox attribute `colour`; expected `event_type`, `schema_version`, `aggregate`, `topic`, `crate`"
        );
        // One letter off a three-letter key is a suggestion; a different word is not.
        assert!(unknown_key("topix", CONTAINER_KEYS).ends_with("did you mean `topic`?"));
        assert!(!unknown_key("key", FIELD_KEYS).contains("did you mean"));
    }
}
