//! Code generation. Everything generated reaches the runtime through absolute paths and its
//! `#[doc(hidden)] __private` module, inside `const _: () = { ... };`.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::DeriveInput;

use crate::ast::Input;
use crate::ctxt::Ctxt;
use crate::valid;

/// Expands the derive, or returns the collected errors plus a stub impl so one mistake
/// does not cascade into errors wherever the event is used.
pub(crate) fn derive(input: &DeriveInput) -> TokenStream {
    let mut cx = Ctxt::default();
    let parsed = Input::from_syn(&mut cx, input);
    valid::check(&mut cx, &parsed);
    match (cx.check(), expand(&parsed)) {
        (Ok(()), Some(tokens)) => tokens,
        (Ok(()), None) => fallback(&parsed),
        (Err(err), _) => {
            let mut tokens = err.into_compile_error();
            tokens.extend(fallback(&parsed));
            tokens
        }
    }
}

fn runtime_path(input: &Input<'_>) -> TokenStream {
    match &input.attrs.krate {
        Some(path) => quote!(#path),
        None => quote!(::outbox_runtime),
    }
}

fn expand(input: &Input<'_>) -> Option<TokenStream> {
    let attrs = &input.attrs;
    let event_type = attrs.event_type.as_ref()?;
    let version = attrs.schema_version?;
    let aggregate = attrs.aggregate.as_ref()?;
    let topic = attrs.topic.as_ref()?;
    let aggregate_id = input.aggregate_id.as_ref()?;
    let ident = input.ident;
    let ident_str = ident.to_string();
    let rt = runtime_path(input);
    let member = &aggregate_id.member;
    // Spanned at the field's type, so "doesn't implement Display" points at it.
    let id_expr = quote_spanned! {aggregate_id.ty.span()=>
        #rt::__private::aggregate_id_string(&self.#member)
    };
    Some(quote! {
        #[doc(hidden)]
        #[allow(non_upper_case_globals, unused_qualifications, clippy::all)]
        const _: () = {
            #[automatically_derived]
            impl #rt::OutboxEvent for #ident {
                const EVENT_TYPE: &'static str = #event_type;
                const SCHEMA_VERSION: u32 = #version;
                const AGGREGATE_TYPE: &'static str = #aggregate;
                const TOPIC: &'static str = #topic;

                fn aggregate_id(&self) -> ::std::string::String {
                    #id_expr
                }
            }

            #rt::__private::inventory::submit! {
                #rt::__private::EventDescriptor::of::<#ident>(
                    ::core::concat!(::core::module_path!(), "::", #ident_str)
                )
            }
        };
    })
}

/// A stub impl emitted beside the errors.
fn fallback(input: &Input<'_>) -> TokenStream {
    if !input.shape_ok {
        return TokenStream::new();
    }
    let ident = input.ident;
    let rt = runtime_path(input);
    quote! {
        #[doc(hidden)]
        const _: () = {
            #[automatically_derived]
            impl #rt::OutboxEvent for #ident {
                const EVENT_TYPE: &'static str = "";
                const SCHEMA_VERSION: u32 = 0;
                const AGGREGATE_TYPE: &'static str = "";
                const TOPIC: &'static str = "";

                fn aggregate_id(&self) -> ::std::string::String {
                    ::core::unreachable!("OutboxEvent derive failed to compile")
                }
            }
        };
    }
}
