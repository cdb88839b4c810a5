//! Replay: publish again what was published, with the original event ids.

use std::time::SystemTime;

use serde::Serialize;
use sqlx::{AssertSqlSafe, PgPool};

use super::Ops;
use crate::action::{at_micros, audit_at, epoch_micros, Audit};
use crate::error::Result;

/// Rows replayed per transaction.
const REPLAY_BATCH: i64 = 5_000;

/// Which events to replay: every filter given must match. Times are the events' creation
/// times; `since` is inclusive, `until` exclusive.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayFilter {
    /// Only this event type.
    pub event_type: Option<String>,
    /// Only this aggregate id.
    pub aggregate_id: Option<String>,
    /// Created at or after.
    pub since: Option<SystemTime>,
    /// Created before.
    pub until: Option<SystemTime>,
    /// Only this event (by its event id).
    pub event_id: Option<uuid::Uuid>,
}

/// What a replay found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ReplayReport {
    /// Events still in the outbox that match the filter, in any status.
    pub matched: u64,
    /// Published events put back up for publication (0 in a dry run).
    pub replayed: u64,
    /// Published events a real run would put back up (equal to `replayed` after one).
    pub replayable: u64,
    /// Matching events not yet published (pending or failed): they go out anyway.
    pub not_yet_published: u64,
    /// Matching events an operator discarded: never replayed.
    pub discarded: u64,
    /// Published events of the filter's type and hours already deleted by cleanup or purge:
    /// they cannot be replayed. Counted per hour of creation, so an aggregate filter or
    /// times within an hour make it an upper bound (then `cleaned_up_exact` is false).
    pub cleaned_up: u64,
    /// Whether `cleaned_up` is exact.
    pub cleaned_up_exact: bool,
    /// The audit row written by [`Ops::replay_by`] (none in a dry run, none by
    /// [`Ops::replay`]).
    pub audit_id: Option<i64>,
}

/// The replay's filter: `$1` event type, `$2` aggregate id, `$3` since, `$4` until
/// ([`epoch_micros`], exact through [`at_micros`]), `$5` event id, all optional.
fn filter_sql() -> String {
    format!(
        "($1::text IS NULL OR event_type = $1) AND ($2::text IS NULL OR aggregate_id = $2) \
         AND ($3::int8 IS NULL OR created_at >= {since}) AND ($4::int8 IS NULL OR created_at < {until}) \
         AND ($5::uuid IS NULL OR event_id = $5)",
        since = at_micros("$3"),
        until = at_micros("$4"),
    )
}

fn on_the_hour(t: Option<SystemTime>) -> bool {
    t.is_none_or(|t| epoch_micros(t).rem_euclid(3_600_000_000) == 0)
}

impl Ops {
    /// Puts the published events matching `filter` back up for publication, with their
    /// original event ids, so consumers that already applied them absorb them as
    /// duplicates. A dry run counts and changes nothing. Works in batches of 5,000 rows,
    /// oldest first; per aggregate, the relay publishes them in their original order.
    pub async fn replay(&self, pool: &PgPool, filter: &ReplayFilter, dry_run: bool) -> Result<ReplayReport> {
        self.replay_unchecked(pool, filter, None, dry_run).await.map_err(|e| self.names().not_migrated(e))
    }

    /// [`Ops::replay`], recorded in `<table>_audit` as action `replay` by `actor`: the
    /// filter, the published events matched when it starts, and the events each batch put
    /// back, written in that batch's transaction (a replay cut short says how far it got);
    /// those not put back (published again, or deleted, meanwhile) as skipped. A dry run
    /// writes nothing. The CLI and the console replay through it.
    pub async fn replay_by(
        &self,
        pool: &PgPool,
        filter: &ReplayFilter,
        actor: &str,
        dry_run: bool,
    ) -> Result<ReplayReport> {
        self.replay_unchecked(pool, filter, Some(actor), dry_run)
            .await
            .map_err(|e| self.names().not_migrated(e))
    }

    async fn replay_unchecked(
        &self,
        pool: &PgPool,
        filter: &ReplayFilter,
        actor: Option<&str>,
        dry_run: bool,
    ) -> Result<ReplayReport> {
        let (t, cleaned) = (&self.names().outbox, &self.names().cleaned);
        let since = filter.since.map(epoch_micros);
        let until = filter.until.map(epoch_micros);
        let counts = format!(
            "SELECT count(*), count(*) FILTER (WHERE status = 'published'), \
                    count(*) FILTER (WHERE status IN ('pending', 'failed')), count(*) FILTER (WHERE status = 'discarded'), \
                    (SELECT coalesce(sum(events), 0)::bigint FROM {cleaned} WHERE status = 'published' \
                       AND ($1::text IS NULL OR event_type = $1) \
                       AND ($3::int8 IS NULL OR hour >= date_trunc('hour', {since} AT TIME ZONE 'UTC')) \
                       AND ($4::int8 IS NULL OR hour < {until} AT TIME ZONE 'UTC')) \
             FROM {t} WHERE {filter}",
            filter = filter_sql(),
            since = at_micros("$3"),
            until = at_micros("$4"),
        );
        let (matched, replayable, not_yet, discarded, cleaned_up): (i64, i64, i64, i64, i64) =
            sqlx::query_as(AssertSqlSafe(counts))
                .bind(&filter.event_type)
                .bind(&filter.aggregate_id)
                .bind(since)
                .bind(until)
                .bind(filter.event_id)
                .fetch_one(pool)
                .await?;
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        let mut report = ReplayReport {
            matched: count(matched),
            replayed: 0,
            replayable: count(replayable),
            not_yet_published: count(not_yet),
            discarded: count(discarded),
            cleaned_up: count(cleaned_up),
            cleaned_up_exact: filter.aggregate_id.is_none()
                && filter.event_id.is_none()
                && on_the_hour(filter.since)
                && on_the_hour(filter.until),
            audit_id: None,
        };
        if dry_run {
            return Ok(report);
        }
        // The set is fixed at the start: rows published by then, up to the highest id then.
        // Pages follow an id cursor, so a row the relay has just republished (published
        // again, after the start) is never picked up a second time, and the loop ends even
        // while a relay runs.
        let (started, last_id): (i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT (EXTRACT(EPOCH FROM now()) * 1000000)::int8, coalesce(max(id), 0) FROM {t}"
        )))
        .fetch_one(pool)
        .await?;
        let page = format!(
            "WITH page AS ( \
               SELECT id FROM {t} WHERE status = 'published' AND id > $6 AND id <= $7 \
                 AND published_at <= {started_at} AND {filter} ORDER BY id LIMIT $9), \
             done AS ( \
               UPDATE {t} SET status = 'pending', next_attempt_at = '-infinity', last_error = NULL \
               WHERE id IN (SELECT id FROM page) AND status = 'published' RETURNING 1) \
             SELECT (SELECT max(id) FROM page), (SELECT count(*) FROM done)",
            started_at = at_micros("$8"),
            filter = filter_sql(),
        );
        let mut cursor = 0_i64;
        let mut tx = pool.begin().await?;
        let audit = actor.map(|actor| Audit {
            table: &self.names().audit,
            consumer: None,
            actor,
            action: "replay",
            reason: None,
        });
        if let Some(audit) = &audit {
            report.audit_id = Some(start_audit(&mut tx, audit, filter, report.replayable).await?);
        }
        loop {
            let (page_end, done): (Option<i64>, i64) = sqlx::query_as(AssertSqlSafe(page.as_str()))
                .bind(&filter.event_type)
                .bind(&filter.aggregate_id)
                .bind(since)
                .bind(until)
                .bind(filter.event_id)
                .bind(cursor)
                .bind(last_id)
                .bind(started)
                .bind(REPLAY_BATCH)
                .fetch_one(&mut *tx)
                .await?;
            let done = u64::try_from(done).unwrap_or(0);
            report.replayed += done;
            if let (Some(audit), Some(id)) = (&audit, report.audit_id) {
                let skipped =
                    if page_end.is_none() { report.replayable.saturating_sub(report.replayed) } else { 0 };
                audit.add(&mut tx, id, done, skipped).await?;
            }
            tx.commit().await?;
            match page_end {
                Some(end) => {
                    cursor = end;
                    tx = pool.begin().await?;
                }
                None => break,
            }
        }
        if report.replayed > 0 && self.config().notify {
            sqlx::query("SELECT pg_notify($1, '')").bind(&self.names().channel).execute(pool).await?;
        }
        Ok(report)
    }
}

/// The audit row of a replay: its filter (the event type as `event_types`, as a retry's),
/// the published events it matched.
async fn start_audit(
    conn: &mut sqlx::PgConnection,
    audit: &Audit<'_>,
    filter: &ReplayFilter,
    matched: u64,
) -> Result<i64> {
    let sql = format!(
        "INSERT INTO {} (actor, action, matched, filter) \
         VALUES ($1, $2, $3, jsonb_strip_nulls(jsonb_build_object('event_types', CASE WHEN $4::text IS NULL THEN NULL \
             ELSE ARRAY[$4::text] END, 'aggregate_id', $5::text, 'since', {since}, \
             'until', {until}, 'ids', CASE WHEN $8::uuid IS NULL THEN NULL ELSE ARRAY[$8::text] END))) \
         RETURNING id",
        audit.table,
        since = audit_at("$6"),
        until = audit_at("$7"),
    );
    Ok(sqlx::query_scalar(AssertSqlSafe(sql))
        .bind(audit.actor)
        .bind(audit.action)
        .bind(i64::try_from(matched).unwrap_or(i64::MAX))
        .bind(&filter.event_type)
        .bind(&filter.aggregate_id)
        .bind(filter.since.map(epoch_micros))
        .bind(filter.until.map(epoch_micros))
        .bind(filter.event_id)
        .fetch_one(conn)
        .await?)
}
