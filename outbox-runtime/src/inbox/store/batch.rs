//! The set-based path of a batch: its bookkeeping in five statements whatever its size,
//! then each new record's handler in order; or the per-record path when it cannot take
//! the batch.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use sqlx::{PgConnection, PgPool, SqlStr};
use tracing::{warn, Instrument as _};
use uuid::Uuid;

use super::{InboxNames, Outcome, Step, Store};
use crate::error::Result;
use crate::inbox::handler::{Dispatch, Erased, Handlers, Meta, Resolved};
use crate::inbox::message::Incoming;
use crate::inbox::partitions::{dedup_insert, dedup_match, Layout};
use crate::inbox::spans;
use crate::table::sql;

/// The set-based statements of a batch: each does for all of the batch's records what
/// the per-record statements do for one.
#[derive(Debug)]
pub(super) struct BatchStatements {
    pub(super) lock_keys: SqlStr,
    pub(super) any_hold: SqlStr,
    /// By layout: plain, partitioned.
    pub(super) insert_inbox: [SqlStr; 2],
    pub(super) versions: SqlStr,
    pub(super) bump_versions: SqlStr,
    /// By layout: plain, partitioned.
    pub(super) mark_stale: [SqlStr; 2],
}

impl BatchStatements {
    pub(super) fn new(names: &InboxNames) -> Self {
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
            insert_inbox: [Layout::Plain, Layout::Partitioned].map(|layout| {
                let [column, value, only_new] = dedup_insert(names, layout, "$1", "u.e");
                sql(format!(
                    "INSERT INTO {inbox} (consumer, event_id, event_type, schema_version, aggregate_type, aggregate_id, \
                                          aggregate_version, topic, kafka_partition, kafka_offset, ce_id, ce_source{column}) \
                     SELECT $1, u.*{value} FROM unnest($2::uuid[], $3::text[], $4::int[], $5::text[], $6::text[], \
                                              $7::bigint[], $8::text[], $9::int[], $10::bigint[], $11::text[], $12::text[]) \
                       AS u(e, ty, v, at, ai, av, t, p, o, ci, cs) \
                     WHERE {only_new} ON CONFLICT DO NOTHING RETURNING event_id"
                ))
            }),
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
            // The versions, gaps and stale counts; stale events' outcome is set one by one
            // (`mark_stale`): rare, and each found by the whole key of its partition.
            bump_versions: sql(format!(
                "UPDATE {aggregates} a SET last_version = u.v, gaps = a.gaps + u.g, stale = a.stale + u.s \
                 FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[], $7::bigint[]) \
                   AS u(t, at, ai, v, g, s) \
                 WHERE a.consumer = $1 AND a.topic = u.t AND a.aggregate_type = u.at AND a.aggregate_id = u.ai"
            )),
            mark_stale: [Layout::Plain, Layout::Partitioned].map(|layout| {
                let only = dedup_match(names, layout, "$2");
                sql(format!("UPDATE {inbox} SET outcome = 'stale' WHERE consumer = $1 AND event_id = $2{only}"))
            }),
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
                Outcome::Applied { gap } => {
                    let span = spans::handling(&self.consumer, msg, meta);
                    match handler.call(&mut *tx, msg.event_data(), meta).instrument(span).await {
                        Dispatch::Ran(Ok(())) => Outcome::Applied { gap },
                        _ => return Ok(SetResult::Failed),
                    }
                }
                Outcome::Duplicate => {
                    self.absorbed(&mut *tx, msg, meta).await?;
                    Outcome::Duplicate
                }
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
        let index = self.layout_index(&mut *tx).await?;
        let inserted: Vec<Uuid> = sqlx::query_scalar(st.insert_inbox[index].clone())
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
            .bind(column(&|m| m.foreign().map(|(id, _)| id.to_owned())))
            .bind(column(&|m| m.foreign().map(|(_, source)| source.to_owned())))
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| self.saw(e))?;
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
                .execute(&mut *tx)
                .await?;
            for id in &stale_ids {
                sqlx::query(st.mark_stale[index].clone())
                    .bind(&self.consumer)
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
            }
        }
        Ok(Bookkept::Decided(decided))
    }
}
