//! What the stream reads and writes in the outbox table: the state of streamed rows, and
//! the marks that record their outcome.

use sqlx::{PgPool, Row as _, SqlStr};

use crate::error::Result;
use crate::migrate::{PENDING_BY_ID, TOUCHED};
use crate::relay::claim::Placement;
use crate::relay::mark::storable;
use crate::relay::plan::MARK_PLAN;
use crate::table::{sql, Names};

/// A streamed row as the table has it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Still the stream's to publish (pending, untouched since its append).
    Mine,
    /// Its aggregate has an earlier failed or waiting event: it goes to the table path
    /// behind it.
    Blocked,
    /// Published, failed, discarded, handed over, put up again or deleted since: not the
    /// stream's any more.
    Gone,
}

/// [`crate::migrate::TOUCHED`] of the table aliased `alias`.
fn touched(alias: &str) -> String {
    TOUCHED
        .replace("next_attempt_at", &format!("{alias}.next_attempt_at"))
        .replace("attempts", &format!("{alias}.attempts"))
        .replace("published_at", &format!("{alias}.published_at"))
        .replace("failed_at", &format!("{alias}.failed_at"))
}

/// What [`Statements::states`] found.
#[derive(Debug, Default)]
pub(crate) struct States {
    pub(crate) known: Vec<(i64, State)>,
    /// Rows whose transaction the snapshot does not see yet.
    pub(crate) invisible: Vec<i64>,
}

#[derive(Debug)]
pub(crate) struct Statements {
    states: SqlStr,
    published: SqlStr,
    failed: SqlStr,
    hand_over: SqlStr,
}

/// What to record after a batch, besides the published marks.
#[derive(Debug, Default)]
pub(crate) struct Settled {
    /// (id, attempts made by the stream, reason)
    pub(crate) failed: Vec<(i64, i32, String)>,
    pub(crate) handed: Vec<i64>,
}

impl Statements {
    pub(crate) fn new(names: &Names) -> Self {
        let outbox = &names.outbox;
        Statements {
            // Blockers: an earlier failed event of the aggregate (the `blocked` index), or an
            // earlier pending one something touched (the `touched_by_aggregate` index). The
            // 64-bit transaction id is the one nearest the snapshot's xmax with these low
            // 32 bits (a live transaction is never 2^31 away from it).
            states: sql(format!(
                "WITH s AS (SELECT pg_current_snapshot() AS snap), \
                      x AS (SELECT pg_snapshot_xmax(snap)::text::bigint AS xmax FROM s) \
                 SELECT d.id, o.id IS NOT NULL, coalesce(o.status = 'pending' AND NOT {touched_o}, false), \
                        EXISTS (SELECT 1 FROM {outbox} b \
                                WHERE b.aggregate_type = d.t AND b.aggregate_id = d.a AND b.id < d.id \
                                  AND b.status = 'failed') \
                        OR EXISTS (SELECT 1 FROM {outbox} b \
                                WHERE b.aggregate_type = d.t AND b.aggregate_id = d.a AND b.id < d.id \
                                  AND b.status = 'pending' AND {touched_b}), \
                        pg_visible_in_snapshot((CASE WHEN c.full > x.xmax + 2147483648 THEN c.full - 4294967296 \
                                                     WHEN c.full < x.xmax - 2147483648 THEN c.full + 4294967296 \
                                                     ELSE c.full END)::text::xid8, s.snap) \
                 FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[]) AS d(id, t, a, xid) \
                 CROSS JOIN s CROSS JOIN x \
                 CROSS JOIN LATERAL (SELECT ((x.xmax >> 32) << 32) | d.xid AS full) AS c \
                 LEFT JOIN {outbox} o ON o.id = d.id",
                touched_o = touched("o"),
                touched_b = touched("b"),
            )),
            published: sql(format!(
                "UPDATE {outbox} o SET status = 'published', published_at = now(), attempts = o.attempts + d.att, \
                        last_error = NULL, kafka_partition = d.kp, kafka_offset = d.ko \
                 FROM unnest($1::bigint[], $2::int[], $3::bigint[], $4::int[]) AS d(id, kp, ko, att) \
                 WHERE o.id = ANY($1) AND o.id = d.id AND {PENDING_BY_ID} \
                 RETURNING EXTRACT(EPOCH FROM o.published_at - o.created_at)::float8, o.attempts"
            )),
            failed: sql(format!(
                "UPDATE {outbox} o SET status = 'failed', attempts = o.attempts + d.att, last_error = d.err, failed_at = now() \
                 FROM unnest($1::bigint[], $2::int[], $3::text[]) AS d(id, att, err) \
                 WHERE o.id = ANY($1) AND o.id = d.id AND {PENDING_BY_ID}"
            )),
            hand_over: sql(format!(
                "UPDATE {outbox} o SET next_attempt_at = now() \
                 WHERE o.id = ANY($1) AND {PENDING_BY_ID} AND NOT {TOUCHED}"
            )),
        }
    }

    /// The state of each streamed row `(id, aggregate type, aggregate id, transaction)`
    /// that the statement's snapshot sees, and the transactions it does not see yet:
    /// committed in the WAL (the stream carries them) but not yet visible to a new snapshot.
    /// That window is usually microseconds; with synchronous replication it lasts until the
    /// standbys confirm. A row missing whose transaction is visible was deleted since.
    pub(crate) async fn states(&self, pool: &PgPool, rows: &[(i64, &str, &str, u32)]) -> Result<States> {
        let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
        let types: Vec<&str> = rows.iter().map(|r| r.1).collect();
        let aggregates: Vec<&str> = rows.iter().map(|r| r.2).collect();
        let xids: Vec<i64> = rows.iter().map(|r| i64::from(r.3)).collect();
        let found = sqlx::query(self.states.clone())
            .bind(ids)
            .bind(types)
            .bind(aggregates)
            .bind(xids)
            .fetch_all(pool)
            .await?;
        let mut states = States::default();
        for r in &found {
            let (id, present, mine, blocked, visible): (i64, bool, bool, bool, bool) =
                (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?, r.try_get(4)?);
            let state = match (present, visible) {
                (false, false) => {
                    states.invisible.push(id);
                    continue;
                }
                (false, true) => State::Gone,
                (true, _) if !mine => State::Gone,
                (true, _) if blocked => State::Blocked,
                (true, _) => State::Mine,
            };
            states.known.push((id, state));
        }
        Ok(states)
    }

    /// Marks acknowledged rows published: (id, placement, attempts made by the stream).
    /// Returns how many were marked.
    pub(crate) async fn published(&self, pool: &PgPool, rows: &[(i64, Placement, i32)]) -> Result<u64> {
        let mut tx = pool.begin().await?;
        sqlx::query(MARK_PLAN).execute(&mut *tx).await?;
        let ids: Vec<i64> = rows.iter().map(|(id, ..)| *id).collect();
        let parts: Vec<i32> = rows.iter().map(|(_, p, _)| p.partition).collect();
        let offsets: Vec<i64> = rows.iter().map(|(_, p, _)| p.offset).collect();
        let attempts: Vec<i32> = rows.iter().map(|(.., a)| *a).collect();
        let marked = sqlx::query(self.published.clone())
            .bind(ids)
            .bind(parts)
            .bind(offsets)
            .bind(attempts)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        let mut again = 0;
        for r in &marked {
            let (seconds, attempts): (f64, i32) = (r.try_get(0)?, r.try_get(1)?);
            metrics::histogram!(crate::metrics::CREATED_TO_PUBLISHED).record(seconds);
            metrics::histogram!(crate::metrics::ATTEMPTS).record(f64::from(attempts));
            again += u64::from(attempts > 1);
        }
        metrics::counter!(crate::metrics::REPUBLISHED).increment(again);
        Ok(marked.len() as u64)
    }

    /// Records failed rows and hands rows to the table path, in one transaction.
    pub(crate) async fn settle(&self, pool: &PgPool, settled: &Settled) -> Result<()> {
        let mut tx = pool.begin().await?;
        if !settled.failed.is_empty() {
            let ids: Vec<i64> = settled.failed.iter().map(|(id, ..)| *id).collect();
            let attempts: Vec<i32> = settled.failed.iter().map(|(_, a, _)| *a).collect();
            let errors: Vec<String> = settled.failed.iter().map(|(.., e)| storable(e)).collect();
            sqlx::query(self.failed.clone()).bind(ids).bind(attempts).bind(errors).execute(&mut *tx).await?;
        }
        if !settled.handed.is_empty() {
            sqlx::query(self.hand_over.clone()).bind(&settled.handed).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }
}
