//! The spans of a record's handling, tied to the trace it was appended in (see
//! [`crate::trace`]).

use tracing::Span;

use super::message::Incoming;
use super::Meta;
use crate::trace;

/// The span a handler runs in: a child of the record's trace context, when it has one.
pub(crate) fn handling(consumer: &str, msg: &Incoming, meta: &Meta) -> Span {
    let span = tracing::info_span!("inbox_handle", consumer, event_id = %meta.event_id,
        event_type = %meta.event_type, aggregate_id = meta.aggregate_id.as_deref().unwrap_or(""),
        topic = %msg.topic, partition = msg.partition, offset = msg.offset);
    trace::follow(&span, &msg.headers);
    span
}

/// A record that was a duplicate, whose handler did not run: a span of its own, linked to
/// the record's trace context.
pub(crate) fn duplicate(consumer: &str, msg: &Incoming, meta: &Meta) {
    let span = tracing::info_span!("inbox_duplicate", consumer, event_id = %meta.event_id,
        event_type = %meta.event_type, aggregate_id = meta.aggregate_id.as_deref().unwrap_or(""),
        topic = %msg.topic, partition = msg.partition, offset = msg.offset);
    trace::link(&span, &msg.headers);
}
