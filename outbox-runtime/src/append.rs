//! Appending events inside the caller's transaction.
//!
//! The event row commits or rolls back with the business change ([invariant 1](crate::guarantees#i1)).
//! Serialization and the record size are checked before anything is written, so a bad
//! event fails the caller's transaction instead of failing later in the relay ([invariant 2](crate::guarantees#i2)).

use std::collections::BTreeMap;

use sqlx::{Connection, PgConnection};
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::outbox::Outbox;
use crate::OutboxEvent;

/// Room counted for the fixed headers the relay adds (names, `ce_id`, `ce_time`,
/// `ce_source` and `ce_dataschema` of up to 128 bytes each, versions, a schema registry
/// frame, ...) when an append checks the record size.
pub const RESERVED_HEADER_BYTES: usize = 768;

/// A schema registry's schema id header (`__value_schema_id`, `__key_schema_id`): the
/// relay's to write when it frames records; an extra header of that name would be read as
/// the record's schema by Confluent's deserializers.
pub(crate) fn is_schema_id(name: &str) -> bool {
    use crate::schema_registry::framing::{KEY_SCHEMA_ID_HEADER, VALUE_SCHEMA_ID_HEADER};
    name == VALUE_SCHEMA_ID_HEADER || name == KEY_SCHEMA_ID_HEADER
}

/// Options of one append.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AppendOptions {
    aggregate_version: Option<i64>,
    headers: BTreeMap<String, String>,
    event_id: Option<Uuid>,
    non_critical: bool,
}

impl AppendOptions {
    /// Whether the event must be appended whatever the outbox's fill level. A non-critical
    /// event (`critical(false)`: a notification, an analytics event) is refused with
    /// [`Error::Backpressure`] once the outbox is nearly full (see
    /// [`OutboxConfig::capacity`](crate::OutboxConfig::capacity)); the caller's transaction
    /// can then go on without it. Default: critical.
    #[must_use]
    pub fn critical(mut self, critical: bool) -> Self {
        self.non_critical = !critical;
        self
    }

    /// The aggregate's version after the change this event records (its sequence of
    /// changes, not the event's `schema_version`). Sent as the `ce_aggregateversion`
    /// header; consumers use it to detect gaps and absorb stale events. Default: none.
    #[must_use]
    pub fn aggregate_version(mut self, version: i64) -> Self {
        self.aggregate_version = Some(version);
        self
    }

    /// An extra Kafka header. Names starting with `ce_`, `content-type`, `__value_schema_id` and `__key_schema_id` are reserved.
    #[must_use]
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// Use this event id instead of a new UUIDv7 (for idempotent producers of their own).
    #[must_use]
    pub fn event_id(mut self, id: Uuid) -> Self {
        self.event_id = Some(id);
        self
    }
}

/// An event serialized and checked, ready to be appended (see [`Outbox::append_batch`]).
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    event_id: Uuid,
    event_type: &'static str,
    schema_version: u32,
    aggregate_type: &'static str,
    aggregate_id: String,
    aggregate_version: Option<i64>,
    topic: &'static str,
    payload: String,
    headers: String,
    record_bytes: usize,
    critical: bool,
    /// The caller gave the event id: checked against the whole table before the insert.
    given_id: bool,
}

impl NewEvent {
    /// Serializes `event`; fails on a serialization error or a reserved header name.
    ///
    /// With feature `opentelemetry`, the current span's context is captured here into
    /// `traceparent` and `tracestate` (unless the options set them): build it inside the
    /// span the event belongs to.
    pub fn new<E: OutboxEvent>(event: &E, options: AppendOptions) -> Result<Self> {
        #[cfg(feature = "opentelemetry")]
        let options = {
            let mut options = options;
            crate::trace::capture(&mut options.headers);
            options
        };
        let payload = serde_json::to_string(event)
            .map_err(|source| Error::Serialize { event_type: E::EVENT_TYPE, source })?;
        if let Some(reserved) = options.headers.keys().find(|name| {
            name.starts_with("ce_") || name.eq_ignore_ascii_case("content-type") || is_schema_id(name)
        }) {
            return Err(Error::ReservedHeader(reserved.clone()));
        }
        let aggregate_id = event.aggregate_id();
        let header_bytes: usize = options.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
        // The aggregate id travels twice (key and ce_subject), the event type twice (ce_type and
        // ce_dataschema), the aggregate type once.
        let record_bytes = 2 * aggregate_id.len()
            + payload.len()
            + header_bytes
            + 2 * E::EVENT_TYPE.len() // ce_type and ce_dataschema
            + E::AGGREGATE_TYPE.len()
            + RESERVED_HEADER_BYTES;
        let headers = serde_json::to_string(&options.headers)
            .map_err(|source| Error::Serialize { event_type: E::EVENT_TYPE, source })?;
        Ok(NewEvent {
            event_id: options.event_id.unwrap_or_else(Uuid::now_v7),
            event_type: E::EVENT_TYPE,
            schema_version: E::SCHEMA_VERSION,
            aggregate_type: E::AGGREGATE_TYPE,
            aggregate_id,
            aggregate_version: options.aggregate_version,
            topic: E::TOPIC,
            payload,
            headers,
            record_bytes,
            critical: !options.non_critical,
            given_id: options.event_id.is_some(),
        })
    }

    /// The id the event will carry (`ce_id`).
    pub fn event_id(&self) -> Uuid {
        self.event_id
    }

    /// Key, value and headers, in bytes: the aggregate id twice (key and `ce_subject`), the
    /// type names, extra headers, and [`RESERVED_HEADER_BYTES`] for the rest of the relay's.
    pub fn record_bytes(&self) -> usize {
        self.record_bytes
    }
}

impl Outbox {
    /// Appends `event` in `tx`, the caller's open transaction: it commits or rolls back
    /// with the business change. Returns the event id. `tx` is a connection inside a sqlx
    /// transaction: `&mut tx` of `pool.begin()`, or the connection an inbox handler is
    /// given (so a handler can append a follow-up event in the transaction that applies
    /// the one it handles). A connection in autocommit is refused with
    /// [`Error::NotInTransaction`]: the event would commit at once, whatever became of the
    /// business change.
    ///
    /// Events of one aggregate are published in the order of their appends, so appends of
    /// one aggregate must not race: lock the aggregate first (the conditional
    /// `UPDATE ... RETURNING version` of the business change does), so each append commits
    /// before the next one of the same aggregate starts.
    ///
    /// ```no_run
    /// # async fn f(pool: sqlx::PgPool, event: impl outbox_runtime::OutboxEvent) -> outbox_runtime::Result<()> {
    /// let outbox = outbox_runtime::Outbox::default_ref();
    /// let mut tx = pool.begin().await?;
    /// // ... the business change on &mut *tx ...
    /// outbox.append(&mut tx, &event).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn append<E: OutboxEvent>(&self, tx: &mut PgConnection, event: &E) -> Result<Uuid> {
        self.append_with(tx, event, AppendOptions::default()).await
    }

    /// [`Outbox::append`] with an aggregate version, extra headers or a given event id.
    pub async fn append_with<E: OutboxEvent>(
        &self,
        tx: &mut PgConnection,
        event: &E,
        options: AppendOptions,
    ) -> Result<Uuid> {
        let event = NewEvent::new(event, options)?;
        let id = event.event_id;
        self.append_batch(tx, std::slice::from_ref(&event)).await?;
        Ok(id)
    }

    /// Appends several events, in order, with one statement. Either all are appended or,
    /// when one is too large, none. Near capacity a batch is refused with
    /// [`Error::Backpressure`] only when every event in it is non-critical: a batch holding a
    /// critical event is appended whole. Each aggregate's lock is taken first, in one fixed
    /// order (see [`OutboxConfig::lock_aggregates`](crate::OutboxConfig::lock_aggregates)).
    ///
    /// Outside a transaction it fails with [`Error::NotInTransaction`]; before the
    /// outbox's migrations have run, with [`Error::NotMigrated`].
    pub async fn append_batch(&self, tx: &mut PgConnection, events: &[NewEvent]) -> Result<()> {
        if !tx.is_in_transaction() {
            return Err(Error::NotInTransaction);
        }
        self.insert(tx, events).await.map_err(|e| self.not_migrated(e))
    }

    /// A missing outbox table, said as such (PostgreSQL says `relation ... does not exist`
    /// and points into the statement).
    fn not_migrated(&self, error: Error) -> Error {
        self.names().not_migrated(error)
    }

    /// Whether migration 11's check of caller-given event ids exists, looked up until it
    /// does (then remembered): before it, the table cannot be partitioned (converting needs
    /// it), and its unique index refuses a duplicate by itself, so a service upgraded before
    /// its database is migrated appends as before.
    async fn check_ids_ready(&self, conn: &mut PgConnection) -> Result<bool> {
        if self.inner.check_ids_ready.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(true);
        }
        let names = self.names();
        let ready: bool = sqlx::query_scalar("SELECT to_regprocedure($1) IS NOT NULL")
            .bind(format!("\"{}\".\"{}_check_event_ids\"(uuid[])", names.schema, names.table))
            .fetch_one(conn)
            .await?;
        if ready {
            self.inner.check_ids_ready.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(ready)
    }

    async fn insert(&self, conn: &mut PgConnection, events: &[NewEvent]) -> Result<()> {
        let max = self.config().max_record_bytes;
        if let Some(big) = events.iter().find(|e| e.record_bytes > max) {
            return Err(Error::RecordTooLarge {
                event_type: big.event_type,
                aggregate_id: big.aggregate_id.clone(),
                size: big.record_bytes,
                max,
            });
        }
        if events.is_empty() {
            return Ok(());
        }
        // A batch is refused near capacity only when none of it is critical: a critical
        // event is never refused, and a batch goes in whole or not at all.
        if events.iter().all(|e| !e.critical) {
            self.admit_non_critical(&mut *conn, events[0].event_type).await?;
        }
        // Ids the caller gave: a partitioned table holds a unique index of event ids per
        // partition, so the whole table is looked at first, under each id's lock.
        let given: Vec<Uuid> = events.iter().filter(|e| e.given_id).map(|e| e.event_id).collect();
        if !given.is_empty() && self.check_ids_ready(&mut *conn).await? {
            sqlx::query(self.inner.insert.check_ids.clone()).bind(given).execute(&mut *conn).await?;
        }
        if let [event] = events {
            let query = sqlx::query(self.inner.insert.one.clone())
                .bind(event.event_id)
                .bind(event.aggregate_type)
                .bind(&event.aggregate_id)
                .bind(event.aggregate_version)
                .bind(event.event_type)
                .bind(i32::try_from(event.schema_version).unwrap_or(i32::MAX))
                .bind(event.topic)
                .bind(&event.payload)
                .bind(&event.headers);
            let query = if self.config().notify { query.bind(&self.names().channel) } else { query };
            query.execute(conn).await?;
            return Ok(());
        }
        let column = |f: fn(&NewEvent) -> String| events.iter().map(f).collect::<Vec<_>>();
        let ids: Vec<Uuid> = events.iter().map(|e| e.event_id).collect();
        let versions: Vec<Option<i64>> = events.iter().map(|e| e.aggregate_version).collect();
        let schema_versions: Vec<i32> =
            events.iter().map(|e| i32::try_from(e.schema_version).unwrap_or(i32::MAX)).collect();
        let query = sqlx::query(self.inner.insert.batch.clone())
            .bind(ids)
            .bind(column(|e| e.aggregate_type.to_owned()))
            .bind(column(|e| e.aggregate_id.clone()))
            .bind(versions)
            .bind(column(|e| e.event_type.to_owned()))
            .bind(schema_versions)
            .bind(column(|e| e.topic.to_owned()))
            .bind(column(|e| e.payload.clone()))
            .bind(column(|e| e.headers.clone()));
        let query = if self.config().notify { query.bind(&self.names().channel) } else { query };
        query.execute(conn).await?;
        Ok(())
    }
}

/// Appends `event` to the default outbox (`public.outbox`) in `tx`, the caller's open
/// transaction. See [`Outbox::append`].
pub async fn append<E: OutboxEvent>(tx: &mut PgConnection, event: &E) -> Result<Uuid> {
    Outbox::default_ref().append(tx, event).await
}
