//! Rules that need the whole item: required keys, exactly one aggregate id, value formats.

use quote::ToTokens;
use syn::LitStr;

use crate::ast::Input;
use crate::ctxt::Ctxt;

/// Checks `input` and records every rule it breaks.
pub(crate) fn check(cx: &mut Ctxt, input: &Input<'_>) {
    check_required(cx, input);
    check_aggregate_id(cx, input);
    if let Some(lit) = &input.attrs.event_type {
        if !is_dotted_words(&lit.value()) {
            cx.error_spanned_by(lit, format!(
                "`event_type` must be lowercase dotted words like \"order.confirmed\" (each word starts with a-z and holds only a-z, 0-9, _), found {:?}",
                lit.value()
            ));
        }
    }
    if let Some(lit) = &input.attrs.aggregate {
        if !is_dotted_words(&lit.value()) {
            cx.error_spanned_by(lit, format!(
                "`aggregate` must be lowercase words like \"order\" or \"billing.invoice\" (a-z, 0-9, _ and dots), found {:?}",
                lit.value()
            ));
        }
    }
    if let Some(lit) = &input.attrs.topic {
        check_topic(cx, lit);
    }
}

fn check_required(cx: &mut Ctxt, input: &Input<'_>) {
    let attrs = &input.attrs;
    let missing: Vec<&str> = [
        ("event_type", attrs.event_type.is_none()),
        ("schema_version", attrs.schema_version.is_none()),
        ("aggregate", attrs.aggregate.is_none()),
        ("topic", attrs.topic.is_none()),
    ]
    .into_iter()
    .filter_map(|(key, missing)| missing.then_some(key))
    .collect();
    if missing.is_empty() {
        return;
    }
    match &attrs.first_attr {
        // Keys that were given but rejected are reported where they stand; only keys
        // that do not appear at all are "missing".
        Some(attr) => {
            for key in missing.into_iter().filter(|key| !attrs.seen.iter().any(|seen| seen == key)) {
                cx.error_spanned_by(attr, format!("missing outbox attribute `{key}`"));
            }
        }
        None => cx.error_spanned_by(
            input.ident,
            "missing `#[outbox(event_type = \"...\", schema_version = N, aggregate = \"...\", topic = \"...\")]` on the struct",
        ),
    }
}

fn check_aggregate_id(cx: &mut Ctxt, input: &Input<'_>) {
    if !input.shape_ok {
        return;
    }
    match input.marked.as_slice() {
        [] => cx.error_spanned_by(
            input.ident,
            "missing `#[outbox(aggregate_id)]`: mark exactly one field as the aggregate id (it becomes the Kafka record key)",
        ),
        [_] => {}
        [(first, _), rest @ ..] => {
            let first_name = first.ident.as_ref().map(ToString::to_string).unwrap_or_default();
            for (_, key) in rest {
                cx.error_spanned_by(
                    key,
                    format!("only one field can be `#[outbox(aggregate_id)]`; `{first_name}` already is"),
                );
            }
        }
    }
}

/// `order`, `order.confirmed`, `billing.invoice_paid`: words of `[a-z][a-z0-9_]*` joined by dots.
fn is_dotted_words(s: &str) -> bool {
    !s.is_empty()
        && s.split('.').all(|word| {
            let mut chars = word.chars();
            matches!(chars.next(), Some('a'..='z')) && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '_'))
        })
}

/// Kafka's own rule: 1 to 249 characters of `[a-zA-Z0-9._-]`, not `.` or `..`.
fn check_topic(cx: &mut Ctxt, lit: &LitStr) {
    let topic = lit.value();
    let valid_chars = topic.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if topic.is_empty() || topic.len() > 249 || !valid_chars || topic == "." || topic == ".." {
        cx.error_spanned_by(
            lit.to_token_stream(),
            format!("`topic` must be a valid Kafka topic name (1 to 249 characters of a-z, A-Z, 0-9, '.', '_', '-'; not \".\" or \"..\"), found {topic:?}"),
        );
    }
}
