//! The inbox's tables and what one message does to them, in one transaction: dedup insert,
//! aggregate version tracking, the handler's effect; or parking with its reason.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use sqlx::{PgConnection, PgPool, Postgres, SqlStr, Transaction};
use tracing::warn;
use uuid::Uuid;

use super::handler::{Dispatch, Erased, HandlerError, Handlers, Meta, Resolved};
use super::message::{raw_headers_json, Incoming};
use crate::error::Result;
use crate::table::{sql, validate_identifier};

/// Quoted names of the inbox's tables.
#[derive(Debug, Clone)]
pub(crate) struct InboxNames {
    pub(crate) schema: String,
    pub(crate) table: String,
    pub(crate) inbox: String,
    pub(crate) parked: String,
    pub(crate) aggregates: String,
}

impl InboxNames {
    pub(crate) fn new(schema: &str, table: &str) -> Result<Self> {
        validate_identifier("schema name", schema)?;
        validate_identifier("table name", table)?;
        let q = |suffix: &str| format!("\"{schema}\".\"{table}{suffix}\"");
        Ok(InboxNames {
            schema: schema.to_owned(),
            table: table.to_owned(),
            inbox: q(""),
            parked: q("_parked"),
            aggregates: q("_aggregates"),
        })
    }
}

/// The longest reason stored, in bytes.
const MAX_REASON_BYTES: usize = 4096;

/// `reason` as storable text: NUL replaced, at most [`MAX_REASON_BYTES`].
pub(crate) fn storable_reason(reason: &str) -> String {
    let mut s = reason.replace('\0', "\u{fffd}");
    if s.len() > MAX_REASON_BYTES {
        let mut end = MAX_REASON_BYTES;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

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
    lock_key: SqlStr,
    find_hold: SqlStr,
    park: SqlStr,
    parked_status: SqlStr,
    insert_inbox: SqlStr,
    version: SqlStr,
    first_version: SqlStr,
    bump_version: SqlStr,
    mark_stale: SqlStr,
    resolve: SqlStr,
    repark: SqlStr,
    batch: BatchStatements,
}

/// The set-based statements of a batch: each does for all of the batch's records what
/// the per-record statements do for one.
#[derive(Debug)]
struct BatchStatements {
    lock_keys: SqlStr,
    any_hold: SqlStr,
    insert_inbox: SqlStr,
    versions: SqlStr,
    bump_versions: SqlStr,
}

impl BatchStatements {
    fn new(names: &InboxNames) -> Self {
        let (inbox, parked, aggregates) = (&names.inbox, &names.parked, &names.aggregates);
        let hold_key = format!("\"{}\".\"{}_hold_key\"", names.schema, names.table);
        let keys = "unnest($2::text[], $3::bytea[]) AS u(t, k)";
        // Each record's aggregate row through the primary key, whatever the statistics say:
        // a lateral subquery is a nested loop over the batch's few keys.
        let each_aggregate = "unnest($2::text[], $3::text[], $4::text[]) AS u(t, at, ai)";
        BatchStatements {
            // The same lock keys as `Store::lock_key`, taken in sorted order.
            lock_keys: sql(format!(
                "SELECT count(pg_advisory_xact_lock(k)) FROM ( \
                   SELECT DISTINCT hashtextextended($1 || ':' || encode({hold_key}(u.t, u.k), 'hex'), 0) AS k \
                   FROM {keys} ORDER BY 1) locks"
            )),
            any_hold: sql(format!(
                "SELECT EXISTS (SELECT 1 FROM {keys} CROSS JOIN LATERAL ( \
                   SELECT 1 FROM {parked} p WHERE p.consumer = $1 AND p.hold_key = {hold_key}(u.t, u.k) \
                     AND p.status IN ('parked', 'held') LIMIT 1) h)"
            )),
            insert_inbox: sql(format!(
                "INSERT INTO {inbox} (consumer, event_id, event_type, schema_version, aggregate_type, aggregate_id, \
                                      aggregate_version, topic, kafka_partition, kafka_offset) \
                 SELECT $1, u.* FROM unnest($2::uuid[], $3::text[], $4::int[], $5::text[], $6::text[], $7::bigint[], \
                                            $8::text[], $9::int[], $10::bigint[]) AS u \
                 ON CONFLICT (consumer, event_id) DO NOTHING RETURNING event_id"
            )),
            // The batch's aggregate rows, locked: those it inserts (with no version yet)
            // come back from the insert, the others from a locking read. A row another
            // transaction inserted meanwhile comes back from neither: the caller then
            // goes per record.
            versions: sql(format!(
                "WITH inserted AS ( \
                   INSERT INTO {aggregates} (consumer, topic, aggregate_type, aggregate_id, last_version) \
                   SELECT $1, u.t, u.at, u.ai, {NO_VERSION} FROM {each_aggregate} \
                   ON CONFLICT (consumer, topic, aggregate_type, aggregate_id) DO NOTHING \
                   RETURNING topic, aggregate_type, aggregate_id, last_version) \
                 SELECT * FROM inserted \
                 UNION ALL \
                 SELECT a.topic, a.aggregate_type, a.aggregate_id, a.last_version FROM {each_aggregate} \
                 CROSS JOIN LATERAL (SELECT x.topic, x.aggregate_type, x.aggregate_id, x.last_version FROM {aggregates} x \
                   WHERE x.consumer = $1 AND x.topic = u.t AND x.aggregate_type = u.at AND x.aggregate_id = u.ai \
                   FOR UPDATE) a"
            )),
            // The versions, gaps and stale counts, and the stale events' outcome.
            bump_versions: sql(format!(
                "WITH stale AS (UPDATE {inbox} SET outcome = 'stale' WHERE consumer = $1 AND event_id = ANY($8)) \
                 UPDATE {aggregates} a SET last_version = u.v, gaps = a.gaps + u.g, stale = a.stale + u.s \
                 FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[], $7::bigint[]) \
                   AS u(t, at, ai, v, g, s) \
                 WHERE a.consumer = $1 AND a.topic = u.t AND a.aggregate_type = u.at AND a.aggregate_id = u.ai"
            )),
        }
    }
}

/// Whether the set statements can store a record's text: no NUL (PostgreSQL refuses it in
/// text) and short enough for an index row (about 2,700 bytes). A record that does not
/// fit goes per record, which gives it its outcome alone; a batch statement that fails
/// anyway fails the batch, which the worker then takes apart.
fn fits(msg: &Incoming, meta: &Meta) -> bool {
    let ok = |s: &str| s.len() <= 1000 && !s.contains('\0');
    ok(&msg.topic)
        && ok(&meta.event_type)
        && meta.aggregate_type.as_deref().is_none_or(ok)
        && meta.aggregate_id.as_deref().is_none_or(ok)
}

/// An aggregate as the inbox tracks its versions: topic, aggregate type, aggregate id.
type AggregateKey<'a> = (&'a str, &'a str, &'a str);

/// The columns of `bump_versions`: the aggregate, its last version, gaps and stale added.
type VersionColumns<'a> = (Vec<&'a str>, Vec<&'a str>, Vec<&'a str>, Vec<i64>, Vec<i64>, Vec<i64>);

/// `last_version` of an aggregate row the batch inserted to lock it before its first
/// version is known; never left behind (the batch sets every one it inserts).
const NO_VERSION: i64 = i64::MIN;

/// What the batch's bookkeeping came to.
enum Bookkept {
    /// Per record, in order: `Applied` (its handler still to run), `Duplicate` or `Stale`.
    Decided(Vec<Outcome>),
    /// A key of the batch has a parked record; nothing was written.
    Held,
    /// An aggregate row appeared meanwhile; the transaction holds part of the batch.
    Raced,
}

/// What the set-based path made of a batch.
enum SetResult {
    /// Every record came to an outcome: commit.
    Applied(Vec<Outcome>),
    /// A record's handler did not simply apply (at the index the caller was told): roll back.
    Failed,
    /// The batch needs the per-record path, in the same transaction (a parked key, a
    /// record without a handler or with text the set statements could not store);
    /// nothing of it is written yet.
    PerRecord,
}

impl Store {
    pub(crate) fn new(names: &InboxNames, consumer: &str) -> Self {
        let (inbox, parked, aggregates) = (&names.inbox, &names.parked, &names.aggregates);
        // The key that orders a message: its topic and record key, hashed (keys may be any
        // size; an index row holds about 2,700 bytes), as the parked table's `hold_key`.
        let hold_key = format!("\"{}\".\"{}_hold_key\"($2, $3)", names.schema, names.table);
        Store {
            consumer: consumer.to_owned(),
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
            insert_inbox: sql(format!(
                "INSERT INTO {inbox} (consumer, event_id, event_type, schema_version, aggregate_type, aggregate_id, \
                                      aggregate_version, topic, kafka_partition, kafka_offset) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
                 ON CONFLICT (consumer, event_id) DO NOTHING RETURNING 1"
            )),
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
            mark_stale: sql(format!(
                "WITH s AS (UPDATE {aggregates} SET stale = stale + 1 \
                            WHERE consumer = $1 AND aggregate_type = $2 AND aggregate_id = $3 AND topic = $5) \
                 UPDATE {inbox} SET outcome = 'stale' WHERE consumer = $1 AND event_id = $4"
            )),
            resolve: sql(format!("UPDATE {parked} SET status = $2, resolved_at = now() WHERE id = $1")),
            repark: sql(format!("UPDATE {parked} SET status = 'parked', reason = $2 WHERE id = $1")),
            batch: BatchStatements::new(names),
        }
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

    /// Processes consecutive messages of one partition in one transaction, in order, each
    /// as [`Store::process`] would, and commits. `at` says which message is in hand, so
    /// that the caller knows which one a failure (an error, a panic, a timeout) came from.
    /// `Ok(false)` when the message at `at` does not simply apply: rolled back, nothing
    /// written.
    pub(crate) async fn process_batch(
        &self,
        pool: &PgPool,
        handlers: &Handlers,
        msgs: &[Incoming],
        at: &AtomicUsize,
    ) -> Result<(bool, Vec<Outcome>)> {
        let mut tx = pool.begin().await?;
        match self.apply_set(&mut tx, handlers, msgs, at).await? {
            SetResult::Applied(outcomes) => {
                tx.commit().await?;
                return Ok((true, outcomes));
            }
            SetResult::Failed => {
                tx.rollback().await?;
                return Ok((false, Vec::new()));
            }
            SetResult::PerRecord => {}
        }
        let mut outcomes = Vec::with_capacity(msgs.len());
        for (i, msg) in msgs.iter().enumerate() {
            at.store(i, Ordering::Relaxed);
            self.lock(&mut tx, &msg.topic, msg.key.as_deref()).await?;
            if let Some(parked_id) = self.hold(&mut tx, msg).await? {
                let reason = format!("held behind parked message {parked_id} of the same key");
                let existing = self.park(&mut tx, msg, "held", &reason).await?;
                outcomes.push(Self::parked_outcome(existing, "held", &reason));
                continue;
            }
            match self.apply_in(&mut tx, handlers, msg, None).await? {
                Step::Commit(outcome) => outcomes.push(outcome),
                Step::Retry(_) | Step::ParkAfterRollback(_) => {
                    tx.rollback().await?;
                    return Ok((false, Vec::new()));
                }
            }
        }
        at.store(msgs.len(), Ordering::Relaxed);
        tx.commit().await?;
        Ok((true, outcomes))
    }

    /// The batch's bookkeeping in a few statements for all its records (their keys locked
    /// in one order, one hold check, one dedup insert, the aggregates' versions read and
    /// written once), then each new record's handler in order. Same outcomes as the
    /// per-record path; a batch it cannot take (see [`SetResult::PerRecord`]) goes that way.
    async fn apply_set(
        &self,
        tx: &mut PgConnection,
        handlers: &Handlers,
        msgs: &[Incoming],
        at: &AtomicUsize,
    ) -> Result<SetResult> {
        let mut batch = Vec::with_capacity(msgs.len());
        for msg in msgs {
            let Ok(meta) = &msg.meta else { return Ok(SetResult::PerRecord) };
            if !fits(msg, meta) {
                return Ok(SetResult::PerRecord);
            }
            let Resolved::Handler(handler) = handlers.resolve(&meta.event_type, meta.schema_version) else {
                return Ok(SetResult::PerRecord);
            };
            batch.push((msg, meta, handler));
        }
        let decided = match self.bookkeep(&mut *tx, &batch).await? {
            Bookkept::Decided(decided) => decided,
            Bookkept::Held => return Ok(SetResult::PerRecord),
            // Written in part: roll back; the worker takes the batch apart.
            Bookkept::Raced => {
                at.store(0, Ordering::Relaxed);
                return Ok(SetResult::Failed);
            }
        };
        let mut outcomes = Vec::with_capacity(batch.len());
        for (i, ((msg, meta, handler), decided)) in batch.iter().zip(decided).enumerate() {
            at.store(i, Ordering::Relaxed);
            outcomes.push(match decided {
                Outcome::Applied { gap } => match handler.call(&mut *tx, &msg.payload, meta).await {
                    Dispatch::Ran(Ok(())) => Outcome::Applied { gap },
                    _ => return Ok(SetResult::Failed),
                },
                other => other,
            });
        }
        at.store(msgs.len(), Ordering::Relaxed);
        Ok(SetResult::Applied(outcomes))
    }

    /// The batch's bookkeeping, in five statements whatever its size: its keys locked in
    /// one order, one hold check, one dedup insert, its aggregates' rows read (or
    /// inserted) locked, and their versions written with the stale events' outcome.
    async fn bookkeep(
        &self,
        tx: &mut PgConnection,
        batch: &[(&Incoming, &Meta, &Arc<dyn Erased>)],
    ) -> Result<Bookkept> {
        let st = &self.batch;
        let keyed: Vec<(&str, Vec<u8>)> =
            batch.iter().filter_map(|(m, _, _)| m.key.clone().map(|k| (m.topic.as_str(), k))).collect();
        if !keyed.is_empty() {
            let topics: Vec<&str> = keyed.iter().map(|k| k.0).collect();
            let keys: Vec<Vec<u8>> = keyed.into_iter().map(|k| k.1).collect();
            sqlx::query(st.lock_keys.clone())
                .bind(&self.consumer)
                .bind(&topics)
                .bind(&keys)
                .execute(&mut *tx)
                .await?;
            let held: bool = sqlx::query_scalar(st.any_hold.clone())
                .bind(&self.consumer)
                .bind(&topics)
                .bind(&keys)
                .fetch_one(&mut *tx)
                .await?;
            if held {
                return Ok(Bookkept::Held);
            }
        }
        let column =
            |f: &dyn Fn(&Meta) -> Option<String>| batch.iter().map(|(_, m, _)| f(m)).collect::<Vec<_>>();
        let inserted: Vec<Uuid> = sqlx::query_scalar(st.insert_inbox.clone())
            .bind(&self.consumer)
            .bind(batch.iter().map(|(_, m, _)| m.event_id).collect::<Vec<_>>())
            .bind(column(&|m| Some(m.event_type.clone())))
            .bind(
                batch
                    .iter()
                    .map(|(_, m, _)| i32::try_from(m.schema_version).unwrap_or(i32::MAX))
                    .collect::<Vec<_>>(),
            )
            .bind(column(&|m| m.aggregate_type.clone()))
            .bind(column(&|m| m.aggregate_id.clone()))
            .bind(batch.iter().map(|(_, m, _)| m.aggregate_version).collect::<Vec<_>>())
            .bind(batch.iter().map(|(msg, _, _)| msg.topic.as_str()).collect::<Vec<_>>())
            .bind(batch.iter().map(|(msg, _, _)| msg.partition).collect::<Vec<_>>())
            .bind(batch.iter().map(|(msg, _, _)| msg.offset).collect::<Vec<_>>())
            .fetch_all(&mut *tx)
            .await?;
        let mut inserted: HashSet<Uuid> = inserted.into_iter().collect();
        // A repeated event id in one batch: the first is new, the others duplicates.
        let new: Vec<bool> = batch.iter().map(|(_, m, _)| inserted.remove(&m.event_id)).collect();
        // The aggregate (topic, type, id) and version of each new record that has both.
        let versioned: Vec<Option<(AggregateKey<'_>, i64)>> = batch
            .iter()
            .zip(&new)
            .map(|((_, m, _), new)| match (new, m.aggregate_version, m.aggregate_id.as_deref()) {
                (true, Some(v), Some(id)) => {
                    Some(((m.topic.as_str(), m.aggregate_type.as_deref().unwrap_or(""), id), v))
                }
                _ => None,
            })
            .collect();
        // Sorted: every batch locks aggregate rows in one order.
        let keys: BTreeSet<AggregateKey<'_>> = versioned.iter().flatten().map(|(k, _)| *k).collect();
        let mut last: BTreeMap<AggregateKey<'_>, (i64, i64, i64)> = BTreeMap::new();
        if !keys.is_empty() {
            let (t, at, ai): (Vec<&str>, Vec<&str>, Vec<&str>) =
                keys.iter().fold((Vec::new(), Vec::new(), Vec::new()), |(mut t, mut at, mut ai), k| {
                    t.push(k.0);
                    at.push(k.1);
                    ai.push(k.2);
                    (t, at, ai)
                });
            let rows: Vec<(String, String, String, i64)> = sqlx::query_as(st.versions.clone())
                .bind(&self.consumer)
                .bind(&t)
                .bind(&at)
                .bind(&ai)
                .fetch_all(&mut *tx)
                .await?;
            let found: BTreeMap<(String, String, String), i64> =
                rows.into_iter().map(|(t, at, ai, v)| ((t, at, ai), v)).collect();
            for key in &keys {
                if let Some(version) = found.get(&(key.0.to_owned(), key.1.to_owned(), key.2.to_owned())) {
                    last.insert(*key, (*version, 0, 0));
                }
            }
        }
        let mut decided = Vec::with_capacity(batch.len());
        let mut stale_ids = Vec::new();
        for (((_, meta, _), new), versioned) in batch.iter().zip(&new).zip(&versioned) {
            decided.push(match (new, versioned) {
                (false, _) => Outcome::Duplicate,
                (true, None) => Outcome::Applied { gap: 0 },
                (true, Some((key, version))) => {
                    // Missing only when another transaction inserted it after this statement's
                    // snapshot (two partitions carrying one aggregate).
                    let Some((seen, gaps, stale)) = last.get_mut(key) else { return Ok(Bookkept::Raced) };
                    if *seen == NO_VERSION {
                        *seen = *version;
                        Outcome::Applied { gap: 0 }
                    } else if *version <= *seen {
                        *stale += 1;
                        stale_ids.push(meta.event_id);
                        Outcome::Stale
                    } else {
                        let gap = version.saturating_sub(*seen).saturating_sub(1);
                        if gap > 0 {
                            warn!(event_id = %meta.event_id, aggregate_id = key.2, r#type = %meta.event_type, version,
                                  last = *seen, stage = "inbox", "aggregate version gap: {gap} version(s) never seen");
                        }
                        *seen = *version;
                        *gaps += gap;
                        Outcome::Applied { gap }
                    }
                }
            });
        }
        if !last.is_empty() {
            let mut columns = VersionColumns::default();
            for (key, (version, gaps, stale)) in &last {
                columns.0.push(key.0);
                columns.1.push(key.1);
                columns.2.push(key.2);
                columns.3.push(*version);
                columns.4.push(*gaps);
                columns.5.push(*stale);
            }
            sqlx::query(st.bump_versions.clone())
                .bind(&self.consumer)
                .bind(&columns.0)
                .bind(&columns.1)
                .bind(&columns.2)
                .bind(&columns.3)
                .bind(&columns.4)
                .bind(&columns.5)
                .bind(&stale_ids)
                .execute(&mut *tx)
                .await?;
        }
        Ok(Bookkept::Decided(decided))
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
                let reason =
                    format!("no handler for event type {} version {}", meta.event_type, meta.schema_version);
                return Ok(Step::Commit(self.park_instead(tx, msg, &reason, resolves).await?));
            }
        };
        let new: Option<i32> = sqlx::query_scalar(self.insert_inbox.clone())
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
            .fetch_optional(&mut *tx)
            .await?;
        if new.is_none() {
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
        match handler.call(tx, &msg.payload, meta).await {
            Dispatch::Ran(Ok(())) => {
                self.resolve(tx, resolves).await?;
                Ok(Step::Commit(Outcome::Applied { gap }))
            }
            Dispatch::Ran(Err(HandlerError::Transient(reason))) => Ok(Step::Retry(reason)),
            Dispatch::Ran(Err(HandlerError::Permanent(reason))) => {
                Ok(Step::ParkAfterRollback(format!("handler failed: {reason}")))
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
                sqlx::query(self.mark_stale.clone())
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
mod tests {
    use super::*;
    use crate::inbox::{Handlers, Inbox, InboxConfig};

    /// Whether a scan node reads through an index (a bitmap heap scan reads the pages a
    /// bitmap index scan below it found).
    fn by_index(node: &str) -> bool {
        node.starts_with("Index") || node == "Bitmap Heap Scan"
    }

    /// Scan nodes of an `EXPLAIN (ANALYZE, FORMAT JSON)` plan: (node type, relation, rows read).
    fn scans(node: &serde_json::Value, found: &mut Vec<(String, String, u64)>) {
        if let Some(relation) = node["Relation Name"].as_str() {
            if node["Node Type"] != "ModifyTable" {
                let rows = node["Actual Rows"].as_f64().unwrap_or(0.0)
                    + node["Rows Removed by Filter"].as_f64().unwrap_or(0.0)
                    + node["Rows Removed by Index Recheck"].as_f64().unwrap_or(0.0);
                let loops = node["Actual Loops"].as_f64().unwrap_or(1.0);
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                found.push((
                    node["Node Type"].as_str().unwrap_or("").to_owned(),
                    relation.to_owned(),
                    (rows * loops) as u64,
                ));
            }
        }
        for child in node["Plans"].as_array().into_iter().flatten() {
            scans(child, found);
        }
    }

    /// Issue 13: every statement the inbox runs per message keeps an index plan that reads
    /// a handful of rows, with 100,000 rows in each inbox table, whether the tables were
    /// last analysed empty (a consumer that caught up on a backlog while autovacuum was
    /// behind) or after the load.
    #[sqlx::test(migrations = false)]
    async fn per_message_statements_read_a_handful_of_rows_whatever_the_statistics(pool: PgPool) {
        let config = InboxConfig::new("c", "127.0.0.1:1", ["t"]);
        let inbox = Inbox::new(pool.clone(), config, Handlers::new()).expect("inbox");
        inbox.migrator().run(&pool).await.expect("migrate");
        sqlx::query("ANALYZE inbox, inbox_parked, inbox_aggregates")
            .execute(&pool)
            .await
            .expect("analyze empty");
        for load in [
            "INSERT INTO inbox (consumer, event_id, event_type, schema_version, aggregate_type, aggregate_id, \
                                aggregate_version, topic, kafka_partition, kafka_offset) \
             SELECT 'c', gen_random_uuid(), 'e', 1, 'a', 'id' || g, 1, 't', 0, g FROM generate_series(1, 100000) g",
            "INSERT INTO inbox_aggregates (consumer, topic, aggregate_type, aggregate_id, last_version) \
             SELECT 'c', 't', 'a', 'id' || g, 1 FROM generate_series(1, 100000) g",
            "INSERT INTO inbox_parked (consumer, topic, kafka_partition, kafka_offset, record_key, headers, payload, \
                                       status, reason) \
             SELECT 'c', 't', 0, g, convert_to('k' || (g % 1000), 'UTF8'), '{}', '', \
                    CASE WHEN g % 100 = 0 THEN 'parked' ELSE 'discarded' END, 'r' \
             FROM generate_series(1, 100000) g",
        ] {
            sqlx::query(load).execute(&pool).await.expect("load");
        }
        let store = &inbox.store;
        let event = uuid::Uuid::new_v4();
        for analysed in [false, true] {
            if analysed {
                sqlx::query("ANALYZE inbox, inbox_parked, inbox_aggregates")
                    .execute(&pool)
                    .await
                    .expect("analyze");
            }
            let mut tx = pool.begin().await.expect("begin");
            let explain = |statement: &SqlStr| {
                crate::table::sql(format!("EXPLAIN (ANALYZE, FORMAT JSON) {}", statement.as_str()))
            };
            let mut plans: Vec<(&str, serde_json::Value)> = Vec::new();
            let key = b"k7".to_vec();
            plans.push((
                "find_hold",
                sqlx::query_scalar(explain(&store.find_hold))
                    .bind("c")
                    .bind("t")
                    .bind(&key)
                    .bind(0)
                    .bind(5_i64)
                    .fetch_one(&mut *tx)
                    .await
                    .expect("find_hold"),
            ));
            plans.push((
                "insert_inbox",
                sqlx::query_scalar(explain(&store.insert_inbox))
                    .bind("c")
                    .bind(event)
                    .bind("e")
                    .bind(1)
                    .bind("a")
                    .bind("id7")
                    .bind(2_i64)
                    .bind("t")
                    .bind(0)
                    .bind(200_000_i64)
                    .fetch_one(&mut *tx)
                    .await
                    .expect("insert_inbox"),
            ));
            plans.push((
                "version",
                sqlx::query_scalar(explain(&store.version))
                    .bind("c")
                    .bind("a")
                    .bind("id7")
                    .bind("t")
                    .fetch_one(&mut *tx)
                    .await
                    .expect("version"),
            ));
            plans.push((
                "first_version",
                sqlx::query_scalar(explain(&store.first_version))
                    .bind("c")
                    .bind("a")
                    .bind("new")
                    .bind(1_i64)
                    .bind("t")
                    .fetch_one(&mut *tx)
                    .await
                    .expect("first_version"),
            ));
            plans.push((
                "bump_version",
                sqlx::query_scalar(explain(&store.bump_version))
                    .bind("c")
                    .bind("a")
                    .bind("id7")
                    .bind(2_i64)
                    .bind(0_i64)
                    .bind("t")
                    .fetch_one(&mut *tx)
                    .await
                    .expect("bump_version"),
            ));
            plans.push((
                "mark_stale",
                sqlx::query_scalar(explain(&store.mark_stale))
                    .bind("c")
                    .bind("a")
                    .bind("id8")
                    .bind(event)
                    .bind("t")
                    .fetch_one(&mut *tx)
                    .await
                    .expect("mark_stale"),
            ));
            plans.push((
                "parked_status",
                sqlx::query_scalar(explain(&store.parked_status))
                    .bind("c")
                    .bind("t")
                    .bind(0)
                    .bind(100_i64)
                    .fetch_one(&mut *tx)
                    .await
                    .expect("parked_status"),
            ));
            // The batch statements, for 50 records of 50 aggregates.
            let topics = vec!["t"; 50];
            let keys: Vec<Vec<u8>> = (0..50).map(|i| format!("k{i}").into_bytes()).collect();
            let types = vec!["a"; 50];
            let ids: Vec<String> = (0..50).map(|i| format!("id{}", i * 7)).collect();
            let events: Vec<uuid::Uuid> = (0..50).map(|_| uuid::Uuid::new_v4()).collect();
            let numbers = vec![5_i64; 50];
            let mut batch_plans: Vec<(&str, serde_json::Value)> = Vec::new();
            let b = &store.batch;
            batch_plans.push((
                "any_hold",
                sqlx::query_scalar(explain(&b.any_hold))
                    .bind("c")
                    .bind(&topics)
                    .bind(&keys)
                    .fetch_one(&mut *tx)
                    .await
                    .expect("any_hold"),
            ));
            batch_plans.push((
                "versions",
                sqlx::query_scalar(explain(&b.versions))
                    .bind("c")
                    .bind(&topics)
                    .bind(&types)
                    .bind(&ids)
                    .fetch_one(&mut *tx)
                    .await
                    .expect("versions"),
            ));
            batch_plans.push((
                "bump_versions",
                sqlx::query_scalar(explain(&b.bump_versions))
                    .bind("c")
                    .bind(&topics)
                    .bind(&types)
                    .bind(&ids)
                    .bind(&numbers)
                    .bind(&numbers)
                    .bind(&numbers)
                    .bind(&events)
                    .fetch_one(&mut *tx)
                    .await
                    .expect("bump_versions"),
            ));
            tx.rollback().await.expect("rollback");
            for (name, plan) in &batch_plans {
                let mut found = Vec::new();
                scans(&plan[0]["Plan"], &mut found);
                let read: u64 = found.iter().map(|(_, _, n)| n).sum();
                assert!(
                    !found.is_empty() && found.iter().all(|(node, _, _)| by_index(node)) && read <= 200,
                    "analysed {analysed}: batch {name} reads {read} rows for 50 records: {found:?}"
                );
            }
            // The check can fail: a lookup by a column without an index is caught.
            let unindexed: serde_json::Value = sqlx::query_scalar(
                "EXPLAIN (ANALYZE, FORMAT JSON) SELECT 1 FROM inbox WHERE event_type = 'x'",
            )
            .fetch_one(&pool)
            .await
            .expect("explain");
            let mut found = Vec::new();
            scans(&unindexed[0]["Plan"], &mut found);
            assert!(found.iter().any(|(node, _, n)| node == "Seq Scan" && *n >= 100_000), "{found:?}");
            for (name, plan) in &plans {
                let mut found = Vec::new();
                scans(&plan[0]["Plan"], &mut found);
                let read: u64 = found.iter().map(|(_, _, n)| n).sum();
                // Inserts check their conflict through the unique index without a scan node.
                let inserts = matches!(*name, "insert_inbox" | "first_version");
                assert!(
                    (inserts || !found.is_empty())
                        && found.iter().all(|(node, _, _)| by_index(node))
                        && read <= 10,
                    "analysed {analysed}: {name} reads {read} rows: {found:?}"
                );
            }
        }
    }
}
