//! Reconciliation: per event type and hour of creation, events appended, published and,
//! given the consumer's database, applied; and the differences between them.
//!
//! Every count of the outbox comes from one snapshot (one `REPEATABLE READ` transaction): a
//! relay publishing or a cleanup deleting meanwhile cannot make the counts disagree with
//! each other. In that same snapshot, the published events' ids are copied into a
//! temporary table of the session, and the transaction ends; the inbox is then checked
//! against that copy, one chunk at a time, each lookup a statement of its own. No snapshot
//! is held while the inbox is checked, however long that takes: a snapshot held open keeps
//! vacuum from every dead row the relays leave in the outbox meanwhile. The inbox is read
//! after the outbox's moment, so an event the consumer applied since counts as applied;
//! nothing the outbox counted can be missed or counted twice.
//!
//! Where the copy cannot be made (a hot standby, a role without the `TEMPORARY` privilege
//! on the database), the outbox's transaction stays open while the inbox is checked, as
//! before: in the outbox's own snapshot when the inbox is in the same database
//! ([`Reconciliation::one_snapshot`]), else in one taken just after.

use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

use serde::Serialize;
use sqlx::{AssertSqlSafe, PgConnection, PgPool, Postgres, Transaction};
use uuid::Uuid;

use super::Ops;
use crate::action::{at_micros, epoch_micros};
use crate::error::Result;
use crate::inbox::InboxNames;

/// Outbox rows read per round trip when checking the inbox.
const CHUNK: i64 = 10_000;
/// Missing event ids listed per row at most.
const LISTED: usize = 20;
/// The hour of an event's creation, UTC, as reconcile reports it.
const HOUR: &str =
    "to_char(date_trunc('hour', created_at AT TIME ZONE 'UTC'), 'YYYY-MM-DD\"T\"HH24:00:00\"Z\"')";

/// The consumer side of a reconciliation: its database and inbox.
#[derive(Debug, Clone)]
pub struct InboxSide {
    pool: PgPool,
    names: InboxNames,
    consumer: String,
    required: BTreeSet<String>,
}

impl InboxSide {
    /// The inbox `schema.table` of `consumer` in `pool`'s database.
    pub fn new(pool: PgPool, schema: &str, table: &str, consumer: impl Into<String>) -> Result<Self> {
        Ok(InboxSide {
            pool,
            names: InboxNames::new(schema, table)?,
            consumer: consumer.into(),
            required: BTreeSet::new(),
        })
    }

    /// An event type the consumer must have applied. Without any, a type counts as
    /// consumed when at least one of its events in the interval is in the inbox; a type
    /// none of whose events is there is reported as not consumed, not as a difference.
    #[must_use]
    pub fn require(mut self, event_type: impl Into<String>) -> Self {
        self.required.insert(event_type.into());
        self
    }
}

/// One event type in one hour.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ReconciliationRow {
    /// The event type.
    pub event_type: String,
    /// The hour of creation, UTC (`2026-11-30T10:00:00Z`).
    pub hour: String,
    /// Events appended (still in the outbox or cleaned up).
    pub appended: i64,
    /// Events published (still in the outbox or cleaned up).
    pub published: i64,
    /// Appended, neither published nor discarded: pending or failed.
    pub unpublished: i64,
    /// Discarded by an operator.
    pub discarded: i64,
    /// Published events already cleaned up from the outbox: counted, but their event ids
    /// are gone, so they are not checked against the inbox.
    pub cleaned_up: i64,
    /// Published events still in the outbox whose effect the consumer applied (with a
    /// consumer).
    pub applied: Option<i64>,
    /// Of the published events in the consumer's inbox, those it absorbed as stale (an
    /// older aggregate version than one it had applied): no effect, but a final outcome.
    pub stale: Option<i64>,
    /// Of the published events in the consumer's inbox, those its operator discarded.
    pub consumer_discarded: Option<i64>,
    /// Published events still in the outbox not in the inbox at all (with a consumer of
    /// the type): neither applied, stale nor discarded there.
    pub not_applied: Option<i64>,
    /// Up to 20 of those event ids.
    pub not_applied_ids: Vec<Uuid>,
}

/// The result of [`Ops::reconcile`](super::Ops::reconcile).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Reconciliation {
    /// Per event type and hour, in that order.
    pub rows: Vec<ReconciliationRow>,
    /// Event types none of whose events of the interval is in the inbox, and not required:
    /// taken as not consumed by this consumer.
    pub not_consumed: Vec<String>,
    /// Rows with a difference: unpublished events, or published events not applied.
    pub differences: usize,
    /// Whether the inbox was read in the outbox's own snapshot: only where the published
    /// events could not be copied out of that snapshot (a hot standby, a role without the
    /// `TEMPORARY` privilege) and the inbox is in the same database; that holds the
    /// snapshot open while the inbox is checked. Otherwise the inbox is read after the
    /// outbox, with no snapshot held. Either way, an event published a moment before shows
    /// as not applied while the consumer has not applied it yet (its lag): give `until` a
    /// little in the past to leave those out.
    pub one_snapshot: bool,
}

/// Begins a read-only transaction that sees one snapshot throughout.
async fn snapshot(pool: &PgPool) -> Result<Transaction<'static, Postgres>> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY").execute(&mut *tx).await?;
    Ok(tx)
}

/// The session's copy of the published events' ids: see the module's documentation.
const COPY: &str = "pg_temp.outbox_reconcile";

/// A snapshot of the inbox's database: the outbox's own when it can be imported there
/// (same database), else a new one. Says which.
async fn inbox_snapshot(
    pool: &PgPool,
    outbox_snapshot: Option<&str>,
) -> Result<(Transaction<'static, Postgres>, bool)> {
    if let Some(id) = outbox_snapshot {
        let mut tx = snapshot(pool).await?;
        // An identifier is hex digits and dashes (it cannot be a bound parameter). Importing
        // fails in another database or on another server: then a snapshot of its own.
        if id.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
            && sqlx::query(AssertSqlSafe(format!("SET TRANSACTION SNAPSHOT '{id}'")))
                .execute(&mut *tx)
                .await
                .is_ok()
        {
            return Ok((tx, true));
        }
        tx.rollback().await?;
    }
    Ok((snapshot(pool).await?, false))
}

impl Ops {
    /// Counts events per type and hour of creation in `[since, until)` and compares
    /// appended with published and, given `inbox`, published with applied.
    pub async fn reconcile(
        &self,
        pool: &PgPool,
        since: SystemTime,
        until: SystemTime,
        inbox: Option<&InboxSide>,
    ) -> Result<Reconciliation> {
        self.reconcile_unchecked(pool, since, until, inbox).await.map_err(|e| match inbox {
            Some(side) => self.names().not_migrated(side.names.not_migrated(e)),
            None => self.names().not_migrated(e),
        })
    }

    async fn reconcile_unchecked(
        &self,
        pool: &PgPool,
        since: SystemTime,
        until: SystemTime,
        inbox: Option<&InboxSide>,
    ) -> Result<Reconciliation> {
        let (t, cleaned) = (&self.names().outbox, &self.names().cleaned);
        let (since, until) = (epoch_micros(since), epoch_micros(until));
        let (since_at, until_at) = (at_micros("$1"), at_micros("$2"));
        let present = format!(
            "SELECT event_type, {HOUR}, count(*), count(*) FILTER (WHERE status = 'published'), \
                    count(*) FILTER (WHERE status IN ('pending', 'failed')), count(*) FILTER (WHERE status = 'discarded') \
             FROM {t} WHERE created_at >= {since_at} AND created_at < {until_at} GROUP BY 1, 2"
        );
        let gone = format!(
            "SELECT event_type, to_char(hour, 'YYYY-MM-DD\"T\"HH24:00:00\"Z\"'), \
                    coalesce(sum(events) FILTER (WHERE status = 'published'), 0)::bigint, \
                    coalesce(sum(events) FILTER (WHERE status = 'discarded'), 0)::bigint \
             FROM {cleaned} WHERE hour >= date_trunc('hour', {since_at} AT TIME ZONE 'UTC') \
               AND hour < {until_at} AT TIME ZONE 'UTC' GROUP BY 1, 2"
        );
        let mut rows: BTreeMap<(String, String), ReconciliationRow> = BTreeMap::new();
        // One connection throughout: the copy of the published ids is a temporary table of
        // its session.
        let mut conn = pool.acquire().await?;
        let mut tx = {
            let mut tx = sqlx::Connection::begin(&mut *conn).await?;
            sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ").execute(&mut *tx).await?;
            tx
        };
        // Copied in the counts' snapshot, before them (a failure to copy is told apart from
        // the counts' own errors by its savepoint). Where the copy cannot be made, the
        // outbox's snapshot is exported for the inbox's transaction instead (where it
        // cannot be exported either, a subtransaction, some proxies: a snapshot without).
        let mut copied = false;
        let mut exported = None;
        if inbox.is_some() {
            copied = copy_published(&mut tx, &self.names().outbox, since, until).await?;
            if !copied {
                match sqlx::query_scalar::<_, String>("SELECT pg_export_snapshot()").fetch_one(&mut *tx).await
                {
                    Ok(id) => exported = Some(id),
                    Err(_) => {
                        tx.rollback().await?;
                        tx = sqlx::Connection::begin(&mut *conn).await?;
                        sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                            .execute(&mut *tx)
                            .await?;
                    }
                }
            }
        }
        let present: Vec<(String, String, i64, i64, i64, i64)> =
            sqlx::query_as(AssertSqlSafe(present)).bind(since).bind(until).fetch_all(&mut *tx).await?;
        for (event_type, hour, appended, published, unpublished, discarded) in present {
            let row = rows.entry((event_type.clone(), hour.clone())).or_insert_with(|| ReconciliationRow {
                event_type,
                hour,
                ..ReconciliationRow::default()
            });
            row.appended += appended;
            row.published += published;
            row.unpublished += unpublished;
            row.discarded += discarded;
        }
        let gone: Vec<(String, String, i64, i64)> =
            sqlx::query_as(AssertSqlSafe(gone)).bind(since).bind(until).fetch_all(&mut *tx).await?;
        for (event_type, hour, published, discarded) in gone {
            let row = rows.entry((event_type.clone(), hour.clone())).or_insert_with(|| ReconciliationRow {
                event_type,
                hour,
                ..ReconciliationRow::default()
            });
            row.appended += published + discarded;
            row.published += published;
            row.discarded += discarded;
            row.cleaned_up += published;
        }

        let mut not_consumed = Vec::new();
        let mut one_snapshot = false;
        if let Some(inbox) = inbox {
            let missing = if copied {
                // The counts and the copy are of one snapshot; nothing more is read in it.
                tx.commit().await?;
                let missing = self.not_in_inbox(&mut conn, None, since, until, inbox, &mut rows).await;
                // A copy left by a failure goes at the next reconcile of this session (or
                // with the session).
                sqlx::query(AssertSqlSafe(format!("DROP TABLE IF EXISTS {COPY}")))
                    .execute(&mut *conn)
                    .await?;
                tx = sqlx::Connection::begin(&mut *conn).await?;
                missing?
            } else {
                let (mut inbox_tx, same) = inbox_snapshot(&inbox.pool, exported.as_deref()).await?;
                one_snapshot = same;
                let missing =
                    self.not_in_inbox(&mut tx, Some(&mut inbox_tx), since, until, inbox, &mut rows).await?;
                inbox_tx.commit().await?;
                missing
            };
            let types: BTreeSet<String> = rows.keys().map(|(event_type, _)| event_type.clone()).collect();
            for event_type in types {
                let seen = rows.values().any(|r| {
                    r.event_type == event_type
                        && r.applied.unwrap_or(0) + r.stale.unwrap_or(0) + r.consumer_discarded.unwrap_or(0)
                            > 0
                });
                if !seen && !inbox.required.contains(&event_type) {
                    not_consumed.push(event_type);
                    continue;
                }
                for row in rows.values_mut().filter(|r| r.event_type == event_type) {
                    let ids =
                        missing.get(&(row.event_type.clone(), row.hour.clone())).cloned().unwrap_or_default();
                    let in_inbox = row.applied.unwrap_or(0)
                        + row.stale.unwrap_or(0)
                        + row.consumer_discarded.unwrap_or(0);
                    row.not_applied = Some(row.published - row.cleaned_up - in_inbox);
                    row.not_applied_ids = ids;
                }
            }
        }
        tx.commit().await?;
        let rows: Vec<ReconciliationRow> = rows.into_values().collect();
        let differences = rows.iter().filter(|r| r.unpublished > 0 || r.not_applied.unwrap_or(0) > 0).count();
        Ok(Reconciliation { rows, not_consumed, differences, one_snapshot })
    }

    /// Sets `applied` on every row from the inbox and returns, per row, up to 20 published
    /// event ids the inbox lacks. The published events are read from `outbox`: from the
    /// session's copy of them when `inbox_tx` is `None` (the inbox then read one statement
    /// at a time from its pool), else from the outbox in `outbox`'s transaction (the inbox
    /// in `inbox_tx`).
    async fn not_in_inbox(
        &self,
        outbox: &mut PgConnection,
        mut inbox_tx: Option<&mut PgConnection>,
        since: i64,
        until: i64,
        inbox: &InboxSide,
        rows: &mut BTreeMap<(String, String), ReconciliationRow>,
    ) -> Result<BTreeMap<(String, String), Vec<Uuid>>> {
        let (since_at, until_at) = (at_micros("$1"), at_micros("$2"));
        let page = if inbox_tx.is_some() {
            format!(
                "SELECT id, event_id, event_type, {HOUR} FROM {} \
                 WHERE status = 'published' AND created_at >= {since_at} AND created_at < {until_at} \
                   AND id > $3 ORDER BY id LIMIT $4",
                self.names().outbox
            )
        } else {
            // The copy holds exactly these rows; `since` and `until` are ignored.
            format!(
                "SELECT id, event_id, event_type, hour FROM {COPY} \
                 WHERE $1::int8 IS NOT NULL AND $2::int8 IS NOT NULL AND id > $3 ORDER BY id LIMIT $4"
            )
        };
        let found = format!(
            "SELECT event_id, outcome FROM {} WHERE consumer = $1 AND event_id = ANY($2)",
            inbox.names.inbox
        );
        for row in rows.values_mut() {
            row.applied = Some(0);
            row.stale = Some(0);
            row.consumer_discarded = Some(0);
        }
        let mut missing: BTreeMap<(String, String), Vec<Uuid>> = BTreeMap::new();
        let mut after = 0_i64;
        loop {
            let chunk: Vec<(i64, Uuid, String, String)> = sqlx::query_as(AssertSqlSafe(page.as_str()))
                .bind(since)
                .bind(until)
                .bind(after)
                .bind(CHUNK)
                .fetch_all(&mut *outbox)
                .await?;
            let Some(last) = chunk.last() else { break };
            after = last.0;
            let ids: Vec<Uuid> = chunk.iter().map(|c| c.1).collect();
            let lookup = sqlx::query_as(AssertSqlSafe(found.as_str())).bind(&inbox.consumer).bind(&ids);
            let outcomes: BTreeMap<Uuid, String> = match inbox_tx.as_deref_mut() {
                Some(tx) => lookup.fetch_all(tx).await?,
                None => lookup.fetch_all(&inbox.pool).await?,
            }
            .into_iter()
            .collect();
            for (_, event_id, event_type, hour) in chunk {
                let key = (event_type, hour);
                if let Some(outcome) = outcomes.get(&event_id) {
                    if let Some(row) = rows.get_mut(&key) {
                        let counter = match outcome.as_str() {
                            "stale" => &mut row.stale,
                            "discarded" => &mut row.consumer_discarded,
                            _ => &mut row.applied,
                        };
                        *counter = Some(counter.unwrap_or(0) + 1);
                    }
                } else {
                    let ids = missing.entry(key).or_default();
                    if ids.len() < LISTED {
                        ids.push(event_id);
                    }
                }
            }
        }
        Ok(missing)
    }
}

/// In `tx`, copies the published events of `[since, until)` of `outbox` into the session's
/// [`COPY`], keyed by id. `false`, with `tx` as it was, where a temporary table cannot be
/// made (a hot standby, no `TEMPORARY` privilege): any other error is an error.
async fn copy_published(tx: &mut PgConnection, outbox: &str, since: i64, until: i64) -> Result<bool> {
    let (since_at, until_at) = (at_micros("$1"), at_micros("$2"));
    sqlx::query("SAVEPOINT reconcile_copy").execute(&mut *tx).await?;
    let copy = async {
        sqlx::query(AssertSqlSafe(format!("DROP TABLE IF EXISTS {COPY}"))).execute(&mut *tx).await?;
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TEMPORARY TABLE {} (id bigint PRIMARY KEY, event_id uuid NOT NULL, \
                                       event_type text NOT NULL, hour text NOT NULL)",
            COPY.trim_start_matches("pg_temp.")
        )))
        .execute(&mut *tx)
        .await?;
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {COPY} SELECT id, event_id, event_type, {HOUR} FROM {outbox} \
             WHERE status = 'published' AND created_at >= {since_at} AND created_at < {until_at}"
        )))
        .bind(since)
        .bind(until)
        .execute(&mut *tx)
        .await
    }
    .await;
    match copy {
        Ok(_) => {
            sqlx::query("RELEASE SAVEPOINT reconcile_copy").execute(&mut *tx).await?;
            Ok(true)
        }
        // read_only_sql_transaction (a hot standby), insufficient_privilege (no TEMPORARY).
        Err(e)
            if e.as_database_error().and_then(|d| d.code()).is_some_and(|c| c == "25006" || c == "42501") =>
        {
            sqlx::query("ROLLBACK TO SAVEPOINT reconcile_copy").execute(&mut *tx).await?;
            sqlx::query("RELEASE SAVEPOINT reconcile_copy").execute(&mut *tx).await?;
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}
