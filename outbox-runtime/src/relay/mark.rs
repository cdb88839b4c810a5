//! Recording what happened to a batch's rows, fenced by the lease tokens or guarded by the
//! partition locks of the relay that holds them.

use std::time::Duration;

use sqlx::{PgConnection, PgPool, Row as _, SqlStr};
use uuid::Uuid;

use super::claim::{Placement, Statements, MARK_PLAN};
use crate::error::Result;

/// The fencing credentials of a mark.
#[derive(Debug, Clone)]
pub(crate) struct Fence {
    pub(crate) relay_id: Uuid,
    pub(crate) partitions: Vec<i32>,
    pub(crate) tokens: Vec<i64>,
}

/// What to record after one batch.
#[derive(Debug, Default)]
pub(crate) struct Marks {
    pub(crate) published: Vec<(i64, Placement)>,
    /// (row id, delay before the next attempt, reason, whether it was an attempt: a row
    /// held back for a missing topic was not sent, and its attempts stay as they are)
    pub(crate) retry: Vec<(i64, Duration, String, bool)>,
    pub(crate) failed: Vec<(i64, String)>,
}

/// What entitles a mark: lease tokens checked in its transaction, or partition locks its
/// transaction already holds.
#[derive(Debug, Clone, Copy)]
enum Guard<'a> {
    Fence(&'a Fence),
    Locked(&'a [i32]),
}

/// Rows actually marked; fewer than asked means leases were lost on the way.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Marked {
    pub(crate) published: u64,
    pub(crate) retry: u64,
    pub(crate) failed: u64,
}

impl Statements {
    /// Records a batch in one transaction: the fence first, then the marks of the rows of
    /// the partitions it still holds. Rows of partitions it lost are left to the new owner.
    pub(crate) async fn mark(&self, pool: &PgPool, marks: &Marks, fence: &Fence) -> Result<Marked> {
        let mut tx = pool.begin().await?;
        let marked = self.mark_in(&mut tx, marks, Guard::Fence(fence), false).await?.0;
        tx.commit().await?;
        Ok(marked)
    }

    /// The marks' plans and row counts as they run (`EXPLAIN (ANALYZE, FORMAT JSON)`), in a
    /// transaction rolled back after.
    #[cfg(test)]
    pub(crate) async fn explain_mark(
        &self,
        pool: &PgPool,
        marks: &Marks,
        fence: &Fence,
    ) -> Result<Vec<serde_json::Value>> {
        let mut tx = pool.begin().await?;
        let plans = self.mark_in(&mut tx, marks, Guard::Fence(fence), true).await?.1;
        tx.rollback().await?;
        Ok(plans)
    }

    /// Records a batch in the transaction that locked its partitions and rows
    /// ([`Statements::claim_locked`]): no fence, the locks are the guard.
    pub(crate) async fn mark_locked(
        &self,
        tx: &mut PgConnection,
        marks: &Marks,
        partitions: &[i32],
    ) -> Result<Marked> {
        Ok(self.mark_in(tx, marks, Guard::Locked(partitions), false).await?.0)
    }

    async fn mark_in(
        &self,
        tx: &mut PgConnection,
        marks: &Marks,
        guard: Guard<'_>,
        explain: bool,
    ) -> Result<(Marked, Vec<serde_json::Value>)> {
        let mut marked = Marked::default();
        let mut plans = Vec::new();
        let held: Vec<i32> = match guard {
            Guard::Fence(fence) => {
                sqlx::query_scalar(self.fence.clone())
                    .bind(fence.relay_id)
                    .bind(&fence.partitions)
                    .bind(&fence.tokens)
                    .fetch_all(&mut *tx)
                    .await?
            }
            Guard::Locked(partitions) => partitions.to_vec(),
        };
        if held.is_empty() {
            return Ok((marked, plans));
        }
        sqlx::query(MARK_PLAN).execute(&mut *tx).await?;
        let statement = |sql: &SqlStr| {
            if explain {
                crate::table::sql(format!("EXPLAIN (ANALYZE, FORMAT JSON) {}", sql.as_str()))
            } else {
                sql.clone()
            }
        };
        if !marks.published.is_empty() {
            let ids: Vec<i64> = marks.published.iter().map(|(id, _)| *id).collect();
            let parts: Vec<i32> = marks.published.iter().map(|(_, p)| p.partition).collect();
            let offsets: Vec<i64> = marks.published.iter().map(|(_, p)| p.offset).collect();
            let query =
                sqlx::query(statement(&self.published)).bind(ids).bind(parts).bind(offsets).bind(&held);
            if explain {
                plans.push(query.fetch_one(&mut *tx).await?.try_get(0)?);
            } else {
                let latencies = query
                    .fetch_all(&mut *tx)
                    .await?
                    .iter()
                    .map(|r| Ok((r.try_get::<f64, _>(0)?, r.try_get::<i32, _>(1)?)))
                    .collect::<sqlx::Result<Vec<_>>>()?;
                for (seconds, attempts) in &latencies {
                    metrics::histogram!(crate::metrics::CREATED_TO_PUBLISHED).record(*seconds);
                    metrics::histogram!(crate::metrics::ATTEMPTS).record(f64::from(*attempts));
                }
                // Sent before without a recorded ack (a retry after an error or a timeout), or
                // replayed: consumers may see these twice and absorb them.
                let again = latencies.iter().filter(|(_, attempts)| *attempts > 1).count() as u64;
                metrics::counter!(crate::metrics::REPUBLISHED).increment(again);
                marked.published = latencies.len() as u64;
            }
        }
        if !marks.retry.is_empty() {
            let ids: Vec<i64> = marks.retry.iter().map(|(id, ..)| *id).collect();
            let delays: Vec<i64> = marks
                .retry
                .iter()
                .map(|(_, d, ..)| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
                .collect();
            let errors: Vec<String> = marks.retry.iter().map(|(_, _, e, _)| storable(e)).collect();
            let attempts: Vec<i32> = marks.retry.iter().map(|(.., attempt)| i32::from(*attempt)).collect();
            let query = sqlx::query(statement(&self.retry))
                .bind(ids)
                .bind(delays)
                .bind(errors)
                .bind(attempts)
                .bind(&held);
            if explain {
                plans.push(query.fetch_one(&mut *tx).await?.try_get(0)?);
            } else {
                marked.retry = query.execute(&mut *tx).await?.rows_affected();
            }
        }
        if !marks.failed.is_empty() {
            let ids: Vec<i64> = marks.failed.iter().map(|(id, _)| *id).collect();
            let errors: Vec<String> = marks.failed.iter().map(|(_, e)| storable(e)).collect();
            let query = sqlx::query(statement(&self.failed)).bind(ids).bind(errors).bind(&held);
            if explain {
                plans.push(query.fetch_one(&mut *tx).await?.try_get(0)?);
            } else {
                marked.failed = query.execute(&mut *tx).await?.rows_affected();
            }
        }
        Ok((marked, plans))
    }
}

/// `text` as PostgreSQL stores it: without NUL characters, which `text` cannot hold (an
/// error from a broker could carry one, and the mark would then fail every time).
pub(crate) fn storable(text: &str) -> String {
    text.replace('\0', "\u{fffd}")
}
