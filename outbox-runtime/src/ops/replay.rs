//! Replay: publish again what was published, with the original event ids.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use sqlx::{AssertSqlSafe, PgPool};

use super::Ops;
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
}

pub(crate) fn epoch_seconds(t: SystemTime) -> f64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs_f64(),
        Err(before) => -before.duration().as_secs_f64(),
    }
}

/// `$1` event type, `$2` aggregate id, `$3` since, `$4` until (epoch seconds), all optional.
const FILTER: &str = "($1::text IS NULL OR event_type = $1) AND ($2::text IS NULL OR aggregate_id = $2) \
     AND ($3::float8 IS NULL OR created_at >= to_timestamp($3)) AND ($4::float8 IS NULL OR created_at < to_timestamp($4))";

fn on_the_hour(t: Option<SystemTime>) -> bool {
    t.is_none_or(|t| epoch_seconds(t).rem_euclid(3600.0) == 0.0)
}

impl Ops {
    /// Puts the published events matching `filter` back up for publication, with their
    /// original event ids, so consumers that already applied them absorb them as
    /// duplicates. A dry run counts and changes nothing. Works in batches of 5,000 rows,
    /// oldest first; per aggregate, the relay publishes them in their original order.
    pub async fn replay(&self, pool: &PgPool, filter: &ReplayFilter, dry_run: bool) -> Result<ReplayReport> {
        self.replay_unchecked(pool, filter, dry_run).await.map_err(|e| self.names().not_migrated(e))
    }

    async fn replay_unchecked(
        &self,
        pool: &PgPool,
        filter: &ReplayFilter,
        dry_run: bool,
    ) -> Result<ReplayReport> {
        let (t, cleaned) = (&self.names().outbox, &self.names().cleaned);
        let since = filter.since.map(epoch_seconds);
        let until = filter.until.map(epoch_seconds);
        let counts = format!(
            "SELECT count(*), count(*) FILTER (WHERE status = 'published'), \
                    count(*) FILTER (WHERE status IN ('pending', 'failed')), count(*) FILTER (WHERE status = 'discarded'), \
                    (SELECT coalesce(sum(events), 0)::bigint FROM {cleaned} WHERE status = 'published' \
                       AND ($1::text IS NULL OR event_type = $1) \
                       AND ($3::float8 IS NULL OR hour >= date_trunc('hour', to_timestamp($3) AT TIME ZONE 'UTC')) \
                       AND ($4::float8 IS NULL OR hour < to_timestamp($4) AT TIME ZONE 'UTC')) \
             FROM {t} WHERE {FILTER}"
        );
        let (matched, replayable, not_yet, discarded, cleaned_up): (i64, i64, i64, i64, i64) =
            sqlx::query_as(AssertSqlSafe(counts))
                .bind(&filter.event_type)
                .bind(&filter.aggregate_id)
                .bind(since)
                .bind(until)
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
                && on_the_hour(filter.since)
                && on_the_hour(filter.until),
        };
        if dry_run {
            return Ok(report);
        }
        // The set is fixed at the start: rows published by then, up to the highest id then.
        // Pages follow an id cursor, so a row the relay has just republished (published
        // again, after the start) is never picked up a second time, and the loop ends even
        // while a relay runs.
        let (started, last_id): (f64, i64) = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT EXTRACT(EPOCH FROM now())::float8, coalesce(max(id), 0) FROM {t}"
        )))
        .fetch_one(pool)
        .await?;
        let page = format!(
            "WITH page AS ( \
               SELECT id FROM {t} WHERE status = 'published' AND id > $5 AND id <= $6 \
                 AND published_at <= to_timestamp($7) AND {FILTER} ORDER BY id LIMIT $8), \
             done AS ( \
               UPDATE {t} SET status = 'pending', next_attempt_at = '-infinity', last_error = NULL \
               WHERE id IN (SELECT id FROM page) AND status = 'published' RETURNING 1) \
             SELECT (SELECT max(id) FROM page), (SELECT count(*) FROM done)"
        );
        let mut cursor = 0_i64;
        loop {
            let (page_end, done): (Option<i64>, i64) = sqlx::query_as(AssertSqlSafe(page.as_str()))
                .bind(&filter.event_type)
                .bind(&filter.aggregate_id)
                .bind(since)
                .bind(until)
                .bind(cursor)
                .bind(last_id)
                .bind(started)
                .bind(REPLAY_BATCH)
                .fetch_one(pool)
                .await?;
            report.replayed += u64::try_from(done).unwrap_or(0);
            match page_end {
                Some(end) => cursor = end,
                None => break,
            }
        }
        if report.replayed > 0 && self.config().notify {
            sqlx::query("SELECT pg_notify($1, '')").bind(&self.names().channel).execute(pool).await?;
        }
        Ok(report)
    }
}
