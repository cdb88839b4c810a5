//! W3C Trace Context from the appending request to the consumer's handler.
//!
//! With feature `opentelemetry`, an append records the current span's context (the
//! `tracing` span's, through `tracing-opentelemetry`, else OpenTelemetry's current context)
//! as the event's `traceparent` and `tracestate` headers, unless the caller set them. They
//! are stored with the row and the relay sends them as Kafka headers like any other. The
//! inbox reads them (`traceparent`, or the CloudEvents tracing extension's
//! `ce_traceparent`) and makes the handler's span (`inbox_handle`) a child of that
//! context; a duplicate, whose handler does not run, gets a span (`inbox_duplicate`) with a
//! link to it instead.
//!
//! The format is W3C's whatever global propagator the service installed: the headers are
//! the outbox's wire format, read by consumers in other languages. A header that is not a
//! valid `traceparent` is ignored (the event is applied, untraced), never an error.
//!
//! Without the feature the handler and duplicate spans are plain `tracing` spans.

use std::collections::BTreeMap;

use tracing::Span;

/// The W3C header of the trace and the parent span.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C header of vendor-specific trace state.
pub const TRACESTATE: &str = "tracestate";

/// Makes `span` (not yet entered) a child of the trace context in a record's `headers`,
/// when they carry one.
pub(crate) fn follow(span: &Span, headers: &BTreeMap<String, String>) {
    #[cfg(feature = "opentelemetry")]
    if let Some(remote) = otel::remote(headers) {
        use opentelemetry::trace::TraceContextExt as _;
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;
        // Fails without an OpenTelemetry layer (nothing to parent) or when a filter
        // disabled the span: the handler's spans then stay in the inbox's own trace.
        let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
    }
    #[cfg(not(feature = "opentelemetry"))]
    let _ = (span, headers);
}

/// Links `span` to the trace context in a record's `headers`, when they carry one.
pub(crate) fn link(span: &Span, headers: &BTreeMap<String, String>) {
    #[cfg(feature = "opentelemetry")]
    if let Some(remote) = otel::remote(headers) {
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;
        span.add_link(remote);
    }
    #[cfg(not(feature = "opentelemetry"))]
    let _ = (span, headers);
}

#[cfg(feature = "opentelemetry")]
pub(crate) use otel::capture;

#[cfg(feature = "opentelemetry")]
mod otel {
    use std::collections::BTreeMap;
    use std::str::FromStr as _;

    use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState};
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;

    use super::{TRACEPARENT, TRACESTATE};

    /// Adds the current span's context to `headers`, unless they already carry one or
    /// there is no valid current context.
    pub(crate) fn capture(headers: &mut BTreeMap<String, String>) {
        // The caller's own context, or a part of one, is never mixed with ours.
        if headers.keys().any(|k| k.eq_ignore_ascii_case(TRACEPARENT) || k.eq_ignore_ascii_case(TRACESTATE)) {
            return;
        }
        // OpenTelemetry's current context first: the innermost span, whether the API
        // opened it or a tracing span entered it (context activation); the tracing span's
        // own context for a layer that does not activate.
        let mut cx = opentelemetry::Context::current();
        if !cx.span().span_context().is_valid() {
            cx = tracing::Span::current().context();
        }
        let span = cx.span();
        let context = span.span_context();
        if !context.is_valid() {
            return;
        }
        headers.insert(TRACEPARENT.to_owned(), traceparent(context));
        let state = context.trace_state().header();
        if !state.is_empty() {
            headers.insert(TRACESTATE.to_owned(), state);
        }
    }

    /// `00-{trace id}-{span id}-{flags}`; of the flags only `sampled` is defined (level 1).
    pub(crate) fn traceparent(context: &SpanContext) -> String {
        let flags = context.trace_flags() & TraceFlags::SAMPLED;
        format!("00-{}-{}-{:02x}", context.trace_id(), context.span_id(), flags.to_u8())
    }

    /// The remote context of a record: `traceparent` (else `ce_traceparent`) and its
    /// `tracestate`.
    pub(crate) fn remote(headers: &BTreeMap<String, String>) -> Option<SpanContext> {
        let (parent, state) = match headers.get(TRACEPARENT) {
            Some(parent) => (parent, headers.get(TRACESTATE)),
            None => (headers.get("ce_traceparent")?, headers.get("ce_tracestate")),
        };
        parse(parent, state.map(String::as_str))
    }

    /// A `traceparent` as W3C Trace Context (level 1) reads it: version 00 has exactly four
    /// fields; a later version at least four, of which the first four are read; version
    /// `ff`, upper-case hex, and all-zero ids are invalid. A `tracestate` that does not
    /// parse is dropped, the parent kept.
    pub(crate) fn parse(parent: &str, state: Option<&str>) -> Option<SpanContext> {
        let fields: Vec<&str> = parent.trim().split('-').collect();
        let [version, trace_id, span_id, flags, rest @ ..] = fields.as_slice() else { return None };
        let hex =
            |s: &str, len: usize| s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if !hex(version, 2) || *version == "ff" || (*version == "00" && !rest.is_empty()) {
            return None;
        }
        if !hex(trace_id, 32) || !hex(span_id, 16) || !hex(flags, 2) {
            return None;
        }
        let trace_id = TraceId::from_hex(trace_id).ok().filter(|t| *t != TraceId::INVALID)?;
        let span_id = SpanId::from_hex(span_id).ok().filter(|s| *s != SpanId::INVALID)?;
        let flags = u8::from_str_radix(flags, 16).ok()?;
        let state = state.and_then(|s| TraceState::from_str(s).ok()).unwrap_or_default();
        // Only the sampled bit is defined; the others must be zeroed (W3C, level 1).
        Some(SpanContext::new(trace_id, span_id, TraceFlags::new(flags) & TraceFlags::SAMPLED, true, state))
    }

    #[cfg(test)]
    mod tests {
        use super::{parse, traceparent};

        #[test]
        fn a_valid_traceparent_round_trips() {
            let header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
            let context = parse(header, Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")).expect("valid");
            assert_eq!(traceparent(&context), header);
            assert!(context.is_sampled() && context.is_remote());
            assert_eq!(context.trace_state().get("congo"), Some("t61rcWkgMzE"));
            let reserved =
                parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff", None).expect("valid");
            assert_eq!(traceparent(&reserved), header, "flags other than sampled are zeroed");
            let later = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next";
            assert!(parse(later, None).is_some(), "a later version's extra fields are skipped");
            let bad_state = parse(header, Some("not a tracestate,,=")).expect("the parent is kept");
            assert_eq!(bad_state.trace_state().header(), "");
        }

        #[test]
        fn anything_else_is_no_context_and_never_a_panic() {
            let bad = [
                "",
                "-",
                "00",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
                "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
                "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "00-4bf92f3577b34da6a3ce929d0e0e47é6-00f067aa0ba902b7-01",
            ];
            for header in bad {
                assert!(parse(header, None).is_none(), "{header:?} must not parse");
            }
            // Seeded: arbitrary text never panics, and what parses prints back as sent.
            let seed = std::env::var("TRACE_SEED")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| fastrand::u64(..));
            println!("TRACE_SEED={seed}");
            let mut rng = fastrand::Rng::with_seed(seed);
            let alphabet: Vec<char> = "0123456789abcdefABCDEF-x é\u{0}".chars().collect();
            let valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
            for _ in 0..20_000 {
                let mut text: Vec<char> = valid.chars().collect();
                for _ in 0..rng.usize(0..4) {
                    match rng.u8(0..3) {
                        0 if !text.is_empty() => {
                            let at = rng.usize(0..text.len());
                            text[at] = alphabet[rng.usize(0..alphabet.len())];
                        }
                        1 if !text.is_empty() => {
                            text.remove(rng.usize(0..text.len()));
                        }
                        _ => text.insert(rng.usize(0..=text.len()), alphabet[rng.usize(0..alphabet.len())]),
                    }
                }
                let text: String = text.into_iter().collect();
                if let Some(context) = parse(&text, Some(&text)) {
                    // The ids as sent, the sampled flag kept and the others zeroed (a
                    // later version prints as 00).
                    let sent = text.trim();
                    let printed = traceparent(&context);
                    assert_eq!(sent.get(3..52), printed.get(3..52), "{text:?}, seed {seed}");
                    let flags =
                        sent.get(53..55).and_then(|f| u8::from_str_radix(f, 16).ok()).expect("parsed");
                    let expected = format!("{:02x}", flags & 1);
                    assert_eq!(printed.get(53..), Some(expected.as_str()), "{text:?}, seed {seed}");
                }
            }
        }
    }
}
