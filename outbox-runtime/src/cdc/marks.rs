//! What the stream reads and writes in the outbox table: the state of streamed rows, and
//! the marks that record their outcome.

use sqlx::{PgPool, Row as _, SqlStr};

use crate::error::Result;
use crate::relay::claim::{storable, Placement, MARK_PLAN};
use crate::table::{sql, Names};

/// A streamed row as the table has it now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Still the stream's to publish (pending, never handed over).
    Mine,
    /// Its aggregate has an earlier failed or waiting event: it goes to the table path
    /// behind it.
    Blocked,
    /// Published, failed, discarded, handed over, put up again or deleted since: not the
    /// stream's any more.
    Gone,
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
            // The first blocker condition is the predicate of the `blocked` index.
            states: sql(format!(
                "SELECT o.id, o.status = 'pending' AND o.next_attempt_at = '-infinity', \
                        EXISTS (SELECT 1 FROM {outbox} b \
                                WHERE b.aggregate_type = o.aggregate_type AND b.aggregate_id = o.aggregate_id \
                                  AND b.id < o.id \
                                  AND (b.status = 'failed' OR (b.status = 'pending' AND b.next_attempt_at > '-infinity'))) \
                 FROM {outbox} o WHERE o.id = ANY($1)"
            )),
            published: sql(format!(
                "UPDATE {outbox} o SET status = 'published', published_at = now(), attempts = o.attempts + d.att, \
                        last_error = NULL, kafka_partition = d.kp, kafka_offset = d.ko \
                 FROM unnest($1::bigint[], $2::int[], $3::bigint[], $4::int[]) AS d(id, kp, ko, att) \
                 WHERE o.id = ANY($1) AND o.id = d.id AND o.status = 'pending' \
                 RETURNING EXTRACT(EPOCH FROM o.published_at - o.created_at)::float8, o.attempts"
            )),
            failed: sql(format!(
                "UPDATE {outbox} o SET status = 'failed', attempts = o.attempts + d.att, last_error = d.err, failed_at = now() \
                 FROM unnest($1::bigint[], $2::int[], $3::text[]) AS d(id, att, err) \
                 WHERE o.id = ANY($1) AND o.id = d.id AND o.status = 'pending'"
            )),
            hand_over: sql(format!(
                "UPDATE {outbox} SET next_attempt_at = now() \
                 WHERE id = ANY($1) AND status = 'pending' AND next_attempt_at = '-infinity'"
            )),
        }
    }

    /// The state of each of `ids` (a deleted row is missing: [`State::Gone`]).
    pub(crate) async fn states(&self, pool: &PgPool, ids: &[i64]) -> Result<Vec<(i64, State)>> {
        let rows = sqlx::query(self.states.clone()).bind(ids).fetch_all(pool).await?;
        rows.iter()
            .map(|r| {
                let (id, mine, blocked): (i64, bool, bool) = (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?);
                Ok((
                    id,
                    if !mine {
                        State::Gone
                    } else if blocked {
                        State::Blocked
                    } else {
                        State::Mine
                    },
                ))
            })
            .collect()
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
