//! The inbox's tables and what one message does to them, in one transaction: dedup insert,
//! aggregate version tracking, the handler's effect; or parking with its reason.

use std::sync::atomic::{AtomicU8, Ordering};

use sqlx::{PgConnection, PgPool, Postgres, SqlStr, Transaction};
use tracing::{warn, Instrument as _};

use super::handler::{Dispatch, Handlers, Meta, Resolved};
use super::message::{raw_headers_json, Incoming};
use super::partitions::{dedup_insert, dedup_match, layout, layout_changed, Layout};
use super::spans;
use crate::error::{Error, Result};
use crate::table::sql;

pub(crate) use super::names::{storable_reason, InboxNames};

/// [`Store::layout`] before it is read.
const UNKNOWN: u8 = 0;

/// What became of one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Its effect was applied (and, with a version, `gap` versions were skipped before it).
    Applied { gap: i64 },
    /// Its event id was already in the inbox: absorbed.
    Duplicate,
    /// Its aggregate version is not newer than the last applied one: absorbed.
    Stale,
    /// Parked with a reason (bad input, unknown type, permanent handler error).
    Parked(String),
    /// Stored behind a parked message of the same key.
    Held,
    /// Its event type is ignored by this consumer on purpose.
    Ignored,
    /// A transient handler error: nothing was written; try again later.
    RetryLater(String),
}

/// Where applying a message in a transaction left it.
enum Step {
    /// Commit: this is its outcome.
    Commit(Outcome),
    /// Roll back; a transient handler error: try again later.
    Retry(String),
    /// Roll back, then park it with this reason in a transaction of its own.
    ParkAfterRollback(String),
}

#[derive(Debug)]
pub(crate) struct Store {
    pub(crate) consumer: String,
    /// The same, shared with every record's [`Meta`].
    pub(crate) consumer_name: std::sync::Arc<str>,
    names: InboxNames,
    lock_key: SqlStr,
    find_hold: SqlStr,
    park: SqlStr,
    parked_status: SqlStr,
    /// By layout: plain, partitioned.
    insert_inbox: [SqlStr; 2],
    /// The dedup table's layout: [`UNKNOWN`] until read (at start, or by the first insert
    /// of a store used outside `run`), then 1 + the index of its statements; set again by
    /// an insert that finds it was converted since (see [`Store::saw`]).
    layout: AtomicU8,
    version: SqlStr,
    first_version: SqlStr,
    bump_version: SqlStr,
    /// By layout: plain, partitioned.
    mark_stale: [SqlStr; 2],
    resolve: SqlStr,
    repark: SqlStr,
    batch: BatchStatements,
}

mod batch;
mod duplicate;

use self::batch::BatchStatements;

impl Store {
    pub(crate) fn new(names: &InboxNames, consumer: &str) -> Self {
        let (inbox, parked, aggregates) = (&names.inbox, &names.parked, &names.aggregates);
        // The key that orders a message: its topic and record key, hashed (keys may be any
        // size; an index row holds about 2,700 bytes), as the parked table's `hold_key`.
        let hold_key = format!("\"{}\".\"{}_hold_key\"($2, $3)", names.schema, names.table);
        Store {
            consumer: consumer.to_owned(),
            consumer_name: consumer.into(),
            names: names.clone(),
            // Serializes everything done for one key: the consumer's hold check and an
            // operator's release cannot interleave.
            lock_key: sql(format!("SELECT pg_advisory_xact_lock(hashtextextended($1 || ':' || encode({hold_key}, 'hex'), 0))")),
            // Only a parked record before this one holds it: a redelivered record that came
            // before the parked one (offsets not yet committed) is processed again, and
            // absorbed as the duplicate it is, not held behind a record that followed it.
            find_hold: sql(format!(
                "SELECT id FROM {parked} WHERE consumer = $1 AND hold_key = {hold_key} AND status IN ('parked', 'held') \
                   AND NOT (topic = $2 AND kafka_partition = $4 AND kafka_offset >= $5) \
                 ORDER BY id LIMIT 1"
            )),
            park: sql(format!(
                "INSERT INTO {parked} (consumer, topic, kafka_partition, kafka_offset, record_key, headers, payload, \
                                       event_id, event_type, schema_version, status, reason, raw_headers, null_value) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) \
                 ON CONFLICT (consumer, topic, kafka_partition, kafka_offset) DO NOTHING RETURNING id"
            )),
            parked_status: sql(format!(
                "SELECT status FROM {parked} WHERE consumer = $1 AND topic = $2 AND kafka_partition = $3 AND kafka_offset = $4"
            )),
            insert_inbox: [Layout::Plain, Layout::Partitioned].map(|layout| {
                let [column, value, only_new] = dedup_insert(names, layout, "$1", "$2");
                sql(format!(
                    "INSERT INTO {inbox} (consumer, event_id, event_type, schema_version, aggregate_type, aggregate_id, \
                                          aggregate_version, topic, kafka_partition, kafka_offset, ce_id, ce_source{column}) \
                     SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12{value} WHERE {only_new} \
                     ON CONFLICT DO NOTHING RETURNING 1"
                ))
            }),
            layout: AtomicU8::new(UNKNOWN),
            version: sql(format!(
                "SELECT last_version FROM {aggregates} \
                 WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND topic = $4 FOR UPDATE"
            )),
            // Two partitions may carry one aggregate (keys other than the subject): the
            // first version is inserted if absent, then read locked as usual.
            first_version: sql(format!(
                "INSERT INTO {aggregates} (consumer, aggregate_type, aggregate_id, topic, last_version) VALUES ($1, $2, $3, $5, $4) \
                 ON CONFLICT (consumer, topic, aggregate_type, aggregate_id) DO NOTHING RETURNING 1"
            )),
            bump_version: sql(format!(
                "UPDATE {aggregates} SET last_version = $4, gaps = gaps + $5 \
                 WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND topic = $6"
            )),
            mark_stale: [Layout::Plain, Layout::Partitioned].map(|layout| {
                let only = dedup_match(names, layout, "$4");
                sql(format!(
                    "WITH s AS (UPDATE {aggregates} SET stale = stale + 1 \
                                WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND topic = $5) \
                     UPDATE {inbox} SET outcome = 'stale' WHERE consumer = $1 AND event_id = $4{only}"
                ))
            }),
            resolve: sql(format!("UPDATE {parked} SET status = $2, resolved_at = now() WHERE id = $1")),
            repark: sql(format!("UPDATE {parked} SET status = 'parked', reason = $2 WHERE id = $1")),
            batch: BatchStatements::new(names),
        }
    }

    /// Sets the dedup table's layout, read from the catalog.
    pub(crate) fn set_layout(&self, layout: Layout) {
        self.layout.store(1 + u8::from(layout == Layout::Partitioned), Ordering::Relaxed);
    }

    /// The index of the dedup statements for the table's layout, read through `tx` the
    /// first time.
    async fn layout_index(&self, tx: &mut PgConnection) -> Result<usize> {
        if self.layout.load(Ordering::Relaxed) == UNKNOWN {
            self.set_layout(layout(&mut *tx, &self.names).await?);
        }
        Ok(usize::from(self.layout.load(Ordering::Relaxed) - 1))
    }

    /// An insert's error: one that says the dedup table has no default for `bucket` means
    /// it was partitioned while this consumer ran (`InboxAdmin::partition_table`), so the
    /// next attempt inserts with the bucket.
    pub(crate) fn saw(&self, error: sqlx::Error) -> Error {
        let partitioned = layout_changed(&error)
            && error.as_database_error().and_then(|d| d.code()).as_deref() == Some("23502");
        if partitioned && self.layout.swap(2, Ordering::Relaxed) != 2 {
            warn!(consumer = %self.consumer, stage = "apply", "the dedup table was partitioned: inserting with the bucket from now on");
        }
        error.into()
    }

    /// Takes the transaction-scoped lock of `key` in `topic` (no-op without a key).
    pub(crate) async fn lock(&self, tx: &mut PgConnection, topic: &str, key: Option<&[u8]>) -> Result<()> {
        if let Some(key) = key {
            sqlx::query(self.lock_key.clone()).bind(&self.consumer).bind(topic).bind(key).execute(tx).await?;
        }
        Ok(())
    }

    /// The first open parked message of the record's key in its topic, before it, if any:
    /// later ones are held.
    async fn hold(&self, tx: &mut PgConnection, msg: &Incoming) -> Result<Option<i64>> {
        let Some(key) = msg.key.as_deref() else { return Ok(None) };
        Ok(sqlx::query_scalar(self.find_hold.clone())
            .bind(&self.consumer)
            .bind(&msg.topic)
            .bind(key)
            .bind(msg.partition)
            .bind(msg.offset)
            .fetch_optional(tx)
            .await?)
    }

    /// Records `msg` in the parked table with `status` and `reason`. A message already there
    /// (redelivered) keeps its row: the status of that row is returned instead.
    pub(crate) async fn park(
        &self,
        tx: &mut PgConnection,
        msg: &Incoming,
        status: &str,
        reason: &str,
    ) -> Result<Option<String>> {
        let meta = msg.meta.as_ref().ok();
        let headers = serde_json::to_value(&msg.headers).unwrap_or_default();
        let reason = storable_reason(reason);
        let inserted: Option<i64> = sqlx::query_scalar(self.park.clone())
            .bind(&self.consumer)
            .bind(&msg.topic)
            .bind(msg.partition)
            .bind(msg.offset)
            .bind(msg.key.as_deref())
            .bind(headers)
            .bind(&msg.payload)
            .bind(meta.map(|m| m.event_id))
            .bind(meta.map(|m| m.event_type.clone()))
            .bind(meta.map(|m| i32::try_from(m.schema_version).unwrap_or(i32::MAX)))
            .bind(status)
            .bind(&reason)
            .bind(raw_headers_json(&msg.raw_headers))
            .bind(msg.null_value)
            .fetch_optional(&mut *tx)
            .await?;
        if inserted.is_some() {
            return Ok(None);
        }
        let existing: String = sqlx::query_scalar(self.parked_status.clone())
            .bind(&self.consumer)
            .bind(&msg.topic)
            .bind(msg.partition)
            .bind(msg.offset)
            .fetch_one(&mut *tx)
            .await?;
        Ok(Some(existing))
    }

    /// The outcome of parking `msg` as `status`, given what [`Store::park`] found.
    fn parked_outcome(existing: Option<String>, status: &str, reason: &str) -> Outcome {
        match existing.as_deref() {
            // Resolved by an operator already: this delivery is a duplicate.
            Some("retried" | "discarded") => Outcome::Duplicate,
            Some("held") => Outcome::Held,
            Some(_) => Outcome::Parked(reason.to_owned()),
            None if status == "held" => Outcome::Held,
            None => Outcome::Parked(reason.to_owned()),
        }
    }

    /// Processes one message from the topic.
    pub(crate) async fn process(
        &self,
        pool: &PgPool,
        handlers: &Handlers,
        msg: &Incoming,
    ) -> Result<Outcome> {
        let mut tx = pool.begin().await?;
        self.lock(&mut tx, &msg.topic, msg.key.as_deref()).await?;
        if let Some(parked_id) = self.hold(&mut tx, msg).await? {
            let reason = format!("held behind parked message {parked_id} of the same key");
            let existing = self.park(&mut tx, msg, "held", &reason).await?;
            tx.commit().await?;
            return Ok(Self::parked_outcome(existing, "held", &reason));
        }
        self.apply(pool, tx, handlers, msg, None).await
    }

    /// Applies `msg` in `tx` (the key already locked and not held). When `resolves` names a
    /// parked row, that row is marked retried in the same transaction.
    pub(crate) async fn apply(
        &self,
        pool: &PgPool,
        mut tx: Transaction<'static, Postgres>,
        handlers: &Handlers,
        msg: &Incoming,
        resolves: Option<(i64, &str)>,
    ) -> Result<Outcome> {
        match self.apply_in(&mut tx, handlers, msg, resolves).await? {
            Step::Commit(outcome) => {
                tx.commit().await?;
                Ok(outcome)
            }
            Step::Retry(reason) => {
                tx.rollback().await?;
                Ok(Outcome::RetryLater(reason))
            }
            Step::ParkAfterRollback(reason) => {
                tx.rollback().await?;
                self.park_after_rollback(pool, msg, &reason, resolves).await
            }
        }
    }

    /// What applying `msg` in `tx` came to, without ending the transaction.
    async fn apply_in(
        &self,
        tx: &mut PgConnection,
        handlers: &Handlers,
        msg: &Incoming,
        resolves: Option<(i64, &str)>,
    ) -> Result<Step> {
        let meta = match &msg.meta {
            Ok(meta) => meta,
            Err(reason) => return Ok(Step::Commit(self.park_instead(tx, msg, reason, resolves).await?)),
        };
        let handler = match handlers.resolve(&meta.event_type, meta.schema_version) {
            Resolved::Handler(handler) => handler,
            Resolved::Ignored => {
                self.resolve(tx, resolves).await?;
                return Ok(Step::Commit(Outcome::Ignored));
            }
            Resolved::Unhandled => {
                let reason = handlers.unhandled_reason(&meta.event_type, meta.schema_version);
                return Ok(Step::Commit(self.park_instead(tx, msg, &reason, resolves).await?));
            }
        };
        let index = self.layout_index(&mut *tx).await?;
        let new: Option<i32> = sqlx::query_scalar(self.insert_inbox[index].clone())
            .bind(&self.consumer)
            .bind(meta.event_id)
            .bind(&meta.event_type)
            .bind(i32::try_from(meta.schema_version).unwrap_or(i32::MAX))
            .bind(&meta.aggregate_type)
            .bind(&meta.aggregate_id)
            .bind(meta.aggregate_version)
            .bind(&msg.topic)
            .bind(msg.partition)
            .bind(msg.offset)
            .bind(meta.foreign().map(|(id, _)| id))
            .bind(meta.foreign().map(|(_, source)| source))
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| self.saw(e))?;
        if new.is_none() {
            self.absorbed(tx, msg, meta).await?;
            self.resolve(tx, resolves).await?;
            return Ok(Step::Commit(Outcome::Duplicate));
        }
        let gap = match self.track_version(tx, meta).await? {
            Some(gap) => gap,
            None => {
                self.resolve(tx, resolves).await?;
                return Ok(Step::Commit(Outcome::Stale));
            }
        };
        let span = spans::handling(&self.consumer, msg, meta);
        match handler.call(tx, msg.event_data(), meta).instrument(span).await {
            Dispatch::Ran(Ok(())) => {
                self.resolve(tx, resolves).await?;
                Ok(Step::Commit(Outcome::Applied { gap }))
            }
            Dispatch::Ran(Err(error)) if error.is_transient() => Ok(Step::Retry(error.reason_with_causes())),
            Dispatch::Ran(Err(error)) => {
                Ok(Step::ParkAfterRollback(format!("handler failed: {}", error.reason_with_causes())))
            }
            Dispatch::Undecodable(reason) => Ok(Step::ParkAfterRollback(reason)),
        }
    }

    /// Last applied version of the aggregate: `Some(gap)` to apply (versions skipped),
    /// `None` when the event is stale (already marked so).
    async fn track_version(&self, tx: &mut PgConnection, meta: &Meta) -> Result<Option<i64>> {
        let (Some(version), Some(aggregate_id)) = (meta.aggregate_version, meta.aggregate_id.as_deref())
        else {
            return Ok(Some(0));
        };
        let aggregate_type = meta.aggregate_type.as_deref().unwrap_or("");
        let read_last = || {
            sqlx::query_scalar::<_, i64>(self.version.clone())
                .bind(&self.consumer)
                .bind(aggregate_type)
                .bind(aggregate_id)
                .bind(&meta.topic)
        };
        let mut last: Option<i64> = read_last().fetch_optional(&mut *tx).await?;
        if last.is_none() {
            let inserted: Option<i32> = sqlx::query_scalar(self.first_version.clone())
                .bind(&self.consumer)
                .bind(aggregate_type)
                .bind(aggregate_id)
                .bind(version)
                .bind(&meta.topic)
                .fetch_optional(&mut *tx)
                .await?;
            if inserted.is_some() {
                return Ok(Some(0));
            }
            // Another transaction inserted it meanwhile: read it (locked) like any other.
            last = read_last().fetch_optional(&mut *tx).await?;
        }
        match last {
            None => Ok(Some(0)),
            Some(last) if version <= last => {
                sqlx::query(self.mark_stale[self.layout_index(&mut *tx).await?].clone())
                    .bind(&self.consumer)
                    .bind(aggregate_type)
                    .bind(aggregate_id)
                    .bind(meta.event_id)
                    .bind(&meta.topic)
                    .execute(&mut *tx)
                    .await?;
                Ok(None)
            }
            Some(last) => {
                let gap = version.saturating_sub(last).saturating_sub(1);
                if gap > 0 {
                    warn!(event_id = %meta.event_id, aggregate_id, r#type = %meta.event_type, version, last,
                          stage = "inbox", "aggregate version gap: {gap} version(s) never seen");
                }
                sqlx::query(self.bump_version.clone())
                    .bind(&self.consumer)
                    .bind(aggregate_type)
                    .bind(aggregate_id)
                    .bind(version)
                    .bind(gap)
                    .bind(&meta.topic)
                    .execute(&mut *tx)
                    .await?;
                Ok(Some(gap))
            }
        }
    }

    async fn resolve(&self, tx: &mut PgConnection, resolves: Option<(i64, &str)>) -> Result<()> {
        if let Some((id, status)) = resolves {
            sqlx::query(self.resolve.clone()).bind(id).bind(status).execute(tx).await?;
        }
        Ok(())
    }

    /// Parks `msg` in `tx` instead of applying it (or, retrying a parked row, parks that
    /// row again with the new reason).
    async fn park_instead(
        &self,
        tx: &mut PgConnection,
        msg: &Incoming,
        reason: &str,
        resolves: Option<(i64, &str)>,
    ) -> Result<Outcome> {
        Ok(match resolves {
            // Retrying a parked message that fails again: it stays parked, with the new reason.
            Some((id, _)) => {
                self.repark(tx, id, reason).await?;
                Outcome::Parked(reason.to_owned())
            }
            None => Self::parked_outcome(self.park(tx, msg, "parked", reason).await?, "parked", reason),
        })
    }

    pub(crate) async fn park_after_rollback(
        &self,
        pool: &PgPool,
        msg: &Incoming,
        reason: &str,
        resolves: Option<(i64, &str)>,
    ) -> Result<Outcome> {
        let mut tx = pool.begin().await?;
        self.lock(&mut tx, &msg.topic, msg.key.as_deref()).await?;
        let outcome = self.park_instead(&mut tx, msg, reason, resolves).await?;
        tx.commit().await?;
        Ok(outcome)
    }

    async fn repark(&self, tx: &mut PgConnection, id: i64, reason: &str) -> Result<()> {
        sqlx::query(self.repark.clone()).bind(id).bind(storable_reason(reason)).execute(tx).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
