//! The derive input as the expansion sees it: a named-field struct with parsed attributes.

use syn::{Data, DeriveInput, Fields, Ident, Member};

use crate::attr;
use crate::ctxt::Ctxt;

/// What `#[derive(OutboxEvent)]` was applied to, after parsing.
pub(crate) struct Input<'a> {
    pub(crate) ident: &'a Ident,
    pub(crate) attrs: attr::Container,
    /// The field marked `#[outbox(aggregate_id)]`, when exactly one is.
    pub(crate) aggregate_id: Option<AggregateId<'a>>,
    /// The fields marked `#[outbox(aggregate_id)]`, with the attribute key for spans.
    pub(crate) marked: Vec<(&'a syn::Field, proc_macro2::TokenStream)>,
    /// Whether the shape (named-field struct without generics) is supported.
    pub(crate) shape_ok: bool,
}

/// The field that identifies the aggregate.
pub(crate) struct AggregateId<'a> {
    pub(crate) member: Member,
    pub(crate) ty: &'a syn::Type,
}

impl<'a> Input<'a> {
    /// Parses `input`, recording every problem in `cx`.
    pub(crate) fn from_syn(cx: &mut Ctxt, input: &'a DeriveInput) -> Self {
        let attrs = attr::container(cx, &input.attrs);
        let mut shape_ok = true;
        let fields = match &input.data {
            Data::Struct(data) => match &data.fields {
                Fields::Named(named) => Some(named),
                Fields::Unnamed(unnamed) => {
                    cx.error_spanned_by(unnamed, "#[derive(OutboxEvent)] is not supported on a tuple struct: name the fields, so one can be marked `#[outbox(aggregate_id)]` and each has a key in the JSON payload");
                    None
                }
                Fields::Unit => {
                    cx.error_spanned_by(&input.ident, "#[derive(OutboxEvent)] is not supported on a unit struct: an event needs named fields, one of them marked `#[outbox(aggregate_id)]`");
                    None
                }
            },
            Data::Enum(data) => {
                cx.error_spanned_by(data.enum_token, "#[derive(OutboxEvent)] is not supported on an enum: derive it on one struct per event type (each with its own event_type)");
                None
            }
            Data::Union(data) => {
                cx.error_spanned_by(data.union_token, "#[derive(OutboxEvent)] is not supported on a union: derive it on a struct with named fields");
                None
            }
        };
        if fields.is_none() {
            shape_ok = false;
        }
        if !input.generics.params.is_empty() || input.generics.where_clause.is_some() {
            cx.error_spanned_by(&input.generics, "#[derive(OutboxEvent)] is not supported on a generic struct: an event is one concrete type with one registered schema");
            shape_ok = false;
        }

        let mut marked = Vec::new();
        for field in fields.into_iter().flat_map(|named| named.named.iter()) {
            if let Some(key) = attr::field(cx, &field.attrs).aggregate_id {
                marked.push((field, key));
            }
        }
        let aggregate_id = match marked.as_slice() {
            [(field, _)] => {
                field.ident.clone().map(|ident| AggregateId { member: Member::Named(ident), ty: &field.ty })
            }
            _ => None,
        };
        Input { ident: &input.ident, attrs, aggregate_id, marked, shape_ok }
    }
}
