//! Handlers: what the inbox calls, inside the message's transaction, with the decoded event.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::OutboxEvent;

/// A handler error's cause, kept for its chain (`std::error::Error::source`).
type Cause = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// Why a handler did not apply an event. Its cause, when given, stays reachable through
/// [`std::error::Error::source`], and its whole chain is what the inbox records as the
/// reason.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum HandlerError {
    /// May succeed later (a lock timeout, a service briefly away): the transaction rolls
    /// back and the same message is retried with backoff, keeping its place.
    Transient {
        /// What went wrong, for the log and the record.
        reason: String,
        /// The error that caused it, if any.
        source: Option<Cause>,
    },
    /// Will fail again (the event contradicts the consumer's state): the transaction rolls
    /// back, the message is parked with this reason, and later messages of its key are
    /// held behind it until an operator retries or discards it.
    Permanent {
        /// What went wrong, for the log and the record.
        reason: String,
        /// The error that caused it, if any.
        source: Option<Cause>,
    },
}

impl HandlerError {
    /// A transient error with `reason`.
    pub fn transient(reason: impl std::fmt::Display) -> Self {
        HandlerError::Transient { reason: reason.to_string(), source: None }
    }

    /// A permanent error with `reason`.
    pub fn permanent(reason: impl std::fmt::Display) -> Self {
        HandlerError::Permanent { reason: reason.to_string(), source: None }
    }

    /// A permanent error for an event this handler does not handle (a catch-all arm): its
    /// reason names the event's type, version and id, and nothing of its payload, so that it
    /// is safe to record, list and show. Prefer it to formatting the decoded event into a
    /// reason, which puts the payload's values (a customer's e-mail address) where
    /// operators read.
    pub fn unhandled(meta: &Meta) -> Self {
        HandlerError::permanent(format!(
            "not handled here: {} v{} (event {})",
            meta.event_type, meta.schema_version, meta.event_id
        ))
    }

    /// The same error with `cause` as its source: `HandlerError::transient("ledger
    /// busy").with_source(io_error)`. The recorded reason then carries the cause's chain.
    #[must_use]
    pub fn with_source(
        mut self,
        cause: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        let cause: Cause = Arc::from(cause.into());
        match &mut self {
            HandlerError::Transient { source, .. } | HandlerError::Permanent { source, .. } => {
                *source = Some(cause)
            }
        }
        self
    }

    /// Whether the inbox retries it (transient) rather than parking the message.
    pub fn is_transient(&self) -> bool {
        matches!(self, HandlerError::Transient { .. })
    }

    /// The reason followed by each cause in its source chain (`reason: cause: its
    /// cause`), a cause left out when the text before it already says it: what the inbox
    /// records and logs.
    pub fn reason_with_causes(&self) -> String {
        let (HandlerError::Transient { reason, .. } | HandlerError::Permanent { reason, .. }) = self;
        let mut text = reason.clone();
        let mut next = std::error::Error::source(self);
        while let Some(cause) = next {
            let said = cause.to_string();
            if !said.is_empty() && !text.contains(&said) {
                text.push_str(": ");
                text.push_str(&said);
            }
            next = cause.source();
        }
        text
    }
}

impl std::fmt::Display for HandlerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandlerError::Transient { reason, .. } => write!(f, "transient: {reason}"),
            HandlerError::Permanent { reason, .. } => write!(f, "permanent: {reason}"),
        }
    }
}

/// The source is the cause itself (not the `Arc` around it), so it downcasts to its type.
impl std::error::Error for HandlerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        let (HandlerError::Transient { source, .. } | HandlerError::Permanent { source, .. }) = self;
        source.as_deref().map(|cause| cause as &(dyn std::error::Error + 'static))
    }
}

/// Equal when of the same kind with the same reason (causes are not compared).
impl PartialEq for HandlerError {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (HandlerError::Transient { reason: a, .. }, HandlerError::Transient { reason: b, .. })
            | (HandlerError::Permanent { reason: a, .. }, HandlerError::Permanent { reason: b, .. }) => {
                a == b
            }
            _ => false,
        }
    }
}

impl Eq for HandlerError {}

/// Database errors in a handler are permanent when they repeat for the same input (SQLSTATE
/// classes 22 data exception, 23 integrity constraint violation, 54 program limit
/// exceeded), transient otherwise (a transient error is retried up to
/// [`InboxConfig::max_attempts`](super::InboxConfig::max_attempts) times, attempts being
/// counted only while the database answers). The sqlx error stays the source.
impl From<sqlx::Error> for HandlerError {
    fn from(error: sqlx::Error) -> Self {
        let permanent = super::failure::sqlx_is_permanent(&error);
        let reason = error.to_string();
        let source: Option<Cause> = Some(Arc::new(error));
        if permanent {
            HandlerError::Permanent { reason, source }
        } else {
            HandlerError::Transient { reason, source }
        }
    }
}

/// What the inbox knows about a message besides its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Meta {
    /// The event id the inbox deduplicates on: the CloudEvents `id` when it is a UUID (as
    /// the relay sends), else a UUIDv5 of `source` and `id`
    /// ([`event_id_of`](super::event_id_of)).
    pub event_id: Uuid,
    /// The CloudEvents `id`, as sent.
    pub id: String,
    /// The CloudEvents `source`.
    pub source: String,
    /// The CloudEvents `dataschema`, when sent.
    pub dataschema: Option<String>,
    /// Whether the record was a structured-mode CloudEvent (the whole event as JSON in the
    /// value) rather than binary mode (attributes in `ce_*` headers).
    pub structured: bool,
    /// `ce_type`.
    pub event_type: String,
    /// `ce_schemaversion`, or the version the `dataschema` names (`.../v2.json`).
    pub schema_version: u32,
    /// `ce_aggregatetype`, when present.
    pub aggregate_type: Option<String>,
    /// `ce_subject`, or the record key.
    pub aggregate_id: Option<String>,
    /// `ce_aggregateversion`, when present.
    pub aggregate_version: Option<i64>,
    /// `ce_time`, as sent.
    pub time: Option<String>,
    /// Where the message was read.
    pub topic: String,
    /// Kafka partition.
    pub partition: i32,
    /// Kafka offset.
    pub offset: i64,
    /// Every header, by name.
    pub headers: BTreeMap<String, String>,
    /// The schema a schema registry frame names (the value's `0x00` + id prefix, or its
    /// `__value_schema_id` header), when the record has one; the data handlers decode is
    /// the payload after the frame.
    pub registry_schema: Option<crate::schema_registry::framing::SchemaRef>,
    /// The consumer reading it (set by the inbox before a handler sees it).
    pub(crate) consumer: Arc<str>,
}

/// The namespace of [`Meta::idempotency_key`]'s UUIDv5s.
pub const IDEMPOTENCY_NAMESPACE: Uuid = Uuid::from_u128(0x6f75_7462_6f78_4000_8000_6964_656d_706f);

impl Meta {
    /// The consumer (the inbox's name) this message is handled for.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    /// A key for an effect outside the database, to send to a receiver that deduplicates
    /// (an `Idempotency-Key` header, a payment provider's request id): the UUIDv5 of the
    /// consumer and the event id in [`IDEMPOTENCY_NAMESPACE`].
    ///
    /// The inbox row makes the database effect happen once; it cannot make a call to
    /// another service atomic with it: the call may succeed and the transaction still roll
    /// back (a later handler error, a crash, a lost connection), and the event is then
    /// delivered again. This key is the same on every delivery, replay and operator retry
    /// of the event to this consumer, and different for another consumer, so a receiver
    /// that honours it performs the effect once. For a receiver that does not, see the
    /// book's "Effects outside the database": reconciliation and compensation remain.
    pub fn idempotency_key(&self) -> Uuid {
        let mut name = Vec::with_capacity(self.consumer.len() + 17);
        name.extend_from_slice(self.consumer.as_bytes());
        name.push(0);
        name.extend_from_slice(self.event_id.as_bytes());
        Uuid::new_v5(&IDEMPOTENCY_NAMESPACE, &name)
    }

    /// The CloudEvents `id` and `source` when the event id was derived from them (an id
    /// that is not a UUID), for the inbox row.
    pub(crate) fn foreign(&self) -> Option<(&str, &str)> {
        (self.event_id.hyphenated().to_string() != self.id)
            .then_some((self.id.as_str(), self.source.as_str()))
    }
}

/// A boxed future, as erased handlers return (futures' own).
pub use futures_util::future::BoxFuture;

/// Handles events of type `E` (decoded from the payload).
///
/// ```
/// use outbox_runtime::inbox::{EventHandler, HandlerError, Meta};
/// # #[derive(serde::Deserialize)] struct OrderConfirmed { order_id: uuid::Uuid }
/// struct Projection;
/// impl EventHandler<OrderConfirmed> for Projection {
///     async fn handle(&self, tx: &mut sqlx::PgConnection, event: OrderConfirmed, _: &Meta) -> Result<(), HandlerError> {
///         sqlx::query("INSERT INTO confirmed_orders (id) VALUES ($1)").bind(event.order_id).execute(tx).await?;
///         Ok(())
///     }
/// }
/// ```
pub trait EventHandler<E>: Send + Sync + 'static {
    /// Applies `event` on `tx`, the transaction that also records it in the inbox.
    fn handle(
        &self,
        tx: &mut PgConnection,
        event: E,
        meta: &Meta,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send;
}

/// Handles messages no typed handler claims, with the raw payload.
pub trait RawHandler: Send + Sync + 'static {
    /// Applies the message on `tx`.
    fn handle(
        &self,
        tx: &mut PgConnection,
        payload: &[u8],
        meta: &Meta,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send;
}

/// How a dispatch ended before the handler ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Dispatch {
    /// The payload did not decode into the handler's type.
    Undecodable(String),
    /// The handler ran.
    Ran(Result<(), HandlerError>),
}

pub(crate) trait Erased: Send + Sync {
    fn call<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        payload: &'a [u8],
        meta: &'a Meta,
    ) -> BoxFuture<'a, Dispatch>;
}

struct Typed<E, H> {
    handler: H,
    _event: PhantomData<fn() -> E>,
}

impl<E, H> Erased for Typed<E, H>
where
    E: DeserializeOwned + Send + 'static,
    H: EventHandler<E>,
{
    fn call<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        payload: &'a [u8],
        meta: &'a Meta,
    ) -> BoxFuture<'a, Dispatch> {
        Box::pin(async move {
            match super::decode::decode::<E>(payload) {
                Ok(event) => Dispatch::Ran(self.handler.handle(tx, event, meta).await),
                Err(error) => Dispatch::Undecodable(format!(
                    "payload does not decode as {} v{}: {error}",
                    meta.event_type, meta.schema_version
                )),
            }
        })
    }
}

struct Raw<H>(H);

impl<H: RawHandler> Erased for Raw<H> {
    fn call<'a>(
        &'a self,
        tx: &'a mut PgConnection,
        payload: &'a [u8],
        meta: &'a Meta,
    ) -> BoxFuture<'a, Dispatch> {
        Box::pin(async move { Dispatch::Ran(self.0.handle(tx, payload, meta).await) })
    }
}

/// The registered or ignored types a "no handler" reason lists at most, each.
const LISTED_TYPES: usize = 20;

/// Handlers by (event_type, schema_version), plus an optional fallback.
#[derive(Clone, Default)]
pub struct Handlers {
    typed: BTreeMap<(String, u32), Arc<dyn Erased>>,
    ignored: BTreeSet<String>,
    fallback: Option<Arc<dyn Erased>>,
}

impl std::fmt::Debug for Handlers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handlers")
            .field("typed", &self.typed.keys().collect::<Vec<_>>())
            .field("ignored", &self.ignored)
            .field("fallback", &self.fallback.is_some())
            .finish()
    }
}

impl Handlers {
    /// No handlers.
    pub fn new() -> Self {
        Handlers::default()
    }

    /// Handles `E`'s event type and schema version with `handler`.
    #[must_use]
    pub fn on<E, H>(self, handler: H) -> Self
    where
        E: OutboxEvent + DeserializeOwned + Send + 'static,
        H: EventHandler<E>,
    {
        self.on_type::<E, H>(E::EVENT_TYPE, E::SCHEMA_VERSION, handler)
    }

    /// Handles `event_type` at `schema_version`, decoded as `E` (for types generated from
    /// the schemas, which do not implement [`OutboxEvent`]).
    #[must_use]
    pub fn on_type<E, H>(mut self, event_type: &str, schema_version: u32, handler: H) -> Self
    where
        E: DeserializeOwned + Send + 'static,
        H: EventHandler<E>,
    {
        let erased: Arc<dyn Erased> = Arc::new(Typed { handler, _event: PhantomData::<fn() -> E> });
        self.typed.insert((event_type.to_owned(), schema_version), erased);
        self
    }

    /// Skips events of `event_type` (every version) on purpose: they are counted as
    /// ignored and their offsets move on. Without this, a type with no handler is parked.
    #[must_use]
    pub fn ignore(mut self, event_type: &str) -> Self {
        self.ignored.insert(event_type.to_owned());
        self
    }

    /// Handles every message no typed handler claims.
    #[must_use]
    pub fn fallback<H: RawHandler>(mut self, handler: H) -> Self {
        self.fallback = Some(Arc::new(Raw(handler)));
        self
    }

    /// The (event type, schema version) pairs that have a typed handler, in order.
    pub fn registered(&self) -> impl Iterator<Item = (&str, u32)> + '_ {
        self.typed.keys().map(|(event_type, version)| (event_type.as_str(), *version))
    }

    /// The event types skipped on purpose ([`Handlers::ignore`]), in order.
    pub fn ignored_types(&self) -> impl Iterator<Item = &str> + '_ {
        self.ignored.iter().map(String::as_str)
    }

    /// Why a message of `event_type` at `schema_version` is parked when nothing handles it:
    /// what is registered (at most [`LISTED_TYPES`] of each list) and the two ways out,
    /// `Handlers::ignore` to skip it on purpose or a handler to apply it.
    pub(crate) fn unhandled_reason(&self, event_type: &str, schema_version: u32) -> String {
        fn list<'a>(items: impl ExactSizeIterator<Item = String> + 'a) -> String {
            let n = items.len();
            let mut shown: Vec<String> = items.take(LISTED_TYPES).collect();
            if n > LISTED_TYPES {
                shown.push(format!("and {} more", n - LISTED_TYPES));
            }
            shown.join(", ")
        }
        let handled = if self.typed.is_empty() {
            "no event type".to_owned()
        } else {
            list(self.typed.keys().map(|(t, v)| format!("{t} v{v}")))
        };
        let ignored = if self.ignored.is_empty() {
            String::new()
        } else {
            format!("; ignores {}", list(self.ignored.iter().cloned()))
        };
        format!(
            "no handler for event type {event_type} version {schema_version} (this consumer handles {handled}{ignored}): \
             to skip it on purpose, add `Handlers::ignore({event_type:?})`; to apply it, register a handler with \
             `Handlers::on`"
        )
    }

    /// Whether a message of `event_type` at `schema_version` is ignored on purpose (no
    /// typed handler for that version claims it first).
    #[cfg(feature = "testing")]
    pub(crate) fn ignores(&self, event_type: &str, schema_version: u32) -> bool {
        matches!(self.resolve(event_type, schema_version), Resolved::Ignored)
    }

    /// A typed handler first, then an ignored type, then the fallback.
    pub(crate) fn resolve(&self, event_type: &str, schema_version: u32) -> Resolved<'_> {
        if let Some(handler) = self.typed.get(&(event_type.to_owned(), schema_version)) {
            return Resolved::Handler(handler);
        }
        if self.ignored.contains(event_type) {
            return Resolved::Ignored;
        }
        match &self.fallback {
            Some(handler) => Resolved::Handler(handler),
            None => Resolved::Unhandled,
        }
    }
}

/// What handles a message.
pub(crate) enum Resolved<'h> {
    Handler(&'h Arc<dyn Erased>),
    Ignored,
    Unhandled,
}

#[cfg(test)]
mod error_tests {
    use super::HandlerError;
    use std::error::Error as _;

    /// A handler's cause stays its `source()`, and the reason the inbox records carries the
    /// chain (before, `HandlerError` kept only a string and the cause was lost).
    #[test]
    fn a_handler_error_keeps_its_cause_and_records_the_chain() {
        let io = std::io::Error::new(std::io::ErrorKind::TimedOut, "ledger did not answer");
        let error = HandlerError::transient("posting failed").with_source(io);
        assert!(error.is_transient());
        assert_eq!(error.source().map(ToString::to_string).as_deref(), Some("ledger did not answer"));
        assert_eq!(error.reason_with_causes(), "posting failed: ledger did not answer");
        assert_eq!(error.to_string(), "transient: posting failed");

        // A cause the reason already states is not repeated.
        let error = HandlerError::permanent("ledger did not answer")
            .with_source(std::io::Error::other("ledger did not answer"));
        assert_eq!(error.reason_with_causes(), "ledger did not answer");
        assert!(!error.is_transient());

        // sqlx errors keep their source and their class.
        let error = HandlerError::from(sqlx::Error::RowNotFound);
        assert!(error.source().and_then(|e| e.downcast_ref::<sqlx::Error>()).is_some());
        assert_eq!(error, HandlerError::transient(sqlx::Error::RowNotFound));
    }
}

#[cfg(test)]
#[path = "handler_tests.rs"]
mod tests;
